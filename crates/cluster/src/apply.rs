//! `sluice apply [--delete] [--dry-run]` of a pipeline file with `cluster:`: its members
//! keep the applied spec and the shards' recovery logs in etcd (`keys.rs`), so a change
//! is recorded there and a reset forgets them there. The etcd side of
//! `sluice_runtime::pipeline::apply`, which does the same to a single process's folder:
//!
//! ```text
//!  P/lock/apply/<mat>  taken with this command's lease      a member joining waits for
//!                                                           it in its first apply
//!  read  P/members/*, P/assign/<mat>/*, P/shards/<mat>/*, each shard log's commit,
//!        P/applied/<mat>, P/init/<mat>
//!  refuse while any member is registered or any shard of <mat> is assigned
//!  driver Apply (upsert | delete), told the applied spec and the first shard's driver
//!        checkpoint (the prior a single process reads from its folder)
//!  ONE txn  if  the lock is still ours, no key under P/members/ nor P/assign/<mat>/,
//!               the shards and init are as read, and every key written is as read
//!           then  upsert: each shard log's last commit with the driver's Applied state
//!                         merged (the runtime's merge), and P/applied/<mat>
//!                 delete: every key of <mat> (`Keys::of_materialization`)
//!  release the lock
//! ```
//!
//! Refused on any registered member, not only on holders: a member takes shards at any
//! moment. One that registers after the read takes the apply lock in its first apply
//! before it claims anything, so no shard can be claimed before the write; and the txn
//! compares the whole members and assignments prefixes, which holds that even if this
//! command's lease lapsed meanwhile. An upsert moves
//! the logs and the applied spec in one txn (a single process amends its logs first,
//! then writes the record). A dry run takes no lock and writes nothing, and says who
//! would refuse it.
//!
//! After a delete, the members' next run is a first start: first shards made, the spec
//! applied, every source read from the beginning into the emptied store; the deployment
//! id is the cluster's and stays. A raised backfill counter needs nothing more here: the
//! driver rebuilds the binding's resource at Apply, and every shard's loop restarts the
//! binding's sources from the checkpoint it recovers, as a single process's loop does
//! (the runtime's `txn::backfill`).

use crate::etcd::{Cond, Etcd, EtcdError, KeyValue, Op};
use crate::keys::{Keys, ShardId};
use crate::member::{ClusterError, cluster_of, connect, decode_applied, invalid, try_lock};
use sluice_runtime::applied;
use sluice_runtime::config::Pipeline;
use sluice_runtime::pipeline::{self, ApplyAction, Planned, PlannedMaterialization, Prior};
use sluice_runtime::recovery::Checkpoint;
use std::time::Duration;

/// Applies every materialization of `planned` on the cluster's etcd and store (see the
/// module header). Returns (name, what the driver did and which etcd keys changed).
pub async fn apply(
    pipeline: &Pipeline,
    planned: &Planned,
    action: ApplyAction,
    dry_run: bool,
) -> Result<Vec<(String, String)>, ClusterError> {
    let cluster = cluster_of(pipeline);
    let (etcd, keys) = connect(cluster)?;
    let lease = match dry_run {
        true => None,
        false => Some(Lease::grant(&etcd, cluster.lease_ttl).await?),
    };
    let mut out = Vec::new();
    let mut result = Ok(());
    for m in &planned.materializations {
        let apply = Apply {
            pipeline,
            etcd: &etcd,
            keys: &keys,
            m,
            action,
            place: format!("materializations.{}", m.name),
        };
        match apply.locked(lease.as_ref()).await {
            Ok(said) => out.push((m.name.clone(), said)),
            Err(e) => {
                result = Err(e);
                break;
            }
        }
    }
    if let Some(lease) = lease {
        lease.end(&etcd).await;
    }
    result.map(|()| out)
}

/// This command's lease, renewed until it ends: its apply locks go with it should the
/// command die.
struct Lease {
    id: i64,
    holder: String,
    renew: tokio::task::JoinHandle<()>,
}

impl Lease {
    async fn grant(etcd: &Etcd, ttl: Duration) -> Result<Lease, ClusterError> {
        let id = etcd.grant(ttl).await?;
        let renewing = etcd.clone();
        let renew = tokio::spawn(async move {
            loop {
                tokio::time::sleep(ttl / 3).await;
                if let Err(e) = renewing.keep_alive(id).await {
                    tracing::warn!("renewing the apply lock's lease: {e}");
                }
            }
        });
        Ok(Lease {
            id,
            holder: format!("sluice apply (pid {}, lease {id:x})", std::process::id()),
            renew,
        })
    }

