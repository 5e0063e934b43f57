//! Admission: a pipeline runs only when every part can give the delivery it asks for.
//!
//! Each part declares what it gives before anything opens: a source its
//! [`FaultTolerance`], a Flow driver its commit pattern (built-in drivers by their
//! registration, external ones by `pattern:` in the pipeline file: undeclared counts as
//! non-transactional, failing closed), an epoch sink its [`SinkContract`]. [`admit`] is
//! the one decision (pure), run by `plan`, so by `sluice check` and `sluice run` alike.
//!
//! | part                                   | exactly_once | at_least_once |
//! |----------------------------------------|--------------|---------------|
//! | source: exactly-once (replays steps)   | yes          | yes           |
//! | source: at-least-once (seeks)          | no           | yes           |
//! | source: none (cannot resume)           | no           | no            |
//! | Flow driver: authoritative             | yes          | yes           |
//! | Flow driver: idempotent apply          | yes          | yes           |
//! | Flow driver: non-transactional, or undeclared | no    | yes           |
//! | epoch sink: checkpoint-committable     | yes          | yes           |
//! | epoch sink: durable at-least-once      | no           | yes           |
//! | epoch sink: ephemeral                  | no           | no            |

use serde::Deserialize;
use sluice_driver_sdk::CommitPattern;
use sluice_driver_sdk::contract::{Consistency, SinkContract};
use sluice_source_sdk::FaultTolerance;
use std::fmt;

/// What a pipeline asks of its parts (`delivery:` in the pipeline file).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    #[default]
    ExactlyOnce,
    AtLeastOnce,
}

/// What a materialization's endpoint declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkGuarantee {
    /// A Flow driver and its declared commit pattern (`None`: undeclared).
    Flow(Option<CommitPattern>),
    /// An epoch sink and its contract.
    Epoch(SinkContract),
}

impl SinkGuarantee {
    /// Whether the store keeps the runtime checkpoint in its own transactions (an
    /// authoritative Flow driver, an output's view): recovery trusts it over the log.
    pub fn store_keeps_checkpoint(&self) -> bool {
        matches!(
            self,
            SinkGuarantee::Flow(Some(CommitPattern::RemoteAuthoritative))
        )
    }
}

/// A part that cannot give the delivery asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Where in the pipeline file (`sources.events`, `materializations.views.endpoint`).
    pub place: String,
    /// What the part declares.
    pub declares: String,
    /// What would make it admissible.
    pub remedy: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}; {}", self.place, self.declares, self.remedy)
    }
}

const OR_AT_LEAST_ONCE: &str = "or set `delivery: at_least_once` for the pipeline";

/// The refusals of a materialization's parts under `delivery` (none: admitted).
pub fn admit(
    delivery: Delivery,
    sources: &[(String, FaultTolerance)],
    sink: (&str, SinkGuarantee),
) -> Vec<Refusal> {
    let mut refusals = Vec::new();
    for (name, tolerance) in sources {
        let refusal = match (delivery, tolerance) {
            (_, FaultTolerance::ExactlyOnce) => None,
            (Delivery::ExactlyOnce, FaultTolerance::AtLeastOnce) => Some((
                "declares at-least-once delivery (it resumes after its last committed step, \
                 but cannot replay an interrupted one exactly, and journals nothing)",
                format!(
                    "exactly-once needs a source that replays its steps (journaled or \
                     re-readable), {OR_AT_LEAST_ONCE}"
                ),
            )),
            (Delivery::ExactlyOnce, FaultTolerance::None)
            | (Delivery::AtLeastOnce, FaultTolerance::None) => Some((
                "declares no fault tolerance (input read before a crash is lost)",
                "use a source that can resume from a committed position".to_string(),
            )),
            (Delivery::AtLeastOnce, FaultTolerance::AtLeastOnce) => None,
        };
        if let Some((declares, remedy)) = refusal {
            refusals.push(Refusal {
                place: format!("sources.{name}"),
                declares: declares.into(),
                remedy,
            });
        }
    }
    let (place, guarantee) = sink;
    let refusal = match (delivery, guarantee) {
        (Delivery::ExactlyOnce, SinkGuarantee::Flow(None)) => Some((
            "is a driver of undeclared commit pattern, which counts as non-transactional"
                .to_string(),
            format!(
                "declare `pattern: authoritative` or `pattern: idempotent_apply` beside \
                 its config if the driver commits that way, {OR_AT_LEAST_ONCE}"
            ),
        )),
        (
            Delivery::ExactlyOnce,
            SinkGuarantee::Flow(Some(CommitPattern::RecoveryLogNonTransactional)),
        ) => Some((
            "is a non-transactional driver (a crash may apply a transaction twice)".to_string(),
            format!(
                "use a driver that commits authoritatively or applies idempotently, \
                     {OR_AT_LEAST_ONCE}"
            ),
        )),
        (_, SinkGuarantee::Flow(_)) => None,
        (_, SinkGuarantee::Epoch(contract)) => match (delivery, contract.consistency) {
            (_, Consistency::CheckpointCommittable) => None,
            (Delivery::AtLeastOnce, Consistency::AtLeastOnce) => None,
            (Delivery::ExactlyOnce, Consistency::AtLeastOnce) => Some((
                format!("is an epoch sink of {} consistency", contract.consistency),
                format!("exactly-once needs a checkpoint-committable sink, {OR_AT_LEAST_ONCE}"),
            )),
            (_, Consistency::Ephemeral) => Some((
                format!(
                    "is an epoch sink of {} consistency (its writes do not survive a crash)",
                    contract.consistency
                ),
                "use a sink configuration that is durable".to_string(),
            )),
        },
    };
    if let Some((declares, remedy)) = refusal {
        refusals.push(Refusal {
            place: place.to_string(),
            declares,
            remedy,
        });
    }
    refusals
}

/// A commit pattern as the pipeline file spells it (`pattern:` of an external driver).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeclaredPattern {
    Authoritative,
    IdempotentApply,
    NonTransactional,
}

impl From<DeclaredPattern> for CommitPattern {
    fn from(p: DeclaredPattern) -> CommitPattern {
        match p {
            DeclaredPattern::Authoritative => CommitPattern::RemoteAuthoritative,
            DeclaredPattern::IdempotentApply => CommitPattern::RecoveryLogIdempotentApply,
            DeclaredPattern::NonTransactional => CommitPattern::RecoveryLogNonTransactional,
        }
    }
}
