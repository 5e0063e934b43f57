//! The kafka output's `partitioner` end to end, through the output SDK's driver (the
//! Store's packed keys hashed as the runtime hashes them) to the local tansu broker:
//! `key_range` puts each change in partition `h·n >> 32` of `n` for its document's key
//! hash `h`, where a `partitioned_by: key_range` source reads it; the default stays
//! Kafka's murmur2 of the message key.
//!
//! Topics are not deleted after (see `endpoint.rs`: tansu 0.6.0 stops serving when a
//! topic is deleted under a fetch); names are unique.

use serde_json::{Value, json};
use sluice_conformance::messages::{open, store};
use sluice_doc::key_hash;
use sluice_doc::tuple::pack_key;
use sluice_driver_sdk::Driver;
use sluice_driver_sdk::flow;
use sluice_driver_sdk::materialize::transaction_request::Prepare;
use sluice_kafka_client::key_range::partition_of_hash;
use sluice_kafka_output::partitioner::partition_of;
use sluice_kafka_output::read::{Written, read_topic};
use sluice_output_sdk::{BatchKind, OutputDriver};
use sluice_testkit::conformance::unique_name;
use sluice_testkit::tansu::{LOCAL_BROKER, ensure_local_broker};
use std::collections::BTreeSet;

const PARTITIONS: u32 = 4;
const KEYS: i64 = 200;

/// The packed key of the document of `id`, as the runtime packs a key.
fn packed_key(id: i64) -> Vec<u8> {
    pack_key(&[json!(id)])
}

/// A collection of `{"id": integer, "value": string}` documents keyed by `/id`.
fn collection() -> flow::CollectionSpec {
    let projection = |ptr: &str, field: &str, types: &[&str]| flow::Projection {
        ptr: ptr.into(),
        field: field.into(),
        is_primary_key: field == "id",
        inference: Some(flow::Inference {
            types: types.iter().map(|t| t.to_string()).collect(),
            must_exist: true,
            ..Default::default()
        }),
        ..Default::default()
    };
    flow::CollectionSpec {
        collection: "acme/documents".into(),
        key_ptrs: vec!["/id".into()],
        projections: vec![
            projection("/id", "id", &["integer"]),
            projection("", "flow_document", &["object"]),
        ],
        ..Default::default()
    }
}

/// Materializes `KEYS` inserts, then an update of every tenth key (a delete and an
/// insert message of the same key), to a new topic of `PARTITIONS` partitions whose
/// resource adds the keys of `settings`; returns what the topic holds.
async fn publish(test: &str, settings: Value) -> Vec<Written> {
    ensure_local_broker().unwrap();
    let topic = format!("kafka-output-{test}-{}", unique_name());
    let mut resource = json!({"topic": topic, "partitions": PARTITIONS});
    resource
        .as_object_mut()
        .unwrap()
        .extend(settings.as_object().unwrap().clone());
    let spec = flow::MaterializationSpec {
        materialization: format!("acme/{test}"),
        endpoint_spec_json: json!({"brokers": LOCAL_BROKER}).to_string(),
        bindings: vec![flow::materialization_spec::Binding {
            resource_spec_json: resource.to_string(),
            resource_path: vec![topic.clone()],
            collection: Some(collection()),
            field_selection: Some(flow::FieldSelection {
                keys: vec!["id".into()],
                document: "flow_document".into(),
                ..Default::default()
            }),
            ..Default::default()
        }],
        ..Default::default()
    };
    let state = tempfile::tempdir().unwrap();
    let driver = OutputDriver::new(sluice_kafka_output::kind(), state.path().to_path_buf());
    let (mut transactor, _) = driver.open(open(&spec, 0, u32::MAX)).await.unwrap();
    let inserts: Vec<(i64, bool)> = (0..KEYS).map(|id| (id, false)).collect();
    let updates: Vec<(i64, bool)> = (0..KEYS).step_by(10).map(|id| (id, true)).collect();
    for (txn, puts) in [inserts, updates].iter().enumerate() {
        let txn = txn as u64 + 1;
        let docs: Vec<(Vec<u8>, String, bool)> = (puts.iter())
            .map(|&(id, exists)| {
                let doc = json!({"id": id, "value": format!("txn {txn}")});
                (packed_key(id), doc.to_string(), exists)
            })
            .collect();
        let docs: Vec<(&[u8], &str, bool)> = (docs.iter())
            .map(|(key, doc, exists)| (key.as_slice(), doc.as_str(), *exists))
            .collect();
        transactor
            .prepare(Prepare {
                flow_checkpoint: format!(r#"{{"txn":{txn}}}"#).into_bytes(),
            })
            .await
            .unwrap();
        transactor.store(store(0, &docs)).await.unwrap();
        transactor.commit().await.unwrap();
    }
    let written = read_topic(&[LOCAL_BROKER.to_string()], &topic)
        .await
        .unwrap();
    let expected = KEYS as usize + 2 * (KEYS as usize).div_ceil(10);
    assert_eq!(written.len(), expected, "every change's messages, once");
    written
}

/// The key hash of a message's document, from its key fields (the message key is the
/// JSON object of them) packed as the runtime packs a key: not the output's hash.
fn document_key_hash(message: &Written) -> u32 {
    let key: Value = serde_json::from_slice(&message.key).unwrap();
    key_hash(&pack_key(&[key["id"].clone()]))
}

#[tokio::test]
async fn key_range_puts_each_change_in_the_partition_of_its_documents_key_hash() {
    // A snapshot binding: the first batch is the view (its changes encoded from the
    // view's keys), the second the Store's changes.
    let settings = json!({"partitioner": "key_range", "snapshot": true});
    let written = publish("key-range", settings).await;
    assert!(written.iter().any(|m| m.stamp.batch == BatchKind::Snapshot));
    for message in &written {
        let hash = document_key_hash(message);
        assert_eq!(
            message.partition as u32,
            partition_of_hash(hash, PARTITIONS),
            "key {} (hash {hash:#010x}) at partition {} offset {}",
            String::from_utf8_lossy(&message.key),
            message.partition,
            message.offset
        );
    }
    let used: BTreeSet<i32> = written.iter().map(|m| m.partition).collect();
    assert_eq!(used.len(), PARTITIONS as usize, "the keys fill every slice");
}

#[tokio::test]
async fn the_default_partitioner_is_kafkas_murmur2_of_the_message_key() {
    let written = publish("murmur2", json!({})).await;
    let mut differs = false;
    for message in &written {
        let murmur2 = partition_of(&message.key, PARTITIONS as usize);
        assert_eq!(message.partition as usize, murmur2, "key {:?}", message.key);
        differs |= murmur2 as u32 != partition_of_hash(document_key_hash(message), PARTITIONS);
    }
    assert!(differs, "the two partitioners place some key apart");
}
