//! Pause and resume at run time: a followed run of two growing files into SQLite, its
//! status server behind a bearer token. `sluice pause` holds the whole pipeline: after
//! the transaction in flight, nothing commits for seconds while the files grow, the
//! status shows it paused and the log says so once; `sluice resume` reads on and the
//! table ends exactly the reduction of every line written. Pausing one source leaves the
//! other committing. The control API refuses a request without the token (401) and
//! names the pipeline's sources for one it does not have (404).

use serde_json::Value;
use sluice_http::client::Client;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::common;

use common::{
    PAGEVIEWS_COLLECTION, PATIENCE, SLUICE, free_address, generate, reduce_expected, sqlite_table,
    wait_until,
};

const TOKEN: &str = "pause-t0ken";
const SOURCES: [&str; 2] = ["views-a", "views-b"];
/// How long a paused run is watched for commits: many times `max_duration`.
const WATCHED: Duration = Duration::from_secs(3);

/// `sluice run --follow` of two files (sources `views-a`, `views-b`) that a thread
/// keeps appending to; killed when dropped.
struct Run {
    child: Child,
    address: SocketAddr,
    dir: tempfile::TempDir,
    pipeline: PathBuf,
    log: PathBuf,
    feeding: Arc<AtomicBool>,
    /// Every document appended, of both files.
    written: Arc<Mutex<Vec<Value>>>,
    feeder: Option<JoinHandle<()>>,
}

impl Run {
    fn start() -> Run {
        let dir = tempfile::tempdir().unwrap();
        for source in SOURCES {
            std::fs::write(dir.path().join(format!("{source}.jsonl")), "").unwrap();
        }
        let pipeline = dir.path().join("pipeline.yaml");
        let feeding = Arc::new(AtomicBool::new(true));
        let written = Arc::new(Mutex::new(Vec::new()));
        let feeder = {
            let (feeding, written) = (feeding.clone(), written.clone());
            let files: Vec<PathBuf> = (SOURCES.iter())
                .map(|source| dir.path().join(format!("{source}.jsonl")))
                .collect();
            std::thread::spawn(move || feed(&files, &feeding, &written))
        };
        let log = dir.path().join("sluice.log");
        // A free port may be taken by another test before the run binds it: try again.
        let (child, address) = (0..3)
            .find_map(|_| {
                let address = free_address();
                std::fs::write(&pipeline, pipeline_yaml(address)).unwrap();
                let mut child = Command::new(SLUICE)
                    .args(["run", "--follow"])
                    .arg(&pipeline)
                    .env("RUST_LOG", "info")
                    .stdout(Stdio::piped())
                    .stderr(std::fs::File::create(&log).unwrap())
                    .spawn()
                    .unwrap();
                let auth = format!("Bearer {TOKEN}");
                let answered = wait_until("the status server or an exit", PATIENCE, || {
                    if child.try_wait().unwrap().is_some() {
                        return Some(false);
                    }
                    (Client::new(address, ""))
                        .request("GET", "/api/status", &[("Authorization", &auth)], b"")
                        .ok()
                        .map(|_| true)
                });
                answered.then_some((child, address))
            })
            .expect("sluice run serving its status");
        Run {
            child,
            address,
            dir,
            pipeline,
            log,
            feeding,
            written,
            feeder: Some(feeder),
        }
    }

    /// `method path` with the token.
    fn api(&self, method: &str, path: &str) -> Option<sluice_http::client::Response> {
        let auth = format!("Bearer {TOKEN}");
        (Client::new(self.address, ""))
            .request(method, path, &[("Authorization", &auth)], b"")
            .ok()
    }

    /// `/api/status`, or `None` while nothing answers.
    fn status(&self) -> Option<Value> {
        let response = self.api("GET", "/api/status")?;
        assert_eq!(response.status, 200);
        Some(response.json())
    }

