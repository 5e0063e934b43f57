//! Streaming from the slot: pgoutput decoded into transactions of documents (whole, or
//! a large one in parts), and the standby status updates that confirm what is durable.
//!
//! ```text
//!  walsender ──XLogData/keepalive──▶ Stream::next ─▶ Item::Txn (docs of one whole transaction,
//!      ▲                                          │    or of one part of a large one)
//!      │                                          └─▶ Item::Sent (a keepalive between transactions:
//!      │                                               all WAL through wal_end sent; caught up?)
//!      └──── standby status (flush = confirmed) ◀── feedback task ◀── Source::committed
//! ```
//!
//! **Parts.** A transaction is held whole until its Commit, unless it grows past
//! [`PART_DOCS`] documents or [`PART_BYTES`] of text: then what it holds is handed over
//! as a *part* (`end_lsn` none, `first` its first document's index in the
//! transaction) as soon as one more document is decoded, and the rest follows in
//! further parts, the last one with the Commit (`end_lsn` set). No part is empty,
//! the last included. pgoutput v1 sends a transaction only once it committed, so a
//! part handed over before its Commit message is never rolled back; its documents
//! carry the Begin's `final_lsn` as every document of the transaction does. So the
//! stream holds at most one part of a transaction (plus the one or two documents of
//! a change), however large the transaction.
//!
//! **Keepalives between transactions.** A keepalive's `wal_end` is the walsender's
//! `sentPtr`: the end of the last WAL record it decoded. Every transaction whose commit
//! record ends at or before it has been sent before the keepalive (one connection, in
//! order), and any other ends after it. So when no transaction is open in the stream,
//! [`Item::Sent`] says: no transaction of the slot that we have not handed over ends in
//! `(last commit end, wal_end]`. The source turns that into a step without records
//! that moves its position there (`Step::advances`), and once that step is durable the
//! slot confirms `wal_end`: WAL written to tables outside the publication is released
//! while the captured tables are quiet. The walsender sends a keepalive when it waits
//! for WAL while our last status confirmed less than it sent, and at once when a
//! status asks for one; a status goes out every [`STATUS_EVERY`], so a moving WAL end
//! is heard of at least that often.
//!
//! Threads: the read side runs on the source's read-ahead task ([`Prefetch`]) or, for
//! a replay, on the reader's own; the write side is a task of its own, so status updates
//! (every [`STATUS_EVERY`], at once when the server asks or a commit is confirmed) keep
//! the walsender from timing out even while the runtime pauses reading.
//!
//! What is skipped, so that nothing is handed over twice:
//! - whole transactions whose commit ends at or before `skip_through` (the committed
//!   position: a slot confirmed less than was committed redelivers them). Told apart
//!   at their Begin, so that no part of one is handed over: `skip_through` is the end
//!   of a WAL record (a commit end, a keepalive's `sentPtr`, a slot's consistent
//!   point), so a commit record ends at or before it exactly when it starts before it
//!   (checked again at the Commit);
//! - changes that a backfill snapshot already held ([`Segments::holds`]).
//!
//! [`Prefetch`]: sluice_source_sdk::Prefetch

use crate::catalog::Catalog;
use crate::doc::Layout;
use crate::pgoutput::{self, Datum, Message};
use crate::position::{KeyKind, Segments, TableName};
use crate::types::Types;
use crate::wire::{Copy, Reader, WireError, Writer};
use sluice_source_sdk::{Fetch, SourceError};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::Notify;

/// How often a status update is sent (PostgreSQL's `wal_sender_timeout` is 60 s by
/// default); until caught up, each asks for a keepalive, which tells how far the
/// server has sent.
const STATUS_EVERY: Duration = Duration::from_secs(5);
const STATUS_CATCHING_UP: Duration = Duration::from_millis(200);

/// A transaction of more documents than this is handed over in parts of this many
/// (see the module docs): large enough that nearly every transaction is one step,
/// as before parts existed, and one step's hash and documents stay cheap; small
/// enough that a part of wide rows stays a few MiB.
pub const PART_DOCS: usize = 8192;
/// Or in parts of about this much document text (one document more at most): what
/// the stream, the read-ahead and a step hold of one transaction at a time.
pub const PART_BYTES: usize = 8 << 20;

/// When a transaction's documents are handed over as a part ([`PART_DOCS`],
/// [`PART_BYTES`]; lower in tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartBound {
    pub docs: usize,
    pub bytes: usize,
}

