//! One process runs a materialization as `runtime.workers` key-range shards, each with
//! its own transactions and recovery log (`<log>/<materialization>/shards/<range>`).
//! What operators do to it ends exact: more workers split a log with an interrupted
//! transaction in it, fewer keep every shard, a crash between two shards' commits
//! recovers, and a reset starts over.

use crate::common;

use common::{
    SLUICE, assert_success, generate, pipeline_yaml, reduce_expected, sqlite_table, write_lines,
};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A pipeline reading `views.jsonl` in `dir` into SQLite, with `workers` shards.
fn write_pipeline(dir: &Path, workers: u32) -> PathBuf {
    let yaml = pipeline_yaml(
        "    file: {path: views.jsonl, format: json}",
        "sqlite: {path: views.db}",
        false,
        2000,
        "10s",
    );
    let yaml = format!("{yaml}  workers: {workers}\n  recovery_log: log\n");
    let path = dir.join(format!("pipeline-{workers}.yaml"));
    std::fs::write(&path, yaml).unwrap();
    path
}

fn sluice(args: &[&str], pipeline: &Path, failpoints: Option<&str>) -> Output {
    let mut cmd = Command::new(SLUICE);
    cmd.args(args).arg(pipeline);
    if let Some(points) = failpoints {
        cmd.env("FAILPOINTS", points);
    }
    cmd.output().unwrap()
}

/// The table in `dir` is the reduction of `docs`.
fn assert_exact(dir: &Path, docs: &[Value]) {
    assert_eq!(sqlite_table(&dir.join("views.db")), reduce_expected(docs));
}

/// The shard logs `sluice inspect checkpoint` lists.
fn shard_logs(pipeline: &Path) -> Vec<String> {
    let out = sluice(&["inspect", "checkpoint"], pipeline, None);
    assert_success(&out);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("materialization "))
        .map(String::from)
        .collect()
}

#[test]
fn workers_split_a_materialization_into_key_range_shards_that_add_up_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let docs = generate(20_000, 2_000, 21);
    write_lines(&dir.path().join("views.jsonl"), &docs);
    let pipeline = write_pipeline(dir.path(), 3);
    let out = sluice(&["run"], &pipeline, None);
    assert_success(&out);
    assert_exact(dir.path(), &docs);
    let logs = shard_logs(&pipeline);
    assert_eq!(logs.len(), 3, "{logs:?}");
    for (log, range) in logs.iter().zip([
        "00000000-55555555",
        "55555556-aaaaaaaa",
        "aaaaaaab-ffffffff",
    ]) {
        assert!(log.contains(&format!("shard {range}")), "{log}");
    }
    // Each document is counted once, by the shard of its key.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("views-db: 20000 documents"), "{stdout}");
    // Run again: nothing is read twice.
    assert_success(&sluice(&["run"], &pipeline, None));
    assert_exact(dir.path(), &docs);
}

/// A one-shard run crashes with a transaction's intent durable and its commit not; the
/// next run has four workers: each new shard starts from a copy of the log, replays
/// the interrupted transaction and keeps its own keys. Then fewer workers run the four
/// shards still, on more input.
#[test]
fn more_workers_split_an_interrupted_log_and_fewer_keep_every_shard() {
    let dir = tempfile::tempdir().unwrap();
    let mut docs = generate(30_000, 3_000, 22);
    write_lines(&dir.path().join("views.jsonl"), &docs);
    let one = write_pipeline(dir.path(), 1);
    let crashed = sluice(&["run"], &one, Some("txn::after-prepared=3*off->panic"));
    assert!(!crashed.status.success(), "the fail point crashed the run");
    assert_eq!(shard_logs(&one).len(), 1);

    let four = write_pipeline(dir.path(), 4);
    assert_success(&sluice(&["run"], &four, None));
    assert_exact(dir.path(), &docs);
    assert_eq!(shard_logs(&four).len(), 4);

    let more = generate(10_000, 3_000, 23);
    docs.extend(more);
    write_lines(&dir.path().join("views.jsonl"), &docs);
    assert_success(&sluice(&["run"], &one, None));
    assert_exact(dir.path(), &docs);
    assert_eq!(shard_logs(&one).len(), 4, "shards never merge");
}

/// Two shards commit on their own: a crash after one shard's driver commit (before its
/// log commit), while the other shard is anywhere in its own transaction, recovers
/// exactly, at each of several moments.
#[test]
fn a_crash_between_two_shards_commits_recovers_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let docs = generate(30_000, 3_000, 24);
    write_lines(&dir.path().join("views.jsonl"), &docs);
    let two = write_pipeline(dir.path(), 2);
    let mut crashes = 0;
    for nth in [1, 4, 7] {
        let points = format!("txn::after-driver-committed={nth}*off->panic");
        let crashed = sluice(&["run"], &two, Some(&points));
        if crashed.status.success() {
            break;
        }
        crashes += 1;
    }
    assert!(crashes > 0, "no run crashed");
    assert_success(&sluice(&["run"], &two, None));
    assert_exact(dir.path(), &docs);
}

