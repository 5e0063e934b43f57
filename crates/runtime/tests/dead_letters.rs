//! One writer per dead-letter file, across the attempts of a run that restarts itself.
//!
//! A source with `on_error: skip` rejects some documents of every transaction; a
//! retryable driver failure (the fail point `txn::after-prepared`) ends an attempt while
//! the reader's dead-letter write for the next transaction is held in flight
//! (`deadletter::write` sleeps). `pipeline::run` reopens the loop in the same process,
//! whose start cuts the file back to the committed transaction and writes the replayed
//! transaction's rejections again. Whatever the timing, the file must end holding each
//! rejected document exactly once, in transaction order, and the store the reduction of
//! the good documents only: a write of the failed attempt that landed after the next
//! attempt's cut would duplicate its records.
//!
//! Built only with the `failpoints` feature; the fail points are global to the process,
//! so the test holds a `fail::FailScenario`.
#![cfg(feature = "failpoints")]

mod common;

use common::Connector;

use serde_json::{Value, json};
use sluice_driver_sdk::inprocess::InProcess;
use sluice_file::FileKind;
use sluice_memory::MemoryDriver;
use sluice_runtime::config::Pipeline;
use sluice_runtime::deadletter::DeadLetter;
use sluice_runtime::failpoint::{AFTER_PREPARED, DEAD_LETTER_WRITE};
use sluice_runtime::pipeline::{self, RunOptions};
use sluice_runtime::registry::Registry;
use sluice_runtime::txn::Progress;
use sluice_source_sdk::kind;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

const LINES: u64 = 60;
const KEYS: u64 = 7;
const MATERIALIZATION: &str = "views";
const TABLE: &str = "t";

/// Line `line` (from 1) of the input: every fifth is bad ([`is_bad`]), alternately
/// not JSON and without its required `n`.
fn input_line(line: u64) -> String {
    match line % 10 {
        5 => "{\"id\": \"k1\", \"n\": ".to_string(),
        0 => json!({"id": "k2"}).to_string(),
        _ => json!({"id": format!("k{}", line % KEYS), "n": line}).to_string(),
    }
}

fn is_bad(line: u64) -> bool {
    line.is_multiple_of(5)
}

fn pipeline_yaml(input: &Path, dead_letters: &Path, log: &Path) -> String {
    format!(
        r#"
collections:
  acme/views:
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
    target: acme/views
    file: {{path: {input}, format: json}}
    on_error: skip
    dead_letter: {dead_letters}
materializations:
  {MATERIALIZATION}:
    endpoint: {{memory: {{}}}}
    bindings:
      - source: acme/views
        resource: {{table: {TABLE}}}
runtime:
  recovery_log: {log}
  transactions: {{max_docs: 8, max_duration: 600s, min_duration: 600s}}
"#,
        input = input.display(),
        dead_letters = dead_letters.display(),
        log = log.display(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_run_leaves_each_rejected_document_once_and_the_store_exact() {
    let scenario = fail::FailScenario::setup();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("input.jsonl");
    let text: String = (1..=LINES).map(|line| input_line(line) + "\n").collect();
    std::fs::write(&input, text).unwrap();
    let dead_letters = dir.path().join("rejected.jsonl");
    let registry = Registry::new()
        .with_source(kind::<FileKind>())
        .with_builtin(common::memory_kind());
    let yaml = pipeline_yaml(&input, &dead_letters, &dir.path().join("log"));
    let pipeline = Pipeline::parse(&yaml, dir.path(), &registry).unwrap();
    let store = MemoryDriver::new();
    let connector = Connector(Arc::new(InProcess::new("memory", Arc::new(store.clone()))));
    let planned = pipeline::plan(&pipeline, &connector).await.unwrap();
    pipeline::apply_first_start(&pipeline, &planned, &tokio::sync::watch::channel(false).1)
        .await
        .unwrap();

    // The third dead-letter write (transaction 3's, read while transaction 2 is
    // stored) is held in flight while transaction 2 fails at Prepared; every later
    // write is slowed, so the next attempt is still writing when a write of the failed
    // attempt that was not joined would land.
    fail::cfg(DEAD_LETTER_WRITE, "2*off->1*sleep(600)->sleep(200)").unwrap();
    fail::cfg(AFTER_PREPARED, "1*off->1*return").unwrap();
    let summaries = pipeline::run(
        &pipeline,
        planned,
        RunOptions::default(),
        Arc::new(Progress::default()),
        tokio::sync::watch::channel(false).1,
    )
    .await
    .unwrap();
    scenario.teardown();

    let bad: Vec<u64> = (1..=LINES).filter(|&l| is_bad(l)).collect();
    let (_, summary) = &summaries[0];
    assert_eq!(
        summary.restarts, 1,
        "the injected failure restarted the loop"
    );
    assert_eq!(summary.rejected, bad.len() as u64);

    let letters: Vec<DeadLetter> = std::fs::read_to_string(&dead_letters)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let mut lines: Vec<u64> = letters.iter().map(|l| line_of(&l.position)).collect();
    lines.sort_unstable();
    assert_eq!(
        lines, bad,
        "each rejected document exactly once: {letters:#?}"
    );
    assert!(
        letters.windows(2).all(|w| w[0].txn <= w[1].txn),
        "records in transaction order: {letters:#?}"
    );

    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    for line in (1..=LINES).filter(|&l| !is_bad(l)) {
        *expected.entry(format!("k{}", line % KEYS)).or_default() += line as i64;
    }
    let found: BTreeMap<String, i64> = store
        .rows(MATERIALIZATION, TABLE)
        .into_iter()
        .map(|(_, doc): (_, Value)| {
            let id = doc["id"].as_str().unwrap().to_string();
            (id, doc["n"].as_i64().unwrap())
        })
        .collect();
    assert_eq!(found, expected, "the store holds the good documents, once");
}

/// The line of a dead letter's position, `input.jsonl:<line> (byte <offset>)`.
fn line_of(position: &str) -> u64 {
    let (_, rest) = position.rsplit_once(':').expect("file:line");
    rest.split_whitespace().next().unwrap().parse().unwrap()
}