    /// The first status whose only shard satisfies `done`.
    fn wait_for(&mut self, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        wait_until(what, PATIENCE, || {
            assert!(
                self.child.try_wait().unwrap().is_none(),
                "sluice run exited: {}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            self.status().filter(|status| done(&status["shards"][0]))
        })
    }

    /// `sluice <verb> <pipeline> <args>`.
    fn sluice(&self, verb: &str, args: &[&str]) -> Output {
        Command::new(SLUICE)
            .arg(verb)
            .arg(&self.pipeline)
            .args(args)
            .output()
            .unwrap()
    }

    /// `sluice <verb> <pipeline> <args>`, which must succeed: its standard output.
    fn sluice_ok(&self, verb: &str, args: &[&str]) -> String {
        let out = self.sluice(verb, args);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "sluice {verb} failed: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// Stops the feeder, waits until every document written is committed, stops the
    /// run (SIGTERM) and checks that the table is exactly their reduction.
    fn end_exact(mut self) -> String {
        self.feeding.store(false, Ordering::Relaxed);
        self.feeder.take().unwrap().join().unwrap();
        let written = self.written.lock().unwrap().clone();
        let total = written.len() as u64;
        self.wait_for("every document written committed", |shard| {
            documents(shard) == total
        });
        let killed = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let mut stdout = String::new();
        let pipe = self.child.stdout.as_mut().unwrap();
        pipe.read_to_string(&mut stdout).unwrap();
        assert!(self.child.wait().unwrap().success(), "{stdout}");
        let db = self.dir.path().join("out/views.db");
        assert_eq!(sqlite_table(&db), reduce_expected(&written));
        std::fs::read_to_string(&self.log).unwrap()
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        self.feeding.store(false, Ordering::Relaxed);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Appends 40 documents to each file every 50 ms until told to stop.
fn feed(files: &[PathBuf], feeding: &AtomicBool, written: &Mutex<Vec<Value>>) {
    let mut opened: Vec<_> = (files.iter())
        .map(|path| std::fs::OpenOptions::new().append(true).open(path).unwrap())
        .collect();
    for seed in 0.. {
        if !feeding.load(Ordering::Relaxed) {
            break;
        }
        for (i, file) in opened.iter_mut().enumerate() {
            let docs = generate(40, 300, seed * 2 + i as u64);
            let lines: String = docs.iter().map(|doc| format!("{doc}\n")).collect();
            file.write_all(lines.as_bytes()).unwrap();
            written.lock().unwrap().extend(docs);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn pipeline_yaml(address: SocketAddr) -> String {
    let sources: String = (SOURCES.iter())
        .map(|source| {
            format!(
                "  {source}:\n    target: acme/pageviews\n    \
                 file: {{path: {source}.jsonl, format: json, follow: true}}\n"
            )
        })
        .collect();
    format!(
        r#"
{PAGEVIEWS_COLLECTION}sources:
{sources}
materializations:
  views-db:
    endpoint:
      sqlite: {{path: out/views.db}}
    bindings:
      - source: acme/pageviews
        resource: {{table: pageviews}}
runtime:
  transactions: {{max_docs: 200, max_duration: 200ms, min_duration: 50ms}}
  metrics: {{listen: "{address}", token: "{TOKEN}"}}
"#
    )
}

fn transactions(shard: &Value) -> u64 {
    shard["transactions"].as_u64().unwrap_or(0)
}

/// Documents committed by the run, of every source.
fn documents(shard: &Value) -> u64 {
    SOURCES.iter().map(|s| source_docs(shard, s)).sum()
}

fn source_docs(shard: &Value, source: &str) -> u64 {
    shard["sources"][source]["documents"].as_u64().unwrap_or(0)
}

/// The rows of the table, summed: what committed, as the store has it.
fn stored_views(dir: &Path) -> i64 {
    let db = dir.join("out/views.db");
    sqlite_table(&db).values().map(|row| row.views).sum()
}

#[test]
fn a_paused_pipeline_commits_nothing_until_resumed_and_ends_exact() {
    let mut run = Run::start();
    run.wait_for("two committed transactions", |shard| {
        shard["state"] == "running" && transactions(shard) >= 2
    });

    let paused = run.sluice_ok("pause", &[]);
    assert!(paused.contains("pipeline paused"), "{paused}");
    for source in SOURCES {
        assert!(
            paused.contains(&format!("source {source}: paused")),
            "{paused}"
        );
    }
    // The transaction in flight when the pause came commits; nothing after it.
    std::thread::sleep(Duration::from_secs(1));
    let before = run.status().unwrap();
    let stored = stored_views(run.dir.path());
    std::thread::sleep(WATCHED);
    let after = run.status().unwrap();
    assert_eq!(after["state"], "paused");
    let shard = &after["shards"][0];
    assert_eq!(shard["state"], "paused");
    for source in SOURCES {
        assert_eq!(shard["sources"][source]["state"], "paused", "{source}");
    }
    assert_eq!(
        transactions(shard),
        transactions(&before["shards"][0]),
        "committed while paused"
    );
    assert_eq!(documents(shard), documents(&before["shards"][0]));
    assert_eq!(
        stored_views(run.dir.path()),
        stored,
        "the store changed while paused"
    );
    assert!(
        (documents(shard) as usize) < run.written.lock().unwrap().len(),
        "the files grew while paused"
    );
    let status = run.sluice_ok("status", &[]);
    assert!(status.contains("pipeline paused"), "{status}");

    let resumed = run.sluice_ok("resume", &[]);
    assert!(resumed.contains("pipeline running"), "{resumed}");
    let paused_at = transactions(shard);
    run.wait_for("commits after the resume", |shard| {
        shard["state"] == "running" && transactions(shard) > paused_at
    });
    let log = run.end_exact();
    assert_eq!(log.matches("pipeline running → paused").count(), 1, "{log}");
    assert_eq!(log.matches("pipeline paused → running").count(), 1, "{log}");
}

#[test]
fn pausing_one_source_leaves_the_other_committing() {
    let mut run = Run::start();
    run.wait_for("both sources committed", |shard| {
        SOURCES.iter().all(|s| source_docs(shard, s) > 0)
    });

    let paused = run.sluice_ok("pause", &["views-a"]);
    assert!(paused.contains("pipeline running"), "{paused}");
    assert!(paused.contains("source views-a: paused"), "{paused}");
    assert!(paused.contains("source views-b: running"), "{paused}");
    std::thread::sleep(Duration::from_secs(1));
    let before = run.status().unwrap();
    std::thread::sleep(WATCHED);
    let after = run.status().unwrap();
    assert_eq!(after["state"], "running");
    let (before, shard) = (&before["shards"][0], &after["shards"][0]);
    assert_eq!(shard["state"], "running");
    assert_eq!(shard["sources"]["views-a"]["state"], "paused");
    assert_ne!(shard["sources"]["views-b"]["state"], "paused");
    assert_eq!(
        source_docs(shard, "views-a"),
        source_docs(before, "views-a"),
        "the paused source committed"
    );
    assert!(
        source_docs(shard, "views-b") > source_docs(before, "views-b"),
        "the other source stopped committing"
    );

    let resumed = run.api("POST", "/api/resume?source=views-a").unwrap();
    assert_eq!(resumed.status, 200);
    assert_eq!(resumed.json()["sources"]["views-a"], "running");
    let log = run.end_exact();
    assert_eq!(
        log.matches("source views-a running → paused").count(),
        1,
        "{log}"
    );
    assert_eq!(
        log.matches("source views-a paused → running").count(),
        1,
        "{log}"
    );
}

#[test]
fn the_control_api_wants_the_token_and_names_the_sources_it_has() {
    let mut run = Run::start();
    run.wait_for("a committed transaction", |shard| transactions(shard) >= 1);

    let mut client = Client::new(run.address, "");
    let refused = client.request("POST", "/api/pause", &[], b"").unwrap();
    assert_eq!(refused.status, 401);
    let wrong = [("Authorization", "Bearer nope")];
    let refused = client.request("POST", "/api/pause", &wrong, b"").unwrap();
    assert_eq!(refused.status, 403);
    assert_eq!(run.status().unwrap()["state"], "running");

    let unknown = run.api("POST", "/api/pause?source=views-c").unwrap();
    assert_eq!(unknown.status, 404);
    let body = String::from_utf8_lossy(&unknown.body);
    assert!(body.contains("views-c"), "{body}");
    assert!(body.contains("views-a, views-b"), "{body}");
    let out = run.sluice("resume", &["views-c"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("404") && stderr.contains("views-a, views-b"),
        "{stderr}"
    );
    assert_eq!(run.status().unwrap()["state"], "running");
    run.end_exact();
}