/// `sluice apply --delete` removes every shard's log with the table: the next run
/// starts over, split again, and ends exact.
#[test]
fn a_reset_forgets_every_shard_and_starts_over() {
    let dir = tempfile::tempdir().unwrap();
    let docs = generate(10_000, 1_000, 25);
    write_lines(&dir.path().join("views.jsonl"), &docs);
    let two = write_pipeline(dir.path(), 2);
    assert_success(&sluice(&["run"], &two, None));
    assert_eq!(shard_logs(&two).len(), 2);

    let reset = sluice(&["apply", "--delete"], &two, None);
    assert_success(&reset);
    let logs = shard_logs(&two);
    assert_eq!(logs.len(), 1, "{logs:?}");
    assert!(!dir.path().join("log/views-db/shards").exists());

    assert_success(&sluice(&["run"], &two, None));
    assert_exact(dir.path(), &docs);
    assert_eq!(shard_logs(&two).len(), 2);
}

/// A part that cannot be read by several shards keeps the materialization whole: a
/// skipping source's dead letters are numbered by one shard's transactions.
#[test]
fn a_skipping_source_keeps_one_shard() {
    let dir = tempfile::tempdir().unwrap();
    let docs = generate(5_000, 500, 26);
    write_lines(&dir.path().join("views.jsonl"), &docs);
    let pipeline = write_pipeline(dir.path(), 2);
    let yaml = std::fs::read_to_string(&pipeline).unwrap().replace(
        "    target: acme/pageviews\n",
        "    target: acme/pageviews\n    on_error: skip\n",
    );
    std::fs::write(&pipeline, yaml).unwrap();
    let out = sluice(&["run"], &pipeline, None);
    assert_success(&out);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("runs as one shard, not 2"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(shard_logs(&pipeline).len(), 1);
    assert_exact(dir.path(), &docs);
}

/// Records that are not plain JSON text reach their shards too: a CSV file's rows (the
/// source builds each as a `Value`, which the router reads the key of and each shard's
/// part clones) and a Debezium envelope's changes (unwrapped to read the key), deletions
/// included, into three shards over several transactions.
#[test]
fn csv_rows_and_enveloped_changes_route_to_their_shards_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let mut csv = String::from("k,n\n");
    let mut sums: std::collections::BTreeMap<String, i64> = Default::default();
    for i in 0..3_000i64 {
        let k = format!("c{}", i % 97);
        csv.push_str(&format!("{k},{i}\n"));
        *sums.entry(k).or_default() += i;
    }
    std::fs::write(dir.path().join("rows.csv"), csv).unwrap();
    let mut changes = Vec::new();
    for i in 0..2_000i64 {
        let k = format!("d{}", i % 89);
        changes.push(serde_json::json!({"op": "u", "before": null, "after": {"k": k, "n": 1}}));
        *sums.entry(k).or_default() += 1;
    }
    for i in 0..10 {
        let k = format!("d{i}");
        changes.push(serde_json::json!({"op": "d", "before": {"k": k}, "after": null}));
        sums.remove(&k);
    }
    write_lines(&dir.path().join("changes.jsonl"), &changes);
    let pipeline = dir.path().join("pipeline.yaml");
    let yaml = r#"
collections:
  acme/things:
    key: [/k]
    schema:
      type: object
      required: [k, n]
      reduce: {strategy: merge}
      properties:
        k: {type: string}
        n: {type: integer, reduce: {strategy: sum}}
sources:
  rows:
    target: acme/things
    file: {path: rows.csv, format: csv}
  changes:
    target: acme/things
    envelope: debezium
    file: {path: changes.jsonl, format: json}
materializations:
  things-db:
    endpoint:
      sqlite: {path: things.db}
    bindings:
      - source: acme/things
        resource: {table: things}
runtime:
  transactions: {max_docs: 700, max_duration: 10s}
  workers: 3
  recovery_log: log
"#;
    std::fs::write(&pipeline, yaml).unwrap();
    let out = Command::new(SLUICE)
        .args(["run"])
        .arg(&pipeline)
        .env("RUST_LOG", "sluice_runtime=debug")
        .output()
        .unwrap();
    assert_success(&out);
    assert_eq!(shard_logs(&pipeline).len(), 3);
    // Each shard stored keys of its own (one shard storing every key would be exact
    // too): the rows its commits stored add up to the table's keys, and none is idle.
    let mut stored_by: std::collections::BTreeMap<String, u64> = Default::default();
    for line in String::from_utf8_lossy(&out.stderr).lines() {
        if !line.contains("transaction committed") {
            continue;
        }
        let field = |name: &str| {
            let at = line.find(&format!("{name}=")).expect(name) + name.len() + 1;
            line[at..].split([' ', '}']).next().unwrap().to_string()
        };
        *stored_by.entry(field("range")).or_default() += field("stored").parse::<u64>().unwrap();
    }
    assert_eq!(stored_by.len(), 3, "{stored_by:?}");
    assert!(stored_by.values().all(|&n| n > 0), "{stored_by:?}");
    let conn = rusqlite::Connection::open(dir.path().join("things.db")).unwrap();
    let mut stmt = conn
        .prepare(r#"SELECT "flow_document" FROM "things" ORDER BY "k""#)
        .unwrap();
    let stored: Vec<Value> = stmt
        .query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .map(|doc| serde_json::from_str::<Value>(&doc.unwrap()).unwrap())
        .map(|mut doc| {
            doc.as_object_mut().unwrap().remove("_meta");
            doc
        })
        .collect();
    let expected: Vec<Value> = (sums.iter())
        .map(|(k, n)| serde_json::json!({"k": k, "n": n}))
        .collect();
    assert_eq!(stored, expected);
    // Stored once per transaction that changed them: at least once each, and the
    // deleted keys among them when their deletion came in a later transaction.
    assert!(stored_by.values().sum::<u64>() >= expected.len() as u64);
}

/// A store restored from a backup taken while split is behind every shard's log: each
/// shard resumes from the checkpoint the backup holds for its range, and the table is
/// caught up exactly.
#[test]
fn a_split_store_restored_from_a_backup_is_caught_up() {
    let dir = tempfile::tempdir().unwrap();
    let first = generate(6_000, 600, 27);
    write_lines(&dir.path().join("views.jsonl"), &first);
    let two = write_pipeline(dir.path(), 2);
    assert_success(&sluice(&["run"], &two, None));
    let (db, backup) = (dir.path().join("views.db"), dir.path().join("backup.db"));
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute("VACUUM INTO ?1", [backup.to_str().unwrap()])
        .unwrap();
    drop(conn);
    let all: Vec<Value> = first
        .iter()
        .chain(&generate(6_000, 600, 28))
        .cloned()
        .collect();
    write_lines(&dir.path().join("views.jsonl"), &all);
    assert_success(&sluice(&["run"], &two, None));
    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(dir.path().join(format!("views.db{suffix}")));
    }
    std::fs::copy(&backup, &db).unwrap();
    assert_exact(dir.path(), &first);
    assert_success(&sluice(&["run"], &two, None));
    assert_exact(dir.path(), &all);
}

