//! The streaming phase: the replica's stream (`binlog`) read ahead, its transactions
//! handed over as steps of whole transactions or of parts of one (see the parent
//! module), the position each step leaves the source at, and where a stream opens
//! (by GTID state where the position holds one, else by file and offset).

use super::{MysqlCdcSource, Phase};
use crate::binlog::{Dump, Fetcher, Item, Start, Txn};
use crate::catalog::Catalog;
use crate::position::{BinlogPos, CdcPosition, Gtid, GtidState, Part, Segments, quiet_step_after};
use serde_json::Value;
use sluice_source_sdk::cdc::{
    self, Next, Offer, Streamed, Transaction, TxnBatch, TxnMeta, TxnReadAhead,
};
use sluice_source_sdk::{QueueLimits, Records, SourceError, Step};
use std::time::Instant;

pub(super) struct Streaming {
    /// A stream not yet reading ahead; taken by the read-ahead at the first step.
    pub(super) dump: Option<Dump>,
    pub(super) read_ahead: TxnReadAhead<Item, Txn>,
    /// The end of the last transaction handed over.
    pub(super) end: BinlogPos,
    pub(super) gtid: Option<String>,
    /// The server's GTID state at `end` (none: GTIDs are off).
    pub(super) state: Option<GtidState>,
    /// Whether `end` is a position of this stream. A stream connected by GTID starts
    /// with the checkpoint's, maybe another server's: its first transaction (its
    /// start) or heartbeat (everything after the state was read) anchors it.
    pub(super) anchored: bool,
    pub(super) segments: Segments,
    /// The end of the server's log as last heard (at the start, then heartbeats).
    pub(super) server_end: BinlogPos,
    pub(super) caught_up: bool,
    /// Inside a large transaction (the first ending after `end`): the index of its
    /// next document to hand over.
    pub(super) unit: Option<u64>,
    /// The end of the last step the runtime checkpoints (one with records, or quiet).
    pub(super) recorded: BinlogPos,
    /// When `recorded` last moved (or the stream started).
    pub(super) moved: Instant,
    /// How far the log was read with nothing left to hand over: `end`, or a
    /// heartbeat's position past events that are no transaction (a rotation's
    /// checkpoint events): what the lag counts from.
    pub(super) read: BinlogPos,
}

impl Streaming {
    /// When a quiet step is due, if one is owed (never inside a unit or with a
    /// transaction pending).
    pub(super) fn quiet_due(&self) -> Option<Instant> {
        if self.unit.is_some() || self.read_ahead.pending.is_some() {
            return None;
        }
        quiet_step_after(&self.end, &self.recorded).map(|after| self.moved + after)
    }

    /// The runtime checkpoints the step ending here.
    fn record(&mut self) {
        self.recorded = self.end.clone();
        self.moved = Instant::now();
    }

    /// Moves the position past `txn`, which ended (whole, or its last part).
    fn took(&mut self, txn: &Txn) {
        if let Some(end) = &txn.end {
            self.end = end.clone();
            self.read = self.read.clone().max(end.clone());
            if self.end >= self.server_end {
                self.caught_up = true;
                self.server_end = self.end.clone();
            }
        }
        if txn.gtid.is_some() {
            self.gtid = txn.gtid.clone();
        }
        if let (Some(state), Some(gtid)) = (&mut self.state, txn.gtid.as_deref()) {
            state.apply(Gtid::parse(gtid).expect("a GTID this stream printed"));
        }
    }

    /// Where the stream is, whether it has handed over all it read and caught up
    /// (end of input), and how far it read (for the lag).
    fn here(&self) -> (Here, bool, BinlogPos) {
        let here = Here {
            end: self.end.clone(),
            gtid: self.gtid.clone(),
            state: self.state.clone(),
            segments: self.segments.clone(),
        };
        let drained = self.caught_up && self.unit.is_none() && self.read_ahead.drained();
        (here, drained, self.read.clone())
    }

    /// Takes `at`, the first position this stream read, as its position if it had
    /// none of its own (see `anchored`).
    fn anchor(&mut self, at: &BinlogPos) {
        if !self.anchored {
            self.anchored = true;
            self.end = at.clone();
            self.recorded = at.clone();
            self.read = at.clone();
            self.caught_up = false;
        }
    }
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
            // Where the transaction's first event starts (its documents' `_meta/pos`).
            log_offset: self.start.pos,
        }
    }
}

/// Where a step leaves the stream: its last transaction's end, GTID and the server's
/// GTID state then, and the backfilled ranges changes are still checked against.
pub(super) struct Here {
    pub(super) end: BinlogPos,
    pub(super) gtid: Option<String>,
    pub(super) state: Option<GtidState>,
    pub(super) segments: Segments,
}

/// A stream just opened, the server's end of log then, and the catalog connection
/// that checked the position.
pub(super) struct Opened {
    pub(super) dump: Dump,
    pub(super) server_end: BinlogPos,
    pub(super) catalog: Catalog,
}

