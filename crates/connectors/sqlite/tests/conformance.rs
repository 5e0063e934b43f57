//! The driver SDK's conformance suite against a real SQLite file, through the in-process
//! endpoint, claiming every capability: every scenario must pass (none fails, none is
//! skipped), including those that moved here from `testing::scenarios` (checkpoint
//! recovery, split ranges, fencing, atomic commits). Then the same through Flow's
//! current protocol: the driver served as `materialize.Connector` on a loopback gRPC
//! port, driven by the runtime's current-protocol endpoint (over stdio, the `sluice`
//! binary's `driver stdio sqlite` runs it: `crates/cli/tests/external_current.rs`).

use serde_json::json;
use sluice_conformance::{Capabilities, assert_all_pass, run_suite};
use sluice_driver_sdk::inprocess::InProcess;
use sluice_sqlite::SqliteDriver;
use sluice_testkit::conformance::current::{
    assert_all_pass_but_dry_run, run_suite_over_current_grpc,
};
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread")]
async fn the_conformance_suite_passes() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = InProcess::new("sqlite", Arc::new(SqliteDriver::new()));
    let config = json!({ "path": dir.path().join("conformance.db") });
    let results = run_suite(
        &endpoint,
        Capabilities::ALL,
        config,
        json!({ "table": "conf" }),
    )
    .await;
    assert_all_pass(&results);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_conformance_suite_passes_over_the_current_protocol() {
    let dir = tempfile::tempdir().unwrap();
    let config = json!({ "path": dir.path().join("conformance.db") });
    let results = run_suite_over_current_grpc(
        Arc::new(SqliteDriver::new()),
        Capabilities::ALL,
        config,
        json!({ "table": "conf" }),
    )
    .await;
    assert_all_pass_but_dry_run(&results);
}
