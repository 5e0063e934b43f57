//! Where a cluster keeps its state in etcd, under its prefix `P` (pure):
//!
//! ```text
//!  P/members/<member>                 {pid, host}              with the member's lease
//!  P/shards/<mat>/<begin>-<end>       ShardSpec {splitting}    the shard exists
//!  P/assign/<mat>/<begin>-<end>       <member>                 with the holder's lease;
//!                                                              its mod revision is the
//!                                                              holder's fencing token
//!  P/log/<mat>/<begin>-<end>/commit   the last commit record   written only while the
//!  P/log/<mat>/<begin>-<end>/intent   the pending intent       token is current
//!  P/status/<mat>/<begin>-<end>       ShardStatus {lag, rate}  with the holder's lease
//!  P/declined/<mat>/<begin>-<end>/<member>                     with the member's lease:
//!                                     until (Unix ms)          its loop of the shard
//!                                                              failed; it backs off
//!  P/load/<member>                    MemberLoad {cpu}         with the member's lease
//!  P/place/<mat>/<begin>-<end>        <member>                 with <member>'s lease:
//!                                                              a move by load put the
//!                                                              shard there (balance.rs)
//!  P/cooldown/<member>                <shard>                  with a lease of
//!                                                              cluster.balance_interval:
//!                                                              the member took part in
//!                                                              a move by load
//!  P/autosplit/<mat>                  <shard>                  the last shard marked by
//!                                                              autosplit (its revision
//!                                                              serializes the marks)
//!  P/applied/<mat>                    the applied spec
//!  P/init/<mat>                       the first shards were made
//!  P/lock/apply/<mat>                 the member applying     with its lease
//!  P/deployment                       the deployment id        made once (CAS), kept:
//!                                                              what epoch sinks name
//!                                                              their staging by
//! ```
//!
//! A shard's id is its key range as the metrics label it (`00000000-7fffffff`).

use serde::{Deserialize, Serialize};
pub use sluice_runtime::config::ShardDef;

/// A shard of a materialization: its name and key range.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShardId {
    pub materialization: String,
    pub range: ShardDef,
}

impl std::fmt::Display for ShardId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.materialization, self.range.id())
    }
}

/// A shard's spec, the value of `P/shards/<mat>/<id>`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardSpec {
    /// `sluice shards split` asked for it: its holder finishes its transaction, stops,
    /// and replaces it by its halves.
    #[serde(default)]
    pub splitting: bool,
}

/// What a shard's holder publishes about it, the value of `P/status/<mat>/<id>` (its
/// last transaction is its log's commit).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ShardStatus {
    /// How far behind its input each source is, in the source's unit.
    pub lag: std::collections::BTreeMap<String, String>,
    /// Documents per second it committed, over the runtime's rate window (whole
    /// documents: a status is written again only when it changes).
    #[serde(default)]
    pub rate: u64,
}

/// What a member publishes about itself, the value of `P/load/<member>`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemberLoad {
    /// The process's CPU use, in CPU seconds per second (cores), over the last
    /// publishing interval.
    pub cpu: f64,
}

