//! The cluster torture (`sluice torture --scenario cluster`: three members on a private
//! etcd member, killed, stopped past their lease, etcd restarted) with each singleton
//! source: `postgres_cdc` and `mysql_cdc` (a private server's table, snapshotted, then
//! written while the members run) and `http` (clients posting to every member in turn
//! and following each 503 to the holder). Each runs as one shard: in the split's turn
//! the split must be refused naming the source, and the holder is SIGKILLed. Every fault
//! kind must fire twice and the store must end equal to the torture's model (nothing
//! lost, doubled or mismatched, no anomaly).
//!
//! Needs the `sluice` and `sluice-torture` binaries built side by side (`cargo build
//! --workspace --all-features --bins`); the store is a schema of the shared PostgreSQL.

use crate::common;

use common::torture::{assert_exact_after, assert_fired, stdout, torture};
use std::process::Output;

/// Two faults of each kind (the kinds take turns).
const FAULTS: u64 = 8;

/// Runs the cluster torture reading `source`, and checks it as the module says.
fn singleton_torture_is_exact(source: &str) -> Output {
    let faults = FAULTS.to_string();
    let out = torture(&[
        "--store",
        "postgres",
        "--source",
        source,
        "--scenario",
        "cluster",
        "--faults",
        &faults,
    ]);
    assert_exact_after(&out, FAULTS);
    let kinds = [
        "cluster: member SIGKILLed",
        "cluster: zombie past its lease",
        "cluster: split refused (one shard)",
        "cluster: holder SIGKILLed",
        "cluster: etcd restarted",
    ];
    assert_fired(&out, &kinds, 2);
    out
}

#[test]
fn postgres_cdc_cluster_members_killed_stopped_and_etcd_restarted_end_exact() {
    singleton_torture_is_exact("postgres_cdc");
}

#[test]
fn mysql_cdc_cluster_members_killed_stopped_and_etcd_restarted_end_exact() {
    singleton_torture_is_exact("mysql_cdc");
}

#[test]
fn http_cluster_clients_following_the_holder_store_every_body_once() {
    let out = singleton_torture_is_exact("http");
    let report = stdout(&out);
    // "N bodies acknowledged, M retries sent to the holder a 503 named"
    let redirected = (report.lines())
        .find_map(|line| line.split_once(" bodies acknowledged, "))
        .and_then(|(_, rest)| rest.split_whitespace().next()?.parse::<u64>().ok());
    assert!(
        redirected.is_some_and(|n| n > 0),
        "no client followed a 503 to the holder:\n{report}"
    );
}
