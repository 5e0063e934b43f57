//! The conformance suite against the real Redis at 127.0.0.1:6379, claiming what this
//! driver declares: deletions, and nothing of authoritative (no fence, no checkpoint in
//! Redis), delta updates (refused) or strict `exists` checks. Every other scenario must
//! pass; those needing an unclaimed capability are skipped with the reason. Each
//! scenario has its own key prefix, and its cleanup (ApplyDelete) removes its keys.
//! The suite runs in process, then through Flow's current protocol (the driver served
//! as `materialize.Connector` on a loopback gRPC port, driven by the runtime's
//! current-protocol endpoint), each with its own prefixes.

use serde_json::{Value, json};
use sluice_conformance::{Capabilities, Capability, Outcome, ScenarioResult, run_suite};
use sluice_driver_sdk::Driver;
use sluice_driver_sdk::inprocess::InProcess;
use sluice_redis::RedisDriver;
use sluice_testkit::conformance::current::{NO_DRY_RUN, run_suite_over_current_grpc};
use std::sync::Arc;

const CONFIG: &str = "redis://127.0.0.1:6379/0";

/// What the driver claims, checked against what it should.
fn claimed(driver: &RedisDriver) -> Capabilities {
    let claimed = Capabilities::declared(driver.declared());
    assert_eq!(
        claimed,
        Capabilities::ALL
            .without(Capability::Authoritative)
            .without(Capability::DeltaUpdates)
            .without(Capability::StrictExists)
    );
    claimed
}

fn config() -> Value {
    json!({ "url": CONFIG })
}

/// A resource of `format` under a prefix of its own (`run`: which run of the suite).
fn resource(run: &str, format: &str) -> Value {
    json!({ "prefix": format!("sluice-conformance-{run}{format}"), "format": format })
}

/// Nothing failed, and only the scenarios needing an unclaimed capability were skipped:
/// those of the driver, and `also` (what the protocol cannot carry).
fn assert_passes_what_it_claims(results: &[ScenarioResult], format: &str, also: &[&str]) {
    let failed: Vec<String> = (results.iter())
        .filter(|r| matches!(r.outcome, Outcome::Fail(_)))
        .map(ToString::to_string)
        .collect();
    assert!(failed.is_empty(), "format {format}:\n{}", failed.join("\n"));
    let skipped: Vec<&str> = (results.iter())
        .filter(|r| matches!(r.outcome, Outcome::Skip(_)))
        .map(|r| r.name)
        .collect();
    let expected = also.iter().copied().chain([
        "delta-updates",
        "failed-commit-commits-nothing",
        "second-open-fences-first",
        "fenced-zombie-storing-a-key-the-newer-instance-committed",
        "split-range-recovers-parent-then-own-checkpoints",
        "split-range-halves-resume-from-own-lineage",
    ]);
    assert_eq!(
        skipped,
        expected.collect::<Vec<_>>(),
        "format {format}: only the scenarios needing an unclaimed capability are skipped"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_conformance_suite_passes_for_what_the_driver_claims() {
    let driver = RedisDriver::new();
    let claimed = claimed(&driver);
    let endpoint = InProcess::new("redis", Arc::new(driver));
    for format in ["json", "hash"] {
        let results = run_suite(&endpoint, claimed, config(), resource("", format)).await;
        assert_passes_what_it_claims(&results, format, &[]);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_conformance_suite_passes_for_what_the_driver_claims_over_the_current_protocol() {
    let claimed = claimed(&RedisDriver::new());
    for format in ["json", "hash"] {
        let results = run_suite_over_current_grpc(
            Arc::new(RedisDriver::new()),
            claimed,
            config(),
            resource("current-", format),
        )
        .await;
        assert_passes_what_it_claims(&results, format, &[NO_DRY_RUN]);
    }
}
