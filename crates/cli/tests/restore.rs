//! End-to-end: a store restored from a backup is caught up. The store's checkpoint in
//! Opened is where processing begins, even when the recovery log has committed past
//! it: the sources are read again from there, and the table ends equal to the
//! reduction of all the input. When the input there is gone, the run stops with an
//! error naming the source and the gap, and the store is left as restored.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common;

use common::{
    SLUICE, assert_success, generate, pipeline_yaml, reduce_expected, sqlite_table, write_lines,
};

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let pipeline = pipeline_yaml(
            "    file: {path: views.jsonl, format: json}",
            "sqlite: {path: out/views.db}",
            false,
            500,
            "10s",
        );
        std::fs::write(dir.path().join("pipeline.yaml"), pipeline).unwrap();
        Fixture { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn run(&self) -> Output {
        Command::new(SLUICE)
            .arg("run")
            .arg(self.path("pipeline.yaml"))
            .env("RUST_LOG", "warn")
            .output()
            .unwrap()
    }

    fn db(&self) -> PathBuf {
        self.path("out/views.db")
    }

    /// A consistent copy of the database, as a backup tool takes it.
    fn back_up(&self, to: &Path) {
        let conn = rusqlite::Connection::open(self.db()).unwrap();
        conn.execute("VACUUM INTO ?1", [to.to_str().unwrap()])
            .unwrap();
    }

    /// Puts the backup in the database's place (and its write-ahead log away).
    fn restore(&self, from: &Path) {
        for suffix in ["-wal", "-shm"] {
            let _ = std::fs::remove_file(self.path(&format!("out/views.db{suffix}")));
        }
        std::fs::copy(from, self.db()).unwrap();
    }
}

/// Runs `first`, backs the store up, runs `first` + `more`, and restores the backup.
fn restored_behind_the_log(fx: &Fixture, first: &[Value], more: &[Value]) -> PathBuf {
    write_lines(&fx.path("views.jsonl"), first);
    assert_success(&fx.run());
    let backup = fx.path("backup.db");
    fx.back_up(&backup);
    let all: Vec<Value> = first.iter().chain(more).cloned().collect();
    write_lines(&fx.path("views.jsonl"), &all);
    assert_success(&fx.run());
    assert_eq!(sqlite_table(&fx.db()), reduce_expected(&all));
    fx.restore(&backup);
    assert_eq!(sqlite_table(&fx.db()), reduce_expected(first), "restored");
    backup
}

#[test]
fn a_store_restored_from_a_backup_is_caught_up_from_its_checkpoint() {
    let fx = Fixture::new();
    let (first, more) = (generate(3_000, 400, 11), generate(6_000, 600, 12));
    restored_behind_the_log(&fx, &first, &more);

    assert_success(&fx.run());
    let all: Vec<Value> = first.iter().chain(&more).cloned().collect();
    assert_eq!(
        sqlite_table(&fx.db()),
        reduce_expected(&all),
        "the documents after the backup's checkpoint were read again into the store"
    );
    // And the recovery log went on from there: another run changes nothing.
    assert_success(&fx.run());
    assert_eq!(sqlite_table(&fx.db()), reduce_expected(&all));
}

#[test]
fn a_restored_store_whose_input_is_gone_fails_naming_the_source_and_the_gap() {
    let fx = Fixture::new();
    let (first, more) = (generate(3_000, 400, 21), generate(1_000, 400, 22));
    restored_behind_the_log(&fx, &first, &more);
    // The input was rotated: what the backup's checkpoint points into is gone.
    write_lines(&fx.path("views.jsonl"), &first[..100]);

    let out = fx.run();
    assert!(!out.status.success(), "a run over a gap must fail");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("source views-file"), "{stderr}");
    assert!(
        stderr.contains(
            "the store's checkpoint (transaction 6) is older than the recovery \
                         log's (transaction 8)"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("cannot resume at"), "{stderr}");
    assert!(stderr.contains("views.jsonl now has"), "{stderr}");
    assert_eq!(
        stderr.matches("source views-file").count(),
        1,
        "named once: {stderr}"
    );
    let inspect = Command::new(SLUICE)
        .args(["inspect", "checkpoint"])
        .arg(fx.path("pipeline.yaml"))
        .output()
        .unwrap();
    let inspect = String::from_utf8_lossy(&inspect.stdout);
    assert!(
        inspect.contains("last commit: transaction 8"),
        "a failed seek leaves the log as it was: {inspect}"
    );
    assert_eq!(
        sqlite_table(&fx.db()),
        reduce_expected(&first),
        "the store is left as restored"
    );
}
