//! A CDC snapshot under `cluster:` with the default `chunk_rows` (10,000) and
//! `max_docs`: its rows travel in the transactions' intents, which a cluster keeps in
//! etcd records of at most 1 MiB, and one chunk (about 1.7 MB of two-integer rows) is
//! far above that. A snapshot step ends before its rows pass the room its transaction's
//! intent has left, so the snapshot of 30,000 rows completes and the store's table
//! equals the source table, for `postgres_cdc` (a private PostgreSQL with
//! `wal_level=logical`) and `mysql_cdc` (a private MariaDB with the binary log on).
//! Where a step does not fit, every holder fails "a record of N bytes is above the
//! 1048576 bytes": the tests fail as soon as a member's log says so.

use crate::common;

use common::cluster::{Members, items_cdc_pipeline, store_items};
use common::{PATIENCE, POSTGRES_URL, Schema, mysql_at, postgres_execute, wait_until};
use mysql_async::prelude::Queryable;
use sluice_testkit::etcd::PrivateEtcd;
use sluice_testkit::mariadb::BinlogMariadb;
use sluice_testkit::postgres::LogicalPostgres;
use std::collections::BTreeMap;

/// Rows of the table when the pipeline starts: three default chunks, about 5 MB of
/// journaled documents.
const ROWS: i64 = 30_000;
/// `runtime.transactions.max_docs` by default: no bound a test would set below it.
const DEFAULT_MAX_DOCS: u64 = 1_000_000;

/// Runs the pipeline of `source` (its kind and settings, no `chunk_rows`) on one member
/// until the store's table in `schema` holds rows 1 to [`ROWS`], each `qty` its `id`.
fn snapshot_completes_and_is_exact(source: &str, schema: &Schema) {
    let etcd = PrivateEtcd::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cluster.yaml");
    let endpoint = format!(
        "postgres: {{url: \"{POSTGRES_URL}\", schema: {}}}",
        schema.0
    );
    let pipeline = items_cdc_pipeline(source, &endpoint, DEFAULT_MAX_DOCS, &etcd.url());
    std::fs::write(&file, pipeline).unwrap();
    let mut members = Members::new(dir.path(), &file);
    members.start("a", &[]);
    let expected: BTreeMap<i64, Option<i64>> = (1..=ROWS).map(|id| (id, Some(id))).collect();
    wait_until("the snapshot in the store", PATIENCE, || {
        let logs = members.logs();
        assert!(
            !logs.contains("this log takes in one write"),
            "a transaction's intent did not fit an etcd record:\n{logs}"
        );
        (store_items(&schema.0) == expected).then_some(())
    });
}

#[test]
fn a_postgres_cdc_snapshot_of_default_chunks_fits_etcd_records_and_is_exact() {
    let pg = LogicalPostgres::start();
    postgres_execute(
        &pg.url(),
        &format!(
            "CREATE TABLE items (id bigint PRIMARY KEY, qty int);
             INSERT INTO items SELECT g, g FROM generate_series(1, {ROWS}) g;"
        ),
    );
    let source = format!(
        "postgres_cdc: {{url: \"{}\", tables: [public.items]}}",
        pg.url()
    );
    snapshot_completes_and_is_exact(&source, &Schema::new("cluster_cdc_snapshot_pg"));
}

#[test]
fn a_mysql_cdc_snapshot_of_default_chunks_fits_etcd_records_and_is_exact() {
    let server = BinlogMariadb::start();
    mysql_at(&server.url(), async |conn| {
        conn.query_drop(format!(
            "CREATE DATABASE shop;
             CREATE TABLE shop.items (id BIGINT PRIMARY KEY, qty INT);
             USE shop;
             INSERT INTO items SELECT seq, seq FROM seq_1_to_{ROWS};"
        ))
        .await
        .unwrap()
    });
    let source = format!(
        "mysql_cdc: {{url: \"{}/shop\", tables: [shop.items]}}",
        server.url()
    );
    snapshot_completes_and_is_exact(&source, &Schema::new("cluster_cdc_snapshot_my"));
}