    /// Stops renewing and revokes the lease: whatever lock it still held is released.
    async fn end(self, etcd: &Etcd) {
        self.renew.abort();
        if let Err(e) = etcd.revoke(self.id).await {
            tracing::warn!("releasing the apply lock's lease: {e}; it expires by itself");
        }
    }
}

/// What the cluster's etcd holds of one materialization, as read before its Apply.
struct Seen {
    members: Vec<String>,
    /// (shard id, member) of each assignment.
    assigned: Vec<(String, String)>,
    shards: Vec<SeenShard>,
    applied: Option<KeyValue>,
    init: Option<KeyValue>,
}

/// A shard of the materialization and its log's last commit, with the revisions read.
struct SeenShard {
    id: ShardId,
    /// Of `P/shards/<mat>/<id>`.
    revision: i64,
    /// `P/log/<mat>/<id>/commit`.
    commit_key: String,
    /// Of the commit key, 0 when absent.
    commit_revision: i64,
    commit: Option<Checkpoint>,
}

/// One materialization's apply on the cluster.
struct Apply<'a> {
    pipeline: &'a Pipeline,
    etcd: &'a Etcd,
    keys: &'a Keys,
    m: &'a PlannedMaterialization,
    action: ApplyAction,
    /// Where errors point in the pipeline file.
    place: String,
}

