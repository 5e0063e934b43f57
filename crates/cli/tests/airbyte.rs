//! The `airbyte` and `singer` sources with real connectors from PyPI, installed by
//! `.ci/services` into `~/.cache/sluice-connectors/bin` (or `$SLUICE_CONNECTORS`): a
//! missing one fails its test with the install hint, never skips it.
//!
//! - airbyte-source-faker (fixed seed) into PostgreSQL, SIGKILLed at random moments, ends
//!   with whole slices of an uninterrupted run, and no connector process outlives a
//!   killed sluice;
//! - tap-jsonl over a file into SQLite; airbyte-source-file over a CSV;
//! - `sluice discover` on faker prints a pipeline that runs as printed;
//! - a bad configuration shows the connector's own check message, naming the source.

use crate::common;

use common::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// The folder the connectors' executables are linked into.
fn connectors() -> PathBuf {
    match std::env::var_os("SLUICE_CONNECTORS") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/sluice-connectors/bin"),
    }
}

/// The executable `program`, installed by `.ci/services`.
fn connector(program: &str) -> String {
    let path = connectors().join(program);
    assert!(
        path.exists(),
        "{} is missing: run `bash .ci/services` (it pip-installs the test connectors into \
         virtualenvs under ~/.cache/sluice-connectors and links them there)",
        path.display()
    );
    path.display().to_string()
}

fn sluice(args: &[&str], dir: &Path) -> Output {
    Command::new(SLUICE)
        .args(args)
        .current_dir(dir)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

fn sqlite3(db: &Path, sql: &str) -> Vec<Vec<String>> {
    let out = Command::new("sqlite3").arg(db).arg(sql).output();
    let out = match out {
        Ok(out) => out,
        Err(_) => panic!("sqlite3 is needed to read {}", db.display()),
    };
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.split('|').map(String::from).collect())
        .collect()
}

#[test]
fn tap_jsonl_reads_a_file_into_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let lines: String = (1..=50)
        .map(|i| {
            format!(
                "{{\"id\": {}, \"name\": \"n{i}\", \"score\": {}}}\n",
                i % 20,
                i
            )
        })
        .collect();
    std::fs::write(dir.path().join("items.jsonl"), lines).unwrap();
    let pipeline = format!(
        r#"
collections:
  items:
    key: [/id]
    schema: {{type: object, required: [id], properties: {{id: {{type: integer}}, name: {{type: string}}, score: {{type: integer, reduce: {{strategy: maximize}}}}}}}}
sources:
  jsonl:
    target: items
    singer:
      command: [{tap}]
      config: {{path: items.jsonl, stream_name: items, primary_keys: [id], emit_state_every: 7}}
      streams: [{{name: items}}]
materializations:
  db:
    endpoint: {{sqlite: {{path: out.db}}}}
    bindings: [{{source: items, resource: {{table: items}}}}]
"#,
        tap = connector("tap-jsonl")
    );
    // A sum counts a record read again twice: an at-least-once source is refused under
    // exactly-once, naming the reduction.
    let summing = pipeline.replace("strategy: maximize", "strategy: sum");
    std::fs::write(dir.path().join("pipeline.yaml"), summing).unwrap();
    let refused = sluice(&["check", "pipeline.yaml"], dir.path());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{said}");
    assert!(
        said.contains("sources.jsonl: declares at-least-once")
            && said.contains("materializations.db.bindings[0] has /score: sum"),
        "{said}"
    );
    // Maximize is idempotent under replay: admitted, and check says so per binding.
    std::fs::write(dir.path().join("pipeline.yaml"), pipeline).unwrap();
    let checked = sluice(&["check", "pipeline.yaml"], dir.path());
    assert_success(&checked);
    let said = String::from_utf8_lossy(&checked.stdout);
    assert!(said.contains("replay:   idempotent under replay"), "{said}");
    // The tap reads paths relative to where it runs: the pipeline's folder here.
    let out = sluice(&["run", "pipeline.yaml"], dir.path());
    assert_success(&out);
    let rows = sqlite3(
        &dir.path().join("out.db"),
        "SELECT id, name, score FROM items ORDER BY id",
    );
    assert_eq!(rows.len(), 20, "one row per key");
    // Key 0 saw scores 20, 40 (lastWriteWins name, maximize score).
    assert_eq!(rows[0], vec!["0", "n40", "40"]);
    assert_eq!(rows[1], vec!["1", "n41", "41"]);
}

