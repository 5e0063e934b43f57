//! End-to-end: a store that lost what the recovery log committed is refused, never
//! refilled from the middle of its input. A database recreated and applied again, a
//! table dropped, an endpoint pointed at an empty database: each time the log has
//! committed transactions the store no longer holds, so resuming from the log would
//! restart every reduction from nothing while the input before the log's position is
//! never read again. The run stops naming the store, the materialization and the log's
//! last transaction, writes nothing, and `sluice apply --delete` starts over exactly.
//!
//! The Redis driver keeps no checkpoint: there the log is the only record, and a log
//! gone while the keys remain is refused likewise (a fresh run would add the whole
//! input onto sums that hold it already).

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common;

use common::{
    POSTGRES_URL, REDIS_URL, SLUICE, Schema, assert_success, generate, pipeline_yaml,
    postgres_execute, postgres_table, redis, redis_keys, reduce_expected, sqlite_table,
    write_lines,
};

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new(endpoint: &str, delivery: &str) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let pipeline = pipeline_yaml(
            "    file: {path: views.jsonl, format: json}",
            endpoint,
            false,
            500,
            "10s",
        ) + delivery;
        std::fs::write(dir.path().join("pipeline.yaml"), pipeline).unwrap();
        Fixture { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn sluice(&self, args: &[&str]) -> Output {
        Command::new(SLUICE)
            .args(args)
            .arg(self.path("pipeline.yaml"))
            .env("RUST_LOG", "warn")
            .output()
            .unwrap()
    }

    fn run(&self) -> Output {
        self.sluice(&["run"])
    }

    fn db(&self) -> PathBuf {
        self.path("out/views.db")
    }

    fn input(&self, docs: &[Value]) {
        write_lines(&self.path("views.jsonl"), docs);
    }
}

/// The run failed, naming the store's loss, the materialization, the log's last
/// transaction and how to start over.
fn assert_refused(out: &Output, log_txn: u64, what: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{what}: the run must be refused");
    for needle in [
        "views-db",
        &format!("committed through transaction {log_txn}"),
        "sluice apply --delete",
    ] {
        assert!(stderr.contains(needle), "{what}: {needle:?} in {stderr}");
    }
}

fn remove_sqlite(db: &Path) {
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", db.display()));
    }
}

#[test]
fn a_recreated_and_reapplied_sqlite_database_is_refused_then_starts_over_on_delete() {
    let fx = Fixture::new("sqlite: {path: out/views.db}", "");
    let first = generate(2_000, 300, 31);
    fx.input(&first);
    assert_success(&fx.run());

    // The database is lost and made again, and the operator applies the pipeline to it.
    remove_sqlite(&fx.db());
    assert_success(&fx.sluice(&["apply"]));
    let all: Vec<Value> = first
        .iter()
        .chain(&generate(1_000, 300, 32))
        .cloned()
        .collect();
    fx.input(&all);
    assert_refused(&fx.run(), 4, "a recreated database");
    assert!(sqlite_table(&fx.db()).is_empty(), "nothing was written");

    assert_success(&fx.sluice(&["apply", "--delete"]));
    assert_success(&fx.run());
    assert_eq!(
        sqlite_table(&fx.db()),
        reduce_expected(&all),
        "started over"
    );
}

#[test]
fn a_dropped_table_is_refused_naming_the_logs_last_transaction() {
    let fx = Fixture::new("sqlite: {path: out/views.db}", "");
    let first = generate(1_500, 300, 33);
    fx.input(&first);
    assert_success(&fx.run());

    let conn = rusqlite::Connection::open(fx.db()).unwrap();
    conn.execute_batch("DROP TABLE pageviews").unwrap();
    drop(conn);
    let out = fx.run();
    assert_refused(&out, 3, "a dropped table");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("\"pageviews\" does not exist"),
        "names the table"
    );
}

#[test]
fn an_endpoint_pointed_at_an_empty_postgres_schema_is_refused() {
    let schema = Schema::new("recreated");
    let endpoint = format!(
        "postgres: {{url: \"{POSTGRES_URL}\", schema: {}}}",
        schema.0
    );
    let fx = Fixture::new(&endpoint, "");
    let first = generate(1_000, 200, 34);
    fx.input(&first);
    assert_success(&fx.run());
    assert_eq!(postgres_table(&schema.0), reduce_expected(&first));

    // The schema is recreated empty (a restore that missed it, a new database) and
    // the pipeline applied to it again.
    postgres_execute(
        POSTGRES_URL,
        &format!(
            r#"DROP SCHEMA "{0}" CASCADE; CREATE SCHEMA "{0}""#,
            schema.0
        ),
    );
    assert_success(&fx.sluice(&["apply"]));
    let all: Vec<Value> = first
        .iter()
        .chain(&generate(500, 200, 35))
        .cloned()
        .collect();
    fx.input(&all);
    assert_refused(&fx.run(), 2, "an empty schema");
    assert!(postgres_table(&schema.0).is_empty(), "nothing was written");

    assert_success(&fx.sluice(&["apply", "--delete"]));
    assert_success(&fx.run());
    assert_eq!(
        postgres_table(&schema.0),
        reduce_expected(&all),
        "started over"
    );
}

/// Deletes every key under its prefix when dropped, whatever the test's outcome.
struct Prefix(String);

impl Drop for Prefix {
    fn drop(&mut self) {
        let prefix = self.0.clone();
        redis(async |conn| {
            sluice_redis::client::delete_prefix(conn, &prefix)
                .await
                .unwrap()
        });
    }
}

#[test]
fn redis_keys_without_their_recovery_log_are_refused() {
    let guard = Prefix(format!("sluice-test:recreated:{}:", std::process::id()));
    let prefix = &guard.0;
    let endpoint = format!("redis: {{url: \"{REDIS_URL}\"}}");
    let pipeline = pipeline_yaml(
        "    file: {path: views.jsonl, format: json}",
        &endpoint,
        false,
        500,
        "10s",
    )
    .replace(
        "resource: {table: pageviews}",
        &format!("resource: {{prefix: \"{prefix}\"}}"),
    ) + "delivery: at_least_once\n";
    let fx = Fixture::new("", "");
    std::fs::write(fx.path("pipeline.yaml"), pipeline).unwrap();
    fx.input(&generate(800, 100, 36));
    assert_success(&fx.run());
    let keys = redis(async |c| redis_keys(c, prefix).await);
    assert_eq!(keys.len(), 100);

    // The recovery log is lost; the keys hold the whole input's sums already.
    std::fs::remove_dir_all(fx.path(".sluice")).unwrap();
    let out = fx.run();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a run without the log must be refused"
    );
    assert!(
        stderr.contains(prefix.as_str()),
        "names the prefix: {stderr}"
    );
    assert!(stderr.contains("sluice apply --delete"), "{stderr}");

    // Starting over removes the keys; the run then writes each once.
    assert_success(&fx.sluice(&["apply", "--delete"]));
    assert_success(&fx.run());
    let keys = redis(async |c| redis_keys(c, prefix).await);
    assert_eq!(keys.len(), 100);
}
