//! The replica's binlog stream (`COM_BINLOG_DUMP` from a file and offset, or from a
//! MariaDB GTID state) decoded into whole transactions of documents.
//!
//! ```text
//!  server ──events──▶ Dump::next ─▶ Item::Txn (the documents of one transaction, its end)
//!                                └▶ Item::Heartbeat (nothing new; the server's end of log)
//! ```
//!
//! A transaction is the events from its `GTID_EVENT` (MariaDB, 162) or `BEGIN` query to
//! its `XID` or `COMMIT` query; its start is where its first event starts, its end
//! that last event's `log_pos`. Rows events of captured tables become documents (an
//! update changing the key: a delete of the old key, then the update), each held back
//! when a snapshot already held it ([`Segments::holds`]: a snapshot position is a
//! transaction boundary, so a transaction is in a snapshot at P exactly when its rows
//! events end at or before P).
//!
//! **Parts.** A transaction is held whole until its commit event, unless it grows past
//! [`PartBound`]: then what it holds is handed over as a *part* (`end` none, `first`
//! its first document's index in the transaction), and the rest follows in further
//! parts, the last one (maybe empty) with the commit. The server writes a transaction
//! to the binary log only once it committed, so a part handed over is never rolled
//! back. The stream so holds at most one part of a transaction.
//!
//! What `mysql_common` parses: the MySQL event types (rows events v1/v2, table maps,
//! queries, XID, rotate, format description, MySQL's GTID events). What it does not,
//! handled here: MariaDB's `GTID_EVENT` (162: read from its body, [`Gtid::from_event`]),
//! `GTID_LIST` (163), `ANNOTATE_ROWS` (160) and `BINLOG_CHECKPOINT` (161) (skipped:
//! nothing in them changes a row); MariaDB's compressed events (165-171, with
//! `log_bin_compress=ON`) and `START_ENCRYPTION` (164) fail the stream naming the
//! setting. The replica says `@mariadb_slave_capability=4` so MariaDB sends its GTID
//! events rather than rewriting them into `BEGIN` queries.
//!
//! **By GTID.** A stream started from a GTID state sets `@slave_connect_state` to it
//! (the server then starts after the last transaction of each domain the state
//! names, whatever its files are called), with `@slave_gtid_strict_mode=1` (a state
//! the server's log does not hold, such as a GTID another server wrote after a
//! failover diverged, fails the stream rather than being skipped over) and
//! `@slave_gtid_ignore_duplicates=0`. The server's first events (a rotate into the
//! file it starts in) give the stream its file; its offsets are the server's own.
//!
//! DDL on a captured table (a query naming it) fails the stream naming the table and
//! the statement, except `ALTER TABLE … ADD [COLUMN]`: new columns flow through (the
//! table is described again from the catalog).
//!
//! **One replica per server id.** A server streams to one replica per server id: a
//! second dump registering with the id of a running one makes the server end the
//! older dump (MariaDB: error 4052, "A slave with the same server_uuid/server_id is
//! already connected"; MySQL: error 1236, a purged position's code, saying so). That is
//! how a cluster's new holder of the source's shard (the same id, derived from the
//! names) ends a former holder's stream, if it still had one. The ended stream fails
//! with a retryable error naming the id, never as a purged position.

use crate::catalog::{Catalog, Table, server_error, timed};
use crate::ddl::{Ddl, Named, classify};
use crate::doc::Layout;
use crate::position::{
    BinlogPos, Gtid, GtidState, Holds, Segments, TableName, held_in, int_segment,
};
use crate::types::Origin;
use futures::StreamExt;
use mysql_async::binlog::events::{EventData, RotateEvent, RowsEventData};
use mysql_async::{BinlogStream, BinlogStreamRequest, Conn, Opts, Value};
use sluice_source_sdk::{Fetch, SourceError};
use std::collections::HashMap;
use std::time::Duration;