impl Default for PartBound {
    fn default() -> Self {
        PartBound {
            docs: PART_DOCS,
            bytes: PART_BYTES,
        }
    }
}

/// One whole transaction as documents, or one part of a large one.
#[derive(Debug)]
pub struct Txn {
    /// Where its commit record starts (each document's `_meta/lsn`).
    pub final_lsn: u64,
    /// Just past its commit record; none in a part that is not the transaction's last.
    pub end_lsn: Option<u64>,
    /// The transaction's index of this part's first document (0: its first part, or
    /// the whole transaction).
    pub first: u64,
    /// The documents' texts back to back; `ends[i]` is where document `i` ends.
    pub text: Vec<u8>,
    pub ends: Vec<usize>,
}

impl Txn {
    pub fn docs(&self) -> impl Iterator<Item = &[u8]> {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let doc = &self.text[start..end];
            start = end;
            doc
        })
    }

    /// How many documents it holds.
    pub fn len(&self) -> u64 {
        self.ends.len() as u64
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// A whole transaction, not a part of one.
    pub fn whole(&self) -> bool {
        self.first == 0 && self.end_lsn.is_some()
    }

    /// The transaction's index just past this part's last document.
    pub fn next(&self) -> u64 {
        self.first + self.len()
    }

    /// Whether a document more makes it larger than a part (see the module docs).
    fn full(&self, bound: PartBound) -> bool {
        !self.ends.is_empty() && (self.ends.len() >= bound.docs || self.text.len() >= bound.bytes)
    }

    /// Hands over the documents decoded so far as a part that is not the
    /// transaction's last; `self` goes on after them.
    fn take_part(&mut self) -> Txn {
        let part = Txn {
            final_lsn: self.final_lsn,
            end_lsn: None,
            first: self.first,
            text: std::mem::take(&mut self.text),
            ends: std::mem::take(&mut self.ends),
        };
        self.first = part.next();
        part
    }

    /// Splits off the documents from the transaction's index `at` on (within this
    /// part): they become the part returned (with the end, if this part had it), and
    /// `self` ends before them (no end).
    pub fn split_off(&mut self, at: u64) -> Txn {
        let keep = (at.saturating_sub(self.first) as usize).min(self.ends.len());
        let cut = if keep == 0 { 0 } else { self.ends[keep - 1] };
        let text = self.text.split_off(cut);
        let ends = self.ends.split_off(keep).iter().map(|e| e - cut).collect();
        Txn {
            final_lsn: self.final_lsn,
            end_lsn: self.end_lsn.take(),
            first: self.first + keep as u64,
            text,
            ends,
        }
    }
}

#[derive(Debug)]
pub enum Item {
    Txn(Txn),
    /// A keepalive with no transaction open: the server has sent every transaction
    /// whose commit ends at or before `wal_end` (see the module docs). Sent when
    /// `wal_end` moved, or when `caught_up`: the first time it reached the target
    /// given at start (all the WAL written before the stream started).
    Sent {
        wal_end: u64,
        caught_up: bool,
    },
}

/// What the source confirms to the slot: shared by `Source::committed` and the
/// feedback task.
#[derive(Debug, Default)]
pub struct Confirmed {
    lsn: AtomicU64,
    changed: Notify,
}

impl Confirmed {
    /// Everything up to `lsn` is durable in the recovery log.
    pub fn confirm(&self, lsn: u64) {
        if self.lsn.fetch_max(lsn, Ordering::SeqCst) < lsn {
            self.changed.notify_one();
        }
    }

    pub fn get(&self) -> u64 {
        self.lsn.load(Ordering::SeqCst)
    }
}

/// A relation as the stream knows it.
struct Rel {
    name: TableName,
    /// (name, type OID) as sent.
    columns: Vec<(String, u32)>,
    key: Vec<usize>,
    kinds: Option<Vec<KeyKind>>,
    layout: Layout,
}

pub struct Stream {
    name: String,
    reader: Reader,
    reply: Arc<Notify>,
    caught: Arc<AtomicBool>,
    catalog: Catalog,
    types: Types,
    relations: HashMap<u32, Rel>,
    skip_through: u64,
    segments: Segments,
    target: u64,
    /// The transaction being decoded (after what earlier parts of it handed over).
    txn: Option<Txn>,
    /// The open transaction commits at or before `skip_through`: its changes are
    /// not decoded.
    skipping: bool,
    bound: PartBound,
    /// Parts split off `txn`, to hand over before anything else (a change may make
    /// two documents, so two parts with a bound of one document).
    ready: VecDeque<Txn>,
    /// The end of the WAL the server reported last (a keepalive's, a message's).
    wal_end: Arc<AtomicU64>,
    /// The last `wal_end` handed out as [`Item::Sent`].
    sent: u64,
}

