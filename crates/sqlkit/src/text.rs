//! Rows in the escaped text format that both PostgreSQL's `COPY ... FROM STDIN` and
//! MariaDB's `LOAD DATA` read by default: fields separated by tabs, rows ended by
//! newlines, SQL NULL as `\N`, and backslash, tab, newline and carriage return escaped
//! inside fields. The two differ only in NUL: `LOAD DATA` reads `\0`, while PostgreSQL
//! text cannot hold NUL at all (the server refuses it either way), so it is left raw
//! ([`TextTable::ESCAPE_NUL`]).
//!
//! ```text
//!   a\tb\\c   \N   {"x":1}   {"k":"a"}\n      ← keys, values, document of one row
//! ```
//!
//! Invariant: a row that fails to convert (a value that does not fit its column) leaves
//! nothing behind, so the rows written so far stay loadable.

use super::{Column, Table};
use serde_json::Value;
use sluice_driver_sdk::Result;
use std::marker::PhantomData;

/// A table whose rows [`TextRows`] writes: its columns, and the text form of a value
/// in one of them.
pub trait TextTable {
    type Column;
    /// Whether NUL inside a field is written `\0` (`LOAD DATA`) or as is (`COPY`).
    const ESCAPE_NUL: bool;
    /// Keys, then values, then the document column (if any).
    fn columns(&self) -> &[Self::Column];
    fn has_document(&self) -> bool;
    /// Writes the unescaped text form of `value` for `column`, or returns `false` for
    /// SQL NULL (JSON null).
    fn write_text(out: &mut Vec<u8>, column: &Self::Column, value: &Value) -> Result<bool>;
}

/// A store's column type whose values [`TextRows`] writes: every [`Table`] of it is a
/// [`TextTable`].
pub trait TextColumn: Sized {
    /// [`TextTable::ESCAPE_NUL`].
    const ESCAPE_NUL: bool;
    /// [`TextTable::write_text`].
    fn write_text(out: &mut Vec<u8>, column: &Column<Self>, value: &Value) -> Result<bool>;
}

impl<C: TextColumn> TextTable for Table<C> {
    type Column = Column<C>;
    const ESCAPE_NUL: bool = C::ESCAPE_NUL;

    fn columns(&self) -> &[Column<C>] {
        &self.columns
    }

    fn has_document(&self) -> bool {
        self.has_document
    }

    fn write_text(out: &mut Vec<u8>, column: &Column<C>, value: &Value) -> Result<bool> {
        C::write_text(out, column, value)
    }
}

/// Rows of a [`TextTable`], ready for one bulk load.
#[derive(Debug)]
pub struct TextRows<T> {
    buf: Vec<u8>,
    scratch: Vec<u8>,
    rows: usize,
    table: PhantomData<fn(&T)>,
}

impl<T> Default for TextRows<T> {
    fn default() -> Self {
        TextRows {
            buf: Vec::new(),
            scratch: Vec::new(),
            rows: 0,
            table: PhantomData,
        }
    }
}

impl<T: TextTable> TextRows<T> {
    /// Appends one row: `values` for the leading columns, then `document` (JSON text)
    /// if the table has a document column. A failed row leaves nothing behind.
    pub fn push<'v>(
        &mut self,
        table: &T,
        values: impl IntoIterator<Item = &'v Value>,
        document: Option<&[u8]>,
    ) -> Result<()> {
        let start = self.buf.len();
        let result = self.push_fields(table, values, document);
        if result.is_err() {
            self.buf.truncate(start);
        } else {
            self.rows += 1;
        }
        result
    }

    fn push_fields<'v>(
        &mut self,
        table: &T,
        values: impl IntoIterator<Item = &'v Value>,
        document: Option<&[u8]>,
    ) -> Result<()> {
        let mut first = true;
        let mut separator = |buf: &mut Vec<u8>| {
            if !std::mem::take(&mut first) {
                buf.push(b'\t');
            }
        };
        for (column, value) in table.columns().iter().zip(values) {
            separator(&mut self.buf);
            self.scratch.clear();
            if T::write_text(&mut self.scratch, column, value)? {
                escape_into(&mut self.buf, &self.scratch, field_escape::<T>);
            } else {
                self.buf.extend_from_slice(b"\\N");
            }
        }
        if let Some(document) = document.filter(|_| table.has_document()) {
            separator(&mut self.buf);
            escape_into(&mut self.buf, document, field_escape::<T>);
        }
        self.buf.push(b'\n');
        Ok(())
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    /// The rows written so far; the buffer is empty afterwards.
    pub fn take(&mut self) -> Vec<u8> {
        self.rows = 0;
        std::mem::take(&mut self.buf)
    }
}

