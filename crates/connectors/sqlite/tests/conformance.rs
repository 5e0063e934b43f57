//! The driver SDK's conformance suite against a real SQLite file, through the in-process
//! endpoint, claiming every capability: every scenario must pass (none fails, none is
//! skipped), including those that moved here from `testing::scenarios` (checkpoint
//! recovery, split ranges, fencing, atomic commits).

use serde_json::json;
use sluice_conformance::{Capabilities, assert_all_pass, run_suite};
use sluice_driver_sdk::inprocess::InProcess;
use sluice_sqlite::SqliteDriver;
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
