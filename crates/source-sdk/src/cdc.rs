//! What the change-data-capture sources (`postgres_cdc`, `mysql_cdc`) share: one
//! protocol over two databases' logs, its steps made here once.
//!
//! ```text
//!  backfill: Chunks ─(next chunk of a table)─▶ the source's query ─▶ rows ─▶ Journal ─▶ a step journaling its documents
//!            replay_journal(the journaled data) ─▶ the same step again
//!  stream:   Fetch ─▶ TxnReadAhead { ReadAhead, pending } ─take_next─▶ TxnBatch::offer ─▶ stream_step
//!            TxnReadAhead::ready: new input, or the quiet step falling due (quiet_step_wait)
//! ```
//!
//! Both sources read a consistent snapshot first, table by table in primary-key chunks,
//! each step journaling its documents (`Resume::Replay` with data: the snapshot is gone
//! after a crash). Then they stream whole upstream transactions, cut into steps at
//! transaction boundaries within the runtime's limits; a transaction larger than a part
//! comes in parts, each a step of its own (one *unit*). A streamed step is replayed by
//! its position range and checked by the hash [`stream_step`] makes (each document, then
//! a newline). A document names where it comes from by its transaction's log offset and
//! its index in that transaction (`Position::in_log`, [`Unit::Offset`]).
//!
//! What differs stays in each source: its positions (LSNs; binlog files and GTIDs), what
//! a keepalive or heartbeat tells, how a stream reopens inside a unit, the queries.
//!
//! **Quiet steps.** Log the source captures nothing of (other tables, other databases)
//! still moves the server's log; a step without records then moves the checkpoint past
//! it ([`Step::advances`]), so that the server may let that log go. How soon:
//! [`quiet_step_wait`].

use crate::prefetch::{Fetch, ReadAhead};
use crate::{Position, QueueLimits, Queued, Records, Resume, SourceError, Step, StepHasher, Unit};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A quiet step is made once the stream is this much log past the last checkpointed end
/// with nothing captured (or in a later log file), [`QUIET_EVERY`] after the position
/// last moved: a busy server whose captured tables are quiet then checkpoints every few
/// seconds, so a replication slot holds back a WAL segment (16 MiB) or two, and a binary
/// log position stays in the newest files, clear of a purge of the old ones.
pub const QUIET_BYTES: u64 = 1 << 20;
/// The least time between quiet steps (each is a small transaction of its own).
pub const QUIET_EVERY: Duration = Duration::from_secs(3);
/// Below [`QUIET_BYTES`], a quiet step waits this long after the position last moved: a
/// pipeline whose store lives on the same server writes log with each commit, and
/// checkpointing that at once would make a transaction of it every few seconds forever.
pub const QUIET_IDLE: Duration = Duration::from_secs(60);

/// How long after the position last moved a quiet step is made, the stream `past` bytes
/// of log beyond the last checkpointed end (`u64::MAX`: in a later log file).
pub fn quiet_step_wait(past: u64) -> Duration {
    match past >= QUIET_BYTES {
        true => QUIET_EVERY,
        false => QUIET_IDLE,
    }
}

/// A captured table, as positions name it.
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

/// The key ranges of one table read in each snapshot of a backfill restarted after a
/// crash (the snapshot before is gone, so the rest is read in a new one): the source's
/// own segments `S`, each up to which key and in which snapshot, in key order. A
/// streamed change whose key a snapshot read after the change's transaction is skipped:
/// the snapshot already held it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TableSegments<S> {
    #[serde(flatten)]
    pub name: TableName,
    pub segments: Vec<S>,
}

/// The segments of `table` in `tables`, if any were read.
pub fn segments_of<'a, S>(tables: &'a [TableSegments<S>], table: &TableName) -> Option<&'a [S]> {
    let entry = tables.iter().find(|t| &t.name == table)?;
    Some(&entry.segments)
}