/// What MySQL's error 1236 says when a dump of the same server id ended this one: "A
/// replica with the same server_uuid/server_id as this replica has connected to the
/// source" (before 8.0.26: slave, master). MariaDB has a code of its own for it (4052).
const SAME_SERVER_ID: &str = "same server_uuid/server_id";

/// The heartbeat the server sends when it has nothing new: how soon a stream that
/// caught up says so, and how soon a dead connection is noticed.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// A stream that hears nothing (not even a heartbeat) this long is dead.
const SILENCE: Duration = Duration::from_secs(30);

/// What the stream hands over.
#[derive(Debug)]
pub enum Item {
    Txn(Txn),
    /// Nothing new: the server's log ends at `end` (same file as the stream's).
    Heartbeat {
        end: BinlogPos,
    },
}

/// A transaction of more documents than `docs`, or of more than `bytes` of document
/// text, is handed over in parts (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartBound {
    pub docs: usize,
    pub bytes: usize,
}

impl Default for PartBound {
    /// 8192 documents or 8 MiB: large enough that nearly every transaction is one
    /// step, and a step's hash and documents stay cheap; small enough that a part of
    /// wide rows stays a few MiB (as `postgres_cdc`'s).
    fn default() -> PartBound {
        PartBound {
            docs: 8192,
            bytes: 8 << 20,
        }
    }
}

/// The documents of one transaction (maybe none: it touched no captured table), or of
/// one part of a large one.
#[derive(Debug, Clone)]
pub struct Txn {
    /// Where the transaction's first event starts (its documents' `_meta/pos`).
    pub start: BinlogPos,
    /// Where its commit event ends; none: a part, more of it follows.
    pub end: Option<BinlogPos>,
    pub gtid: Option<String>,
    /// The index of the first document in the transaction.
    pub first: u64,
    pub text: Vec<u8>,
    /// Where each document ends in `text`.
    pub ends: Vec<usize>,
}

impl Txn {
    /// Whether this is a whole transaction, not a part.
    pub fn whole(&self) -> bool {
        self.first == 0 && self.end.is_some()
    }

    /// The index of the document after this one's last.
    pub fn next(&self) -> u64 {
        self.first + self.ends.len() as u64
    }

    /// Keeps the documents before index `at`, returns the rest (with the end).
    pub fn split_off(&mut self, at: u64) -> Txn {
        let keep = (at.saturating_sub(self.first) as usize).min(self.ends.len());
        let cut = if keep == 0 { 0 } else { self.ends[keep - 1] };
        Txn {
            start: self.start.clone(),
            end: self.end.take(),
            gtid: self.gtid.clone(),
            first: self.first + keep as u64,
            text: self.text.split_off(cut),
            ends: self.ends.split_off(keep).iter().map(|e| e - cut).collect(),
        }
    }

    /// Appends `more`, the next part of the same transaction.
    pub fn append(&mut self, more: Txn) {
        let base = self.text.len();
        self.text.extend_from_slice(&more.text);
        self.ends.extend(more.ends.iter().map(|e| e + base));
        self.end = more.end;
    }

    /// Whether it holds no document.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub fn docs(&self) -> impl Iterator<Item = &[u8]> {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let doc = &self.text[start..end];
            start = end;
            doc
        })
    }
}

/// A transaction being read: the documents not yet handed over.
struct Open {
    start: BinlogPos,
    gtid: Option<String>,
    /// A single statement with no BEGIN/COMMIT (MariaDB's standalone GTID).
    standalone: bool,
    /// The index of the first document of `text`.
    first: u64,
    text: Vec<u8>,
    ends: Vec<usize>,
}

impl Open {
    fn new(start: BinlogPos, gtid: Option<String>, standalone: bool) -> Open {
        Open {
            start,
            gtid,
            standalone,
            first: 0,
            text: Vec::new(),
            ends: Vec::new(),
        }
    }

    /// Hands over what it holds, up to `end` (none: a part).
    fn take(&mut self, end: Option<BinlogPos>) -> Txn {
        let txn = Txn {
            start: self.start.clone(),
            end,
            gtid: self.gtid.clone(),
            first: self.first,
            text: std::mem::take(&mut self.text),
            ends: std::mem::take(&mut self.ends),
        };
        self.first = txn.next();
        txn
    }
}