/// A database recreated and applied again under split shards: the shards' logs hold
/// transactions the store lost, so the run is refused and writes nothing; a reset
/// starts over exactly.
#[test]
fn a_recreated_database_under_split_shards_is_refused_then_starts_over_on_delete() {
    let dir = tempfile::tempdir().unwrap();
    let docs = generate(6_000, 600, 29);
    write_lines(&dir.path().join("views.jsonl"), &docs);
    let two = write_pipeline(dir.path(), 2);
    assert_success(&sluice(&["run"], &two, None));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(dir.path().join(format!("views.db{suffix}")));
    }
    assert_success(&sluice(&["apply"], &two, None));
    let refused = sluice(&["run"], &two, None);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(stderr.contains("sluice apply --delete"), "{stderr}");
    assert!(
        sqlite_table(&dir.path().join("views.db")).is_empty(),
        "nothing written"
    );
    assert_success(&sluice(&["apply", "--delete"], &two, None));
    assert_success(&sluice(&["run"], &two, None));
    assert_exact(dir.path(), &docs);
}

/// The shards share one reader: a document that fails validation stops every shard at
/// the transaction that holds it, as one shard would; none commits past it, whichever
/// shard owns its key.
#[test]
fn bad_input_stops_every_shard_at_its_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let docs = generate(10_000, 1_000, 30);
    let mut lines = docs.clone();
    lines[5_000]["views"] = Value::from("many");
    write_lines(&dir.path().join("views.jsonl"), &lines);
    let two = write_pipeline(dir.path(), 2);
    let failed = sluice(&["run"], &two, None);
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(!failed.status.success(), "{stderr}");
    assert!(stderr.contains(":5001"), "names the bad line: {stderr}");
    // Transactions of 2 000 documents: the first two commit in both shards.
    assert_exact(dir.path(), &docs[..4_000]);
}
