//! Where a step leaves the source, as its `Resume` position says, and the pure rules
//! that read it: binary log positions, MariaDB GTIDs, and which snapshotted key ranges
//! a change from the log is already in.
//!
//! ```text
//!  backfill {start S, tables, table i, after pk, snapshot P, segments}
//!      step after step: the rows of table i after `after`, read in a snapshot at P
//!  stream {begin B, end E, gtid G, gtid_state S}
//!      a step: the whole transactions whose commit event ends in (B, E]; G the GTID
//!      of the last (MariaDB `domain-server-seq`), S the server's GTID state after it
//!  stream {begin B, end E, quiet: true}
//!      a step without documents: the transactions ending in (B, E] touch no captured
//!      table, and the runtime checkpoints E ([`quiet_step_after`])
//!  stream {begin B, end B, part: {from i, to j}}
//!      a part of a large transaction, not its last (`Step::unit_continues`): its
//!      documents [i, j), of the first transaction ending after B; never
//!      checkpointed, so never sought
//!  stream {begin B, end E, part: {from i}}
//!      the last part of that transaction: its documents from i on; it ends at E
//! ```
//!
//! **Parts.** A transaction larger than the stream's part bound is handed over in
//! parts, each a step of its own, the steps of one *unit* the runtime commits whole.
//! A part's position names its documents by their index in the transaction, so a
//! replay re-reads the log from B and hands exactly those, whatever size of part the
//! replaying stream decodes (as `postgres_cdc`'s parts).
//!
//! A binlog position is a file and the offset just past an event (`log_pos`). Files
//! are numbered (`mysql-bin.000012`): positions order by the file's number, then the
//! offset ([`BinlogPos::cmp`]). A transaction's end is the `log_pos` of its commit
//! event (XID, or a `COMMIT` query); a snapshot taken at P holds exactly the
//! transactions ending at or before P.
//!
//! **GTIDs.** Where the server has them (MariaDB: every transaction), a streamed
//! step also records the GTID state after its end ([`GtidState`]: the last GTID of
//! each replication domain, `gtid_binlog_pos`'s form), and a stream resumed from a
//! checkpoint connects by it (`@slave_connect_state`), not by file and offset: the
//! position survives a failover to a replica whose binary log has another layout
//! (its own files and offsets, the same GTIDs). File and offset stay the fallback
//! where GTIDs are off, and replays re-read by file and offset (a step in flight is
//! replayed from the server that wrote it). A state that the server's oldest log
//! already passes (in some domain, its first GTIDs come after ours) lost changes to a
//! purge ([`GtidState::purged_since`]).
//!
//! **Segments.** As in `postgres_cdc`: a crash mid-backfill loses its snapshot, so the
//! rest is read in a new one at a later position. A table's segments `[(upto, P)]` say
//! its keys up to `upto` were read at P; streaming starts at the first snapshot's
//! position S, and a change of key `k` in a transaction ending at or before the P of
//! the segment holding `k` is skipped: that snapshot already held it
//! ([`Segments::holds`]). Which segment holds `k` is a question of key order: integer
//! keys are compared here ([`int_segment`]), every other key by the server, in its
//! collation (`Catalog::segment_of`), and only for transactions that end between
//! the table's first and last snapshot (before: every snapshot held them; after:
//! none did).

use serde::{Deserialize, Serialize};
/// A captured table, as positions name it (shared by the CDC sources).
pub use sluice_source_sdk::cdc::TableName;
use sluice_source_sdk::cdc::{self, push_segment, quiet_step_wait, segments_after, segments_of};
use std::cmp::Ordering;
use std::time::Duration;

/// When the stream owes a quiet step (a step without records that moves the
/// checkpointed position to `end`), counted from when the position last moved: `end`
/// is where the stream is (a transaction boundary), `recorded` the end of the last step
/// the runtime checkpoints (a rotation into a later file counts as far). None: no step
/// is owed.
pub fn quiet_step_after(end: &BinlogPos, recorded: &BinlogPos) -> Option<Duration> {
    (end > recorded).then(|| {
        quiet_step_wait(match end.file == recorded.file {
            true => end.pos.saturating_sub(recorded.pos),
            false => u64::MAX,
        })
    })
}

