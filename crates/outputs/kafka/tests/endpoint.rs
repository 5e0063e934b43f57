//! The kafka output against a real broker (tansu on 127.0.0.1:9092, started if none
//! answers): transactions in order with their headers, a crash mid-transaction and its
//! replay written exactly once (1 and 3 partitions), a whole replay discarded, a foreign
//! message refused, an unreachable broker reported.
//!
//! Topics are not deleted after: tansu 0.6.0 panics (and serves nothing more) when a
//! topic is deleted while fetches are in flight, as they are in the tests running
//! beside these. Names are unique, so none collide.

use serde_json::json;
use sluice_kafka::admin::Admin;
use sluice_kafka_output::partitioner::partition_of;
use sluice_kafka_output::read::{Written, read_topic};
use sluice_kafka_output::stamp::Stamp;
use sluice_output_sdk::{
    BatchKind, Buffer, Format, Generation, GenerationId, Message, OutputEndpoint, OutputError,
    Target,
};
use sluice_testkit::conformance::unique_name;
use sluice_testkit::tansu::{LOCAL_BROKER, ensure_local_broker};
use std::collections::BTreeMap;
use std::sync::LazyLock;

const MATERIALIZATION: &str = "acme/orders-out";

/// The generation of the endpoints of these tests (each test has a topic of its own);
/// a test of a reset makes another.
static GENERATION: LazyLock<Generation> = LazyLock::new(new_generation);

fn new_generation() -> Generation {
    Generation {
        id: GenerationId::mint(),
        adopts_unstamped: false,
    }
}

/// A transaction's messages, `(key, value)` in index order.
type Messages = Vec<(Vec<u8>, Vec<u8>)>;

/// What a topic should hold: each transaction's batch kind and messages.
type Expected = BTreeMap<u64, (BatchKind, Messages)>;

fn new_topic(test: &str) -> String {
    ensure_local_broker().unwrap();
    format!("kafka-output-{test}-{}", unique_name())
}

fn endpoint(topic: &str, partitions: i32) -> Box<dyn OutputEndpoint> {
    endpoint_of(*GENERATION, topic, partitions)
}

fn endpoint_of(generation: Generation, topic: &str, partitions: i32) -> Box<dyn OutputEndpoint> {
    let target = Target {
        materialization: MATERIALIZATION.into(),
        resource: json!({"topic": topic, "partitions": partitions}),
        format: Format::Json,
        header: None,
        generation,
        former_writers: false,
    };
    (sluice_kafka_output::kind().endpoint)(&json!({"brokers": LOCAL_BROKER}), target).unwrap()
}

/// Transaction `txn`'s messages: `count` keys (spread over partitions), each value
/// naming its transaction and index, padded to `value_bytes`.
fn messages(txn: u64, count: u64, value_bytes: usize) -> Messages {
    (0..count)
        .map(|i| {
            let key = format!("{{\"id\":{}}}", txn * 1000 + i).into_bytes();
            let mut value = format!("txn {txn} message {i} ").into_bytes();
            value.resize(value_bytes.max(value.len()), b'.');
            (key, value)
        })
        .collect()
}

/// Starts transaction `txn` and pushes `messages[..upto]` in pushes of `per_push`
/// (numbering from 0, as the driver's buffer does).
async fn push_prefix(
    endpoint: &mut Box<dyn OutputEndpoint>,
    txn: u64,
    kind: BatchKind,
    messages: &[(Vec<u8>, Vec<u8>)],
    upto: usize,
    per_push: usize,
) {
    endpoint.batch_start(txn, kind).await.unwrap();
    let mut buffer = Buffer::default();
    buffer.start(txn);
    for chunk in messages[..upto].chunks(per_push) {
        for (key, value) in chunk {
            buffer.push(key, value);
        }
        endpoint.push(&buffer).await.unwrap();
        buffer.pushed();
    }
}

/// A whole transaction: its batch started, pushed and ended.
async fn write_txn(
    endpoint: &mut Box<dyn OutputEndpoint>,
    txn: u64,
    kind: BatchKind,
    messages: &[(Vec<u8>, Vec<u8>)],
    per_push: usize,
) {
    push_prefix(endpoint, txn, kind, messages, messages.len(), per_push).await;
    endpoint.batch_end().await.unwrap();
}

