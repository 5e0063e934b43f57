//! An external driver speaking Flow's current protocol
//! (`examples/python-driver-current/driver.py`, Python, one `Materialize` stream of
//! `Request`/`Response`), as a Flow connector author would write one, over both
//! transports:
//!
//! - gRPC (`materialize.Connector/Materialize`, grpcio): `sluice driver test --endpoint
//!   ADDR --protocol current` passes, and a pipeline through `grpc: {protocol: current}`
//!   commits the independent reduction of its input, then exactly once across a restart
//!   of `sluice` with more input; the driver's connector state (a count of commits,
//!   patched at Flushed and StartedCommit) comes back at the next Open as the commits
//!   made; a driver whose store was lost (its state records commits, its store has
//!   none) answers the rebuild sentinel at Open and the pipeline materializes everything
//!   again, once.
//! - stdio (`PROGRAM ARGS…`, no sub-command, one process per stream), in both codecs
//!   (protobuf frames, JSON lines): the suite passes, and a pipeline through
//!   `command: {protocol: current, codec: json}` does as above.
//!
//! The driver sends Acknowledged after the runtime's Acknowledge over stdio (`--acknowledge
//! late`) and before it over gRPC (`early`), so both orders are run. The built-in SQLite
//! driver served over current-protocol stdio (`sluice driver stdio sqlite`) passes the
//! suite too, with either codec. Every `sluice` command here is bounded; one that does
//! not finish fails naming the driver's log.
//!
//! Needs `python3` with `grpcio` and `grpcio-tools` (`.ci/services` installs them); the
//! Python protobuf modules are generated from `crates/proto/proto/current` into a temp
//! dir.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;

use common::{
    PythonProtocol, SLUICE, free_address, generate, pipeline_yaml, reduce_expected, write_lines,
};

const DRIVER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../examples/python-driver-current/driver.py"
);

/// A bound on one `sluice` command here, far above what it needs (a run or the suite
/// takes seconds to a minute): past it, the command is hung, not slow.
const RUN_BOUND: Duration = Duration::from_secs(300);

/// Generates the driver's Python modules into `dir/generated`, which it returns.
fn generate_modules(dir: &Path) -> PathBuf {
    let generated = dir.join("generated");
    common::generate_python_modules(PythonProtocol::Current, &generated);
    generated
}

/// A test's driver files: its modules, store and log, in a temp dir.
struct Setup {
    dir: tempfile::TempDir,
    generated: PathBuf,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let generated = generate_modules(dir.path());
        std::fs::write(dir.path().join("config.json"), "{}").unwrap();
        Setup { dir, generated }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn state(&self) -> PathBuf {
        self.path("driver-state.json")
    }

    fn log(&self) -> PathBuf {
        self.path("driver.log")
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(self.log()).unwrap_or_default()
    }

    /// The driver's arguments after its path: its store, its log, `more`.
    fn driver_args(&self, more: &[&str]) -> Vec<String> {
        let mut args = vec![
            "--state".to_string(),
            self.state().display().to_string(),
            "--log".to_string(),
            self.log().display().to_string(),
        ];
        args.extend(more.iter().map(|arg| arg.to_string()));
        args
    }

    /// The stdio driver as `--command` takes it (split on whitespace).
    fn stdio_command(&self, codec: &str) -> String {
        let mut words = vec!["python3".to_string(), DRIVER.to_string()];
        words.extend(self.driver_args(&["--stdio", "--codec", codec, "--acknowledge", "late"]));
        words.join(" ")
    }

