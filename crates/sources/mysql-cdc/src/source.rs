//! The MariaDB CDC source: a snapshot consistent with a binlog position, then the
//! binary log from there, exactly once.
//!
//! ```text
//!  first command, no checkpoint: checks ─▶ START TRANSACTION WITH CONSISTENT SNAPSHOT (at S)
//!      backfill: per table, chunks in primary-key order ─▶ steps (journaled)
//!      stream:   COM_BINLOG_DUMP from S ─▶ whole transactions ─▶ steps (replayed by position range)
//! ```
//!
//! **Backfill steps** journal their documents (`Resume::Replay` with data): the
//! snapshot they were read in is gone after a crash. A crash mid-backfill resumes
//! after the last committed key in a new snapshot at P2 ≥ S, and records the range
//! read before as a segment ([`crate::position`]), so that streaming from S skips
//! exactly the changes each snapshot already held. Keys of any type bound the chunks,
//! compared by the server in its own order (`key`); only a table keyed by a `JSON`
//! column is read whole, as one step.
//!
//! **Streaming steps** are whole transactions, their position the range of ends
//! `(begin, end]` in the binary log. A transaction larger than the stream's part bound
//! comes in parts (`binlog`), each a step of its own, all but the last with
//! `Step::unit_continues`: the runtime commits the parts of one transaction in one of
//! its transactions, and neither the stream, the read-ahead nor a step holds more than
//! a part of it. A part's position names its documents by their index in the
//! transaction ([`crate::position::Part`]); only a unit's end is checkpointed, and
//! `seek` refuses a position inside one.
//! A replica holds nothing back on the server (the binary log's retention is the
//! server's own), so nothing is confirmed at a commit; a replay re-reads the range
//! from `begin` and checks its hash. A position whose log file was purged fails with
//! [`SourceError::Unavailable`], naming how to start over.
//!
//! **Quiet steps.** Transactions of tables not captured move the stream's position
//! too (empty transactions). When only such came since the last checkpointed step, a
//! step without records moves the checkpoint to the stream's position
//! (`Step::advances`, position `quiet: true`), when
//! [`crate::position::quiet_step_after`] says: the committed position follows a busy
//! server's log even while the captured tables are quiet, so purging old log files
//! never strands it.
//!
//! **Lag** comes from `monitor`: the binary log the server holds past what
//! the stream has handed over, across files.
//!
//! `end_of_input` is never said during the backfill; while streaming it says the
//! stream has read everything the server had written when it started (or a
//! heartbeat said it has nothing more), and nothing is buffered.
//!
//! **GTIDs.** A streamed position records the server's GTID state after its end
//! (MariaDB), and a stream resumed from one connects by it: a failover to a replica
//! whose binary log has other files and offsets resumes exactly (see
//! [`crate::position`]). Replays re-read by file and offset.
//!
//! The backfill phase lives in `source/backfill.rs`, the streaming phase in
//! `source/stream.rs`, the replay of streamed steps in `source/replay.rs`; the pure
//! rules in `position`, the I/O in `catalog` and `binlog`; what it shares with
//! `postgres_cdc` (chunked backfill steps, the read-ahead of transactions, the
//! step-making) in `sluice_source_sdk::cdc`.

mod backfill;
mod replay;
mod stream;

use backfill::{Backfill, backfill};
use stream::{Here, Streaming};

use crate::binlog::{self, PartBound};
use crate::catalog::{Catalog, Table};
use crate::config::{MysqlCdcConfig, split_table};
use crate::monitor::Monitor;
use crate::position::{CdcPosition, Part, Segments, TableName};
use mysql_async::Opts;
use serde_json::Value;
use sluice_source_sdk::cdc::{self, Chunks};
use sluice_source_sdk::{
    FaultTolerance, InvalidConfig, Lag, QueueLimits, Queued, Records, Resume, Source, SourceError,
    Step, check_replay, parse_resume,
};
use std::sync::Arc;

pub struct MysqlCdcSource {
    name: String,
    config: MysqlCdcConfig,
    opts: Opts,
    /// The URL without its password, for messages.
    url: String,
    server_id: u32,
    /// Where records come from, as positions read: `binlog of host:port`.
    origin: Arc<str>,
    /// Where the next open continues (a seek or a replay); none: from scratch.
    resume: Option<CdcPosition>,
    phase: Phase,
    paused: bool,
    /// When a transaction is handed over in parts.
    bound: PartBound,
    /// The lag, from the first stream on.
    monitor: Option<Monitor>,
}

enum Phase {
    Idle,
    Backfill(Box<Backfill>),
    Stream(Box<Streaming>),
}

