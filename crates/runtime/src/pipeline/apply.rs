//! Apply: each planned materialization's resources created or updated (or deleted) by
//! its driver, and the spec recorded as applied beside its recovery log
//! ([`crate::applied`]); a first start applies, a changed pipeline file is refused.
//!
//! ```text
//!  read (folder locked): applied record ──▶ ApplyRequest.last_materialization/last_version
//!                        recovery log's last commit ──▶ ApplyRequest.driver_checkpoint_json
//!  driver Apply ──▶ ApplyResponse.driver_checkpoint (Applied state)
//!      ──▶ merged into every local log's last commit (one atomic rewrite per log)
//!      ──▶ then the applied record
//! ```
//!
//! Where the Applied state goes, and why there: the driver checkpoint lives in the
//! recovery log's commits, which Open reads and every commit carries on, so the state is
//! merged into the log's last commit at once, while `apply` holds the folder's lock (no
//! run can be between), by rewriting the log as its latest state the way a compaction
//! does (atomic: the old log or the new one). A log with no commit yet gets one of
//! transaction 0 holding only the driver checkpoint, which recovery starts from. Exactly
//! once: the log is amended before the applied record is written, and a run refuses a
//! spec not recorded as applied, so a crash in between only leads to `sluice apply`
//! again, whose state is merged right onto the same patch: a merge patch (or a
//! replacement) applied twice in a row is applied once. Kept out of the applied record
//! on purpose: a state there would need a second write to mark it consumed.
//!
//! Under `cluster:` the logs and the record are in the cluster's etcd: the cluster
//! crate's `apply.rs` does the same there, with [`apply_with`] and
//! [`merge_applied_state`].
//!
//! A raised backfill counter (see [`crate::applied::rebuilt`]) is told to the driver by
//! `last_materialization`: it rebuilds the binding's resource; the run that follows
//! reads the binding's sources again ([`crate::txn`]'s backfill). A backfill whose
//! source also feeds a binding that is not backfilled is refused here, before the
//! driver drops anything.

use super::error::{PipelineError, invalid};
use super::plan::{Planned, PlannedMaterialization};
use super::retries::Retries;
use crate::applied;
use crate::config::Pipeline;
use crate::metrics::ended;
use crate::recovery;
use sluice_driver_sdk::error::within;
use sluice_proto::{flow, materialize as m};
use std::path::Path;
use std::time::Duration;
use tokio::sync::watch;

/// Which Apply a materialization gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyAction {
    /// Create or update its resources (ApplyUpsert), and record the spec as applied.
    Upsert,
    /// Drop its resources (ApplyDelete), and forget its applied spec and recovery log.
    Delete,
}

/// Applies every materialization (`sluice apply`): the driver's Apply, then, unless
/// `dry_run`, the record beside the recovery log of what was applied ([`applied`]) or
/// of its deletion. Holds each recovery log's lock meanwhile: refused while the
/// pipeline runs. Returns (name, actions).
pub async fn apply(
    pipeline: &Pipeline,
    planned: &Planned,
    action: ApplyAction,
    dry_run: bool,
) -> Result<Vec<(String, String)>, PipelineError> {
    let mut out = Vec::new();
    for m in &planned.materializations {
        let dir = pipeline.recovery_log().join(&m.name);
        let place = format!("materializations.{}", m.name);
        let failed = |e: &dyn std::fmt::Display| invalid(&place, e.to_string());
        // A dry run changes nothing, not even the lock file.
        let lock = match dry_run {
            true => None,
            false => {
                let dir = dir.clone();
                let lock = crate::blocking::unblock(move || recovery::lock_dir(&dir)).await;
                Some(lock.map_err(|e| failed(&e))?)
            }
        };
        let prior = read_prior(&dir, &m.name).await.map_err(|e| failed(&e))?;
        if action == ApplyAction::Upsert {
            let last = prior.applied.as_ref().map(|a| &a.spec);
            applied::check_backfills(pipeline, last, &m.spec, m.rebuilds_on_backfill)
                .map_err(|e| failed(&e))?;
        }
        let timeout = pipeline.runtime.timeouts.driver;
        let (mut actions, state) = apply_with(m, action, dry_run, timeout, &prior).await?;
        if action == ApplyAction::Delete {
            let verb = if dry_run { "would remove" } else { "removed" };
            actions = format!(
                "{}\n{verb} the recovery log {}",
                actions.trim_end(),
                dir.display()
            );
        }
        if let Some(lock) = lock {
            match action {
                ApplyAction::Upsert => {
                    record_state(&dir, &m.name, state, &lock)
                        .await
                        .map_err(|e| failed(&e))?;
                    (applied::record(&dir, &m.spec).await).map_err(|e| failed(&e))?
                }
                ApplyAction::Delete => {
                    applied::forget(&dir).await.map_err(|e| failed(&e))?;
                    let dir = dir.clone();
                    ended::forget(&dir).await.map_err(|e| failed(&e))?;
                    let removed = crate::blocking::unblock(move || {
                        super::layout::remove_shards(&dir, &lock)?;
                        recovery::remove(&dir, &lock)
                    })
                    .await;
                    removed.map_err(|e| failed(&e))?;
                }
            }
        }
        out.push((m.name.clone(), actions));
    }
    Ok(out)
}

