//! The Iceberg epoch sink end to end, with the `sluice` binary, read back independently
//! by pyiceberg (`sluice_iceberg::pyiceberg_read`, through the same SQLite catalog):
//! the table is the change log of the pipeline, one row per transaction and key, `_txn`
//! numbering them, and adds up to the input's reduction. A second run changes nothing;
//! runs SIGKILLed at random moments and restarted leave it exact, with no file
//! in the warehouse that the table does not reference; `sluice apply --dry-run` shows the
//! table it would create and creates nothing.
//!
//! A `mode: upsert` table (a standard binding, summing per user) reads back as ONE row
//! per user equal to the whole input's reduction, after a clean run, a second run, and
//! runs SIGKILLed at random moments.
//!
//! What operators do is refused where it would count twice or leave a hole, naming
//! the table and the ways out: `apply --delete`, a removed or older recovery log, a
//! table rolled back to an older backup, a table recreated.
//!
//! Needs `python3` with `pyiceberg[sql-sqlite,pyarrow]` (`.ci/services` installs it).

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common;

use common::{
    Row, SLUICE, assert_success, copy_dir, generate, pipeline_yaml, reduce_expected, write_lines,
};

/// The table's mode: a change log (delta updates), or one row per key (`mode: upsert`,
/// a standard binding).
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Changelog,
    Upsert,
}

/// A folder holding `docs` as the input of the pageviews pipeline into an Iceberg table
/// of `mode`, in transactions of `max_docs`.
fn pipeline_dir(mode: Mode, docs: &[Value], max_docs: u64) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_lines(&dir.path().join("views.jsonl"), docs);
    let yaml = pipeline_yaml(
        "    file: {path: views.jsonl, format: json}",
        "iceberg: {catalog: out/catalog.db, warehouse: out/warehouse}",
        mode == Mode::Changelog,
        max_docs,
        "10m",
    );
    let yaml = match mode {
        Mode::Changelog => yaml,
        Mode::Upsert => yaml.replace(
            "resource: {table: pageviews}",
            "resource: {table: pageviews, mode: upsert}",
        ),
    };
    std::fs::write(dir.path().join("pipeline.yaml"), yaml).unwrap();
    dir
}

/// The upsert table as pyiceberg reads it (position deletes applied): one row per user
/// (asserted), as its reduction.
fn upsert_view(dir: &Path) -> BTreeMap<String, Row> {
    common::iceberg_upsert_view(dir).unwrap()
}

/// Every row of the table, as pyiceberg reads it.
fn pyiceberg_rows(dir: &Path) -> Vec<Value> {
    sluice_iceberg::pyiceberg_read(
        &dir.join("out/catalog.db"),
        &dir.join("out/warehouse"),
        "sluice.pageviews",
        false,
    )
    .unwrap()
}

/// Checks the change log: each (transaction, key) once, transactions 1..=n each
/// present, the rows of each key adding up to its reduction. Returns n.
fn assert_change_log(rows: &[Value], expected: &BTreeMap<String, Row>) -> u64 {
    let mut seen = BTreeSet::new();
    let mut txns = BTreeSet::new();
    let mut table: BTreeMap<String, Row> = BTreeMap::new();
    for row in rows {
        let user = row["user_id"].as_str().unwrap().to_string();
        let txn = row["_txn"].as_i64().unwrap();
        assert_eq!(row["_op"], "U", "{row}");
        assert!(
            seen.insert((txn, user.clone())),
            "key {user} twice in txn {txn}"
        );
        txns.insert(txn as u64);
        table.entry(user).or_default().add(
            row["views"].as_i64().unwrap(),
            row["bytes"].as_i64().unwrap(),
            row["last_seen"].as_str().unwrap(),
        );
        let doc: Value = serde_json::from_str(row["flow_document"].as_str().unwrap()).unwrap();
        assert_eq!(
            doc["views"], row["views"],
            "the document column holds the row"
        );
    }
    assert_eq!(
        &table, expected,
        "the change log adds up to the input's reduction"
    );
    let n = txns.len() as u64;
    assert_eq!(
        txns,
        (1..=n).collect(),
        "transactions are contiguous from 1"
    );
    n
}

fn orphans(dir: &Path) -> Vec<String> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let catalog =
            sluice_iceberg::open_catalog(&dir.join("out/catalog.db"), &dir.join("out/warehouse"))
                .await
                .unwrap();
        sluice_iceberg::orphan_data_files(&catalog).await.unwrap()
    })
}

