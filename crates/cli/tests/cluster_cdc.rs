//! A `postgres_cdc` source under `cluster:` (a private PostgreSQL with
//! `wal_level=logical`, a private etcd member): its materialization runs as one shard
//! whatever `cluster.shards` says, refuses a split, and moves to another member when its
//! holder is SIGKILLed; each new holder resumes from the position in the shard's etcd
//! log, the slot being on the server. While rows are written, the holder is killed
//! three times; the store's table then equals the source table, and the slot holds back
//! no WAL the holders committed (the last one confirmed it past every write).

use crate::common;

use common::cluster::items_cdc_pipeline;
use common::{SLUICE, postgres_at, postgres_execute};
use serde_json::Value;
use sluice_testkit::etcd::PrivateEtcd;
use sluice_testkit::postgres::LogicalPostgres;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Longer than anything here should take: reaching it fails the test.
const PATIENCE: Duration = Duration::from_secs(120);

fn rows(url: &str, table: &str) -> BTreeMap<i64, Option<i64>> {
    let query = format!("SELECT id, qty::bigint FROM {table}");
    postgres_at(url, async move |client| {
        let rows = client.query(&query, &[]).await.unwrap_or_default();
        rows.iter().map(|r| (r.get(0), r.get(1))).collect()
    })
}

/// A WAL position as a number (`pg_lsn - '0/0'` as text), 0 when absent.
fn lsn(url: &str, query: &str) -> u64 {
    let query = query.to_string();
    postgres_at(url, async move |client| {
        let rows = client.query(&query, &[]).await.unwrap();
        (rows.first())
            .and_then(|r| r.get::<_, Option<String>>(0))
            .map_or(0, |n| n.parse().unwrap())
    })
}

fn pipeline(url: &str, etcd: &str) -> String {
    items_cdc_pipeline(
        &format!("postgres_cdc: {{url: \"{url}\", tables: [public.items], chunk_rows: 500}}"),
        &format!("postgres: {{url: \"{url}\", schema: out}}"),
        500,
        etcd,
    )
}

fn start(dir: &Path, member: &str) -> Child {
    let log = std::fs::File::create(dir.join(format!("{member}.log"))).unwrap();
    Command::new(SLUICE)
        .current_dir(dir)
        .arg("run")
        .arg(dir.join("cluster.yaml"))
        .env("MEMBER", member)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

fn shards(dir: &Path, verb: &[&str]) -> std::process::Output {
    Command::new(SLUICE)
        .arg("shards")
        .arg(verb[0])
        .arg(dir.join("cluster.yaml"))
        .args(&verb[1..])
        .env("MEMBER", "cli")
        .output()
        .unwrap()
}

/// The shards as `sluice shards list --json` shows them.
fn list(dir: &Path) -> Vec<Value> {
    let out = shards(dir, &["list", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn logs(dir: &Path, members: &[(String, Child)]) -> String {
    (members.iter())
        .map(|(m, _)| {
            let log = std::fs::read_to_string(dir.join(format!("{m}.log"))).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            format!(
                "--- {m}\n{}\n",
                lines[lines.len().saturating_sub(30)..].join("\n")
            )
        })
        .collect()
}

/// The member running the one shard, once it runs on one of `members`.
fn holder(dir: &Path, members: &[(String, Child)]) -> String {
    let started = Instant::now();
    loop {
        let shards = list(dir);
        let running = (shards.iter())
            .find(|s| s["status"] == "running")
            .and_then(|s| s["member"].as_str())
            .filter(|m| members.iter().any(|(name, _)| name == m));
        if let Some(member) = running {
            return member.to_string();
        }
        assert!(
            started.elapsed() < PATIENCE,
            "the shard does not run: {shards:#?}\n{}",
            logs(dir, members)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_cdc_source_runs_as_one_shard_that_moves_when_its_holder_is_killed_and_the_table_is_exact() {
    let pg = LogicalPostgres::start();
    let url = pg.url();
    let etcd = PrivateEtcd::start();
    postgres_execute(
        &url,
        "CREATE SCHEMA out;
         CREATE TABLE items (id bigint PRIMARY KEY, qty int);
         INSERT INTO items SELECT g, g FROM generate_series(1, 2000) g;",
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cluster.yaml"), pipeline(&url, &etcd.url())).unwrap();
    let mut members: Vec<(String, Child)> = ["a", "b"]
        .iter()
        .map(|m| (m.to_string(), start(dir.path(), m)))
        .collect();
    holder(dir.path(), &members);
    let listed = list(dir.path());
    assert_eq!(
        listed.len(),
        1,
        "one shard, not cluster.shards: {listed:#?}"
    );
    let out = shards(dir.path(), &["split", "items-db", "00000000-ffffffff"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("replication slot"),
        "{err}"
    );
    // Rows written (inserts, updates, deletes) while the holder is killed.
    let writing = Arc::new(AtomicBool::new(true));
    let writer = {
        let (url, writing) = (url.clone(), writing.clone());
        std::thread::spawn(move || {
            let mut round = 0i64;
            while writing.load(Ordering::SeqCst) {
                round += 1;
                let first = 2000 + round * 50;
                postgres_execute(
                    &url,
                    &format!(
                        "INSERT INTO items SELECT g, g FROM generate_series({first}, {}) g;
                         UPDATE items SET qty = qty + 1 WHERE id % 17 = {};
                         DELETE FROM items WHERE id % 101 = {};",
                        first + 49,
                        round % 17,
                        round % 101
                    ),
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let mut joined = 0;
    for _ in 0..3 {
        std::thread::sleep(Duration::from_secs(2));
        let victim = holder(dir.path(), &members);
        let at = members.iter().position(|(m, _)| *m == victim).unwrap();
        let (_, mut child) = members.swap_remove(at);
        child.kill().unwrap();
        child.wait().unwrap();
        joined += 1;
        let name = format!("n{joined}");
        let child = start(dir.path(), &name);
        members.push((name, child));
        let next = holder(dir.path(), &members);
        eprintln!("killed {victim}, the holder; {next} holds the shard now");
    }
    writing.store(false, Ordering::SeqCst);
    writer.join().unwrap();
    // Every write so far is below `written`; the last row after it.
    let written = lsn(
        &url,
        "SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::text",
    );
    postgres_execute(&url, "INSERT INTO items VALUES (1000000, 1)");
    let expected = rows(&url, "public.items");
    let started = Instant::now();
    loop {
        let found = rows(&url, "out.items");
        if found == expected {
            break;
        }
        if started.elapsed() > PATIENCE {
            let lost = expected.keys().filter(|k| !found.contains_key(*k)).count();
            let extra = found.keys().filter(|k| !expected.contains_key(*k)).count();
            panic!(
                "not exact after {PATIENCE:?}: {lost} rows missing, {extra} not in the source\n{}",
                logs(dir.path(), &members)
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    // The slot keeps no WAL the holders have committed: the last holder confirmed it
    // past every write before the last row.
    let started = Instant::now();
    let confirmed = "SELECT (confirmed_flush_lsn - '0/0'::pg_lsn)::text FROM \
                     pg_replication_slots WHERE slot_name = 'sluice_items_db_items_cdc'";
    while lsn(&url, confirmed) < written {
        assert!(
            started.elapsed() < PATIENCE,
            "the slot was not confirmed past {written} (at {})\n{}",
            lsn(&url, confirmed),
            logs(dir.path(), &members)
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    for (_, mut child) in members {
        let _ = child.kill();
        let _ = child.wait();
    }
}
