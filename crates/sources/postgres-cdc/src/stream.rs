//! Streaming from the slot: pgoutput decoded into whole transactions of documents, and
//! the standby status updates that confirm what is durable.
//!
//! ```text
//!  walsender ──XLogData/keepalive──▶ Stream::next ─▶ Item::Txn (docs of one whole transaction)
//!      ▲                                          └─▶ Item::CaughtUp (sent all WAL up to the target)
//!      └──── standby status (flush = confirmed) ◀── feedback task ◀── Source::committed
//! ```
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
    /// The server has sent all the WAL up to the target given at start.
    CaughtUp,
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
    feedback: tokio::task::JoinHandle<()>,
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
}

impl Drop for Stream {
    fn drop(&mut self) {
        self.feedback.abort();
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
    pub fn new(
        name: &str,
        (reader, writer): (Reader, Writer),
        catalog: Catalog,
        types: Types,
        confirmed: Arc<Confirmed>,
        start: Start,
        wal_end: Arc<AtomicU64>,
    ) -> Stream {
        let reply = Arc::new(Notify::new());
        let caught = Arc::new(AtomicBool::new(false));
        let feedback = tokio::spawn(feedback(
            writer,
            confirmed,
            reply.clone(),
            caught.clone(),
            start.skip_through,
        ));
        Stream {
            name: name.to_string(),
            reader,
            feedback,
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
        }
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
                    if !self.caught.load(Ordering::SeqCst)
                        && wal_end >= self.target
                        && self.txn.is_none()
                    {
                        self.caught.store(true, Ordering::SeqCst);
                        return Ok(Item::CaughtUp);
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

/// Sends standby status updates until aborted.
async fn feedback(
    mut writer: Writer,
    confirmed: Arc<Confirmed>,
    reply: Arc<Notify>,
    caught: Arc<AtomicBool>,
    floor: u64,
) {
    loop {
        let catching_up = !caught.load(Ordering::SeqCst);
        let flushed = confirmed.get().max(floor);
        if writer.status(flushed, catching_up).await.is_err() {
            return; // the reader sees the broken connection
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
            Item::CaughtUp => 0,
        };
        Ok(vec![(item, bytes)])
    }
}
