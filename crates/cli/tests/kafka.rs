//! End to end with a Kafka source (tansu on 127.0.0.1:9092, started if none answers)
//! into SQLite: a 4-partition topic materializes to exactly its independent
//! reduction, messages produced while `sluice run --follow` runs reduce into it, and a
//! message that is not JSON is named by topic, partition and offset (failing the run,
//! or dead-lettered with `on_error: skip`).

use serde_json::Value;
use sluice_kafka::admin::Admin;
use sluice_testkit::conformance::unique_name;
use sluice_testkit::tansu::{LOCAL_BROKER, ensure_local_broker};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common;

use common::{SLUICE, assert_success, generate, pipeline_yaml, reduce_expected, sqlite_table};

const PARTITIONS: i32 = 4;

/// A pipeline reading a topic of its own. The topic is left behind: tansu 0.6.0 panics
/// (and serves nothing more) when a topic is deleted while fetches are in flight, as
/// they are in the tests running beside this one. Names are unique.
struct Fixture {
    dir: tempfile::TempDir,
    topic: String,
    runtime: tokio::runtime::Runtime,
    admin: Admin,
}

impl Fixture {
    /// A topic of its own and a pipeline reading it into SQLite; `extra` are YAML lines
    /// for the source (indented for it).
    fn new(test: &str, extra: &str) -> Fixture {
        ensure_local_broker().unwrap();
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let admin = runtime
            .block_on(Admin::connect(&[LOCAL_BROKER.to_string()]))
            .unwrap();
        let topic = format!("cli-{test}-{}", unique_name());
        runtime
            .block_on(admin.create_topic(&topic, PARTITIONS))
            .unwrap();
        let source = format!(
            "    kafka: {{brokers: [\"{LOCAL_BROKER}\"], topic: {topic}, format: json, meta: null}}\n{extra}"
        );
        let pipeline = pipeline_yaml(&source, "sqlite: {path: out/views.db}", false, 300, "200ms");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pipeline.yaml"), pipeline).unwrap();
        Fixture {
            dir,
            topic,
            runtime,
            admin,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(SLUICE);
        cmd.arg("run")
            .arg(self.path("pipeline.yaml"))
            .env("RUST_LOG", "warn");
        cmd
    }

    fn run(&self) -> Output {
        self.command().output().unwrap()
    }

    /// Produces each message to the partition of its user (documents of one key stay
    /// in order), in batches of 100.
    fn produce(&self, messages: &[Vec<u8>], user_of: impl Fn(usize) -> usize) {
        let mut by_partition: Vec<Vec<Vec<u8>>> = vec![Vec::new(); PARTITIONS as usize];
        for (i, message) in messages.iter().enumerate() {
            by_partition[user_of(i) % PARTITIONS as usize].push(message.clone());
        }
        for (partition, messages) in by_partition.iter().enumerate() {
            for batch in messages.chunks(100) {
                let batch = batch.iter().map(|m| (None, m.clone()));
                self.runtime
                    .block_on(self.admin.produce(&self.topic, partition as i32, batch))
                    .unwrap();
            }
        }
    }

    fn produce_docs(&self, docs: &[Value]) {
        let messages: Vec<Vec<u8>> = docs.iter().map(|d| d.to_string().into_bytes()).collect();
        self.produce(&messages, |i| user_number(&docs[i]));
    }
}

fn user_number(doc: &Value) -> usize {
    let user = doc["user_id"].as_str().unwrap();
    user.trim_start_matches("user-").parse().unwrap()
}

#[test]
fn a_topic_materializes_to_its_reduction_and_follows_what_is_produced() {
    let fx = Fixture::new("follow", "");
    let docs = generate(3_000, 200, 11);
    fx.produce_docs(&docs);
    assert_success(&fx.run());
    assert_eq!(
        sqlite_table(&fx.path("out/views.db")),
        reduce_expected(&docs)
    );

    let mut child = fx
        .command()
        .arg("--follow")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let more = generate(1_000, 300, 12);
    fx.produce_docs(&more);
    let all: Vec<Value> = docs.iter().chain(&more).cloned().collect();
    let expected = reduce_expected(&all);
    let deadline = Instant::now() + Duration::from_secs(120);
    while sqlite_table(&fx.path("out/views.db")) != expected {
        assert!(
            child.try_wait().unwrap().is_none(),
            "sluice run --follow exited"
        );
        assert!(
            Instant::now() < deadline,
            "the produced documents never reduced in"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

/// 40 good documents and one that is not JSON, on partition `1` at offset 10.
fn with_bad_message(fx: &Fixture) -> Vec<Value> {
    let docs = generate(40, 8, 3);
    let mut messages: Vec<Vec<u8>> = docs.iter().map(|d| d.to_string().into_bytes()).collect();
    messages.insert(20, b"not json".to_vec());
    // Good documents all on partition 0, except ten before the bad one on partition 1.
    fx.produce(&messages, |i| match i {
        10..=20 => 1,
        _ => 0,
    });
    docs
}

#[test]
fn a_message_that_is_not_json_is_named_by_topic_partition_and_offset() {
    let fx = Fixture::new("bad", "");
    with_bad_message(&fx);
    let out = fx.run();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let at = format!("topic {} partition 1 offset 10", fx.topic);
    assert!(stderr.contains(&at), "{at} in {stderr}");
}

#[test]
fn on_error_skip_dead_letters_a_bad_message_with_its_position() {
    let fx = Fixture::new("skip", "    on_error: skip");
    let docs = with_bad_message(&fx);
    assert_success(&fx.run());
    assert_eq!(
        sqlite_table(&fx.path("out/views.db")),
        reduce_expected(&docs)
    );
    let letters =
        std::fs::read_to_string(fx.path(".sluice/pipeline/views-db/dead-letters.jsonl")).unwrap();
    let letters: Vec<Value> = letters
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(letters.len(), 1, "{letters:?}");
    let position = letters[0]["position"].as_str().unwrap();
    assert_eq!(
        position,
        format!("topic {} partition 1 offset 10", fx.topic)
    );
}