    /// Starts the driver over gRPC on `port` (0: a free one), sending Acknowledged
    /// early; returns it with the address it printed.
    fn start_grpc(&self, port: u16) -> GrpcDriver {
        let port = port.to_string();
        let args = self.driver_args(&["--port", &port, "--acknowledge", "early"]);
        let mut child = Command::new("python3")
            .arg(DRIVER)
            .args(&args)
            .env("PYTHONPATH", &self.generated)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the driver");
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let Some(address) = line.trim().strip_prefix("listening on ") else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the driver did not start ({line:?}):\n{}", self.log_text());
        };
        GrpcDriver {
            address: address.to_string(),
            child,
        }
    }

    /// Runs `sluice ARGS` in the temp dir, with the driver's modules on PYTHONPATH; it
    /// must succeed within [`RUN_BOUND`]. Returns stdout.
    fn sluice(&self, args: &[&str]) -> String {
        let (out, err) = (self.path("sluice.stdout"), self.path("sluice.stderr"));
        let mut child = Command::new(SLUICE)
            .args(args)
            .current_dir(self.dir.path())
            .env("RUST_LOG", "warn")
            .env("PYTHONPATH", &self.generated)
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
                panic!(
                    "sluice {args:?} hung (killed after {RUN_BOUND:?}).\nstdout:\n{}\n\
                     stderr:\n{}\ndriver log:\n{}",
                    read(&out),
                    read(&err),
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(
            status.success(),
            "sluice {args:?} failed ({status}):\n{}\n{}\ndriver log:\n{}",
            read(&out),
            read(&err),
            self.log_text()
        );
        read(&out)
    }

    /// The documents of `views-db`'s `pageviews` table in the driver's store.
    fn table(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(self.state()).expect("the driver committed");
        let state: Value = serde_json::from_str(&text).unwrap();
        let rows = state["tables"]["views-db"]["pageviews"]
            .as_object()
            .expect("the table was committed");
        let mut docs: Vec<Value> = (rows.values())
            .map(|doc| serde_json::from_str(doc.as_str().unwrap()).unwrap())
            .collect();
        docs.sort_by(|a, b| a["user_id"].as_str().cmp(&b["user_id"].as_str()));
        docs
    }

    /// How many commits of `views-db` the driver's store has made.
    fn store_commits(&self) -> u64 {
        let text = std::fs::read_to_string(self.state()).unwrap();
        let state: Value = serde_json::from_str(&text).unwrap();
        state["commits"]["views-db"].as_u64().unwrap_or(0)
    }

    /// The connector state each Open of the full key range got, in order.
    fn open_states(&self) -> Vec<Value> {
        (self.log_text().lines())
            .filter_map(|line| line.strip_prefix("driver: Open [00000000, ffffffff] state "))
            .map(|state| serde_json::from_str(state).unwrap())
            .collect()
    }

    /// The pipeline of the pageviews in `views.jsonl` into `endpoint` (YAML, one line),
    /// in transactions of at most 400 documents.
    fn write_pipeline(&self, endpoint: &str) {
        let source = "    file: {path: views.jsonl, format: json}";
        let yaml = pipeline_yaml(source, endpoint, false, 400, "10s");
        std::fs::write(self.path("pipeline.yaml"), yaml).unwrap();
    }

    /// Runs the conformance suite through the current protocol with `target` (`--endpoint
    /// ADDR` or `--command PROG`) and `more` arguments; all but delta updates must pass.
    fn suite(&self, target: &[&str], more: &[&str]) -> String {
        let mut args = vec!["driver", "test"];
        args.extend_from_slice(target);
        args.extend_from_slice(&["--protocol", "current", "--config", "config.json"]);
        args.extend_from_slice(more);
        let stdout = self.sluice(&args);
        for scenario in [
            "rebuild-sentinel",
            "loads-sent-during-commit-read-committed",
            "reopen-recovers-checkpoint",
            "deletes",
            "document-16-mib",
        ] {
            let pass = format!("PASS {scenario}");
            assert!(stdout.lines().any(|l| l == pass), "no {pass}:\n{stdout}");
        }
        assert!(!stdout.contains("FAIL "), "{stdout}");
        stdout
    }
}

/// The driver served over gRPC, killed however the test ends.
struct GrpcDriver {
    address: String,
    child: Child,
}

impl Drop for GrpcDriver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The sample of this test's pipelines: 3 000 documents of 150 users.
fn input() -> Vec<Value> {
    generate(3_000, 150, 36)
}

/// Runs the pipeline over the first 2 000 documents, then over all 3 000 (a restart of
/// `sluice` with more input), then once more: after each, the driver's table is the
/// reduction of the input so far (each document counted once). Returns the commits the
/// store had made after the first run and after the second.
fn run_exactly_once_across_restarts(setup: &Setup) -> [u64; 2] {
    let docs = input();
    let views = setup.path("views.jsonl");
    let run = ["run", "pipeline.yaml"];

    write_lines(&views, &docs[..2_000]);
    setup.sluice(&run);
    assert_eq!(
        reduce_expected(&setup.table()),
        reduce_expected(&docs[..2_000])
    );
    let first = setup.store_commits();
    // 2 000 documents in transactions of at most 400: Loads of later ones read earlier
    // commits.
    assert!(first >= 5, "{first} commits\n{}", setup.log_text());

    write_lines(&views, &docs);
    setup.sluice(&run);
    assert_eq!(
        reduce_expected(&setup.table()),
        reduce_expected(&docs),
        "a restart with more input counts each document once"
    );
    let second = setup.store_commits();
    assert!(second > first);

    let table = setup.table();
    setup.sluice(&run);
    assert_eq!(
        setup.table(),
        table,
        "a run with no new input changed the table"
    );
    [first, second]
}

