//! Flow's current protocol (`materialize.Connector/Materialize`) across real processes:
//! `sluice driver serve --protocol current` and `sluice driver stdio` with no
//! sub-command (both codecs) pass `sluice driver test --protocol current`, detection
//! picks each protocol of a real driver process, and a driver answering another
//! protocol number fails naming it. A pipeline whose `command:` endpoint leaves the
//! protocol unset runs a current-protocol driver it detected, in the JSON codec.
//!
//! Every scenario passes but `apply-dry-run`, which is skipped: the current protocol has
//! no dry run (the endpoint answers one itself, saying it could not describe it:
//! `current::endpoint::DRY_RUN`), so `driver test --protocol current` claims none.

use crate::common;

use common::{
    Row, SLUICE, pipeline_yaml, reduce_expected, serve_driver, sqlite_table, write_lines,
};
use sluice_driver_sdk::current::{self, Codec, Protocol};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// Runs `sluice driver test <args> --config <config>`; returns whether it exited 0 and
/// its stdout and stderr.
fn driver_test(args: &[&str], config: serde_json::Value) -> (bool, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("config.json");
    std::fs::write(&config_path, config.to_string()).unwrap();
    let output = Command::new(SLUICE)
        .args(["driver", "test"])
        .args(args)
        .arg("--config")
        .arg(&config_path)
        .output()
        .expect("run sluice driver test");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    (output.status.success(), stdout, stderr)
}

/// Every scenario passed but the dry run's, which is skipped: the current protocol has
/// no dry run.
fn assert_all_but_the_dry_run_passed(stdout: &str, stderr: &str) {
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.ends_with(" passed, 0 failed, 1 skipped"),
        "closing line {last:?} of:\n{stdout}\n{stderr}"
    );
    let skipped: Vec<&str> = stdout.lines().filter(|l| l.starts_with("SKIP")).collect();
    assert_eq!(skipped.len(), 1, "{stdout}");
    assert!(skipped[0].starts_with("SKIP apply-dry-run: "), "{stdout}");
    for passed in [
        "PASS second-open-fences-first",
        "PASS store-commit-acknowledge",
    ] {
        assert!(stdout.lines().any(|l| l == passed), "{stdout}");
    }
}

/// Writes an executable shell script `name` holding `body` into `dir`.
fn script(dir: &Path, name: &str, body: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.to_string_lossy().into_owned()
}

#[test]
fn memory_driver_served_as_a_connector_passes_over_grpc() {
    let (_server, address) = serve_driver("memory", "127.0.0.1:0", "current");
    let args = ["--endpoint", &address, "--protocol", "current"];
    let (_, stdout, stderr) = driver_test(&args, serde_json::json!({}));
    assert_all_but_the_dry_run_passed(&stdout, &stderr);
}

#[test]
fn sqlite_driver_passes_over_stdio_in_the_proto_codec() {
    let dir = tempfile::tempdir().unwrap();
    let command = format!("{SLUICE} driver stdio sqlite");
    let config = serde_json::json!({"path": dir.path().join("store.db")});
    let args = ["--command", &command, "--protocol", "current"];
    let (_, stdout, stderr) = driver_test(&args, config);
    assert_all_but_the_dry_run_passed(&stdout, &stderr);
}

#[test]
fn sqlite_driver_passes_over_stdio_in_the_json_codec() {
    let dir = tempfile::tempdir().unwrap();
    let command = format!("{SLUICE} driver stdio sqlite --codec json");
    let config = serde_json::json!({"path": dir.path().join("store.db")});
    let args = [
        "--command",
        &command,
        "--protocol",
        "current",
        "--codec",
        "json",
    ];
    let (_, stdout, stderr) = driver_test(&args, config);
    assert_all_but_the_dry_run_passed(&stdout, &stderr);
}

#[test]
fn json_codec_is_refused_with_the_transactions_protocol() {
    let command = format!("{SLUICE} driver stdio memory");
    let args = ["--command", &command, "--codec", "json"];
    let (passed, _, stderr) = driver_test(&args, serde_json::json!({}));
    assert!(!passed);
    assert!(stderr.contains("--protocol current only"), "{stderr}");
}

#[tokio::test]
async fn grpc_detection_picks_each_protocol() {
    let (_current, current_address) = serve_driver("memory", "127.0.0.1:0", "current");
    let (_seed, seed_address) = serve_driver("memory", "127.0.0.1:0", "transactions");
    let detect = current::grpc::detect;
    assert_eq!(detect(&current_address).await.unwrap(), Protocol::Current);
    assert_eq!(detect(&seed_address).await.unwrap(), Protocol::Transactions);
}

#[tokio::test]
async fn command_detection_picks_each_protocol() {
    let dir = tempfile::tempdir().unwrap();
    // With no sub-command `sluice driver stdio` speaks the current protocol.
    for codec in [Codec::Proto, Codec::Json] {
        let args = ["driver", "stdio", "memory", "--codec", codec.as_str()].map(String::from);
        let detected = current::stdio::detect("memory", SLUICE, &args, codec).await;
        assert_eq!(detected.unwrap(), Protocol::Current, "{codec}");
    }
    // A driver of the seed's protocol alone: without a sub-command it fails.
    let seed_only = script(
        dir.path(),
        "seed-only",
        &format!(
            r#"[ -n "$1" ] || {{ echo "a sub-command is required" >&2; exit 2; }}; exec {SLUICE} driver stdio memory "$1""#
        ),
    );
    let detected = current::stdio::detect("seed-only", &seed_only, &[], Codec::Proto).await;
    assert_eq!(detected.unwrap(), Protocol::Transactions);
}

