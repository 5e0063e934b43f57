//! A `mysql_cdc` source under `cluster:` (a private MariaDB with the binary log, a
//! private etcd member, the store a schema of the shared PostgreSQL): its
//! materialization runs as one shard whatever `cluster.shards` says, refuses a split,
//! and moves to another member when its holder is SIGKILLed; each new holder resumes
//! from the positions in the shard's etcd log (a snapshot's chunks and segments, then
//! binlog positions and GTID states), registering as the same replica. The first kill
//! lands mid-snapshot; while rows are inserted, updated and deleted, the holder is
//! killed three times, then stopped past its lease (its replica connection ended by
//! the server when the new holder registers; resumed, it exits fenced), and the
//! store's table then equals the source table.

use crate::common;

use common::cluster::{Members, items_cdc_pipeline, store_items};
use common::{PATIENCE, POSTGRES_URL, Schema, mysql_at, signal, wait_until};
use mysql_async::prelude::Queryable;
use sluice_testkit::etcd::PrivateEtcd;
use sluice_testkit::mariadb::BinlogMariadb;
use std::collections::BTreeMap;
use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Rows in the table before the first start: a snapshot of 100 transactions of 200
/// documents (some seconds here), still running when its first chunk is committed.
const SNAPSHOT_ROWS: i64 = 20_000;

type Table = BTreeMap<i64, Option<i64>>;

fn source_rows(url: &str) -> Table {
    mysql_at(url, async |conn| {
        let rows: Vec<(i64, Option<i64>)> = conn.query("SELECT id, qty FROM items").await.unwrap();
        rows.into_iter().collect()
    })
}

/// The server's threads streaming the binary log to a replica.
fn binlog_dumps(server: &str) -> Vec<u64> {
    mysql_at(server, async |conn| {
        conn.query("SELECT id FROM information_schema.processlist WHERE command = 'Binlog Dump'")
            .await
            .unwrap()
    })
}

fn child<'m>(members: &'m mut Members, name: &str) -> &'m mut Child {
    let at = (members.running.iter()).position(|(member, _)| member == name);
    &mut members.running[at.expect("a running member")].1
}

fn pipeline(mysql: &str, schema: &str, etcd: &str) -> String {
    items_cdc_pipeline(
        &format!("mysql_cdc: {{url: \"{mysql}\", tables: [shop.items], chunk_rows: 200}}"),
        &format!("postgres: {{url: \"{POSTGRES_URL}\", schema: {schema}}}"),
        200,
        etcd,
    )
}

#[test]
fn a_mysql_cdc_source_runs_as_one_shard_that_moves_mid_snapshot_and_mid_stream_and_the_table_is_exact()
 {
    let server = BinlogMariadb::start();
    let url = format!("{}/shop", server.url());
    mysql_at(&server.url(), async |conn| {
        conn.query_drop(format!(
            "CREATE DATABASE shop;
             CREATE TABLE shop.items (id BIGINT PRIMARY KEY, qty INT);
             USE shop;
             INSERT INTO items SELECT seq, seq FROM seq_1_to_{SNAPSHOT_ROWS};"
        ))
        .await
        .unwrap()
    });
    let schema = Schema::new("cluster_mysql_cdc");
    let etcd = PrivateEtcd::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cluster.yaml");
    std::fs::write(&file, pipeline(&url, &schema.0, &etcd.url())).unwrap();
    let mut members = Members::new(dir.path(), &file);
    for member in ["a", "b"] {
        members.start(member, &[]);
    }
    members.holder();
    let listed = members.list();
    assert_eq!(
        listed.len(),
        1,
        "one shard, not cluster.shards: {listed:#?}"
    );
    let out = members.shards("split", &["items-db", "00000000-ffffffff"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("one replica"),
        "{err}"
    );
    // Rows written (inserts, updates, deletes; some of the updates and deletes in the
    // snapshot's range) while the holder is killed.
    let writing = Arc::new(AtomicBool::new(true));
    let writer = {
        let (url, writing) = (url.clone(), writing.clone());
        std::thread::spawn(move || {
            let mut round = 0i64;
            while writing.load(Ordering::SeqCst) {
                round += 1;
                let first = SNAPSHOT_ROWS + round * 50;
                mysql_at(&url, async |conn| {
                    conn.query_drop(format!(
                        "START TRANSACTION;
                         INSERT INTO items SELECT seq, seq FROM seq_{first}_to_{};
                         UPDATE items SET qty = qty + 1 WHERE id % 17 = {};
                         DELETE FROM items WHERE id % 101 = {};
                         COMMIT;",
                        first + 49,
                        round % 17,
                        round % 101
                    ))
                    .await
                    .unwrap()
                });
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    // The first kill once the snapshot has committed a chunk, before it ends.
    let started = Instant::now();
    while store_items(&schema.0).is_empty() {
        assert!(
            started.elapsed() < PATIENCE,
            "the snapshot commits nothing\n{}",
            members.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    for joined in 1..=3 {
        let victim = members.holder();
        let committed = store_items(&schema.0);
        members.kill(&victim);
        // The snapshot reads in key order and streams nothing before it ends.
        let last = committed.keys().last().copied().unwrap_or(0);
        if joined == 1 {
            assert!(
                last < SNAPSHOT_ROWS,
                "the snapshot ended before the first kill (keys up to {last})"
            );
        }
        let name = format!("n{joined}");
        members.start(&name, &[]);
        let next = members.holder();
        eprintln!("killed {victim}, the holder, at keys up to {last}; {next} holds the shard now");
        std::thread::sleep(Duration::from_secs(2));
    }
    // A holder stopped past its lease keeps its connection: the new holder's
    // registration (the same server_id) ends its stream on the server, so the server
    // streams to one replica, the new holder; resumed, the zombie is fenced and exits.
    let zombie = members.holder();
    let streaming = wait_until("one binlog dump", PATIENCE, || {
        let dumps = binlog_dumps(&server.url());
        (dumps.len() == 1).then(|| dumps[0])
    });
    signal(child(&mut members, &zombie), "STOP");
    let next = wait_until("another holder", PATIENCE, || {
        Some(members.holder()).filter(|holder| *holder != zombie)
    });
    wait_until("the new holder's binlog dump alone", PATIENCE, || {
        let dumps = binlog_dumps(&server.url());
        (dumps.len() == 1 && dumps[0] != streaming).then_some(())
    });
    signal(child(&mut members, &zombie), "CONT");
    let status = wait_until("the zombie's exit", PATIENCE, || {
        child(&mut members, &zombie).try_wait().unwrap()
    });
    let log = std::fs::read_to_string(dir.path().join(format!("{zombie}.log"))).unwrap();
    assert!(
        !status.success() && log.contains("fenced"),
        "the zombie {zombie} did not exit fenced ({status}):\n{log}"
    );
    eprintln!("stopped {zombie}, the holder, past its lease; {next} holds the shard now");
    writing.store(false, Ordering::SeqCst);
    writer.join().unwrap();
    let expected = source_rows(&url);
    let started = Instant::now();
    loop {
        let found = store_items(&schema.0);
        if found == expected {
            break;
        }
        if started.elapsed() > PATIENCE {
            let lost = expected.keys().filter(|k| !found.contains_key(*k)).count();
            let extra = found.keys().filter(|k| !expected.contains_key(*k)).count();
            let differ = (expected.iter())
                .filter(|(k, v)| found.get(*k).is_some_and(|f| f != *v))
                .count();
            panic!(
                "not exact after {PATIENCE:?}: {lost} rows missing, {extra} not in the source, \
                 {differ} with another qty\n{}",
                members.logs()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}
