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
//!  P/status/<mat>/<begin>-<end>       ShardStatus {txn, lag}   with the holder's lease
//!  P/applied/<mat>                    the applied spec
//!  P/init/<mat>                       the first shards were made
//!  P/lock/apply/<mat>                 the member applying     with its lease
//! ```
//!
//! A shard's id is its key range as the metrics label it (`00000000-7fffffff`).

use serde::{Deserialize, Serialize};
use sluice_runtime::config::ShardDef;

/// A shard of a materialization: its name and key range.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ShardId {
    pub materialization: String,
    pub range: Range,
}

impl std::fmt::Display for ShardId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.materialization, self.range.id())
    }
}

/// A key-hash range, inclusive at both ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Range {
    pub key_begin: u32,
    pub key_end: u32,
}

impl Range {
    pub const ALL: Range = Range {
        key_begin: 0,
        key_end: u32::MAX,
    };

    /// `00000000-ffffffff`.
    pub fn id(&self) -> String {
        sluice_runtime::metrics::shard_label(self.key_begin, self.key_end)
    }

    /// Reads an [`id`](Self::id).
    pub fn parse(id: &str) -> Option<Range> {
        let (begin, end) = id.split_once('-')?;
        if begin.len() != 8 || end.len() != 8 {
            return None;
        }
        let range = Range {
            key_begin: u32::from_str_radix(begin, 16).ok()?,
            key_end: u32::from_str_radix(end, 16).ok()?,
        };
        (range.key_begin <= range.key_end).then_some(range)
    }

    /// `n` equal ranges covering every key, in order.
    pub fn split_evenly(n: u32) -> Vec<Range> {
        let n = u64::from(n.max(1));
        let span = (u64::from(u32::MAX) + 1) / n;
        (0..n)
            .map(|i| Range {
                key_begin: (i * span) as u32,
                key_end: if i + 1 == n {
                    u32::MAX
                } else {
                    ((i + 1) * span - 1) as u32
                },
            })
            .collect()
    }

    /// The two halves a split makes, `None` for a range of one hash.
    pub fn halves(&self) -> Option<(Range, Range)> {
        if self.key_begin == self.key_end {
            return None;
        }
        let mid = self.key_begin + (self.key_end - self.key_begin) / 2;
        Some((
            Range {
                key_begin: self.key_begin,
                key_end: mid,
            },
            Range {
                key_begin: mid + 1,
                key_end: self.key_end,
            },
        ))
    }

    pub fn shard(&self) -> ShardDef {
        ShardDef {
            key_begin: self.key_begin,
            key_end: self.key_end,
        }
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

/// What a shard's holder publishes about it, the value of `P/status/<mat>/<id>`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ShardStatus {
    /// The last transaction it committed.
    pub txn: u64,
    /// How far behind its input each source is, in the source's unit.
    pub lag: std::collections::BTreeMap<String, String>,
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
        format!(
            "{}/log/{}/{}/",
            self.prefix,
            id.materialization,
            id.range.id()
        )
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

    pub fn applied(&self, materialization: &str) -> String {
        format!("{}/applied/{materialization}", self.prefix)
    }

    pub fn init(&self, materialization: &str) -> String {
        format!("{}/init/{materialization}", self.prefix)
    }

    pub fn apply_lock(&self, materialization: &str) -> String {
        format!("{}/lock/apply/{materialization}", self.prefix)
    }

    /// (materialization, range) of a key under `under` (one of the per-shard folders).
    pub fn parse_shard<'k>(&self, under: &str, key: &'k str) -> Option<(&'k str, Range)> {
        let rest = key.strip_prefix(under)?;
        let (materialization, id) = rest.rsplit_once('/')?;
        Some((materialization, Range::parse(id)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_split_evenly_cover_every_key_once() {
        for n in [1, 2, 3, 7, 1024] {
            let ranges = Range::split_evenly(n);
            assert_eq!(ranges.len(), n as usize);
            assert_eq!(ranges[0].key_begin, 0);
            assert_eq!(ranges.last().unwrap().key_end, u32::MAX);
            for pair in ranges.windows(2) {
                assert_eq!(pair[0].key_end + 1, pair[1].key_begin);
            }
        }
    }

    #[test]
    fn halves_are_adjacent_and_cover_the_range() {
        let (lo, hi) = Range::ALL.halves().unwrap();
        assert_eq!((lo.key_begin, lo.key_end), (0, 0x7fff_ffff));
        assert_eq!((hi.key_begin, hi.key_end), (0x8000_0000, u32::MAX));
        let (lo, hi) = hi.halves().unwrap();
        assert_eq!(lo.key_end + 1, hi.key_begin);
        let one = Range {
            key_begin: 5,
            key_end: 5,
        };
        assert_eq!(one.halves(), None);
    }

    #[test]
    fn ids_round_trip_and_name_the_shard_in_keys() {
        let range = Range {
            key_begin: 0x10,
            key_end: 0x7fff_ffff,
        };
        assert_eq!(Range::parse(&range.id()), Some(range));
        assert_eq!(Range::parse("0000-ffff"), None);
        assert_eq!(Range::parse("ffffffff-00000000"), None);
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
    }
}
