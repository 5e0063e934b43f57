//! `sluice driver test` against the built-in drivers over every transport: in-process
//! (`--builtin`), gRPC (`sluice driver serve` in a child process) and stdio (`--command`
//! running `sluice driver stdio`), in both protocols (the seed's `transactions` and
//! Flow's `current`): every built-in driver, each transport, each protocol. Each run
//! must print `0 failed` and exit 0.

use crate::common;

use common::{MyDatabase, POSTGRES_URL, REDIS_URL, SLUICE, Schema, serve_driver};
use std::process::Command;

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

#[test]
fn memory_driver_passes_in_process() {
    let stdout = driver_test(&["--builtin", "memory"], serde_json::json!({}));
    assert_all_passed(&stdout);
}

#[test]
fn memory_driver_passes_over_grpc_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("unix:{}", dir.path().join("driver.sock").display());
    let (_server, address) = serve_driver("memory", &listen, "transactions");
    let stdout = driver_test(&["--endpoint", &address], serde_json::json!({}));
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

/// What a built-in driver is tested with: its configuration, a resource, what it does
/// not claim, and the database or schema it writes into (removed when dropped).
struct Store {
    config: serde_json::Value,
    resource: serde_json::Value,
    lacks: &'static [&'static str],
    _dir: tempfile::TempDir,
    _database: Option<MyDatabase>,
    _schema: Option<Schema>,
}

impl Store {
    /// Driver `name`'s store; `tag` makes names unique per test.
    fn of(name: &str, tag: &str) -> Store {
        let dir = tempfile::tempdir().unwrap();
        let unique = format!("sluice_dc_{tag}_{}", std::process::id());
        let table = serde_json::json!({"table": "conformance"});
        let (mut database, mut schema) = (None, None);
        let (config, resource, lacks): (_, _, &[&str]) = match name {
            "memory" => {
                let path = dir.path().join("state.json");
                (serde_json::json!({"path": path}), table, &[])
            }
            "sqlite" => {
                let path = dir.path().join("store.db");
                (serde_json::json!({"path": path}), table, &[])
            }
            "postgres" => {
                let created = Schema::new(&unique);
                let config = serde_json::json!({"url": POSTGRES_URL, "schema": created.0});
                schema = Some(created);
                (config, table, &[])
            }
            "mysql" => {
                let created = MyDatabase::create(&unique);
                let config = serde_json::json!({"url": created.url()});
                database = Some(created);
                (config, table, &[])
            }
            "redis" => (
                serde_json::json!({"url": REDIS_URL}),
                serde_json::json!({"prefix": format!("{unique}:")}),
                &["authoritative", "delta-updates", "strict-exists"],
            ),
            other => panic!("no store for {other}"),
        };
        Store {
            config,
            resource,
            lacks,
            _dir: dir,
            _database: database,
            _schema: schema,
        }
    }
}

/// The whole suite against built-in driver `name` over `transport` (`grpc` or
/// `stdio`) in `protocol`: nothing fails; only what the driver does not claim is
/// skipped, and, in the current protocol, the dry run (that protocol has none).
fn passes(name: &str, transport: &str, protocol: &str) {
    let store = Store::of(name, &format!("{transport}_{protocol}"));
    let dir = tempfile::tempdir().unwrap();
    let resource = dir.path().join("resource.json");
    std::fs::write(&resource, store.resource.to_string()).unwrap();
    let resource = resource.to_string_lossy().into_owned();
    let mut args: Vec<String> = vec!["--resource".into(), resource, "--protocol".into()];
    args.push(protocol.into());
    for lacks in store.lacks {
        args.extend(["--lacks".to_string(), lacks.to_string()]);
    }
    let _server = match transport {
        "grpc" => {
            let (server, address) = serve_driver(name, "127.0.0.1:0", protocol);
            args.extend(["--endpoint".to_string(), address]);
            Some(server)
        }
        _ => {
            // The seed's protocol runs `… transactions` (a sub-command the runtime adds).
            args.extend([
                "--command".to_string(),
                format!("{SLUICE} driver stdio {name}"),
            ]);
            None
        }
    };
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let stdout = driver_test(&args, store.config.clone());
    let last = stdout.lines().last().unwrap_or_default();
    assert!(last.contains(" passed, 0 failed"), "{stdout}");
    let skipped: Vec<&str> = stdout.lines().filter(|l| l.starts_with("SKIP")).collect();
    for line in &skipped {
        let dry_run = protocol == "current" && line.starts_with("SKIP apply-dry-run:");
        let lacked = line
            .split_once("does not claim the capability ")
            .is_some_and(|(_, names)| names.split(", ").all(|n| store.lacks.contains(&n)));
        assert!(dry_run || lacked, "skipped for no reason: {line}\n{stdout}");
    }
    assert!(
        stdout.lines().any(|l| l == "PASS apply-idempotence"),
        "{stdout}"
    );
}

/// One test per built-in driver, transport and protocol.
macro_rules! matrix {
    ($($test:ident: $name:literal $transport:literal $protocol:literal;)*) => {
        $(
            #[test]
            fn $test() {
                passes($name, $transport, $protocol);
            }
        )*
    };
}

matrix! {
    memory_over_grpc_in_the_seed_protocol: "memory" "grpc" "transactions";
    memory_over_stdio_in_the_seed_protocol: "memory" "stdio" "transactions";
    memory_over_grpc_in_the_current_protocol: "memory" "grpc" "current";
    memory_over_stdio_in_the_current_protocol: "memory" "stdio" "current";
    sqlite_over_grpc_in_the_seed_protocol: "sqlite" "grpc" "transactions";
    sqlite_over_stdio_in_the_seed_protocol: "sqlite" "stdio" "transactions";
    sqlite_over_grpc_in_the_current_protocol: "sqlite" "grpc" "current";
    sqlite_over_stdio_in_the_current_protocol: "sqlite" "stdio" "current";
    postgres_over_grpc_in_the_seed_protocol: "postgres" "grpc" "transactions";
    postgres_over_stdio_in_the_seed_protocol: "postgres" "stdio" "transactions";
    postgres_over_grpc_in_the_current_protocol: "postgres" "grpc" "current";
    postgres_over_stdio_in_the_current_protocol: "postgres" "stdio" "current";
    mysql_over_grpc_in_the_seed_protocol: "mysql" "grpc" "transactions";
    mysql_over_stdio_in_the_seed_protocol: "mysql" "stdio" "transactions";
    mysql_over_grpc_in_the_current_protocol: "mysql" "grpc" "current";
    mysql_over_stdio_in_the_current_protocol: "mysql" "stdio" "current";
    redis_over_grpc_in_the_seed_protocol: "redis" "grpc" "transactions";
    redis_over_stdio_in_the_seed_protocol: "redis" "stdio" "transactions";
    redis_over_grpc_in_the_current_protocol: "redis" "grpc" "current";
    redis_over_stdio_in_the_current_protocol: "redis" "stdio" "current";
}