impl Apply<'_> {
    /// Applies under the materialization's lock (`lease`: none for a dry run).
    async fn locked(&self, lease: Option<&Lease>) -> Result<String, ClusterError> {
        let Some(lease) = lease else {
            return self.applied(None).await;
        };
        let lock = self.keys.apply_lock(&self.m.name);
        let etcd_failed = |e: EtcdError| invalid(&self.place, format!("taking {lock}: {e}"));
        let held = try_lock(self.etcd, self.keys, &self.m.name, &lease.holder, lease.id);
        if let Some(holder) = held.await.map_err(etcd_failed)? {
            return Err(invalid(
                &self.place,
                format!(
                    "{lock} is held by {holder}: a member joining the cluster is applying \
                     it, or another `sluice apply` runs; stop the members (or let that \
                     apply end) and apply again"
                ),
            ));
        }
        let result = self.applied(Some((&lock, &lease.holder))).await;
        let release = Op::Delete(lock.clone());
        let ours = Cond::Value(lock.clone(), lease.holder.clone().into_bytes());
        if let Err(e) = self.etcd.txn(vec![ours], vec![release], vec![]).await {
            tracing::warn!("releasing {lock}: {e}; it goes with this command's lease");
        }
        result
    }

    /// Reads what the cluster holds, refuses while it runs the materialization, applies
    /// the driver's Apply and then writes etcd in one txn (`lock`: the lock's key and
    /// our value; none for a dry run, which writes nothing).
    async fn applied(&self, lock: Option<(&String, &String)>) -> Result<String, ClusterError> {
        let name = &self.m.name;
        let seen = self.read().await?;
        let refused = refusal(self.keys, name, &seen);
        if let (Some(why), Some(_)) = (&refused, lock) {
            return Err(invalid(&self.place, why.clone()));
        }
        let prior = Prior {
            applied: decode_applied(self.keys, name, seen.applied.as_ref())?,
            driver_checkpoint: (seen.shards.first())
                .and_then(|shard| shard.commit.as_ref())
                .and_then(|c| c.driver_checkpoints.get(name).cloned()),
        };
        if self.action == ApplyAction::Upsert {
            let last = prior.applied.as_ref().map(|a| &a.spec);
            let rebuilds = self.m.rebuilds_on_backfill;
            (applied::check_backfills(self.pipeline, last, &self.m.spec, rebuilds))
                .map_err(|e| invalid(&self.place, e))?;
        }
        let timeout = self.pipeline.runtime.timeouts.driver;
        let dry_run = lock.is_none();
        let (actions, state) =
            pipeline::apply_with(self.m, self.action, dry_run, timeout, &prior).await?;
        let mut when = self.conditions(&seen);
        let (then, said) = match self.action {
            ApplyAction::Upsert => {
                // The Applied state into each shard log's last commit (none yet: one of
                // transaction 0), as a single process amends its logs.
                let mut commits = Vec::new();
                for shard in &seen.shards {
                    let Some(state) = &state else { break };
                    let (id, key) = (&shard.id, &shard.commit_key);
                    let mut commit = shard.commit.clone().unwrap_or_default();
                    (pipeline::merge_applied_state(&mut commit, name, state)).map_err(|e| {
                        let why = format!(
                            "merging the driver's Applied state into {key} (shard {id}): {e}"
                        );
                        invalid(&self.place, why)
                    })?;
                    commits.push((key.clone(), shard.commit_revision, commit));
                }
                self.upsert(&seen, commits, &mut when, dry_run)
            }
            ApplyAction::Delete => self.delete(dry_run).await?,
        };
        let mut lines: Vec<String> = [actions.trim(), &said]
            .into_iter()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        match lock {
            None => lines.extend(refused.map(|why| format!("(would be refused now: {why})"))),
            Some((key, ours)) => {
                when.push(Cond::Value(key.clone(), ours.clone().into_bytes()));
                let written = self.etcd.txn(when, then, vec![]).await;
                let written = written.map_err(|e| {
                    invalid(
                        &self.place,
                        format!("writing the cluster's etcd ({said}): {e}; the driver's Apply was made: apply again"),
                    )
                })?;
                if !written.succeeded {
                    return Err(invalid(
                        &self.place,
                        format!(
                            "the cluster's etcd changed while applying (a member started, \
                             a shard was claimed or split, or {key} was lost with this \
                             command's lease), so nothing was written to it though the \
                             driver's Apply was made (not done: {said}): stop every member \
                             and apply again"
                        ),
                    ));
                }
            }
        }
        Ok(lines.join("\n"))
    }

    async fn read(&self) -> Result<Seen, ClusterError> {
        let (keys, name) = (self.keys, &self.m.name);
        let failed = |key: &str| {
            let key = key.to_string();
            move |e: EtcdError| invalid(&self.place, format!("reading {key}: {e}"))
        };
        let get_prefix = async |prefix: &str| {
            let (kvs, _) = self.etcd.get_prefix(prefix).await.map_err(failed(prefix))?;
            Ok::<_, ClusterError>(kvs)
        };
        let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
        let members = (get_prefix(&keys.members()).await?.iter())
            .map(|kv| text(&kv.key[keys.members().len()..]))
            .collect();
        let assignments = keys.of(&keys.assignments(), name);
        let assigned = (get_prefix(&assignments).await?.iter())
            .map(|kv| (text(&kv.key[assignments.len()..]), text(&kv.value)))
            .collect();
        let mut shards = Vec::new();
        for kv in get_prefix(&keys.of(&keys.shards(), name)).await? {
            let key = text(&kv.key);
            let Some((_, range)) = keys.parse_shard(&keys.shards(), &key) else {
                continue;
            };
            let id = ShardId {
                materialization: name.clone(),
                range,
            };
            let commit_key = format!("{}commit", keys.log(&id));
            let commit = self
                .etcd
                .get(&commit_key)
                .await
                .map_err(failed(&commit_key))?;
            let commit_revision = revision(commit.as_ref());
            let commit = match commit {
                None => None,
                Some(kv) => Some(serde_json::from_slice(&kv.value).map_err(|e| {
                    invalid(
                        &self.place,
                        format!(
                            "shard {id}'s last commit in etcd ({commit_key}) does not read: {e}"
                        ),
                    )
                })?),
            };
            shards.push(SeenShard {
                id,
                revision: kv.mod_revision,
                commit_key,
                commit_revision,
                commit,
            });
        }
        let get = async |key: String| self.etcd.get(&key).await.map_err(failed(&key));
        Ok(Seen {
            members,
            assigned,
            shards,
            applied: get(keys.applied(name)).await?,
            init: get(keys.init(name)).await?,
        })
    }

    /// What every write of the txn holds only if: no member is registered and no shard
    /// of the materialization assigned, and the shards and the first-shard marker are as
    /// read (no split, no first start).
    fn conditions(&self, seen: &Seen) -> Vec<Cond> {
        let mut when = vec![
            Cond::NoneUnder(self.keys.members()),
            Cond::NoneUnder(self.keys.of(&self.keys.assignments(), &self.m.name)),
        ];
        for shard in &seen.shards {
            when.push(Cond::ModRevision(
                self.keys.shard(&shard.id),
                shard.revision,
            ));
        }
        let init = self.keys.init(&self.m.name);
        when.push(Cond::ModRevision(init, revision(seen.init.as_ref())));
        when
    }

    /// The upsert's writes: each shard log's last commit with the Applied state merged
    /// (`commits`: key, mod revision as read, the new commit), then the applied spec,
    /// each only if unchanged since read (added to `when`).
    fn upsert(
        &self,
        seen: &Seen,
        commits: Vec<(String, i64, Checkpoint)>,
        when: &mut Vec<Cond>,
        dry_run: bool,
    ) -> (Vec<Op>, String) {
        let name = &self.m.name;
        let mut then = Vec::new();
        for (key, revision, commit) in commits {
            when.push(Cond::ModRevision(key.clone(), revision));
            then.push(Op::Put {
                key,
                value: serde_json::to_vec(&commit).expect("a checkpoint serializes"),
                lease: 0,
            });
        }
        let applied = self.keys.applied(name);
        when.push(Cond::ModRevision(
            applied.clone(),
            revision(seen.applied.as_ref()),
        ));
        then.push(Op::Put {
            key: applied.clone(),
            value: applied::encode(&self.m.spec),
            lease: 0,
        });
        let verb = if dry_run { "would amend" } else { "amended" };
        let logs = match then.len() - 1 {
            0 => String::new(),
            n => format!(
                ", and the last commit of {n} shard log(s) with the driver's Applied state \
                 ({}*/commit)",
                self.keys.of(&self.keys.logs(), name)
            ),
        };
        (then, format!("{verb} the cluster's etcd: {applied}{logs}"))
    }

    /// The delete's writes: every key of the materialization; and how many each of its
    /// folders holds now.
    async fn delete(&self, dry_run: bool) -> Result<(Vec<Op>, String), ClusterError> {
        let mut then = Vec::new();
        let (mut total, mut found) = (0, Vec::new());
        for key in self.keys.of_materialization(&self.m.name) {
            let failed = |e: EtcdError| invalid(&self.place, format!("reading {key}: {e}"));
            if key.ends_with('/') {
                let (kvs, _) = self.etcd.get_prefix(&key).await.map_err(failed)?;
                if !kvs.is_empty() {
                    found.push(format!("{key}* ({})", kvs.len()));
                }
                total += kvs.len();
                then.push(Op::DeletePrefix(key));
            } else {
                if self.etcd.get(&key).await.map_err(failed)?.is_some() {
                    found.push(key.clone());
                    total += 1;
                }
                then.push(Op::Delete(key));
            }
        }
        let verb = if dry_run { "would remove" } else { "removed" };
        let said = match found.is_empty() {
            true => format!(
                "{verb} no key of the cluster's etcd (it holds none of {})",
                self.m.name
            ),
            false => format!(
                "{verb} {total} key(s) of the cluster's etcd: {}",
                found.join(", ")
            ),
        };
        Ok((then, said))
    }
}

