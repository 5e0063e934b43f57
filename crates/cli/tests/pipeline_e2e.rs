//! End-to-end: `sluice run` keeps a table exactly equal to the reduction of its input,
//! across clean runs, SIGKILLs at random moments, and bad input; in SQLite and in the
//! shared PostgreSQL server (each test in its own schema, dropped afterwards).
//!
//! The expected reduction is computed here, independently of Sluice's reducers.

use serde_json::Value;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::common;

use common::{
    POSTGRES_URL, Row as Expected, SLUICE, assert_success, generate, pipeline_yaml,
    postgres_execute, postgres_rows, reduce_expected, sqlite_rows, write_lines,
};

/// Where a fixture's pipeline materializes.
enum Store {
    Sqlite,
    /// A schema of its own in the shared server.
    Postgres {
        schema: String,
    },
}

struct Fixture {
    dir: tempfile::TempDir,
    store: Store,
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Store::Postgres { schema } = &self.store {
            let sql = format!(r#"DROP SCHEMA IF EXISTS "{schema}" CASCADE"#);
            postgres_execute(POSTGRES_URL, &sql);
        }
    }
}

impl Fixture {
    fn new(delta_updates: bool, max_docs: u64) -> Fixture {
        Fixture::with_store(Store::Sqlite, delta_updates, max_docs)
    }

    fn postgres(delta_updates: bool, max_docs: u64) -> Fixture {
        static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let schema = format!(
            "sluice_e2e_{}_{}_{}",
            std::process::id(),
            COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .subsec_nanos()
        );
        let sql = format!(r#"CREATE SCHEMA "{schema}""#);
        postgres_execute(POSTGRES_URL, &sql);
        Fixture::with_store(Store::Postgres { schema }, delta_updates, max_docs)
    }

    fn with_store(store: Store, delta_updates: bool, max_docs: u64) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let endpoint = match &store {
            Store::Sqlite => "sqlite: {path: out/views.db}".to_string(),
            Store::Postgres { schema } => {
                format!("postgres: {{url: \"{POSTGRES_URL}\", schema: {schema}}}")
            }
        };
        let pipeline = pipeline_yaml(
            "    file: {path: views.jsonl, format: json}",
            &endpoint,
            delta_updates,
            max_docs,
            "10s",
        );
        std::fs::write(dir.path().join("pipeline.yaml"), pipeline).unwrap();
        Fixture { dir, store }
    }

    fn pipeline(&self) -> PathBuf {
        self.dir.path().join("pipeline.yaml")
    }

    fn input(&self) -> PathBuf {
        self.dir.path().join("views.jsonl")
    }

    fn run(&self) -> Output {
        Command::new(SLUICE)
            .arg("run")
            .arg(self.pipeline())
            .env("RUST_LOG", "warn")
            .output()
            .unwrap()
    }

    /// The table as (user_id → summed row), plus the number of rows per user.
    fn table(&self) -> (BTreeMap<String, Expected>, BTreeMap<String, usize>) {
        let rows: Vec<(String, i64, i64, String)> = match &self.store {
            Store::Sqlite => sqlite_rows(&self.dir.path().join("out/views.db")),
            Store::Postgres { schema } => postgres_rows(schema),
        };
        let mut table: BTreeMap<String, Expected> = BTreeMap::new();
        let mut counts: BTreeMap<String, usize> = BTreeMap::new();
        for (user, views, bytes, seen) in rows {
            table
                .entry(user.clone())
                .or_default()
                .add(views, bytes, &seen);
            *counts.entry(user).or_default() += 1;
        }
        (table, counts)
    }
}

#[test]
fn run_to_completion_equals_independent_reduction() {
    run_to_completion(Fixture::new(false, 1000));
}

#[test]
fn postgres_run_to_completion_equals_independent_reduction() {
    run_to_completion(Fixture::postgres(false, 1000));
}

fn run_to_completion(fx: Fixture) {
    let docs = generate(20_000, 1_500, 1);
    write_lines(&fx.input(), &docs);
    assert_success(&fx.run());
    let (table, counts) = fx.table();
    assert_eq!(table, reduce_expected(&docs));
    assert!(counts.values().all(|c| *c == 1), "one row per key");

    // A second run over the same, exhausted input changes nothing.
    assert_success(&fx.run());
    assert_eq!(fx.table().0, reduce_expected(&docs));
}

/// The number before " loaded" in the run's summary line.
fn loaded_count(out: &Output) -> u64 {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let words: Vec<&str> = stdout.split_whitespace().collect();
    let at = words
        .iter()
        .position(|w| w.starts_with("loaded"))
        .unwrap_or_else(|| panic!("a summary line: {stdout}"));
    words[at - 1].parse().unwrap()
}

