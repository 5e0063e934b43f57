//! Partitioned reads: a Kafka topic `partitioned_by: key_range` (filled by `sluice
//! produce`, which partitions by key range for such a source) read by a cluster's
//! shards, each only in the partitions holding its key range, into one PostgreSQL
//! table (a private etcd member; tansu on 127.0.0.1:9092):
//! - three shards over six partitions: the table is exact, and each shard's source
//!   reads its two partitions only (its per-partition gauges name them) and fetches
//!   far less than the topic (its fetched-messages counter);
//! - a shard split while the topic grows: the halves start from their parent's
//!   positions, each reads its one partition only, and the table is exact;
//! - a topic whose producer did not partition by key range (Kafka's murmur2 of the
//!   message key) fails the run, naming the partition, offset and key of the first
//!   misplaced message, rather than losing what no shard would read.

mod common;

use common::cluster::Members;
use common::{
    PAGEVIEWS_COLLECTION, POSTGRES_URL, SLUICE, Schema, free_address, generate, postgres_table,
    reduce_expected, wait_until, write_lines,
};
use serde_json::Value;
use sluice_doc::key_hash;
use sluice_doc::tuple::pack_key;
use sluice_http::client::Client;
use sluice_kafka_client::key_range;
use sluice_testkit::etcd::PrivateEtcd;
use sluice_testkit::tansu::{LOCAL_BROKER, ensure_local_broker};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const PARTITIONS: u32 = 6;

/// Longer than anything here should take: reaching it fails the test.
const PATIENCE: Duration = Duration::from_secs(120);

/// A topic name no other test or run uses. The topic is left behind: tansu 0.6.0 panics
/// when a topic is deleted while fetches are in flight (see `kafka.rs`).
fn unique_topic(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("partitions-{test}-{}-{nanos:x}", std::process::id())
}

/// The pageviews from topic `topic` (`partitioned_by: key_range`) into `endpoint`;
/// `cluster` is the YAML of the `cluster:` section, if any.
fn pipeline(topic: &str, endpoint: &str, cluster: &str) -> String {
    format!(
        r#"{PAGEVIEWS_COLLECTION}sources:
  views-kafka:
    target: acme/pageviews
    kafka: {{brokers: ["{LOCAL_BROKER}"], topic: {topic}, format: json, meta: null, partitioned_by: key_range}}
materializations:
  views-db:
    endpoint:
      {endpoint}
    bindings:
      - source: acme/pageviews
        resource: {{table: pageviews}}
runtime:
  transactions: {{max_docs: 500, max_duration: 200ms, min_duration: 200ms}}
{cluster}"#
    )
}

