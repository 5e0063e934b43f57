//! Logs and errors as the binary writes them: secrets (a URL's password, the HTTP
//! source's token, a NATS password or NKey seed, a Kafka SASL password) never appear, and JSON log lines carry the materialization, shard and
//! transaction of the work they describe.

use crate::common;

use common::SLUICE;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const PASSWORD: &str = "hunter2-not-logged";
const TOKEN: &str = "tok-3f9a-not-logged";

const COLLECTION: &str = "collections:
  events:
    key: [/id]
    schema: {type: object, required: [id], properties: {id: {type: string}, n: {type: integer}}}
";

/// Writes a pipeline of `source` (a source's config) into `endpoint`, and its input.
fn pipeline(dir: &Path, source: &str, endpoint: &str) -> std::path::PathBuf {
    std::fs::write(
        dir.join("in.jsonl"),
        "{\"id\":\"a\",\"n\":1}\n{\"id\":\"b\",\"n\":2}\n",
    )
    .unwrap();
    let path = dir.join("pipeline.yaml");
    let text = format!(
        "{COLLECTION}sources:
  src:
    target: events
    {source}
materializations:
  m:
    endpoint:
      {endpoint}
    bindings:
      - source: events
        resource: {{table: events}}
"
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn sluice(args: &[&str], pipeline: &Path, rust_log: &str) -> Command {
    let mut cmd = Command::new(SLUICE);
    cmd.args(["--log-format", "json"])
        .args(args)
        .arg(pipeline)
        .env("RUST_LOG", rust_log);
    cmd
}

/// The output of a run that retries an unreachable part: its first retries are logged
/// within two seconds, then SIGINT ends it.
fn retried_then_interrupted(mut command: Command) -> Output {
    let child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    common::signal(&child, "INT");
    child.wait_with_output().unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn an_unreachable_postgres_store_fails_without_its_password() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("postgres://sluice:{PASSWORD}@127.0.0.1:1/db?connect_timeout=2");
    let path = pipeline(
        dir.path(),
        "file: {path: in.jsonl, format: json}",
        &format!("postgres: {{url: \"{url}\"}}"),
    );
    let run = retried_then_interrupted(sluice(&["run"], &path, "debug"));
    let all = text(&run);
    assert!(!run.status.success(), "{all}");
    assert!(
        all.contains("127.0.0.1:1"),
        "the error names the server: {all}"
    );
    assert!(!all.contains(PASSWORD), "{all}");
    // Check asks the driver for its Spec and Validate only (no connection).
    let check = text(&sluice(&["check"], &path, "debug").output().unwrap());
    assert!(!check.contains(PASSWORD), "{check}");
}

/// With `--log-format json` every line of stderr is a JSON object, the final error
/// too; and no line carries a terminal's colour codes when stderr is not a terminal.
#[test]
fn json_logs_end_with_the_error_as_a_json_line_and_carry_no_colours() {
    let dir = tempfile::tempdir().unwrap();
    let path = pipeline(
        dir.path(),
        "file: {path: missing.jsonl, format: json}",
        "sqlite: {path: out.db}",
    );
    let run = sluice(&["run"], &path, "info").output().unwrap();
    assert!(!run.status.success());
    let stderr = String::from_utf8_lossy(&run.stderr);
    let lines: Vec<Value> = stderr
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}")))
        .collect();
    let last = lines.last().expect("the error is logged");
    assert_eq!(last["level"], "ERROR", "{last}");
    assert!(
        last["message"].as_str().unwrap().contains("missing.jsonl"),
        "{last}"
    );

    let text = Command::new(SLUICE)
        .args(["run"])
        .arg(&path)
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&text.stderr);
    assert!(stderr.contains("error: "), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "colour codes in a pipe: {stderr:?}"
    );
}

/// A NATS source's error names its URL, and the client logs its `Url` (Debug, with the
/// password): both come out redacted. The run retries; SIGINT ends it.
#[test]
fn an_unreachable_nats_source_is_named_with_its_password_redacted() {
    let dir = tempfile::tempdir().unwrap();
    let path = pipeline(
        dir.path(),
        &format!("nats: {{url: \"nats://sluice:{PASSWORD}@127.0.0.1:1\", stream: S}}"),
        "sqlite: {path: out.db}",
    );
    let all = text(&retried_then_interrupted(sluice(&["run"], &path, "debug")));
    assert!(
        all.contains("nats://sluice:***@127.0.0.1:1"),
        "the redacted URL is named: {all}"
    );
    assert!(!all.contains(PASSWORD), "{all}");
}

