//! The conformance suite: one scenario list any driver must pass, over any transport,
//! and the one way tests drive a driver.
//!
//! ```text
//!   run_suite(endpoint, claimed capabilities, config, resource)
//!     └─ for each scenario: skipped (with its reason) if it needs a capability not claimed,
//!        else Fixture (unique materialization and table names)
//!          └─ scenario body: unary calls + Sessions (client::open, checked by the state machine)
//!               └─ Pass | Fail(reason) | Skip(reason), within SCENARIO_TIMEOUT
//! ```
//!
//! Every scenario talks to the driver only through the [`Endpoint`] and the runtime-side
//! [`sluice_driver_sdk::client`] (as a [`Session`]), so it tests exactly what a runtime
//! would see, whatever the transport. Invariants:
//! - Isolation: each scenario has its own materialization name and table names (the
//!   resource's `table` plus a suffix unique to this process, run and scenario), so
//!   reruns and parallel runs against one store never collide.
//! - Every scenario ends: a driver that stops answering fails the scenario after
//!   [`SCENARIO_TIMEOUT`] rather than hanging the suite.
//! - The collection is fixed ([`fixture`]): key `/id` (integer), a `value` string field
//!   and the whole document (`flow_document`); keys and values are tuple-packed.
//! - Capabilities are declared ([`Capabilities`]); a scenario runs when the driver
//!   claims every capability it needs and is then checked strictly ([`capability`]).
//!
//! The scenarios and what each checks are listed in [`scenarios`]. Besides the suite:
//! [`Session`] is how every test drives a Transactions stream and [`messages`] builds raw
//! protocol messages. (The fixtures of the table-writing connectors' own tests are
//! `sluice_testkit::conformance`.)

pub mod capability;
mod fixture;
pub mod messages;
mod scenarios;
mod session;

pub use capability::{Capabilities, Capability, skip_reason};
pub use session::{Session, Txn};

use serde_json::Value;
use sluice_driver_sdk::Endpoint;
use std::time::Duration;

/// The longest a scenario may take. Generous (16 MiB documents through a debug build
/// and a file-backed store take seconds); only a driver that stopped answering hits it.
pub const SCENARIO_TIMEOUT: Duration = Duration::from_secs(300);

/// How one scenario went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    Fail(String),
    /// The driver does not claim a capability the scenario needs (e.g. deletions).
    Skip(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScenarioResult {
    pub name: &'static str,
    pub outcome: Outcome,
}

impl std::fmt::Display for ScenarioResult {
    /// `PASS name`, `FAIL name: reason` or `SKIP name: reason`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.outcome {
            Outcome::Pass => write!(f, "PASS {}", self.name),
            Outcome::Fail(reason) => write!(f, "FAIL {}: {reason}", self.name),
            Outcome::Skip(reason) => write!(f, "SKIP {}: {reason}", self.name),
        }
    }
}

/// The names of the scenarios, in the order they run.
pub fn scenario_names() -> impl Iterator<Item = &'static str> {
    scenarios::ALL.iter().map(|scenario| scenario.name)
}

/// Runs every scenario against `endpoint`, in order; skips those needing a capability
/// the driver does not claim (`claimed`). `config` is the endpoint configuration sent in
/// every request; `resource` is a binding's resource configuration, an object whose
/// string `table` property is made unique per scenario.
pub async fn run_suite(
    endpoint: &dyn Endpoint,
    claimed: Capabilities,
    config: Value,
    resource: Value,
) -> Vec<ScenarioResult> {
    let mut results = Vec::new();
    for scenario in &scenarios::ALL {
        let name = scenario.name;
        let fixture = fixture::Fixture::new(endpoint, claimed, &config, &resource, name);
        let outcome = match (skip_reason(scenario.needs, &claimed), fixture) {
            (Some(reason), _) => Outcome::Skip(reason),
            (None, Err(reason)) => Outcome::Fail(reason),
            (None, Ok(fx)) => {
                let run = (scenario.run)(&fx);
                let outcome = match tokio::time::timeout(SCENARIO_TIMEOUT, run).await {
                    Ok(Ok(())) => Outcome::Pass,
                    Ok(Err(scenarios::Failure(reason))) => Outcome::Fail(reason),
                    Err(_) => Outcome::Fail(format!(
                        "no answer within {}s: the driver hangs",
                        SCENARIO_TIMEOUT.as_secs()
                    )),
                };
                // Bounded too: cleanup talks to the same, possibly hung, driver.
                let _ = tokio::time::timeout(SCENARIO_TIMEOUT, fx.cleanup()).await;
                outcome
            }
        };
        results.push(ScenarioResult { name, outcome });
    }
    results
}

/// A test's verdict on a suite run of a driver claiming every capability: panics
/// listing every scenario that did not pass (a failure, or a skip).
pub fn assert_all_pass(results: &[ScenarioResult]) {
    let not_passed: Vec<String> = (results.iter())
        .filter(|r| r.outcome != Outcome::Pass)
        .map(ScenarioResult::to_string)
        .collect();
    assert!(
        not_passed.is_empty(),
        "{} of {} scenarios did not pass:\n{}",
        not_passed.len(),
        results.len(),
        not_passed.join("\n")
    );
}