/// A change of a row: its op and its values, one per column.
type Change = (&'static str, Vec<Option<Value>>);

/// Where and how a stream starts.
pub struct Start {
    /// The replica id it registers with.
    pub server_id: u32,
    pub from: BinlogPos,
    /// Connect by this GTID state rather than at `from` (which then only names the
    /// file until the server's rotate says where the stream is).
    pub gtid: Option<GtidState>,
    /// The captured tables, as the catalog describes them now.
    pub tables: Vec<Table>,
    /// The backfilled ranges whose changes are skipped.
    pub segments: Segments,
    pub bound: PartBound,
}

pub struct Dump {
    name: String,
    url: String,
    /// The replica id registered with.
    server_id: u32,
    opts: Opts,
    stream: BinlogStream,
    file: String,
    tables: Vec<Table>,
    layouts: Vec<Layout>,
    by_name: HashMap<TableName, usize>,
    segments: Segments,
    /// Where keys other than integers are placed among the segments (connected when
    /// first needed).
    order: Option<Catalog>,
    open: Option<Open>,
    bound: PartBound,
    /// The server's events carry a checksum, and the stream's first rotate (the fake
    /// one, read before the format description says so) still has it on its name.
    fake_rotate_checksum: bool,
}

impl Dump {
    /// Registers as replica `start.server_id` and streams from `start.from`.
    pub async fn start(
        name: &str,
        url: &str,
        opts: &Opts,
        start: Start,
    ) -> Result<Dump, SourceError> {
        let Start {
            server_id,
            from,
            gtid,
            tables,
            segments,
            bound,
        } = start;
        let from = &from;
        let err = |what: &str, e| server_error(name, url, what, e);
        let mut conn = timed(name, "connect", Conn::new(opts.clone()))
            .await?
            .map_err(|e| err("cannot connect", e))?;
        use mysql_async::prelude::Queryable;
        let period = HEARTBEAT.as_nanos();
        let mut sets = vec![
            "SET @mariadb_slave_capability = 4".to_string(),
            format!("SET @master_heartbeat_period = {period}"),
        ];
        if let Some(state) = &gtid {
            sets.extend([
                format!("SET @slave_connect_state = '{state}'"),
                "SET @slave_gtid_strict_mode = 1".to_string(),
                "SET @slave_gtid_ignore_duplicates = 0".to_string(),
            ]);
        }
        for set in sets {
            timed(name, "query", conn.query_drop(set.as_str()))
                .await?
                .map_err(|e| err(&set, e))?;
        }
        let checksum = "SELECT @@GLOBAL.binlog_checksum";
        let checksummed = timed(name, "query", conn.query_first::<String, _>(checksum))
            .await?
            .map_err(|e| err(checksum, e))?
            .is_some_and(|alg| !alg.eq_ignore_ascii_case("NONE"));
        let request = match gtid {
            // The server starts by the state: the file and offset are not read.
            Some(_) => BinlogStreamRequest::new(server_id).with_pos(4u64),
            None => BinlogStreamRequest::new(server_id)
                .with_filename(from.file.as_bytes())
                .with_pos(from.pos),
        };
        let stream = timed(name, "binlog dump", conn.get_binlog_stream(request))
            .await?
            .map_err(|e| match &e {
                // COM_REGISTER_SLAVE refused: the user lacks REPLICATION SLAVE (the
                // server says "access denied", as for a wrong password).
                mysql_async::Error::Server(server) if matches!(server.code, 1045 | 1227) => {
                    SourceError::Config {
                        name: name.to_string(),
                        reason: format!(
                            "cannot register as a replica at {url}: {}: the user needs \
                             REPLICATION SLAVE: GRANT REPLICATION SLAVE, REPLICATION CLIENT \
                             ON *.* TO the user",
                            server.message
                        ),
                    }
                }
                _ => err("cannot start the binlog stream", e),
            })?;
        let layouts = tables.iter().map(Layout::new).collect();
        let by_name = tables
            .iter()
            .enumerate()
            .map(|(i, t)| (t.name.clone(), i))
            .collect();
        Ok(Dump {
            name: name.to_string(),
            url: url.to_string(),
            server_id,
            opts: opts.clone(),
            stream,
            file: from.file.clone(),
            tables,
            layouts,
            by_name,
            segments,
            order: None,
            open: None,
            fake_rotate_checksum: checksummed,
            bound,
        })
    }

    fn fail(&self, reason: String) -> SourceError {
        SourceError::Io {
            name: self.name.clone(),
            path: self.url.clone(),
            error: std::io::Error::new(std::io::ErrorKind::InvalidData, reason),
        }
    }

    fn config(&self, reason: String) -> SourceError {
        SourceError::Config {
            name: self.name.clone(),
            reason,
        }
    }

    /// The next transaction or heartbeat.
    pub async fn next(&mut self) -> Result<Item, SourceError> {
        loop {
            let event = match tokio::time::timeout(SILENCE, self.stream.next()).await {
                Err(_) => {
                    return Err(SourceError::Timeout {
                        name: self.name.clone(),
                        call: "the binlog stream",
                        after: SILENCE,
                    });
                }
                Ok(None) => return Err(self.fail("the server ended the binlog stream".into())),
                Ok(Some(Err(e))) => return Err(self.stream_error(e)),
                Ok(Some(Ok(event))) => event,
            };
            let header = event.header();
            let at = BinlogPos::new(self.file.clone(), u64::from(header.log_pos()));
            let start = BinlogPos::new(
                self.file.clone(),
                u64::from(header.log_pos()).saturating_sub(u64::from(header.event_size())),
            );
            match header.event_type_raw() {
                // MariaDB: GTID_EVENT.
                162 => {
                    let gtid = Gtid::from_event(header.server_id(), event.data());
                    self.open = Some(Open::new(
                        start,
                        gtid.map(|g| g.to_string()),
                        Gtid::standalone(event.data()),
                    ));
                    continue;
                }
                // ANNOTATE_ROWS, BINLOG_CHECKPOINT, GTID_LIST: nothing to a row.
                160 | 161 | 163 => continue,
                164 => {
                    return Err(self.config(
                        "the binary log is encrypted (encrypt_binlog=ON): a replica \
                         receives it decrypted only from MariaDB itself; turn \
                         encrypt_binlog off to capture changes"
                            .into(),
                    ));
                }
                165..=171 => {
                    return Err(self.config(
                        "the binary log holds compressed events (log_bin_compress=ON), \
                         which are not read yet: set log_bin_compress=OFF"
                            .into(),
                    ));
                }
                _ => {}
            }
            let data = event
                .read_data()
                .map_err(|e| self.fail(format!("an unreadable binlog event at {at}: {e}")))?;
            let Some(data) = data else { continue };
            match data {
                EventData::RotateEvent(rotate) => self.rotate(&rotate),
                EventData::HeartbeatEvent => {
                    return Ok(Item::Heartbeat { end: at });
                }
                EventData::GtidEvent(_) | EventData::AnonymousGtidEvent(_) => {
                    self.open = Some(Open::new(start, None, false));
                }
                EventData::QueryEvent(query) => {
                    let sql = query.query();
                    let trimmed = sql.trim();
                    if trimmed.eq_ignore_ascii_case("BEGIN") {
                        if self.open.is_none() {
                            self.open = Some(Open::new(start, None, false));
                        }
                        continue;
                    }
                    if trimmed.eq_ignore_ascii_case("COMMIT") {
                        if let Some(txn) = self.finish(at) {
                            return Ok(Item::Txn(txn));
                        }
                        continue;
                    }
                    let schema = query.schema().to_string();
                    self.ddl(&schema, trimmed).await?;
                    let group_ends = self.open.as_ref().is_none_or(|o| o.standalone);
                    if group_ends {
                        return Ok(Item::Txn(self.finish_or_empty(start, at)));
                    }
                }
                EventData::XidEvent(_) => {
                    if let Some(txn) = self.finish(at) {
                        return Ok(Item::Txn(txn));
                    }
                }
                EventData::RowsEvent(rows) => {
                    if let Some((index, changes)) = self.rows(&rows, &at)? {
                        self.push(index, changes, &at, start).await?;
                    }
                    if let Some(open) = &mut self.open
                        && (open.ends.len() >= self.bound.docs
                            || open.text.len() >= self.bound.bytes)
                    {
                        return Ok(Item::Txn(open.take(None)));
                    }
                }
                _ => {}
            }
        }
    }

    /// The stream's file becomes the rotate's. The fake rotate a dump starts with
    /// comes before the format description that says events carry a checksum, so
    /// `mysql_common` leaves the checksum's 4 bytes on its name (which may be
    /// digits): they are cut off that first rotate's name only.
    fn rotate(&mut self, rotate: &RotateEvent<'_>) {
        let checksummed = std::mem::take(&mut self.fake_rotate_checksum);
        self.file = file_name(rotate.name_raw(), checksummed);
    }

    fn stream_error(&self, e: mysql_async::Error) -> SourceError {
        if let mysql_async::Error::Server(server) = &e {
            // A dump of the same server id registered after this one: MariaDB's
            // ER_SLAVE_SAME_ID, MySQL's ER_MASTER_FATAL_ERROR_READING_BINLOG saying so.
            if server.code == 4052
                || (server.code == 1236 && server.message.contains(SAME_SERVER_ID))
            {
                return SourceError::Io {
                    name: self.name.clone(),
                    path: self.url.clone(),
                    error: std::io::Error::other(format!(
                        "the server ended the binlog stream: another replica registered \
                         with this source's server_id {} ({}). Under `cluster:` that is \
                         another member taking this source's shard over (only the shard's \
                         current holder can commit: the stream is opened again if this \
                         member still holds it); otherwise give this source, or the other \
                         replica, a server_id of its own",
                        self.server_id, server.message
                    )),
                };
            }
            // ER_MASTER_FATAL_ERROR_READING_BINLOG: a purged or missing position.
            if server.code == 1236 {
                return SourceError::Unavailable {
                    name: self.name.clone(),
                    position: serde_json::Value::from(self.file.clone()),
                    reason: format!(
                        "the server no longer has the binary log this source must read \
                         from ({}): the changes since the committed position are gone \
                         (the logs were purged: PURGE BINARY LOGS, expire_logs_days, \
                         binlog_expire_logs_seconds; or, after a failover, the new server's \
                         log never held the committed GTID state). Start over: reset the pipeline \
                         (`sluice apply --delete <pipeline>`, then run it again), and the \
                         tables are snapshotted anew; keep the binary logs longer than \
                         the pipeline may stand still",
                        server.message
                    ),
                };
            }
        }
        server_error(&self.name, &self.url, "the binlog stream", e)
    }

    /// The changes of a rows event, if of a captured table (its index): a row each, an
    /// update of the key a delete of the old key and the new row.
    fn rows(
        &self,
        rows: &RowsEventData<'_>,
        at: &BinlogPos,
    ) -> Result<Option<(usize, Vec<Change>)>, SourceError> {
        let Some(tme) = self.stream.get_tme(rows.table_id()) else {
            return Err(self.fail(format!(
                "a rows event at {at} for table id {} without its table map",
                rows.table_id()
            )));
        };
        let name = TableName {
            schema: tme.database_name().to_string(),
            table: tme.table_name().to_string(),
        };
        let Some(&index) = self.by_name.get(&name) else {
            return Ok(None);
        };
        let op_new = match rows {
            RowsEventData::WriteRowsEvent(_) | RowsEventData::WriteRowsEventV1(_) => "c",
            RowsEventData::UpdateRowsEvent(_) | RowsEventData::UpdateRowsEventV1(_) => "u",
            RowsEventData::DeleteRowsEvent(_) | RowsEventData::DeleteRowsEventV1(_) => "d",
            RowsEventData::PartialUpdateRowsEvent(_) => {
                return Err(self.config(
                    "a partial JSON update (binlog_row_value_options=PARTIAL_JSON): set \
                     binlog_row_value_options='' so updates carry whole rows"
                        .into(),
                ));
            }
        };
        let table = &self.tables[index];
        if tme.columns_count() as usize > table.columns.len() {
            return Err(self.config(format!(
                "table {name} has {} columns in the binary log at {at}, {} when the source \
                 described it: a column was added without a DDL event this source saw; \
                 restart the pipeline",
                tme.columns_count(),
                table.columns.len()
            )));
        }
        // mysql_common's row decoding can panic on values it misreads (an arithmetic
        // overflow in debug builds): caught here, so a bad event fails the stream
        // with its position rather than kill the read-ahead task.
        let values = |row: Option<mysql_async::binlog::row::BinlogRow>| {
            row.map(|row| {
                row.unwrap()
                    .into_iter()
                    .map(|v| Value::try_from(v).ok())
                    .collect::<Vec<_>>()
            })
        };
        let decoded = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rows.rows(tme)
                .map(|row| row.map(|(before, after)| (values(before), values(after))))
                .collect::<std::io::Result<Vec<_>>>()
        }));
        let unreadable = |why: String| SourceError::Io {
            name: self.name.clone(),
            path: self.url.clone(),
            error: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("an unreadable row of {name} at {at}: {why}"),
            ),
        };
        let decoded = match decoded {
            Ok(Ok(decoded)) => decoded,
            Ok(Err(e)) => return Err(unreadable(e.to_string())),
            Err(_) => return Err(unreadable("the binlog row decoder panicked".into())),
        };
        let mut changes = Vec::new();
        for (before, after) in decoded {
            match (op_new, before, after) {
                ("d", Some(before), _) => changes.push(("d", before)),
                ("u", Some(before), Some(after)) => {
                    let key = |row| table.key_of(row, Origin::Binlog);
                    if key(&before) != key(&after) {
                        changes.push(("d", before));
                    }
                    changes.push(("u", after));
                }
                (_, _, Some(after)) => changes.push((op_new, after)),
                _ => {}
            }
        }
        Ok(Some((index, changes)))
    }

    /// Writes the changes of captured table `index` into the open transaction, but
    /// those a snapshot already held.
    async fn push(
        &mut self,
        index: usize,
        changes: Vec<Change>,
        at: &BinlogPos,
        start: BinlogPos,
    ) -> Result<(), SourceError> {
        let open = self
            .open
            .get_or_insert_with(|| Open::new(start, None, false));
        let (gtid, txn_start) = (open.gtid.clone(), open.start.clone());
        for (op, values) in changes {
            if self.held(index, &values, at).await? {
                continue;
            }
            let open = self.open.as_mut().expect("opened above");
            self.layouts[index].write(
                &mut open.text,
                &self.tables[index],
                op,
                &txn_start,
                gtid.as_deref(),
                &values,
                Origin::Binlog,
            );
            open.ends.push(open.text.len());
        }
        Ok(())
    }

    /// Whether a snapshot already held this change of table `index` (a row of it, in
    /// a transaction ending at `at`): [`Segments::holds`], the key's segment found by
    /// the server unless the key is of integers.
    async fn held(
        &mut self,
        index: usize,
        values: &[Option<Value>],
        at: &BinlogPos,
    ) -> Result<bool, SourceError> {
        let table = &self.tables[index];
        let segments = match self.segments.holds(&table.name, at) {
            Holds::Always(held) => return Ok(held),
            Holds::ByKey(segments) => segments,
        };
        let key = table.key_of(values, Origin::Binlog);
        if table.int_key() {
            return Ok(held_in(segments, int_segment(segments, &key), at));
        }
        let uptos: Vec<Option<&[String]>> = segments.iter().map(|s| s.upto.as_deref()).collect();
        if self.order.is_none() {
            self.order = Some(Catalog::connect(&self.name, &self.opts, &self.url).await?);
        }
        let order = self.order.as_mut().expect("connected above");
        let index = order.segment_of(table, &key, &uptos).await?;
        Ok(held_in(segments, index, at))
    }

    /// Ends the open transaction at `end`; none open: none.
    fn finish(&mut self, end: BinlogPos) -> Option<Txn> {
        let mut open = self.open.take()?;
        Some(open.take(Some(end)))
    }

    /// Ends the open transaction, or makes an empty one (a statement outside any,
    /// starting at `start`).
    fn finish_or_empty(&mut self, start: BinlogPos, end: BinlogPos) -> Txn {
        let mut open = self
            .open
            .take()
            .unwrap_or_else(|| Open::new(start, None, true));
        open.take(Some(end))
    }

    /// A statement other than BEGIN/COMMIT: DDL changing a captured table fails the
    /// stream, naming both; one adding columns has the table described again (new
    /// columns flow through); the rest passes ([`crate::ddl`]).
    async fn ddl(&mut self, schema: &str, sql: &str) -> Result<(), SourceError> {
        let captured = |names: &[Named]| -> Vec<usize> {
            let mut hit: Vec<usize> = names
                .iter()
                .filter_map(|n| {
                    let db = n.schema.as_deref().unwrap_or(schema);
                    self.tables.iter().position(|t| {
                        t.name.schema.eq_ignore_ascii_case(db)
                            && t.name.table.eq_ignore_ascii_case(&n.table)
                    })
                })
                .collect();
            hit.dedup();
            hit
        };
        let refresh = match classify(sql) {
            Ddl::None | Ddl::Harmless => return Ok(()),
            Ddl::Changes(names) => {
                if let Some(&i) = captured(&names).first() {
                    let table = &self.tables[i].name;
                    return Err(self.config(format!(
                        "a DDL statement on captured table {table} in the binary log: {sql:?}. \
                         Only added columns flow through; after another change of a table's \
                         shape, reset the pipeline (`sluice apply --delete <pipeline>`, then \
                         run it again) so the table is snapshotted anew"
                    )));
                }
                return Ok(());
            }
            Ddl::AddsColumns(names) => captured(&names),
        };
        if refresh.is_empty() {
            return Ok(());
        }
        let mut catalog = Catalog::connect(&self.name, &self.opts, &self.url).await?;
        for i in refresh {
            let table = catalog.table(&self.tables[i].name).await?;
            self.layouts[i] = Layout::new(&table);
            self.tables[i] = table;
        }
        Ok(())
    }
}

