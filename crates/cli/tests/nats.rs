//! End-to-end: `sluice run` of a NATS JetStream stream (the local nats-server) into
//! SQLite equals the independent reduction; with `--follow`, messages published while
//! it runs are reduced in; bad messages are named by stream and sequence and, with
//! `on_error: skip`, dead-lettered at that position. Each test has its own stream,
//! deleted afterwards.

use bytes::Bytes;
use serde_json::Value;
use sluice_nats::admin::Admin;
use sluice_testkit::conformance::unique_name;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;

use common::{
    SLUICE, assert_success, block_on, generate, pipeline_yaml, reduce_expected, sqlite_table,
};

const URL: &str = "nats://127.0.0.1:4222";

struct Fixture {
    dir: tempfile::TempDir,
    stream: String,
}

impl Fixture {
    /// A stream of its own and a pipeline reading it (`nats`: more `nats:` settings,
    /// `, key: value`; `extra`: more source settings, YAML indented for the source)
    /// into SQLite, in transactions of `max_docs`.
    fn new(nats: &str, extra: &str, max_docs: u64) -> Fixture {
        let stream = format!("E2E_{}", unique_name());
        block_on(async {
            let admin = Admin::connect(URL).await.unwrap();
            admin
                .create_stream(&stream, &[&format!("{stream}.>")])
                .await
                .unwrap();
        });
        let source = format!(
            "    nats: {{url: \"{URL}\", stream: {stream}, subject: \"{stream}.views\", start: first{nats}}}\n{extra}"
        );
        let pipeline = pipeline_yaml(
            &source,
            "sqlite: {path: out/views.db}",
            false,
            max_docs,
            "1s",
        );
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pipeline.yaml"), pipeline).unwrap();
        Fixture { dir, stream }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn publish(&self, payloads: impl IntoIterator<Item = Vec<u8>>) {
        let subject = format!("{}.views", self.stream);
        let payloads: Vec<Bytes> = payloads.into_iter().map(Bytes::from).collect();
        block_on(async {
            let admin = Admin::connect(URL).await.unwrap();
            admin.publish_batch(&subject, payloads).await.unwrap();
        });
    }

    fn publish_docs(&self, docs: &[Value]) {
        self.publish(docs.iter().map(|d| d.to_string().into_bytes()));
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(SLUICE);
        cmd.arg("run")
            .arg(self.path("pipeline.yaml"))
            .env("RUST_LOG", "warn");
        cmd
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let stream = self.stream.clone();
        block_on(async {
            let admin = Admin::connect(URL).await.unwrap();
            admin.delete_stream(&stream).await.ok();
        });
    }
}

#[test]
fn a_stream_run_to_its_end_then_followed_equals_the_reduction() {
    let fx = Fixture::new("", "", 300);
    let docs = generate(2_000, 97, 7);
    fx.publish_docs(&docs[..1_500]);

    // Caught up with the stream, the run ends.
    let out = fx.command().output().unwrap();
    assert_success(&out);
    let db = fx.path("out/views.db");
    assert_eq!(sqlite_table(&db), reduce_expected(&docs[..1_500]));

    // Followed, what is published while it runs is reduced in (resumed from the
    // committed position: nothing read twice).
    let mut child = fx
        .command()
        .arg("--follow")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    fx.publish_docs(&docs[1_500..]);
    let expected = reduce_expected(&docs);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut table = sqlite_table(&db);
    while table != expected && Instant::now() < deadline {
        assert!(
            child.try_wait().unwrap().is_none(),
            "sluice run --follow exited"
        );
        std::thread::sleep(Duration::from_millis(100));
        table = sqlite_table(&db);
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(table, expected);
}

#[test]
fn a_message_that_is_not_json_stops_the_run_naming_stream_and_sequence() {
    // `meta: null`: the payload is handed over as it is and parsed by the reader.
    let fx = Fixture::new(", meta: null", "", 100);
    let docs = generate(20, 5, 3);
    fx.publish_docs(&docs[..16]);
    fx.publish([b"{\"user_id\": oops".to_vec()]);
    fx.publish_docs(&docs[16..]);
    let out = fx.command().output().unwrap();
    assert!(!out.status.success(), "bad JSON fails the run by default");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let position = format!("stream {} sequence 17", fx.stream);
    assert!(stderr.contains(&position), "{position} in {stderr}");
}

#[test]
fn skipped_messages_are_dead_lettered_at_their_stream_and_sequence() {
    let fx = Fixture::new(
        "",
        "    on_error: skip\n    dead_letter: rejected/views.jsonl\n",
        100,
    );
    let docs = generate(300, 11, 5);
    // Sequences 101 (not JSON) and 202 (not an object, so no metadata) are bad.
    fx.publish_docs(&docs[..100]);
    fx.publish([b"not json at all".to_vec()]);
    fx.publish_docs(&docs[100..200]);
    fx.publish([b"[1, 2, 3]".to_vec()]);
    fx.publish_docs(&docs[200..]);

    let out = fx.command().output().unwrap();
    assert_success(&out);
    assert_eq!(
        sqlite_table(&fx.path("out/views.db")),
        reduce_expected(&docs)
    );
    let letters: Vec<Value> = std::fs::read_to_string(fx.path("rejected/views.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let positions: Vec<&str> = letters
        .iter()
        .map(|l| l["position"].as_str().unwrap())
        .collect();
    assert_eq!(
        positions,
        [
            format!("stream {} sequence 101", fx.stream),
            format!("stream {} sequence 202", fx.stream)
        ]
    );
    assert!(letters.iter().all(|l| l["source"] == "views-file"));
}

/// A store restored from a backup whose checkpoint points into messages the stream's
/// retention has removed since: the run refuses naming the gap, and leaves the store
/// as restored.
#[test]
fn a_restored_store_whose_messages_retention_removed_is_refused_naming_the_gap() {
    let fx = Fixture::new("", "", 300);
    let docs = generate(2_000, 97, 8);
    fx.publish_docs(&docs[..1_000]);
    assert_success(&fx.command().output().unwrap());
    let db = fx.path("out/views.db");
    let backup = fx.path("backup.db");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute("VACUUM INTO ?1", [backup.to_str().unwrap()])
        .unwrap();
    fx.publish_docs(&docs[1_000..]);
    assert_success(&fx.command().output().unwrap());

    // Retention removes the first 1 500 messages.
    block_on(async {
        let admin = Admin::connect(URL).await.unwrap();
        admin.purge_below(&fx.stream, 1_501).await.unwrap();
    });
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
    std::fs::copy(&backup, &db).unwrap();

    let out = fx.command().output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a rewind into removed messages must fail"
    );
    assert!(
        stderr.contains(&format!("stream {}", fx.stream)),
        "{stderr}"
    );
    assert!(
        stderr.contains("is older than the recovery log's"),
        "{stderr}"
    );
    assert_eq!(
        sqlite_table(&db),
        reduce_expected(&docs[..1_000]),
        "left as restored"
    );
}
