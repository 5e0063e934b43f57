//! Moving shards: a shard handed over to its owner, moved to the least busy member by
//! load (a placement with cooldowns), and split into its halves, asked for (`sluice
//! shards split`) or automatic (`cluster.autosplit`). Every write holds only while this
//! member's claim of the shard is current.

use super::{ClusterError, Member, invalid};
use crate::autosplit;
use crate::etcd::{Cond, Op};
use crate::keys::{ShardId, ShardSpec};
use crate::log::SharedLog;
use std::time::{Duration, Instant};

impl Member {
    /// Moves `shard`, held here, to member `to` by load ([`crate::balance`]): writes its
    /// placement with `to`'s own lease, so that it ends when `to` leaves, and both
    /// members' cooldowns with a lease of `cluster.balance_interval`, while this
    /// member's claim is current, `to` is still the member whose key was read (the same
    /// lease), and neither member is cooling down. The next look releases it, as for
    /// any shard another member owns.
    pub(super) async fn place(&self, shard: &ShardId, to: &str) -> Result<(), ClusterError> {
        let Some(running) = self.held.get(shard) else {
            return Ok(());
        };
        let Some(target) = self.etcd.get(&self.keys.member(to)).await? else {
            return Ok(()); // It left since the view: the next view plans without it.
        };
        let interval = self.balance_interval.max(Duration::from_secs(1));
        let cooldown = self.etcd.grant(interval).await?;
        let cool = |member: &str| Op::Put {
            key: self.keys.cooldown(member),
            value: shard.to_string().into_bytes(),
            lease: cooldown,
        };
        let when = vec![
            Cond::ModRevision(self.keys.assignment(shard), running.token),
            Cond::ModRevision(self.keys.member(to), target.mod_revision),
            Cond::Absent(self.keys.cooldown(&self.me)),
            Cond::Absent(self.keys.cooldown(to)),
        ];
        let put = Op::Put {
            key: self.keys.placement(shard),
            value: to.as_bytes().to_vec(),
            lease: target.lease,
        };
        let placed = self
            .etcd
            .txn(when, vec![put, cool(&self.me), cool(to)], vec![]);
        if placed.await?.succeeded {
            tracing::info!(%shard, to, "moving it by load: it is the busiest member's, {to} is the least busy");
        } else {
            let _ = self.etcd.revoke(cooldown).await;
        }
        Ok(())
    }

    /// Deletes this member's assignment of `shard` (if still its own), so that the
    /// shard's owner claims it without waiting for the lease.
    pub(super) async fn hand_over(&self, shard: &ShardId, token: i64) {
        let key = self.keys.assignment(shard);
        let deleted = (self.etcd)
            .txn(
                vec![Cond::ModRevision(key.clone(), token)],
                vec![Op::Delete(key), Op::Delete(self.keys.status(shard))],
                vec![],
            )
            .await;
        if let Err(e) = deleted {
            tracing::warn!(%shard, "handing over: {e}; it moves once the lease expires");
        }
    }

    /// Replaces `shard`, whose loop has stopped, by its halves: each half's log starts
    /// as a copy of the shard's (its last commit, and its pending intent: each half
    /// replays it and keeps its own keys), in one transaction that holds only while
    /// this member's claim is current. The halves' first Open fences the shard's range
    /// at the store and recovers from the narrowest checkpoint covering each half.
    pub(super) async fn split(&self, shard: &ShardId, token: i64) -> Result<(), ClusterError> {
        let log = SharedLog::new(self.etcd.clone(), &self.keys, shard, token);
        let (commit, intent) = log
            .read()
            .await
            .map_err(|e| invalid(shard.to_string(), e.to_string()))?;
        let Some((lo, hi)) = shard.range.halves() else {
            return Err(invalid(
                shard.to_string(),
                "a range of one key hash cannot split",
            ));
        };
        let mut then = Vec::new();
        for half in [lo, hi] {
            let child = ShardId {
                materialization: shard.materialization.clone(),
                range: half,
            };
            then.push(Op::Put {
                key: self.keys.shard(&child),
                value: serde_json::to_vec(&ShardSpec::default()).expect("serializes"),
                lease: 0,
            });
            then.extend(SharedLog::copy_ops(
                &self.keys.log(&child),
                commit.as_ref(),
                intent.as_ref(),
            ));
        }
        then.extend([
            Op::Delete(self.keys.shard(shard)),
            Op::DeletePrefix(self.keys.log(shard)),
            Op::Delete(self.keys.status(shard)),
            Op::Delete(self.keys.placement(shard)),
            Op::Delete(self.keys.assignment(shard)),
        ]);
        let assignment = self.keys.assignment(shard);
        let done = (self.etcd)
            .txn(vec![Cond::ModRevision(assignment, token)], then, vec![])
            .await?;
        if !done.succeeded {
            return Err(invalid(shard.to_string(), "fenced before it could split"));
        }
        tracing::info!(
            %shard,
            at = commit.as_ref().map_or(0, |c| c.txn),
            "split into {} and {}",
            lo.id(),
            hi.id()
        );
        Ok(())
    }

    /// Marks for a split each shard held here whose lag has stayed high for
    /// `cluster.autosplit.for` ([`crate::autosplit`]), while its materialization has room
    /// under `max_shards`: the next look splits it, as `sluice shards split` would.
    pub(super) async fn split_lagging(&mut self) -> Result<(), ClusterError> {
        let Some(rule) = self.autosplit.clone() else {
            return Ok(());
        };
        let now = Instant::now();
        let due: Vec<(ShardId, i64)> = (self.held.iter())
            .filter(|(id, _)| !self.singletons.contains(&id.materialization))
            .filter(|(_, r)| r.stopping.is_none() && autosplit::due(&rule, r.lagging_since, now))
            .map(|(id, r)| (id.clone(), r.token))
            .collect();
        for (shard, token) in due {
            // The last mark first, then the shards: a mark made before it is counted,
            // one made after it fails this one's condition.
            let mark = self.keys.autosplit(&shard.materialization);
            let last = match self.etcd.get(&mark).await? {
                Some(kv) => Cond::ModRevision(mark.clone(), kv.mod_revision),
                None => Cond::Absent(mark.clone()),
            };
            let under = format!("{}{}/", self.keys.shards(), shard.materialization);
            let (specs, _) = self.etcd.get_prefix(&under).await?;
            let splitting = (specs.iter())
                .filter(|kv| {
                    serde_json::from_slice::<ShardSpec>(&kv.value).is_ok_and(|s| s.splitting)
                })
                .count();
            if !autosplit::room(&rule, specs.len(), splitting) {
                continue;
            }
            let spec = serde_json::to_vec(&ShardSpec { splitting: true }).expect("serializes");
            let marked = (self.etcd)
                .txn(
                    vec![Cond::ModRevision(self.keys.assignment(&shard), token), last],
                    vec![
                        Op::Put {
                            key: self.keys.shard(&shard),
                            value: spec,
                            lease: 0,
                        },
                        Op::Put {
                            key: mark,
                            value: shard.to_string().into_bytes(),
                            lease: 0,
                        },
                    ],
                    vec![],
                )
                .await?;
            if marked.succeeded {
                tracing::info!(
                    %shard,
                    "its lag stayed above {} for {}s: splitting it (cluster.autosplit)",
                    rule.lag_above,
                    rule.sustained.as_secs()
                );
                if let Some(running) = self.held.get_mut(&shard) {
                    running.lagging_since = None;
                }
            }
        }
        Ok(())
    }
}