/// A rotate event's file name, without the 4 bytes of checksum `checksummed` says
/// were left on it.
fn file_name(raw: &[u8], checksummed: bool) -> String {
    let name = match checksummed {
        true => &raw[..raw.len().saturating_sub(4)],
        false => raw,
    };
    String::from_utf8_lossy(name).into_owned()
}

/// The stream as the read-ahead's fetcher.
pub struct Fetcher(pub Dump);

#[async_trait::async_trait]
impl Fetch for Fetcher {
    type Item = Item;

    async fn fetch(&mut self) -> Result<Vec<(Item, u64)>, SourceError> {
        let item = self.0.next().await?;
        let bytes = match &item {
            Item::Txn(txn) => txn.text.len() as u64,
            Item::Heartbeat { .. } => 0,
        };
        Ok(vec![(item, bytes)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The checksum's bytes may be anything, digits too (`26` once cost a torture
    /// run its position: `mysql-bin.00000126`).
    #[test]
    fn a_rotate_name_loses_the_checksum_mysql_common_leaves_on_it() {
        assert_eq!(
            file_name(b"mysql-bin.000001\x14Da\x7f", true),
            "mysql-bin.000001"
        );
        assert_eq!(
            file_name(b"mysql-bin.00000126\x8a\x01", true),
            "mysql-bin.000001"
        );
        assert_eq!(file_name(b"mysql-bin.000002", false), "mysql-bin.000002");
    }
}