impl MysqlCdcSource {
    pub fn new(
        name: &str,
        materialization: &str,
        config: &MysqlCdcConfig,
    ) -> Result<Self, SourceError> {
        let invalid = |e: InvalidConfig| SourceError::Config {
            name: name.to_string(),
            reason: e.to_string(),
        };
        let opts = config.opts().map_err(invalid)?;
        let url = format!(
            "mysql://{}@{}:{}",
            opts.user().unwrap_or(""),
            opts.ip_or_hostname(),
            opts.tcp_port()
        );
        Ok(MysqlCdcSource {
            name: name.to_string(),
            config: config.clone(),
            server_id: config.server_id(materialization, name),
            origin: format!("binlog of {}:{}", opts.ip_or_hostname(), opts.tcp_port()).into(),
            opts,
            url,
            resume: None,
            phase: Phase::Idle,
            paused: false,
            bound: PartBound::default(),
            monitor: None,
        })
    }

    /// Hands a transaction of more than `docs` documents over in parts of `docs`, so
    /// that tests need not write thousands of rows. Takes effect at the next stream
    /// start.
    #[doc(hidden)]
    pub fn set_part_docs(&mut self, docs: usize) {
        self.bound.docs = docs.max(1);
    }

    fn tables(&self) -> Vec<TableName> {
        self.config
            .tables
            .iter()
            .filter_map(|t| split_table(t))
            .map(|(schema, table)| TableName { schema, table })
            .collect()
    }

    async fn catalog(&self) -> Result<Catalog, SourceError> {
        let mut catalog = Catalog::connect(&self.name, &self.opts, &self.url).await?;
        catalog.check_server().await?;
        Ok(catalog)
    }

    async fn describe(
        &self,
        catalog: &mut Catalog,
        names: &[TableName],
    ) -> Result<Vec<Table>, SourceError> {
        let mut tables = Vec::new();
        for name in names {
            tables.push(catalog.table(name).await?);
        }
        Ok(tables)
    }

    /// Opens from `resume`, if nothing is open.
    async fn open(&mut self) -> Result<(), SourceError> {
        if !matches!(self.phase, Phase::Idle) {
            return Ok(());
        }
        self.phase = match self.resume.clone() {
            None => {
                let mut catalog = self.catalog().await?;
                let tables = self.describe(&mut catalog, &self.tables()).await?;
                let (snapshot, gtid) = catalog.begin_snapshot().await?;
                let chunks = Chunks::new(0, None, self.config.chunk_rows);
                backfill(catalog, tables, snapshot.clone(), gtid, chunks, snapshot)
                    .with(Segments::default())
            }
            Some(CdcPosition::Backfill {
                start,
                gtid,
                tables,
                table,
                after,
                snapshot,
                segments,
            }) => {
                let mut segments = Segments(segments);
                if table >= tables.len() {
                    self.streaming(start, None, None, segments, None).await?
                } else {
                    if let Some(after) = &after {
                        segments.push(&tables[table], Some(after.clone()), snapshot);
                    }
                    let mut catalog = self.catalog().await?;
                    self.check_available(&mut catalog, &start).await?;
                    let described = self.describe(&mut catalog, &tables).await?;
                    let (snapshot, _) = catalog.begin_snapshot().await?;
                    let chunks = Chunks::new(table, after, self.config.chunk_rows);
                    backfill(catalog, described, start, gtid, chunks, snapshot).with(segments)
                }
            }
            // Inside a unit (the queue failed mid-unit, or a part was replayed): from
            // the unit's start, handing over only its documents after those taken.
            Some(CdcPosition::Stream {
                begin,
                gtid,
                gtid_state,
                segments,
                part: Some(Part { to: Some(to), .. }),
                ..
            }) => {
                self.streaming(begin, gtid, gtid_state, Segments(segments), Some(to))
                    .await?
            }
            Some(CdcPosition::Stream {
                end,
                gtid,
                gtid_state,
                segments,
                ..
            }) => {
                self.streaming(end, gtid, gtid_state, Segments(segments), None)
                    .await?
            }
        };
        Ok(())
    }
}