/// Why applying now is refused, if it is: the cluster runs the materialization (pure).
fn refusal(keys: &Keys, name: &str, seen: &Seen) -> Option<String> {
    if seen.members.is_empty() && seen.assigned.is_empty() {
        return None;
    }
    let mut running = Vec::new();
    if !seen.members.is_empty() {
        running.push(format!(
            "member(s) {} are registered ({}*)",
            seen.members.join(", "),
            keys.members()
        ));
    }
    if !seen.assigned.is_empty() {
        let held: Vec<String> = (seen.assigned.iter())
            .map(|(shard, member)| format!("{shard} by {member}"))
            .collect();
        running.push(format!(
            "its shard(s) are held: {} ({}*)",
            held.join(", "),
            keys.of(&keys.assignments(), name)
        ));
    }
    Some(format!(
        "the cluster runs it: {}; stop every member (their `sluice run` of this pipeline \
         file) and apply again (a member killed rather than stopped stays registered until \
         its lease expires, cluster.lease_ttl after)",
        running.join("; ")
    ))
}

/// A key's mod revision as read, 0 when absent (what [`Cond::ModRevision`] takes).
fn revision(kv: Option<&KeyValue>) -> i64 {
    kv.map_or(0, |kv| kv.mod_revision)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(members: &[&str], assigned: &[(&str, &str)]) -> Seen {
        Seen {
            members: members.iter().map(|m| m.to_string()).collect(),
            assigned: (assigned.iter())
                .map(|(s, m)| (s.to_string(), m.to_string()))
                .collect(),
            shards: Vec::new(),
            applied: None,
            init: None,
        }
    }

    #[test]
    fn any_registered_member_or_held_shard_refuses_naming_them() {
        let keys = Keys::new("/sluice/p");
        assert_eq!(refusal(&keys, "views", &seen(&[], &[])), None);
        let idle = refusal(&keys, "views", &seen(&["a"], &[])).unwrap();
        assert!(
            idle.contains("member(s) a are registered (/sluice/p/members/*)"),
            "{idle}"
        );
        assert!(idle.contains("stop every member"), "{idle}");
        let held = refusal(
            &keys,
            "views",
            &seen(&["a", "b"], &[("00000000-ffffffff", "b")]),
        );
        let held = held.unwrap();
        assert!(held.contains("member(s) a, b"), "{held}");
        assert!(
            held.contains("00000000-ffffffff by b (/sluice/p/assign/views/*)"),
            "{held}"
        );
    }
}
