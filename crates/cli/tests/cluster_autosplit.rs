//! `cluster.autosplit`: two members of a private etcd run two first shards of one
//! pipeline (datagen pageviews into PostgreSQL) over a backlog that both shards take
//! tens of seconds to commit: transactions are small and slow (1,000 documents, at
//! least 200 ms), and datagen counts what it generated but a shard has not committed as
//! lag. Both shards' lag stays above the threshold past `for`, so both holders want to
//! split; the marks are serialized and counted, so exactly one shard splits into its
//! halves (`max_shards: 3`), nothing more splits, and the table ends equal to the
//! model.

use crate::common;

use common::cluster::Members;
use common::{PATIENCE, POSTGRES_URL, Row, Schema, pipeline_yaml, postgres_table};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const DOCS: u64 = 200_000;
const KEYS: u64 = 50_000;

#[test]
fn shards_that_stay_behind_split_themselves_within_max_shards_and_the_store_is_exact() {
    let etcd = sluice_testkit::etcd::PrivateEtcd::start();
    let schema = Schema::new("cluster_autosplit");
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!(
        "postgres: {{url: \"{POSTGRES_URL}\", schema: {}}}",
        schema.0
    );
    let source =
        format!("    datagen: {{seed: 7, documents: {DOCS}, keys: {KEYS}, shape: pageviews}}");
    let yaml = pipeline_yaml(&source, &endpoint, false, 1000, "200ms");
    let yaml = format!(
        "{yaml}cluster:\n  etcd: [\"{}\"]\n  member: ${{MEMBER}}\n  lease_ttl: 3s\n  shards: 2\n  \
         autosplit: {{lag_above: 1000, for: 2s, max_shards: 3}}\n",
        etcd.url()
    );
    let pipeline = dir.path().join("autosplit.yaml");
    std::fs::write(&pipeline, yaml).unwrap();
    let mut members = Members::new(dir.path(), &pipeline);
    members.start("a", &[]);
    members.start("b", &[]);

    let mut expected: BTreeMap<String, Row> = BTreeMap::new();
    for seq in 0..DOCS {
        let doc = sluice_datagen::pageview::pageview(7, KEYS, seq);
        (expected.entry(doc.user_id()).or_default()).add(
            doc.views as i64,
            doc.bytes as i64,
            &doc.last_seen(),
        );
    }
    let started = Instant::now();
    let mut most = 0;
    let shards = loop {
        let shards = members.list();
        most = most.max(shards.len());
        assert!(most <= 3, "more shards than max_shards: {shards:#?}");
        let settled = shards.len() == 3 && shards.iter().all(|s| s["status"] == "running");
        if settled && postgres_table(&schema.0) == expected {
            break shards;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "no exact end on three running shards: {shards:#?}\n{}",
            members.logs()
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    let mut ids: Vec<&str> = shards
        .iter()
        .map(|s| s["shard"].as_str().unwrap())
        .collect();
    ids.sort();
    let low_split = [
        "00000000-3fffffff",
        "40000000-7fffffff",
        "80000000-ffffffff",
    ];
    let high_split = [
        "00000000-7fffffff",
        "80000000-bfffffff",
        "c0000000-ffffffff",
    ];
    assert!(
        ids == low_split || ids == high_split,
        "one first shard split in halves: {ids:?}"
    );
    // Nothing more splits once the backlog is committed.
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(members.list().len(), 3);
    assert_eq!(postgres_table(&schema.0), expected);
}