/// A record as the output stamps it, by `materialization`.
fn stamped(txn: u64, index: u64, key: &[u8], materialization: &str) -> rskafka::record::Record {
    let message = Message {
        txn,
        index,
        packed_key: b"",
        key,
        value: b"{}",
    };
    let now = rskafka::chrono::Utc::now();
    let generation = GENERATION.id;
    sluice_kafka_output::stamp::record(&message, BatchKind::Delta, materialization, generation, now)
}

async fn read(topic: &str) -> Vec<Written> {
    read_topic(&[LOCAL_BROKER.to_string()], topic)
        .await
        .unwrap()
}

/// Checks that `written` holds each message of `expected` (by transaction) exactly
/// once, with its key, value and headers, on the partition its key picks, and that
/// every partition holds its messages in (transaction, index) order.
fn assert_exactly_once(written: &[Written], partitions: usize, expected: &Expected) {
    let mut seen = BTreeMap::new();
    let mut last_of_partition = BTreeMap::new();
    for w in written {
        let at = (w.stamp.txn, w.stamp.index);
        if let Some(before) = seen.insert(at, w) {
            panic!(
                "({}, {}) written twice: at partition {} offset {} and partition {} offset {}",
                at.0, at.1, before.partition, before.offset, w.partition, w.offset
            );
        }
        if let Some(previous) = last_of_partition.insert(w.partition, at) {
            assert!(
                previous < at,
                "partition {} holds {previous:?} before {at:?}",
                w.partition
            );
        }
        let (kind, messages) = &expected[&w.stamp.txn];
        let (key, value) = &messages[w.stamp.index as usize];
        assert_eq!((&w.key, &w.value), (key, value), "message {at:?}");
        assert_eq!(w.partition as usize, partition_of(key, partitions));
        assert_eq!(w.stamp.batch, *kind);
        assert_eq!(w.stamp.materialization, MATERIALIZATION);
        assert_eq!(
            w.stamp.generation, written[0].stamp.generation,
            "one generation"
        );
    }
    let want: usize = expected.values().map(|(_, m)| m.len()).sum();
    assert_eq!(seen.len(), want, "messages missing");
}

#[tokio::test]
async fn transactions_arrive_in_order_with_contiguous_indexes_and_their_headers() {
    let topic = new_topic("order");
    let mut expected = Expected::new();
    expected.insert(1, (BatchKind::Snapshot, messages(1, 25, 0)));
    expected.insert(2, (BatchKind::Delta, messages(2, 3, 0)));
    // About 1.2 MiB in one push: several produce requests.
    expected.insert(3, (BatchKind::Delta, messages(3, 300, 4 << 10)));
    let mut out = endpoint(&topic, 1);
    out.open().await.unwrap();
    for (txn, (kind, messages)) in &expected {
        write_txn(&mut out, *txn, *kind, messages, 10_000).await;
    }
    out.close().await;

    let written = read(&topic).await;
    assert_exactly_once(&written, 1, &expected);
    let order: Vec<(u64, u64)> = written
        .iter()
        .map(|w| (w.stamp.txn, w.stamp.index))
        .collect();
    let want: Vec<(u64, u64)> = (expected.iter())
        .flat_map(|(txn, (_, m))| (0..m.len() as u64).map(move |i| (*txn, i)))
        .collect();
    assert_eq!(order, want);
    let offsets: Vec<i64> = written.iter().map(|w| w.offset).collect();
    assert_eq!(offsets, (0..want.len() as i64).collect::<Vec<_>>());
}

