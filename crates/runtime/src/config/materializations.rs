//! `materializations:`: each one's endpoint (read by its kind, `kinds.rs`), its
//! bindings and their fields, and the key range of its shard.

use crate::types::EndpointDef;
use serde::Deserialize;
use serde_json::{Map, Value};

#[derive(Debug, Clone, PartialEq)]
pub struct MaterializationDef {
    pub endpoint: EndpointDef,
    /// Why its endpoint cannot take several shards at once, or move between a
    /// cluster's members (`DriverKind::pinned`).
    pub pinned: Option<&'static str>,
    /// Why its endpoint takes one writer at a time (`DriverKind::singleton`): one
    /// shard, never split, which may move between a cluster's members.
    pub singleton: Option<&'static str>,
    pub bindings: Vec<BindingDef>,
    pub shard: ShardDef,
}

/// A materialization as written: its endpoint not yet read by its kind.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct MaterializationFile {
    pub(super) endpoint: Map<String, Value>,
    pub(super) bindings: Vec<BindingDef>,
    #[serde(default)]
    pub(super) shard: ShardDef,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BindingDef {
    /// The collection materialized.
    pub source: String,
    /// Where it goes, in the driver's terms (e.g. `{table: pageviews}`).
    pub resource: Value,
    #[serde(default)]
    pub delta_updates: bool,
    #[serde(default)]
    pub fields: Option<FieldsDef>,
    /// The binding's backfill counter (default 0). Raising it and running `sluice apply`
    /// rebuilds the binding: its driver drops and recreates the resource, and its
    /// sources are read again from the beginning.
    #[serde(default)]
    pub backfill: u32,
}

#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FieldsDef {
    #[serde(default)]
    pub include: Vec<String>,
    #[serde(default)]
    pub exclude: Vec<String>,
}

/// The key-hash range of a materialization shard, inclusive at both ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardDef {
    pub key_begin: u32,
    pub key_end: u32,
}

impl ShardDef {
    /// The shard's id as metrics, logs and a cluster name it: `00000000-7fffffff`.
    pub fn id(&self) -> String {
        crate::types::shard_label(self.key_begin, self.key_end)
    }

    /// Reads an [`id`](Self::id).
    pub fn parse(id: &str) -> Option<ShardDef> {
        let (begin, end) = id.split_once('-')?;
        if begin.len() != 8 || end.len() != 8 {
            return None;
        }
        let shard = ShardDef {
            key_begin: u32::from_str_radix(begin, 16).ok()?,
            key_end: u32::from_str_radix(end, 16).ok()?,
        };
        (shard.key_begin <= shard.key_end).then_some(shard)
    }

    /// `n` equal ranges covering every key, in order.
    pub fn split_evenly(n: u32) -> Vec<ShardDef> {
        ShardDef::default().split_into(n)
    }

    /// This range in `n` equal parts (as many as it has hashes, at most), in order:
    /// part `i` begins at `ceil(i · width / n)`, so the parts of the whole range are the
    /// slices of Kafka's key-range partitioner (`h · n >> 32`), and those of `k · n`
    /// partitions nest in them: a shard then reads whole partitions only.
    pub fn split_into(&self, n: u32) -> Vec<ShardDef> {
        let width = u64::from(self.key_end - self.key_begin) + 1;
        let n = u64::from(n.max(1)).min(width);
        let start = |i: u64| u64::from(self.key_begin) + (i * width).div_ceil(n);
        (0..n)
            .map(|i| ShardDef {
                key_begin: start(i) as u32,
                key_end: (start(i + 1) - 1) as u32,
            })
            .collect()
    }

    /// The two halves a split at the midpoint makes; `None` for a range of one hash.
    pub fn halves(&self) -> Option<(ShardDef, ShardDef)> {
        if self.key_begin == self.key_end {
            return None;
        }
        let mid = self.key_begin + (self.key_end - self.key_begin) / 2;
        let low = ShardDef {
            key_begin: self.key_begin,
            key_end: mid,
        };
        let high = ShardDef {
            key_begin: mid + 1,
            key_end: self.key_end,
        };
        Some((low, high))
    }
}

impl Default for ShardDef {
    fn default() -> Self {
        ShardDef {
            key_begin: 0,
            key_end: u32::MAX,
        }
    }
}
