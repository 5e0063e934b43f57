//! The Kafka source against a real broker (tansu on 127.0.0.1:9092, started if none
//! answers): configuration errors, steps that seek and replay exactly, partitions
//! added and removed, metadata, where bad input is said to be, and a topic
//! `partitioned_by: key_range` read by shards of part of the key space.

use serde_json::{Value, json};
use sluice_kafka::admin::Admin;
use sluice_kafka::source::KafkaPosition;
use sluice_kafka::{KafkaConfig, KafkaFormat, KafkaKind, KafkaSource, PartitionedBy, Start};
use sluice_kafka_client::key_range;
use sluice_source_sdk::health::Report;
use sluice_source_sdk::testing::{ALL, parsed_docs, position, records};
use sluice_source_sdk::{
    Connection, Health, Opening, QueueLimits, Records, Resume, ShardKeys, Source, SourceError,
    Step, kind,
};
use sluice_testkit::conformance::unique_name;
use sluice_testkit::tansu::{LOCAL_BROKER, ensure_local_broker};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A topic of its own for one test. It is not deleted after: tansu 0.6.0 panics (and
/// serves nothing more) when a topic is deleted while fetches are in flight, as they
/// are in the tests running beside this one. Names are unique, so none collide.
struct Topic {
    admin: Admin,
    name: String,
}

impl Topic {
    async fn new(test: &str, partitions: i32) -> Topic {
        ensure_local_broker().unwrap();
        let admin = Admin::connect(&[LOCAL_BROKER.to_string()]).await.unwrap();
        let name = format!("{test}-{}", unique_name());
        admin.create_topic(&name, partitions).await.unwrap();
        Topic { admin, name }
    }

    fn config(&self) -> KafkaConfig {
        KafkaConfig {
            brokers: vec![LOCAL_BROKER.to_string()],
            topic: self.name.clone(),
            partitions: None,
            start: Start::Earliest,
            format: KafkaFormat::Json,
            partitioned_by: None,
            meta: None,
            fetch_wait: std::time::Duration::from_millis(10),
            tls: None,
            sasl: None,
        }
    }

    /// Produces `{"p": partition, "i": i}` for each `i` in `range` to `partition`, in
    /// batches of `batch`.
    async fn produce(&self, partition: i32, range: std::ops::Range<usize>, batch: usize) {
        let docs: Vec<usize> = range.collect();
        for chunk in docs.chunks(batch) {
            let messages = chunk.iter().map(|i| {
                let value = json!({"p": partition, "i": i}).to_string().into_bytes();
                (Some(format!("k{i}").into_bytes()), value)
            });
            self.admin
                .produce(&self.name, partition, messages)
                .await
                .unwrap();
        }
    }
}

/// Queues steps (each waiting for input first) until one ends the input, or fails.
async fn read_to_end(
    source: &mut KafkaSource,
    limits: QueueLimits,
) -> Result<Vec<(Vec<Value>, Step)>, SourceError> {
    source.extend();
    let mut steps = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "the source never caught up");
        let _ = tokio::time::timeout(Duration::from_millis(200), source.ready()).await;
        let mut out = Records::default();
        let step = source.queue(limits, &mut out).await?;
        let end = step.end_of_input;
        if step.records > 0 || end {
            steps.push((parsed_docs(&mut out), step));
        }
        if end {
            return Ok(steps);
        }
    }
}

fn docs_of(steps: &[(Vec<Value>, Step)]) -> Vec<Value> {
    steps.iter().flat_map(|(docs, _)| docs.clone()).collect()
}

/// Sorted by partition, then by i: the order-free content of a read.
fn sorted(mut docs: Vec<Value>) -> Vec<Value> {
    docs.sort_by_key(|d| (d["p"].as_i64(), d["i"].as_i64()));
    docs
}

fn expected(partitions: i32, per_partition: usize) -> Vec<Value> {
    (0..partitions)
        .flat_map(|p| (0..per_partition).map(move |i| json!({"p": p, "i": i})))
        .collect()
}

fn parse(config: Value) -> Result<KafkaConfig, String> {
    kind::<KafkaKind>()
        .parse(config, Path::new("."))
        .map(|c| c.get::<KafkaConfig>().unwrap().clone())
        .map_err(|e| e.to_string())
}