/// Only the tables of `tables` with a segment that can still skip something: one `later`
/// than where the stream is.
pub fn segments_after<S: Clone>(
    tables: &[TableSegments<S>],
    later: impl Fn(&S) -> bool,
) -> Vec<TableSegments<S>> {
    (tables.iter())
        .filter(|t| t.segments.iter().any(&later))
        .cloned()
        .collect()
}

/// Adds `segment` to those of `table` (appended: ranges are read in key order).
pub fn push_segment<S>(tables: &mut Vec<TableSegments<S>>, table: &TableName, segment: S) {
    match tables.iter_mut().find(|t| &t.name == table) {
        Some(entry) => entry.segments.push(segment),
        None => tables.push(TableSegments {
            name: table.clone(),
            segments: vec![segment],
        }),
    }
}

/// A transaction of the log as a CDC source decodes it, or a part of a large one.
pub trait Transaction {
    /// Its documents' JSON texts (this part's, if it is one), in order.
    fn docs(&self) -> impl Iterator<Item = &[u8]>;
    /// What a step needs to know of it besides the texts.
    fn meta(&self) -> TxnMeta;
}

/// What a step needs to know of a [`Transaction`] besides its documents' texts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnMeta {
    /// How many documents it holds.
    pub docs: usize,
    /// The bytes of their texts.
    pub bytes: u64,
    /// The transaction's index of its first document (0: its first part, or the whole
    /// transaction).
    pub first: u64,
    /// A whole transaction, not a part of one.
    pub whole: bool,
    /// The log offset its documents name as where they come from.
    pub log_offset: u64,
}

/// The read-ahead of a CDC source's stream: its items fetched ahead (transactions, and
/// what the server says between them), the runtime's Extend and Pause, and a transaction
/// taken from it that the last step had no room for.
pub struct TxnReadAhead<I, T> {
    read_ahead: ReadAhead<I>,
    /// Taken and not handed over: the next step's first transaction (or what is left of a
    /// part a replay split).
    pub pending: Option<T>,
}

/// What a streamed step reads next ([`TxnReadAhead::take_next`]).
pub enum Next<I, T> {
    /// The transaction held back by the step before.
    Pending(T),
    /// The next item of the read-ahead.
    Fetched(I),
}

impl<I: Send + 'static, T: Transaction> TxnReadAhead<I, T> {
    /// Nothing read ahead yet; the read-ahead started later fetches unless `paused` (the
    /// runtime's last word).
    pub fn new(paused: bool) -> Self {
        TxnReadAhead {
            read_ahead: ReadAhead::new(paused),
            pending: None,
        }
    }

    /// Starts reading ahead with `fetcher` (the stream, from where the source is).
    pub fn start<F: Fetch<Item = I>>(&mut self, fetcher: F) {
        self.read_ahead.start(fetcher);
    }

    /// The pending transaction, else the next item read ahead; none: nothing new yet.
    /// The read-ahead's error once it handed out what it read before it.
    pub fn take_next(&mut self) -> Result<Option<Next<I, T>>, SourceError> {
        if let Some(txn) = self.pending.take() {
            return Ok(Some(Next::Pending(txn)));
        }
        let prefetch = self
            .read_ahead
            .running()
            .expect("the read-ahead is started before a step reads it");
        let one = QueueLimits {
            max_records: 1,
            max_bytes: u64::MAX,
            max_journaled: u64::MAX,
        };
        Ok(prefetch.take(one)?.pop().map(Next::Fetched))
    }

    /// Nothing pending and nothing read ahead: a source that has caught up has handed
    /// over everything (its end of input).
    pub fn drained(&self) -> bool {
        self.pending.is_none() && self.read_ahead.queued().records == 0
    }

    /// Returns when a step may have something (`Source::ready`): at once with a
    /// transaction pending or nothing read ahead yet (the next step starts it); else on
    /// new input, or at `quiet_due` when a quiet step is owed.
    pub async fn ready(&self, quiet_due: Option<Instant>) {
        let Some(prefetch) = self.read_ahead.running() else {
            return;
        };
        if self.pending.is_some() {
            return;
        }
        match quiet_due {
            // A quiet step owed: the next step makes it when due.
            Some(due) => tokio::select! {
                () = prefetch.ready() => {}
                () = tokio::time::sleep_until(due.into()) => {}
            },
            None => prefetch.ready().await,
        }
    }

    /// What is read ahead and pending, not yet handed over (`Source::queued`).
    pub fn queued(&self) -> Queued {
        let mut queued = self.read_ahead.queued();
        if let Some(txn) = &self.pending {
            let meta = txn.meta();
            queued.records += meta.docs;
            queued.bytes += meta.bytes;
        }
        queued
    }

    /// The runtime's Extend ([`ReadAhead::extend`]).
    pub fn extend(&mut self) {
        self.read_ahead.extend();
    }

    /// The runtime's Pause ([`ReadAhead::pause`]).
    pub fn pause(&mut self) {
        self.read_ahead.pause();
    }
}

