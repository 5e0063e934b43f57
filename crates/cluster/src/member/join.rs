//! What a member does once, as it joins: each materialization's first shards (once for
//! the cluster), the cluster's deployment id (made once in etcd), and the first Apply of
//! each spec (once for the cluster, under an etcd lock held with the member's lease).

use super::{ClusterError, Member, invalid};
use crate::etcd::{Cond, Etcd, EtcdError, KeyValue, Op};
use crate::keys::{Keys, ShardDef, ShardId, ShardSpec};
use sluice_runtime::applied::{self, Applied};
use sluice_runtime::config::Pipeline;
use sluice_runtime::pipeline::{self, ApplyAction, Planned};
use std::time::Duration;

impl Member {
    /// Makes materialization `name`'s first shards, unless the cluster has seen it.
    pub(super) async fn first_shards(&self, name: &str, count: u32) -> Result<(), ClusterError> {
        let mut then = vec![Op::Put {
            key: self.keys.init(name),
            value: Vec::new(),
            lease: 0,
        }];
        for range in ShardDef::split_evenly(count) {
            let shard = ShardId {
                materialization: name.to_string(),
                range,
            };
            then.push(Op::Put {
                key: self.keys.shard(&shard),
                value: serde_json::to_vec(&ShardSpec::default()).expect("serializes"),
                lease: 0,
            });
        }
        let made = (self.etcd)
            .txn(vec![Cond::Absent(self.keys.init(name))], then, vec![])
            .await?;
        if made.succeeded {
            tracing::info!(materialization = %name, "made its first {count} shard(s)");
        }
        Ok(())
    }

    /// The cluster's deployment id, what epoch sinks name their staging by: made once
    /// by the first member that needs it (a CAS on `P/deployment`), read by every other,
    /// so each holder of a shard names, finds and cleans its staging as the last one
    /// did. Kept beside the shards' logs, never on a member's disk.
    pub(super) async fn deployment_id(&self) -> Result<String, ClusterError> {
        let key = self.keys.deployment();
        let minted = sluice_runtime::recovery::new_deployment_id();
        let made = (self.etcd)
            .txn(
                vec![Cond::Absent(key.clone())],
                vec![Op::Put {
                    key: key.clone(),
                    value: minted.clone().into_bytes(),
                    lease: 0,
                }],
                vec![Op::Get(key.clone())],
            )
            .await?;
        if made.succeeded {
            tracing::info!(deployment = %minted, "made the cluster's deployment id");
            return Ok(minted);
        }
        let kept = made.got.into_iter().flatten().next().map(|kv| kv.value);
        match kept.map(String::from_utf8) {
            Some(Ok(id)) if !id.is_empty() => Ok(id),
            _ => Err(invalid(
                key,
                "holds no deployment id sluice wrote (sluice makes it once and only \
                 reads it after)",
            )),
        }
    }

    /// Applies each never-applied materialization once for the whole cluster (under
    /// an etcd lock held with this member's lease), and refuses one whose applied spec
    /// differs from the file's, as a single process does.
    pub(super) async fn first_apply(
        &self,
        pipeline: &Pipeline,
        planned: &Planned,
    ) -> Result<(), ClusterError> {
        for m in &planned.materializations {
            let lock = self.keys.apply_lock(&m.name);
            loop {
                let held = try_lock(&self.etcd, &self.keys, &m.name, &self.me, self.lease);
                if held.await.map_err(|e| self.lease_lost(e))?.is_none() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            let result = self.apply_locked(pipeline, m).await;
            (self.etcd)
                .txn(vec![], vec![Op::Delete(lock.clone())], vec![])
                .await?;
            result?;
        }
        Ok(())
    }

    pub(super) async fn apply_locked(
        &self,
        pipeline: &Pipeline,
        m: &pipeline::PlannedMaterialization,
    ) -> Result<(), ClusterError> {
        let key = self.keys.applied(&m.name);
        let kv = self.etcd.get(&key).await?;
        let recorded = decode_applied(&self.keys, &m.name, kv.as_ref())?;
        match applied::check(recorded.as_ref(), &m.spec) {
            applied::Check::Current => Ok(()),
            applied::Check::FirstApply => {
                let timeout = pipeline.runtime.timeouts.driver;
                let actions =
                    pipeline::apply_materialization(m, ApplyAction::Upsert, false, timeout).await?;
                tracing::debug!(materialization = %m.name, "applied: {actions}");
                self.etcd.put(&key, applied::encode(&m.spec), 0).await?;
                Ok(())
            }
            applied::Check::Differs {
                applied,
                file,
                changes,
            } => Err(pipeline::PipelineError::NotApplied {
                materialization: m.name.clone(),
                applied,
                file,
                changes: applied::describe(&changes, pipeline, &m.name),
            }
            .into()),
        }
    }
}

/// The spec recorded as applied in etcd (`kv`, the value of `P/applied/<name>`).
pub(crate) fn decode_applied(
    keys: &Keys,
    name: &str,
    kv: Option<&KeyValue>,
) -> Result<Option<Applied>, ClusterError> {
    let Some(kv) = kv else {
        return Ok(None);
    };
    applied::decode(&kv.value).map(Some).map_err(|e| {
        invalid(
            format!("materializations.{name}"),
            format!("the applied spec in etcd ({}): {e}", keys.applied(name)),
        )
    })
}

/// Takes `name`'s apply lock for `holder` with `lease`: `None` once taken, else who
/// holds it.
pub(crate) async fn try_lock(
    etcd: &Etcd,
    keys: &Keys,
    name: &str,
    holder: &str,
    lease: i64,
) -> Result<Option<String>, EtcdError> {
    let key = keys.apply_lock(name);
    let taken = etcd
        .txn(
            vec![Cond::Absent(key.clone())],
            vec![Op::Put {
                key: key.clone(),
                value: holder.as_bytes().to_vec(),
                lease,
            }],
            vec![Op::Get(key)],
        )
        .await?;
    Ok(match taken.succeeded {
        true => None,
        false => Some(taken.got.into_iter().flatten().next().map_or_else(
            || "a holder gone meanwhile".to_string(),
            |kv| String::from_utf8_lossy(&kv.value).into_owned(),
        )),
    })
}
