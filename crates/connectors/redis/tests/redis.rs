//! The Redis driver against the real server at 127.0.0.1:6379: what lands in Redis for
//! each format, deletions, chunked loads, a transaction larger than the stage's memory
//! bound, ApplyDelete's reach, and the refusals (delta updates). Every test has a key
//! prefix of its own and deletes its keys afterwards (never FLUSHDB).

use redis::aio::MultiplexedConnection;
use serde_json::{Value, json};
use sluice_conformance::Session;
use sluice_conformance::messages::{apply_request, open};
use sluice_doc::tuple::pack_key;
use sluice_driver_sdk::arena::{LoadBuilder, StoreBuilder, StoreDoc};
use sluice_driver_sdk::inprocess::InProcess;
use sluice_driver_sdk::materialize::{self as m, constraint::Type};
use sluice_driver_sdk::{Driver, Error, flow};
use sluice_redis::{RedisDriver, client, key};
use std::sync::Arc;

const URL: &str = "redis://127.0.0.1:6379/0";

/// A prefix unique to this test and process, whose keys are deleted when dropped.
struct Prefix(String);

impl Prefix {
    fn new(test: &str) -> Prefix {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        Prefix(format!(
            "sluice-test:{test}:{nanos:x}:{}:",
            std::process::id()
        ))
    }
}

impl Drop for Prefix {
    fn drop(&mut self) {
        let prefix = self.0.clone();
        // On a thread of its own: a test's runtime may be shutting down.
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let mut conn = conn().await;
                client::delete_prefix(&mut conn, &prefix).await.unwrap();
            });
        })
        .join()
        .unwrap();
    }
}

async fn conn() -> MultiplexedConnection {
    let config = sluice_redis::config::EndpointConfig::parse(&json!({ "url": URL }).to_string());
    client::connect(&config.unwrap()).await.unwrap()
}

fn endpoint() -> String {
    json!({ "url": URL }).to_string()
}

/// One binding per `(prefix, format)`, over a collection keyed by `/id` with a `name`
/// value field.
fn spec(bindings: &[(&str, &str)]) -> flow::MaterializationSpec {
    flow::MaterializationSpec {
        materialization: "acme/redis".into(),
        endpoint_type: flow::EndpointType::SluiceRedis as i32,
        endpoint_spec_json: endpoint(),
        bindings: (bindings.iter())
            .map(|(prefix, format)| flow::materialization_spec::Binding {
                resource_spec_json: json!({ "prefix": prefix, "format": format }).to_string(),
                resource_path: vec![prefix.to_string()],
                field_selection: Some(flow::FieldSelection {
                    keys: vec!["id".into()],
                    values: vec!["name".into()],
                    document: "flow_document".into(),
                    field_config_json: Default::default(),
                }),
                ..Default::default()
            })
            .collect(),
    }
}

/// Stores of `(id, document)` into binding 0 (`None`: delete), with `name` as the value.
fn stores(docs: &[(i64, Option<Value>)]) -> Vec<m::transaction_request::Store> {
    let mut builder = StoreBuilder::new();
    let packed: Vec<(Vec<u8>, Vec<u8>, Vec<u8>)> = (docs.iter())
        .map(|(id, doc)| {
            let name = doc.as_ref().map_or(Value::Null, |d| d["name"].clone());
            let text = doc.as_ref().map_or("null".to_string(), Value::to_string);
            (pack_key(&[json!(id)]), pack_key(&[name]), text.into_bytes())
        })
        .collect();
    for (key, values, doc) in &packed {
        builder.push(
            0,
            StoreDoc {
                key,
                values,
                doc,
                exists: false,
            },
        );
    }
    builder.finish()
}

fn loads(ids: impl IntoIterator<Item = i64>) -> Vec<m::transaction_request::Load> {
    let mut builder = LoadBuilder::new();
    for id in ids {
        builder.push(0, &pack_key(&[json!(id)]));
    }
    builder.finish()
}

async fn session(spec: &flow::MaterializationSpec) -> Session {
    let endpoint = InProcess::new("redis", Arc::new(RedisDriver::new()));
    Session::open(&endpoint, open(spec, 0, u32::MAX))
        .await
        .unwrap()
}

fn doc(id: i64, name: &str) -> Value {
    json!({"id": id, "name": name})
}

