//! [`PipelineError`]: why planning, applying or running a pipeline failed, each
//! problem naming its place in the pipeline file.

use crate::admission::Refusal;
use crate::projections::BuildError;
use crate::types::{RunError, Summary};
use sluice_source_sdk::SourceError;

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error("{place}: {reason}")]
    Invalid { place: String, reason: String },
    /// Admission: parts that cannot give the delivery the pipeline asks for.
    #[error("the pipeline asks for {delivery} delivery, which {} cannot give:{}",
        if refusals.len() == 1 { "this part" } else { "these parts" },
        refusals.iter().map(|r| format!("\n  - {r}")).collect::<String>())]
    Refused {
        delivery: &'static str,
        refusals: Vec<Refusal>,
    },
    #[error("materialization {materialization}: {source}")]
    Driver {
        materialization: String,
        #[source]
        source: sluice_driver_sdk::Error,
    },
    /// The pipeline file changed since the store was applied (user action needed).
    #[error(
        "materialization {materialization}: the pipeline file differs from the spec \
             applied to its store (applied version {applied}, the file's {file}): {changes}. \
             If the file reads environment variables, check that each is set as when it \
             was applied: applying would point the store at the new values. If the change \
             is meant, run `sluice apply` on the pipeline file, then run again"
    )]
    NotApplied {
        materialization: String,
        applied: String,
        file: String,
        changes: String,
    },
    /// A source that cannot be read ([`Source::probe`](sluice_source_sdk::Source::probe)).
    #[error(transparent)]
    Source(#[from] SourceError),
    /// A stop request came before the run began: nothing was created.
    #[error("stopped before the run began: nothing was created")]
    Stopped,
    /// Several problems at once, each naming its place: what `sluice check` reports,
    /// and what `run` refuses to start with.
    #[error("{} problems:{}", .0.len(), .0.iter().map(|p| format!("\n  - {p}")).collect::<String>())]
    Problems(Vec<PipelineError>),
    /// A materialization's loop failed (and was not retried, or ran out of attempts).
    /// The others were stopped after their transaction in progress.
    #[error("materialization {materialization}: {source}")]
    Run {
        materialization: String,
        #[source]
        source: Box<RunError>,
        /// What every materialization committed before the run ended, the failed one
        /// included, by name.
        summaries: Vec<(String, Summary)>,
    },
}

impl PipelineError {
    /// The one problem, all of them, or `None` without any.
    pub fn gathered(mut problems: Vec<PipelineError>) -> Option<PipelineError> {
        match problems.len() {
            0 => None,
            1 => Some(problems.remove(0)),
            _ => Some(PipelineError::Problems(problems)),
        }
    }
}

pub(super) fn invalid(place: impl Into<String>, reason: impl Into<String>) -> PipelineError {
    PipelineError::Invalid {
        place: place.into(),
        reason: reason.into(),
    }
}
