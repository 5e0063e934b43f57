//! End-to-end: `sluice run` of an HTTP source into SQLite. A 200 comes only once the
//! body's transaction is durable, so the store holds the documents by then; bad
//! requests get their named refusal and leave the store alone; a retried
//! Idempotency-Key answers its original transaction and is applied once, also after
//! the server was SIGKILLed and restarted. A document the collection would not take
//! (invalid, keyless) refuses its body with a 400 naming it and never stops the
//! pipeline; with `on_error: skip` it is dead-lettered and the 200 counts it apart. Each test's server listens on a port of its
//! own; the token comes from the environment (`${SLUICE_TEST_TOKEN}`).

use serde_json::Value;
use sluice_http::client::{Client, Response};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;

use common::{SLUICE, generate, pipeline_yaml, reduce_expected, sqlite_table};

const TOKEN: &str = "e2e-token";

struct Fixture {
    dir: tempfile::TempDir,
    address: SocketAddr,
}

/// A running `sluice run`, killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Fixture {
    /// A pipeline whose source is `http:` on a free port (`http`: more settings,
    /// `, key: value`), into SQLite.
    fn new(http: &str) -> Fixture {
        Fixture::with_keys(http, "")
    }

    /// As [`Fixture::new`], with the source's runtime keys `keys` (YAML lines under
    /// the source, each indented by four spaces).
    fn with_keys(http: &str, keys: &str) -> Fixture {
        Fixture::bounded(http, keys, 100_000)
    }

    /// As [`Fixture::with_keys`], its transactions closing at `max_docs`.
    fn bounded(http: &str, keys: &str, max_docs: u64) -> Fixture {
        let address = common::free_address();
        let source = format!(
            "{keys}    http: {{listen: \"{address}\", token: \"${{SLUICE_TEST_TOKEN}}\"{http}}}\n"
        );
        let pipeline = pipeline_yaml(
            &source,
            "sqlite: {path: out/views.db}",
            false,
            max_docs,
            "20ms",
        );
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("pipeline.yaml"), pipeline).unwrap();
        Fixture { dir, address }
    }

    fn db(&self) -> PathBuf {
        self.dir.path().join("out/views.db")
    }

    /// Starts the pipeline and waits until its server is healthy.
    fn start(&self) -> Running {
        let child = Command::new(SLUICE)
            .arg("run")
            .arg(self.dir.path().join("pipeline.yaml"))
            .env("RUST_LOG", "warn")
            .env("SLUICE_TEST_TOKEN", TOKEN)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut running = Running(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            assert!(
                running.0.try_wait().unwrap().is_none(),
                "sluice run exited before serving"
            );
            let health = Client::new(self.address, TOKEN).request("GET", "/health", &[], b"");
            if let Ok(health) = health
                && health.status == 200
            {
                assert_eq!(health.json()["source"], "views-file");
                return running;
            }
            assert!(Instant::now() < deadline, "the server did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn post(&self, key: Option<&str>, body: &[u8]) -> Response {
        Client::new(self.address, TOKEN)
            .ingest("views-file", key, body)
            .unwrap()
    }
}

fn lines(docs: &[Value]) -> Vec<u8> {
    docs.iter()
        .flat_map(|d| format!("{d}\n").into_bytes())
        .collect()
}

/// SIGTERM: the run finishes its transaction and stops.
fn terminate(mut running: Running) {
    let status = Command::new("kill")
        .args(["-TERM", &running.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let status = running.0.wait().unwrap();
    assert!(status.success(), "sluice run after SIGTERM: {status}");
}

#[test]
fn posted_documents_are_in_the_store_when_the_200_comes() {
    let fx = Fixture::new("");
    let running = fx.start();
    let docs = generate(500, 37, 3);
    let first = fx.post(None, &lines(&docs[..300]));
    assert_eq!(
        first.status,
        200,
        "{}",
        String::from_utf8_lossy(&first.body)
    );
    assert_eq!(first.json()["documents"], 300);
    // Durable before the answer: the store holds the body now.
    assert_eq!(sqlite_table(&fx.db()), reduce_expected(&docs[..300]));

    let array = serde_json::to_vec(&docs[300..]).unwrap();
    let second = fx.post(None, &array);
    assert_eq!(second.status, 200);
    assert_eq!(second.json()["documents"], 200);
    assert!(second.json()["txn"].as_u64() > first.json()["txn"].as_u64());
    assert_eq!(sqlite_table(&fx.db()), reduce_expected(&docs));
    terminate(running);
}

/// A body is one unit of the source's input: it commits in one transaction whatever
/// its size, here three times the transactions' `max_docs`, never split across two.
#[test]
fn a_body_larger_than_max_docs_commits_in_one_transaction() {
    let fx = Fixture::bounded("", "", 100);
    let running = fx.start();
    let docs = generate(600, 37, 3);
    let mut txns = Vec::new();
    for body in docs.chunks(300) {
        let answer = fx.post(None, &lines(body));
        assert_eq!(
            answer.status,
            200,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
        txns.push(answer.json()["txn"].as_u64().unwrap());
    }
    assert_eq!(txns, [1, 2], "each body in a transaction of its own, whole");
    assert_eq!(sqlite_table(&fx.db()), reduce_expected(&docs));
    terminate(running);
}

#[test]
fn bad_requests_are_refused_by_name_and_leave_the_store_alone() {
    let fx = Fixture::new(", max_body_bytes: 4KiB, max_buffered_bytes: 1MiB");
    let running = fx.start();
    let docs = generate(10, 5, 9);
    let body = lines(&docs);
    let mut client = Client::new(fx.address, TOKEN);

    let anonymous = client
        .request("POST", "/ingest/views-file", &[], &body)
        .unwrap();
    assert_eq!(anonymous.status, 401);
    assert_eq!(anonymous.header("www-authenticate"), Some("Bearer"));
    let wrong = client
        .request(
            "POST",
            "/ingest/views-file",
            &[("Authorization", "Bearer nope")],
            &body,
        )
        .unwrap();
    assert_eq!(wrong.status, 403);
    let other = fx.post(None, &body);
    assert_eq!(other.status, 200);
    let mut elsewhere = Client::new(fx.address, TOKEN);
    assert_eq!(elsewhere.ingest("orders", None, &body).unwrap().status, 404);

    let large = lines(&generate(60, 5, 1));
    assert!(large.len() > 4096);
    let too_large = fx.post(None, &large);
    assert_eq!(too_large.status, 413);
    assert!(String::from_utf8_lossy(&too_large.body).contains("max_body_bytes"));

    let mut bad = lines(&docs[..2]);
    bad.extend_from_slice(b"{\"user_id\": oops}\n");
    bad.extend_from_slice(&lines(&docs[2..]));
    let refused = fx.post(None, &bad);
    assert_eq!(refused.status, 400);
    assert_eq!(refused.json()["at"], "line 3");
    let error = refused.json()["error"].as_str().unwrap().to_string();
    assert!(error.starts_with("line 3: invalid JSON"), "{error}");

    // Only the one accepted body is stored.
    assert_eq!(sqlite_table(&fx.db()), reduce_expected(&docs));
    terminate(running);
}

#[test]
fn a_retried_key_is_applied_once_also_after_a_sigkill() {
    let fx = Fixture::new("");
    let running = fx.start();
    let docs = generate(200, 19, 4);
    let first = fx.post(Some("batch-1"), &lines(&docs[..100]));
    assert_eq!(first.status, 200);
    let answer = first.json();
    assert_eq!(answer["documents"], 100);
    let retry = fx.post(Some("batch-1"), &lines(&docs[..100]));
    assert_eq!(retry.json(), answer);
    assert_eq!(sqlite_table(&fx.db()), reduce_expected(&docs[..100]));

    drop(running); // SIGKILL
    let running = fx.start();
    let after_restart = fx.post(Some("batch-1"), &lines(&docs[..100]));
    assert_eq!(after_restart.status, 200);
    assert_eq!(after_restart.json(), answer);
    let next = fx.post(Some("batch-2"), &lines(&docs[100..]));
    assert_eq!(next.status, 200);
    assert_eq!(next.json()["documents"], 100);
    assert!(next.json()["txn"].as_u64() > answer["txn"].as_u64());
    assert_eq!(sqlite_table(&fx.db()), reduce_expected(&docs));
    terminate(running);
}

/// A store restored from a backup taken before some bodies were answered 200: those
/// bodies lived only in transactions the store no longer holds, and their clients will
/// not send them again, so the run refuses, naming them, and leaves the store alone.
#[test]
fn a_store_restored_behind_answered_bodies_is_refused_naming_them() {
    let fx = Fixture::new("");
    let docs = generate(300, 50, 41);
    let running = fx.start();
    for chunk in docs[..100].chunks(50) {
        assert_eq!(fx.post(None, &lines(chunk)).status, 200);
    }
    let backup = fx.dir.path().join("backup.db");
    rusqlite::Connection::open(fx.db())
        .unwrap()
        .execute("VACUUM INTO ?1", [backup.to_str().unwrap()])
        .unwrap();
    for chunk in docs[100..].chunks(50) {
        assert_eq!(fx.post(None, &lines(chunk)).status, 200);
    }
    terminate(running);
    assert_eq!(sqlite_table(&fx.db()), reduce_expected(&docs));

    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", fx.db().display()));
    }
    std::fs::copy(&backup, fx.db()).unwrap();
    let out = Command::new(SLUICE)
        .arg("run")
        .arg(fx.dir.path().join("pipeline.yaml"))
        .env("RUST_LOG", "warn")
        .env("SLUICE_TEST_TOKEN", TOKEN)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a rewind past answered bodies must fail"
    );
    assert!(stderr.contains("source views-file"), "{stderr}");
    assert!(
        stderr.contains("the bodies numbered 3 to 6 were answered 200"),
        "names the lost bodies: {stderr}"
    );
    assert_eq!(
        sqlite_table(&fx.db()),
        reduce_expected(&docs[..100]),
        "the store is left as restored"
    );
}

/// The body of `docs` as JSON lines, with `bad` inserted as line `at` (1-based).
fn lines_with(docs: &[Value], at: usize, bad: &str) -> Vec<u8> {
    let mut body = lines(&docs[..at - 1]);
    body.extend_from_slice(bad.as_bytes());
    body.push(b'\n');
    body.extend_from_slice(&lines(&docs[at - 1..]));
    body
}

/// A 400 naming `line`, whose error contains each of `says`.
fn assert_refused(refused: &Response, line: usize, says: &[&str]) {
    assert_eq!(
        refused.status,
        400,
        "{}",
        String::from_utf8_lossy(&refused.body)
    );
    assert_eq!(refused.json()["at"], format!("line {line}"));
    let error = refused.json()["error"].as_str().unwrap().to_string();
    assert!(error.starts_with(&format!("line {line}: ")), "{error}");
    for said in says {
        assert!(error.contains(said), "{said:?} in {error}");
    }
    assert!(
        error.contains("nothing of this body was applied"),
        "{error}"
    );
}

/// A document that fails the collection's schema refuses its whole body at intake: a
/// 400 naming its line and the schema location, nothing of the body stored, its key
/// not taken; the pipeline runs on, and the next body (the same key) is stored.
#[test]
fn a_schema_invalid_document_refuses_its_body_and_the_pipeline_runs_on() {
    let fx = Fixture::new("");
    let running = fx.start();
    let docs = generate(20, 7, 11);
    let bad = r#"{"user_id": "user-00001", "views": "many", "bytes": 1, "last_seen": "x"}"#;
    let refused = fx.post(Some("batch-1"), &lines_with(&docs[..10], 4, bad));
    assert_refused(
        &refused,
        4,
        &["/views", "schema location #/properties/views/type"],
    );
    let stored = fx.post(Some("batch-1"), &lines(&docs[..10]));
    assert_eq!(
        stored.status,
        200,
        "{}",
        String::from_utf8_lossy(&stored.body)
    );
    assert_eq!(stored.json()["documents"], 10);
    assert_eq!(stored.json().get("dead_lettered"), None);
    assert_eq!(sqlite_table(&fx.db()), reduce_expected(&docs[..10]));

    let array = format!("[{}, {bad}]", serde_json::to_string(&docs[10]).unwrap());
    let refused = fx.post(None, array.as_bytes());
    assert_eq!(refused.status, 400);
    assert_eq!(refused.json()["at"], "element 2");
    assert_eq!(fx.post(None, &lines(&docs[10..])).status, 200);
    assert_eq!(sqlite_table(&fx.db()), reduce_expected(&docs));
    terminate(running);
}

/// A document without the collection's key refuses its body likewise.
#[test]
fn a_document_without_its_key_refuses_its_body_and_the_pipeline_runs_on() {
    let fx = Fixture::new("");
    let running = fx.start();
    let docs = generate(10, 4, 12);
    let keyless = r#"{"views": 1, "bytes": 1, "last_seen": "2026-11-01T00:00:00Z"}"#;
    let refused = fx.post(None, &lines_with(&docs, 2, keyless));
    assert_refused(&refused, 2, &["/user_id"]);
    let stored = fx.post(None, &lines(&docs));
    assert_eq!(
        stored.status,
        200,
        "{}",
        String::from_utf8_lossy(&stored.body)
    );
    assert_eq!(stored.json()["documents"], 10);
    assert_eq!(sqlite_table(&fx.db()), reduce_expected(&docs));
    terminate(running);
}

/// With `on_error: skip`, a bad document does not refuse its body: the runtime
/// dead-letters it (its one dead-letter path) and the 200 says so, counting only the
/// stored documents in `documents`; a retry of the key answers the same.
#[test]
fn with_on_error_skip_the_200_counts_dead_lettered_documents_apart() {
    let fx = Fixture::with_keys("", "    on_error: skip\n    dead_letter: rejected.jsonl\n");
    let running = fx.start();
    let docs = generate(2, 2, 13);
    let bad = r#"{"user_id": "user-00009", "views": "many", "bytes": 1, "last_seen": "x"}"#;
    let body = lines_with(&docs[..1], 2, bad);
    let answer = fx.post(Some("skip-1"), &body);
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    assert_eq!(answer.json()["documents"], 1);
    assert_eq!(answer.json()["dead_lettered"], 1);
    assert_eq!(fx.post(Some("skip-1"), &body).json(), answer.json());
    assert_eq!(sqlite_table(&fx.db()), reduce_expected(&docs[..1]));

    let letters: Vec<Value> = std::fs::read_to_string(fx.dir.path().join("rejected.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(letters.len(), 1, "{letters:#?}");
    assert_eq!(letters[0]["source"], "views-file");
    assert_eq!(
        letters[0]["document"],
        serde_json::from_str::<Value>(bad).unwrap()
    );
    let reason = letters[0]["reason"].as_str().unwrap();
    assert!(reason.contains("/views"), "{reason}");

    // The pipeline runs on.
    let next = fx.post(None, &lines(&docs[1..]));
    assert_eq!(next.status, 200);
    assert_eq!(next.json()["documents"], 1);
    assert_eq!(next.json().get("dead_lettered"), None);
    assert_eq!(sqlite_table(&fx.db()), reduce_expected(&docs));
    terminate(running);
}
