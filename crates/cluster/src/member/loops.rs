//! The loops a member runs its shards in. The shards it holds of one materialization
//! share one loop, so one read of their sources, wherever their logs let one reader
//! resume them together (`txn::shared_reads`: the same committed transaction and
//! positions, or one apart with the intent between): shards that came here together,
//! from one member's loop or as the halves of one split, read their input once; a shard
//! that comes from elsewhere, at its own position, reads on its own.
//!
//! ```text
//!  claimed ──▶ waiting ──launch_waiting: read each log, group──▶ in a loop
//!  a shard of a loop asked to stop (release, split, drop, move by load): the whole
//!    loop finishes its transaction; the asked one is handed over, split or dropped,
//!    the others wait again and start anew (together: their logs agree)
//!  a loop of several shards that fails: each of its shards runs alone from then on
//!    here (whichever shard's input or store failed it, the others go on); a loop of
//!    one that fails: its shard is declined, as always
//! ```
//!
//! A shard's claim, fencing token and etcd log are its own whatever loop it runs in:
//! a loop's transaction writes each shard's log under that shard's claim.

use super::{Member, Stopping};
use crate::keys::ShardId;
use crate::log::SharedLog;
use sluice_runtime::pipeline::{Launcher, LogPlace};
use sluice_runtime::txn::{RunError, Summary, shared_reads};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// One launched loop: shards of one materialization sharing a reader.
pub(super) struct Loop {
    /// In key order.
    shards: Vec<ShardId>,
    stop: watch::Sender<bool>,
    task: JoinHandle<(Summary, Result<(), RunError>)>,
}

impl Loop {
    /// Asks the loop to finish its transaction in progress and end.
    pub(super) fn stop(&self) {
        self.stop.send_replace(true);
    }

    /// What the member's summary lists it as: `<mat>/<range>`, the ranges of several
    /// shards joined by `+`.
    fn label(&self) -> String {
        let ranges: Vec<String> = self.shards.iter().map(|s| s.range.id()).collect();
        format!("{}/{}", self.shards[0].materialization, ranges.join("+"))
    }
}

impl Member {
    /// Starts the loops of the shards waiting for one: per materialization, each group
    /// of them one reader can resume (from their logs as etcd holds them now) runs as
    /// one loop; a shard that ran alone before goes on alone.
    pub(super) async fn launch_waiting(&mut self, launcher: &Launcher) {
        let waiting = std::mem::take(&mut self.waiting);
        let mut by_materialization = BTreeMap::<String, Vec<ShardId>>::new();
        for shard in waiting {
            match self.held.get(&shard) {
                Some(running) if running.stopping.is_none() && running.in_loop.is_none() => {
                    by_materialization
                        .entry(shard.materialization.clone())
                        .or_default()
                        .push(shard);
                }
                _ => {}
            }
        }
        for (materialization, shards) in by_materialization {
            // Its sources' addresses free before they bind them.
            self.standbys.stop_for(&materialization).await;
            for group in self.groups(shards).await {
                self.start_loop(launcher, group);
            }
        }
    }

    /// `shards` (of one materialization, in key order) as the groups they run in: those
    /// running alone here each on its own, the others as `txn::shared_reads` groups
    /// them by their logs. A log that cannot be read now leaves its shard alone (its
    /// loop's recovery reads it again, with retries).
    async fn groups(&self, shards: Vec<ShardId>) -> Vec<Vec<ShardId>> {
        let (alone, sharing): (Vec<_>, Vec<_>) = shards
            .into_iter()
            .partition(|s| self.held.get(s).is_some_and(|r| r.alone));
        let mut groups: Vec<Vec<ShardId>> = alone.into_iter().map(|s| vec![s]).collect();
        let mut readable = Vec::new();
        let mut recovered = Vec::new();
        for shard in sharing {
            let token = self.held[&shard].token;
            let log = SharedLog::new(self.etcd.clone(), &self.keys, &shard, token);
            match log.read().await {
                Ok(state) => {
                    readable.push(shard);
                    recovered.push(state);
                }
                Err(e) => {
                    tracing::debug!(%shard, "reading its log to group it: {e}; it runs alone");
                    groups.push(vec![shard]);
                }
            }
        }
        for group in shared_reads(&recovered) {
            groups.push(group.into_iter().map(|i| readable[i].clone()).collect());
        }
        groups
    }

    /// Launches one loop over `group` (shards of one materialization, in key order),
    /// each over its etcd log under its own claim.
    fn start_loop(&mut self, launcher: &Launcher, mut group: Vec<ShardId>) {
        group.sort_by_key(|s| s.range.key_begin);
        let materialization = group[0].materialization.clone();
        let ranges = (group.iter())
            .map(|shard| {
                let token = self.held[shard].token;
                let log = SharedLog::new(self.etcd.clone(), &self.keys, shard, token);
                tracing::info!(%shard, token, "recovering from its log");
                (shard.range, LogPlace::Shared(Arc::new(log)))
            })
            .collect();
        if group.len() > 1 {
            let shards: Vec<String> = group.iter().map(|s| s.range.id()).collect();
            tracing::info!(
                materialization,
                shards = shards.join(", "),
                "these shards share one read of their sources"
            );
        }
        let (stop, stopped) = watch::channel(false);
        let run = launcher.launch(&materialization, ranges, stopped);
        // Its end wakes the member, which hands shards over at once.
        let ended = self.wake.notifier();
        let task = tokio::spawn(async move {
            let outcome = run.await;
            ended.notify_one();
            outcome
        });
        let id = self.next_loop;
        self.next_loop += 1;
        for shard in &group {
            if let Some(running) = self.held.get_mut(shard) {
                running.in_loop = Some(id);
            }
        }
        self.loops.insert(
            id,
            Loop {
                shards: group,
                stop,
                task,
            },
        );
    }