#[test]
fn airbyte_source_file_reads_a_csv() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("people.csv");
    std::fs::write(&csv, "id,name,score\n1,ann,3\n2,bob,5\n3,cy,7\n2,bo,6\n").unwrap();
    let pipeline = format!(
        r#"
delivery: at_least_once
collections:
  people:
    key: [/id]
    schema: {{type: object, required: [id], properties: {{id: {{type: number}}, name: {{type: string}}, score: {{type: number}}}}}}
sources:
  csv:
    target: people
    airbyte:
      command: [{program}]
      config: {{dataset_name: people, format: csv, url: {csv}, provider: {{storage: local}}}}
      streams: [{{name: people, key: [/id], sync_mode: full_refresh}}]
materializations:
  db:
    endpoint: {{sqlite: {{path: out.db}}}}
    bindings: [{{source: people, resource: {{table: people}}}}]
"#,
        program = connector("source-file"),
        csv = csv.display()
    );
    std::fs::write(dir.path().join("pipeline.yaml"), pipeline).unwrap();
    assert_success(&sluice(&["run", "pipeline.yaml"], dir.path()));
    let rows = sqlite3(
        &dir.path().join("out.db"),
        "SELECT id, name, score FROM people ORDER BY id",
    );
    let rows: Vec<String> = rows.into_iter().map(|r| r.join(",")).collect();
    assert_eq!(rows, vec!["1.0,ann,3.0", "2.0,bo,6.0", "3.0,cy,7.0"]);
}

/// A faker pipeline into `schema` of the shared PostgreSQL server: `count` users, seed 1,
/// a state every 25, its configuration in a file of `dir` (so that the connector's
/// command line names the test).
fn faker_pipeline(dir: &Path, schema: &str, count: u32) -> PathBuf {
    let config = serde_json::json!({"count": count, "seed": 1, "records_per_slice": 25,
                                    "parallelism": 1, "always_updated": false});
    std::fs::write(dir.join("faker.json"), config.to_string()).unwrap();
    let pipeline = format!(
        r#"
collections:
  users:
    key: [/id]
    schema:
      type: object
      required: [id]
      properties: {{id: {{type: integer}}, name: {{type: string}}, email: {{type: string}}, age: {{type: integer}}}}
sources:
  faker:
    target: users
    airbyte:
      command: [{program}]
      config: faker.json
      streams: [{{name: users}}]
materializations:
  pg:
    endpoint: {{postgres: {{url: "{POSTGRES_URL}", schema: {schema}}}}}
    bindings: [{{source: users, resource: {{table: users}}}}]
runtime:
  transactions: {{max_docs: 20}}
"#,
        program = connector("source-faker"),
    );
    let path = dir.join("pipeline.yaml");
    std::fs::write(&path, pipeline).unwrap();
    path
}