#[tokio::test]
async fn a_driver_answering_another_protocol_number_fails_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    // Answers every request, whatever it is, with a Spec of protocol 1234.
    let other = script(
        dir.path(),
        "other-protocol",
        r#"cat >/dev/null; echo '{"spec": {"protocol": 1234}}'"#,
    );
    let err = current::stdio::detect("other", &other, &[], Codec::Json)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("speaks neither protocol") && err.contains("protocol 1234"),
        "{err}"
    );
    // Configured as current, its Spec fails naming the number.
    let args = [
        "--command",
        &other,
        "--protocol",
        "current",
        "--codec",
        "json",
    ];
    let (passed, stdout, _) = driver_test(&args, serde_json::json!({}));
    assert!(!passed, "{stdout}");
    let spec = stdout.lines().find(|l| l.contains("spec-schemas")).unwrap();
    assert!(
        spec.starts_with("FAIL") && spec.contains("protocol 1234") && spec.contains("3032023"),
        "{stdout}"
    );
}

#[test]
fn a_pipeline_detects_a_current_driver_and_materializes_through_it_in_json() {
    let dir = tempfile::tempdir().unwrap();
    let docs = common::generate(500, 40, 7);
    write_lines(&dir.path().join("views.jsonl"), &docs);
    let db = dir.path().join("views.db");
    // No `protocol:`: asked of the driver, which answers in the current protocol.
    let endpoint = format!(
        "command: {{program: {SLUICE}, args: [driver, stdio, sqlite, --codec, json], \
         codec: json, pattern: authoritative, config: {{path: {}}}}}",
        db.display()
    );
    let yaml = pipeline_yaml(
        "    file: {path: views.jsonl, format: json}",
        &endpoint,
        false,
        100,
        "10s",
    );
    std::fs::write(dir.path().join("pipeline.yaml"), yaml).unwrap();
    let out = Command::new(SLUICE)
        .args(["run", "pipeline.yaml"])
        .current_dir(dir.path())
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let logs = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{logs}");
    assert!(
        logs.contains("the driver speaks the current protocol"),
        "{logs}"
    );
    assert_eq!(sqlite_table(&db), reduce_expected(&docs));
}

/// A pipeline through built-in driver `name` served by another process in the current
/// protocol, over gRPC, with `config`: the store holds the reduction (`table` reads it),
/// a second run with more input, after the driver process was restarted, adds exactly
/// the rest (the store's checkpoint says where to go on), and a reset (`sluice apply
/// --delete`: an Apply with no bindings, which the served driver takes as ApplyDelete)
/// starts the store over from the whole input, nothing doubled.
fn a_pipeline_runs_through(name: &str, config: &str, table: impl Fn() -> BTreeMap<String, Row>) {
    let dir = tempfile::tempdir().unwrap();
    let write = |address: &str| {
        let endpoint = format!(
            "grpc: {{address: \"{address}\", protocol: current, pattern: authoritative, \
             config: {config}}}"
        );
        let yaml = pipeline_yaml(
            "    file: {path: views.jsonl, format: json}",
            &endpoint,
            false,
            100,
            "10s",
        );
        std::fs::write(dir.path().join("pipeline.yaml"), yaml).unwrap();
    };
    let sluice = |args: &[&str]| {
        let out = Command::new(SLUICE)
            .args(args)
            .arg("pipeline.yaml")
            .current_dir(dir.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "sluice {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let run = || sluice(&["run"]);
    let (server, address) = serve_driver(name, "127.0.0.1:0", "current");
    let first = common::generate(600, 50, 71);
    write_lines(&dir.path().join("views.jsonl"), &first);
    write(&address);
    run();
    assert_eq!(table(), reduce_expected(&first));

    drop(server);
    let (_server, address) = serve_driver(name, "127.0.0.1:0", "current");
    let all: Vec<serde_json::Value> = first
        .iter()
        .chain(&common::generate(300, 50, 72))
        .cloned()
        .collect();
    write_lines(&dir.path().join("views.jsonl"), &all);
    write(&address);
    run();
    assert_eq!(table(), reduce_expected(&all));

    sluice(&["apply", "--delete"]);
    let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&table));
    assert!(read.is_err(), "the reset dropped the table");
    run();
    assert_eq!(
        table(),
        reduce_expected(&all),
        "started over after the reset"
    );
}

#[test]
fn a_pipeline_runs_through_the_postgres_driver_served_in_the_current_protocol() {
    let schema = common::Schema::new("protocol_current");
    let config = format!(
        "{{url: \"{}\", schema: {}}}",
        common::POSTGRES_URL,
        schema.0
    );
    a_pipeline_runs_through("postgres", &config, || common::postgres_table(&schema.0));
}

#[test]
fn a_pipeline_runs_through_the_mysql_driver_served_in_the_current_protocol() {
    let database = common::MyDatabase::create(&format!("protocol_current_{}", std::process::id()));
    let config = format!("{{url: \"{}\"}}", database.url());
    a_pipeline_runs_through("mysql", &config, || common::mysql_table(&database.0));
}