/// The status-update task of a stream; dropping it ends the task.
pub struct Feedback {
    task: tokio::task::JoinHandle<()>,
    /// Told to send a last status update and stop ([`Feedback::close`]).
    closing: Arc<Notify>,
}

impl Drop for Feedback {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How long [`Feedback::close`] waits for its last status update to go out.
const CLOSE_WAIT: Duration = Duration::from_secs(5);

impl Feedback {
    /// Sends a last status update (what `Source::committed` confirmed so far) and
    /// ends the task: a clean stop releases the WAL of the last commits at once,
    /// rather than at the next start. Waits at most [`CLOSE_WAIT`].
    pub async fn close(mut self) {
        self.closing.notify_one();
        let _ = tokio::time::timeout(CLOSE_WAIT, &mut self.task).await;
    }
}

/// How a stream starts.
pub struct Start {
    pub skip_through: u64,
    pub segments: Segments,
    /// `end_of_input` once the server has sent the WAL up to here.
    pub target: u64,
    pub bound: PartBound,
}

impl Stream {
    /// The stream over a started replication connection, and the task sending its
    /// status updates.
    pub fn new(
        name: &str,
        (reader, writer): (Reader, Writer),
        catalog: Catalog,
        types: Types,
        confirmed: Arc<Confirmed>,
        start: Start,
        wal_end: Arc<AtomicU64>,
    ) -> (Stream, Feedback) {
        let reply = Arc::new(Notify::new());
        let caught = Arc::new(AtomicBool::new(false));
        let closing = Arc::new(Notify::new());
        let feedback = tokio::spawn(feedback(
            writer,
            confirmed,
            reply.clone(),
            caught.clone(),
            closing.clone(),
            start.skip_through,
        ));
        let stream = Stream {
            name: name.to_string(),
            reader,
            reply,
            caught,
            catalog,
            types,
            relations: HashMap::new(),
            skip_through: start.skip_through,
            segments: start.segments,
            target: start.target,
            txn: None,
            skipping: false,
            bound: start.bound,
            ready: VecDeque::new(),
            wal_end,
            sent: 0,
        };
        let feedback = Feedback {
            task: feedback,
            closing,
        };
        (stream, feedback)
    }

    fn io(&self, e: WireError) -> SourceError {
        self.catalog.io(format!("replication stream: {e}"))
    }

    fn malformed(&self, what: String) -> SourceError {
        self.catalog.io(format!("replication stream: {what}"))
    }

