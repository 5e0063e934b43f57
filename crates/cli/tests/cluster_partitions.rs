//! What a cluster reads from Kafka (a private etcd member; tansu on 127.0.0.1:9092),
//! into one PostgreSQL table:
//! - a member's shards of a materialization share one read: three shards on one member
//!   fetch the topic once, partitioned or not (one source reports, and its fetched
//!   count stays under twice the topic; three reads would fetch it three times);
//! - a topic `partitioned_by: key_range` (filled by `sluice produce`, which partitions by
//!   key range for such a source) is read by each member only in the partitions
//!   holding its shards' key ranges (its source's per-partition gauges name them), and
//!   an unpartitioned one whole; a second member joining, and a split while the topic
//!   grows, keep the table exact;
//! - a topic whose producer did not partition by key range (Kafka's murmur2 of the
//!   message key) fails the run, naming the partition, offset and key of the first
//!   misplaced message, rather than losing what no shard would read.

use crate::common;

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

/// What a loop's source said of itself in `/api/status` (sampled as it reads, so a
/// counter may be a little behind): the partitions it has a lag gauge for, which are
/// the partitions its fetch polls, and the messages it fetched. A loop's sources report
/// in its first shard only.
#[derive(Debug)]
struct SourceRead {
    partitions: BTreeSet<u32>,
    fetched_messages: u64,
}

/// The [`SourceRead`] of each running shard of the member at `address` whose source
/// reports (one per loop), once `done` holds of them.
fn reads(
    address: SocketAddr,
    done: impl Fn(&BTreeMap<String, SourceRead>) -> bool,
) -> BTreeMap<String, SourceRead> {
    let mut client = Client::new(address, "");
    wait_until("the member's source metrics", PATIENCE, || {
        let status: Value = client.request("GET", "/api/status", &[], b"").ok()?.json();
        let mut reads = BTreeMap::new();
        for shard in status["shards"].as_array()? {
            if shard["state"] != "running" {
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
                reads.insert(shard["shard"].as_str()?.to_string(), read);
            }
        }
        Some(reads).filter(|r| done(r))
    })
}

/// The shards member `member` runs, as `sluice shards list` shows them.
fn shards_of(members: &Members, member: &str) -> Vec<String> {
    (members.list().iter())
        .filter(|s| s["status"] == "running" && s["member"] == member)
        .map(|s| s["shard"].as_str().unwrap().to_string())
        .collect()
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
fn a_members_shards_read_a_partitioned_topic_once_in_their_partitions_only() {
    members_read_once("partitioned", true);
}

#[test]
fn a_members_shards_read_an_unpartitioned_topic_once() {
    members_read_once("whole", false);
}

/// One member with three shards, then a second, then a split, over a topic partitioned
/// by key range or not (see the header).
fn members_read_once(tag: &str, partitioned: bool) {
    ensure_local_broker().unwrap();
    let etcd = PrivateEtcd::start();
    let schema = Schema::new(&format!("partitions_{tag}"));
    let dir = tempfile::tempdir().unwrap();
    let topic = unique_topic(tag);
    let endpoint = format!(
        "postgres: {{url: \"{POSTGRES_URL}\", schema: {}}}",
        schema.0
    );
    let cluster = format!(
        "  metrics: {{listen: \"${{METRICS}}\"}}\ncluster:\n  etcd: [\"{}\"]\n  member: \
         ${{MEMBER}}\n  lease_ttl: 3s\n  shards: 3\n",
        etcd.url()
    );
    let mut text = pipeline(&topic, &endpoint, &cluster);
    if !partitioned {
        text = text.replace(", partitioned_by: key_range", "");
    }
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, text).unwrap();
    let docs = generate(9_000, 600, 41);
    let (first, more) = docs.split_at(3_000);
    let (second, third) = more.split_at(3_000);
    produce(dir.path(), &path, first);
    let mut members = Members::new(dir.path(), &path);
    // What `sluice shards` reads of the file; each member serves metrics of its own.
    members
        .env
        .push(("METRICS".to_string(), "127.0.0.1:0".to_string()));
    let addresses: BTreeMap<&str, SocketAddr> =
        [("a", free_address()), ("b", free_address())].into();
    members.start("a", &[("METRICS", addresses["a"].to_string())]);
    wait_exact(&schema, first, 3, &members);

    // The three shards share one loop: one source reads, every partition, once.
    let read = reads(addresses["a"], |r| !r.is_empty());
    assert_eq!(read.len(), 1, "one read for the member's shards: {read:?}");
    let (_, source) = read.first_key_value().unwrap();
    assert_eq!(source.partitions, (0..PARTITIONS).collect());
    assert!(
        source.fetched_messages < 2 * first.len() as u64,
        "the member fetched {} messages of a topic of {}: {read:?}",
        source.fetched_messages,
        first.len()
    );

    // A second member takes its shards: each member reads the partitions of its own.
    members.start("b", &[("METRICS", addresses["b"].to_string())]);
    produce(dir.path(), &path, second);
    wait_exact(&schema, &docs[..6_000], 3, &members);
    for (member, address) in &addresses {
        let shards = shards_of(&members, member);
        if shards.is_empty() {
            continue; // Rendezvous gave it none.
        }
        let wanted: BTreeSet<u32> = match partitioned {
            true => shards
                .iter()
                .flat_map(|id| partitions_of_shard(id))
                .collect(),
            false => (0..PARTITIONS).collect(),
        };
        let read = reads(*address, |r| {
            let polled: BTreeSet<u32> = r.values().flat_map(|s| s.partitions.clone()).collect();
            polled == wanted
        });
        assert!(
            read.len() <= shards.len(),
            "{member}: {read:?} for {shards:?}"
        );
    }

    // Split a third while the topic grows: the table stays exact.
    let out = members.shards("split", &["views-db", "00000000-55555555"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    produce(dir.path(), &path, third);
    wait_exact(&schema, &docs, 4, &members);
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
