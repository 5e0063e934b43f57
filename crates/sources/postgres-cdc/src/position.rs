//! Where a step leaves the source, as its `Resume` position says, and the pure rules
//! that read it: which backfilled key ranges a streamed change is already in.
//!
//! ```text
//!  backfill {consistent C, tables, table i, after pk, snapshot L, segments}
//!      step after step: the rows of table i after `after`, read under snapshot L
//!  stream {begin B, end E, segments}
//!      a step: the whole transactions whose commit ends in (B, E]
//! ```
//!
//! **Segments.** The backfill reads under one exported snapshot as long as it runs. A
//! crash loses that snapshot, so a restarted backfill reads the rest under a new one,
//! at a later LSN. A table's *segments* `[(upto, L)]` say that its keys up to `upto`
//! (after the previous segment's) were read at snapshot LSN `L` (`upto` none: to the
//! end). Streaming then starts at the main slot's consistent point `C ≤ L`, and a
//! change of key `k` in a transaction whose commit record starts before `L` (its
//! `final_lsn`) is skipped: the snapshot that read `k` already held it
//! ([`Segments::holds`]). Keys compare as the chunk query orders them
//! ([`KeyKind`]): integers as numbers, text in the "C" collation (bytes), uuids as
//! their text.
//!
//! A stream position keeps only the segments that can still skip something: those
//! with `L` above its `begin` (every later transaction's commit starts at or after it).

use serde::{Deserialize, Serialize};
use std::cmp::Ordering;

/// A step's resume position (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case", deny_unknown_fields)]
pub enum CdcPosition {
    Backfill {
        /// The main slot's consistent point: streaming starts there.
        consistent: u64,
        /// The tables to read, in order, fixed when the backfill began.
        tables: Vec<TableName>,
        /// The table being read (`tables.len()`: all read).
        table: usize,
        /// The primary key of the last row read of `table` (text forms); none: none yet.
        after: Option<Vec<String>>,
        /// The LSN of the snapshot `table` is being read under.
        snapshot: u64,
        /// The ranges read so far under earlier snapshots, and whole tables read.
        segments: Vec<TableSegments>,
    },
    Stream {
        /// The commit end of the transaction before this step (exclusive).
        begin: u64,
        /// The commit end of this step's last transaction (inclusive); what the slot
        /// confirms once the step is durable.
        end: u64,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        segments: Vec<TableSegments>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableName {
    pub schema: String,
    pub table: String,
}

impl std::fmt::Display for TableName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.schema, self.table)
    }
}

/// The backfilled ranges of one table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableSegments {
    #[serde(flatten)]
    pub name: TableName,
    pub segments: Vec<Segment>,
}

/// Keys up to `upto` (text forms; none: the end of the table) were read at `lsn`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Segment {
    pub upto: Option<Vec<String>>,
    pub lsn: u64,
}

/// How a primary-key column compares, as the chunk query orders it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyKind {
    Int,
    /// text/varchar, ordered `COLLATE "C"`; uuid (lower-case hex text).
    Text,
}

impl KeyKind {
    /// The kind of a key column of type `oid`; none: not chunkable.
    pub fn of(oid: u32) -> Option<KeyKind> {
        match oid {
            20 | 21 | 23 => Some(KeyKind::Int),
            25 | 1043 | 2950 => Some(KeyKind::Text),
            _ => None,
        }
    }
}

/// Compares two keys (text forms) column by column.
pub fn compare_keys(kinds: &[KeyKind], a: &[String], b: &[String]) -> Ordering {
    for ((kind, a), b) in kinds.iter().zip(a).zip(b) {
        let order = match kind {
            KeyKind::Int => {
                let (x, y) = (a.parse::<i64>(), b.parse::<i64>());
                match (x, y) {
                    (Ok(x), Ok(y)) => x.cmp(&y),
                    _ => a.cmp(b),
                }
            }
            KeyKind::Text => a.as_bytes().cmp(b.as_bytes()),
        };
        if order != Ordering::Equal {
            return order;
        }
    }
    Ordering::Equal
}

