//! Where a step leaves the source, as its `Resume` position says, and the pure rules
//! that read it: which backfilled key ranges a streamed change is already in.
//!
//! ```text
//!  backfill {consistent C, tables, table i, after pk, snapshot L, segments}
//!      step after step: the rows of table i after `after`, read under snapshot L
//!  stream {begin B, end E, segments}
//!      a step: the whole transactions whose commit ends in (B, E]
//!  stream {begin B, end E, quiet: true}
//!      a step of none: the server said it sent all the WAL through E, and no
//!      transaction of the slot ends in (B, E] (the captured tables were quiet)
//!  stream {begin B, end B, part: {lsn L, from i, to j}}
//!      a part of a large transaction, not its last (`Step::unit_continues`): its
//!      documents [i, j), of the transaction committing first after B (its commit
//!      record starts at L); never checkpointed, so never sought
//!  stream {begin B, end E, part: {lsn L, from i}}
//!      the last part of that transaction: its documents from i on; it commits at E
//! ```
//!
//! **Parts.** A transaction of more than the stream's `PART_DOCS` documents (or
//! `PART_BYTES` of text) is handed over in parts as it is decoded, each a step of its
//! own, the steps of one *unit*: the runtime commits them in one of its transactions,
//! whole or not at all. A part's position says which of the transaction's documents
//! it holds, counted from the transaction's start, so a replay re-reads the slot from
//! `B` and hands exactly those, whatever size of part the replaying stream decodes.
//! Only a unit's end (the last part) is ever checkpointed: `seek` refuses a part that
//! is not the last ([`CdcPosition::mid_unit`]), and `committed` only hears of commit
//! ends.
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
/// A captured table, as positions name it (shared by the CDC sources).
pub use sluice_source_sdk::cdc::TableName;
use sluice_source_sdk::cdc::{self, push_segment, quiet_step_wait, segments_after, segments_of};
use std::cmp::Ordering;
use std::time::Duration;

/// When the stream owes a quiet step (a step without records that moves the position
/// to `sent`), counted from when the position last moved: `sent` is what a keepalive
/// between transactions said the server had sent through, `end` the stream's
/// position, `recorded` the end of the last step the runtime checkpoints (the WAL
/// between it and `sent` is what the slot holds back for nothing). None: no step is
/// owed (nothing was sent past `end`).
pub fn quiet_step_after(sent: u64, end: u64, recorded: u64) -> Option<Duration> {
    (sent > end).then(|| quiet_step_wait(sent.saturating_sub(recorded)))
}

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
        /// No transaction of the slot ends in `(begin, end]`: `end` is where a
        /// keepalive said the server had sent everything, not a commit end. A replay
        /// reads the slot up to the first keepalive at or past `end` and expects no
        /// transaction before it.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        quiet: bool,
        /// The step is a part of one large transaction (see the module docs); none:
        /// whole transactions (or a quiet step), as every position written before
        /// parts existed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        part: Option<Part>,
    },
}

impl CdcPosition {
    /// The part this position ends inside a transaction with (a part not its last):
    /// the runtime never checkpoints there, so it is never sought.
    pub fn mid_unit(&self) -> Option<&Part> {
        match self {
            CdcPosition::Stream {
                part: Some(part), ..
            } if part.to.is_some() => Some(part),
            _ => None,
        }
    }
}

/// The documents of one large transaction that a step holds: `[from, to)`, counted
/// from the transaction's first (the first transaction committing after the step's
/// `begin`); `to` none: through its last, where the transaction ends (the unit's
/// last step).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Part {
    /// Where the transaction's commit record starts (its documents' `_meta/lsn`).
    pub lsn: u64,
    pub from: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<u64>,
}

