//! `sluice produce`: a JSON-lines file sent to what a source reads, then `sluice run`
//! materializes exactly its documents (a fresh Kafka topic, created with the partitions
//! asked for; a fresh NATS stream, created holding the source's subject, the documents
//! read from stdin). A line that is not JSON is named by file and line, and nothing is
//! sent: the topic or stream is not even created. A source of another kind is refused.
//!
//! Needs tansu on 127.0.0.1:9092 (started if none answers) and NATS JetStream on
//! 127.0.0.1:4222. Streams are deleted afterwards; topics are left behind, uniquely
//! named (tansu stops serving when a topic is deleted under a fetch).

use serde_json::Value;
use sluice_kafka::admin::Admin as KafkaAdmin;
use sluice_nats::admin::Admin as NatsAdmin;
use sluice_testkit::conformance::unique_name;
use sluice_testkit::tansu::{LOCAL_BROKER, ensure_local_broker};
use std::io::Write as _;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use crate::common;

use common::{
    SLUICE, assert_success, block_on, generate, pipeline_yaml, reduce_expected, sqlite_table,
    write_lines,
};

const NATS_URL: &str = "nats://127.0.0.1:4222";

/// A pipeline whose source `views` is `source` (YAML indented for it), into SQLite.
struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new(source: &str) -> Fixture {
        let pipeline = pipeline_yaml(source, "sqlite: {path: out/views.db}", false, 500, "1s")
            .replace("  views-file:\n", "  views:\n");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pipeline.yaml"), pipeline).unwrap();
        Fixture { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn sluice(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(SLUICE);
        cmd.args(args)
            .current_dir(self.dir.path())
            .env("RUST_LOG", "warn");
        cmd
    }

    /// `sluice produce pipeline.yaml views docs.jsonl`, with `more` arguments.
    fn produce(&self, more: &[&str]) -> Output {
        let mut args = vec!["produce", "pipeline.yaml", "views", "docs.jsonl"];
        args.extend_from_slice(more);
        self.sluice(&args).output().unwrap()
    }

    fn run(&self) {
        assert_success(&self.sluice(&["run", "pipeline.yaml"]).output().unwrap());
    }

    fn table(&self) -> std::collections::BTreeMap<String, common::Row> {
        sqlite_table(&self.path("out/views.db"))
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn kafka_source(topic: &str) -> String {
    format!("    kafka: {{brokers: \"{LOCAL_BROKER}\", topic: {topic}, format: json, meta: null}}")
}

fn nats_source(stream: &str, subject: &str) -> String {
    format!("    nats: {{url: \"{NATS_URL}\", stream: {stream}, subject: {subject}, meta: null}}")
}

/// A JetStream stream, deleted when dropped.
struct Stream(String);

impl Stream {
    fn new() -> Stream {
        Stream(format!("PRODUCE_{}", unique_name()))
    }

    /// Its subjects; `None` while it does not exist.
    fn subjects(&self) -> Option<Vec<String>> {
        block_on(async {
            let admin = NatsAdmin::connect(NATS_URL).await.unwrap();
            admin.stream_subjects(&self.0).await.unwrap()
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        block_on(async {
            let admin = NatsAdmin::connect(NATS_URL).await.unwrap();
            admin.delete_stream(&self.0).await.ok();
        });
    }
}

/// The partitions of `topic`; `None` while it does not exist.
fn topic_partitions(topic: &str) -> Option<usize> {
    block_on(async {
        let admin = KafkaAdmin::connect(&[LOCAL_BROKER.to_string()])
            .await
            .unwrap();
        admin.partitions(topic).await.unwrap()
    })
}

#[test]
fn a_file_produced_to_a_new_topic_is_materialized_by_a_run() {
    ensure_local_broker().unwrap();
    let topic = format!("produce-{}", unique_name());
    let fx = Fixture::new(&kafka_source(&topic));
    let docs = generate(3_000, 200, 71);
    write_lines(&fx.path("docs.jsonl"), &docs);

    let out = fx.produce(&["--partitions", "3"]);
    assert_success(&out);
    let said = stdout(&out);
    assert!(
        said.contains(&format!("created topic {topic} with 3 partitions")),
        "{said}"
    );
    assert!(
        said.contains(&format!("sent 3000 documents to topic {topic} (views)")),
        "{said}"
    );
    assert_eq!(topic_partitions(&topic), Some(3));
    fx.run();
    assert_eq!(fx.table(), reduce_expected(&docs));

    // More documents to the topic as it is: reduced in by the next run.
    let more = generate(500, 200, 72);
    write_lines(&fx.path("docs.jsonl"), &more);
    let out = fx.produce(&[]);
    assert_success(&out);
    assert!(!stdout(&out).contains("created"), "{}", stdout(&out));
    fx.run();
    let all: Vec<Value> = docs.into_iter().chain(more).collect();
    assert_eq!(fx.table(), reduce_expected(&all));
}

#[test]
fn stdin_produced_to_a_new_stream_is_materialized_by_a_run() {
    let stream = Stream::new();
    let subject = format!("{}.views", stream.0.to_lowercase());
    let fx = Fixture::new(&nats_source(&stream.0, &subject));
    let docs = generate(2_000, 150, 81);
    let text: String = docs.iter().map(|d| format!("{d}\n")).collect();

    let mut child = fx
        .sluice(&["produce", "pipeline.yaml", "views", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_success(&out);
    let said = stdout(&out);
    assert!(
        said.contains(&format!(
            "created stream {} with subject {subject}",
            stream.0
        )),
        "{said}"
    );
    assert!(
        said.contains(&format!("sent 2000 documents to subject {subject} (views)")),
        "{said}"
    );
    assert_eq!(stream.subjects(), Some(vec![subject]));
    fx.run();
    assert_eq!(fx.table(), reduce_expected(&docs));
}

#[test]
fn a_line_that_is_not_json_is_named_and_nothing_is_sent() {
    ensure_local_broker().unwrap();
    let topic = format!("produce-{}", unique_name());
    let stream = Stream::new();
    let subject = format!("{}.views", stream.0.to_lowercase());
    let lines = "{\"user_id\": \"u1\", \"views\": 1}\n\n{\"user_id\": \"u2\", views: 1}\n{}\n";
    for (source, sent_nothing) in [
        (
            kafka_source(&topic),
            Box::new(|| topic_partitions(&topic).is_none()) as Box<dyn Fn() -> bool>,
        ),
        (
            nats_source(&stream.0, &subject),
            Box::new(|| stream.subjects().is_none()),
        ),
    ] {
        let fx = Fixture::new(&source);
        std::fs::write(fx.path("docs.jsonl"), lines).unwrap();
        let out = fx.produce(&[]);
        assert!(!out.status.success(), "a bad line must fail the command");
        let err = stderr(&out);
        assert!(
            err.contains("docs.jsonl line 3: invalid JSON at column 19: key must be a string"),
            "{err}"
        );
        assert!(err.contains("nothing was sent"), "{err}");
        assert!(stdout(&out).is_empty(), "{}", stdout(&out));
        assert!(
            sent_nothing(),
            "nothing was sent, the destination not even created"
        );
    }
}

#[test]
fn a_source_of_another_kind_is_refused_naming_the_kinds_supported() {
    let fx = Fixture::new("    file: {path: views.jsonl, format: json}");
    write_lines(&fx.path("docs.jsonl"), &generate(10, 5, 91));
    let out = fx.produce(&[]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains(
            "source views is a file source: `sluice produce` sends to kafka and nats sources only"
        ),
        "{err}"
    );
    let out = fx
        .sluice(&["produce", "pipeline.yaml", "clicks", "docs.jsonl"])
        .output()
        .unwrap();
    assert!(
        stderr(&out).contains("has no source \"clicks\" (its sources: views)"),
        "{}",
        stderr(&out)
    );
}
