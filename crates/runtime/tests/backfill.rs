//! A binding's `backfill` counter, end to end on SQLite (the embedded default): a raised
//! counter refuses `sluice run` until applied, naming the backfill; `sluice apply` drops
//! and recreates the binding's table; the next run reads its source again from the
//! beginning, so the table holds each key's sum once (not doubled, not lost), new input
//! included. A backfill whose source also feeds a binding not backfilled is refused.

mod common;

use rusqlite::Connection;
use sluice_driver_sdk::{Builtin, flow};
use sluice_file::FileKind;
use sluice_runtime::config::Pipeline;
use sluice_runtime::pipeline::{self, ApplyAction, PipelineError, RunOptions};
use sluice_runtime::registry::Registry;
use sluice_runtime::txn::Progress;
use sluice_source_sdk::kind;
use sluice_sqlite::SqliteDriver;
use std::path::Path;
use std::sync::Arc;
use tokio::sync::watch;

fn registry() -> Registry {
    Registry::new()
        .with_source(kind::<FileKind>())
        .with_builtin(common::memory_kind())
        .with_builtin(Builtin::new::<sluice_sqlite::config::EndpointConfig>(
            "sqlite",
            flow::EndpointType::Sqlite,
            &["path"],
            || Arc::new(SqliteDriver::new()),
        ))
}

/// The pipeline: `input` summed per id into table `t` (backfill `t`), and, with
/// `u: Some(n)`, into table `u` too (backfill `n`).
fn yaml(t: u32, u: Option<u32>) -> String {
    let u = match u {
        Some(backfill) => format!(
            "      - source: acme/sums\n        resource: {{table: u}}\n        backfill: {backfill}\n"
        ),
        None => String::new(),
    };
    format!(
        r#"
collections:
  acme/sums:
    key: [/id]
    schema:
      type: object
      required: [id, n]
      reduce: {{strategy: merge}}
      properties:
        id: {{type: string}}
        n: {{type: integer, reduce: {{strategy: sum}}}}
sources:
  input:
    target: acme/sums
    file: {{path: input.jsonl, format: json}}
materializations:
  sums:
    endpoint: {{sqlite: {{path: out.db}}}}
    bindings:
      - source: acme/sums
        resource: {{table: t}}
        backfill: {t}
{u}runtime:
  recovery_log: log
  transactions: {{max_docs: 2}}
"#
    )
}

fn append(dir: &Path, lines: &[(&str, i64)]) {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("input.jsonl"))
        .unwrap();
    for (id, n) in lines {
        writeln!(file, r#"{{"id": "{id}", "n": {n}}}"#).unwrap();
    }
}

fn sums(dir: &Path, table: &str) -> Vec<(String, i64)> {
    let conn = Connection::open(dir.join("out.db")).unwrap();
    let mut statement = conn
        .prepare(&format!("SELECT id, n FROM \"{table}\" ORDER BY id"))
        .unwrap();
    let rows = statement
        .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
        .unwrap();
    rows.map(Result::unwrap).collect()
}

fn pipeline(dir: &Path, text: &str) -> Pipeline {
    Pipeline::parse(text, dir, &registry()).unwrap()
}

async fn apply(dir: &Path, text: &str) -> Result<(), PipelineError> {
    let pipeline = pipeline(dir, text);
    let planned = pipeline::plan(&pipeline, &registry()).await?;
    pipeline::apply(&pipeline, &planned, ApplyAction::Upsert, false).await?;
    Ok(())
}

/// `sluice run` to the end of the input: the applied check, then the loop.
async fn run(dir: &Path, text: &str) -> Result<(), PipelineError> {
    let pipeline = pipeline(dir, text);
    let planned = pipeline::plan(&pipeline, &registry()).await?;
    let (_stop, stopped) = watch::channel(false);
    pipeline::apply_first_start(&pipeline, &planned, &stopped).await?;
    let progress = Arc::new(Progress::default());
    pipeline::run(&pipeline, planned, RunOptions::default(), progress, stopped).await?;
    Ok(())
}