    /// The next whole transaction or part of one (or the news of being caught up).
    /// Cancel-safe only in that a cancelled stream is dropped, never used again.
    pub async fn next(&mut self) -> Result<Item, SourceError> {
        loop {
            if let Some(part) = self.ready.pop_front() {
                return Ok(Item::Txn(part));
            }
            let copy = self.reader.next().await.map_err(|e| self.io(e))?;
            let body = match copy {
                Copy::Keepalive { wal_end, reply } => {
                    self.wal_end.fetch_max(wal_end, Ordering::Relaxed);
                    if reply {
                        self.reply.notify_one();
                    }
                    if self.txn.is_some() {
                        continue; // inside a transaction: its commit is still to come
                    }
                    let caught_up = !self.caught.load(Ordering::SeqCst) && wal_end >= self.target;
                    if caught_up {
                        self.caught.store(true, Ordering::SeqCst);
                    }
                    if caught_up || wal_end > self.sent {
                        self.sent = self.sent.max(wal_end);
                        return Ok(Item::Sent { wal_end, caught_up });
                    }
                    continue;
                }
                Copy::Data { body, wal_end } => {
                    self.wal_end.fetch_max(wal_end, Ordering::Relaxed);
                    body
                }
            };
            let message = pgoutput::decode(body).map_err(|e| self.malformed(e.0))?;
            match message {
                Message::Begin { final_lsn } => {
                    self.skipping = final_lsn < self.skip_through;
                    self.txn = Some(Txn {
                        final_lsn,
                        end_lsn: None,
                        first: 0,
                        text: Vec::new(),
                        ends: Vec::new(),
                    });
                }
                Message::Commit { end_lsn } => {
                    let Some(mut txn) = self.txn.take() else {
                        return Err(self.malformed("a commit without its begin".into()));
                    };
                    if std::mem::take(&mut self.skipping) {
                        if end_lsn > self.skip_through {
                            return Err(self.malformed(format!(
                                "the commit record of the transaction at {} ends at {}, past \
                                 the start position {}, which is no record's end",
                                crate::wire::format_lsn(txn.final_lsn),
                                crate::wire::format_lsn(end_lsn),
                                crate::wire::format_lsn(self.skip_through)
                            )));
                        }
                        continue;
                    }
                    txn.end_lsn = Some(end_lsn);
                    return Ok(Item::Txn(txn));
                }
                Message::Relation(rel) => self.relation(rel).await?,
                Message::Insert { relation, new } => self.change(relation, "c", None, &new)?,
                Message::Update { relation, old, new } => {
                    self.change(relation, "u", old.as_deref(), &new)?
                }
                Message::Delete { relation, old } => self.change(relation, "d", Some(&old), &[])?,
                Message::Truncate { relations } => {
                    let names: Vec<String> = relations
                        .iter()
                        .filter_map(|id| self.relations.get(id).map(|r| r.name.to_string()))
                        .collect();
                    return Err(SourceError::Config {
                        name: self.name.clone(),
                        reason: format!(
                            "table {} was truncated (the transaction committing at {}): a \
                             truncate is not a change of some keys, so the store cannot follow \
                             it; reset the pipeline's recovery log and store to snapshot again",
                            names.join(", "),
                            crate::wire::format_lsn(self.txn.as_ref().map_or(0, |t| t.final_lsn))
                        ),
                    });
                }
                Message::Other => {}
            }
            if let Some(part) = self.ready.pop_front() {
                return Ok(Item::Txn(part));
            }
        }
    }

    async fn relation(&mut self, rel: pgoutput::Relation) -> Result<(), SourceError> {
        let name = TableName {
            schema: rel.schema,
            table: rel.table,
        };
        if rel.columns.iter().any(|(_, oid)| !self.types.knows(*oid)) {
            self.types = self.catalog.types().await?;
        }
        let table = self.catalog.table(&name).await?;
        let key: Vec<usize> = table
            .key
            .iter()
            .filter_map(|&k| {
                rel.columns
                    .iter()
                    .position(|(c, _)| *c == table.columns[k].0)
            })
            .collect();
        let layout = Layout::new(&name, &rel.columns);
        self.relations.insert(
            rel.id,
            Rel {
                name,
                columns: rel.columns,
                key,
                kinds: table.kinds,
                layout,
            },
        );
        Ok(())
    }

    /// Appends the document(s) of one change to the transaction: an insert or update of
    /// `new`, or (op `d`) a delete of `old`; an update that changed the key also deletes
    /// the old key.
    fn change(
        &mut self,
        relation: u32,
        op: &str,
        old: Option<&[Datum]>,
        new: &[Datum],
    ) -> Result<(), SourceError> {
        let Some(rel) = self.relations.get(&relation) else {
            return Err(self.malformed(format!(
                "a change of relation {relation} before its description"
            )));
        };
        let Some(txn) = self.txn.as_mut() else {
            return Err(self.malformed("a change outside a transaction".into()));
        };
        if self.skipping {
            return Ok(());
        }
        let key_of = |tuple: &[Datum]| -> Vec<String> {
            rel.key
                .iter()
                .map(|&i| match tuple.get(i) {
                    Some(Datum::Text(t)) => t.clone(),
                    _ => String::new(),
                })
                .collect()
        };
        let final_lsn = txn.final_lsn;
        let held = |key: &[String]| {
            self.segments
                .holds(&rel.name, rel.kinds.as_deref(), key, final_lsn)
        };
        let (bound, ready) = (self.bound, &mut self.ready);
        let mut emit = |txn: &mut Txn, op: &str, tuple: &[Datum], only_key: bool| {
            if txn.full(bound) {
                ready.push_back(txn.take_part());
            }
            let types = &self.types;
            let values = tuple.iter().enumerate().filter_map(|(i, datum)| {
                if only_key && !rel.key.contains(&i) {
                    return None;
                }
                let oid = rel.columns.get(i).map_or(25, |c| c.1);
                match datum {
                    Datum::Null => Some((i, oid, None)),
                    Datum::Unchanged => None,
                    Datum::Text(t) => Some((i, oid, Some(t.as_str()))),
                }
            });
            rel.layout
                .write(&mut txn.text, types, op, txn.final_lsn, values);
            txn.ends.push(txn.text.len());
        };
        if op == "d" {
            let old = old.unwrap_or_default();
            // Only the key columns are sent unless the identity is FULL.
            let full = old
                .iter()
                .enumerate()
                .any(|(i, d)| !rel.key.contains(&i) && *d != Datum::Null);
            if !held(&key_of(old)) {
                emit(txn, "d", old, !full);
            }
            return Ok(());
        }
        let new_key = key_of(new);
        if let Some(old) = old {
            let old_key = key_of(old);
            if old_key != new_key && !held(&old_key) {
                emit(txn, "d", old, true);
            }
        }
        if !held(&new_key) {
            emit(txn, op, new, false);
        }
        Ok(())
    }
}

/// Sends standby status updates until aborted, or until told to close (after one
/// last update).
async fn feedback(
    mut writer: Writer,
    confirmed: Arc<Confirmed>,
    reply: Arc<Notify>,
    caught: Arc<AtomicBool>,
    closing: Arc<Notify>,
    floor: u64,
) {
    let mut last = false;
    loop {
        let catching_up = !caught.load(Ordering::SeqCst);
        let flushed = confirmed.get().max(floor);
        if writer.status(flushed, catching_up).await.is_err() || last {
            return; // the reader sees a broken connection
        }
        let every = if catching_up {
            STATUS_CATCHING_UP
        } else {
            STATUS_EVERY
        };
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = reply.notified() => {}
            _ = confirmed.changed.notified() => {}
            _ = closing.notified() => last = true,
        }
    }
}

