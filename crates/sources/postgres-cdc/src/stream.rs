//! Streaming from the slot: pgoutput decoded into whole transactions of documents, and
//! the standby status updates that confirm what is durable.
//!
//! ```text
//!  walsender ──XLogData/keepalive──▶ Stream::next ─▶ Item::Txn (docs of one whole transaction)
//!      ▲                                          └─▶ Item::Sent (a keepalive between transactions:
//!      │                                               all WAL through wal_end sent; caught up?)
//!      └──── standby status (flush = confirmed) ◀── feedback task ◀── Source::committed
//! ```
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
//!   position: a slot confirmed less than was committed redelivers them);
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
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::Notify;

/// How often a status update is sent (PostgreSQL's `wal_sender_timeout` is 60 s by
/// default); until caught up, each asks for a keepalive, which tells how far the
/// server has sent.
const STATUS_EVERY: Duration = Duration::from_secs(5);
const STATUS_CATCHING_UP: Duration = Duration::from_millis(200);

/// One whole transaction, as documents.
#[derive(Debug)]
pub struct Txn {
    /// Where its commit record starts (each document's `_meta/lsn`).
    pub final_lsn: u64,
    /// Just past its commit record.
    pub end_lsn: u64,
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
    txn: Option<Txn>,
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

    /// The next whole transaction (or the news of being caught up). Cancel-safe only in
    /// that a cancelled stream is dropped, never used again.
    pub async fn next(&mut self) -> Result<Item, SourceError> {
        loop {
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
                    self.txn = Some(Txn {
                        final_lsn,
                        end_lsn: 0,
                        text: Vec::new(),
                        ends: Vec::new(),
                    });
                }
                Message::Commit { end_lsn } => {
                    let Some(mut txn) = self.txn.take() else {
                        return Err(self.malformed("a commit without its begin".into()));
                    };
                    if end_lsn <= self.skip_through {
                        continue;
                    }
                    txn.end_lsn = end_lsn;
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
        let emit = |txn: &mut Txn, op: &str, tuple: &[Datum], only_key: bool| {
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
