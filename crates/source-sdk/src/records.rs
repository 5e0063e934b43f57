//! The records of a step: documents in order, each with where it came from.
//!
//! JSON text is kept back to back in one buffer (a record is its range), so a step of
//! JSON lines or generated documents allocates nothing per record once the buffer has
//! grown; see the crate docs for who parses it.
//!
//! A source that read a record's key hash
//! ([`ShardKeys::key_hash`](crate::ShardKeys::key_hash), to check that the record is
//! one of its partition's) hands it on with the record
//! ([`Records::set_key_hash`]), and the runtime routes the record by it instead of
//! reading its key again. The hashes are kept beside the records, only as far as the
//! last one set: a source that sets none pays nothing per record.

use serde_json::Value;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

/// Where a record came from, for error messages and dead letters. `(line,
/// byte_offset)` identifies a record within its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// The file path, or a source-specific name (`datagen views`, `topic views
    /// partition 2`). Shared: every record carries one, so a clone must not allocate.
    pub source: Arc<str>,
    /// 1-based line (file), sequence number (datagen, a stream), or offset (a log
    /// partition): see `unit`.
    pub line: u64,
    /// The byte offset in a file; for a log, what tells its records apart besides
    /// `line` (a Kafka partition), else 0.
    pub byte_offset: u64,
    pub unit: Unit,
}

/// What [`Position::line`] counts, which is how the position reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Unit {
    /// `path:line (byte N)`.
    #[default]
    Line,
    /// `source offset N` (a Kafka partition's offset).
    Offset,
    /// `source sequence N` (a stream's sequence number).
    Sequence,
}

impl Position {
    /// The position of record `at` of a log: `unit` says whether it is an offset or a
    /// sequence number; `part` tells apart records of one `at` (a partition), else 0.
    pub fn in_log(source: Arc<str>, unit: Unit, at: u64, part: u64) -> Position {
        Position {
            source,
            line: at,
            byte_offset: part,
            unit,
        }
    }
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.unit {
            Unit::Line => write!(
                f,
                "{}:{} (byte {})",
                self.source, self.line, self.byte_offset
            ),
            Unit::Offset => write!(f, "{} offset {}", self.source, self.line),
            Unit::Sequence => write!(f, "{} sequence {}", self.source, self.line),
        }
    }
}

/// The records of a step, in order, each a document and where it came from (see the
/// module docs).
#[derive(Debug, Default)]
pub struct Records {
    /// The text of every JSON record, back to back.
    text: Vec<u8>,
    records: Vec<Stored>,
    /// The key hash of each record its source set one of, by record number; shorter
    /// than `records` when the last ones have none.
    key_hashes: Vec<Option<u32>>,
}

#[derive(Debug)]
struct Stored {
    doc: StoredDoc,
    position: Position,
    bytes: usize,
}

#[derive(Debug)]
enum StoredDoc {
    /// Its range of [`Records::text`].
    Json(Range<usize>),
    Value(Value),
}

/// One record of [`Records`].
#[derive(Debug)]
pub struct Record<'a> {
    pub doc: RecordDoc<'a>,
    pub position: &'a Position,
    /// Size of the raw record (counts towards transaction byte bounds).
    pub bytes: usize,
}

/// A record's document: as JSON text, or as the `Value` its source built (the
/// combiner may take it).
#[derive(Debug)]
pub enum RecordDoc<'a> {
    Json(&'a [u8]),
    Value(&'a mut Value),
}

impl RecordDoc<'_> {
    /// The document, read in place.
    pub fn shared(&self) -> SharedDoc<'_> {
        match self {
            RecordDoc::Json(text) => SharedDoc::Json(text),
            RecordDoc::Value(value) => SharedDoc::Value(value),
        }
    }
}

/// A record read in place ([`Records::get`]), where the records are shared (between
/// threads): its `Value` is borrowed, not taken.
#[derive(Debug)]
pub struct SharedRecord<'a> {
    pub doc: SharedDoc<'a>,
    pub position: &'a Position,
    pub bytes: usize,
    /// The key hash its source read ([`Records::set_key_hash`]).
    pub key_hash: Option<u32>,
}