/// The read-ahead of a stream: one item per fetch.
pub struct Fetcher(pub Stream);

#[async_trait::async_trait]
impl Fetch for Fetcher {
    type Item = Item;

    async fn fetch(&mut self) -> Result<Vec<(Item, u64)>, SourceError> {
        let item = self.0.next().await?;
        let bytes = match &item {
            Item::Txn(txn) => txn.text.len() as u64,
            Item::Sent { .. } => 0,
        };
        Ok(vec![(item, bytes)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(first: u64, docs: &[&str], end_lsn: Option<u64>) -> Txn {
        let mut txn = Txn {
            final_lsn: 7,
            end_lsn,
            first,
            text: Vec::new(),
            ends: Vec::new(),
        };
        for doc in docs {
            txn.text.extend_from_slice(doc.as_bytes());
            txn.ends.push(txn.text.len());
        }
        txn
    }

    fn texts(txn: &Txn) -> Vec<&str> {
        txn.docs()
            .map(|d| std::str::from_utf8(d).unwrap())
            .collect()
    }

    /// Splitting at a transaction index keeps the documents before it, and the tail
    /// takes the end; an index outside the part leaves all or nothing behind.
    #[test]
    fn a_part_splits_at_a_transaction_index_and_the_tail_keeps_the_end() {
        let mut head = part(3, &["a", "bb", "ccc"], Some(99));
        let tail = head.split_off(5);
        assert_eq!(
            (texts(&head), head.first, head.end_lsn),
            (vec!["a", "bb"], 3, None)
        );
        assert_eq!(
            (texts(&tail), tail.first, tail.end_lsn),
            (vec!["ccc"], 5, Some(99))
        );
        assert!(!tail.whole() && tail.next() == 6);
        let mut all = part(3, &["a"], None);
        let none = all.split_off(9);
        assert_eq!(
            (texts(&all), texts(&none), none.first),
            (vec!["a"], vec![], 4)
        );
        let mut before = part(3, &["a"], Some(1));
        let rest = before.split_off(0);
        assert!(before.is_empty() && rest.first == 3 && rest.end_lsn == Some(1));
    }

    /// A full transaction hands its documents over as a part and goes on after them.
    #[test]
    fn a_full_transaction_hands_over_a_part_and_counts_on() {
        let bound = PartBound {
            docs: 2,
            bytes: 1 << 20,
        };
        let mut txn = part(0, &["a"], None);
        assert!(!txn.full(bound));
        txn = part(0, &["a", "b"], None);
        assert!(txn.full(bound));
        let first = txn.take_part();
        assert_eq!(
            (texts(&first), first.first, first.end_lsn),
            (vec!["a", "b"], 0, None)
        );
        assert!(txn.is_empty() && txn.first == 2 && !txn.full(bound));
        assert!(part(0, &["abc"], None).full(PartBound { docs: 10, bytes: 3 }));
    }
}