/// `txn` as the continuation of the unit whose documents before `next` were handed
/// over (a stream reopened inside a unit hands its transaction from the start). None:
/// all of it was handed over before, and more follows.
fn after_handed(next: u64, mut txn: Txn) -> Option<Txn> {
    let rest = if txn.first < next {
        txn.split_off(next)
    } else {
        txn
    };
    (!rest.is_empty() || rest.end.is_some()).then_some(rest)
}

impl MysqlCdcSource {
    /// Refuses a position whose log file the server no longer has.
    pub(super) async fn check_available(
        &self,
        catalog: &mut Catalog,
        from: &BinlogPos,
    ) -> Result<(), SourceError> {
        let logs = catalog.binary_logs().await?;
        if logs.iter().any(|(file, _)| file == &from.file) {
            return Ok(());
        }
        let first = logs.first().map_or("none", |(f, _)| f.as_str());
        Err(SourceError::Unavailable {
            name: self.name.clone(),
            position: Value::from(from.to_string()),
            reason: format!(
                "the server at {} no longer has binary log {} (its first is now {first}): \
                 the changes since the committed position were purged (PURGE BINARY LOGS, \
                 expire_logs_days, binlog_expire_logs_seconds) and are lost to this \
                 pipeline. Start over: reset the pipeline (`sluice apply --delete \
                 <pipeline>`, then run it again), and the tables are snapshotted anew; \
                 keep the binary logs longer than the pipeline may stand still",
                self.url, from.file
            ),
        })
    }

    /// Refuses a GTID state whose transactions after it the server no longer has (a
    /// purge, [`GtidState::purged_since`]). Where the server gives no GTID state for
    /// its logs, the position's file must be there (`end`).
    pub(super) async fn check_gtids(
        &self,
        catalog: &mut Catalog,
        end: &BinlogPos,
        state: &GtidState,
    ) -> Result<(), SourceError> {
        let Some(oldest) = catalog.oldest_gtid_state().await? else {
            return self.check_available(catalog, end).await;
        };
        let Some(gone) = state.purged_since(&oldest) else {
            return Ok(());
        };
        Err(SourceError::Unavailable {
            name: self.name.clone(),
            position: Value::from(state.to_string()),
            reason: format!(
                "the server at {} no longer has the transactions after GTID state {state}: \
                 its oldest binary log starts after {gone}. The changes since the committed \
                 position were purged (PURGE BINARY LOGS, expire_logs_days, \
                 binlog_expire_logs_seconds) and are lost to this pipeline. Start over: \
                 reset the pipeline (`sluice apply --delete <pipeline>`, then run it again), \
                 and the tables are snapshotted anew; keep the binary logs longer than the \
                 pipeline may stand still",
                self.url
            ),
        })
    }

    /// A stream from `from`: by `state` where the position holds one (GTIDs on),
    /// else at `from`, learning the GTID state there where the server has GTIDs.
    pub(super) async fn streaming(
        &self,
        from: BinlogPos,
        gtid: Option<String>,
        state: Option<GtidState>,
        segments: Segments,
        unit: Option<u64>,
    ) -> Result<Phase, SourceError> {
        let by_gtid = state.is_some();
        let Opened {
            dump,
            server_end,
            mut catalog,
        } = self
            .dump_from(&from, state.clone(), segments.clone())
            .await?;
        let state = match state {
            Some(state) => Some(state),
            None => catalog.gtid_state_at(&from).await,
        };
        Ok(Phase::Stream(Box::new(Streaming {
            dump: Some(dump),
            read_ahead: TxnReadAhead::new(self.paused),
            caught_up: !by_gtid && from >= server_end,
            end: from.clone(),
            gtid,
            state,
            anchored: !by_gtid,
            segments,
            server_end,
            unit,
            recorded: from.clone(),
            moved: Instant::now(),
            read: from,
        })))
    }

    /// A binlog stream from `from` (by GTID from `gtid`, if given).
    pub(super) async fn dump_from(
        &self,
        from: &BinlogPos,
        gtid: Option<GtidState>,
        segments: Segments,
    ) -> Result<Opened, SourceError> {
        let mut catalog = self.catalog().await?;
        match &gtid {
            Some(state) => self.check_gtids(&mut catalog, from, state).await?,
            None => self.check_available(&mut catalog, from).await?,
        }
        let tables = self.describe(&mut catalog, &self.tables()).await?;
        let server_end = catalog.master().await?;
        let start = Start {
            server_id: self.server_id,
            from: from.clone(),
            gtid,
            tables,
            segments: segments.after(from),
            bound: self.bound,
        };
        let dump = Dump::start(&self.name, &self.url, &self.opts, start).await?;
        Ok(Opened {
            dump,
            server_end,
            catalog,
        })
    }