fn owned(rows: &[(&str, i64)]) -> Vec<(String, i64)> {
    rows.iter().map(|(k, n)| (k.to_string(), *n)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raised_backfill_rebuilds_the_table_with_each_sum_once() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    append(dir, &[("a", 1), ("b", 2), ("a", 3), ("c", 5), ("b", 10)]);
    run(dir, &yaml(0, None)).await.unwrap();
    assert_eq!(sums(dir, "t"), owned(&[("a", 4), ("b", 12), ("c", 5)]));

    // Raised, not applied: run refuses, naming the backfill.
    let raised = yaml(1, None);
    let refused = run(dir, &raised).await.unwrap_err().to_string();
    assert!(
        refused.contains("backfill 0 → 1") && refused.contains("sluice apply"),
        "{refused}"
    );

    // `sluice check` shows what the apply would do: told the spec applied last, the
    // store's dry run drops and creates the table.
    let pipeline = pipeline(dir, &raised);
    let planned = pipeline::plan(&pipeline, &registry()).await.unwrap();
    let probed = pipeline::probe(&pipeline, &planned).await;
    assert!(probed.problems.is_empty(), "{:?}", probed.problems);
    let (_, actions) = &probed.stores[0];
    assert!(actions.contains("DROP TABLE IF EXISTS \"t\""), "{actions}");
    assert_eq!(
        sums(dir, "t"),
        owned(&[("a", 4), ("b", 12), ("c", 5)]),
        "a dry run"
    );

    // Applied: the table is dropped and created anew, empty.
    apply(dir, &raised).await.unwrap();
    assert_eq!(sums(dir, "t"), Vec::new(), "the rebuilt table starts empty");

    // The next run reads the input again from the beginning, and what came since.
    append(dir, &[("c", 1), ("d", 7)]);
    run(dir, &raised).await.unwrap();
    let expected = owned(&[("a", 4), ("b", 12), ("c", 6), ("d", 7)]);
    assert_eq!(
        sums(dir, "t"),
        expected,
        "each sum once: not doubled, not lost"
    );

    // The backfill is consumed: the next run goes on from where that one stopped.
    append(dir, &[("a", 100)]);
    run(dir, &raised).await.unwrap();
    let expected = owned(&[("a", 104), ("b", 12), ("c", 6), ("d", 7)]);
    assert_eq!(sums(dir, "t"), expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_whose_source_feeds_another_binding_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    append(dir, &[("a", 1), ("b", 2)]);
    run(dir, &yaml(0, Some(0))).await.unwrap();
    let err = apply(dir, &yaml(1, Some(0))).await.unwrap_err().to_string();
    for part in [
        "binding t",
        "binding u",
        "source input",
        "both bindings together",
    ] {
        assert!(err.contains(part), "{part:?} missing from: {err}");
    }
    // Nothing was dropped.
    assert_eq!(sums(dir, "t"), owned(&[("a", 1), ("b", 2)]));

    // Raised together, both are rebuilt and read again once.
    let both = yaml(1, Some(1));
    apply(dir, &both).await.unwrap();
    run(dir, &both).await.unwrap();
    for table in ["t", "u"] {
        assert_eq!(sums(dir, table), owned(&[("a", 1), ("b", 2)]), "{table}");
    }
}

/// A driver that keeps what a binding stored across Apply (the memory driver) cannot
/// take a backfill of a standard binding: the input read again would add onto the sums
/// it holds. Refused at apply, naming the binding and the ways out; nothing changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_into_a_driver_that_keeps_its_rows_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let into_memory = |t| yaml(t, None).replace("{sqlite: {path: out.db}}", "{memory: {}}");
    append(dir, &[("a", 1), ("b", 2)]);
    run(dir, &into_memory(0)).await.unwrap();
    let err = apply(dir, &into_memory(1)).await.unwrap_err().to_string();
    for part in ["binding t", "count twice", "sluice apply --delete"] {
        assert!(err.contains(part), "{part:?} missing from: {err}");
    }
    // The applied spec is the old one still: a run of the raised one is refused.
    let refused = run(dir, &into_memory(1)).await.unwrap_err().to_string();
    assert!(refused.contains("backfill 0 → 1"), "{refused}");
}
