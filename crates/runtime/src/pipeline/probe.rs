//! What `sluice check` and the start of `sluice run` find past the file: each store
//! reached through an Apply dry run, each source probed ([`Source::probe`](sluice_source_sdk::Source::probe)).

use super::admit::open_to_look;
use super::apply::{ApplyAction, apply_with, read_prior};
use super::error::{PipelineError, invalid};
use super::plan::Planned;
use super::retries::Retries;
use crate::config::Pipeline;
use crate::txn;
use sluice_source_sdk::SourceError;
use tokio::sync::watch;

/// What `sluice check` found past the file ([`probe`]).
#[derive(Debug, Default)]
pub struct Probed {
    /// (materialization, what Apply would do there now) of each store reached.
    pub stores: Vec<(String, String)>,
    /// The sources that can be read.
    pub sources: Vec<String>,
    /// What cannot be reached or read, each naming its place.
    pub problems: Vec<PipelineError>,
}

/// What `sluice check` finds past the file: every planned materialization's Apply as a
/// dry run, told the spec applied last (its driver connects to the store and reads what
/// is there, creating nothing), and every source probed ([`probe_sources`]).
pub async fn probe(pipeline: &Pipeline, planned: &Planned) -> Probed {
    let mut probed = Probed::default();
    let timeout = pipeline.runtime.timeouts.driver;
    for m in &planned.materializations {
        // Told what was applied last, as `sluice apply` is: a raised backfill or a
        // retyped field shows here as it would there.
        let dir = pipeline.recovery_log().join(&m.name);
        let prior = match read_prior(&dir, &m.name).await {
            Ok(prior) => prior,
            Err(err) => {
                let place = format!("materializations.{}", m.name);
                probed.problems.push(invalid(place, err));
                continue;
            }
        };
        match apply_with(m, ApplyAction::Upsert, true, timeout, &prior).await {
            Ok((actions, _)) => probed.stores.push((m.name.clone(), actions)),
            Err(PipelineError::Driver { source, .. }) => probed.problems.push(invalid(
                format!("materializations.{}.endpoint", m.name),
                sluice_driver_sdk::error::chain(&source),
            )),
            Err(err) => probed.problems.push(err),
        }
    }
    // Nothing stops a check but its own bounds.
    let (_never, unstopped) = watch::channel(false);
    for (source, result) in probe_sources(pipeline, &unstopped).await {
        match result {
            Ok(()) => probed.sources.push(source),
            Err(err) => probed.problems.push(err.into()),
        }
    }
    probed
}

/// Probes every source a materialization reads ([`Source::probe`](sluice_source_sdk::Source::probe)), once each, each
/// call bounded as the loop bounds a source's calls (`runtime.timeouts.source`, and
/// given up at `shutdown`): (source, what the probe found).
pub async fn probe_sources(
    pipeline: &Pipeline,
    shutdown: &watch::Receiver<bool>,
) -> Vec<(String, Result<(), SourceError>)> {
    let mut probed = Vec::new();
    for (source, def) in &pipeline.sources {
        let reader = (pipeline.materializations.keys())
            .find(|m| pipeline.sources_of(m).any(|(name, _)| name == source));
        let Some(materialization) = reader else {
            continue;
        };
        let after = pipeline.runtime.timeouts.source;
        let result = match open_to_look(pipeline, materialization, source, def) {
            Ok(opened) => txn::bounded(opened, after, shutdown.clone()).probe().await,
            Err(err) => Err(err),
        };
        probed.push((source.clone(), result));
    }
    probed
}

/// What `sluice run` does before it creates anything (tables, the recovery log): probes
/// its sources ([`probe_sources`]), retrying as the loop retries while every failure is
/// retryable (a broker not up yet); `shutdown` ends the wait.
pub async fn check_sources(
    pipeline: &Pipeline,
    shutdown: &watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    let mut retries = Retries::new();
    loop {
        let errors: Vec<SourceError> = (probe_sources(pipeline, shutdown).await.into_iter())
            .filter_map(|(_, probed)| probed.err())
            .collect();
        let retryable = errors.iter().all(SourceError::is_retryable);
        let Some(err) = PipelineError::gathered(errors.into_iter().map(Into::into).collect())
        else {
            return Ok(());
        };
        if *shutdown.borrow() {
            return Err(PipelineError::Stopped);
        }
        if !retries.failed(retryable, shutdown)
            || !retries.wait(&err, "checking again", shutdown).await
        {
            return Err(err);
        }
    }
}
