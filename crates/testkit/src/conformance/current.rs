//! The conformance suite through Flow's current protocol: a driver served as
//! `materialize.Connector` on a loopback gRPC port, and the runtime's
//! `CurrentEndpoint` driving every scenario through it.
//!
//! ```text
//!   run_suite ─▶ CurrentEndpoint ─▶ CurrentGrpc ──127.0.0.1:PORT──▶ CurrentServer ─▶ driver
//!    (seed)      (seed ⇄ current)    (tonic client)                  (current ⇄ seed)
//! ```
//!
//! Both translations run, so a scenario passing here passes through the current
//! protocol's every message (Open/Opened with the runtime checkpoint in a
//! `consumer.Checkpoint`, Acknowledge/Acknowledged, Load/Loaded, Flush/Flushed, Store,
//! StartCommit/StartedCommit) and back; the driver itself is the one the in-process
//! suite runs. The stdio transport is run with the `sluice` binary's
//! `driver stdio NAME` (`crates/cli/tests/external_current.rs`), which a connector's
//! tests cannot start.

use serde_json::Value;
use sluice_conformance::{
    Capabilities, Capability, Outcome, ScenarioResult, assert_all_pass, run_suite,
};
use sluice_driver_sdk::Driver;
use sluice_driver_sdk::current::Protocol;
use sluice_driver_sdk::current::grpc::{connect, serve};
use sluice_driver_sdk::grpc::GrpcListener;
use std::sync::Arc;

/// The scenario no driver passes over the current protocol, which has no dry run: the
/// runtime's endpoint answers a dry run itself and never asks the driver.
pub const NO_DRY_RUN: &str = "apply-dry-run";

/// Runs the whole suite against `driver` served over the current protocol on a
/// loopback gRPC port (as [`run_suite`] takes `claimed`, `config` and `resource`), the
/// driver claiming no dry run (see [`NO_DRY_RUN`]), as `sluice driver test --protocol
/// current` claims. The server is stopped (its task aborted and awaited) before this
/// returns.
pub async fn run_suite_over_current_grpc(
    driver: Arc<dyn Driver>,
    claimed: Capabilities,
    config: Value,
    resource: Value,
) -> Vec<ScenarioResult> {
    let listener = GrpcListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let address = listener.address().to_string();
    let server = tokio::spawn(serve(listener, driver));
    let endpoint = connect(&address, Some(Protocol::Current))
        .await
        .unwrap_or_else(|err| panic!("connect to the current server at {address}: {err}"));
    let claimed = claimed.without(Capability::DryRun);
    let results = run_suite(endpoint.as_ref(), claimed, config, resource).await;
    drop(endpoint);
    server.abort();
    let _ = server.await;
    results
}

/// A test's verdict on a suite run over the current protocol of a driver claiming every
/// capability: every scenario passed but [`NO_DRY_RUN`], which was skipped.
pub fn assert_all_pass_but_dry_run(results: &[ScenarioResult]) {
    let (dry_run, rest): (Vec<ScenarioResult>, Vec<ScenarioResult>) =
        (results.iter().cloned()).partition(|r| r.name == NO_DRY_RUN);
    assert!(
        dry_run
            .iter()
            .all(|r| matches!(r.outcome, Outcome::Skip(_))),
        "{NO_DRY_RUN} runs over the current protocol, which has no dry run: {dry_run:?}"
    );
    assert_all_pass(&rest);
}
