//! CSV: one row per document, the selected fields (keys, then values) and `_op`
//! (`insert` or `delete`; an update is two rows, as in `insert_delete`). Cells are
//! RFC 4180: strings as text, quoted when they hold a comma, a quote, a line break or
//! surrounding spaces, or are empty (an empty cell is `null` or absent); numbers and
//! booleans as JSON writes them; objects and arrays as their JSON text.

use super::{Buffer, Encoder, Fields, write_json};
use crate::Result;
use crate::change::{Change, Op};
use serde_json::Value;

pub struct Csv {
    fields: Fields,
    key: Vec<u8>,
    row: Vec<u8>,
    scratch: Vec<u8>,
}

impl Csv {
    pub fn new(fields: Fields) -> Csv {
        Csv {
            fields,
            key: Vec::new(),
            row: Vec::new(),
            scratch: Vec::new(),
        }
    }

    fn row(&mut self, op: &str, doc: &Value, out: &mut Buffer) {
        self.row.clear();
        for field in self.fields.all() {
            match field.get(doc) {
                None | Some(Value::Null) => {}
                Some(Value::String(s)) => cell(s.as_bytes(), &mut self.row),
                Some(other) => {
                    self.scratch.clear();
                    write_json(other, &mut self.scratch);
                    cell(&self.scratch, &mut self.row);
                }
            }
            self.row.push(b',');
        }
        self.row.extend_from_slice(op.as_bytes());
        self.row.push(b'\n');
        out.push(&self.key, &self.row);
    }
}

/// Appends `text` as one cell.
fn cell(text: &[u8], out: &mut Vec<u8>) {
    let quote = text.is_empty()
        || text.first().is_some_and(u8::is_ascii_whitespace)
        || text.last().is_some_and(u8::is_ascii_whitespace)
        || text
            .iter()
            .any(|b| matches!(b, b',' | b'"' | b'\n' | b'\r'));
    if !quote {
        out.extend_from_slice(text);
        return;
    }
    out.push(b'"');
    for &b in text {
        if b == b'"' {
            out.push(b'"');
        }
        out.push(b);
    }
    out.push(b'"');
}

/// Reads one row back, the inverse of this encoder (for tests and tools that read its
/// files; fuzzed as a decoder of outside input): its cells, `None` for an empty
/// unquoted cell (a null or absent field), else the text with the quoting undone. `line` is one row, its
/// final newline optional; a line break is taken only inside quotes. `Err` names the
/// offset where `line` stops being such a row. The cells hold no more bytes than `line`.
pub fn read_row(line: &[u8]) -> std::result::Result<Vec<Option<String>>, String> {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let text = |bytes: Vec<u8>, at: usize| {
        String::from_utf8(bytes).map_err(|e| format!("offset {at}: a cell that is not UTF-8: {e}"))
    };
    let mut cells = Vec::new();
    let mut at = 0;
    loop {
        if line.get(at) == Some(&b'"') {
            let start = at;
            let mut cell = Vec::new();
            at += 1;
            loop {
                match line.get(at) {
                    None => return Err(format!("offset {start}: a quote that is not closed")),
                    Some(b'"') if line.get(at + 1) == Some(&b'"') => {
                        cell.push(b'"');
                        at += 2;
                    }
                    Some(b'"') => {
                        at += 1;
                        break;
                    }
                    Some(&b) => {
                        cell.push(b);
                        at += 1;
                    }
                }
            }
            if !matches!(line.get(at), None | Some(b',')) {
                return Err(format!("offset {at}: text after a closing quote"));
            }
            cells.push(Some(text(cell, start)?));
        } else {
            let end = (line[at..].iter().position(|&b| b == b',')).map_or(line.len(), |n| at + n);
            let cell = &line[at..end];
            if let Some(n) = cell.iter().position(|b| matches!(b, b'"' | b'\n' | b'\r')) {
                return Err(format!(
                    "offset {}: a quote or line break in an unquoted cell",
                    at + n
                ));
            }
            cells.push(
                (!cell.is_empty())
                    .then(|| text(cell.to_vec(), at))
                    .transpose()?,
            );
            at = end;
        }
        if at == line.len() {
            return Ok(cells);
        }
        at += 1; // the comma
    }
}

impl Encoder for Csv {
    fn header(&self) -> Option<Vec<u8>> {
        let mut header = Vec::new();
        for field in self.fields.all() {
            cell(field.name.as_bytes(), &mut header);
            header.push(b',');
        }
        header.extend_from_slice(b"_op\n");
        Some(header)
    }

    fn encode(&mut self, change: &Change<'_>, out: &mut Buffer) -> Result<()> {
        self.key.clear();
        self.fields.write_json_key(change.current(), &mut self.key);
        if let (Op::Update | Op::Delete, Some(before)) = (change.op, change.before) {
            self.row("delete", before, out);
        }
        if let Some(after) = change.after {
            self.row("insert", after, out);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rows_quote_what_csv_needs_and_leave_null_empty() {
        let mut csv = Csv::new(crate::encode::json::tests::fields());
        assert_eq!(csv.header().unwrap(), b"id,n,_op\n");
        let mut out = Buffer::default();
        let (old, new) = (
            json!({"id": "a,\"b\"", "n": null}),
            json!({"id": "", "n": 2}),
        );
        let change = Change {
            txn: 1,
            op: Op::Update,
            before: Some(&old),
            after: Some(&new),
        };
        csv.encode(&change, &mut out).unwrap();
        let rows: Vec<_> = out.messages().map(|m| m.value.to_vec()).collect();
        assert_eq!(rows[0], b"\"a,\"\"b\"\"\",,delete\n");
        assert_eq!(rows[1], b"\"\",2,insert\n");
    }

    #[test]
    fn rows_read_back_as_their_cells() {
        let some = |s: &str| Some(s.to_string());
        assert_eq!(
            read_row(b"\"a,\"\"b\"\"\",,delete\n").unwrap(),
            [some("a,\"b\""), None, some("delete")]
        );
        assert_eq!(
            read_row(b"\"\",2,\"x\ny\"").unwrap(),
            [some(""), some("2"), some("x\ny")]
        );
        assert_eq!(read_row(b"").unwrap(), [None]);
        let err = |row: &[u8]| read_row(row).unwrap_err();
        assert_eq!(err(b"a,\"b"), "offset 2: a quote that is not closed");
        assert_eq!(err(b"\"a\"b,c"), "offset 3: text after a closing quote");
        assert_eq!(
            err(b"a\"b"),
            "offset 1: a quote or line break in an unquoted cell"
        );
        assert!(err(b"\xff").contains("not UTF-8"));
    }
}
