//! Orchestration: from a loaded pipeline file to running transaction loops, one stage
//! after the other, each in its own module:
//!
//! ```text
//! Pipeline ──plan──▶ Planned { collections, materializations (endpoint, spec) }    plan.rs
//!              └─ each endpoint connected, then admitted before any driver is  admit.rs
//!                 asked anything, then Spec, Validate, field selection
//!          ──apply──▶ driver ApplyUpsert (idempotent; dry-run describes), or    apply.rs
//!                     ApplyDelete; recorded beside the recovery log;
//!                     apply_first_start: applies a never-applied spec, refuses a
//!                     spec that differs from the applied one
//!          ──run / Launcher──▶ one txn::run per materialization: its shards     launch.rs
//!                     (layout.rs) share one reader, each with its own recovery
//!                     log `<recovery_log>/<materialization>[/shards/<range>]`
//! ```
//!
//! `sluice run` plans, probes its sources (`check_sources`, [`probe`]: nothing is created
//! before every source answers), applies a first start, then runs; `sluice check` plans
//! and probes. Retries back off alike everywhere (`retries.rs`); errors name their place
//! in the file ([`PipelineError`]).
//!
//! The applied spec is the contract between the pipeline file and the store
//! ([`applied`](crate::applied)): `sluice apply` changes it; `sluice run` runs only what
//! was applied, and Open carries its version, which the driver checks against its own
//! record.
//!
//! Connecting an endpoint is the caller's job ([`Connect`], usually the binary's
//! [`Registry`](crate::registry::Registry)): the runtime does not know which connectors
//! are linked into the binary.

mod admit;
mod apply;
mod error;
mod launch;
pub mod layout;
mod plan;
mod probe;
mod retries;

pub use crate::registry::{Connect, Connected};
pub use apply::{
    ApplyAction, Prior, apply, apply_first_start, apply_materialization, apply_with,
    merge_applied_state,
};
pub use error::PipelineError;
pub use launch::{Launcher, LogPlace, OpenLog, RunOptions};
pub use plan::{Planned, PlannedMaterialization, plan, plan_all};
pub use probe::{Probed, check_sources, probe, probe_sources};

use crate::config::Pipeline;
use crate::txn::Progress;
use crate::types::Summary;
use error::invalid;
use std::sync::Arc;
use tokio::sync::watch;

/// Runs every materialization until its sources are exhausted (or `shutdown`). The
/// first materialization to fail stops the others after their transaction in progress
/// (as `shutdown` does); the error then carries what each one committed.
pub async fn run(
    pipeline: &Pipeline,
    planned: Planned,
    opts: RunOptions,
    progress: Arc<Progress>,
    shutdown: watch::Receiver<bool>,
) -> Result<Vec<(String, Summary)>, PipelineError> {
    let launcher = Launcher::new(pipeline, planned, opts, progress)?;
    // Fired by the caller's shutdown, or by the first failure.
    let (stop, stopped) = watch::channel(false);
    let stop = Arc::new(stop);
    let forward = {
        let (stop, mut shutdown) = (stop.clone(), shutdown);
        tokio::spawn(async move {
            if shutdown.wait_for(|down| *down).await.is_ok() {
                stop.send_replace(true);
            }
        })
    };
    // Every materialization's shards, before any runs (each split where it may).
    let mut layouts = Vec::new();
    let names: Vec<String> = launcher.materializations().map(String::from).collect();
    for name in names {
        let local = launcher.local_shards(&name).await?;
        layouts.push((name, local));
    }
    let mut tasks = tokio::task::JoinSet::new();
    // Each materialization's lock, held while its split shards run.
    let mut locks = Vec::new();
    for (name, local) in layouts {
        // One group: the shards share one reader of the sources.
        let shards = (local.shards.into_iter())
            .map(|(range, dir)| (range, LogPlace::Local(dir)))
            .collect();
        let run = launcher.launch(&name, shards, stopped.clone());
        tasks.spawn(async move {
            let (summary, result) = run.await;
            (name, summary, result)
        });
        locks.extend(local.lock);
    }
    let mut summaries = Vec::new();
    let mut failed = None;
    let mut panicked = None;
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((name, summary, result)) => {
                if let Err(err) = result
                    && failed.is_none()
                {
                    stop.send_replace(true);
                    failed = Some((name.clone(), err));
                }
                summaries.push((name, summary));
            }
            Err(join) => {
                stop.send_replace(true);
                panicked.get_or_insert(join);
            }
        }
    }
    forward.abort();
    let _ = forward.await;
    if let Some(join) = panicked {
        return Err(invalid(
            "runtime",
            format!("a materialization task panicked: {join}"),
        ));
    }
    drop(locks);
    // One summary per materialization, its shards' added up.
    let mut merged: std::collections::BTreeMap<String, Summary> = Default::default();
    for (name, summary) in summaries {
        merged.entry(name).or_default().merge(&summary);
    }
    let summaries: Vec<(String, Summary)> = merged.into_iter().collect();
    match failed {
        None => Ok(summaries),
        Some((materialization, source)) => Err(PipelineError::Run {
            materialization,
            source: Box::new(source),
            summaries,
        }),
    }
}