/// Transaction 1 is written; transaction 2 is cut after 7 of its 20 messages (no
/// batch_end: a crash); a new endpoint replays 2 from its start, with other push
/// boundaries, then writes 3.
async fn crash_and_replay(test: &str, partitions: i32) {
    let topic = new_topic(test);
    let mut expected = Expected::new();
    for (txn, count) in [(1, 12), (2, 20), (3, 9)] {
        expected.insert(txn, (BatchKind::Delta, messages(txn, count, 0)));
    }
    let mut first = endpoint(&topic, partitions);
    first.open().await.unwrap();
    write_txn(&mut first, 1, BatchKind::Delta, &expected[&1].1, 5).await;
    push_prefix(&mut first, 2, BatchKind::Delta, &expected[&2].1, 7, 4).await;
    drop(first);
    let cut = read(&topic).await;
    assert_eq!(cut.len(), 12 + 7, "what the crash left");

    let mut second = endpoint(&topic, partitions);
    second.open().await.unwrap();
    write_txn(&mut second, 2, BatchKind::Delta, &expected[&2].1, 6).await;
    write_txn(&mut second, 3, BatchKind::Delta, &expected[&3].1, 4).await;
    second.close().await;

    let written = read(&topic).await;
    assert_exactly_once(&written, partitions as usize, &expected);
    let used: std::collections::BTreeSet<i32> = written.iter().map(|w| w.partition).collect();
    assert_eq!(
        used.len(),
        partitions as usize,
        "every partition is written"
    );
}

#[tokio::test]
async fn a_transaction_cut_by_a_crash_resumes_exactly_once_in_one_partition() {
    crash_and_replay("crash1", 1).await;
}

#[tokio::test]
async fn a_transaction_cut_by_a_crash_resumes_exactly_once_in_each_of_three_partitions() {
    crash_and_replay("crash3", 3).await;
}

/// What a crash in the middle of a push leaves: the partitions acknowledged different
/// prefixes of the transaction (partition 0 up to its message 15, partition 1 up to
/// 3, partition 2 none of it). The replay resumes each right after its own tail.
#[tokio::test]
async fn a_push_cut_at_a_different_point_in_each_partition_resumes_each_after_its_tail() {
    let topic = new_topic("cut");
    let mut expected = Expected::new();
    for (txn, count) in [(1, 9), (2, 30), (3, 6)] {
        expected.insert(txn, (BatchKind::Delta, messages(txn, count, 0)));
    }
    let mut first = endpoint(&topic, 3);
    first.open().await.unwrap();
    write_txn(&mut first, 1, BatchKind::Delta, &expected[&1].1, 100).await;
    drop(first);
    let admin = Admin::connect(&[LOCAL_BROKER.to_string()]).await.unwrap();
    let cut_before = [15, 3, 0];
    for (partition, cut) in cut_before.into_iter().enumerate() {
        let records: Vec<_> = (expected[&2].1.iter().enumerate())
            .filter(|(i, (key, _))| *i < cut && partition_of(key, 3) == partition)
            .map(|(i, (key, value))| {
                let mut record = stamped(2, i as u64, key, MATERIALIZATION);
                record.value = Some(value.clone());
                record
            })
            .collect();
        assert!(!records.is_empty() || cut == 0, "partition {partition}");
        admin
            .produce_records(&topic, partition as i32, records)
            .await
            .unwrap();
    }

    let mut second = endpoint(&topic, 3);
    second.open().await.unwrap();
    write_txn(&mut second, 2, BatchKind::Delta, &expected[&2].1, 7).await;
    write_txn(&mut second, 3, BatchKind::Delta, &expected[&3].1, 100).await;
    assert_exactly_once(&read(&topic).await, 3, &expected);
}

#[tokio::test]
async fn a_replayed_transaction_that_was_fully_written_is_discarded() {
    let topic = new_topic("replay");
    let mut expected = Expected::new();
    for (txn, count) in [(1, 10), (2, 15), (3, 5)] {
        expected.insert(txn, (BatchKind::Delta, messages(txn, count, 0)));
    }
    let mut first = endpoint(&topic, 3);
    first.open().await.unwrap();
    write_txn(&mut first, 1, BatchKind::Delta, &expected[&1].1, 100).await;
    write_txn(&mut first, 2, BatchKind::Delta, &expected[&2].1, 100).await;
    drop(first);
    let before = read(&topic).await;

    let mut second = endpoint(&topic, 3);
    second.open().await.unwrap();
    write_txn(&mut second, 2, BatchKind::Delta, &expected[&2].1, 4).await;
    assert_eq!(read(&topic).await, before, "the replay wrote nothing");
    write_txn(&mut second, 3, BatchKind::Delta, &expected[&3].1, 100).await;

    assert_exactly_once(&read(&topic).await, 3, &expected);
}