/// The transactions one streamed step takes: whole ones within the runtime's limits (at
/// least one, however large), or one part of a large transaction alone.
pub struct TxnBatch<T> {
    /// Those taken, in the log's order.
    pub txns: Vec<T>,
    records: usize,
    bytes: u64,
}

/// Where a transaction offered to a step goes ([`TxnBatch::offer`]).
pub enum Offer<T> {
    /// Into the step (the last of its `txns`).
    Taken,
    /// A part of a large transaction, with nothing taken before it: a step of its own.
    Part(T),
    /// Not into this step, which ends before it: the next step's first (pending).
    Full(T),
}

impl<T: Transaction> Default for TxnBatch<T> {
    fn default() -> Self {
        TxnBatch {
            txns: Vec::new(),
            records: 0,
            bytes: 0,
        }
    }
}

impl<T: Transaction> TxnBatch<T> {
    /// Takes `txn` if the step has room for it under `limits`.
    pub fn offer(&mut self, txn: T, limits: QueueLimits) -> Offer<T> {
        let meta = txn.meta();
        if !meta.whole {
            return match self.txns.is_empty() {
                true => Offer::Part(txn),
                false => Offer::Full(txn),
            };
        }
        if self.records > 0
            && (self.records + meta.docs > limits.max_records || self.bytes >= limits.max_bytes)
        {
            return Offer::Full(txn);
        }
        self.records += meta.docs;
        self.bytes += meta.bytes;
        self.txns.push(txn);
        Offer::Taken
    }

    /// The documents of the transactions taken.
    pub fn records(&self) -> usize {
        self.records
    }
}

/// What a streamed step holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Streamed {
    /// Whole transactions (maybe none).
    Txns,
    /// None: the position moves past log nothing was captured of ([`Step::advances`]).
    Quiet,
    /// One part of a large transaction; `last`: the part that ends it (the unit's end).
    Part { last: bool },
}

/// The step of the streamed transactions `txns` (whole ones, or the pieces of one part),
/// resuming at `position`: their documents pushed to `out` at their transaction's log
/// offset and index (in the log `origin`), and hashed as a replay hashes them (each
/// document, then a newline). `end_of_input`: the source has caught up and has nothing
/// more buffered (never said inside a unit).
pub fn stream_step<T: Transaction>(
    origin: &Arc<str>,
    txns: &[T],
    out: &mut Records,
    position: Value,
    end_of_input: bool,
    streamed: Streamed,
) -> Step {
    let (mut records, mut bytes, mut hasher) = (0, 0, StepHasher::new());
    for txn in txns {
        let meta = txn.meta();
        for (i, doc) in txn.docs().enumerate() {
            let index = meta.first + i as u64;
            let at = Position::in_log(origin.clone(), Unit::Offset, meta.log_offset, index);
            out.push_json(doc, at, doc.len());
            hasher.append(doc);
            hasher.append(b"\n");
            records += 1;
            bytes += doc.len() as u64;
        }
    }
    let unit_continues = streamed == Streamed::Part { last: false };
    Step {
        records,
        bytes,
        errors: Vec::new(),
        end_of_input: end_of_input && !unit_continues,
        // A last part without documents (after a reopen inside a unit whose documents
        // were all taken) still ends the unit and moves the position.
        advances: match streamed {
            Streamed::Quiet => true,
            Streamed::Part { last } => last && records == 0,
            Streamed::Txns => false,
        },
        unit_continues,
        resume: Resume::Replay {
            position,
            data: None,
            hash: hasher.finish(),
        },
    }
}

