//! An external driver written with Python's grpcio (`examples/python-driver/driver.py`),
//! as a connector author would write one: `sluice run` materializes a pipeline into it
//! through `grpc: {address: HOST:PORT}`, and the table it commits is the independent
//! reduction of the input; a second run changes nothing.
//!
//! The same driver passes the conformance suite (`sluice driver test`), but for
//! delta-updates, which it does not claim.
//!
//! grpcio sends response headers only with a stream's first message (Opened), so these
//! are also the tests that the runtime sends Open before the Transactions call resolves:
//! every `sluice` run here is bounded, and one that does not finish fails naming what
//! hung.
//!
//! Needs `python3` with `grpcio` and `grpcio-tools` (`.ci/services` installs them); the
//! Python protobuf modules are generated from `crates/proto/proto` into a temp dir.

use serde_json::{Value, json};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use crate::common;

use common::{PythonProtocol, SLUICE, pipeline_yaml, reduce_expected, start_python_driver};

const DRIVER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../examples/python-driver/driver.py"
);

/// A bound on one `sluice` command here, far above what it needs (a run or the suite
/// takes seconds): past it, the command is hung, not slow.
const RUN_BOUND: Duration = Duration::from_secs(120);

/// The Python driver process, killed however the test ends.
struct PythonDriver {
    child: Child,
    address: String,
    log: PathBuf,
    state: PathBuf,
}

impl Drop for PythonDriver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl PythonDriver {
    /// Generates the protobuf modules into `dir` and starts the driver there.
    fn start(dir: &Path) -> PythonDriver {
        let log = dir.join("driver.log");
        let state = dir.join("driver-state.json");
        let mut command = Command::new("python3");
        command.arg(DRIVER).arg("--state").arg(&state);
        let (child, address) =
            start_python_driver(PythonProtocol::Seed, command, &dir.join("generated"), &log);
        PythonDriver {
            child,
            address,
            log,
            state,
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// How many requests or calls named `what` the driver has logged.
    fn count(&self, what: &str) -> usize {
        let line = format!("driver: {what}");
        self.log_text()
            .lines()
            .filter(|l| l.starts_with(&line))
            .count()
    }

    /// The documents of `table` of materialization `views-db` the driver last committed.
    fn table(&self, table: &str) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.state).expect("the driver committed");
        let state: Value = serde_json::from_str(&text).unwrap();
        let rows = state["views-db"][table]
            .as_object()
            .expect("the table was committed");
        rows.values().cloned().collect()
    }
}

/// Runs `sluice ARGS` in `dir`, which must succeed within [`RUN_BOUND`]; a run that
/// does not finish is killed and fails the test, saying where it hung. Returns stdout.
fn sluice_bounded(dir: &Path, args: &[&str], driver: &PythonDriver) -> String {
    let (out, err) = (dir.join("sluice.stdout"), dir.join("sluice.stderr"));
    let opens_before = driver.count("Open");
    let mut child = Command::new(SLUICE)
        .args(args)
        .current_dir(dir)
        .env("RUST_LOG", "warn")
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    let read = |path: &Path| std::fs::read_to_string(path).unwrap_or_default();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > RUN_BOUND {
            let _ = child.kill();
            let _ = child.wait();
            let place = if driver.count("Open") == opens_before {
                "before Open reached the driver: the Transactions call awaits response \
                 headers, which grpcio sends only with Opened"
            } else {
                "after Open"
            };
            panic!(
                "sluice {args:?} against the grpcio driver hung {place} (killed after \
                 {RUN_BOUND:?}).\nsluice stdout:\n{}\nsluice stderr:\n{}\ndriver log:\n{}",
                read(&out),
                read(&err),
                driver.log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        status.success(),
        "sluice {args:?} failed ({status}):\n{}\n{}\ndriver log:\n{}",
        read(&out),
        read(&err),
        driver.log_text()
    );
    read(&out)
}

/// `n` documents over `keys` users, deterministic.
fn generate(n: usize, keys: usize) -> Vec<Value> {
    (0..n)
        .map(|i| {
            json!({
                "user_id": format!("user-{:03}", (i * 7) % keys),
                "views": (i % 10) as i64,
                "bytes": (i * 37 % 5000) as i64,
                "last_seen": format!("2026-11-{:02}T00:00:{:02}Z", 1 + i % 28, i % 60),
            })
        })
        .collect()
}

#[test]
fn a_grpcio_driver_materializes_the_reduction_and_a_second_run_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let driver = PythonDriver::start(dir.path());
    let docs = generate(2_000, 150);
    let mut input = std::fs::File::create(dir.path().join("views.jsonl")).unwrap();
    for doc in &docs {
        writeln!(input, "{doc}").unwrap();
    }
    // A plain HOST:PORT address, as users write it.
    let endpoint = format!(
        "grpc: {{address: \"{}\", pattern: authoritative}}",
        driver.address
    );
    let pipeline = dir.path().join("pipeline.yaml");
    let yaml = pipeline_yaml(
        "    file: {path: views.jsonl, format: json}",
        &endpoint,
        false,
        400,
        "10s",
    );
    std::fs::write(&pipeline, yaml).unwrap();

    let run = ["run", "pipeline.yaml"];
    sluice_bounded(dir.path(), &run, &driver);
    let table = driver.table("pageviews");
    assert_eq!(table.len(), 150, "one row per user");
    // Each committed document is its user's whole row.
    assert_eq!(reduce_expected(&table), reduce_expected(&docs));
    // 2,000 documents in transactions of 400: Loads of later ones read earlier commits.
    assert!(driver.count("commit") >= 5, "{}", driver.log_text());

    sluice_bounded(dir.path(), &run, &driver);
    assert_eq!(driver.count("Open"), 2, "{}", driver.log_text());
    assert_eq!(
        driver.table("pageviews"),
        table,
        "the second run changed the table"
    );
}

#[test]
fn the_grpcio_driver_passes_the_conformance_suite_at_a_plain_address() {
    let dir = tempfile::tempdir().unwrap();
    let driver = PythonDriver::start(dir.path());
    std::fs::write(dir.path().join("config.json"), "{}").unwrap();
    let args = [
        "driver",
        "test",
        "--endpoint",
        &driver.address,
        "--config",
        "config.json",
        "--lacks",
        "delta-updates",
    ];
    let stdout = sluice_bounded(dir.path(), &args, &driver);
    for scenario in [
        "loads-sent-during-commit-read-committed",
        "second-open-fences-first",
    ] {
        let pass = format!("PASS {scenario}");
        assert!(stdout.lines().any(|l| l == pass), "{stdout}");
    }
}
