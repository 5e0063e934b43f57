//! What the source's tests share: a private server with the `shop.items` table and a
//! connection to it, statements run on it, the source's configuration, stepping until
//! a condition holds (and all that was read), and folding change documents by key.

#![allow(dead_code)] // Each test binary uses its own subset of the fixtures.

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts};
use serde_json::{Value, json};
use sluice_mysql_cdc::{MysqlCdcConfig, MysqlCdcSource};
use sluice_source_sdk::testing::{parsed_docs, records};
use sluice_source_sdk::{Records, Resume, Source, Step};
use sluice_testkit::mariadb::BinlogMariadb;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub async fn sql(server: &BinlogMariadb) -> Conn {
    Conn::new(Opts::from_url(&server.url()).unwrap())
        .await
        .unwrap()
}

/// A private server holding `shop.items` with `n` rows, a connection to it, and the
/// source's configuration for the table.
pub async fn shop(n: i64) -> (BinlogMariadb, Conn, MysqlCdcConfig) {
    shop_on(BinlogMariadb::start(), n).await
}

/// [`shop`] on `server`.
pub async fn shop_on(server: BinlogMariadb, n: i64) -> (BinlogMariadb, Conn, MysqlCdcConfig) {
    let mut conn = sql(&server).await;
    items(&mut conn, n).await;
    let config = config(&server, &["shop.items"]);
    (server, conn, config)
}

/// Runs `statements` (`;`-separated), panicking naming them.
pub async fn run(conn: &mut Conn, statements: &str) {
    conn.query_drop(statements)
        .await
        .unwrap_or_else(|e| panic!("{statements}: {e}"));
}

pub fn config(server: &BinlogMariadb, tables: &[&str]) -> MysqlCdcConfig {
    let config: MysqlCdcConfig = sluice_source_sdk::config::parse(
        json!({"url": server.url(), "tables": tables, "chunk_rows": 3}),
    )
    .unwrap();
    config.check().unwrap();
    config
}

pub fn source(config: &MysqlCdcConfig) -> MysqlCdcSource {
    MysqlCdcSource::new("cdc", "test", config).unwrap()
}

pub async fn step(source: &mut MysqlCdcSource, max: usize) -> (Vec<Value>, Step) {
    let mut out = Records::default();
    let step = source.queue(records(max), &mut out).await.unwrap();
    assert_eq!(step.records, out.len());
    (parsed_docs(&mut out), step)
}

/// Steps until `done` holds of what was read, or the clock runs out.
pub async fn until(
    source: &mut MysqlCdcSource,
    max: usize,
    docs: &mut Vec<Value>,
    steps: &mut Vec<Step>,
    done: impl Fn(&[Value], &Step) -> bool,
) {
    let started = Instant::now();
    loop {
        let (got, s) = step(source, max).await;
        docs.extend(got);
        let finished = done(docs, &s);
        steps.push(s);
        if finished {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no end after {} docs: {docs:?}",
            docs.len()
        );
        if steps.last().unwrap().records == 0 {
            tokio::time::timeout(Duration::from_millis(200), source.ready())
                .await
                .ok();
        }
    }
}

pub fn caught_up(_: &[Value], s: &Step) -> bool {
    s.end_of_input
}

/// The documents and steps a source reads until it has caught up with the log, in
/// steps of 10 at most.
pub async fn catch_up(source: &mut MysqlCdcSource) -> (Vec<Value>, Vec<Step>) {
    let (mut docs, mut steps) = (Vec::new(), Vec::new());
    until(source, 10, &mut docs, &mut steps, caught_up).await;
    (docs, steps)
}

/// Folds change documents by `id`: a delete forgets the key.
pub fn fold(docs: &[Value]) -> BTreeMap<i64, Value> {
    fold_by(docs, |doc| doc["id"].as_i64().unwrap())
}

/// Folds change documents by the key `key_of` reads from each: a delete forgets it.
pub fn fold_by<K: Ord>(docs: &[Value], key_of: impl Fn(&Value) -> K) -> BTreeMap<K, Value> {
    let mut table = BTreeMap::new();
    for doc in docs {
        let key = key_of(doc);
        if doc["_meta"]["op"] == "d" {
            table.remove(&key);
        } else {
            let mut row = doc.clone();
            row.as_object_mut().unwrap().remove("_meta");
            table.insert(key, row);
        }
    }
    table
}

pub async fn table_rows(conn: &mut Conn) -> BTreeMap<i64, Value> {
    let rows: Vec<(i64, Option<String>, Option<i32>)> = conn
        .query("SELECT id, name, qty FROM shop.items ORDER BY id")
        .await
        .unwrap();
    rows.into_iter()
        .map(|(id, name, qty)| (id, json!({"id": id, "name": name, "qty": qty})))
        .collect()
}

pub async fn items(conn: &mut Conn, n: i64) {
    conn.query_drop(
        "CREATE DATABASE shop; \
         CREATE TABLE shop.items (id BIGINT PRIMARY KEY, name TEXT, qty INT) ENGINE=InnoDB",
    )
    .await
    .unwrap();
    for i in 1..=n {
        conn.query_drop(format!(
            "INSERT INTO shop.items VALUES ({i}, 'item {i}', {})",
            i * 10
        ))
        .await
        .unwrap();
    }
}

pub fn position(step: &Step) -> Value {
    match &step.resume {
        Resume::Replay { position, .. } => position.clone(),
        other => panic!("not a replay step: {other:?}"),
    }
}

/// Purges every binary log but the newest (a dump thread of a source disconnected a
/// moment ago may still hold the older ones: tried again until they are gone), and
/// returns the newest's name.
pub async fn purge_to_newest(conn: &mut Conn) -> String {
    let status: mysql_async::Row = conn
        .query_first("SHOW MASTER STATUS")
        .await
        .unwrap()
        .unwrap();
    let newest: String = status.get(0).unwrap();
    let started = Instant::now();
    loop {
        conn.query_drop(format!("PURGE BINARY LOGS TO '{newest}'"))
            .await
            .unwrap();
        let oldest: Option<mysql_async::Row> = conn.query_first("SHOW BINARY LOGS").await.unwrap();
        if oldest.and_then(|r| r.get::<String, _>(0)).as_deref() == Some(newest.as_str()) {
            return newest;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "logs not purged"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