/// The documents of a backfill step being read: pushed to the step's records and
/// journaled in its resume, as the snapshot they were read in is gone after a crash
/// ([`replay_journal`] hands them back).
pub struct Journal<'a> {
    out: &'a mut Records,
    origin: Arc<str>,
    /// The log offset of the snapshot the documents were read in.
    snapshot: u64,
    data: Vec<u8>,
    records: usize,
}

impl<'a> Journal<'a> {
    /// An empty step into `out`, of documents read in the snapshot at log offset
    /// `snapshot` of the log `origin`.
    pub fn new(out: &'a mut Records, origin: &Arc<str>, snapshot: u64) -> Journal<'a> {
        Journal {
            out,
            origin: origin.clone(),
            snapshot,
            data: Vec::new(),
            records: 0,
        }
    }

    /// Hands `doc` over and journals it.
    pub fn push(&mut self, doc: &[u8]) {
        self.out.push_json(doc, self.position(), doc.len());
        self.data.extend_from_slice(doc);
        self.data.push(b'\n');
        self.records += 1;
    }

    /// Where the next document comes from: the snapshot, and its index in the step.
    fn position(&self) -> Position {
        Position::in_log(
            self.origin.clone(),
            Unit::Offset,
            self.snapshot,
            self.records as u64,
        )
    }

    pub fn records(&self) -> usize {
        self.records
    }

    /// The bytes journaled so far.
    pub fn bytes(&self) -> u64 {
        self.data.len() as u64
    }

    /// The step, resuming at `position` (the source's backfill position after it).
    pub fn into_step(self, position: Value) -> Step {
        journaled_step(self.records, self.data, position)
    }
}

/// The backfill step journaled as `data` (resuming at `position`) again: its documents
/// pushed to `out` as they were first (documents read in the snapshot at log offset
/// `snapshot` of `origin`).
pub fn replay_journal(
    origin: &Arc<str>,
    snapshot: u64,
    data: &[u8],
    position: &Value,
    out: &mut Records,
) -> Step {
    let mut journal = Journal::new(out, origin, snapshot);
    for line in data.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        journal.out.push_json(line, journal.position(), line.len());
        journal.records += 1;
    }
    journaled_step(journal.records, data.to_vec(), position.clone())
}

/// The step of `records` documents journaled as `data`, hashed as journaled.
fn journaled_step(records: usize, data: Vec<u8>, position: Value) -> Step {
    let mut hasher = StepHasher::new();
    hasher.append(&data);
    Step {
        records,
        bytes: data.len() as u64,
        errors: Vec::new(),
        end_of_input: false,
        advances: false,
        unit_continues: false,
        resume: Resume::Replay {
            position,
            data: Some(data),
            hash: hasher.finish(),
        },
    }
}

/// Where a backfill is in its tables: the table being read, the key of its last row
/// handed over, and the rows of its last chunk not yet handed over. Rows of type `R`, as
/// the source's query returns them.
pub struct Chunks<R> {
    /// The index of the table being read (the number of tables: all read).
    pub table: usize,
    /// The primary key of the last row of `table` handed over (text forms); none: none
    /// yet, or the table is read whole.
    pub after: Option<Vec<String>>,
    rows: VecDeque<R>,
    /// `rows` are the table's last.
    exhausted: bool,
    /// The most rows of a chunk (the source's `chunk_rows`).
    chunk_rows: usize,
}