/// A reset: the old generation wrote transactions 1 to 3; the new one numbers from 1
/// again. Every partition's tail is the old generation's, which is nothing of the new
/// one's: it produces all of its transactions, and a restart of it discards only its
/// own.
#[tokio::test]
async fn a_new_generation_produces_every_transaction_after_an_old_generations_tail() {
    let topic = new_topic("generation");
    let mut old_expected = Expected::new();
    for (txn, count) in [(1, 10), (2, 10), (3, 10)] {
        old_expected.insert(txn, (BatchKind::Delta, messages(txn, count, 0)));
    }
    let mut old = endpoint(&topic, 3);
    old.open().await.unwrap();
    for (txn, (kind, messages)) in &old_expected {
        write_txn(&mut old, *txn, *kind, messages, 100).await;
    }
    drop(old);

    let new = new_generation();
    let mut new_expected = Expected::new();
    for (txn, count) in [(1, 12), (2, 6), (3, 4)] {
        // Other keys and values than the old generation's transactions of those numbers.
        let mut of = messages(txn + 10, count, 0);
        for (_, value) in &mut of {
            value.extend_from_slice(b" new");
        }
        new_expected.insert(txn, (BatchKind::Delta, of));
    }
    let mut first = endpoint_of(new, &topic, 3);
    first.open().await.unwrap();
    write_txn(&mut first, 1, BatchKind::Delta, &new_expected[&1].1, 5).await;
    write_txn(&mut first, 2, BatchKind::Delta, &new_expected[&2].1, 5).await;
    drop(first);
    let mut restarted = endpoint_of(new, &topic, 3);
    restarted.open().await.unwrap();
    write_txn(&mut restarted, 2, BatchKind::Delta, &new_expected[&2].1, 4).await;
    write_txn(&mut restarted, 3, BatchKind::Delta, &new_expected[&3].1, 4).await;

    let written = read(&topic).await;
    let (olds, news): (Vec<Written>, Vec<Written>) =
        (written.into_iter()).partition(|w| w.stamp.generation == Some(GENERATION.id));
    assert!(news.iter().all(|w| w.stamp.generation == Some(new.id)));
    assert_exactly_once(&olds, 3, &old_expected);
    assert_exactly_once(&news, 3, &new_expected);
}

#[tokio::test]
async fn a_foreign_message_at_a_partitions_end_fails_open_as_corrupt() {
    let topic = new_topic("foreign");
    let mut out = endpoint(&topic, 2);
    out.open().await.unwrap();
    write_txn(&mut out, 1, BatchKind::Delta, &messages(1, 10, 0), 100).await;
    out.close().await;
    let admin = Admin::connect(&[LOCAL_BROKER.to_string()]).await.unwrap();
    let offsets = admin
        .produce(&topic, 1, [(None, b"not ours".to_vec())])
        .await
        .unwrap();

    let err = endpoint(&topic, 2).open().await.unwrap_err();
    assert!(matches!(err, OutputError::Corrupt(_)), "{err:?}");
    let message = err.to_string();
    let place = format!("topic {topic} partition 1 ends at offset {}", offsets[0]);
    assert!(message.contains(&place), "{message}");
    assert!(message.contains("no sluice-txn header"), "{message}");

    let err = read_topic(&[LOCAL_BROKER.to_string()], &topic)
        .await
        .unwrap_err();
    assert!(matches!(err, OutputError::Corrupt(_)), "{err:?}");
}