/// The backfilled ranges of one table.
pub type TableSegments = cdc::TableSegments<Segment>;

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
        let Some(segments) = segments_of(&self.0, table) else {
            return false;
        };
        let segment = segments.iter().find(|s| match (&s.upto, kinds) {
            (None, _) => true,
            (Some(upto), Some(kinds)) => compare_keys(kinds, key, upto) != Ordering::Greater,
            (Some(_), None) => false,
        });
        segment.is_some_and(|s| final_lsn < s.lsn)
    }

    /// Only the segments that can skip a change committed after `lsn`.
    pub fn after(&self, lsn: u64) -> Segments {
        Segments(segments_after(&self.0, |s| s.lsn > lsn))
    }

    /// Adds the range of `table` up to `upto` read at `lsn` (appended: ranges are read
    /// in key order).
    pub fn push(&mut self, table: &TableName, upto: Option<Vec<String>>, lsn: u64) {
        push_segment(&mut self.0, table, Segment { upto, lsn });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_source_sdk::cdc::{QUIET_EVERY, QUIET_IDLE};

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

    /// A quiet step comes soon after a large stretch of uncaptured WAL, late after a
    /// small one (a store on the same server), never when nothing was sent past the
    /// position.
    #[test]
    fn a_quiet_step_is_owed_only_past_the_position_and_sooner_the_more_wal() {
        let mib = 1 << 20;
        for (sent, end, recorded, expected) in [
            (100, 100, 100, None),
            (99, 100, 100, None),
            (0, 100, 100, None),
            (101, 100, 100, Some(QUIET_IDLE)),
            (100 + mib - 1, 100, 100, Some(QUIET_IDLE)),
            (100 + mib, 100, 100, Some(QUIET_EVERY)),
            // Steps of empty transactions moved `end` but were not checkpointed.
            (100 + mib, 100 + mib - 1, 100, Some(QUIET_EVERY)),
        ] {
            assert_eq!(
                quiet_step_after(sent, end, recorded),
                expected,
                "sent {sent}, end {end}, recorded {recorded}"
            );
        }
    }

    #[test]
    fn positions_round_trip_as_json() {
        let p = CdcPosition::Stream {
            begin: 1,
            end: 2,
            segments: vec![],
            quiet: false,
            part: None,
        };
        let text = serde_json::to_string(&p).unwrap();
        assert_eq!(text, r#"{"phase":"stream","begin":1,"end":2}"#);
        assert_eq!(serde_json::from_str::<CdcPosition>(&text).unwrap(), p);
        let quiet = CdcPosition::Stream {
            begin: 1,
            end: 2,
            segments: vec![],
            quiet: true,
            part: None,
        };
        let text = serde_json::to_string(&quiet).unwrap();
        assert_eq!(text, r#"{"phase":"stream","begin":1,"end":2,"quiet":true}"#);
        assert_eq!(serde_json::from_str::<CdcPosition>(&text).unwrap(), quiet);
        assert_eq!(quiet.mid_unit(), None);
        let part = |to| CdcPosition::Stream {
            begin: 1,
            end: 1,
            segments: vec![],
            quiet: false,
            part: Some(Part {
                lsn: 5,
                from: 4,
                to,
            }),
        };
        let mid = part(Some(8));
        let text = serde_json::to_string(&mid).unwrap();
        assert_eq!(
            text,
            r#"{"phase":"stream","begin":1,"end":1,"part":{"lsn":5,"from":4,"to":8}}"#
        );
        assert_eq!(serde_json::from_str::<CdcPosition>(&text).unwrap(), mid);
        assert_eq!(mid.mid_unit().map(|p| p.to), Some(Some(8)));
        let last = part(None);
        let text = serde_json::to_string(&last).unwrap();
        assert_eq!(
            text,
            r#"{"phase":"stream","begin":1,"end":1,"part":{"lsn":5,"from":4}}"#
        );
        assert_eq!(serde_json::from_str::<CdcPosition>(&text).unwrap(), last);
        assert_eq!(last.mid_unit(), None, "a unit's end is checkpointed");
    }
}
