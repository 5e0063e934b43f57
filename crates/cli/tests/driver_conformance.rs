//! `sluice driver test` against the built-in drivers over every transport: in-process
//! (`--builtin`), gRPC (`sluice driver serve` in a child process) and stdio (`--command`
//! running `sluice driver stdio`). Each run must print `0 failed` and exit 0.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// Runs `sluice driver test <target> --config <config>`, which must exit 0; returns
/// its stdout.
fn driver_test(target: &[&str], config: serde_json::Value) -> String {
    let (passed, stdout, stderr) = run_driver_test(&config.to_string(), target);
    assert!(
        passed,
        "sluice driver test {target:?} failed:\n{stdout}\n{stderr}"
    );
    stdout
}

/// Runs `sluice driver test <target> --config <config>` (the configuration written to a
/// file), whatever its outcome: whether it exited 0, its stdout and its stderr.
fn run_driver_test(config: &str, target: &[&str]) -> (bool, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let config_path = dir.path().join("config.json");
    std::fs::write(&config_path, config).unwrap();
    let output = Command::new(SLUICE)
        .args(["driver", "test"])
        .args(target)
        .arg("--config")
        .arg(&config_path)
        .output()
        .expect("run sluice driver test");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    (output.status.success(), stdout, stderr)
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
    let stdout = driver_test(&["--builtin", "memory"], serde_json::json!({}));
    assert_all_passed(&stdout);
}

#[test]
fn memory_driver_passes_over_grpc_tcp() {
    let (_server, address) = serve_memory("127.0.0.1:0");
    assert!(address.starts_with("grpc://127.0.0.1:"), "{address}");
    let stdout = driver_test(&["--endpoint", &address], serde_json::json!({}));
    assert_all_passed(&stdout);
}

#[test]
fn memory_driver_passes_over_grpc_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("unix:{}", dir.path().join("driver.sock").display());
    let (_server, address) = serve_memory(&listen);
    let stdout = driver_test(&["--endpoint", &address], serde_json::json!({}));
    assert_all_passed(&stdout);
}

#[test]
fn memory_driver_passes_over_stdio_with_its_state_in_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let command = format!("{SLUICE} driver stdio memory");
    let config = serde_json::json!({"path": dir.path().join("state.json")});
    let stdout = driver_test(&["--command", &command], config);
    assert_all_passed(&stdout);
}

#[test]
fn sqlite_driver_passes_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let config = serde_json::json!({"path": dir.path().join("store.db")});
    let stdout = driver_test(&["--builtin", "sqlite"], config);
    assert_all_passed(&stdout);
}

/// Redis declares what it does (deletes only: no fence, no delta updates, no strict
/// exists), so it passes with no `--lacks`, the scenarios it cannot run skipped.
#[test]
fn redis_driver_passes_in_process_claiming_what_it_declares() {
    let dir = tempfile::tempdir().unwrap();
    let resource = dir.path().join("resource.json");
    let prefix = format!("sluice-cli-conformance-{}", std::process::id());
    std::fs::write(
        &resource,
        serde_json::json!({ "prefix": prefix }).to_string(),
    )
    .unwrap();
    let resource = resource.to_string_lossy().into_owned();
    let config = serde_json::json!({"url": "redis://127.0.0.1:6379/0"});
    let stdout = driver_test(&["--builtin", "redis", "--resource", &resource], config);
    let last = stdout.lines().last().unwrap_or_default();
    assert!(last.contains(" passed, 0 failed, "), "{stdout}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("SKIP second-open-fences-first")),
        "{stdout}"
    );
}

#[test]
fn a_failing_scenario_is_reported_and_makes_the_exit_status_non_zero() {
    // The memory driver refuses unknown endpoint settings, so every scenario fails.
    let (passed, stdout, _) =
        run_driver_test(r#"{"no_such_setting": true}"#, &["--builtin", "memory"]);
    assert!(!passed, "{stdout}");
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
    let lacks = ["--lacks", "deletes", "--lacks", "authoritative"];
    let (passed, stdout, _) =
        run_driver_test("{}", &[&["--builtin", "memory"][..], &lacks].concat());
    assert!(passed, "{stdout}");
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
    let command = format!("{SLUICE} driver stdio memory");
    let (passed, stdout, _) = run_driver_test("{}", &["--command", &command]);
    assert!(!passed, "{stdout}");
    for scenario in ["reopen-recovers-checkpoint", "second-open-fences-first"] {
        let prefix = format!("FAIL {scenario}: ");
        assert!(stdout.lines().any(|l| l.starts_with(&prefix)), "{stdout}");
    }
}