/// What a materialization was applied with last: the spec recorded beside its recovery
/// log, and the driver checkpoint its log holds.
#[derive(Debug, Clone, Default)]
pub struct Prior {
    pub applied: Option<applied::Applied>,
    /// The driver checkpoint of the log's last commit (the first shard's, when split:
    /// each shard keeps its own, and the driver is told one); `None` when the log holds
    /// none.
    pub driver_checkpoint: Option<serde_json::Value>,
}

/// Reads what materialization `name`, whose folder is `dir`, was applied with last. The
/// caller holds the folder's lock, or reads for a dry run.
pub async fn read_prior(dir: &Path, name: &str) -> Result<Prior, String> {
    let applied = applied::read(dir).await.map_err(|e| e.to_string())?;
    let (dir, name) = (dir.to_path_buf(), name.to_string());
    let driver_checkpoint = crate::blocking::unblock(move || {
        let Some((_, log)) = super::layout::local_logs(&dir)?.into_iter().next() else {
            return Ok(None);
        };
        let (last_commit, _) = recovery::read_latest(&log)?;
        Ok::<_, recovery::RecoveryError>(
            last_commit.and_then(|c| c.driver_checkpoints.get(&name).cloned()),
        )
    })
    .await
    .map_err(|e| e.to_string())?;
    Ok(Prior {
        applied,
        driver_checkpoint,
    })
}

/// Merges the driver's Applied state (`state`) into the last commit of every local log
/// of the materialization (see the module header); `held` is its folder's lock.
async fn record_state(
    dir: &Path,
    name: &str,
    state: Option<flow::DriverCheckpoint>,
    held: &std::fs::File,
) -> Result<(), String> {
    let Some(state) = state else {
        return Ok(());
    };
    let held = held.try_clone().map_err(|e| e.to_string())?;
    let (dir, name) = (dir.to_path_buf(), name.to_string());
    let recorded = crate::blocking::unblock(move || {
        for (_, log) in super::layout::local_logs(&dir)? {
            recovery::amend_last_commit(&log, &held, |commit| {
                merge_applied_state(commit, &name, &state)
                    .map_err(recovery::RecoveryError::BadCheckpoint)
            })?;
        }
        Ok::<_, recovery::RecoveryError>(())
    })
    .await;
    recorded.map_err(|e| format!("recording the driver's Applied state: {e}"))
}

/// Merges the driver's Applied state (`state`) into `commit`, a shard log's last commit
/// (a log with none takes the default, transaction 0): what `sluice apply` does to every
/// log of the materialization, local or in a cluster's etcd, before it records the spec.
pub fn merge_applied_state(
    commit: &mut recovery::Checkpoint,
    name: &str,
    state: &flow::DriverCheckpoint,
) -> Result<(), String> {
    crate::txn::merge_driver_checkpoint(commit, name, state).map_err(|e| e.to_string())
}

/// Applies one planned materialization (its driver's Apply), returning what it did.
/// Tells the driver nothing of what was applied before: see [`apply_with`].
pub async fn apply_materialization(
    m: &PlannedMaterialization,
    action: ApplyAction,
    dry_run: bool,
    timeout: Duration,
) -> Result<String, PipelineError> {
    let prior = Prior::default();
    Ok(apply_with(m, action, dry_run, timeout, &prior).await?.0)
}

