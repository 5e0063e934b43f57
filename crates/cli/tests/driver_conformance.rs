//! `sluice driver test` against the built-in drivers over every transport: in-process
//! (`--builtin`), gRPC (`sluice driver serve` in a child process) and stdio (`--command`
//! running `sluice driver stdio`). Each run must print `0 failed` and exit 0.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// Writes `config` to a file in `dir` and runs `sluice driver test <target> --config it`.
fn driver_test(dir: &Path, target: &[&str], config: serde_json::Value) -> String {
    let config_path = dir.join("config.json");
    std::fs::write(&config_path, config.to_string()).unwrap();
    let output = Command::new(SLUICE)
        .args(["driver", "test"])
        .args(target)
        .arg("--config")
        .arg(&config_path)
        .output()
        .expect("run sluice driver test");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "sluice driver test {target:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

fn assert_all_passed(stdout: &str) {
    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.ends_with(" passed, 0 failed"),
        "closing line {last:?} of:\n{stdout}"
    );
    assert!(
        stdout.lines().any(|l| l == "PASS second-open-fences-first"),
        "{stdout}"
    );
}

/// Kills the served driver however the test ends.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `sluice driver serve memory --listen <listen>`; returns it and the address
/// from its `listening on ADDRESS` line.
fn serve_memory(listen: &str) -> (Server, String) {
    let mut child = Command::new(SLUICE)
        .args(["driver", "serve", "memory", "--listen", listen])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start sluice driver serve");
    let stdout = child.stdout.take().unwrap();
    let server = Server(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let address = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    (server, address)
}

#[test]
fn memory_driver_passes_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let stdout = driver_test(dir.path(), &["--builtin", "memory"], serde_json::json!({}));
    assert_all_passed(&stdout);
}

#[test]
fn memory_driver_passes_over_grpc_tcp() {
    let dir = tempfile::tempdir().unwrap();
    let (_server, address) = serve_memory("127.0.0.1:0");
    assert!(address.starts_with("grpc://127.0.0.1:"), "{address}");
    let stdout = driver_test(dir.path(), &["--endpoint", &address], serde_json::json!({}));
    assert_all_passed(&stdout);
}

#[test]
fn memory_driver_passes_over_grpc_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("unix:{}", dir.path().join("driver.sock").display());
    let (_server, address) = serve_memory(&listen);
    let stdout = driver_test(dir.path(), &["--endpoint", &address], serde_json::json!({}));
    assert_all_passed(&stdout);
}

#[test]
fn memory_driver_passes_over_stdio_with_its_state_in_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let command = format!("{SLUICE} driver stdio memory");
    let config = serde_json::json!({"path": dir.path().join("state.json")});
    let stdout = driver_test(dir.path(), &["--command", &command], config);
    assert_all_passed(&stdout);
}

#[test]
fn sqlite_driver_passes_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let config = serde_json::json!({"path": dir.path().join("store.db")});
    let stdout = driver_test(dir.path(), &["--builtin", "sqlite"], config);
    assert_all_passed(&stdout);
}

#[test]
fn a_failing_scenario_is_reported_and_makes_the_exit_status_non_zero() {
    // The memory driver refuses unknown endpoint settings, so every scenario fails.
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("config.json");
    std::fs::write(&config_path, r#"{"no_such_setting": true}"#).unwrap();
    let output = Command::new(SLUICE)
        .args(["driver", "test", "--builtin", "memory", "--config"])
        .arg(&config_path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "{stdout}");
    assert!(
        stdout.lines().any(|l| l.starts_with("FAIL spec-schemas: ")),
        "{stdout}"
    );
    let every = format!(
        "0 passed, {} failed",
        sluice_conformance::scenario_names().count()
    );
    assert!(
        stdout.lines().last().unwrap().starts_with(&every),
        "{stdout}"
    );
}

#[test]
fn scenarios_needing_a_capability_the_driver_lacks_are_skipped_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("config.json");
    std::fs::write(&config_path, "{}").unwrap();
    let output = Command::new(SLUICE)
        .args(["driver", "test", "--builtin", "memory", "--config"])
        .arg(&config_path)
        .args(["--lacks", "deletes", "--lacks", "authoritative"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    for skipped in ["deletes", "second-open-fences-first"] {
        let line = format!("SKIP {skipped}: the driver does not claim the capability");
        assert!(stdout.lines().any(|l| l.starts_with(&line)), "{stdout}");
    }
    assert!(stdout.lines().any(|l| l == "PASS updates"), "{stdout}");
    assert!(
        stdout.lines().last().unwrap().ends_with(" skipped"),
        "{stdout}"
    );
}

#[test]
fn a_stdio_driver_that_forgets_its_state_between_processes_fails_recovery_and_fencing() {
    // Without `path` every `transactions` process starts from an empty memory driver.
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("config.json");
    std::fs::write(&config_path, "{}").unwrap();
    let output = Command::new(SLUICE)
        .args(["driver", "test", "--config"])
        .arg(&config_path)
        .arg("--command")
        .arg(format!("{SLUICE} driver stdio memory"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(!output.status.success(), "{stdout}");
    for scenario in ["reopen-recovers-checkpoint", "second-open-fences-first"] {
        let prefix = format!("FAIL {scenario}: ");
        assert!(stdout.lines().any(|l| l.starts_with(&prefix)), "{stdout}");
    }
}
