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
//!
//! Effectively-once ([`admit_bindings`]): under `exactly_once`, a materialization whose
//! every binding reduces only idempotently under replay ([`Replay`]: lastWriteWins,
//! firstWriteWins, minimize, maximize, merge and set of those; no sum, no append, no
//! delta updates) also takes at-least-once sources and a non-transactional Flow driver
//! (Redis): reading a suffix of the input again, or applying a transaction again,
//! leaves the store as one reading would.
//!
//! An epoch sink's bindings are judged too, once it validated them
//! ([`admit_epoch_bindings`]): a standard binding only where the sink loads it.

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

/// A binding of an epoch sink, as admission sees it once the sink validated it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpochBinding {
    /// Where in the pipeline file (`materializations.lake.bindings[0]`).
    pub place: String,
    /// The pipeline asks for a standard binding (no `delta_updates: true`): each key's
    /// stored document loaded and reduced onto.
    pub standard: bool,
    /// The sink declares it answers Load for this binding (`EpochSink::loads`; its
    /// Validate says the binding is not delta updates).
    pub loads: bool,
}

/// The refusals of an epoch sink's bindings: a standard binding is admitted only into a
/// sink that declares it loads it (a sink that does not would get each transaction's
/// changes, unreduced onto what it holds: sums counted from zero every time).
pub fn admit_epoch_bindings(bindings: &[EpochBinding]) -> Vec<Refusal> {
    bindings
        .iter()
        .filter(|b| b.standard && !b.loads)
        .map(|b| Refusal {
            place: b.place.clone(),
            declares: "is a standard binding, but the epoch sink answers no Load for it (it \
                       takes each transaction's changes as delta updates)"
                .into(),
            remedy: "set `delta_updates: true` on the binding, or choose a mode of the sink \
                     that keeps one row per key (Iceberg: `mode: upsert` in its resource)"
                .into(),
        })
        .collect()
}

/// Whether a binding's effect survives its input reduced twice: a source read a suffix
/// of it again (at-least-once), or a store applied a transaction again
/// (non-transactional).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replay {
    /// A standard binding whose every reduction is idempotent under replay
    /// (`Reducer::not_idempotent`): reduced twice, its store holds what once would.
    Idempotent,
    /// What counts input read twice twice: a reduction (`/total: sum`), or delta
    /// updates (the store reduces what it is sent by itself).
    Counts(String),
}

/// A binding of a materialization, as effectively-once admission sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingReplay {
    /// Where in the pipeline file (`materializations.views.bindings[0]`).
    pub place: String,
    pub replay: Replay,
}

impl BindingReplay {
    /// The binding at `place`: delta updates, or its collection's reductions.
    pub fn of(place: String, delta_updates: bool, reducer: &sluice_doc::Reducer) -> BindingReplay {
        let replay = match (delta_updates, reducer.not_idempotent()) {
            (true, _) => Replay::Counts("delta updates".to_string()),
            (false, Some((location, strategy))) if location.is_empty() => {
                Replay::Counts(format!("the document root: {strategy}"))
            }
            (false, Some((location, strategy))) => {
                Replay::Counts(format!("{location}: {strategy}"))
            }
            (false, None) => Replay::Idempotent,
        };
        BindingReplay { place, replay }
    }
}

impl fmt::Display for Replay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Replay::Idempotent => write!(
                f,
                "idempotent under replay: exactly-once even from an at-least-once source \
                 or into a non-transactional store (effectively-once)"
            ),
            Replay::Counts(what) => write!(
                f,
                "not idempotent under replay ({what}): exactly-once needs exactly-once \
                 sources and store"
            ),
        }
    }
}

/// [`admit`] with the materialization's bindings: under `delivery: exactly_once`, when
/// every binding is [`Replay::Idempotent`] (and there is one), an at-least-once source
/// counts as replaying and a non-transactional Flow driver as applying idempotently
/// (effectively-once). An undeclared driver still fails closed, and an epoch sink is
/// judged by its contract alone: it appends what it is sent, unreduced. Otherwise a
/// refusal that idempotent reductions would lift names the binding and reduction that
/// stop it.
pub fn admit_bindings(
    delivery: Delivery,
    sources: &[(String, FaultTolerance)],
    sink: (&str, SinkGuarantee),
    bindings: &[BindingReplay],
) -> Vec<Refusal> {
    let blocker = bindings.iter().find_map(|b| match &b.replay {
        Replay::Idempotent => None,
        Replay::Counts(what) => Some(format!("{} has {what}", b.place)),
    });
    let (place, guarantee) = sink;
    let non_transactional =
        guarantee == SinkGuarantee::Flow(Some(CommitPattern::RecoveryLogNonTransactional));
    if delivery == Delivery::AtLeastOnce || bindings.is_empty() {
        return admit(delivery, sources, sink);
    }
    let Some(blocker) = blocker else {
        let sources: Vec<(String, FaultTolerance)> = (sources.iter())
            .map(|(name, t)| match t {
                FaultTolerance::AtLeastOnce => (name.clone(), FaultTolerance::ExactlyOnce),
                other => (name.clone(), *other),
            })
            .collect();
        let guarantee = match non_transactional {
            true => SinkGuarantee::Flow(Some(CommitPattern::RecoveryLogIdempotentApply)),
            false => guarantee,
        };
        return admit(delivery, &sources, (place, guarantee));
    };
    let mut refusals = admit(delivery, sources, sink);
    for refusal in &mut refusals {
        let lifted = match refusal.place.strip_prefix("sources.") {
            Some(name) => sources
                .iter()
                .any(|(n, t)| n == name && *t == FaultTolerance::AtLeastOnce),
            None => refusal.place == place && non_transactional,
        };
        if lifted {
            refusal.remedy.push_str(&format!(
                ", or keep only reductions idempotent under replay in its bindings \
                 ({blocker})"
            ));
        }
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

#[cfg(test)]
mod epoch_binding_tests {
    use super::*;

    #[test]
    fn a_standard_binding_needs_a_sink_that_loads_it() {
        let binding = |standard, loads| EpochBinding {
            place: "materializations.lake.bindings[0]".into(),
            standard,
            loads,
        };
        // (standard asked, sink loads) -> admitted
        for (standard, loads, admitted) in [
            (false, false, true),
            (false, true, true),
            (true, true, true),
            (true, false, false),
        ] {
            let refusals = admit_epoch_bindings(&[binding(standard, loads)]);
            assert_eq!(refusals.is_empty(), admitted, "{standard} {loads}");
        }
        let refusal = &admit_epoch_bindings(&[binding(true, false)])[0];
        let text = refusal.to_string();
        assert!(
            text.starts_with("materializations.lake.bindings[0]: "),
            "{text}"
        );
        assert!(
            text.contains("answers no Load") && text.contains("mode: upsert"),
            "{text}"
        );
    }
}