/// A position in the binary log: just past an event of `file`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BinlogPos {
    pub file: String,
    pub pos: u64,
}

impl BinlogPos {
    pub fn new(file: impl Into<String>, pos: u64) -> BinlogPos {
        BinlogPos {
            file: file.into(),
            pos,
        }
    }

    /// The number a binlog file's name ends with (`mysql-bin.000012` → 12).
    fn number(&self) -> Option<u64> {
        self.file.rsplit_once('.').and_then(|(_, n)| n.parse().ok())
    }
}

impl std::fmt::Display for BinlogPos {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.file, self.pos)
    }
}

impl PartialOrd for BinlogPos {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for BinlogPos {
    fn cmp(&self, other: &Self) -> Ordering {
        let files = match (self.number(), other.number()) {
            (Some(a), Some(b)) => a.cmp(&b),
            _ => self.file.cmp(&other.file),
        };
        files.then(self.pos.cmp(&other.pos))
    }
}

/// A step's resume position (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case", deny_unknown_fields)]
pub enum CdcPosition {
    Backfill {
        /// Where the first snapshot was consistent: streaming starts there.
        start: BinlogPos,
        /// The server's `@@gtid_binlog_pos` then (MariaDB; empty without GTIDs), for
        /// the operator.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        gtid: String,
        /// The tables to read, in order, fixed when the backfill began.
        tables: Vec<TableName>,
        /// The table being read (`tables.len()`: all read).
        table: usize,
        /// The primary key of the last row read of `table` (text forms); none: none yet.
        after: Option<Vec<String>>,
        /// The position of the snapshot `table` is being read in.
        snapshot: BinlogPos,
        /// The ranges read so far in earlier snapshots, and whole tables read.
        segments: Vec<TableSegments>,
    },
    Stream {
        /// The end of the transaction before this step (exclusive).
        begin: BinlogPos,
        /// The end of this step's last transaction (inclusive).
        end: BinlogPos,
        /// The GTID of the last transaction read (MariaDB), if the server sends them.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gtid: Option<String>,
        /// The server's GTID state after `end` (MariaDB): where a resumed stream
        /// connects; none: GTIDs are off, it connects at `end`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        gtid_state: Option<GtidState>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        segments: Vec<TableSegments>,
        /// The step is a part of one large transaction; none: whole transactions.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        part: Option<Part>,
        /// A step without documents that moves the checkpointed position past
        /// transactions of tables not captured (`Step::advances`).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        quiet: bool,
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
/// from the transaction's first (the first transaction ending after the step's
/// `begin`); `to` none: through its last, where the transaction ends (the unit's last
/// step).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Part {
    pub from: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<u64>,
}

/// The backfilled ranges of one table.
pub type TableSegments = cdc::TableSegments<Segment>;

/// Keys up to `upto` (text forms; none: the end of the table) were read at `at`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Segment {
    pub upto: Option<Vec<String>>,
    pub at: BinlogPos,
}

/// Compares two integer keys (text forms) column by column (other keys order as only
/// the server knows).
pub fn compare_keys(a: &[String], b: &[String]) -> Ordering {
    for (a, b) in a.iter().zip(b) {
        let order = match (a.parse::<i128>(), b.parse::<i128>()) {
            (Ok(x), Ok(y)) => x.cmp(&y),
            _ => a.cmp(b),
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

/// Whether a snapshot of a table already holds a change of a transaction ending at
/// some position ([`Segments::holds`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holds<'a> {
    /// Whatever the change's key.
    Always(bool),
    /// Held when the segment its key falls in (of these, in key order: its index, from
    /// the key's order) holds it: [`held_in`].
    ByKey(&'a [Segment]),
}

/// Whether segment `index` of `segments` (the one a change's key falls in; past the
/// last: none) holds a change of a transaction ending at `end`.
pub fn held_in(segments: &[Segment], index: usize, end: &BinlogPos) -> bool {
    segments.get(index).is_some_and(|s| end <= &s.at)
}

/// The segment an integer key (text forms) falls in: the first whose `upto` is at or
/// after it.
pub fn int_segment(segments: &[Segment], key: &[String]) -> usize {
    segments
        .iter()
        .position(|s| match &s.upto {
            None => true,
            Some(upto) => compare_keys(key, upto) != Ordering::Greater,
        })
        .unwrap_or(segments.len())
}

impl Segments {
    /// Whether the snapshots that read `table` already hold a change of a transaction
    /// ending at `end`: whatever its key when every segment (through the table's end)
    /// was read at or after `end`, or none was; else by the segment its key falls in.
    pub fn holds(&self, table: &TableName, end: &BinlogPos) -> Holds<'_> {
        let Some(segments) = segments_of(&self.0, table) else {
            return Holds::Always(false);
        };
        let whole = segments.last().is_some_and(|s| s.upto.is_none());
        if whole && segments.iter().all(|s| end <= &s.at) {
            return Holds::Always(true);
        }
        if segments.iter().all(|s| end > &s.at) {
            return Holds::Always(false);
        }
        Holds::ByKey(segments)
    }

    /// Only the segments that can skip a change of a transaction ending after `pos`.
    pub fn after(&self, pos: &BinlogPos) -> Segments {
        Segments(segments_after(&self.0, |s| &s.at > pos))
    }

    /// Adds the range of `table` up to `upto` read at `at` (ranges come in key order).
    pub fn push(&mut self, table: &TableName, upto: Option<Vec<String>>, at: BinlogPos) {
        push_segment(&mut self.0, table, Segment { upto, at });
    }
}

/// A MariaDB GTID, `domain-server-seq`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gtid {
    pub domain: u32,
    pub server: u32,
    pub seq: u64,
}

impl std::fmt::Display for Gtid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}-{}", self.domain, self.server, self.seq)
    }
}