#[test]
fn keys_above_the_highest_stored_are_not_loaded_yet_reduce_exactly() {
    let fx = Fixture::new(false, 1000);
    // Sorted by key: each transaction's keys lie above everything stored before, but for
    // the one key a transaction boundary may split.
    let mut docs = generate(10_000, 800, 6);
    docs.sort_by(|a, b| a["user_id"].as_str().cmp(&b["user_id"].as_str()));
    write_lines(&fx.input(), &docs);
    let out = fx.run();
    assert_success(&out);
    assert!(loaded_count(&out) <= 10, "{}", loaded_count(&out));
    assert_eq!(fx.table().0, reduce_expected(&docs));

    // More documents for keys already stored must be loaded and reduced into them.
    let more = generate(2_000, 800, 7);
    let all: Vec<Value> = docs.iter().chain(&more).cloned().collect();
    write_lines(&fx.input(), &all);
    let out = fx.run();
    assert_success(&out);
    assert!(loaded_count(&out) > 500, "{}", loaded_count(&out));
    assert_eq!(fx.table().0, reduce_expected(&all));
}

/// Keys the previous transaction stored are reduced onto what it stored, with no Load,
/// and the result is still exact: five transactions of 1,000 documents over the same 100
/// keys load nothing (the first has nothing stored; every later key was stored by the
/// transaction before), where loading them would take about 400 Loads.
#[test]
fn keys_the_last_transaction_stored_are_not_loaded_yet_reduce_exactly() {
    stored_documents_replace_loads(Fixture::new(false, 1000));
}

#[test]
fn postgres_keys_the_last_transaction_stored_are_not_loaded_yet_reduce_exactly() {
    stored_documents_replace_loads(Fixture::postgres(false, 1000));
}

/// Under memory pressure (every combiner spills) the stored documents are not kept, so
/// their memory stays bounded: the keys are loaded instead, and the result is the same.
#[test]
fn under_memory_pressure_stored_documents_are_loaded_instead_and_reduce_exactly() {
    let fx = Fixture::new(false, 1000);
    let pipeline = std::fs::read_to_string(fx.pipeline()).unwrap();
    let tiny = pipeline.replace("runtime:\n", "runtime:\n  memory_budget: 4KiB\n");
    assert_ne!(pipeline, tiny);
    std::fs::write(fx.pipeline(), tiny).unwrap();
    let docs = generate(5_000, 100, 11);
    write_lines(&fx.input(), &docs);
    let out = fx.run();
    assert_success(&out);
    assert!(loaded_count(&out) >= 400, "{}", loaded_count(&out));
    assert_eq!(fx.table().0, reduce_expected(&docs));
}

fn stored_documents_replace_loads(fx: Fixture) {
    let docs = generate(5_000, 100, 11);
    for window in docs.chunks(1000) {
        let keys: std::collections::BTreeSet<_> =
            window.iter().map(|d| d["user_id"].as_str()).collect();
        assert_eq!(keys.len(), 100, "every transaction holds every key");
    }
    write_lines(&fx.input(), &docs);
    let out = fx.run();
    assert_success(&out);
    assert_eq!(loaded_count(&out), 0);
    let (table, counts) = fx.table();
    assert_eq!(table, reduce_expected(&docs));
    assert!(counts.values().all(|c| *c == 1), "one row per key");
}

/// A source with input ready (a backfill) fills its transaction to the bound instead of
/// handing the idle committer a small one: every key would otherwise be written once per
/// small transaction.
#[test]
fn a_backlog_fills_the_transaction_instead_of_closing_when_the_committer_is_idle() {
    let fx = Fixture::new(false, 1000);
    let pipeline = pipeline_yaml(
        "    file: {path: views.jsonl, format: json}",
        "sqlite: {path: out/views.db}",
        false,
        100_000,
        "10m",
    )
    .replace("min_duration: 10m", "min_duration: 0s");
    std::fs::write(fx.pipeline(), pipeline).unwrap();
    // Several reader steps' worth, all of it ready at once.
    let docs = generate(30_000, 2_000, 9);
    write_lines(&fx.input(), &docs);
    let out = fx.run();
    assert_success(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(" in 1 transactions"), "{stdout}");
    assert_eq!(fx.table().0, reduce_expected(&docs));
}