/// The key layout under one cluster's prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Keys {
        Keys {
            prefix: prefix.trim_end_matches('/').to_string(),
        }
    }

    pub fn members(&self) -> String {
        format!("{}/members/", self.prefix)
    }

    pub fn member(&self, member: &str) -> String {
        format!("{}{member}", self.members())
    }

    pub fn shards(&self) -> String {
        format!("{}/shards/", self.prefix)
    }

    pub fn shard(&self, id: &ShardId) -> String {
        format!("{}{}/{}", self.shards(), id.materialization, id.range.id())
    }

    pub fn assignments(&self) -> String {
        format!("{}/assign/", self.prefix)
    }

    pub fn assignment(&self, id: &ShardId) -> String {
        format!(
            "{}{}/{}",
            self.assignments(),
            id.materialization,
            id.range.id()
        )
    }

    /// The folder of a shard's log records (`commit`, `intent`).
    pub fn log(&self, id: &ShardId) -> String {
        format!("{}{}/{}/", self.logs(), id.materialization, id.range.id())
    }

    /// Every shard's log folder.
    pub fn logs(&self) -> String {
        format!("{}/log/", self.prefix)
    }

    pub fn statuses(&self) -> String {
        format!("{}/status/", self.prefix)
    }

    pub fn status(&self, id: &ShardId) -> String {
        format!(
            "{}{}/{}",
            self.statuses(),
            id.materialization,
            id.range.id()
        )
    }

    /// Every member's declined shards.
    pub fn declines(&self) -> String {
        format!("{}/declined/", self.prefix)
    }

    /// `member` backs off from shard `id`.
    pub fn declined(&self, id: &ShardId, member: &str) -> String {
        format!(
            "{}{}/{}/{member}",
            self.declines(),
            id.materialization,
            id.range.id()
        )
    }

    /// (materialization, range, member) of a key under [`Keys::declines`].
    pub fn parse_declined<'k>(&self, key: &'k str) -> Option<(&'k str, ShardDef, &'k str)> {
        let dir = self.declines();
        let rest = key.strip_prefix(&dir)?;
        let (shard, member) = rest.rsplit_once('/')?;
        let (materialization, id) = shard.rsplit_once('/')?;
        Some((materialization, ShardDef::parse(id)?, member))
    }

    /// Every member's published load.
    pub fn loads(&self) -> String {
        format!("{}/load/", self.prefix)
    }

    pub fn load(&self, member: &str) -> String {
        format!("{}{member}", self.loads())
    }

    /// Every shard's placement by load.
    pub fn placements(&self) -> String {
        format!("{}/place/", self.prefix)
    }

    pub fn placement(&self, id: &ShardId) -> String {
        format!(
            "{}{}/{}",
            self.placements(),
            id.materialization,
            id.range.id()
        )
    }

    /// Every member's cooldown after a move by load.
    pub fn cooldowns(&self) -> String {
        format!("{}/cooldown/", self.prefix)
    }

    pub fn cooldown(&self, member: &str) -> String {
        format!("{}{member}", self.cooldowns())
    }

    /// The last autosplit mark of `materialization`.
    pub fn autosplit(&self, materialization: &str) -> String {
        format!("{}/autosplit/{materialization}", self.prefix)
    }

    pub fn applied(&self, materialization: &str) -> String {
        format!("{}/applied/{materialization}", self.prefix)
    }

    pub fn init(&self, materialization: &str) -> String {
        format!("{}/init/{materialization}", self.prefix)
    }

    /// The cluster's deployment id, the same for every member.
    pub fn deployment(&self) -> String {
        format!("{}/deployment", self.prefix)
    }

    pub fn apply_lock(&self, materialization: &str) -> String {
        format!("{}/lock/apply/{materialization}", self.prefix)
    }

    /// The folder of `materialization`'s keys under `folder` (one of the per-shard
    /// folders: [`Keys::shards`], [`Keys::assignments`], …).
    pub fn of(&self, folder: &str, materialization: &str) -> String {
        format!("{folder}{materialization}/")
    }

    /// Every key the cluster keeps of `materialization` but its assignments (written by
    /// holders, with their leases) and its apply lock: what `sluice apply --delete`
    /// removes, so the members' next run is a first start. A folder ends in `/`. The
    /// deployment id is the cluster's, not the materialization's: kept.
    pub fn of_materialization(&self, materialization: &str) -> Vec<String> {
        let mut keys: Vec<String> = [
            self.shards(),
            self.logs(),
            self.statuses(),
            self.placements(),
            self.declines(),
        ]
        .iter()
        .map(|folder| self.of(folder, materialization))
        .collect();
        keys.extend([
            self.applied(materialization),
            self.init(materialization),
            self.autosplit(materialization),
        ]);
        keys
    }

    /// (materialization, range) of a key under `under` (one of the per-shard folders).
    pub fn parse_shard<'k>(&self, under: &str, key: &'k str) -> Option<(&'k str, ShardDef)> {
        let rest = key.strip_prefix(under)?;
        let (materialization, id) = rest.rsplit_once('/')?;
        Some((materialization, ShardDef::parse(id)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_the_shard_and_read_back() {
        let range = ShardDef {
            key_begin: 0x10,
            key_end: 0x7fff_ffff,
        };
        let keys = Keys::new("/sluice/p/");
        let id = ShardId {
            materialization: "views".into(),
            range,
        };
        let key = keys.assignment(&id);
        assert_eq!(key, "/sluice/p/assign/views/00000010-7fffffff");
        assert_eq!(
            keys.parse_shard(&keys.assignments(), &key),
            Some(("views", range))
        );
        let key = keys.declined(&id, "m-1");
        assert_eq!(key, "/sluice/p/declined/views/00000010-7fffffff/m-1");
        assert_eq!(keys.parse_declined(&key), Some(("views", range, "m-1")));
    }

    #[test]
    fn a_materializations_keys_are_its_own_not_a_longer_names() {
        let keys = Keys::new("/sluice/p");
        let id = ShardId {
            materialization: "views".into(),
            range: ShardDef::default(),
        };
        let owned = keys.of_materialization("views");
        let of_views = |key: &str| {
            owned
                .iter()
                .any(|k| k == key || (k.ends_with('/') && key.starts_with(k.as_str())))
        };
        for key in [
            keys.shard(&id),
            format!("{}commit", keys.log(&id)),
            keys.status(&id),
            keys.placement(&id),
            keys.declined(&id, "m-1"),
            keys.applied("views"),
            keys.init("views"),
            keys.autosplit("views"),
        ] {
            assert!(of_views(&key), "{key} is not removed with views");
        }
        let other = ShardId {
            materialization: "views2".into(),
            range: ShardDef::default(),
        };
        for key in [
            keys.shard(&other),
            keys.applied("views2"),
            keys.deployment(),
        ] {
            assert!(!of_views(&key), "{key} is removed with views");
        }
        assert!(!of_views(&keys.assignment(&id)));
    }
}