impl Gtid {
    /// `domain-server-seq`.
    pub fn parse(text: &str) -> Option<Gtid> {
        let mut parts = text.trim().splitn(3, '-');
        Some(Gtid {
            domain: parts.next()?.parse().ok()?,
            server: parts.next()?.parse().ok()?,
            seq: parts.next()?.parse().ok()?,
        })
    }

    /// The GTID of a MariaDB `GTID_EVENT` (type 162): its body starts with the
    /// sequence number (8 bytes) and the domain (4), little-endian; the server is the
    /// event header's. None: too short.
    pub fn from_event(server: u32, body: &[u8]) -> Option<Gtid> {
        let seq = u64::from_le_bytes(body.get(..8)?.try_into().ok()?);
        let domain = u32::from_le_bytes(body.get(8..12)?.try_into().ok()?);
        Some(Gtid {
            domain,
            server,
            seq,
        })
    }

    /// Whether a `GTID_EVENT`'s flags (byte 12 of its body) say it holds a single
    /// statement with no `BEGIN`/`COMMIT` around it (DDL, a non-transactional table):
    /// its end is the end of its one event group.
    pub fn standalone(body: &[u8]) -> bool {
        const FL_STANDALONE: u8 = 1;
        body.get(12).is_some_and(|f| f & FL_STANDALONE != 0)
    }
}

/// A MariaDB GTID state: the last GTID of each replication domain, written as
/// `gtid_binlog_pos` and `@slave_connect_state` write it (`0-1-17,2-5-3`, by domain;
/// empty: no transaction yet).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GtidState(std::collections::BTreeMap<u32, Gtid>);

impl GtidState {
    /// `gtid_binlog_pos`'s text. None: not a GTID list.
    pub fn parse(text: &str) -> Option<GtidState> {
        let mut state = GtidState::default();
        for gtid in text.split(',').filter(|g| !g.trim().is_empty()) {
            state.apply(Gtid::parse(gtid)?);
        }
        Some(state)
    }