/// A document read in place: JSON text, or the `Value` its source built.
#[derive(Debug, Clone, Copy)]
pub enum SharedDoc<'a> {
    Json(&'a [u8]),
    Value(&'a Value),
}

impl Records {
    /// Appends a document given as JSON text, unparsed; `bytes` is its raw record's size.
    pub fn push_json(&mut self, text: &[u8], position: Position, bytes: usize) {
        self.push_text(position, Some(bytes), |buf| buf.extend_from_slice(text));
    }

    /// Appends a document that `write` writes as JSON text straight into the buffer (its
    /// raw record); returns that text.
    pub fn push_json_with(
        &mut self,
        position: Position,
        write: impl FnOnce(&mut Vec<u8>),
    ) -> &[u8] {
        self.push_text(position, None, write)
    }

    /// Appends the text `write` writes; the raw record is `bytes` long, or the text.
    fn push_text(
        &mut self,
        position: Position,
        bytes: Option<usize>,
        write: impl FnOnce(&mut Vec<u8>),
    ) -> &[u8] {
        let start = self.text.len();
        write(&mut self.text);
        let range = start..self.text.len();
        self.records.push(Stored {
            bytes: bytes.unwrap_or(range.len()),
            doc: StoredDoc::Json(range.clone()),
            position,
        });
        &self.text[range]
    }

    /// Appends a document its source built as a `Value`.
    pub fn push_value(&mut self, doc: Value, position: Position, bytes: usize) {
        self.records.push(Stored {
            doc: StoredDoc::Value(doc),
            position,
            bytes,
        });
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// Sets the key hash of record `at` to `hash`, as
    /// [`ShardKeys::key_hash`](crate::ShardKeys::key_hash) read it from its text: the
    /// runtime routes the record by it rather than reading its key again.
    ///
    /// Panics when there is no record `at`.
    pub fn set_key_hash(&mut self, at: usize, hash: u32) {
        assert!(
            at < self.records.len(),
            "no record {at} to set a key hash of"
        );
        if self.key_hashes.len() <= at {
            self.key_hashes.resize(at + 1, None);
        }
        self.key_hashes[at] = Some(hash);
    }

    /// Keeps the first `len` records.
    pub fn truncate(&mut self, len: usize) {
        let cut = self.records.get(len..).unwrap_or_default();
        if let Some(start) = cut.iter().find_map(|r| match &r.doc {
            StoredDoc::Json(range) => Some(range.start),
            StoredDoc::Value(_) => None,
        }) {
            self.text.truncate(start);
        }
        self.records.truncate(len);
        self.key_hashes.truncate(len);
    }

    /// Removes every record, keeping the buffers' capacity.
    pub fn clear(&mut self) {
        self.text.clear();
        self.records.clear();
        self.key_hashes.clear();
    }

    /// Record `at`, read in place.
    pub fn get(&self, at: usize) -> Option<SharedRecord<'_>> {
        let stored = self.records.get(at)?;
        Some(SharedRecord {
            doc: match &stored.doc {
                StoredDoc::Json(range) => SharedDoc::Json(&self.text[range.clone()]),
                StoredDoc::Value(value) => SharedDoc::Value(value),
            },
            position: &stored.position,
            bytes: stored.bytes,
            key_hash: self.key_hashes.get(at).copied().flatten(),
        })
    }

    /// The records in order; a `Value` document may be taken out of its record.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = Record<'_>> {
        let text = &self.text;
        self.records.iter_mut().map(move |stored| Record {
            doc: match &mut stored.doc {
                StoredDoc::Json(range) => RecordDoc::Json(&text[range.clone()]),
                StoredDoc::Value(value) => RecordDoc::Value(value),
            },
            position: &stored.position,
            bytes: stored.bytes,
        })
    }
}

/// Why a record's JSON `text` did not parse (`error`), as every bad-input error says
/// it: where in the record (a column; the line too when the record spans several, as
/// serde_json's own "line 1" would mislead for a record that is one line of a file)
/// and serde_json's message.
pub fn bad_json(text: &[u8], error: &serde_json::Error) -> String {
    if let Err(u) = std::str::from_utf8(text) {
        return format!("invalid UTF-8 at byte {} of the line", u.valid_up_to());
    }
    let full = error.to_string();
    let message = full.rfind(" at line ").map_or(&full[..], |at| &full[..at]);
    match (error.line(), error.column()) {
        (0, _) => format!("invalid JSON: {message}"),
        (1, column) => format!("invalid JSON at column {column}: {message}"),
        (line, column) => format!("invalid JSON at line {line} column {column}: {message}"),
    }
}

/// Input that could not be parsed. Its record is not emitted.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{position}: {reason}")]
pub struct InputError {
    pub position: Position,
    /// The start of the raw record, at most [`InputError::RAW_LIMIT`] bytes.
    pub raw: Vec<u8>,
    pub reason: String,
}

impl InputError {
    /// How much of a bad record is kept for the error message.
    pub const RAW_LIMIT: usize = 256;

    pub fn new(position: Position, raw: &[u8], reason: impl Into<String>) -> InputError {
        InputError {
            position,
            raw: raw[..raw.len().min(Self::RAW_LIMIT)].to_vec(),
            reason: reason.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(line: u64) -> Position {
        Position::in_log("topic t partition 0".into(), Unit::Offset, line, 0)
    }

    #[test]
    fn a_key_hash_set_stays_with_its_record_until_it_is_cut() {
        let mut records = Records::default();
        for line in 0..4 {
            records.push_json(b"{}", at(line), 2);
        }
        records.set_key_hash(1, 7);
        records.set_key_hash(2, 9);
        let hashes = |records: &Records| -> Vec<Option<u32>> {
            (0..records.len())
                .map(|i| records.get(i).unwrap().key_hash)
                .collect()
        };
        assert_eq!(hashes(&records), [None, Some(7), Some(9), None]);
        records.truncate(2);
        records.push_json(b"{}", at(5), 2);
        assert_eq!(hashes(&records), [None, Some(7), None], "not the cut one's");
        records.clear();
        records.push_json(b"{}", at(6), 2);
        assert_eq!(hashes(&records), [None]);
    }
}