/// Runs the pipeline six times, each SIGKILLed after a while unless it ended first:
/// how many were killed.
fn kill_at_random_moments(dir: &Path) -> usize {
    let mut killed = 0;
    for delay_ms in [150u64, 400, 250, 700, 350, 900] {
        let mut child = Command::new(SLUICE)
            .args(["run", "pipeline.yaml"])
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap();
            killed += 1;
        }
        child.wait().unwrap();
    }
    killed
}

fn run(dir: &Path) {
    let out = Command::new(SLUICE)
        .args(["run", "pipeline.yaml"])
        .current_dir(dir)
        .output()
        .unwrap();
    assert_success(&out);
}

/// Runs `sluice <command> pipeline.yaml` in `dir`, which must fail with an error naming
/// every one of `parts`.
fn assert_refused(dir: &Path, command: &[&str], parts: &[&str]) {
    let out = Command::new(SLUICE)
        .args(command)
        .arg("pipeline.yaml")
        .current_dir(dir)
        .output()
        .unwrap();
    let error = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{command:?} went on:\n{error}");
    for part in parts {
        assert!(
            error.contains(part),
            "{command:?}: {part:?} missing from:\n{error}"
        );
    }
}

/// A standard binding into a change-log table would quietly become delta updates (each
/// transaction's sums counted from zero): `sluice check` and `sluice run` refuse it,
/// naming the binding and both ways out, and the run creates nothing.
#[test]
fn a_standard_binding_into_a_change_log_table_is_refused_naming_the_remedy() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = pipeline_yaml(
        "    file: {path: views.jsonl, format: json}",
        "iceberg: {catalog: out/catalog.db, warehouse: out/warehouse}",
        false,
        100,
        "10m",
    );
    std::fs::write(dir.path().join("pipeline.yaml"), yaml).unwrap();
    write_lines(&dir.path().join("views.jsonl"), &generate(10, 5, 1));
    for command in [&["check", "--offline"][..], &["run"]] {
        assert_refused(
            dir.path(),
            command,
            &[
                "materializations.views-db.bindings[0]",
                "is a standard binding, but the epoch sink answers no Load for it",
                "delta_updates: true",
                "mode: upsert",
            ],
        );
    }
    assert!(
        !dir.path().join("out/catalog.db").exists(),
        "nothing created"
    );
}

