//! The PostgreSQL CDC source: a backfill consistent with the slot, then the slot's
//! changes, exactly once.
//!
//! ```text
//!  first command, no checkpoint:  checks ─▶ CREATE_REPLICATION_SLOT s LOGICAL pgoutput EXPORT_SNAPSHOT (at C)
//!      backfill: SET TRANSACTION SNAPSHOT; per table, chunks in primary-key order ─▶ steps (journaled)
//!      stream:   START_REPLICATION SLOT s LOGICAL C ─▶ whole transactions ─▶ steps (replayed by LSN range)
//!                                       a large one's parts ─▶ a step each (one unit)
//!  Source::committed(stream step ending at E) ─▶ the slot confirms E (never earlier)
//! ```
//!
//! **Backfill steps** journal their documents (`Resume::Replay` with data): the
//! snapshot they were read under is gone after a crash. A crash mid-backfill resumes
//! after the last committed key under a new snapshot, exported by a temporary slot at
//! L2 ≥ C, and records the range read before as a segment ([`crate::position`]), so
//! that streaming from C skips exactly the changes each snapshot already held. A table
//! whose primary key cannot be compared outside PostgreSQL (not integers, text or uuid)
//! is read whole, as one step.
//!
//! **Streaming steps** are whole transactions cut at commit boundaries, their position
//! the range of commit ends `(begin, end]` (a transaction larger than the limits is one
//! step). They are replayed by position: the slot confirms only what the recovery log
//! holds ([`Source::committed`]), so after a crash it still holds the step, which is
//! re-read from `begin` and checked by its hash; transactions ending at or below the
//! committed `end` are skipped.
//!
//! **Large transactions** come from the stream in parts ([`crate::stream`]), and each
//! part is a step of its own (never shared with other transactions), all but the last
//! with `Step::unit_continues`: the runtime commits the parts of one upstream
//! transaction in one of its transactions, so it still commits every upstream
//! transaction whole, while neither the stream, the read-ahead nor a step holds more
//! than a part of it. A part's position ([`crate::position::Part`]) names its
//! documents by their index in the transaction: its replay re-reads the slot from the
//! transaction's `begin` and hands exactly those (an interrupted unit replays part
//! after part on one stream). Only a unit's end is checkpointed; `seek` refuses a
//! position inside one.
//!
//! **Quiet steps.** WAL written to tables outside the publication (or other
//! databases) reaches the stream only as keepalives. When one arrives between
//! transactions with nothing buffered, no transaction of the slot ends between the
//! last step's end and its `wal_end` ([`crate::stream`]); the source then makes a step
//! without records that moves its position there (`Step::advances`, position
//! `quiet: true`), at most every few seconds ([`crate::position::quiet_step_after`]).
//! The runtime commits it, and `committed` confirms it like any streamed step: the
//! slot advances while its tables are quiet, and never past what the recovery log
//! holds. Its replay reads the slot to the first keepalive at or past its end and
//! expects no transaction before it.
//!
//! **Seeking back.** The server starts `START_REPLICATION` at the slot's
//! `confirmed_flush_lsn` when asked for less, silently. So `seek` (and every stream
//! start) compares the position with it and refuses with [`SourceError::SeekBack`]
//! when the slot has confirmed past it: recovery adopted a checkpoint older than what
//! the slot released (a store restored from a backup, a failover).
//!
//! `end_of_input` is never said during the backfill; while streaming it says the
//! server has sent everything written before the stream started and nothing is
//! buffered (the runtime ends a run there; `--follow` goes on).
//!
//! Length: about 1150 lines, over the house's 800, as the phases share the opening;
//! the pure rules already live in `position`, the I/O in `catalog`, `wire`, `stream`
//! and `monitor`, the replay of streamed steps in `source/replay.rs`, and what it
//! shares with `mysql_cdc` (chunked backfill steps, the read-ahead of transactions, the
//! step-making) in `sluice_source_sdk::cdc`. Splitting the backfill phase out is the
//! next cut.

mod replay;