#[async_trait::async_trait]
impl Source for MysqlCdcSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn fault_tolerance(&self) -> FaultTolerance {
        FaultTolerance::ExactlyOnce
    }

    /// The server's settings and the user's privileges, and every table (each with a
    /// primary key, every column of a supported type).
    ///
    /// Then registers as a replica at the end of the log and reads what the server sends
    /// first (the stream's opening events, then a heartbeat within a second): a user
    /// without REPLICATION SLAVE is refused there. Nothing stays behind on the server.
    async fn probe(&mut self) -> Result<(), SourceError> {
        let mut catalog = self.catalog().await?;
        self.describe(&mut catalog, &self.tables()).await?;
        let end = catalog.master().await?;
        let mut dump = self.dump_from(&end, None, Segments::default()).await?.dump;
        match tokio::time::timeout(binlog::HEARTBEAT * 3, dump.next()).await {
            Ok(Err(e)) => Err(e),
            Ok(Ok(_)) | Err(_) => Ok(()),
        }
    }

    /// Records the position, after checking that the server still has its log. The
    /// stream opens at the first `queue` or `replay`.
    async fn seek(&mut self, position: &Value) -> Result<(), SourceError> {
        let parsed: CdcPosition = parse_resume(&self.name, "seek to", position)?;
        if let Some(part) = parsed.mid_unit() {
            return Err(SourceError::bad_resume(
                &self.name,
                "seek to",
                position,
                format!(
                    "the position lies inside a transaction (after its document {}): the \
                     runtime checkpoints only where a unit ends, so no checkpoint holds it",
                    part.to.unwrap_or_default()
                ),
            ));
        }
        self.phase = Phase::Idle;
        let mut catalog = self.catalog().await?;
        match &parsed {
            CdcPosition::Backfill { start, .. } => {
                self.check_available(&mut catalog, start).await?
            }
            CdcPosition::Stream {
                end,
                gtid_state: Some(state),
                ..
            } => self.check_gtids(&mut catalog, end, state).await?,
            CdcPosition::Stream { end, .. } => self.check_available(&mut catalog, end).await?,
        }
        self.resume = Some(parsed);
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
        self.phase = Phase::Idle;
        let replayed = match (&parsed, data) {
            (CdcPosition::Backfill { snapshot, .. }, Some(data)) => {
                cdc::replay_journal(&self.origin, snapshot.pos, data, position, out)
            }
            (
                CdcPosition::Stream {
                    begin,
                    end,
                    gtid,
                    gtid_state,
                    segments,
                    part,
                    quiet,
                },
                None,
            ) => {
                let segments = Segments(segments.clone());
                let read = match part {
                    None => self.replay_txns((begin, end), segments.clone()).await,
                    Some(part) => self
                        .replay_part((begin, end), *part, segments.clone())
                        .await
                        .map(|txn| vec![txn]),
                };
                let txns = match read {
                    Ok(txns) => txns,
                    Err(e) => {
                        out.truncate(first);
                        return Err(e);
                    }
                };
                let here = Here {
                    end: end.clone(),
                    gtid: gtid.clone(),
                    state: gtid_state.clone(),
                    segments,
                };
                self.stream_step(begin, here, &txns, out, (false, *part, *quiet))
            }
            _ => {
                return Err(SourceError::bad_resume(
                    &self.name,
                    "replay",
                    position,
                    "a backfill step journals its rows, a streamed one does not".into(),
                ));
            }
        };
        if let Err(e) = check_replay(&self.name, step, replayed.resume.hash()) {
            out.truncate(first);
            return Err(e);
        }
        self.resume = Some(parsed);
        Ok(replayed)
    }

    async fn queue(&mut self, limits: QueueLimits, out: &mut Records) -> Result<Step, SourceError> {
        self.open().await?;
        if let Some(step) = self.queue_backfill(limits, out).await? {
            return Ok(step);
        }
        self.open().await?; // the backfill may have just ended
        if self.monitor.is_none() {
            self.monitor = Some(Monitor::spawn(
                self.name.clone(),
                self.opts.clone(),
                self.url.clone(),
            ));
        }
        self.queue_stream(limits, out).await
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

    /// While streaming: the bytes of binary log the server holds past the last
    /// transaction handed over, as the monitor last read them (every 2 s, across
    /// files; `monitor`); before its first reading, in the same file as the
    /// server's end as the stream last heard it (at its start, then heartbeats).
    /// Unknown during the backfill.
    fn lag(&self) -> Option<Lag> {
        let Phase::Stream(s) = &self.phase else {
            return None;
        };
        if let Some(bytes) = self.monitor.as_ref().and_then(Monitor::lag) {
            return Some(Lag::Bytes(bytes));
        }
        (s.server_end.file == s.end.file)
            .then(|| Lag::Bytes(s.server_end.pos.saturating_sub(s.end.pos)))
    }

    async fn disconnect(&mut self) {
        self.phase = Phase::Idle;
        self.monitor = None;
    }
}