/// Pushes return before the broker answers (each partition's producer sends in the
/// background): a produce that fails is the batch's end's error, nothing of the batch is
/// sent after it, and the next push reads the tails again.
#[tokio::test]
async fn a_produce_that_fails_in_the_background_fails_the_batch_end_and_the_tails_are_read_again() {
    let topic = new_topic("background");
    let mut out = endpoint(&topic, 1);
    out.open().await.unwrap();
    // Another producer appends after open: the partition's next offset is not where
    // this output's first produce finds its messages put.
    let admin = Admin::connect(&[LOCAL_BROKER.to_string()]).await.unwrap();
    admin
        .produce(&topic, 0, [(None, b"not ours".to_vec())])
        .await
        .unwrap();
    let batch = messages(1, 40, 0);
    push_prefix(&mut out, 1, BatchKind::Delta, &batch, batch.len(), 10).await;
    let err = out.batch_end().await.unwrap_err();
    assert!(matches!(err, OutputError::Corrupt(_)), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains(&format!("topic {topic} partition 0"))
            && message.contains("another producer writes to the topic"),
        "{message}"
    );
    // The batch again (the runtime's replay): the endpoint reads the tail again and
    // sends only what its failed produce did not land, so the partition holds the
    // foreign message and each of the batch's once.
    write_txn(&mut out, 1, BatchKind::Delta, &batch, 10).await;
    let probe = admin
        .produce(&topic, 0, [(None, b"probe".to_vec())])
        .await
        .unwrap();
    assert_eq!(probe, vec![1 + 40]);
}

#[tokio::test]
async fn another_materializations_message_at_a_partitions_end_fails_open_as_corrupt() {
    let topic = new_topic("other");
    let mut out = endpoint(&topic, 1);
    out.open().await.unwrap();
    write_txn(&mut out, 4, BatchKind::Delta, &messages(4, 3, 0), 100).await;
    let admin = Admin::connect(&[LOCAL_BROKER.to_string()]).await.unwrap();
    let record = stamped(9, 0, b"{\"id\":1}", "acme/other");
    admin
        .produce_records(&topic, 0, vec![record])
        .await
        .unwrap();

    let err = endpoint(&topic, 1).open().await.unwrap_err();
    assert!(matches!(err, OutputError::Corrupt(_)), "{err:?}");
    assert!(
        err.to_string().contains(&format!(
            "materialization acme/other wrote it, not {MATERIALIZATION}"
        )),
        "{err}"
    );
    let stamps: Vec<Stamp> = read(&topic).await.into_iter().map(|w| w.stamp).collect();
    assert_eq!(stamps.len(), 4);
}

#[tokio::test]
async fn an_unreachable_broker_is_a_retryable_error_naming_brokers_and_topic() {
    let target = Target {
        materialization: MATERIALIZATION.into(),
        resource: json!({"topic": "nowhere"}),
        format: Format::Json,
        header: None,
        generation: *GENERATION,
        former_writers: false,
    };
    let config = json!({"brokers": ["127.0.0.1:1"]});
    let mut out = (sluice_kafka_output::kind().endpoint)(&config, target).unwrap();
    let err = out.open().await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("brokers 127.0.0.1:1"), "{message}");
    assert!(message.contains("topic nowhere"), "{message}");
}

#[test]
fn the_kind_checks_configs_and_names_a_bindings_topic() {
    let kind = sluice_kafka_output::kind();
    assert_eq!(kind.name, "kafka");
    (kind.check)(&json!({"brokers": ["a:9092"], "max_buffer_size_bytes": 4096})).unwrap();
    let err = (kind.check)(&json!({"brokers": "a"})).unwrap_err();
    assert!(err.to_string().starts_with("brokers:"), "{err}");
    assert_eq!(
        (kind.resource_path)(&json!({"topic": "views", "partitions": 4})).unwrap(),
        ["views"]
    );
    let err = (kind.resource_path)(&json!({"topik": "views"})).unwrap_err();
    assert!(matches!(err, OutputError::Config(_)), "{err:?}");
    for schema in [kind.endpoint_schema, kind.resource_schema] {
        serde_json::from_str::<serde_json::Value>(&schema()).unwrap();
    }
    let target = Target {
        materialization: MATERIALIZATION.into(),
        resource: json!({"topic": "t"}),
        format: Format::Avro,
        header: None,
        generation: *GENERATION,
        former_writers: false,
    };
    let out = (kind.endpoint)(
        &json!({"brokers": "a:1", "max_buffer_size_bytes": 4096}),
        target,
    )
    .unwrap();
    assert_eq!(out.max_buffer_size_bytes(), 4096);
}