    /// After transaction `gtid`.
    pub fn apply(&mut self, gtid: Gtid) {
        self.0.insert(gtid.domain, gtid);
    }

    /// The first GTID of the server's oldest binary log that shows transactions after
    /// this state are gone: given `oldest`, the state that log starts from, a domain
    /// whose last purged sequence number is past ours (or one we never saw, whose
    /// transactions were purged). None: every transaction after this state is still
    /// there.
    pub fn purged_since(&self, oldest: &GtidState) -> Option<Gtid> {
        oldest.0.values().copied().find(|gone| {
            self.0
                .get(&gone.domain)
                .is_none_or(|ours| ours.seq < gone.seq)
        })
    }
}

impl std::fmt::Display for GtidState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, gtid) in self.0.values().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{gtid}")?;
        }
        Ok(())
    }
}

impl Serialize for GtidState {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for GtidState {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        GtidState::parse(&text).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "{text:?} is not a GTID state (domain-server-seq, comma-separated)"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_source_sdk::cdc::{QUIET_BYTES, QUIET_EVERY, QUIET_IDLE};

    fn name(t: &str) -> TableName {
        TableName {
            schema: "db".into(),
            table: t.into(),
        }
    }

    fn key(k: &[&str]) -> Vec<String> {
        k.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn positions_order_by_file_number_then_offset() {
        let a = BinlogPos::new("mysql-bin.000009", 900);
        let b = BinlogPos::new("mysql-bin.000010", 4);
        assert!(a < b);
        assert!(BinlogPos::new("mysql-bin.000010", 5) > b);
        assert_eq!(a.to_string(), "mysql-bin.000009:900");
    }

    /// Keys 1..=10 read at 100 before a crash, the rest at 300 after it: a change
    /// committed at 200 is in the second snapshot only.
    #[test]
    fn a_change_is_skipped_only_where_its_snapshot_already_held_it() {
        let at = |p| BinlogPos::new("b.000001", p);
        let mut segments = Segments::default();
        segments.push(&name("t"), Some(key(&["10"])), at(100));
        segments.push(&name("t"), None, at(300));
        let holds = |k: &str, p| match segments.holds(&name("t"), &at(p)) {
            Holds::Always(held) => held,
            Holds::ByKey(by_key) => held_in(by_key, int_segment(by_key, &key(&[k])), &at(p)),
        };
        assert!(!holds("9", 200), "read at 100: the change at 200 is new");
        assert!(!holds("10", 200));
        assert!(holds("11", 200), "read at 300: already held");
        assert!(holds("100", 300), "a transaction ending at 300 is in it");
        assert!(!holds("100", 301));
        assert!(holds("2", 50), "older than both snapshots");
        assert_eq!(segments.holds(&name("t"), &at(50)), Holds::Always(true));
        assert_eq!(segments.holds(&name("t"), &at(301)), Holds::Always(false));
        assert!(matches!(
            segments.holds(&name("t"), &at(200)),
            Holds::ByKey(_)
        ));
        assert_eq!(segments.holds(&name("other"), &at(0)), Holds::Always(false));
        assert_eq!(segments.after(&at(300)), Segments::default());
        assert_eq!(segments.after(&at(299)).0.len(), 1);
    }

    /// A quiet step comes soon after a rotation or a large stretch of uncaptured log,
    /// late after a small one (a store on the same server), never at the position.
    #[test]
    fn a_quiet_step_is_owed_only_past_the_position_and_sooner_the_further() {
        let at = |f: &str, p| BinlogPos::new(f, p);
        let a = "b.000001";
        for (end, recorded, expected) in [
            (at(a, 100), at(a, 100), None),
            (at(a, 99), at(a, 100), None),
            (at(a, 101), at(a, 100), Some(QUIET_IDLE)),
            (at(a, 100 + QUIET_BYTES), at(a, 100), Some(QUIET_EVERY)),
            (at("b.000002", 4), at(a, 100), Some(QUIET_EVERY)),
        ] {
            assert_eq!(
                quiet_step_after(&end, &recorded),
                expected,
                "{end} after {recorded}"
            );
        }
    }

    #[test]
    fn mariadb_gtids_read_from_their_event() {
        let mut body = 7u64.to_le_bytes().to_vec();
        body.extend_from_slice(&2u32.to_le_bytes());
        body.push(1);
        let gtid = Gtid::from_event(5, &body).unwrap();
        assert_eq!(gtid.to_string(), "2-5-7");
        assert!(Gtid::standalone(&body));
        assert_eq!(Gtid::from_event(5, &body[..6]), None);
    }

    #[test]
    fn gtid_states_follow_each_domain_and_print_as_the_server_does() {
        let mut state = GtidState::parse("1-2-9, 0-1-5").unwrap();
        assert_eq!(state.to_string(), "0-1-5,1-2-9");
        state.apply(Gtid::parse("0-3-6").unwrap());
        state.apply(Gtid::parse("4-3-1").unwrap());
        assert_eq!(state.to_string(), "0-3-6,1-2-9,4-3-1");
        assert_eq!(GtidState::parse(""), Some(GtidState::default()));
        assert_eq!(GtidState::parse("0-1"), None);
        assert_eq!(GtidState::parse("0-1-x"), None);
    }

    /// The oldest log starts after 0-1-5: a state at 0-1-5 or later misses nothing, one
    /// at 0-1-4 missed 0-1-5; a domain the state never saw lost what was purged of it.
    #[test]
    fn a_purge_past_the_state_in_any_domain_is_found() {
        let state = |t: &str| GtidState::parse(t).unwrap();
        let oldest = state("0-1-5");
        assert_eq!(state("0-1-5").purged_since(&oldest), None);
        assert_eq!(state("0-2-7,1-1-1").purged_since(&oldest), None);
        assert_eq!(state("0-1-4").purged_since(&oldest), Gtid::parse("0-1-5"));
        assert_eq!(
            state("0-1-9").purged_since(&state("0-1-5,3-1-2")),
            Gtid::parse("3-1-2")
        );
        assert_eq!(state("").purged_since(&GtidState::default()), None);
    }

    #[test]
    fn positions_round_trip_as_json() {
        let p = CdcPosition::Stream {
            begin: BinlogPos::new("b.000001", 4),
            end: BinlogPos::new("b.000001", 900),
            gtid: Some("0-1-5".into()),
            gtid_state: GtidState::parse("0-1-5,1-2-9"),
            segments: vec![],
            part: None,
            quiet: false,
        };
        let text = serde_json::to_string(&p).unwrap();
        assert_eq!(
            text,
            r#"{"phase":"stream","begin":{"file":"b.000001","pos":4},"end":{"file":"b.000001","pos":900},"gtid":"0-1-5","gtid_state":"0-1-5,1-2-9"}"#
        );
        let bad = text.replace("1-2-9", "1-2");
        let error = serde_json::from_str::<CdcPosition>(&bad).unwrap_err();
        assert!(error.to_string().contains("not a GTID state"), "{error}");
        assert_eq!(serde_json::from_str::<CdcPosition>(&text).unwrap(), p);
        assert_eq!(p.mid_unit(), None);
        let part = |to| CdcPosition::Stream {
            begin: BinlogPos::new("b.000001", 4),
            end: BinlogPos::new("b.000001", 4),
            gtid: None,
            gtid_state: None,
            segments: vec![],
            part: Some(Part { from: 3, to }),
            quiet: false,
        };
        assert_eq!(
            part(Some(6)).mid_unit(),
            Some(&Part {
                from: 3,
                to: Some(6)
            })
        );
        assert_eq!(part(None).mid_unit(), None);
        let text = serde_json::to_string(&part(Some(6))).unwrap();
        assert!(text.ends_with(r#""part":{"from":3,"to":6}}"#), "{text}");
    }
}