/// The connector state the second and third Opens got back: the commits (and flushes)
/// made before each, `commits`. Those of StartedCommit and Flushed are recorded with
/// their transaction; Acknowledged's with the next one, or lost when the run ends (so
/// at most the commits made). The first Open had no state but Applied's.
fn assert_open_states(setup: &Setup, commits: [u64; 2]) {
    let states = setup.open_states();
    assert!(states.len() >= 3, "{}", setup.log_text());
    assert_eq!(
        states[0].get("commits"),
        None,
        "a first Open has no commits"
    );
    for (state, commits) in states[1..3].iter().zip(commits) {
        assert_eq!(
            state["flushes"], commits,
            "Flushed state, recorded: {state}"
        );
        assert_eq!(
            state["commits"], commits,
            "StartedCommit state, recorded: {state}"
        );
        let acknowledged = state["acknowledged"].as_u64();
        assert!(
            acknowledged.is_some_and(|a| a <= commits),
            "Acknowledged state, recorded with the next commit: {state}"
        );
    }
}

#[test]
fn the_current_driver_over_grpc_passes_the_conformance_suite() {
    let setup = Setup::new();
    let driver = setup.start_grpc(0);
    setup.suite(
        &["--endpoint", &driver.address],
        &["--lacks", "delta-updates"],
    );
}

#[test]
fn the_current_driver_over_stdio_passes_the_conformance_suite_in_either_codec() {
    for codec in ["proto", "json"] {
        let setup = Setup::new();
        let command = setup.stdio_command(codec);
        setup.suite(
            &["--command", &command],
            &["--codec", codec, "--lacks", "delta-updates"],
        );
    }
}

#[test]
fn the_builtin_sqlite_driver_served_over_current_stdio_passes_the_conformance_suite() {
    for codec in ["proto", "json"] {
        let setup = Setup::new();
        let config = serde_json::json!({ "path": setup.path("conformance.db") });
        std::fs::write(setup.path("config.json"), config.to_string()).unwrap();
        let command = format!("{SLUICE} driver stdio sqlite --codec {codec}");
        setup.suite(&["--command", &command], &["--codec", codec]);
    }
}

#[test]
fn a_pipeline_through_the_current_grpc_driver_is_exactly_once_and_rebuilds_a_lost_store() {
    let setup = Setup::new();
    // A fixed port, so the restarted driver below answers where the pipeline looks.
    let port = free_address().port();
    let driver = setup.start_grpc(port);
    let endpoint = format!(
        "grpc: {{address: \"{}\", protocol: current, pattern: authoritative}}",
        driver.address
    );
    setup.write_pipeline(&endpoint);
    let commits = run_exactly_once_across_restarts(&setup);
    let table = setup.table();

    // The store is lost: the driver restarts with none, while the runtime's recovery log
    // says everything was committed. The driver's state says it made commits, so its
    // Open answers the rebuild sentinel, and the run materializes the input again from
    // the start: once.
    drop(driver);
    std::fs::remove_file(setup.state()).unwrap();
    let _driver = setup.start_grpc(port);
    setup.sluice(&["run", "pipeline.yaml"]);
    assert!(
        setup
            .log_text()
            .contains("store lost: answering the rebuild sentinel"),
        "{}",
        setup.log_text()
    );
    assert_eq!(
        setup.table(),
        table,
        "the rebuilt table is the reduction, once"
    );
    assert_open_states(&setup, commits);
}

#[test]
fn a_pipeline_through_the_current_stdio_driver_in_json_is_exactly_once_across_restarts() {
    let setup = Setup::new();
    let args: Vec<String> = std::iter::once(DRIVER.to_string())
        .chain(setup.driver_args(&["--stdio", "--codec", "json", "--acknowledge", "late"]))
        .map(|arg| format!("\"{arg}\""))
        .collect();
    let endpoint = format!(
        "command: {{program: python3, args: [{}], protocol: current, codec: json, \
         pattern: authoritative}}",
        args.join(", ")
    );
    setup.write_pipeline(&endpoint);
    let commits = run_exactly_once_across_restarts(&setup);
    assert_open_states(&setup, commits);
}
