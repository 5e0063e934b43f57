//! What `sluice shards list | split` read and write in a cluster's etcd.

use crate::assign::read_view;
use crate::etcd::{Cond, Etcd, Op};
use crate::keys::{Keys, ShardDef, ShardId, ShardSpec, ShardStatus};
use crate::member::ClusterError;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// One shard as `sluice shards list` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct ShardRow {
    pub materialization: String,
    pub shard: String,
    pub key_begin: u32,
    pub key_end: u32,
    /// `running`, `unassigned` or `splitting`.
    pub status: &'static str,
    pub member: Option<String>,
    /// The last transaction committed to its log.
    pub txn: u64,
    /// Each source's lag as its holder last published it.
    pub lag: BTreeMap<String, String>,
    /// Documents per second committed, as its holder last published it.
    pub rate: u64,
}

/// Every shard of the cluster, with its member, last transaction, rate and lag.
pub async fn list(etcd: &Etcd, keys: &Keys) -> Result<Vec<ShardRow>, ClusterError> {
    let (members, _) = etcd.get_prefix(&keys.members()).await?;
    let (shards, _) = etcd.get_prefix(&keys.shards()).await?;
    let (assignments, _) = etcd.get_prefix(&keys.assignments()).await?;
    let (statuses, _) = etcd.get_prefix(&keys.statuses()).await?;
    let view = read_view(keys, &members, &shards, &assignments);
    let (logs, _) = etcd.get_prefix(&keys.logs()).await?;
    let by_shard = |under: String, kvs: &[crate::etcd::KeyValue], suffix: &str| {
        let mut out = BTreeMap::new();
        for kv in kvs {
            let key = String::from_utf8_lossy(&kv.key);
            let Some(key) = key.strip_suffix(suffix) else {
                continue;
            };
            if let Some((m, range)) = keys.parse_shard(&under, key) {
                out.insert((m.to_string(), range), kv.value.clone());
            }
        }
        out
    };
    let commits = by_shard(keys.logs(), &logs, "/commit");
    let statuses = by_shard(keys.statuses(), &statuses, "");
    let mut rows = Vec::new();
    for (id, state) in &view.shards {
        let at = (id.materialization.clone(), id.range);
        let txn = (commits.get(&at))
            .and_then(|c| serde_json::from_slice::<serde_json::Value>(c).ok())
            .and_then(|c| c["txn"].as_u64())
            .unwrap_or(0);
        let status = (statuses.get(&at))
            .and_then(|s| serde_json::from_slice::<ShardStatus>(s).ok())
            .unwrap_or_default();
        rows.push(ShardRow {
            materialization: id.materialization.clone(),
            shard: id.range.id(),
            key_begin: id.range.key_begin,
            key_end: id.range.key_end,
            status: match (state.splitting, &state.holder) {
                (true, _) => "splitting",
                (false, Some(_)) => "running",
                (false, None) => "unassigned",
            },
            member: state.holder.as_ref().map(|(m, _)| m.clone()),
            txn,
            lag: status.lag,
            rate: status.rate,
        });
    }
    Ok(rows)
}

/// Asks the holder of `materialization`'s shard `shard` (its id, `00000000-ffffffff`)
/// to split it, then waits up to `wait` for its halves. Returns the halves' ids.
/// `singleton`: why the materialization runs as one shard ([`crate::assign::singleton`]),
/// which refuses the split.
pub async fn split(
    etcd: &Etcd,
    keys: &Keys,
    materialization: &str,
    shard: &str,
    wait: Duration,
    singleton: Option<String>,
) -> Result<(String, String), ClusterError> {
    let unknown = |reason: String| ClusterError::Invalid {
        place: format!("shard {materialization}/{shard}"),
        reason,
    };
    if let Some(why) = singleton {
        return Err(unknown(format!(
            "{materialization} runs as one shard, which cannot split: {why}"
        )));
    }
    let range = ShardDef::parse(shard)
        .ok_or_else(|| unknown("a shard id is `<key_begin>-<key_end>` in 8 hex digits each, as `sluice shards list` shows it".into()))?;
    let Some((lo, hi)) = range.halves() else {
        return Err(unknown("a range of one key hash cannot split".into()));
    };
    let id = ShardId {
        materialization: materialization.to_string(),
        range,
    };
    let key = keys.shard(&id);
    let Some(kv) = etcd.get(&key).await? else {
        let known: Vec<String> = list(etcd, keys)
            .await?
            .into_iter()
            .map(|r| format!("{}/{}", r.materialization, r.shard))
            .collect();
        return Err(unknown(format!(
            "no such shard; the cluster has {}",
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        )));
    };
    let spec = serde_json::to_vec(&ShardSpec { splitting: true }).expect("serializes");
    let asked = etcd
        .txn(
            vec![Cond::ModRevision(key.clone(), kv.mod_revision)],
            vec![Op::Put {
                key: key.clone(),
                value: spec,
                lease: 0,
            }],
            vec![],
        )
        .await?;
    if !asked.succeeded {
        return Err(unknown(
            "the shard changed meanwhile: list the shards and try again".into(),
        ));
    }
    let started = Instant::now();
    while etcd.get(&key).await?.is_some() {
        if started.elapsed() > wait {
            return Err(unknown(format!(
                "asked to split, but no member has split it after {}s: is a member running? \
                 It splits once one is",
                wait.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok((lo.id(), hi.id()))
}
