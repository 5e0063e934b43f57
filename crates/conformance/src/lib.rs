//! The conformance suite: a scenario matrix any driver must pass, over any transport.
//!
//! ```text
//!   run_suite(endpoint, config, resource)
//!     └─ for each scenario: Fixture (unique materialization and table names)
//!          └─ scenario body: unary calls + Sessions (client::open, checked by the state machine)
//!               └─ Pass | Fail(reason) | Skip(reason), within SCENARIO_TIMEOUT
//! ```
//!
//! Every scenario talks to the driver only through the [`Endpoint`] and the runtime-side
//! [`sluice_driver_sdk::client`], so it tests exactly what a runtime would see, whatever the
//! transport. Invariants:
//! - Isolation: each scenario has its own materialization name and table names (the
//!   resource's `table` plus a suffix unique to this process, run and scenario), so
//!   reruns and parallel runs against one store never collide.
//! - Every scenario ends: a driver that stops answering fails the scenario after
//!   [`SCENARIO_TIMEOUT`] rather than hanging the suite.
//! - The collection is fixed ([`fixture`]): key `/id` (integer), a `value` string field
//!   and the whole document (`flow_document`); keys and values are tuple-packed.
//!
//! The scenarios and what each checks are listed in [`scenarios`].

mod fixture;
mod scenarios;
mod session;
pub mod testing;

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
    /// The driver does not claim the capability the scenario tests (e.g. deletions).
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

/// Runs every scenario against `endpoint`, in order. `config` is the endpoint
/// configuration sent in every request; `resource` is a binding's resource
/// configuration, an object whose string `table` property is made unique per scenario.
pub async fn run_suite(
    endpoint: &dyn Endpoint,
    config: Value,
    resource: Value,
) -> Vec<ScenarioResult> {
    let mut results = Vec::new();
    for (name, scenario) in scenarios::ALL {
        let outcome = match fixture::Fixture::new(endpoint, &config, &resource, name) {
            Err(reason) => Outcome::Fail(reason),
            Ok(fx) => {
                let outcome = match tokio::time::timeout(SCENARIO_TIMEOUT, scenario(&fx)).await {
                    Ok(Ok(())) => Outcome::Pass,
                    Ok(Err(scenarios::Failure::Fail(reason))) => Outcome::Fail(reason),
                    Ok(Err(scenarios::Failure::Skip(reason))) => Outcome::Skip(reason),
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

/// A test's verdict on a suite run: panics listing every scenario that did not pass
/// (a failure, or a skip of a capability the driver was expected to have).
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
