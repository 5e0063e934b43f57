//! The backfill: the captured tables read in a consistent snapshot, chunk by chunk in
//! primary-key order, each step journaling its documents (see the parent module).
//!
//! A chunk starts after the key of the last row read (`after`, its text as the step's
//! position journals it), sent back to the server as a typed bound it compares in the
//! key's own order ([`crate::key`]): a continued backfill and one resumed from a
//! journal read the same next chunk.

use super::{MysqlCdcSource, Phase};
use crate::catalog::{Catalog, Table};
use crate::doc::Layout;
use crate::position::{BinlogPos, CdcPosition, Segments};
use crate::types::Origin;
use sluice_source_sdk::{
    Position, QueueLimits, Records, Resume, SourceError, Step, StepHasher, Unit,
};
use std::collections::VecDeque;

pub(super) struct Backfill {
    catalog: Catalog,
    tables: Vec<Table>,
    layouts: Vec<Layout>,
    start: BinlogPos,
    gtid: String,
    table: usize,
    after: Option<Vec<String>>,
    snapshot: BinlogPos,
    segments: Segments,
    rows: VecDeque<Vec<Option<mysql_async::Value>>>,
    exhausted: bool,
}

impl MysqlCdcSource {
    pub(super) async fn queue_backfill(
        &mut self,
        limits: QueueLimits,
        out: &mut Records,
    ) -> Result<Option<Step>, SourceError> {
        let Phase::Backfill(b) = &mut self.phase else {
            return Ok(None);
        };
        let chunk_rows = self.config.chunk_rows;
        let mut data = Vec::new();
        let mut records = 0usize;
        let mut doc = Vec::new();
        'step: while b.table < b.tables.len() {
            let table = &b.tables[b.table];
            let whole = !table.chunked;
            if whole && records > 0 {
                break; // a table read whole is a step of its own
            }
            while let Some(row) = b.rows.pop_front() {
                if !whole
                    && records > 0
                    && (records >= limits.max_records || data.len() as u64 >= limits.max_bytes)
                {
                    b.rows.push_front(row);
                    break 'step;
                }
                doc.clear();
                b.layouts[b.table].write(
                    &mut doc,
                    table,
                    "r",
                    &b.snapshot,
                    None,
                    &row,
                    Origin::Snapshot,
                );
                out.push_json(
                    &doc,
                    Position::in_log(
                        self.origin.clone(),
                        Unit::Offset,
                        b.snapshot.pos,
                        records as u64,
                    ),
                    doc.len(),
                );
                data.extend_from_slice(&doc);
                data.push(b'\n');
                records += 1;
                if !whole {
                    b.after = Some(table.key_of(&row, Origin::Snapshot));
                }
            }
            if b.exhausted {
                let name = table.name.clone();
                b.segments.push(&name, None, b.snapshot.clone());
                b.table += 1;
                b.after = None;
                b.exhausted = false;
                continue;
            }
            let limit = if whole {
                usize::MAX
            } else {
                chunk_rows.min(limits.max_records.max(1))
            };
            let after = match &b.after {
                Some(after) if !whole => Some(table.key_params(after).map_err(|reason| {
                    SourceError::BadResume {
                        name: self.name.clone(),
                        action: "resume the snapshot of",
                        resume: serde_json::json!({"table": table.name.to_string(), "after": after}),
                        reason,
                    }
                })?),
                _ => None,
            };
            let rows = b.catalog.chunk(table, after, limit).await?;
            b.exhausted = whole || rows.len() < limit;
            b.rows.extend(rows);
        }
        let position = CdcPosition::Backfill {
            start: b.start.clone(),
            gtid: b.gtid.clone(),
            tables: b.tables.iter().map(|t| t.name.clone()).collect(),
            table: b.table,
            after: b.after.clone(),
            snapshot: b.snapshot.clone(),
            segments: b.segments.0.clone(),
        };
        let done = b.table >= b.tables.len();
        if done && records == 0 {
            // Nothing left to read: stream from where the first snapshot was.
            let (start, segments) = (b.start.clone(), b.segments.clone());
            self.phase = Phase::Idle;
            self.resume = Some(CdcPosition::Stream {
                begin: start.clone(),
                end: start,
                gtid: None,
                gtid_state: None,
                segments: segments.0,
                part: None,
                quiet: false,
            });
            return Ok(None);
        }
        let mut hasher = StepHasher::new();
        hasher.append(&data);
        Ok(Some(Step {
            records,
            bytes: data.len() as u64,
            errors: Vec::new(),
            end_of_input: false,
            advances: false,
            unit_continues: false,
            resume: Resume::Replay {
                position: serde_json::to_value(&position).expect("a position serializes"),
                data: Some(data),
                hash: hasher.finish(),
            },
        }))
    }
}

/// A backfill phase being built (its segments still to add).
pub(super) struct NewBackfill(Backfill);

impl NewBackfill {
    pub(super) fn with(mut self, segments: Segments) -> Phase {
        self.0.segments = segments;
        Phase::Backfill(Box::new(self.0))
    }
}

pub(super) fn backfill(
    catalog: Catalog,
    tables: Vec<Table>,
    start: BinlogPos,
    gtid: String,
    table: usize,
    after: Option<Vec<String>>,
    snapshot: BinlogPos,
) -> NewBackfill {
    let layouts = tables.iter().map(Layout::new).collect();
    NewBackfill(Backfill {
        catalog,
        tables,
        layouts,
        start,
        gtid,
        table,
        after,
        snapshot,
        segments: Segments::default(),
        rows: VecDeque::new(),
        exhausted: false,
    })
}