#[test]
fn appended_input_is_reduced_into_existing_rows() {
    let fx = Fixture::new(false, 700);
    let docs = generate(6_000, 500, 2);
    write_lines(&fx.input(), &docs[..4_000]);
    assert_success(&fx.run());
    assert_eq!(fx.table().0, reduce_expected(&docs[..4_000]));
    write_lines(&fx.input(), &docs);
    assert_success(&fx.run());
    assert_eq!(fx.table().0, reduce_expected(&docs));
}

#[test]
fn sigkill_at_random_moments_loses_and_doubles_nothing() {
    sigkill_at_random_moments(Fixture::new(false, 500));
}

#[test]
fn postgres_sigkill_at_random_moments_loses_and_doubles_nothing() {
    sigkill_at_random_moments(Fixture::postgres(false, 500));
}

fn sigkill_at_random_moments(fx: Fixture) {
    let docs = generate(200_000, 20_000, 3);
    write_lines(&fx.input(), &docs);
    let mut kills = 0;
    let mut seed = 0x5eed_u64;
    for _ in 0..6 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        let delay = Duration::from_millis(150 + (seed >> 33) % 600);
        let mut child = Command::new(SLUICE)
            .arg("run")
            .arg(fx.pipeline())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(delay);
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap(); // SIGKILL
            kills += 1;
        }
        child.wait().unwrap();
    }
    assert_success(&fx.run());
    let (table, counts) = fx.table();
    assert_eq!(table, reduce_expected(&docs), "after {kills} kills");
    assert!(counts.values().all(|c| *c == 1));
}

#[test]
fn delta_updates_store_one_row_per_transaction_and_key() {
    delta_updates_one_row_per_transaction_and_key(Fixture::new(true, 1000));
}

#[test]
fn postgres_delta_updates_store_one_row_per_transaction_and_key() {
    delta_updates_one_row_per_transaction_and_key(Fixture::postgres(true, 1000));
}

fn delta_updates_one_row_per_transaction_and_key(fx: Fixture) {
    let docs = generate(10_000, 300, 4);
    write_lines(&fx.input(), &docs);
    assert_success(&fx.run());
    let (table, counts) = fx.table();
    // Summing the appended rows gives the full reduction: nothing lost, nothing doubled.
    assert_eq!(table, reduce_expected(&docs));
    // Each transaction of 1000 documents stores each of its keys once.
    for (user, count) in counts {
        let expected: usize = docs
            .chunks(1000)
            .filter(|chunk| chunk.iter().any(|d| d["user_id"] == user.as_str()))
            .count();
        assert_eq!(count, expected, "rows of {user}");
    }
}

/// Writes `good` documents, then `bad` as line `good + 1`, then more good ones.
fn bad_input_case(bad: &str, expect_in_error: &[&str]) {
    let fx = Fixture::new(false, 100);
    let docs = generate(1_000, 50, 5);
    // A user this transaction has already combined, so a reduction error is met on
    // the bad line itself.
    let bad = bad.replace("USER", docs[540]["user_id"].as_str().unwrap());
    let mut text = String::new();
    for d in &docs[..550] {
        text.push_str(&d.to_string());
        text.push('\n');
    }
    text.push_str(&bad);
    text.push('\n');
    for d in &docs[550..] {
        text.push_str(&d.to_string());
        text.push('\n');
    }
    std::fs::write(fx.input(), text).unwrap();
    let out = fx.run();
    assert!(!out.status.success(), "bad input must stop the pipeline");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("views.jsonl:551"),
        "names file and line: {stderr}"
    );
    for needle in expect_in_error {
        assert!(
            stderr.contains(needle),
            "error mentions {needle:?}: {stderr}"
        );
    }
    // Transactions of 100 documents: the first five committed, the sixth (lines
    // 501..=600, holding the bad line) committed nothing.
    assert_eq!(fx.table().0, reduce_expected(&docs[..500]));
}

#[test]
fn malformed_json_line_stops_with_file_and_line() {
    bad_input_case(r#"{"user_id": "USER", "views": 1,"#, &[]);
}

#[test]
fn schema_violation_stops_with_file_and_line() {
    bad_input_case(
        r#"{"user_id": "USER", "views": "many", "bytes": 1, "last_seen": "x"}"#,
        &["/views"],
    );
}

#[test]
fn missing_key_stops_with_file_and_line() {
    bad_input_case(
        r#"{"views": 1, "bytes": 1, "last_seen": "x"}"#,
        &["user_id"],
    );
}

#[test]
fn sum_overflow_stops_with_file_and_line() {
    bad_input_case(
        r#"{"user_id": "USER", "views": 18446744073709551615, "bytes": 1, "last_seen": "x"}"#,
        &["/views"],
    );
}