/// `sluice produce` of `docs` to the topic of the pipeline's source (created with
/// [`PARTITIONS`] partitions when missing); the variables of a member's pipeline file
/// are set, though it reads none of what they are for.
fn produce(dir: &Path, pipeline: &Path, docs: &[Value]) {
    let input = dir.join("produced.jsonl");
    write_lines(&input, docs);
    let out = Command::new(SLUICE)
        .env("MEMBER", "producer")
        .env("METRICS", "127.0.0.1:0")
        .arg("produce")
        .arg(pipeline)
        .arg("views-kafka")
        .arg(&input)
        .args(["--partitions", &PARTITIONS.to_string()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "sluice produce failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The partition the key-range partitioner gives a pageview.
fn partition_of(doc: &Value) -> u32 {
    let hash = key_hash(&pack_key(&[doc["user_id"].clone()]));
    key_range::partition_of_hash(hash, PARTITIONS)
}

/// What a shard's source said of itself in `/api/status` (sampled as it reads, so a
/// counter may be a little behind): the partitions it has a lag gauge for, which are
/// the partitions its fetch polls, and the messages it fetched.
#[derive(Debug)]
struct SourceRead {
    partitions: BTreeSet<u32>,
    fetched_messages: u64,
}

/// The [`SourceRead`] of each of the running shards `ids` (`<begin>-<end>` in hex), once
/// the member at `address` serves them all, each source having said its partitions.
fn reads(address: SocketAddr, ids: &[&str]) -> BTreeMap<String, SourceRead> {
    let mut client = Client::new(address, "");
    wait_until("every shard's source metrics", PATIENCE, || {
        let status: Value = client.request("GET", "/api/status", &[], b"").ok()?.json();
        let mut reads = BTreeMap::new();
        for shard in status["shards"].as_array()? {
            let id = shard["shard"].as_str()?;
            if !ids.contains(&id) || shard["state"] != "running" {
                continue;
            }
            let metrics = shard["sources"]["views-kafka"]["metrics"].as_array()?;
            let named = |name: &'static str| metrics.iter().filter(move |m| m["name"] == name);
            let partitions: BTreeSet<u32> = named("kafka_partition_lag_messages")
                .map(|m| m["labels"]["partition"].as_str().unwrap().parse().unwrap())
                .collect();
            let fetched_messages = named("kafka_fetched_messages")
                .map(|m| m["value"].as_u64().unwrap())
                .sum();
            if !partitions.is_empty() {
                let read = SourceRead {
                    partitions,
                    fetched_messages,
                };
                reads.insert(id.to_string(), read);
            }
        }
        Some(reads).filter(|r| r.len() == ids.len())
    })
}

/// The partitions overlapping the key hashes of shard `id` (`<begin>-<end>` in hex).
fn partitions_of_shard(id: &str) -> BTreeSet<u32> {
    let (begin, end) = id.split_once('-').unwrap();
    let hex = |h: &str| u32::from_str_radix(h, 16).unwrap();
    key_range::overlapping(hex(begin), hex(end), PARTITIONS).collect()
}

/// Waits until `shards` shards run (the table exists once one does), then until the
/// table holds the reduction of `docs`.
fn wait_exact(schema: &Schema, docs: &[Value], shards: usize, members: &Members) {
    let started = std::time::Instant::now();
    while (members.list().iter())
        .filter(|s| s["status"] == "running")
        .count()
        != shards
    {
        assert!(
            started.elapsed() < PATIENCE,
            "the shards never ran: {:#?}\n{}",
            members.list(),
            members.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let expected = reduce_expected(docs);
    while postgres_table(&schema.0) != expected {
        assert!(
            started.elapsed() < PATIENCE,
            "the table never became exact\n{}",
            members.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn shards_read_only_the_partitions_of_their_key_range_and_a_split_reads_on_exactly() {
    ensure_local_broker().unwrap();
    let etcd = PrivateEtcd::start();
    let schema = Schema::new("partitions");
    let dir = tempfile::tempdir().unwrap();
    let topic = unique_topic("cluster");
    let endpoint = format!(
        "postgres: {{url: \"{POSTGRES_URL}\", schema: {}}}",
        schema.0
    );
    let cluster = format!(
        "  metrics: {{listen: \"${{METRICS}}\"}}\ncluster:\n  etcd: [\"{}\"]\n  member: \
         ${{MEMBER}}\n  lease_ttl: 3s\n  shards: 3\n",
        etcd.url()
    );
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, pipeline(&topic, &endpoint, &cluster)).unwrap();
    let docs = generate(6_000, 600, 41);
    let (first, more) = docs.split_at(3_000);
    produce(dir.path(), &path, first);
    let mut members = Members::new(dir.path(), &path);
    let address = free_address();
    members
        .env
        .push(("METRICS".to_string(), address.to_string()));
    members.start("a", &[]);
    wait_exact(&schema, first, 3, &members);

    // `cluster.shards: 3` makes the slices of the key-range partitioner's thirds.
    let thirds = [
        "00000000-55555555",
        "55555556-aaaaaaaa",
        "aaaaaaab-ffffffff",
    ];
    let read = reads(address, &thirds);
    for (id, source) in &read {
        let own = partitions_of_shard(id);
        assert_eq!(own.len(), 2, "{id}: a third of six partitions");
        assert_eq!(
            source.partitions, own,
            "shard {id} reads only its partitions"
        );
    }
    // Every shard reading every partition would fetch the topic three times.
    let fetched: u64 = read.values().map(|r| r.fetched_messages).sum();
    assert!(
        fetched < 2 * first.len() as u64,
        "the shards fetched {fetched} messages of a topic of {}: {read:?}",
        first.len()
    );

    // Split the first third: its halves are exactly partitions 0 and 1.
    let out = members.shards("split", &["views-db", "00000000-55555555"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    produce(dir.path(), &path, more);
    wait_exact(&schema, &docs, 4, &members);
    let halves = ["00000000-2aaaaaaa", "2aaaaaab-55555555"];
    let read = reads(address, &halves);
    for (half, partition) in halves.iter().zip(0..) {
        assert_eq!(
            read[*half].partitions,
            BTreeSet::from([partition]),
            "{half}"
        );
    }
}

#[test]
fn a_topic_not_partitioned_by_key_range_fails_naming_the_misplaced_message() {
    ensure_local_broker().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let topic = unique_topic("murmur2");
    // Produced as for a source without partitioned_by: Kafka's default partitioner.
    let unpartitioned = dir.path().join("unpartitioned.yaml");
    let text = pipeline(&topic, "sqlite: {path: out/views.db}", "");
    std::fs::write(
        &unpartitioned,
        text.replace(", partitioned_by: key_range", ""),
    )
    .unwrap();
    let docs = generate(500, 100, 43);
    produce(dir.path(), &unpartitioned, &docs);
    // Some key then lies outside its partition's slice.
    let misplaced = docs.iter().any(|doc| {
        let key = serde_json::json!({"user_id": doc["user_id"]}).to_string();
        let murmur2 = sluice_kafka_output::partitioner::partition_of(key.as_bytes(), 6);
        murmur2 as u32 != partition_of(doc)
    });
    assert!(misplaced, "the input must hold a misplaced key");

    let path = dir.path().join("pipeline.yaml");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(SLUICE)
        .current_dir(dir.path())
        .arg("run")
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the run must fail: {stderr}");
    let named = format!("topic {topic} partition ");
    assert!(stderr.contains(&named), "{stderr}");
    assert!(stderr.contains(" offset "), "{stderr}");
    assert!(stderr.contains("(key {\"user_id\":\"user-"), "{stderr}");
    assert!(
        stderr.contains("does not partition by key range"),
        "{stderr}"
    );
}
