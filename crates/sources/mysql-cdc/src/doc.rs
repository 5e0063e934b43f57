//! A change as a document: the row's columns as JSON ([`crate::types`]) after its
//! metadata, written straight as JSON text (the combiner parses it once).
//!
//! ```text
//!  {"_meta":{"op":"u","file":"mysql-bin.000003","pos":1834,"gtid":"0-1-17","source":{"schema":"shop","table":"orders"}},"id":7,"total":12.5}
//! ```
//!
//! `op` is `r` for a snapshot row (read, as in Debezium), `c` insert, `u` update, `d`
//! delete; `file` and `pos` are where the snapshot was consistent for a snapshot row,
//! else the end of the change's transaction in the binary log; `gtid` is the
//! transaction's MariaDB GTID when the server has them. A delete carries the whole
//! old row (`binlog_row_image=FULL`).

use crate::catalog::Table;
use crate::position::BinlogPos;
use crate::types::{self, Origin};
use mysql_async::Value;

/// How a table's documents are written: its metadata and column names as JSON text,
/// made once.
#[derive(Debug, Clone)]
pub struct Layout {
    /// `,"source":{"schema":…,"table":…}}`, closing `_meta`.
    source: Vec<u8>,
    /// `"name":` per column.
    keys: Vec<Vec<u8>>,
}

impl Layout {
    pub fn new(table: &Table) -> Layout {
        let source = serde_json::json!({"schema": table.name.schema, "table": table.name.table});
        Layout {
            source: format!(",\"source\":{source}}}").into_bytes(),
            keys: table
                .columns
                .iter()
                .map(|c| {
                    let mut key = serde_json::to_vec(&c.name).expect("a string serializes");
                    key.push(b':');
                    key
                })
                .collect(),
        }
    }

    /// Writes one document: `op` at `at` (in the transaction `gtid`, if known), with
    /// the row's `values` (one per column of `table`, in order; a missing one is left
    /// out).
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &self,
        out: &mut Vec<u8>,
        table: &Table,
        op: &str,
        at: &BinlogPos,
        gtid: Option<&str>,
        values: &[Option<Value>],
        origin: Origin,
    ) {
        out.extend_from_slice(b"{\"_meta\":{\"op\":\"");
        out.extend_from_slice(op.as_bytes());
        out.extend_from_slice(b"\",\"file\":");
        types::write_string(&at.file, out);
        out.extend_from_slice(b",\"pos\":");
        out.extend_from_slice(at.pos.to_string().as_bytes());
        if let Some(gtid) = gtid {
            out.extend_from_slice(b",\"gtid\":");
            types::write_string(gtid, out);
        }
        out.extend_from_slice(&self.source);
        for (i, column) in table.columns.iter().enumerate() {
            let Some(Some(value)) = values.get(i) else {
                continue;
            };
            out.push(b',');
            out.extend_from_slice(&self.keys[i]);
            types::write(&column.kind, value, origin, out);
        }
        out.push(b'}');
    }
}