/// The escape of byte `b` inside a field of `T`'s text format, if it needs one.
fn field_escape<T: TextTable>(b: u8) -> Option<&'static [u8]> {
    match b {
        b'\\' => Some(b"\\\\"),
        b'\t' => Some(b"\\t"),
        b'\n' => Some(b"\\n"),
        b'\r' => Some(b"\\r"),
        0 if T::ESCAPE_NUL => Some(b"\\0"),
        _ => None,
    }
}

/// Appends `text` with the escapes `escape` gives. Runs without special bytes are copied
/// whole.
pub fn escape_into(out: &mut Vec<u8>, text: &[u8], escape: impl Fn(u8) -> Option<&'static [u8]>) {
    let mut rest = text;
    while let Some((i, escaped)) = rest
        .iter()
        .enumerate()
        .find_map(|(i, &b)| escape(b).map(|e| (i, e)))
    {
        out.extend_from_slice(&rest[..i]);
        out.extend_from_slice(escaped);
        rest = &rest[i + 1..];
    }
    out.extend_from_slice(rest);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mismatch;
    use serde_json::json;

    /// Columns are field names; every value is written as its JSON text, except that
    /// a column named `n` holds only numbers.
    struct Table<const NUL: bool> {
        columns: Vec<&'static str>,
        has_document: bool,
    }

    impl<const NUL: bool> TextTable for Table<NUL> {
        type Column = &'static str;
        const ESCAPE_NUL: bool = NUL;
        fn columns(&self) -> &[&'static str] {
            &self.columns
        }
        fn has_document(&self) -> bool {
            self.has_document
        }
        fn write_text(out: &mut Vec<u8>, column: &&'static str, value: &Value) -> Result<bool> {
            match value {
                Value::Null => return Ok(false),
                Value::String(s) if *column != "n" => out.extend_from_slice(s.as_bytes()),
                Value::Number(n) => out.extend_from_slice(n.to_string().as_bytes()),
                other if *column != "n" => out.extend_from_slice(other.to_string().as_bytes()),
                other => return Err(mismatch(column, other, "is not a number")),
            }
            Ok(true)
        }
    }

    fn table<const NUL: bool>() -> Table<NUL> {
        Table {
            columns: vec!["k", "n", "j", "flow_document"],
            has_document: true,
        }
    }

    #[test]
    fn rows_escape_special_bytes_and_write_nulls() {
        let mut rows = TextRows::<Table<false>>::default();
        let values = [json!("a\tb\\c\nd\re"), Value::Null, json!({"x": "q\\"})];
        rows.push(&table(), &values, Some(br#"{"k":"\\"}"#))
            .unwrap();
        rows.push(&table(), &[json!("e"), json!(3), json!([1])], Some(b"{}"))
            .unwrap();
        assert_eq!(rows.rows(), 2);
        assert_eq!(
            String::from_utf8(rows.take()).unwrap(),
            "a\\tb\\\\c\\nd\\re\t\\N\t{\"x\":\"q\\\\\\\\\"}\t{\"k\":\"\\\\\\\\\"}\n\
             e\t3\t[1]\t{}\n"
        );
        assert!(rows.is_empty());
    }

    #[test]
    fn nul_is_escaped_only_where_the_format_reads_it() {
        let values = [json!("a\0b"), json!(1), json!(null)];
        let mut raw = TextRows::<Table<false>>::default();
        raw.push(&table(), &values, None).unwrap();
        assert_eq!(raw.take(), b"a\0b\t1\t\\N\n");
        let mut escaped = TextRows::<Table<true>>::default();
        escaped.push(&table(), &values, None).unwrap();
        assert_eq!(escaped.take(), b"a\\0b\t1\t\\N\n");
    }

    #[test]
    fn a_failed_row_leaves_nothing_behind() {
        let mut rows = TextRows::<Table<true>>::default();
        rows.push(&table(), &[json!("a"), json!(1)], None).unwrap();
        let err = rows
            .push(&table(), &[json!("b"), json!("seven")], Some(b"{}"))
            .unwrap_err();
        assert!(err.to_string().contains("field \"n\""), "{err}");
        assert_eq!(rows.rows(), 1);
        assert_eq!(rows.take(), b"a\t1\n");
    }
}
