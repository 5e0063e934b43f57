//! End-to-end: deletions through `sluice run`. A document whose `/_meta/op` is `"d"`
//! deletes its key's row, needs only the key, resets the key's reduction (documents
//! after it in the same transaction start from nothing), and a later document recreates
//! the key from nothing; in a delta-updates binding it is a row like any other. File
//! sources read change envelopes (`debezium`, `insert_delete`) into such documents; a
//! record that is not one is refused at its position. Into SQLite and into the shared
//! PostgreSQL server (a schema of its own, dropped afterwards).

use serde_json::{Value, json};
use std::io::Write;
use std::process::{Command, Output};

use crate::common;

use common::{POSTGRES_URL, SLUICE, assert_success, postgres};

/// `n` sums; `n` is required, and a deletion (which has only the key) is still valid.
const SCHEMA: &str = r#"
      type: object
      required: [k, n]
      reduce: {strategy: merge}
      properties:
        k: {type: string}
        n: {type: integer, reduce: {strategy: sum}}"#;

/// The changes, as plain documents, three per transaction:
/// 1. a and b are stored.
/// 2. a is deleted; b sums on.
/// 3. a comes back from nothing; b is deleted and recreated within the transaction,
///    so it starts over (10, not 13 + 10).
/// 4. c is created and deleted within one transaction: never stored.
fn changes() -> Vec<(&'static str, &'static str, i64)> {
    vec![
        ("c", "a", 1),
        ("c", "b", 1),
        ("u", "b", 1),
        ("d", "a", 0),
        ("u", "b", 1),
        ("u", "b", 10),
        ("c", "a", 5),
        ("d", "b", 0),
        ("c", "b", 10),
        ("c", "c", 1),
        ("d", "c", 0),
        ("u", "a", 0),
    ]
}

fn expected() -> Vec<Value> {
    vec![json!({"k": "a", "n": 5}), json!({"k": "b", "n": 10})]
}

/// One change as a record of `envelope`.
fn record(envelope: &str, op: &str, k: &str, n: i64) -> Value {
    let doc = json!({"k": k, "n": n});
    let key = json!({"k": k});
    match (envelope, op) {
        ("none", "d") => json!({"k": k, "_meta": {"op": "d"}}),
        ("none", _) => doc,
        ("debezium", "d") => json!({"op": "d", "before": key, "after": null}),
        ("debezium", op) => json!({"op": op, "before": null, "after": doc}),
        ("insert_delete", "d") => json!({"delete": key}),
        ("insert_delete", _) => json!({"insert": doc}),
        _ => unreachable!(),
    }
}

struct Run {
    dir: tempfile::TempDir,
    schema: Option<String>,
}

