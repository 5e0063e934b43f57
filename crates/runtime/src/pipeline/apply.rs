//! Apply: each planned materialization's resources created or updated (or deleted) by
//! its driver, and the spec recorded as applied beside its recovery log
//! ([`crate::applied`]); a first start applies, a changed pipeline file is refused.

use super::error::{PipelineError, invalid};
use super::plan::{Planned, PlannedMaterialization};
use super::retries::Retries;
use crate::applied;
use crate::config::Pipeline;
use crate::metrics::ended;
use crate::recovery;
use sluice_driver_sdk::error::within;
use sluice_proto::materialize as m;
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
        let mut actions =
            apply_materialization(m, action, dry_run, pipeline.runtime.timeouts.driver).await?;
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

/// Applies one planned materialization (its driver's Apply), returning what it did.
pub async fn apply_materialization(
    m: &PlannedMaterialization,
    action: ApplyAction,
    dry_run: bool,
    timeout: Duration,
) -> Result<String, PipelineError> {
    let request = m::ApplyRequest {
        materialization: Some(m.spec.clone()),
        version: applied::version(&m.spec),
        dry_run,
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
    Ok(response.action_description)
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
                let mut retries = Retries::new();
                let actions = loop {
                    let timeout = pipeline.runtime.timeouts.driver;
                    match apply_materialization(m, ApplyAction::Upsert, false, timeout).await {
                        Ok(actions) => break actions,
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
                (applied::record(&dir, &m.spec).await)
                    .map_err(|e| invalid(&place, e.to_string()))?;
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