/// What a backfill step needs next ([`Chunks::fill`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    /// Nothing: the step is full, or every table is read.
    StepEnds,
    /// Table `table` was read to its end (the source records that its whole rest was
    /// read in the current snapshot); then fill again.
    TableRead { table: usize },
    /// At most `limit` rows of table [`Chunks::table`] after [`Chunks::after`] in key
    /// order (all of it when read `whole`), for [`Chunks::add`]; then fill again.
    Chunk { limit: usize, whole: bool },
}

impl<R> Chunks<R> {
    /// From table `table`, after its key `after` (none: from its start), reading at
    /// most `chunk_rows` rows at a time.
    pub fn new(table: usize, after: Option<Vec<String>>, chunk_rows: usize) -> Chunks<R> {
        Chunks {
            table,
            after,
            rows: VecDeque::new(),
            exhausted: false,
            chunk_rows,
        }
    }

    /// Hands rows over into `journal` (one document each, written by `write`) until the
    /// step reaches `limits` or needs rows read. A table read whole (`whole(table)`: its
    /// key cannot bound chunks) is one chunk and a step of its own; the others' rows
    /// come a chunk at a time, and `key` names the last handed over.
    ///
    /// A step ends before the row whose document would take its journal past
    /// `limits.max_journaled` (the room left in its transaction's intent: under a
    /// cluster, what an etcd record holds), however few rows that leaves it, so a chunk
    /// of `chunk_rows` spans as many steps as its bytes need; the step resumes after its
    /// last row's key, and the rows read but not handed over start the next step. A
    /// single row larger than the bound still makes a step alone.
    pub fn fill(
        &mut self,
        journal: &mut Journal<'_>,
        limits: QueueLimits,
        tables: usize,
        whole: impl Fn(usize) -> bool,
        mut write: impl FnMut(usize, &R, &mut Vec<u8>),
        mut key: impl FnMut(usize, &R) -> Vec<String>,
    ) -> Fill {
        let mut doc = Vec::new();
        if self.table >= tables {
            return Fill::StepEnds;
        }
        let whole = whole(self.table);
        if whole && journal.records() > 0 {
            return Fill::StepEnds; // a table read whole is a step of its own
        }
        while let Some(row) = self.rows.pop_front() {
            if !whole
                && journal.records() > 0
                && (journal.records() >= limits.max_records || journal.bytes() >= limits.max_bytes)
            {
                self.rows.push_front(row);
                return Fill::StepEnds;
            }
            doc.clear();
            write(self.table, &row, &mut doc);
            // Journaled as the document and a newline.
            let journaled = journal.bytes() + doc.len() as u64 + 1;
            if !whole && journal.records() > 0 && journaled > limits.max_journaled {
                self.rows.push_front(row);
                return Fill::StepEnds;
            }
            journal.push(&doc);
            if !whole {
                self.after = Some(key(self.table, &row));
            }
        }
        if self.exhausted {
            let read = self.table;
            self.table += 1;
            self.after = None;
            self.exhausted = false;
            return Fill::TableRead { table: read };
        }
        let limit = match whole {
            true => usize::MAX,
            false => self.chunk_rows.min(limits.max_records.max(1)),
        };
        Fill::Chunk { limit, whole }
    }

    /// The rows read for [`Fill::Chunk`] `{ limit, whole }`: fewer than `limit` are the
    /// table's last.
    pub fn add(&mut self, rows: Vec<R>, limit: usize, whole: bool) {
        self.exhausted = whole || rows.len() < limit;
        self.rows.extend(rows);
    }
}

#[cfg(test)]
#[path = "cdc_tests.rs"]
mod tests;