#[test]
fn a_run_appends_each_transactions_changes_once_and_a_second_run_changes_nothing() {
    let docs = generate(20_000, 500, 3);
    let dir = pipeline_dir(Mode::Changelog, &docs, 2_000);

    let dry = Command::new(SLUICE)
        .args(["apply", "--dry-run", "pipeline.yaml"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_success(&dry);
    let said = String::from_utf8_lossy(&dry.stdout);
    assert!(
        said.contains("pageviews"),
        "the dry run names the table: {said}"
    );
    assert!(
        !dir.path().join("out/catalog.db").exists() && !dir.path().join("out/warehouse").exists(),
        "the dry run created nothing"
    );

    run(dir.path());
    assert!(
        dir.path()
            .join("out/warehouse/sluice.db/pageviews")
            .is_dir(),
        "the table lives where the dry run's check above found nothing"
    );
    let expected = reduce_expected(&docs);
    let rows = pyiceberg_rows(dir.path());
    assert_eq!(assert_change_log(&rows, &expected), 10);
    assert_eq!(orphans(dir.path()), Vec::<String>::new());

    run(dir.path());
    assert_eq!(
        pyiceberg_rows(dir.path()).len(),
        rows.len(),
        "nothing appended twice"
    );
}

#[test]
fn runs_killed_at_random_moments_leave_the_table_exact_and_no_orphans() {
    let docs = generate(30_000, 700, 11);
    let dir = pipeline_dir(Mode::Changelog, &docs, 500);
    let killed = kill_at_random_moments(dir.path());
    run(dir.path());
    let rows = pyiceberg_rows(dir.path());
    let n = assert_change_log(&rows, &reduce_expected(&docs));
    assert_eq!(n, 60, "30 000 documents in transactions of 500");
    assert_eq!(
        orphans(dir.path()),
        Vec::<String>::new(),
        "after {killed} kills"
    );
}

#[test]
fn an_upsert_table_holds_one_row_per_key_equal_to_the_reduction() {
    let docs = generate(20_000, 500, 5);
    let dir = pipeline_dir(Mode::Upsert, &docs, 2_000);
    run(dir.path());
    let expected = reduce_expected(&docs);
    assert_eq!(
        upsert_view(dir.path()),
        expected,
        "10 transactions reduced onto the table"
    );
    let snapshots = sluice_iceberg::pyiceberg_read(
        &dir.path().join("out/catalog.db"),
        &dir.path().join("out/warehouse"),
        "sluice.pageviews",
        true,
    )
    .unwrap();
    assert_eq!(snapshots.len(), 10, "one snapshot per transaction");
    assert!(
        snapshots[1..].iter().all(|s| s["operation"] == "overwrite"),
        "later transactions replace rows: {snapshots:?}"
    );

    run(dir.path());
    assert_eq!(
        upsert_view(dir.path()),
        expected,
        "a second run changes nothing"
    );
}

#[test]
fn runs_killed_at_random_moments_leave_the_upsert_table_exact() {
    let docs = generate(30_000, 700, 13);
    let dir = pipeline_dir(Mode::Upsert, &docs, 500);
    let killed = kill_at_random_moments(dir.path());
    run(dir.path());
    assert_eq!(
        upsert_view(dir.path()),
        reduce_expected(&docs),
        "after {killed} kills"
    );
    assert_eq!(orphans(dir.path()), Vec::<String>::new());
}

/// Starting over without the sink's help: `sluice apply --delete` is refused for
/// Iceberg (it does not drop what it created, saying so), so an operator removes the
/// recovery log and runs again, which would read the input again from the beginning
/// under a new generation. Reduced onto the rows the last run left, each key would count
/// twice: the run is refused, naming the table and the ways out, and the table keeps
/// each reduction once.
#[test]
fn an_upsert_table_whose_recovery_log_was_removed_is_refused_not_doubled() {
    let docs = generate(4_000, 200, 17);
    let dir = pipeline_dir(Mode::Upsert, &docs, 1_000);
    run(dir.path());
    let expected = reduce_expected(&docs);
    assert_eq!(upsert_view(dir.path()), expected);

    assert_refused(
        dir.path(),
        &["apply", "--delete"],
        &["cannot drop what it created"],
    );
    std::fs::remove_dir_all(dir.path().join(".sluice")).unwrap();
    assert_refused(
        dir.path(),
        &["run"],
        &[
            "sluice.pageviews",
            "holds the view of another run",
            "Drop the table",
        ],
    );
    assert_eq!(
        upsert_view(dir.path()),
        expected,
        "each key reduced once, nothing counted twice"
    );
}

/// A recovery log restored from an older backup is behind the table: the transactions
/// after it would be read and numbered again, and applied to a table that holds them.
/// The run is refused, naming the table, the epochs, and the ways out; the table keeps
/// each reduction once.
#[test]
fn a_recovery_log_restored_from_an_older_backup_is_refused() {
    let docs = generate(6_000, 200, 19);
    let (first, second) = docs.split_at(3_000);
    let dir = pipeline_dir(Mode::Upsert, first, 1_000);
    run(dir.path());
    let backup = dir.path().join("backup");
    copy_dir(&dir.path().join(".sluice"), &backup, &[]);

    write_lines(&dir.path().join("views.jsonl"), &docs);
    run(dir.path());
    let expected = reduce_expected(&docs);
    assert_eq!(upsert_view(dir.path()), expected);
    assert_ne!(
        expected,
        reduce_expected(second),
        "the halves overlap in keys"
    );

    std::fs::remove_dir_all(dir.path().join(".sluice")).unwrap();
    copy_dir(&backup, &dir.path().join(".sluice"), &[]);
    assert_refused(
        dir.path(),
        &["run"],
        &[
            "sluice.pageviews",
            "holds epoch 6",
            "decided epochs up to 3 only",
            "restored from an older backup",
            "Restore the newest copy",
        ],
    );
    assert_eq!(upsert_view(dir.path()), expected, "nothing applied twice");
}

/// An upsert table rolled back (its catalog restored from an older backup) has lost
/// transactions its recovery log committed to it, and the next run would append the
/// pending ones above the hole. The run is refused, naming the table, what it holds,
/// what the log committed, and the ways out; the table stays as the restore left it.
/// Putting the newest catalog back (the first way out) lets the run finish exactly.
#[test]
fn a_table_rolled_back_to_an_older_backup_is_refused_not_left_with_a_hole() {
    let docs = generate(6_000, 200, 23);
    let dir = pipeline_dir(Mode::Upsert, &docs[..3_000], 1_000);
    run(dir.path());
    let catalog = dir.path().join("out/catalog.db");
    let (older, newest) = (dir.path().join("older.db"), dir.path().join("newest.db"));
    std::fs::copy(&catalog, &older).unwrap();
    let rolled_back = upsert_view(dir.path());

    write_lines(&dir.path().join("views.jsonl"), &docs);
    run(dir.path());
    let expected = reduce_expected(&docs);
    assert_eq!(upsert_view(dir.path()), expected);
    std::fs::copy(&catalog, &newest).unwrap();

    std::fs::copy(&older, &catalog).unwrap();
    assert_eq!(
        upsert_view(dir.path()),
        rolled_back,
        "the restore rolled it back"
    );
    assert_refused(
        dir.path(),
        &["run"],
        &[
            "sluice.pageviews",
            "holds transactions up to 3 of this run",
            "log committed transactions up to",
            "rolled back",
            "Restore the table's newest metadata",
        ],
    );
    assert_eq!(
        upsert_view(dir.path()),
        rolled_back,
        "nothing appended above the hole"
    );

    std::fs::copy(&newest, &catalog).unwrap();
    run(dir.path());
    assert_eq!(upsert_view(dir.path()), expected);
}

/// A table dropped and created again (here its catalog and warehouse removed, then
/// `sluice apply`) holds none of what the recovery log committed to it, and the log
/// would carry on from its position: the earlier transactions would never come back.
/// The run is refused, naming the table and the ways out; starting over as it says
/// (the recovery log removed too) fills the table from the beginning.
#[test]
fn a_recreated_table_is_refused_not_filled_from_the_middle() {
    let docs = generate(3_000, 200, 31);
    let dir = pipeline_dir(Mode::Changelog, &docs, 1_000);
    run(dir.path());
    let recreate = |dir: &Path| {
        std::fs::remove_dir_all(dir.join("out")).unwrap();
        let out = Command::new(SLUICE)
            .args(["apply", "pipeline.yaml"])
            .current_dir(dir)
            .output()
            .unwrap();
        assert_success(&out);
    };
    recreate(dir.path());
    let all = [docs, generate(1_000, 200, 37)].concat();
    write_lines(&dir.path().join("views.jsonl"), &all);
    assert_refused(
        dir.path(),
        &["run"],
        &[
            "sluice.pageviews",
            "dropped and created again",
            "remove the materialization's recovery log folder",
        ],
    );
    assert!(pyiceberg_rows(dir.path()).is_empty(), "nothing appended");

    std::fs::remove_dir_all(dir.path().join(".sluice")).unwrap();
    recreate(dir.path());
    run(dir.path());
    assert_change_log(&pyiceberg_rows(dir.path()), &reduce_expected(&all));
}

/// `sluice maintain` on an upsert table of many small transactions: its data files are
/// compacted into one, its delete files and all but the kept snapshots go, and the table
/// reads the same. The next run, on more input, still reduces each key once onto it (the
/// ancestry walk and the index of live rows follow the compaction).
#[test]
fn maintain_compacts_an_upsert_table_and_later_runs_stay_exact() {
    let docs = generate(12_000, 300, 23);
    let (first, _) = docs.split_at(6_000);
    let dir = pipeline_dir(Mode::Upsert, first, 500);
    run(dir.path());
    let maintain = |dir: &Path| {
        let out = Command::new(SLUICE)
            .args([
                "maintain",
                "pipeline.yaml",
                "--json",
                "--keep-snapshots",
                "2",
            ])
            .args(["--snapshot-age", "0s", "--orphan-age", "0s"])
            .current_dir(dir)
            .output()
            .unwrap();
        assert_success(&out);
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        report["tables"][0].clone()
    };
    let report = maintain(dir.path());
    assert_eq!(report["table"], "sluice.pageviews");
    assert!(
        report["data_files_before"].as_u64().unwrap() >= 12
            && report["data_files_after"] == 1
            && report["delete_files_before"].as_u64().unwrap() > 0
            && report["delete_files_after"] == 0,
        "{report}"
    );
    assert!(
        report["snapshots_expired"].as_u64().unwrap() >= 10,
        "{report}"
    );
    assert_eq!(upsert_view(dir.path()), reduce_expected(first));
    assert_eq!(orphans(dir.path()), Vec::<String>::new());

    write_lines(&dir.path().join("views.jsonl"), &docs);
    run(dir.path());
    assert_eq!(upsert_view(dir.path()), reduce_expected(&docs));
    run(dir.path());
    assert_eq!(
        upsert_view(dir.path()),
        reduce_expected(&docs),
        "a second run changes nothing"
    );
}

/// A pipeline without an Iceberg endpoint has nothing to maintain, and is told so.
#[test]
fn maintain_without_an_iceberg_endpoint_names_what_the_pipeline_has() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = pipeline_yaml(
        "    file: {path: views.jsonl, format: json}",
        "sqlite: {path: out/views.db}",
        false,
        100,
        "10s",
    );
    std::fs::write(dir.path().join("pipeline.yaml"), yaml).unwrap();
    assert_refused(
        dir.path(),
        &["maintain"],
        &["no Iceberg endpoint to maintain", "(sqlite)"],
    );
}