#[test]
fn configuration_is_strict_and_errors_name_their_place() {
    let base = json!({"brokers": ["127.0.0.1:9092"], "topic": "views", "format": "json"});
    let config = parse(base.clone()).unwrap();
    assert_eq!(config.meta.as_deref(), Some("_meta"));
    assert_eq!(config.start, Start::Earliest);
    assert_eq!(config.partitions, None);
    let with = |key: &str, value: Value| {
        let mut config = base.clone();
        config[key] = value;
        parse(config)
    };
    assert_eq!(with("meta", Value::Null).unwrap().meta, None);
    // As the output takes them: one string, a comma-separated string, or a list whose
    // items may be such strings (a list holding `${KAFKA_BROKERS}`).
    for brokers in [json!("a:1, b:2"), json!(["a:1", "b:2"]), json!(["a:1,b:2"])] {
        assert_eq!(with("brokers", brokers).unwrap().brokers, ["a:1", "b:2"]);
    }
    assert_eq!(with("start", json!("latest")).unwrap().start, Start::Latest);
    assert_eq!(
        with("start", json!({"0": 120, "3": 0})).unwrap().start,
        Start::Offsets([(0, 120), (3, 0)].into())
    );
    for (key, value, error) in [
        (
            "start",
            json!("first"),
            "start: invalid value: string \"first\"",
        ),
        ("start", json!({"x": 1}), "\"x\" is not a partition number"),
        ("start", json!({"0": -1}), "start"),
        ("format", json!("csv"), "format: unknown variant `csv`"),
        ("brokers", json!([]), "brokers: name at least one broker"),
        (
            "brokers",
            json!(["localhost"]),
            "brokers[0]: \"localhost\" is not host:port",
        ),
        (
            "brokers",
            json!(["a:1", "b:2,c"]),
            "brokers[1]: \"c\" is not host:port",
        ),
        ("topic", json!(""), "topic: the topic name is empty"),
        (
            "partitions",
            json!([]),
            "partitions: name at least one partition",
        ),
        (
            "partitions",
            json!([0, 1, 0]),
            "partitions[2]: partition 0 is named twice",
        ),
        ("partitions", json!([-1]), "partitions"),
        ("meta", json!(""), "meta: name the property"),
        ("group", json!("g"), "unknown field `group`"),
    ] {
        let got = with(key, value.clone()).unwrap_err();
        assert!(got.contains(error), "{key}: {value}: {got}");
    }
    let mut both = base.clone();
    both["partitions"] = json!([0, 1]);
    both["start"] = json!({"2": 5});
    let got = parse(both).unwrap_err();
    assert!(
        got.starts_with("start.2: partition 2 is not among"),
        "{got}"
    );
}

#[tokio::test]
async fn steps_seek_and_replay_exactly() {
    let topic = Topic::new("exact", 4).await;
    for p in 0..4 {
        // Batches of 4: steps begin and end inside them.
        topic.produce(p, 0..10, 4).await;
    }
    let mut source = KafkaSource::new("views", &topic.config());
    let steps = read_to_end(&mut source, records(7)).await.unwrap();
    assert_eq!(sorted(docs_of(&steps)), expected(4, 10));
    for (docs, step) in &steps {
        assert!(step.records <= 7);
        // Grouped by partition in partition order, each partition in offset order.
        let order: Vec<_> = docs
            .iter()
            .map(|d| (d["p"].as_i64(), d["i"].as_i64()))
            .collect();
        let mut in_order = order.clone();
        in_order.sort();
        assert_eq!(order, in_order);
        // Each range read is exactly what the step holds of that partition.
        let at: KafkaPosition = serde_json::from_value(position(step).clone()).unwrap();
        for (p, [begin, end]) in &at.read {
            let is: Vec<i64> = docs
                .iter()
                .filter(|d| d["p"] == *p)
                .map(|d| d["i"].as_i64().unwrap())
                .collect();
            assert_eq!(is, (*begin..*end).collect::<Vec<_>>(), "partition {p}");
        }
        assert_eq!(at.next.len(), 4, "every partition's next offset");
    }
    assert!(steps.len() >= 6, "40 messages in steps of at most 7");

    for (i, (docs, step)) in steps.iter().enumerate() {
        // A replay returns the step as first read, in the same order.
        let mut fresh = KafkaSource::new("views", &topic.config());
        let mut out = Records::default();
        let replayed = fresh.replay(&step.resume, &mut out).await.unwrap();
        assert_eq!(&parsed_docs(&mut out), docs, "step {i}");
        assert_eq!(replayed.resume, step.resume);
        // ... and leaves the source after it, as a seek there does.
        let after_replay = read_to_end(&mut fresh, ALL).await.unwrap();
        let mut sought = KafkaSource::new("views", &topic.config());
        sought.seek(position(step)).await.unwrap();
        let after_seek = read_to_end(&mut sought, ALL).await.unwrap();
        let rest: Vec<Value> = docs_of(&steps[i + 1..]);
        assert_eq!(
            sorted(docs_of(&after_replay)),
            sorted(rest.clone()),
            "step {i}"
        );
        assert_eq!(sorted(docs_of(&after_seek)), sorted(rest), "step {i}");
    }

    // A step whose hash does not match what the broker now holds is refused.
    let (_, step) = &steps[0];
    let Resume::Replay { position, hash, .. } = step.resume.clone() else {
        panic!("{:?}", step.resume)
    };
    let changed = Resume::Replay {
        position,
        data: None,
        hash: hash ^ 1,
    };
    let mut out = Records::default();
    let err = KafkaSource::new("views", &topic.config())
        .replay(&changed, &mut out)
        .await
        .unwrap_err();
    assert!(matches!(err, SourceError::ReplayMismatch { .. }), "{err}");
    assert!(out.is_empty(), "nothing of a refused replay is kept");
}

