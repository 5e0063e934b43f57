//! The driver conformance suite against the real server, through the in-process
//! endpoint: every scenario must pass (none may fail; skips are reported).

mod common;

use common::TestDb;
use serde_json::json;
use sluice_driver::conformance::{Outcome, run_suite};
use sluice_driver::inprocess::InProcess;
use sluice_mysql::MysqlDriver;
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread")]
async fn the_conformance_suite_passes_against_the_real_server() {
    let db = TestDb::new().await;
    let endpoint = InProcess::new("mysql", Arc::new(MysqlDriver::new()));
    let results = run_suite(&endpoint, db.endpoint(), json!({ "table": "conf" })).await;
    for result in &results {
        println!("{result}");
    }
    let failed: Vec<String> = results
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Fail(_)))
        .map(|r| r.to_string())
        .collect();
    assert!(
        failed.is_empty(),
        "{} failed:\n{}",
        failed.len(),
        failed.join("\n")
    );
    assert!(
        results.iter().all(|r| r.outcome == Outcome::Pass),
        "every scenario applies to this driver"
    );
}