/// The segments of every table, looked up by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Segments(pub Vec<TableSegments>);

impl Segments {
    /// Whether the snapshot that read `key` of `table` already holds a change
    /// committed in a transaction whose commit record starts at `final_lsn`.
    /// `kinds`: how the key's columns compare (none: the table was read whole).
    pub fn holds(
        &self,
        table: &TableName,
        kinds: Option<&[KeyKind]>,
        key: &[String],
        final_lsn: u64,
    ) -> bool {
        let Some(entry) = self.0.iter().find(|t| &t.name == table) else {
            return false;
        };
        let segment = entry.segments.iter().find(|s| match (&s.upto, kinds) {
            (None, _) => true,
            (Some(upto), Some(kinds)) => compare_keys(kinds, key, upto) != Ordering::Greater,
            (Some(_), None) => false,
        });
        segment.is_some_and(|s| final_lsn < s.lsn)
    }

    /// Only the segments that can skip a change committed after `lsn`.
    pub fn after(&self, lsn: u64) -> Segments {
        Segments(
            self.0
                .iter()
                .filter(|t| t.segments.iter().any(|s| s.lsn > lsn))
                .cloned()
                .collect(),
        )
    }

    /// Adds the range of `table` up to `upto` read at `lsn` (appended: ranges are read
    /// in key order).
    pub fn push(&mut self, table: &TableName, upto: Option<Vec<String>>, lsn: u64) {
        let segment = Segment { upto, lsn };
        match self.0.iter_mut().find(|t| &t.name == table) {
            Some(entry) => entry.segments.push(segment),
            None => self.0.push(TableSegments {
                name: table.clone(),
                segments: vec![segment],
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(t: &str) -> TableName {
        TableName {
            schema: "public".into(),
            table: t.into(),
        }
    }

    fn key(k: &[&str]) -> Vec<String> {
        k.iter().map(|s| s.to_string()).collect()
    }

    /// Keys 1..=10 read at 100 before a crash, the rest at 300 after it: a change
    /// committed at 200 is in the second snapshot only.
    #[test]
    fn a_change_is_skipped_only_where_its_snapshot_already_held_it() {
        let mut segments = Segments::default();
        segments.push(&name("t"), Some(key(&["10"])), 100);
        segments.push(&name("t"), None, 300);
        let ints = [KeyKind::Int];
        let holds = |k: &str, lsn| segments.holds(&name("t"), Some(&ints), &key(&[k]), lsn);
        assert!(!holds("9", 200), "read at 100: the change at 200 is new");
        assert!(!holds("10", 200));
        assert!(holds("11", 200), "read at 300: already held");
        assert!(holds("100", 299));
        assert!(
            !holds("100", 300),
            "the commit at the snapshot's LSN is not in it"
        );
        assert!(holds("2", 50), "older than both snapshots");
        assert!(!segments.holds(&name("other"), Some(&ints), &key(&["1"]), 0));
        assert_eq!(segments.after(300), Segments::default());
        assert_eq!(segments.after(299).0.len(), 1);
    }

    #[test]
    fn keys_compare_as_the_chunk_query_orders_them() {
        let kinds = [KeyKind::Int, KeyKind::Text];
        assert_eq!(
            compare_keys(&kinds, &key(&["9", "b"]), &key(&["10", "a"])),
            Ordering::Less
        );
        assert_eq!(
            compare_keys(&kinds, &key(&["10", "B"]), &key(&["10", "a"])),
            Ordering::Less
        );
        assert_eq!(
            compare_keys(&kinds, &key(&["-1", "é"]), &key(&["-1", "z"])),
            Ordering::Greater
        );
    }

    #[test]
    fn positions_round_trip_as_json() {
        let p = CdcPosition::Stream {
            begin: 1,
            end: 2,
            segments: vec![],
        };
        let text = serde_json::to_string(&p).unwrap();
        assert_eq!(text, r#"{"phase":"stream","begin":1,"end":2}"#);
        assert_eq!(serde_json::from_str::<CdcPosition>(&text).unwrap(), p);
    }
}