/// A position of this source's shape, as JSON.
fn position_of(next: &[(i32, i64)], read: &[(i32, [i64; 2])]) -> Value {
    serde_json::to_value(KafkaPosition {
        next: next.iter().copied().collect(),
        read: read.iter().copied().collect(),
        partitions: None,
    })
    .unwrap()
}

#[tokio::test]
async fn replaying_other_or_missing_offsets_is_refused() {
    let topic = Topic::new("changed", 2).await;
    topic.produce(0, 0..10, 10).await;
    let mut source = KafkaSource::new("views", &topic.config());
    let steps = read_to_end(&mut source, records(5)).await.unwrap();
    let Resume::Replay { hash, .. } = steps[0].1.resume.clone() else {
        panic!("{:?}", steps[0].1.resume)
    };
    // The offsets hold other messages than the step hashed (as after a topic is
    // recreated): the replay sees the difference and keeps nothing.
    let other = Resume::Replay {
        position: position_of(&[(0, 10), (1, 0)], &[(0, [5, 10])]),
        data: None,
        hash,
    };
    let mut out = Records::default();
    let err = KafkaSource::new("views", &topic.config())
        .replay(&other, &mut out)
        .await
        .unwrap_err();
    assert!(matches!(err, SourceError::ReplayMismatch { .. }), "{err}");
    assert!(out.is_empty(), "nothing of a refused replay is kept");

    // Offsets the partition does not hold: named by topic, partition and offsets.
    let beyond = Resume::Replay {
        position: position_of(&[(0, 20), (1, 0)], &[(0, [5, 20])]),
        data: None,
        hash,
    };
    let err = KafkaSource::new("views", &topic.config())
        .replay(&beyond, &mut out)
        .await
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, SourceError::Unavailable { .. }), "{text}");
    let at = format!(
        "topic {} partition 0: the step read offsets 5..20",
        topic.name
    );
    assert!(
        text.contains(&at) && text.contains("now ends at offset 10"),
        "{text}"
    );
    let err = KafkaSource::new("views", &topic.config())
        .seek(&position_of(&[(0, 20), (1, 0)], &[]))
        .await
        .unwrap_err();
    let text = err.to_string();
    let at = format!(
        "topic {} partition 0: the committed position is offset 20",
        topic.name
    );
    assert!(text.contains(&at), "{text}");
}

