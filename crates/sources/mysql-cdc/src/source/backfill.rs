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
use sluice_source_sdk::cdc::{Chunks, Fill, Journal};
use sluice_source_sdk::{QueueLimits, Records, SourceError, Step};

pub(super) struct Backfill {
    catalog: Catalog,
    tables: Vec<Table>,
    layouts: Vec<Layout>,
    start: BinlogPos,
    gtid: String,
    /// The table being read, the key of its last row handed over, its rows read and
    /// not yet handed over.
    chunks: Chunks<Vec<Option<mysql_async::Value>>>,
    snapshot: BinlogPos,
    segments: Segments,
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
        let Backfill {
            catalog,
            tables,
            layouts,
            start,
            gtid,
            chunks,
            snapshot,
            segments,
        } = &mut **b;
        let mut journal = Journal::new(out, &self.origin, snapshot.pos);
        loop {
            let fill = chunks.fill(
                &mut journal,
                limits,
                tables.len(),
                // Keyed by a JSON column: read whole.
                |i| !tables[i].chunked,
                |i, row, doc| {
                    let table = &tables[i];
                    layouts[i].write(doc, table, "r", snapshot, None, row, Origin::Snapshot);
                },
                |i, row| tables[i].key_of(row, Origin::Snapshot),
            );
            match fill {
                Fill::StepEnds => break,
                Fill::TableRead { table } => {
                    segments.push(&tables[table].name, None, snapshot.clone());
                }
                Fill::Chunk { limit, whole } => {
                    let table = &tables[chunks.table];
                    let after = match &chunks.after {
                        Some(after) if !whole => {
                            Some(table.key_params(after).map_err(|reason| {
                                SourceError::BadResume {
                                    name: self.name.clone(),
                                    action: "resume the snapshot of",
                                    resume: serde_json::json!({"table": table.name.to_string(), "after": after}),
                                    reason,
                                }
                            })?)
                        }
                        _ => None,
                    };
                    let rows = catalog.chunk(table, after, limit).await?;
                    chunks.add(rows, limit, whole);
                }
            }
        }
        if chunks.table >= tables.len() && journal.records() == 0 {
            // Nothing left to read: stream from where the first snapshot was.
            let (start, segments) = (start.clone(), segments.clone());
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
        let position = CdcPosition::Backfill {
            start: start.clone(),
            gtid: gtid.clone(),
            tables: tables.iter().map(|t| t.name.clone()).collect(),
            table: chunks.table,
            after: chunks.after.clone(),
            snapshot: snapshot.clone(),
            segments: segments.0.clone(),
        };
        let position = serde_json::to_value(&position).expect("a position serializes");
        Ok(Some(journal.into_step(position)))
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

/// The backfill of `tables` from where `chunks` is, in the snapshot at `snapshot`.
pub(super) fn backfill(
    catalog: Catalog,
    tables: Vec<Table>,
    start: BinlogPos,
    gtid: String,
    chunks: Chunks<Vec<Option<mysql_async::Value>>>,
    snapshot: BinlogPos,
) -> NewBackfill {
    let layouts = tables.iter().map(Layout::new).collect();
    NewBackfill(Backfill {
        catalog,
        tables,
        layouts,
        start,
        gtid,
        chunks,
        snapshot,
        segments: Segments::default(),
    })
}
