//! The driver SDK's conformance suite against a real SQLite file, through the in-process
//! endpoint: every scenario must pass (none fails, none is skipped).

use serde_json::json;
use sluice_driver::conformance::{Outcome, run_suite};
use sluice_driver::inprocess::InProcess;
use sluice_sqlite::SqliteDriver;
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread")]
async fn the_conformance_suite_passes() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = InProcess::new("sqlite", Arc::new(SqliteDriver::new()));
    let config = json!({ "path": dir.path().join("conformance.db") });
    let results = run_suite(&endpoint, config, json!({ "table": "conf" })).await;
    let not_passed: Vec<String> = results
        .iter()
        .filter(|r| r.outcome != Outcome::Pass)
        .map(|r| r.to_string())
        .collect();
    assert!(
        not_passed.is_empty(),
        "{} of {} scenarios did not pass:\n{}",
        not_passed.len(),
        results.len(),
        not_passed.join("\n")
    );
}