#[tokio::test]
async fn start_latest_and_start_offsets() {
    let topic = Topic::new("start", 2).await;
    topic.produce(0, 0..5, 5).await;
    topic.produce(1, 0..5, 5).await;
    let mut latest = KafkaSource::new(
        "views",
        &KafkaConfig {
            start: Start::Latest,
            ..topic.config()
        },
    );
    let steps = read_to_end(&mut latest, ALL).await.unwrap();
    assert_eq!(
        docs_of(&steps),
        Vec::<Value>::new(),
        "nothing before the start"
    );
    topic.produce(1, 5..7, 2).await;
    let mut seen = Vec::new();
    while seen.len() < 2 {
        seen.extend(docs_of(&read_to_end(&mut latest, ALL).await.unwrap()));
    }
    assert_eq!(seen, vec![json!({"p": 1, "i": 5}), json!({"p": 1, "i": 6})]);

    let mut offsets = KafkaSource::new(
        "views",
        &KafkaConfig {
            start: Start::Offsets([(0, 3)].into()),
            partitions: Some(vec![0]),
            ..topic.config()
        },
    );
    let docs = docs_of(&read_to_end(&mut offsets, ALL).await.unwrap());
    assert_eq!(docs, vec![json!({"p": 0, "i": 3}), json!({"p": 0, "i": 4})]);

    let mut beyond = KafkaSource::new(
        "views",
        &KafkaConfig {
            start: Start::Offsets([(0, 9)].into()),
            ..topic.config()
        },
    );
    let err = read_to_end(&mut beyond, ALL).await.unwrap_err().to_string();
    assert!(
        err.contains("start offset 9 of topic") && err.contains("outside its offsets 0..5"),
        "{err}"
    );
    let mut missing = KafkaSource::new(
        "views",
        &KafkaConfig {
            partitions: Some(vec![0, 7]),
            ..topic.config()
        },
    );
    let err = read_to_end(&mut missing, ALL)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("has no partition 7 (it has 2 partitions)"),
        "{err}"
    );
}

#[tokio::test]
async fn partitions_missing_from_a_position_are_read_from_their_beginning() {
    // tansu cannot add partitions to a topic (no CreatePartitions), so the topic grew
    // as far as this position knows: it was recorded when only partitions 0 and 1 were
    // read. A source resuming there reads partitions 2 and 3 from their beginning.
    let topic = Topic::new("grow", 4).await;
    for p in 0..4 {
        topic.produce(p, 0..3, 3).await;
    }
    let mut source = KafkaSource::new("views", &topic.config());
    source
        .seek(&position_of(&[(0, 3), (1, 1)], &[]))
        .await
        .unwrap();
    let steps = read_to_end(&mut source, ALL).await.unwrap();
    let mut want = expected(4, 3);
    want.retain(|d| d["p"] != 0 && !(d["p"] == 1 && d["i"] == 0));
    assert_eq!(sorted(docs_of(&steps)), want);
    let last: KafkaPosition =
        serde_json::from_value(position(&steps.last().unwrap().1).clone()).unwrap();
    assert_eq!(last.next, [(0, 3), (1, 3), (2, 3), (3, 3)].into());
}

#[tokio::test]
async fn a_position_with_more_partitions_than_the_topic_is_refused() {
    let topic = Topic::new("shrunk", 2).await;
    let err = KafkaSource::new("views", &topic.config())
        .seek(&position_of(&[(0, 0), (1, 0), (2, 0)], &[]))
        .await
        .unwrap_err()
        .to_string();
    let counts = format!(
        "topic {} has 2 partitions, but partition 2 was read",
        topic.name
    );
    assert!(
        err.contains(&counts) && err.contains("cannot shrink"),
        "{err}"
    );
}

