//! The driver conformance suite against the real server, through the in-process
//! endpoint, claiming every capability: every scenario must pass (none fails, none is
//! skipped), including those that moved here from `testing::scenarios` (checkpoint
//! recovery, split ranges, fencing, atomic commits). Then the same through Flow's
//! current protocol: the driver served as `materialize.Connector` on a loopback gRPC
//! port, driven by the runtime's current-protocol endpoint.

mod common;

use common::TestDb;
use serde_json::json;
use sluice_conformance::{Capabilities, assert_all_pass, run_suite};
use sluice_driver_sdk::inprocess::InProcess;
use sluice_postgres::PostgresDriver;
use sluice_testkit::conformance::current::{
    assert_all_pass_but_dry_run, run_suite_over_current_grpc,
};
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread")]
async fn the_conformance_suite_passes_against_the_real_server() {
    let db = TestDb::new();
    let endpoint = InProcess::new("postgres", Arc::new(PostgresDriver::new()));
    let results = run_suite(
        &endpoint,
        Capabilities::ALL,
        db.endpoint(),
        json!({ "table": "conf" }),
    )
    .await;
    assert_all_pass(&results);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_conformance_suite_passes_over_the_current_protocol() {
    let db = TestDb::new();
    let results = run_suite_over_current_grpc(
        Arc::new(PostgresDriver::new()),
        Capabilities::ALL,
        db.endpoint(),
        json!({ "table": "conf" }),
    )
    .await;
    assert_all_pass_but_dry_run(&results);
}