/// A NATS source's password in `auth`, or its NKey seed file, appear in no line of a run
/// (which retries the unreachable server) or of a check.
#[test]
fn the_nats_sources_password_and_seed_are_never_written() {
    let dir = tempfile::tempdir().unwrap();
    const SEED: &str = "SUAIO3FHUX5PNV2LQIIP7TZ3N4L7TX3W53MQGEIVYFIGA635OZCKEYHFLM";
    std::fs::write(dir.path().join("user.nk"), SEED).unwrap();
    for auth in [
        format!("{{user: sluice, password: \"{PASSWORD}\"}}"),
        "{nkey_file: user.nk}".to_string(),
    ] {
        let path = pipeline(
            dir.path(),
            &format!("nats: {{url: \"nats://127.0.0.1:1\", stream: S, auth: {auth}}}"),
            "sqlite: {path: out.db}",
        );
        let run = text(&retried_then_interrupted(sluice(&["run"], &path, "debug")));
        assert!(
            run.contains("127.0.0.1:1"),
            "the error names the server: {run}"
        );
        let check = text(&sluice(&["check"], &path, "debug").output().unwrap());
        for (command, all) in [("run", run), ("check", check)] {
            assert!(!all.contains(PASSWORD), "{auth} {command}: {all}");
            assert!(!all.contains(SEED), "{auth} {command}: {all}");
        }
    }
}

/// A Kafka source's SASL password, given in the file or read from `password_file`,
/// appears in no line of a run (which retries the unreachable broker, rskafka logging
/// at debug) or of a check.
#[test]
fn the_kafka_sources_sasl_password_is_never_written() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("kafka-password"), format!("{PASSWORD}\n")).unwrap();
    for password in [
        format!("password: \"{PASSWORD}\""),
        "password_file: kafka-password".into(),
    ] {
        let path = pipeline(
            dir.path(),
            &format!(
                "kafka: {{brokers: \"127.0.0.1:1\", topic: t, format: json, \
                 sasl: {{mechanism: SCRAM-SHA-256, username: sluice, {password}}}}}"
            ),
            "sqlite: {path: out.db}",
        );
        let run = text(&retried_then_interrupted(sluice(&["run"], &path, "debug")));
        assert!(
            run.contains("127.0.0.1:1"),
            "the error names the broker: {run}"
        );
        let check = text(&sluice(&["check"], &path, "debug").output().unwrap());
        for (command, all) in [("run", run), ("check", check)] {
            assert!(!all.contains(PASSWORD), "{password} {command}: {all}");
        }
    }
}

#[test]
fn the_http_source_token_is_never_written() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("postgres://sluice:{PASSWORD}@127.0.0.1:1/db?connect_timeout=2");
    let path = pipeline(
        dir.path(),
        &format!("http: {{listen: \"127.0.0.1:0\", token: \"{TOKEN}\"}}"),
        &format!("postgres: {{url: \"{url}\"}}"),
    );
    let run = text(&retried_then_interrupted(sluice(&["run"], &path, "debug")));
    let check = text(&sluice(&["check"], &path, "debug").output().unwrap());
    for (command, all) in [("run", run), ("check", check)] {
        assert!(!all.contains(TOKEN), "{command}: {all}");
        assert!(!all.contains(PASSWORD), "{command}: {all}");
    }
}

#[test]
fn json_log_lines_carry_materialization_shard_and_txn() {
    let dir = tempfile::tempdir().unwrap();
    let path = pipeline(
        dir.path(),
        "file: {path: in.jsonl, format: json}",
        "sqlite: {path: out.db}",
    );
    let started = Instant::now();
    let output = sluice(&["run"], &path, "sluice_runtime=debug")
        .output()
        .unwrap();
    let all = text(&output);
    assert!(output.status.success(), "{all}");
    assert!(started.elapsed() < Duration::from_secs(60));
    let lines: Vec<Value> = String::from_utf8_lossy(&output.stderr)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let committed = lines
        .iter()
        .find(|line| line["message"] == "transaction committed")
        .unwrap_or_else(|| panic!("no transaction committed line: {all}"));
    for field in ["timestamp", "level", "target", "docs"] {
        assert!(!committed[field].is_null(), "{field}: {committed}");
    }
    let spans = committed["spans"].as_array().unwrap();
    let field = |name: &str| spans.iter().find_map(|span| span.get(name).cloned());
    assert_eq!(field("materialization"), Some("m".into()), "{committed}");
    assert_eq!(
        field("shard"),
        Some("00000000-ffffffff".into()),
        "{committed}"
    );
    assert_eq!(field("txn"), Some(1.into()), "{committed}");
    // Every line of the runtime's work names its materialization.
    for line in &lines {
        let named = line["spans"]
            .as_array()
            .is_some_and(|spans| spans.iter().any(|s| s["materialization"] == "m"));
        assert!(named, "{line}");
    }
}