    /// Asks `shard` to stop for `why`: its loop (with the shards it shares it with)
    /// finishes its transaction in progress and ends.
    pub(super) fn stop(&mut self, shard: &ShardId, why: Stopping) {
        let Some(running) = self.held.get_mut(shard) else {
            return;
        };
        tracing::info!(%shard, "{}", match why {
            Stopping::Release => "another member should run it: finishing the transaction in progress, then handing it over",
            Stopping::Split => "asked to split: finishing the transaction in progress, then splitting",
            Stopping::Drop => "its assignment is no longer this member's: stopping",
        });
        running.stopping = Some(why);
        self.waiting.remove(shard);
        if let Some(lp) = running.in_loop.and_then(|id| self.loops.get(&id)) {
            lp.stop();
        }
    }

    /// Ends what has stopped: shards claimed only to split them, and loops that
    /// returned. Each shard asked to stop is handed over, split or forgotten; the others
    /// of its loop wait to start again; those of a shared loop that failed run alone
    /// from now on; a shard whose own loop failed is released and declined for a
    /// while ([`Member::decline`]); the member's other shards run on.
    pub(super) async fn reap(&mut self) {
        let unlaunched: Vec<ShardId> = (self.held.iter())
            .filter(|(id, r)| r.in_loop.is_none() && !self.waiting.contains(*id))
            .map(|(id, _)| id.clone())
            .collect();
        for shard in unlaunched {
            self.end_shard(&shard, Ok(())).await;
        }
        let done: Vec<u64> = (self.loops.iter())
            .filter(|(_, lp)| lp.task.is_finished())
            .map(|(&id, _)| id)
            .collect();
        for id in done {
            let lp = self.loops.remove(&id).expect("listed above");
            let label = lp.label();
            let (summary, result) = match lp.task.await {
                Ok(outcome) => outcome,
                Err(join) => (
                    Summary::default(),
                    Err(RunError::Internal(format!("the shards' task: {join}"))),
                ),
            };
            self.add(&label, &summary);
            let asked =
                (lp.shards.iter()).any(|s| self.held.get(s).is_some_and(|r| r.stopping.is_some()));
            let shared = lp.shards.len() > 1;
            for shard in &lp.shards {
                let Some(running) = self.held.get_mut(shard) else {
                    continue;
                };
                running.in_loop = None;
                if running.stopping.is_some() {
                    self.end_shard(shard, result.as_ref().map(|_| ())).await;
                    continue;
                }
                match &result {
                    // Another shard of its loop stopped: this one runs on.
                    Ok(()) if asked => {
                        self.waiting.insert(shard.clone());
                    }
                    Err(e) if shared => {
                        tracing::warn!(
                            %shard,
                            "the loop it shared with {} failed: {e}; it runs alone from now on",
                            label
                        );
                        running.alone = true;
                        self.waiting.insert(shard.clone());
                    }
                    result => self.end_shard(shard, result.as_ref().map(|_| ())).await,
                }
            }
        }
    }

    /// `shard`'s loop has ended with `result`: hands it over, splits it, forgets it,
    /// or declines it.
    async fn end_shard(&mut self, shard: &ShardId, result: Result<(), &RunError>) {
        let Some(running) = self.held.remove(shard) else {
            return;
        };
        if !(self.held.keys()).any(|s| s.materialization == shard.materialization) {
            self.standbys.resume_for(&shard.materialization);
        }
        match (running.stopping, result) {
            (Some(Stopping::Drop), result) => {
                if let Err(e) = result {
                    tracing::info!(%shard, "stopped: {e}");
                }
            }
            (Some(Stopping::Split), Ok(())) => {
                if let Err(e) = self.split(shard, running.token).await {
                    tracing::warn!(%shard, "splitting: {e}; the next holder splits it");
                    self.hand_over(shard, running.token).await;
                }
            }
            (Some(Stopping::Release) | None, Ok(())) => {
                self.hand_over(shard, running.token).await;
            }
            (_, Err(why)) => self.decline(shard, running.token, why).await,
        }
    }

    /// Stops every loop, each after its transaction in progress (a fenced one fails),
    /// and adds what each committed to the member's summary.
    pub(super) async fn stop_all(&mut self) {
        for lp in self.loops.values() {
            lp.stop();
        }
        for (_, lp) in std::mem::take(&mut self.loops) {
            let label = lp.label();
            if let Ok((summary, _)) = lp.task.await {
                self.add(&label, &summary);
            }
        }
        self.held.clear();
        self.waiting.clear();
    }
}
