//! An operator deletes a cluster's etcd keys (`etcdctl del --prefix <prefix>`) under an
//! Iceberg materialization whose table keeps what the earlier runs committed. The
//! shard's recovery log and the cluster's deployment id lived there, so the next run
//! would read its input again from the beginning: appended to the table as if new, every
//! document would count twice. Both table modes are refused instead, on every member
//! that tries the shard, naming the cause and the ways out, and the table is left
//! exactly as it was (the same snapshots, the same rows).
//!
//! Two members of a private etcd, a local warehouse and SQLite catalog (they share this
//! machine). Needs `python3` with `pyiceberg[sql-sqlite,pyarrow]` (`.ci/services`
//! installs it).

use crate::common;

use common::cluster::Members;
use common::{PATIENCE, block_on, generate, pipeline_yaml, reduce_expected, write_lines};
use serde_json::Value;
use sluice_cluster::etcd::{Etcd, Op};
use sluice_testkit::etcd::PrivateEtcd;
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

const PREFIX: &str = "/sluice/wiped";

/// The pageviews pipeline into Iceberg table `pageviews` (`mode`: `upsert`, or
/// `changelog` with delta updates), under `cluster:` with its etcd keys under [`PREFIX`].
fn pipeline(etcd: &str, mode: &str) -> String {
    let yaml = pipeline_yaml(
        "    file: {path: views.jsonl, format: json}",
        "iceberg: {catalog: out/catalog.db, warehouse: out/warehouse}",
        mode == "changelog",
        500,
        "200ms",
    )
    .replace(
        "resource: {table: pageviews}",
        &format!("resource: {{table: pageviews, mode: {mode}}}"),
    );
    format!(
        "{yaml}cluster:\n  etcd: [\"{etcd}\"]\n  member: ${{MEMBER}}\n  prefix: {PREFIX}\n  \
         lease_ttl: 3s\n"
    )
}

/// The table as pyiceberg reads it: every snapshot's summary, and the rows.
fn table(dir: &Path) -> Result<(Vec<Value>, Vec<Value>), String> {
    let read = |snapshots| {
        sluice_iceberg::pyiceberg_read(
            &dir.join("out/catalog.db"),
            &dir.join("out/warehouse"),
            "sluice.pageviews",
            snapshots,
        )
    };
    Ok((read(true)?, read(false)?))
}

/// Each user's views summed over the table's rows: in either mode, the views the table
/// counts (a change log's rows are each transaction's changes).
fn views(rows: &[Value]) -> BTreeMap<String, i64> {
    let mut views = BTreeMap::new();
    for row in rows {
        let user = row["user_id"].as_str().unwrap().to_string();
        *views.entry(user).or_default() += row["views"].as_i64().unwrap();
    }
    views
}

/// Members `a` and `b` run the pipeline of table mode `mode` until the table counts
/// every document, and leave; the cluster's etcd keys are deleted; the members start
/// again: both refuse the shard with `refusal`, and the table is as they left it.
fn wiped_prefix_is_refused(mode: &str, refusal: &str) {
    let etcd = PrivateEtcd::start();
    let dir = tempfile::tempdir().unwrap();
    let pipeline_path = dir.path().join("cluster.yaml");
    std::fs::write(&pipeline_path, pipeline(&etcd.url(), mode)).unwrap();
    let docs = generate(3_000, 300, 41);
    write_lines(&dir.path().join("views.jsonl"), &docs);
    let expected: BTreeMap<String, i64> = (reduce_expected(&docs).into_iter())
        .map(|(user, row)| (user, row.views))
        .collect();

    let mut members = Members::new(dir.path(), &pipeline_path);
    for m in ["a", "b"] {
        members.start(m, &[]);
    }
    let started = Instant::now();
    while table(dir.path()).map(|(_, rows)| views(&rows)).as_ref() != Ok(&expected) {
        assert!(
            started.elapsed() < PATIENCE,
            "the table does not count every document: {:?}\n{}",
            table(dir.path()).map(|(_, rows)| rows.len()),
            members.logs()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    for (_, child) in &members.running {
        common::signal(child, "TERM");
    }
    for (_, child) in &mut members.running {
        child.wait().unwrap();
    }
    members.running.clear();
    let before = table(dir.path()).unwrap();

    // `etcdctl del --prefix /sluice/wiped/`.
    block_on(async {
        let client = Etcd::connect(&[etcd.url()], Duration::from_secs(5), None).unwrap();
        let wipe = Op::DeletePrefix(format!("{PREFIX}/"));
        client.txn(vec![], vec![wipe], vec![]).await.unwrap();
        let (left, _) = client.get_prefix(&format!("{PREFIX}/")).await.unwrap();
        assert!(left.is_empty(), "{left:?}");
    });

    for m in ["a", "b"] {
        members.start(m, &[]);
    }
    let log = |m: &str| std::fs::read_to_string(dir.path().join(format!("{m}.log"))).unwrap();
    let started = Instant::now();
    while !["a", "b"].iter().all(|m| log(m).contains(refusal)) {
        assert!(
            started.elapsed() < PATIENCE,
            "not both members refused the shard with {refusal:?}\n{}",
            members.logs()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let after = table(dir.path()).unwrap();
    assert_eq!(after.0, before.0, "a snapshot was committed after the wipe");
    assert_eq!(views(&after.1), expected, "the table counts other views");
    for m in ["a", "b"] {
        let log = log(m);
        assert!(
            log.contains("Drop the table") && log.contains("restore the recovery log"),
            "the refusal names no way out:\n{log}"
        );
    }
}

#[test]
fn a_wiped_etcd_prefix_under_an_upsert_table_is_refused_and_the_table_kept() {
    wiped_prefix_is_refused("upsert", "(mode: upsert) holds the view of another run");
}

#[test]
fn a_wiped_etcd_prefix_under_a_change_log_table_is_refused_and_the_table_kept() {
    wiped_prefix_is_refused("changelog", "holds the change log of another run");
}