#[tokio::test]
async fn metadata_is_added_and_bad_input_is_placed_by_offset() {
    use rskafka::chrono::DateTime;
    use rskafka::record::Record;
    let topic = Topic::new("meta", 3).await;
    let record = |key: Option<&[u8]>, value: &[u8]| Record {
        key: key.map(<[u8]>::to_vec),
        value: Some(value.to_vec()),
        headers: [("trace".to_string(), b"t-1".to_vec())].into(),
        timestamp: DateTime::from_timestamp_millis(1_700_000_000_007).unwrap(),
    };
    let records = vec![
        record(Some(b"user-1"), br#"{"views": 3}"#),
        record(None, b"[1, 2]"),
        record(Some(&[0xff]), b"not json"),
    ];
    topic
        .admin
        .produce_records(&topic.name, 2, records)
        .await
        .unwrap();

    let config = KafkaConfig {
        meta: Some("_meta".to_string()),
        ..topic.config()
    };
    let mut source = KafkaSource::new("views", &config);
    let steps = read_to_end(&mut source, ALL).await.unwrap();
    let docs = docs_of(&steps);
    assert_eq!(
        docs,
        vec![
            json!({"views": 3, "_meta": {"topic": topic.name, "partition": 2, "offset": 0,
            "timestamp": 1_700_000_000_007i64, "key": "user-1", "headers": {"trace": "t-1"}}})
        ]
    );
    let errors: Vec<String> = steps
        .iter()
        .flat_map(|(_, s)| s.errors.iter().map(|e| e.to_string()))
        .collect();
    let at = |offset| format!("topic {} partition 2 offset {offset}: ", topic.name);
    assert_eq!(errors.len(), 2, "{errors:?}");
    assert!(errors[0].starts_with(&at(1)) && errors[0].contains("not a JSON object"));
    assert!(errors[1].starts_with(&at(2)));

    // Without metadata every value is handed over as it is, each at its position; the
    // reader's combiner names the one that is not JSON there.
    let mut plain = KafkaSource::new("views", &topic.config());
    plain.extend();
    let mut out = Records::default();
    while out.len() < 3 {
        plain.ready().await;
        plain.queue(ALL, &mut out).await.unwrap();
    }
    let positions: Vec<String> = out.iter_mut().map(|r| r.position.to_string()).collect();
    let source = format!("topic {} partition 2", topic.name);
    assert_eq!(
        positions,
        (0..3)
            .map(|o| format!("{source} offset {o}"))
            .collect::<Vec<_>>()
    );
}

/// What a source told its [`Health`].
#[derive(Default)]
struct Told(std::sync::Mutex<Vec<Connection>>);

impl Report for Told {
    fn report(&self, connection: Connection) {
        self.0.lock().unwrap().push(connection);
    }
}

/// No broker on the port: the first call retries inside itself, and says so at once,
/// with the error of each failed round, rather than only when it gives up.
#[tokio::test]
async fn a_broker_that_cannot_be_reached_is_told_to_health_while_the_call_retries() {
    let told = Arc::new(Told::default());
    let health = Health::new(told.clone());
    let state_dir = std::env::temp_dir();
    let opening = Opening {
        health: &health,
        // The Kafka source keeps nothing there.
        ..Opening::standalone("views", &state_dir)
    };
    let config = json!({"brokers": ["127.0.0.1:1"], "topic": "nowhere", "format": "json"});
    let config = kind::<KafkaKind>().parse(config, Path::new(".")).unwrap();
    let mut source = config.open(&opening).unwrap();
    let mut out = Records::default();
    let retried = async {
        while told.0.lock().unwrap().len() < 2 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::select! {
        step = source.queue(ALL, &mut out) => panic!("the call ended first: {:?}", step.err()),
        () = retried => {}
    }
    let told = told.0.lock().unwrap().clone();
    assert_eq!(told[0], Connection::Connecting);
    let Connection::Retrying { error } = &told[1] else {
        panic!("{told:?}");
    };
    assert!(
        error.contains("source views: cannot read brokers 127.0.0.1:1"),
        "{error}"
    );
}

/// The shards of key hashes `ranges` (`[begin, end]` each), reading the key hash of
/// `{"p": p, "i": i}` as the `i`-th hash of partition `p`'s slice of `partitions`: where
/// the key-range partitioner puts what `Topic::produce` writes to partition `p`.
fn shard_keys(ranges: &[(u32, u32)], partitions: u32) -> ShardKeys {
    ShardKeys::new(ranges.to_vec(), move |text| {
        let doc: Value = serde_json::from_slice(text).ok()?;
        let (p, i) = (doc["p"].as_u64()?, doc["i"].as_u64()?);
        Some(key_range::slice(p as u32, partitions).start() + i as u32)
    })
}

fn partitioned(topic: &Topic, shards: ShardKeys) -> KafkaSource {
    let config = KafkaConfig {
        partitioned_by: Some(PartitionedBy::KeyRange),
        ..topic.config()
    };
    KafkaSource::new("views", &config).for_shards(Some(shards))
}

/// `{"p": p, "i": i}` for each partition `p` and `i` in `range`.
fn docs_in(partitions: &[i32], range: std::ops::Range<usize>) -> Vec<Value> {
    (partitions.iter())
        .flat_map(|&p| range.clone().map(move |i| json!({"p": p, "i": i})))
        .collect()
}

#[tokio::test]
async fn shards_read_only_their_partitions_and_a_half_reads_on_from_its_parents_position() {
    let topic = Topic::new("key-range", 4).await;
    for p in 0..4 {
        topic.produce(p, 0..10, 4).await;
    }
    // The lower half of the key hashes: partitions 0 and 1 of 4.
    let mut low = partitioned(&topic, shard_keys(&[(0, 0x7fff_ffff)], 4));
    let steps = read_to_end(&mut low, ALL).await.unwrap();
    assert_eq!(sorted(docs_of(&steps)), docs_in(&[0, 1], 0..10));
    let at = serde_json::from_value::<KafkaPosition>(position(&steps.last().unwrap().1).clone())
        .unwrap();
    assert_eq!(at.next.keys().copied().collect::<Vec<_>>(), [0, 1]);
    assert_eq!(
        at.partitions,
        Some(4),
        "the count its slices were read over"
    );

    // The whole range, then its upper half from there (a split's half, copying its
    // parent's log): the parent's offsets of partitions 2 and 3, and only those.
    let mut parent = partitioned(&topic, shard_keys(&[(0, u32::MAX)], 4));
    let steps = read_to_end(&mut parent, ALL).await.unwrap();
    assert_eq!(sorted(docs_of(&steps)), docs_in(&[0, 1, 2, 3], 0..10));
    let parents = position(&steps.last().unwrap().1).clone();
    for p in 0..4 {
        topic.produce(p, 10..15, 4).await;
    }
    let mut high = partitioned(&topic, shard_keys(&[(0x8000_0000, u32::MAX)], 4));
    high.seek(&parents).await.unwrap();
    let steps = read_to_end(&mut high, ALL).await.unwrap();
    assert_eq!(sorted(docs_of(&steps)), docs_in(&[2, 3], 10..15));
    let at = serde_json::from_value::<KafkaPosition>(position(&steps.last().unwrap().1).clone())
        .unwrap();
    assert_eq!(at.next, [(2, 15), (3, 15)].into());
    let fetched = |source: &KafkaSource| {
        let metrics = source.metrics();
        let counter = metrics.iter().find(|m| m.name == "kafka_fetched_messages");
        counter.unwrap().value
    };
    assert!(fetched(&high) < 20, "fetched {} of 20", fetched(&high));
}

#[tokio::test]
async fn shards_of_ranges_apart_read_only_the_partitions_of_each() {
    // A cluster member's shards of one materialization share one read, their ranges
    // need not touch: here partitions 0 and 2 of 4, not 1 between them.
    let topic = Topic::new("ranges-apart", 4).await;
    for p in 0..4 {
        topic.produce(p, 0..10, 4).await;
    }
    let ranges = [(0, 0x3fff_ffff), (0x8000_0000, 0xbfff_ffff)];
    let mut source = partitioned(&topic, shard_keys(&ranges, 4));
    let steps = read_to_end(&mut source, ALL).await.unwrap();
    assert_eq!(sorted(docs_of(&steps)), docs_in(&[0, 2], 0..10));
    let at = serde_json::from_value::<KafkaPosition>(position(&steps.last().unwrap().1).clone())
        .unwrap();
    assert_eq!(at.next, [(0, 10), (2, 10)].into());
}

#[tokio::test]
async fn a_message_outside_its_partitions_key_range_fails_naming_partition_offset_and_key() {
    let topic = Topic::new("misplaced", 2).await;
    topic.produce(0, 0..3, 3).await;
    // A key of partition 1's slice, produced to partition 0 at offset 3.
    let misplaced = json!({"p": 1, "i": 0}).to_string().into_bytes();
    let produced = topic
        .admin
        .produce(&topic.name, 0, [(Some(b"u7".to_vec()), misplaced)]);
    assert_eq!(produced.await.unwrap(), [3]);
    let mut source = partitioned(&topic, shard_keys(&[(0, u32::MAX)], 2));
    let err = read_to_end(&mut source, ALL).await.unwrap_err();
    assert!(matches!(err, SourceError::Config { .. }), "{err}");
    assert!(!err.is_retryable());
    let err = err.to_string();
    assert!(
        err.contains("partition 0 offset 3: the message (key u7) has key hash 80000000")
            && err.contains("puts in partition 1 of 2 (hashes 80000000-ffffffff)"),
        "{err}"
    );
}

#[tokio::test]
async fn a_position_over_another_partition_count_is_refused() {
    let topic = Topic::new("recounted", 4).await;
    let mut source = partitioned(&topic, shard_keys(&[(0, u32::MAX)], 4));
    source
        .seek(&json!({"next": {"0": 0, "1": 0}, "read": {}, "partitions": 2}))
        .await
        .unwrap();
    let err = read_to_end(&mut source, ALL).await.unwrap_err().to_string();
    assert!(
        err.contains("has 4 partitions, but it was read partitioned_by key_range over 2"),
        "{err}"
    );
}