#[tokio::test(flavor = "multi_thread")]
async fn json_documents_are_strings_and_hashes_hold_the_fields_and_the_document() {
    let (json_prefix, hash_prefix) = (Prefix::new("json"), Prefix::new("hash"));
    for (prefix, format) in [(&json_prefix.0, "json"), (&hash_prefix.0, "hash")] {
        let spec = spec(&[(prefix, format)]);
        let mut s = session(&spec).await;
        let first = stores(&[(1, Some(doc(1, "one"))), (2, Some(doc(2, "two")))]);
        s.transaction(vec![], b"cp1", first).await.unwrap();
        let second = stores(&[(1, Some(doc(1, "uno"))), (2, None)]);
        s.transaction(vec![], b"cp2", second).await.unwrap();
        let loaded = s
            .transaction(loads([1, 2, 3]), b"cp3", vec![])
            .await
            .unwrap();
        assert_eq!(
            loaded,
            vec![doc(1, "uno")],
            "{format}: updated, deleted, absent"
        );
        s.close().await.unwrap();

        let mut conn = conn().await;
        let one = key::encode(prefix, &pack_key(&[json!(1)]));
        let two = key::encode(prefix, &pack_key(&[json!(2)]));
        let exists: bool = redis::cmd("EXISTS")
            .arg(&two)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(!exists, "{format}: a null document deletes the key");
        if format == "json" {
            let text: String = redis::cmd("GET")
                .arg(&one)
                .query_async(&mut conn)
                .await
                .unwrap();
            assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), doc(1, "uno"));
        } else {
            let hash: Vec<(String, String)> = redis::cmd("HGETALL")
                .arg(&one)
                .query_async(&mut conn)
                .await
                .unwrap();
            let mut hash: Vec<(String, String)> = hash;
            hash.sort();
            let expected = vec![
                ("flow_document".to_string(), doc(1, "uno").to_string()),
                ("id".to_string(), "1".to_string()),
                ("name".to_string(), "uno".to_string()),
            ];
            assert_eq!(hash, expected);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn loads_of_many_keys_come_back_across_chunks() {
    let prefix = Prefix::new("many");
    let spec = spec(&[(&prefix.0, "json")]);
    let mut s = session(&spec).await;
    let n = 2 * client::CHUNK_KEYS as i64 + 500;
    let docs: Vec<(i64, Option<Value>)> = (0..n).map(|i| (i, Some(doc(i, "x")))).collect();
    s.transaction(vec![], b"cp1", stores(&docs)).await.unwrap();
    let loaded = s
        .transaction(loads(0..n + 100), b"cp2", vec![])
        .await
        .unwrap();
    let mut ids: Vec<i64> = loaded.iter().map(|d| d["id"].as_i64().unwrap()).collect();
    ids.sort();
    assert_eq!(ids, (0..n).collect::<Vec<_>>());
    s.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_transaction_larger_than_the_stage_memory_commits_whole() {
    let prefix = Prefix::new("large");
    let spec = spec(&[(&prefix.0, "hash")]);
    let mut s = session(&spec).await;
    // 24 documents of 1 MiB: past the stage's 16 MiB, so through its temporary file.
    let big = "x".repeat(1 << 20);
    let docs: Vec<(i64, Option<Value>)> = (0..24).map(|i| (i, Some(doc(i, &big)))).collect();
    s.transaction(vec![], b"cp1", stores(&docs)).await.unwrap();
    let loaded = s.transaction(loads(0..24), b"cp2", vec![]).await.unwrap();
    assert_eq!(loaded.len(), 24);
    assert!(
        loaded
            .iter()
            .all(|d| d["name"].as_str() == Some(big.as_str()))
    );
    s.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_delete_removes_the_prefix_keys_only_and_its_dry_run_nothing() {
    let (mine, neighbour) = (Prefix::new("mine"), Prefix::new("neighbour"));
    let driver = RedisDriver::new();
    let (spec_mine, spec_neighbour) = (spec(&[(&mine.0, "json")]), spec(&[(&neighbour.0, "json")]));
    for spec in [&spec_mine, &spec_neighbour] {
        let upserted = driver
            .apply_upsert(apply_request(spec, false))
            .await
            .unwrap();
        assert!(upserted.action_description.starts_with("keys under prefix"));
        let mut s = session(spec).await;
        s.transaction(vec![], b"cp1", stores(&[(1, Some(doc(1, "a")))]))
            .await
            .unwrap();
        s.close().await.unwrap();
    }
    let dry = driver
        .apply_delete(apply_request(&spec_mine, true))
        .await
        .unwrap();
    let mut conn = conn().await;
    assert_eq!(
        count(&mut conn, &mine.0).await,
        1,
        "the dry run deleted nothing"
    );
    let real = driver
        .apply_delete(apply_request(&spec_mine, false))
        .await
        .unwrap();
    assert_eq!(dry, real, "the dry run describes what the real one does");
    assert_eq!(
        real.action_description,
        format!("delete keys under prefix {:?} (format json)", mine.0)
    );
    for (prefix, left) in [(&mine.0, 0), (&neighbour.0, 1)] {
        assert_eq!(count(&mut conn, prefix).await, left, "{prefix}");
    }
}

/// How many keys start with `prefix` (KEYS: the test's prefixes hold a few keys).
async fn count(conn: &mut MultiplexedConnection, prefix: &str) -> usize {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(key::scan_pattern(prefix))
        .query_async(conn)
        .await
        .unwrap();
    keys.len()
}

#[tokio::test]
async fn delta_updates_are_refused_naming_the_binding() {
    let driver = RedisDriver::new();
    let validate = m::ValidateRequest {
        materialization: "acme/redis".into(),
        endpoint_spec_json: endpoint(),
        bindings: vec![m::validate_request::Binding {
            resource_spec_json: r#"{"prefix":"views:","delta_updates":true}"#.into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let err = driver.validate(validate).await.unwrap_err();
    assert!(
        matches!(&err, Error::Config(m) if m.contains("binding 0 (prefix \"views:\")") && m.contains("a second time")),
        "{err}"
    );

    let mut delta = spec(&[("views:", "json")]);
    delta.bindings[0].delta_updates = true;
    let endpoint = InProcess::new("redis", Arc::new(RedisDriver::new()));
    let err = Session::open(&endpoint, open(&delta, 0, u32::MAX))
        .await
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("delta updates are not supported"),
        "{err}"
    );
    let err = driver
        .apply_upsert(apply_request(&delta, true))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("binding 0"), "{err}");
}

#[tokio::test]
async fn validate_recommends_the_fields_of_a_hash_and_leaves_them_optional_in_json() {
    let projection = |field: &str, ptr: &str, key: bool| flow::Projection {
        field: field.into(),
        ptr: ptr.into(),
        is_primary_key: key,
        ..Default::default()
    };
    let collection = flow::CollectionSpec {
        key_ptrs: vec!["/id".into()],
        projections: vec![
            projection("id", "/id", true),
            projection("flow_document", "", false),
            projection("name", "/name", false),
        ],
        ..Default::default()
    };
    let binding = |prefix: &str, format: &str| m::validate_request::Binding {
        resource_spec_json: json!({ "prefix": prefix, "format": format }).to_string(),
        collection: Some(collection.clone()),
        ..Default::default()
    };
    let req = m::ValidateRequest {
        materialization: "acme/redis".into(),
        endpoint_spec_json: endpoint(),
        bindings: vec![binding("j:", "json"), binding("h:", "hash")],
        ..Default::default()
    };
    let resp = RedisDriver::new().validate(req).await.unwrap();
    let kind = |b: usize, f: &str| resp.bindings[b].constraints[f].r#type;
    for b in 0..2 {
        assert_eq!(kind(b, "id"), Type::LocationRequired as i32);
        assert_eq!(kind(b, "flow_document"), Type::FieldRequired as i32);
    }
    assert_eq!(kind(0, "name"), Type::FieldOptional as i32);
    assert_eq!(kind(1, "name"), Type::LocationRecommended as i32);
    assert_eq!(resp.bindings[1].resource_path, vec!["h:".to_string()]);
}

#[tokio::test]
async fn an_unreachable_server_is_a_retryable_error_within_the_connect_timeout() {
    let config = json!({ "url": "redis://127.0.0.1:1/0", "connect_timeout": 2 });
    let config = sluice_redis::config::EndpointConfig::parse(&config.to_string()).unwrap();
    let started = std::time::Instant::now();
    let err = client::connect(&config).await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}
