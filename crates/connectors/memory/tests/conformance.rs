//! The conformance suite against the reference memory driver through Flow's current
//! protocol: the driver served as `materialize.Connector` on a loopback gRPC port,
//! driven by the runtime's current-protocol endpoint, in memory and in a state file.
//! Claiming every capability, every scenario must pass. (The same suite in process is
//! `tests/memory.rs`.)

use serde_json::json;
use sluice_conformance::Capabilities;
use sluice_memory::MemoryDriver;
use sluice_testkit::conformance::current::{
    assert_all_pass_but_dry_run, run_suite_over_current_grpc,
};
use std::sync::Arc;

#[tokio::test(flavor = "multi_thread")]
async fn the_conformance_suite_passes_over_the_current_protocol() {
    let dir = tempfile::tempdir().unwrap();
    let configs = [json!({}), json!({ "path": dir.path().join("state.json") })];
    for config in configs {
        let results = run_suite_over_current_grpc(
            Arc::new(MemoryDriver::new()),
            Capabilities::ALL,
            config,
            json!({"table": "t"}),
        )
        .await;
        assert_all_pass_but_dry_run(&results);
    }
}
