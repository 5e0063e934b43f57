//! The conformance suite against the real Redis at 127.0.0.1:6379, in process, claiming
//! what this driver declares: deletions, and nothing of authoritative (no fence, no
//! checkpoint in Redis), delta updates (refused) or strict `exists` checks. Every other
//! scenario must pass; those needing an unclaimed capability are skipped with the
//! reason. Each scenario has its own key prefix, and its cleanup (ApplyDelete) removes
//! its keys.

use serde_json::json;
use sluice_conformance::{Capabilities, Capability, Outcome, run_suite};
use sluice_driver_sdk::Driver;
use sluice_driver_sdk::inprocess::InProcess;
use sluice_redis::RedisDriver;
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread")]
async fn the_conformance_suite_passes_for_what_the_driver_claims() {
    let driver = RedisDriver::new();
    let claimed = Capabilities::declared(driver.declared());
    assert_eq!(
        claimed,
        Capabilities::ALL
            .without(Capability::Authoritative)
            .without(Capability::DeltaUpdates)
            .without(Capability::StrictExists)
    );
    let endpoint = InProcess::new("redis", Arc::new(driver));
    let config = json!({ "url": "redis://127.0.0.1:6379/0" });
    for format in ["json", "hash"] {
        let resource =
            json!({ "prefix": format!("sluice-conformance-{format}"), "format": format });
        let results = run_suite(&endpoint, claimed, config.clone(), resource).await;
        let failed: Vec<String> = (results.iter())
            .filter(|r| matches!(r.outcome, Outcome::Fail(_)))
            .map(ToString::to_string)
            .collect();
        assert!(failed.is_empty(), "format {format}:\n{}", failed.join("\n"));
        let skipped: Vec<&str> = (results.iter())
            .filter(|r| matches!(r.outcome, Outcome::Skip(_)))
            .map(|r| r.name)
            .collect();
        assert_eq!(
            skipped,
            [
                "delta-updates",
                "failed-commit-commits-nothing",
                "second-open-fences-first",
                "fenced-zombie-storing-a-key-the-newer-instance-committed",
                "split-range-recovers-parent-then-own-checkpoints",
                "split-range-halves-resume-from-own-lineage",
            ],
            "format {format}: only the scenarios needing an unclaimed capability are skipped"
        );
    }
}