use crate::catalog::{Catalog, Table};
use crate::config::{PostgresCdcConfig, split_table};
use crate::doc::Layout;
use crate::monitor::{Monitor, Watch};
use crate::position::{CdcPosition, Part, Segments, TableName, quiet_step_after};
use crate::stream::{Confirmed, Feedback, Fetcher, Item, PartBound, Start, Stream, Txn};
use crate::types::Types;
use crate::wire::{self, Target, WireError, format_lsn, parse_lsn};
use serde_json::Value;
use sluice_source_sdk::cdc::{
    self, Chunks, Fill, Journal, Next, Offer, Streamed, Transaction, TxnBatch, TxnMeta,
    TxnReadAhead,
};
use sluice_source_sdk::tls::rustls::ClientConfig;
use sluice_source_sdk::{
    FaultTolerance, InvalidConfig, Lag, QueueLimits, Queued, Records, Resume, Source, SourceError,
    Step, check_replay, parse_resume,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long a start waits for the slot to be released by an earlier walsender (one
/// of a killed process lingers until it notices).
const SLOT_BUSY_WAIT: Duration = Duration::from_secs(60);

/// What a streamed step holds.
#[derive(Debug, Clone, Copy)]
enum Shape {
    /// Whole transactions (maybe none).
    Txns,
    /// None, moving the position to a keepalive's end ([`Step::advances`]).
    Quiet,
    /// One part of a large transaction.
    Part(Part),
}

impl Transaction for Txn {
    fn docs(&self) -> impl Iterator<Item = &[u8]> {
        Txn::docs(self)
    }

    fn meta(&self) -> TxnMeta {
        TxnMeta {
            docs: self.ends.len(),
            bytes: self.text.len() as u64,
            first: self.first,
            whole: self.whole(),
            // Where its commit record starts (each document's `_meta/lsn`).
            log_offset: self.final_lsn,
        }
    }
}

pub struct PostgresCdcSource {
    name: String,
    config: PostgresCdcConfig,
    target: Target,
    /// How both connections check the server's certificate (the CA file read at open).
    tls: Arc<ClientConfig>,
    /// The URL without its password, for messages.
    url: String,
    slot: String,
    publication: String,
    /// Where records come from, as positions read: `slot s`.
    origin: Arc<str>,
    confirmed: Arc<Confirmed>,
    /// The end of the server's WAL, as its replication stream last reported it.
    wal_end: Arc<AtomicU64>,
    /// Where the next open continues (a seek or a replay); none: from scratch.
    resume: Option<CdcPosition>,
    phase: Phase,
    paused: bool,
    /// The slot's retained WAL and the heartbeat, from the first open on.
    monitor: Option<Monitor>,
    /// When a transaction is handed over in parts.
    bound: PartBound,
}

enum Phase {
    /// Nothing open: the next command opens from `resume`.
    Idle,
    Backfill(Box<Backfill>),
    Stream(Box<Streaming>),
}

struct Backfill {
    /// The replication connection whose snapshot the catalog's transaction uses (and
    /// whose temporary slot, after a restart, lives as long as it does).
    _holder: wire::Connection,
    catalog: Catalog,
    types: Types,
    tables: Vec<Table>,
    layouts: Vec<Layout>,
    consistent: u64,
    /// The table being read, the key of its last row handed over, its rows read and
    /// not yet handed over.
    chunks: Chunks<Vec<Option<String>>>,
    snapshot: u64,
    segments: Segments,
}

/// A slot's exported snapshot, being read.
struct Exported {
    /// The replication connection that must stay open while the snapshot is read.
    holder: wire::Connection,
    /// The connection whose transaction reads in the snapshot.
    catalog: Catalog,
    /// The type catalog as of the snapshot.
    types: Types,
    /// The LSN the snapshot is consistent with.
    lsn: u64,
}

struct Streaming {
    /// A stream not yet reading ahead (after a replay); taken by the read-ahead.
    stream: Option<Stream>,
    read_ahead: TxnReadAhead<Item, Txn>,
    /// The stream's status updates (ended cleanly at `disconnect`).
    feedback: Feedback,
    /// The commit end of the last transaction handed over, or a quiet step's end.
    end: u64,
    /// Inside a large transaction, the one committing first after `end`: the parts
    /// handed over so far.
    unit: Option<InUnit>,
    segments: Segments,
    caught_up: bool,
    /// The highest `wal_end` of a keepalive between transactions taken from the
    /// stream: every transaction ending at or before it was taken (see
    /// [`crate::stream`]).
    sent: u64,
    /// The end of the last step the runtime checkpoints (one with records, or quiet).
    recorded: u64,
    /// When `recorded` last moved (or the stream started).
    moved: Instant,
}

/// How far the parts of a large transaction were handed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct InUnit {
    /// Where its commit record starts.
    lsn: u64,
    /// The index of its next document to hand over.
    next: u64,
}

impl Streaming {
    fn new(
        stream: Stream,
        feedback: Feedback,
        from: u64,
        segments: Segments,
        unit: Option<InUnit>,
        paused: bool,
    ) -> Streaming {
        Streaming {
            stream: Some(stream),
            read_ahead: TxnReadAhead::new(paused),
            feedback,
            end: from,
            unit,
            segments,
            caught_up: false,
            sent: 0,
            recorded: from,
            moved: Instant::now(),
        }
    }

    /// When a quiet step is due, if one is owed (never inside a unit).
    fn quiet_due(&self) -> Option<Instant> {
        if self.unit.is_some() {
            return None;
        }
        quiet_step_after(self.sent, self.end, self.recorded).map(|after| self.moved + after)
    }
}

impl PostgresCdcSource {
    pub fn new(
        name: &str,
        materialization: &str,
        config: &PostgresCdcConfig,
    ) -> Result<Self, SourceError> {
        let invalid = |e: InvalidConfig| SourceError::Config {
            name: name.to_string(),
            reason: e.to_string(),
        };
        let target = config.target().map_err(invalid)?;
        let tls = Arc::new(target.ssl.client_config().map_err(invalid)?);
        let slot = config.slot_name(materialization, name);
        let url = format!(
            "postgres://{}@{}:{}/{}",
            target.user, target.host, target.port, target.database
        );
        Ok(PostgresCdcSource {
            name: name.to_string(),
            config: config.clone(),
            target,
            tls,
            url,
            publication: config.publication_name(&slot),
            origin: format!("slot {slot}").into(),
            slot,
            confirmed: Arc::new(Confirmed::default()),
            wal_end: Arc::new(AtomicU64::new(0)),
            resume: None,
            phase: Phase::Idle,
            paused: false,
            monitor: None,
            bound: PartBound::default(),
        })
    }

    /// Hands a transaction of more than `docs` documents over in parts of `docs`
    /// (`stream::PART_DOCS` by default), so that tests need not write thousands of rows.
    /// Takes effect at the next stream start.
    #[doc(hidden)]
    pub fn set_part_docs(&mut self, docs: usize) {
        self.bound.docs = docs.max(1);
    }

    /// The replication slot this source reads.
    pub fn slot(&self) -> &str {
        &self.slot
    }

    fn config_error(&self, reason: String) -> SourceError {
        SourceError::Config {
            name: self.name.clone(),
            reason,
        }
    }

    fn wire_error(&self, what: &str, e: WireError) -> SourceError {
        match e {
            WireError::Server { code, message } if code == "55000" && message.contains("wal_level") => {
                self.config_error(format!("{what} at {}: {message}: set wal_level = logical and restart the server", self.url))
            }
            WireError::Server { code, message } if code == "42501" => self.config_error(format!(
                "{what} at {}: {message}: the user needs the REPLICATION attribute (ALTER ROLE … REPLICATION)",
                self.url
            )),
            WireError::Tls(why) => self.config_error(format!(
                "{what} at {} ({}): {why}",
                self.url,
                self.target.ssl.describe()
            )),
            e => SourceError::Io {
                name: self.name.clone(),
                path: self.url.clone(),
                error: std::io::Error::other(format!("{what}: {e}")),
            },
        }
    }

    /// The refusal of a position behind what the slot confirmed (see the module docs).
    fn seek_back(&self, from: u64, confirmed: u64) -> SourceError {
        let (from, confirmed) = (format_lsn(from), format_lsn(confirmed));
        SourceError::SeekBack {
            name: self.name.clone(),
            position: Value::from(from.clone()),
            reason: format!(
                "replication slot `{}` at {} has confirmed LSN {confirmed}, past LSN {from} \
                 where the checkpoint being resumed continues: the server released the \
                 changes between them and would silently start at {confirmed}. The \
                 checkpoint is older than what the slot confirmed (a store restored from a \
                 backup, a failover to an asynchronous replica, a store that lost its last \
                 commits, a slot advanced or created again by hand). Restore a store whose \
                 checkpoint is at or after LSN {confirmed}, or start over with `sluice \
                 apply --delete <pipeline>` and run again: the tables are then snapshotted \
                 anew in a new slot",
                self.slot, self.url
            ),
        }
    }

    /// Refuses to continue from `from` when the slot has confirmed past it; nothing to
    /// check while the slot does not exist (opening then says it is gone).
    async fn check_slot_at(&self, catalog: &Catalog, from: u64) -> Result<(), SourceError> {
        match catalog.slot(&self.slot).await? {
            Some(confirmed) if from < confirmed => Err(self.seek_back(from, confirmed)),
            _ => Ok(()),
        }
    }

    /// Starts watching the slot (retained WAL, heartbeat) if not yet.
    fn watch(&mut self) {
        if self.monitor.is_none() {
            self.monitor = Some(Monitor::spawn(Watch {
                name: self.name.clone(),
                target: self.target.clone(),
                tls: self.tls.clone(),
                redacted: self.url.clone(),
                slot: self.slot.clone(),
                heartbeat: self.config.heartbeat,
                retained_warning: self.config.retained_warning,
            }));
        }
    }

    fn slot_gone(&self, position: u64) -> SourceError {
        SourceError::Unavailable {
            name: self.name.clone(),
            position: Value::from(format_lsn(position)),
            reason: format!(
                "replication slot `{}` no longer exists at {}: the changes after LSN {} \
                 are lost to this pipeline; reset its recovery log and store, and it \
                 snapshots the tables again in a new slot",
                self.slot,
                self.url,
                format_lsn(position)
            ),
        }
    }

    async fn catalog(&self) -> Result<Catalog, SourceError> {
        let catalog = Catalog::connect(&self.name, &self.target, &self.tls, &self.url).await?;
        catalog.check_wal_level().await?;
        Ok(catalog)
    }

    async fn replication(&self) -> Result<wire::Connection, SourceError> {
        wire::Connection::connect(&self.target, &self.tls)
            .await
            .map_err(|e| self.wire_error("cannot open a replication connection", e))
    }

    /// Creates a slot exporting its snapshot on `conn`; returns (consistent point,
    /// snapshot name).
    async fn create_slot(
        &self,
        conn: &mut wire::Connection,
        slot: &str,
        temporary: bool,
    ) -> Result<(u64, String), SourceError> {
        let temporary = if temporary { " TEMPORARY" } else { "" };
        let rows = conn
            .query(&format!(
                "CREATE_REPLICATION_SLOT {slot}{temporary} LOGICAL pgoutput EXPORT_SNAPSHOT"
            ))
            .await
            .map_err(|e| self.wire_error(&format!("cannot create replication slot {slot}"), e))?;
        let row = rows.first().ok_or_else(|| {
            self.wire_error(
                "CREATE_REPLICATION_SLOT",
                WireError::Io(std::io::Error::other("no row")),
            )
        })?;
        let lsn = row
            .get(1)
            .cloned()
            .flatten()
            .as_deref()
            .and_then(parse_lsn)
            .unwrap_or(0);
        let snapshot = row.get(2).cloned().flatten().unwrap_or_default();
        Ok((lsn, snapshot))
    }

    /// Opens from `resume`, if nothing is open.
    async fn open(&mut self) -> Result<(), SourceError> {
        if !matches!(self.phase, Phase::Idle) {
            return Ok(());
        }
        self.phase = match self.resume.clone() {
            None => self.fresh().await?,
            Some(CdcPosition::Backfill {
                consistent,
                tables,
                table,
                after,
                snapshot,
                segments,
            }) => {
                let mut segments = Segments(segments);
                if table >= tables.len() {
                    self.streaming(consistent, segments, None).await?
                } else {
                    if let Some(after) = &after {
                        segments.push(&tables[table], Some(after.clone()), snapshot);
                    }
                    self.restart_backfill(consistent, tables, table, after, segments)
                        .await?
                }
            }
            // Inside a unit (the queue failed mid-unit, or a part was replayed): from
            // the unit's start, handing over only its documents after those taken.
            Some(CdcPosition::Stream {
                begin,
                segments,
                part: Some(part),
                ..
            }) if part.to.is_some() => {
                let unit = InUnit {
                    lsn: part.lsn,
                    next: part.to.unwrap_or_default(),
                };
                self.streaming(begin, Segments(segments), Some(unit))
                    .await?
            }
            Some(CdcPosition::Stream { end, segments, .. }) => {
                self.streaming(end, Segments(segments), None).await?
            }
        };
        Ok(())
    }

    /// The tables the configuration lists, if it lists them (else the publication's).
    fn listed_tables(&self) -> Option<Vec<TableName>> {
        self.config.tables.as_ref().map(|tables| {
            tables
                .iter()
                .filter_map(|t| split_table(t))
                .map(|(schema, table)| TableName { schema, table })
                .collect()
        })
    }

    /// No checkpoint: the checks, the publication, a new slot and its snapshot.
    async fn fresh(&mut self) -> Result<Phase, SourceError> {
        let catalog = self.catalog().await?;
        let listed = self.listed_tables();
        catalog
            .ensure_publication(&self.publication, listed.as_deref())
            .await?;
        let tables = catalog.tables(&self.publication).await?;
        if catalog.slot(&self.slot).await?.is_some() {
            // Nothing was committed from it (there is no checkpoint): a start that
            // crashed before its first commit, or a pipeline reset.
            tracing::warn!(source = %self.name, slot = %self.slot, "the slot exists but no checkpoint does: dropping it to snapshot anew");
            catalog.drop_slot(&self.slot).await?;
        }
        let slot = self.slot.clone();
        let exported = self.exported_snapshot(catalog, &slot, false).await?;
        let consistent = exported.lsn;
        Ok(Self::backfill(
            self.config.chunk_rows,
            exported,
            tables,
            consistent,
            0,
            None,
            Segments::default(),
        ))
    }

    /// A checkpoint mid-backfill: the rest under a new snapshot.
    async fn restart_backfill(
        &mut self,
        consistent: u64,
        names: Vec<TableName>,
        table: usize,
        after: Option<Vec<String>>,
        segments: Segments,
    ) -> Result<Phase, SourceError> {
        let catalog = self.catalog().await?;
        match catalog.slot(&self.slot).await? {
            None => return Err(self.slot_gone(consistent)),
            Some(confirmed) if consistent < confirmed => {
                return Err(self.seek_back(consistent, confirmed));
            }
            Some(_) => {}
        }
        let mut tables = Vec::new();
        for name in &names {
            tables.push(catalog.table(name).await?);
        }
        let temporary =
            crate::config::sanitize_slot(&format!("{}_snap_{}", self.slot, std::process::id()));
        let exported = self.exported_snapshot(catalog, &temporary, true).await?;
        Ok(Self::backfill(
            self.config.chunk_rows,
            exported,
            tables,
            consistent,
            table,
            after,
            segments,
        ))
    }

    /// Creates `slot` (temporary or not) exporting its snapshot, and has `catalog` read
    /// in it.
    async fn exported_snapshot(
        &mut self,
        catalog: Catalog,
        slot: &str,
        temporary: bool,
    ) -> Result<Exported, SourceError> {
        let mut holder = self.replication().await?;
        let (lsn, snapshot) = self.create_slot(&mut holder, slot, temporary).await?;
        catalog.begin_snapshot(&snapshot).await?;
        let types = catalog.types().await?;
        Ok(Exported {
            holder,
            catalog,
            types,
            lsn,
        })
    }

    /// The backfill of `tables` from `table` (after the key `after`), read in `exported`
    /// `chunk_rows` rows at a time.
    fn backfill(
        chunk_rows: usize,
        exported: Exported,
        tables: Vec<Table>,
        consistent: u64,
        table: usize,
        after: Option<Vec<String>>,
        segments: Segments,
    ) -> Phase {
        let layouts = tables
            .iter()
            .map(|t| Layout::new(&t.name, &t.columns))
            .collect();
        Phase::Backfill(Box::new(Backfill {
            _holder: exported.holder,
            catalog: exported.catalog,
            types: exported.types,
            tables,
            layouts,
            consistent,
            chunks: Chunks::new(table, after, chunk_rows),
            snapshot: exported.lsn,
            segments,
        }))
    }

    /// Streams from `from` (a commit end, or the consistent point), inside `unit` if
    /// some.
    async fn streaming(
        &mut self,
        from: u64,
        segments: Segments,
        unit: Option<InUnit>,
    ) -> Result<Phase, SourceError> {
        let (stream, feedback) = self.stream_from(from, segments.clone()).await?;
        Ok(Phase::Stream(Box::new(Streaming::new(
            stream,
            feedback,
            from,
            segments,
            unit,
            self.paused,
        ))))
    }

    /// Starts replication at `from`, refusing when the slot confirmed past it (the
    /// server would start later without a word).
    async fn stream_from(
        &mut self,
        from: u64,
        segments: Segments,
    ) -> Result<(Stream, Feedback), SourceError> {
        let catalog = self.catalog().await?;
        match catalog.slot(&self.slot).await? {
            None => return Err(self.slot_gone(from)),
            Some(confirmed) if from < confirmed => return Err(self.seek_back(from, confirmed)),
            Some(_) => {}
        }
        let types = catalog.types().await?;
        let target = catalog.current_lsn().await?;
        let command = format!(
            "START_REPLICATION SLOT {} LOGICAL {} (proto_version '1', publication_names {})",
            self.slot,
            format_lsn(from),
            crate::catalog::quote_literal(&crate::catalog::quote_ident(&self.publication))
        );
        let started = Instant::now();
        let halves = loop {
            let conn = self.replication().await?;
            match conn.start(&command).await {
                Ok(halves) => break halves,
                // An earlier walsender of this slot has not noticed its client died.
                Err(WireError::Server { code, .. })
                    if code == "55006" && started.elapsed() < SLOT_BUSY_WAIT =>
                {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(WireError::Server { code, .. }) if code == "42704" => {
                    return Err(self.slot_gone(from));
                }
                Err(e) => return Err(self.wire_error("cannot start replication", e)),
            }
        };
        self.confirmed.confirm(0);
        Ok(Stream::new(
            &self.name,
            halves,
            catalog,
            types,
            self.confirmed.clone(),
            Start {
                skip_through: from,
                segments,
                target,
                bound: self.bound,
            },
            self.wal_end.clone(),
        ))
    }

    async fn queue_backfill(
        &mut self,
        limits: QueueLimits,
        out: &mut Records,
    ) -> Result<Option<Step>, SourceError> {
        let Phase::Backfill(b) = &mut self.phase else {
            return Ok(None);
        };
        let Backfill {
            catalog,
            types,
            tables,
            layouts,
            consistent,
            chunks,
            snapshot,
            segments,
            ..
        } = &mut **b;
        let mut journal = Journal::new(out, &self.origin, *snapshot);
        loop {
            let fill = chunks.fill(
                &mut journal,
                limits,
                tables.len(),
                // Its key cannot be compared outside PostgreSQL: read whole.
                |i| tables[i].kinds.is_none(),
                |i, row, doc| {
                    let table = &tables[i];
                    let values = (row.iter().enumerate())
                        .map(|(c, v)| (c, table.columns[c].1, v.as_deref()));
                    layouts[i].write(doc, types, "r", *snapshot, values);
                },
                |i, row| {
                    (tables[i].key.iter())
                        .map(|&c| row[c].clone().unwrap_or_default())
                        .collect()
                },
            );
            match fill {
                Fill::StepEnds => break,
                Fill::TableRead { table } => segments.push(&tables[table].name, None, *snapshot),
                Fill::Chunk { limit, whole } => {
                    let table = &tables[chunks.table];
                    let rows = catalog.chunk(table, chunks.after.as_deref(), limit).await?;
                    chunks.add(rows, limit, whole);
                }
            }
        }
        if chunks.table >= tables.len() && journal.records() == 0 {
            // Nothing left to read: stream from the consistent point.
            let (consistent, segments) = (*consistent, segments.clone());
            self.phase = Phase::Idle;
            self.resume = Some(CdcPosition::Stream {
                begin: consistent,
                end: consistent,
                segments: segments.0,
                quiet: false,
                part: None,
            });
            return Ok(None);
        }
        let position = CdcPosition::Backfill {
            consistent: *consistent,
            tables: tables.iter().map(|t| t.name.clone()).collect(),
            table: chunks.table,
            after: chunks.after.clone(),
            snapshot: *snapshot,
            segments: segments.0.clone(),
        };
        let position = serde_json::to_value(&position).expect("a position serializes");
        Ok(Some(journal.into_step(position)))
    }

    /// The step of the whole transactions `txns`, ending at `end`, or of one part of a
    /// large transaction (`txns` its pieces) ([`cdc::stream_step`]).
    fn stream_step(
        &self,
        (begin, end): (u64, u64),
        segments: &Segments,
        txns: &[Txn],
        out: &mut Records,
        (end_of_input, shape): (bool, Shape),
    ) -> Step {
        let (quiet, part, streamed) = match shape {
            Shape::Txns => (false, None, Streamed::Txns),
            Shape::Quiet => (true, None, Streamed::Quiet),
            Shape::Part(part) => (
                false,
                Some(part),
                Streamed::Part {
                    last: part.to.is_none(),
                },
            ),
        };
        let position = CdcPosition::Stream {
            begin,
            end,
            segments: segments.after(begin).0,
            quiet,
            part,
        };
        let position = serde_json::to_value(&position).expect("a position serializes");
        cdc::stream_step(&self.origin, txns, out, position, end_of_input, streamed)
    }

    /// After a streamed step failed: the next open goes on where the step began
    /// (inside its unit, after the documents taken before, if it was in one).
    fn failed_at(&mut self, begin: u64, unit: Option<InUnit>) {
        let segments = match &self.phase {
            Phase::Stream(s) => s.segments.0.clone(),
            _ => Vec::new(),
        };
        self.phase = Phase::Idle;
        self.resume = Some(CdcPosition::Stream {
            begin,
            end: begin,
            segments,
            quiet: false,
            part: unit.map(|u| Part {
                lsn: u.lsn,
                from: u.next,
                to: Some(u.next),
            }),
        });
    }
}

#[async_trait::async_trait]
impl Source for PostgresCdcSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn fault_tolerance(&self) -> FaultTolerance {
        FaultTolerance::ExactlyOnce
    }

    /// The server, its `wal_level`, the tables (each with a primary key) or the
    /// publication that names them, and a replication connection; no slot is made.
    async fn probe(&mut self) -> Result<(), SourceError> {
        let catalog = self.catalog().await?;
        match self.listed_tables() {
            Some(listed) => {
                for table in &listed {
                    catalog.table(table).await?;
                }
            }
            None => {
                catalog.ensure_publication(&self.publication, None).await?;
                catalog.tables(&self.publication).await?;
            }
        }
        self.replication().await.map(drop)
    }

    /// Records the position, after checking that the slot has not confirmed past
    /// where it continues (refused with [`SourceError::SeekBack`]: the server would
    /// silently start later). The stream opens at the first `queue` or `replay`.
    async fn seek(&mut self, position: &Value) -> Result<(), SourceError> {
        let value = position;
        let position: CdcPosition = parse_resume(&self.name, "seek to", value)?;
        if let Some(part) = position.mid_unit() {
            return Err(SourceError::bad_resume(
                &self.name,
                "seek to",
                value,
                format!(
                    "the position lies inside the transaction committing at {} (after its \
                     document {}): the runtime checkpoints only where a unit ends, so no \
                     checkpoint holds it",
                    format_lsn(part.lsn),
                    part.to.unwrap_or_default()
                ),
            ));
        }
        self.phase = Phase::Idle;
        let from = match &position {
            CdcPosition::Backfill { consistent, .. } => *consistent,
            CdcPosition::Stream { end, .. } => *end,
        };
        let catalog = self.catalog().await?;
        self.check_slot_at(&catalog, from).await?;
        self.resume = Some(position);
        Ok(())
    }

    async fn replay(&mut self, step: &Resume, out: &mut Records) -> Result<Step, SourceError> {
        let Resume::Replay { position, data, .. } = step else {
            let resume = serde_json::to_value(step).expect("a resume serializes");
            return Err(SourceError::bad_resume(
                &self.name,
                "replay",
                &resume,
                "not a step of this source".into(),
            ));
        };
        let parsed: CdcPosition = parse_resume(&self.name, "replay", position)?;
        let first = out.len();
        let replayed = match (&parsed, data) {
            (CdcPosition::Backfill { snapshot, .. }, Some(data)) => {
                let step = cdc::replay_journal(&self.origin, *snapshot, data, position, out);
                self.phase = Phase::Idle;
                step
            }
            (
                CdcPosition::Stream {
                    begin,
                    end,
                    segments,
                    quiet,
                    part,
                },
                None,
            ) if !(*quiet && part.is_some()) => {
                self.watch();
                let shape = match (quiet, part) {
                    (_, Some(part)) => Shape::Part(*part),
                    (true, None) => Shape::Quiet,
                    (false, None) => Shape::Txns,
                };
                match self
                    .replay_stream((*begin, *end), Segments(segments.clone()), shape, out)
                    .await
                {
                    Ok(step) => step,
                    Err(e) => {
                        out.truncate(first);
                        self.phase = Phase::Idle;
                        return Err(e);
                    }
                }
            }
            _ => {
                return Err(SourceError::bad_resume(
                    &self.name,
                    "replay",
                    position,
                    "a backfill step journals its rows, a streamed one does not, and a \
                     quiet step is no part of a transaction"
                        .into(),
                ));
            }
        };
        if let Err(e) = check_replay(&self.name, step, replayed.resume.hash()) {
            out.truncate(first);
            self.phase = Phase::Idle;
            return Err(e);
        }
        self.resume = Some(parsed);
        Ok(replayed)
    }

    async fn queue(&mut self, limits: QueueLimits, out: &mut Records) -> Result<Step, SourceError> {
        self.watch();
        self.open().await?;
        if let Some(step) = self.queue_backfill(limits, out).await? {
            return Ok(step);
        }
        self.open().await?; // the backfill may have just ended
        let Phase::Stream(s) = &mut self.phase else {
            unreachable!("opened above: a backfill returns its step, else the stream is open")
        };
        if let Some(stream) = s.stream.take() {
            s.read_ahead.start(Fetcher(stream));
        }
        let (begin, unit) = (s.end, s.unit);
        let mut batch = TxnBatch::default();
        let mut part = None;
        loop {
            let txn = match s.read_ahead.take_next() {
                Ok(None) => break,
                Ok(Some(Next::Pending(txn) | Next::Fetched(Item::Txn(txn)))) => txn,
                Ok(Some(Next::Fetched(Item::Sent { wal_end, caught_up }))) => {
                    s.caught_up |= caught_up;
                    s.sent = s.sent.max(wal_end);
                    continue;
                }
                Err(e) => {
                    self.failed_at(begin, unit);
                    return Err(e);
                }
            };
            let continued = match s.unit {
                None => Ok(Some(txn)),
                Some(unit) => after_handed(unit, txn),
            };
            let txn = match continued {
                Ok(Some(txn)) => txn,
                Ok(None) => continue,
                Err(reason) => {
                    let e = SourceError::Unavailable {
                        name: self.name.clone(),
                        position: Value::from(format_lsn(begin)),
                        reason: format!("{reason}, in the middle of a transaction"),
                    };
                    self.failed_at(begin, unit);
                    return Err(e);
                }
            };
            match batch.offer(txn, limits) {
                Offer::Taken => {
                    let taken = batch.txns.last().expect("just taken");
                    s.end = taken.end_lsn.unwrap_or(s.end);
                }
                Offer::Part(txn) => {
                    part = Some(txn);
                    break;
                }
                Offer::Full(txn) => {
                    s.read_ahead.pending = Some(txn);
                    break;
                }
            }
        }
        let now = Instant::now();
        if let Some(txn) = part {
            let to = match txn.end_lsn {
                Some(end) => {
                    (s.end, s.unit) = (end, None);
                    None
                }
                None => {
                    s.unit = Some(InUnit {
                        lsn: txn.final_lsn,
                        next: txn.next(),
                    });
                    Some(txn.next())
                }
            };
            let part = Part {
                lsn: txn.final_lsn,
                from: txn.first,
                to,
            };
            (s.recorded, s.moved) = (s.end, now);
            let (end, segments) = (s.end, s.segments.clone());
            let end_of_input = s.caught_up && s.read_ahead.drained();
            let shape = (end_of_input, Shape::Part(part));
            return Ok(self.stream_step((begin, end), &segments, &[txn], out, shape));
        }
        // Every transaction ending at or before `sent` was taken (none is pending):
        // with none in this step, a quiet one may move the position up to `sent`.
        let quiet = batch.txns.is_empty()
            && s.read_ahead.pending.is_none()
            && s.quiet_due().is_some_and(|due| due <= now);
        if quiet {
            s.end = s.sent;
        }
        if quiet || batch.records() > 0 {
            (s.recorded, s.moved) = (s.end, now);
        }
        let (end, segments) = (s.end, s.segments.clone());
        // Never inside a unit: its next part is still to come.
        let end_of_input = s.caught_up && s.unit.is_none() && s.read_ahead.drained();
        let shape = match quiet {
            true => Shape::Quiet,
            false => Shape::Txns,
        };
        let shape = (end_of_input, shape);
        Ok(self.stream_step((begin, end), &segments, &batch.txns, out, shape))
    }

    async fn ready(&mut self) {
        if let Phase::Stream(s) = &self.phase {
            s.read_ahead.ready(s.quiet_due()).await;
        }
    }

    fn queued(&self) -> Queued {
        match &self.phase {
            Phase::Stream(s) => s.read_ahead.queued(),
            _ => Queued::default(),
        }
    }

    fn extend(&mut self) {
        self.paused = false;
        if let Phase::Stream(s) = &mut self.phase {
            s.read_ahead.extend();
        }
    }

    fn pause(&mut self) {
        self.paused = true;
        if let Phase::Stream(s) = &mut self.phase {
            s.read_ahead.pause();
        }
    }

    /// Confirms a durable streaming step's end (a commit end, or a quiet step's
    /// keepalive) to the slot, through the feedback task; a backfill position confirms
    /// nothing.
    fn committed(&mut self, _txn: u64, position: &Value) {
        if position.get("phase").and_then(Value::as_str) == Some("stream")
            && let Some(end) = position.get("end").and_then(Value::as_u64)
        {
            self.confirmed.confirm(end);
        }
    }

    /// While streaming: the WAL the server has written beyond the last transaction
    /// handed over (its commit end), as the stream last reported it. Unknown during
    /// the backfill.
    fn lag(&self) -> Option<Lag> {
        let Phase::Stream(streaming) = &self.phase else {
            return None;
        };
        let wal_end = self.wal_end.load(Ordering::Relaxed);
        (wal_end > 0).then(|| Lag::Bytes(wal_end.saturating_sub(streaming.end)))
    }

    /// The WAL the slot holds back (from its `restart_lsn` to the server's end), as
    /// the monitor last read it (every few seconds; [`crate::monitor`]).
    fn retained(&self) -> Option<u64> {
        self.monitor.as_ref().and_then(Monitor::retained)
    }

    /// Ends the stream after a last status update, so the slot confirms the last
    /// commits now rather than at the next start.
    async fn disconnect(&mut self) {
        if let Phase::Stream(s) = std::mem::replace(&mut self.phase, Phase::Idle) {
            let Streaming {
                stream,
                read_ahead,
                feedback,
                ..
            } = *s;
            feedback.close().await;
            drop((stream, read_ahead));
        }
        self.monitor = None;
    }
}

/// `txn` as the continuation of `unit`: without the documents handed over before (a
/// stream reopened inside a unit hands its transaction from the start). None: all of
/// it was handed over before, and more follows. An error: the slot no longer holds
/// the unit's transaction there.
fn after_handed(unit: InUnit, mut txn: Txn) -> Result<Option<Txn>, String> {
    if txn.final_lsn != unit.lsn {
        return Err(format!(
            "the slot now has the transaction committing at {} there",
            format_lsn(txn.final_lsn)
        ));
    }
    if txn.first > unit.next {
        return Err(format!(
            "the slot now hands its documents from {} on, not {}",
            txn.first, unit.next
        ));
    }
    let rest = if txn.first < unit.next {
        txn.split_off(unit.next)
    } else {
        txn
    };
    Ok((!rest.is_empty() || rest.end_lsn.is_some()).then_some(rest))
}