impl Drop for Run {
    fn drop(&mut self) {
        if let Some(schema) = &self.schema {
            let sql = format!(r#"DROP SCHEMA IF EXISTS "{schema}" CASCADE"#);
            postgres(async |c| c.batch_execute(&sql).await.unwrap());
        }
    }
}

impl Run {
    /// A pipeline reading `lines` (a file of records of `envelope`) into SQLite, or a
    /// schema of its own in PostgreSQL.
    fn new(envelope: &str, in_postgres: bool, delta_updates: bool, lines: &[String]) -> Run {
        let dir = tempfile::tempdir().unwrap();
        let schema = in_postgres.then(|| {
            let schema = format!(
                "sluice_deletes_{}",
                sluice_testkit::conformance::unique_name()
            );
            let sql = format!(r#"CREATE SCHEMA "{schema}""#);
            postgres(async |c| c.batch_execute(&sql).await.unwrap());
            schema
        });
        let endpoint = match &schema {
            Some(schema) => format!("postgres: {{url: \"{POSTGRES_URL}\", schema: {schema}}}"),
            None => "sqlite: {path: out/things.db}".to_string(),
        };
        let pipeline = format!(
            r#"
collections:
  acme/things:
    key: [/k]
    schema:{SCHEMA}
sources:
  things-file:
    target: acme/things
    envelope: {envelope}
    file: {{path: things.jsonl, format: json}}
materializations:
  things-db:
    endpoint:
      {endpoint}
    bindings:
      - source: acme/things
        resource: {{table: things}}
        delta_updates: {delta_updates}
runtime:
  transactions: {{max_docs: 3, max_duration: 30s, min_duration: 30s}}
"#
        );
        std::fs::write(dir.path().join("pipeline.yaml"), pipeline).unwrap();
        let mut input = std::fs::File::create(dir.path().join("things.jsonl")).unwrap();
        for line in lines {
            writeln!(input, "{line}").unwrap();
        }
        Run { dir, schema }
    }

    fn run(&self) -> Output {
        Command::new(SLUICE)
            .arg("run")
            .arg(self.dir.path().join("pipeline.yaml"))
            .env("RUST_LOG", "warn")
            .output()
            .unwrap()
    }

    /// The table's documents in key order (a delta table's in the order stored).
    fn documents(&self) -> Vec<Value> {
        let texts: Vec<String> = match &self.schema {
            None => common::sqlite_things(&self.dir.path().join("out/things.db")),
            Some(schema) => {
                let sql = format!(
                    r#"SELECT "flow_document"::text FROM "{schema}"."things" ORDER BY "k""#
                );
                postgres(async |c| {
                    c.query(&sql, &[])
                        .await
                        .unwrap()
                        .iter()
                        .map(|r| r.get(0))
                        .collect()
                })
            }
        };
        texts
            .iter()
            .map(|text| {
                let mut doc: Value = serde_json::from_str(text).unwrap();
                // What remains of the envelope's `_meta` is not what this test checks.
                doc.as_object_mut().unwrap().remove("_meta");
                doc
            })
            .collect()
    }
}

fn lines(envelope: &str) -> Vec<String> {
    (changes().into_iter())
        .map(|(op, k, n)| record(envelope, op, k, n).to_string())
        .collect()
}

#[test]
fn deletions_delete_rows_reset_reductions_and_keys_come_back_in_sqlite() {
    let run = Run::new("none", false, false, &lines("none"));
    assert_success(&run.run());
    assert_eq!(run.documents(), expected());
}

#[test]
fn deletions_delete_rows_reset_reductions_and_keys_come_back_in_postgres() {
    let run = Run::new("none", true, false, &lines("none"));
    assert_success(&run.run());
    assert_eq!(run.documents(), expected());
}

#[test]
fn debezium_events_are_read_as_changes() {
    let mut lines = lines("debezium");
    // Kafka's tombstone after a Debezium delete: nothing to apply.
    lines.insert(4, "null".to_string());
    let run = Run::new("debezium", false, false, &lines);
    assert_success(&run.run());
    assert_eq!(run.documents(), expected());
}

#[test]
fn insert_delete_records_are_read_as_changes() {
    let run = Run::new("insert_delete", true, false, &lines("insert_delete"));
    assert_success(&run.run());
    assert_eq!(run.documents(), expected());
}

#[test]
fn in_a_delta_updates_binding_a_deletion_is_a_row_like_any_other() {
    let lines = [
        json!({"k": "a", "n": 1}).to_string(),
        json!({"k": "b", "_meta": {"op": "d"}}).to_string(),
    ];
    let run = Run::new("none", false, true, &lines);
    assert_success(&run.run());
    assert_eq!(
        run.documents(),
        vec![json!({"k": "a", "n": 1}), json!({"k": "b"})]
    );
}

/// A record that is not an envelope fails the run at its line, naming the envelope and
/// what is wrong, and nothing of its transaction is committed; the transactions before
/// it are.
#[test]
fn a_record_that_is_not_an_envelope_is_refused_at_its_position() {
    let mut lines = lines("debezium");
    lines.insert(
        6,
        json!({"op": "x", "after": {"k": "z", "n": 1}}).to_string(),
    );
    let run = Run::new("debezium", false, false, &lines);
    let out = run.run();
    assert!(!out.status.success(), "the run should fail");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("things.jsonl:7")
            && stderr.contains("envelope debezium")
            && stderr.contains(r#"`op` is "x""#),
        "{stderr}"
    );
    // Transactions 1 and 2 (the first six records) committed: a deleted, b at 13.
    assert_eq!(run.documents(), vec![json!({"k": "b", "n": 13})]);
}
