//! An Iceberg table under `cluster:` (two members of a private etcd, a local warehouse
//! and SQLite catalog all members reach: they share this machine). The sink's contract
//! declares one writer at a time, so its materialization runs as one shard whatever
//! `cluster.shards` says, and a split is refused naming the endpoint. The holder is
//! SIGKILLed three times while the input grows; each time the other member takes the
//! shard over, and the victim comes back under its own name, with its own folder and the
//! upsert index it left there (a stale cache of an older snapshot). Every holder names
//! its staging by the cluster's deployment id (in etcd), so a new holder accepts the
//! table the last one committed and removes what that one staged and never decided.
//! The `mode: upsert` table then reads back (through pyiceberg) as one row per user
//! equal to the reduction of every document appended, and no data file is orphaned.
//!
//! Needs `python3` with `pyiceberg[sql-sqlite,pyarrow]` (`.ci/services` installs it).

use crate::common;

use common::cluster::Members;
use common::{
    Growing, PATIENCE, append_lines, block_on, generate, iceberg_upsert_view, pipeline_yaml,
    reduce_expected,
};
use sluice_testkit::etcd::PrivateEtcd;
use std::time::{Duration, Instant};

/// The pageviews pipeline into an upsert table, in transactions of 500 documents or
/// 200 ms, under `cluster:` asking for three shards (a 3 s lease).
fn pipeline(etcd: &str) -> String {
    let yaml = pipeline_yaml(
        "    file: {path: views.jsonl, format: json}",
        "iceberg: {catalog: out/catalog.db, warehouse: out/warehouse}",
        false,
        500,
        "200ms",
    )
    .replace(
        "resource: {table: pageviews}",
        "resource: {table: pageviews, mode: upsert}",
    );
    format!(
        "{yaml}cluster:\n  etcd: [\"{etcd}\"]\n  member: ${{MEMBER}}\n  lease_ttl: 3s\n  shards: 3\n"
    )
}

#[test]
fn an_iceberg_table_runs_as_one_shard_that_moves_between_members_and_stays_exact() {
    let etcd = PrivateEtcd::start();
    let dir = tempfile::tempdir().unwrap();
    let pipeline_path = dir.path().join("cluster.yaml");
    std::fs::write(&pipeline_path, pipeline(&etcd.url())).unwrap();
    let input = dir.path().join("views.jsonl");
    let docs = generate(120_000, 400, 31);
    append_lines(&input, &docs[..2_000]);

    let mut members = Members::new(dir.path(), &pipeline_path);
    for m in ["a", "b"] {
        members.start(m, &[]);
    }
    let mut stints = vec![members.holder()];
    let listed = members.list();
    assert_eq!(
        listed.len(),
        1,
        "one shard, not cluster.shards: {listed:#?}"
    );
    let out = members.shards("split", &["views-db", "00000000-ffffffff"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("its endpoint (a iceberg driver)")
            && err.contains("one writer at a time"),
        "{err}"
    );

    // The input grows, 200 documents every 100 ms, while holders are killed.
    let growing = Growing::start(&input, &docs, 2_000);
    for _ in 0..3 {
        std::thread::sleep(Duration::from_secs(2));
        members.kill_holder_and_rejoin(&mut stints);
    }
    let appended = growing.stop(&docs);
    let holders: Vec<&String> = stints.iter().collect();
    assert!(
        (holders.iter().enumerate()).any(|(i, m)| holders[..i.saturating_sub(1)].contains(m)),
        "a member took the shard back after another held it: {holders:?}"
    );

    let expected = reduce_expected(&docs[..appended]);
    let started = Instant::now();
    loop {
        let found = iceberg_upsert_view(dir.path());
        if found.as_ref() == Ok(&expected) {
            break;
        }
        if started.elapsed() > PATIENCE {
            let found = found.unwrap_or_default();
            let lost = expected.keys().filter(|k| !found.contains_key(*k)).count();
            let wrong = (found.iter())
                .filter(|(k, row)| expected.get(*k) != Some(row))
                .count();
            panic!(
                "not exact after {PATIENCE:?}: {lost} users missing, {wrong} rows not their \
                 reduction\n{}",
                members.logs()
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    // Each member finishes its transaction and leaves; nothing staged is left over.
    for (_, child) in &members.running {
        common::signal(child, "TERM");
    }
    for (_, child) in &mut members.running {
        child.wait().unwrap();
    }
    let orphans = block_on(async {
        let catalog = sluice_iceberg::open_catalog(
            &dir.path().join("out/catalog.db"),
            &dir.path().join("out/warehouse"),
        )
        .await
        .unwrap();
        sluice_iceberg::orphan_data_files(&catalog).await.unwrap()
    });
    assert_eq!(orphans, Vec::<String>::new());
    assert_eq!(
        iceberg_upsert_view(dir.path()),
        Ok(expected),
        "a clean leave changes nothing"
    );
}
