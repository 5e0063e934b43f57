//! A change as a document: the row's columns as JSON ([`crate::types`]) after its
//! metadata, written straight as JSON text (the combiner parses it once).
//!
//! ```text
//!  {"_meta":{"op":"u","lsn":23911816,"source":{"schema":"public","table":"orders"}},"id":7,"total":12.5}
//! ```
//!
//! `op` is `r` for a snapshot row (read, as in Debezium), `c` insert, `u` update, `d`
//! delete; `lsn` is the snapshot's LSN for a snapshot row, else where the commit record
//! of the change's transaction starts. A delete carries the key columns (the whole old
//! row under `REPLICA IDENTITY FULL`). A TOASTed column an update left unchanged is not
//! sent by PostgreSQL and is left out of the document.

use crate::position::TableName;
use crate::types::Types;

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
    pub fn new(table: &TableName, columns: &[(String, u32)]) -> Layout {
        let source = serde_json::json!({"schema": table.schema, "table": table.table});
        Layout {
            source: format!(",\"source\":{source}}}").into_bytes(),
            keys: columns
                .iter()
                .map(|(name, _)| {
                    let mut key = serde_json::to_vec(name).expect("a string serializes");
                    key.push(b':');
                    key
                })
                .collect(),
        }
    }

    /// Writes one document: `op` at `lsn`, with the columns that `values` yields
    /// (index, type OID, text; None: NULL).
    pub fn write<'a>(
        &self,
        out: &mut Vec<u8>,
        types: &Types,
        op: &str,
        lsn: u64,
        values: impl Iterator<Item = (usize, u32, Option<&'a str>)>,
    ) {
        out.extend_from_slice(b"{\"_meta\":{\"op\":\"");
        out.extend_from_slice(op.as_bytes());
        out.extend_from_slice(b"\",\"lsn\":");
        out.extend_from_slice(lsn.to_string().as_bytes());
        out.extend_from_slice(&self.source);
        for (i, oid, text) in values {
            out.push(b',');
            out.extend_from_slice(&self.keys[i]);
            types.write(oid, text, out);
        }
        out.push(b'}');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_carries_its_metadata_first() {
        let table = TableName {
            schema: "public".into(),
            table: "t".into(),
        };
        let layout = Layout::new(&table, &[("id".into(), 23), ("name".into(), 25)]);
        let mut out = Vec::new();
        let values = [(0, 23, Some("7")), (1, 25, None)];
        layout.write(&mut out, &Types::default(), "c", 42, values.into_iter());
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"{"_meta":{"op":"c","lsn":42,"source":{"schema":"public","table":"t"}},"id":7,"name":null}"#
        );
    }
}