/// Applies one planned materialization, telling the driver the spec applied last and
/// the driver checkpoint (`prior`); returns what it did and the driver's Applied state.
pub async fn apply_with(
    m: &PlannedMaterialization,
    action: ApplyAction,
    dry_run: bool,
    timeout: Duration,
    prior: &Prior,
) -> Result<(String, Option<flow::DriverCheckpoint>), PipelineError> {
    let request = m::ApplyRequest {
        materialization: Some(m.spec.clone()),
        version: applied::version(&m.spec),
        dry_run,
        last_materialization: prior.applied.as_ref().map(|a| a.spec.clone()),
        last_version: (prior.applied.as_ref()).map_or_else(String::new, |a| a.version.clone()),
        driver_checkpoint_json: (prior.driver_checkpoint.as_ref())
            .map_or_else(|| b"{}".to_vec(), |cp| cp.to_string().into_bytes()),
    };
    let response = match action {
        ApplyAction::Upsert => {
            within(timeout, || "Apply".into(), m.endpoint.apply_upsert(request)).await
        }
        ApplyAction::Delete => {
            within(
                timeout,
                || "Apply (delete)".into(),
                m.endpoint.apply_delete(request),
            )
            .await
        }
    };
    let response = response.map_err(|source| PipelineError::Driver {
        materialization: m.name.clone(),
        source,
    })?;
    Ok((response.action_description, response.driver_checkpoint))
}

/// What `sluice run` does before it runs: applies each materialization that was never
/// applied (a first start) and records it; refuses one whose applied spec differs from
/// the pipeline file's ([`PipelineError::NotApplied`]). Returns (name, actions) of the
/// ones it applied.
/// A driver's retryable failure (an unreachable store) is retried as the loop retries
/// its own; `shutdown` ends the wait.
pub async fn apply_first_start(
    pipeline: &Pipeline,
    planned: &Planned,
    shutdown: &watch::Receiver<bool>,
) -> Result<Vec<(String, String)>, PipelineError> {
    let mut out = Vec::new();
    for m in &planned.materializations {
        let dir = pipeline.recovery_log().join(&m.name);
        let place = format!("materializations.{}", m.name);
        let recorded = (applied::read(&dir).await).map_err(|e| invalid(&place, e.to_string()))?;
        match applied::check(recorded.as_ref(), &m.spec) {
            applied::Check::Current => {}
            applied::Check::FirstApply => {
                // The folder's lock, as `sluice apply` holds it: the Applied state
                // goes into its logs.
                let lock = {
                    let dir = dir.clone();
                    crate::blocking::unblock(move || recovery::lock_dir(&dir)).await
                };
                let lock = lock.map_err(|e| invalid(&place, e.to_string()))?;
                let prior = (read_prior(&dir, &m.name).await).map_err(|e| invalid(&place, e))?;
                let mut retries = Retries::new();
                let (actions, state) = loop {
                    let timeout = pipeline.runtime.timeouts.driver;
                    let upsert = ApplyAction::Upsert;
                    match apply_with(m, upsert, false, timeout, &prior).await {
                        Ok(applied) => break applied,
                        Err(err) => {
                            let retryable = matches!(
                                &err, PipelineError::Driver { source, .. } if source.is_retryable()
                            );
                            if !retries.failed(retryable, shutdown)
                                || !retries.wait(&err, "applying again", shutdown).await
                            {
                                return Err(err);
                            }
                        }
                    }
                };
                (record_state(&dir, &m.name, state, &lock).await)
                    .map_err(|e| invalid(&place, e))?;
                (applied::record(&dir, &m.spec).await)
                    .map_err(|e| invalid(&place, e.to_string()))?;
                drop(lock);
                out.push((m.name.clone(), actions));
            }
            applied::Check::Differs {
                applied,
                file,
                changes,
            } => {
                return Err(PipelineError::NotApplied {
                    materialization: m.name.clone(),
                    applied,
                    file,
                    changes: applied::describe(&changes, pipeline, &m.name),
                });
            }
        }
    }
    Ok(out)
}