    /// The step of the whole transactions `txns`, from `begin` to `end`, or of one
    /// part of a large transaction (`txns` its pieces) ([`cdc::stream_step`]).
    pub(super) fn stream_step(
        &self,
        begin: &BinlogPos,
        here: Here,
        txns: &[Txn],
        out: &mut Records,
        (end_of_input, part, quiet): (bool, Option<Part>, bool),
    ) -> Step {
        let streamed = match (part, quiet) {
            (Some(part), _) => Streamed::Part {
                last: part.to.is_none(),
            },
            (None, true) => Streamed::Quiet,
            (None, false) => Streamed::Txns,
        };
        let position = CdcPosition::Stream {
            begin: begin.clone(),
            end: here.end,
            gtid: here.gtid,
            gtid_state: here.state,
            segments: here.segments.after(begin).0,
            part,
            quiet,
        };
        let position = serde_json::to_value(&position).expect("a position serializes");
        cdc::stream_step(&self.origin, txns, out, position, end_of_input, streamed)
    }

    /// After a streamed step failed: the next open goes on where the step began
    /// (GTID state `gtid_state`; inside its unit, after the documents taken before, if
    /// it was in one).
    pub(super) fn failed_at(
        &mut self,
        begin: BinlogPos,
        gtid_state: Option<GtidState>,
        unit: Option<u64>,
    ) {
        let (gtid, segments) = match &self.phase {
            Phase::Stream(s) => (s.gtid.clone(), s.segments.0.clone()),
            _ => (None, Vec::new()),
        };
        self.phase = Phase::Idle;
        self.resume = Some(CdcPosition::Stream {
            begin: begin.clone(),
            end: begin,
            gtid,
            gtid_state,
            segments,
            part: unit.map(|next| Part {
                from: next,
                to: Some(next),
            }),
            quiet: false,
        });
    }

    /// The streaming half of `queue`: the next step of whole transactions, a part of
    /// a large one, or a quiet step (see the parent module).
    pub(super) async fn queue_stream(
        &mut self,
        limits: QueueLimits,
        out: &mut Records,
    ) -> Result<Step, SourceError> {
        let Phase::Stream(s) = &mut self.phase else {
            unreachable!("opened above: a backfill returns its step, else the stream is open")
        };
        if let Some(dump) = s.dump.take() {
            s.read_ahead.start(Fetcher(dump));
        }
        let (mut begin, unit, begin_state) = (s.end.clone(), s.unit, s.state.clone());
        let mut batch = TxnBatch::default();
        let mut part = None;
        loop {
            let next = match s.read_ahead.take_next() {
                Ok(Some(next)) => next,
                Ok(None) => break,
                Err(e) => {
                    self.failed_at(begin, begin_state, unit);
                    return Err(e);
                }
            };
            if !s.anchored
                && let Next::Fetched(item) = &next
            {
                s.anchor(match item {
                    Item::Txn(txn) => &txn.start,
                    Item::Heartbeat { end } => end,
                });
                begin = s.end.clone();
            }
            let txn = match next {
                Next::Pending(txn) | Next::Fetched(Item::Txn(txn)) => txn,
                Next::Fetched(Item::Heartbeat { end }) => {
                    s.caught_up = true;
                    // Everything before it was taken (FIFO).
                    if s.read_ahead.pending.is_none() && s.unit.is_none() && end > s.read {
                        s.read = end.clone();
                    }
                    if end.file == s.end.file || end > s.server_end {
                        s.server_end = end;
                    }
                    continue;
                }
            };
            let txn = match s.unit {
                None => txn,
                Some(next) => match after_handed(next, txn) {
                    Some(txn) => txn,
                    None => continue,
                },
            };
            match batch.offer(txn, limits) {
                Offer::Taken => s.took(batch.txns.last().expect("just taken")),
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
        if let Some(txn) = part {
            let to = match &txn.end {
                Some(_) => {
                    s.took(&txn);
                    s.unit = None;
                    s.record();
                    None
                }
                None => {
                    s.unit = Some(txn.next());
                    Some(txn.next())
                }
            };
            let part = Part {
                from: txn.first,
                to,
            };
            let (here, end_of_input, read) = s.here();
            return Ok(self.hand_over(
                &begin,
                here,
                &read,
                &[txn],
                out,
                (end_of_input, Some(part), false),
            ));
        }
        // Only transactions of other tables since the last checkpointed step, for a
        // while: a step without records moves the checkpoint past them.
        let records = batch.records();
        let quiet = records == 0 && s.quiet_due().is_some_and(|due| due <= Instant::now());
        if records > 0 || quiet {
            s.record();
        }
        let (here, end_of_input, read) = s.here();
        Ok(self.hand_over(
            &begin,
            here,
            &read,
            &batch.txns,
            out,
            (end_of_input, None, quiet),
        ))
    }

    /// The step of `txns` from `begin` to `here` (see [`Self::stream_step`]), the lag
    /// monitor told how far the stream `read`.
    fn hand_over(
        &self,
        begin: &BinlogPos,
        here: Here,
        read: &BinlogPos,
        txns: &[Txn],
        out: &mut Records,
        how: (bool, Option<Part>, bool),
    ) -> Step {
        if let Some(monitor) = &self.monitor {
            monitor.at(read);
        }
        self.stream_step(begin, here, txns, out, how)
    }
}