/// The users table (its id, name, email and age; not the faker's timestamps), by id.
fn users(schema: &str) -> BTreeMap<i64, String> {
    let sql = format!(r#"SELECT "id", "name", "email", "age" FROM "{schema}"."users""#);
    postgres(async |c| {
        c.query(&sql, &[])
            .await
            .unwrap()
            .iter()
            .map(|r| {
                let id: i64 = r.get(0);
                let rest: (Option<String>, Option<String>, Option<i64>) =
                    (r.get(1), r.get(2), r.get(3));
                (id, format!("{rest:?}"))
            })
            .collect()
    })
}

/// Whether a process whose command line holds `marker` runs.
fn running(marker: &str) -> bool {
    let out = Command::new("pgrep").args(["-f", marker]).output().unwrap();
    !out.stdout.is_empty()
}

/// source-faker's users stream takes any state as "synced": a read resumed from one
/// sends nothing (`always_updated: false`). So a run killed after its first commit keeps
/// what it committed and the runs after it add nothing: the table then holds the users
/// of whole slices (a state every 25), each row as an uninterrupted run wrote it. A
/// commit between two states, or a state committed without its records, would leave a
/// count of users that is not a whole number of slices.
#[test]
fn faker_into_postgres_after_sigkills_holds_whole_slices_of_an_uninterrupted_run() {
    const USERS: u32 = 2_000;
    const SLICE: usize = 25;
    let whole = Schema::new("airbyte_whole");
    let whole_dir = tempfile::tempdir().unwrap();
    let path = faker_pipeline(whole_dir.path(), &whole.0, USERS);
    let started = std::time::Instant::now();
    assert_success(&sluice(&["run", path.to_str().unwrap()], whole_dir.path()));
    let run_ms = started.elapsed().as_millis() as u64;
    let expected = users(&whole.0);
    assert_eq!(expected.len(), USERS as usize);

    let killed = Schema::new("airbyte_killed");
    let dir = tempfile::tempdir().unwrap();
    let path = faker_pipeline(dir.path(), &killed.0, USERS);
    let marker = dir.path().display().to_string();
    // Kill moments anywhere in a run's length (the connector's check and discover, its
    // read, the commits), different each time the test runs.
    let seed = std::process::id() as u64;
    for round in 0..4u64 {
        let mut child = Command::new(SLUICE)
            .args(["run", path.to_str().unwrap()])
            .env("RUST_LOG", "warn")
            .spawn()
            .unwrap();
        let wait_ms = seed.wrapping_mul(2_654_435_761).wrapping_add(round * 7_919) % run_ms.max(1);
        std::thread::sleep(Duration::from_millis(wait_ms));
        signal(&child, "KILL");
        child.wait().unwrap();
        // The connector dies with sluice: its parent-death signal.
        wait_until("the connector to die with sluice", PATIENCE, || {
            (!running(&marker)).then_some(())
        });
    }
    assert_success(&sluice(&["run", path.to_str().unwrap()], dir.path()));
    let got = users(&killed.0);
    let n = got.len();
    assert!(
        n == USERS as usize || (n > 0 && n.is_multiple_of(SLICE)),
        "{n} users: not whole slices of {SLICE}"
    );
    let prefix: BTreeMap<i64, String> = expected.into_iter().take(n).collect();
    assert!(
        got == prefix,
        "the users after SIGKILLs are not the first {n} of an uninterrupted run"
    );
}

#[test]
fn discover_prints_a_pipeline_that_runs_as_printed() {
    let dir = tempfile::tempdir().unwrap();
    let source = format!(
        "command: [{}]\nconfig: {{count: 30, seed: 5, parallelism: 1}}\nstreams: [{{name: users}}, {{name: products}}]\n",
        connector("source-faker")
    );
    std::fs::write(dir.path().join("faker.yaml"), source).unwrap();
    let out = sluice(
        &[
            "discover",
            "airbyte",
            "--config",
            "faker.yaml",
            "--sqlite",
            "out/faker.db",
        ],
        dir.path(),
    );
    assert_success(&out);
    let printed = String::from_utf8(out.stdout).unwrap();
    assert!(
        printed.contains("airbyte_type: timestamp_with_timezone"),
        "{printed}"
    );
    std::fs::write(dir.path().join("pipeline.yaml"), &printed).unwrap();
    let run = sluice(&["run", "pipeline.yaml"], dir.path());
    assert_success(&run);
    let db = dir.path().join("out/faker.db");
    assert_eq!(sqlite3(&db, "SELECT count(*) FROM users"), vec![vec!["30"]]);
    let products = sqlite3(&db, "SELECT count(*) FROM products");
    assert!(products[0][0].parse::<u32>().unwrap() > 0, "{products:?}");
}

#[test]
fn a_bad_configuration_shows_the_connectors_check_message_naming_the_source() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = format!(
        r#"
collections:
  users: {{key: [/id], schema: {{type: object, required: [id], properties: {{id: {{type: integer}}}}}}}}
sources:
  fake-users:
    target: users
    airbyte: {{command: [{program}], config: {{count: many}}, streams: [{{name: users}}]}}
materializations:
  db:
    endpoint: {{sqlite: {{path: out.db}}}}
    bindings: [{{source: users, resource: {{table: users}}}}]
"#,
        program = connector("source-faker")
    );
    std::fs::write(dir.path().join("pipeline.yaml"), pipeline).unwrap();
    for command in ["check", "run"] {
        let out = sluice(&[command, "pipeline.yaml"], dir.path());
        assert!(!out.status.success(), "{command} succeeded");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("source fake-users: airbyte connector: the connector's check failed")
                && stderr.contains("'many' is not of type 'integer'"),
            "{command}: {stderr}"
        );
    }
}
