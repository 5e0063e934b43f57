//! The source model: readers driven by commands, reporting per step how to resume.
//!
//! ```text
//!  open_source ─▶ seek(committed position)? ─▶ replay(journaled step)* ─▶ extend
//!                                                                          │
//!                    ┌─────────────── queue(limits, &mut Records) ◀────────┤
//!                    └──▶ Step { records, errors, end_of_input, resume } ──┘
//!                                                                 pause ─▶ disconnect
//! ```
//!
//! A step appends its documents to [`Records`], in order. A document is handed over as
//! the JSON text the source has (a JSON line, a generated document), unparsed: the
//! reader's combiner parses it into one `Value` it reuses, so same-shaped documents
//! allocate nothing (`Combiner::combine_right_json`). Only a source that builds its
//! documents itself (CSV rows) hands over `Value`s. The texts of all records lie back to
//! back in one buffer of the `Records`, so appending one allocates nothing once the
//! buffer has grown to a step's size; the reader clears it after each step.
//!
//! A *step* is what one [`Source::queue`] call hands to the current transaction. Each
//! step says how to get back to it ([`Resume`]):
//!
//! - `Barrier`: nowhere; the runtime cannot checkpoint right after this step.
//! - `Seek { position }`: `position` restarts the source just after the step
//!   (at-least-once).
//! - `Replay { position, data, hash }`: as `Seek`, and the step itself can be re-read
//!   exactly: `position` (or `data`, for sources that cannot re-read their input)
//!   carries everything needed, and `hash` is the [`StepHasher`] hash of the step's raw
//!   records, checked on replay (exactly-once).
//!
//! Invariants every source keeps:
//! - After `seek(p)` with `p` the position of a step's `Resume`, the next `queue`
//!   returns exactly the records that followed that step.
//! - `replay(r)` returns the same records as the step that produced `r`, leaves the
//!   source positioned just after that step, and fails with
//!   [`SourceError::ReplayMismatch`] rather than return anything else.
//! - `queue` returns quickly: with zero records and `end_of_input == false` when there
//!   is nothing new yet (a followed file, a rate-limited generator ahead of schedule).
//! - Bad input the source itself finds (a CSV row that does not split, a record above
//!   the size limit) is reported in [`Step::errors`] and its record is not emitted. JSON
//!   text is not checked by the source: text that does not parse fails where it is
//!   parsed, in the combiner, and the reader reports it at the record's position as
//!   [`bad_json`] words it. Either way the runtime decides (`on_error`) whether that
//!   fails the transaction.
//!
//! The built-in sources ([`file`](mod@file), [`datagen`]) are exactly-once. Their
//! positions are [`Span`]s: the step's `begin` and `end` cursors; `seek` restores
//! `end`, `replay` re-reads `begin..end`.

pub mod datagen;
pub mod file;

use crate::config::{SourceDef, SourceKind};
use highway::{HighwayHash, HighwayHasher, Key};
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use serde_json::Value;
use std::fmt;
use std::ops::Range;
use std::sync::Arc;

/// What a source can promise after a crash, weakest first (so `<` compares strength).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultTolerance {
    /// Cannot resume: input read before a crash is lost or read again.
    None,
    /// Resumes after the last committed step; a step may be read again differently.
    AtLeastOnce,
    /// Every step can be replayed exactly, verified by its hash.
    ExactlyOnce,
}

/// Where a record came from, for error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    /// The file path, or a source-specific name (e.g. `datagen views`). Shared: every
    /// record carries one, so a clone must not allocate.
    pub source: Arc<str>,
    /// 1-based line (file) or sequence number (datagen).
    pub line: u64,
    pub byte_offset: u64,
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{} (byte {})",
            self.source, self.line, self.byte_offset
        )
    }
}

/// The records of a step, in order, each a document and where it came from (see the
/// module docs).
#[derive(Debug, Default)]
pub struct Records {
    /// The text of every JSON record, back to back.
    text: Vec<u8>,
    records: Vec<Stored>,
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
    }

    /// Removes every record, keeping the buffers' capacity.
    pub fn clear(&mut self) {
        self.text.clear();
        self.records.clear();
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

/// Why a record's JSON `text` did not parse (`error`), as a bad-input error says it.
pub fn bad_json(text: &[u8], error: &serde_json::Error) -> String {
    match std::str::from_utf8(text) {
        Err(u) => format!("invalid UTF-8 at byte {} of the line", u.valid_up_to()),
        Ok(_) => format!("invalid JSON: {error}"),
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

/// How to get back to a step after a restart (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Resume {
    Barrier,
    Seek {
        position: Value,
    },
    Replay {
        position: Value,
        /// The step's raw input, for sources that cannot re-read it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        data: Option<Vec<u8>>,
        hash: u64,
    },
}

impl Resume {
    /// The position that restarts the source just after this step, if any.
    pub fn position(&self) -> Option<&Value> {
        match self {
            Resume::Barrier => None,
            Resume::Seek { position } | Resume::Replay { position, .. } => Some(position),
        }
    }

    /// The step hash of a `Replay` resume; 0 for the others, which are never replayed.
    pub fn hash(&self) -> u64 {
        match self {
            Resume::Replay { hash, .. } => *hash,
            Resume::Barrier | Resume::Seek { .. } => 0,
        }
    }

    /// The strongest guarantee a step with this resume supports.
    pub fn fault_tolerance(&self) -> FaultTolerance {
        match self {
            Resume::Barrier | Resume::Seek { .. } => FaultTolerance::AtLeastOnce,
            Resume::Replay { .. } => FaultTolerance::ExactlyOnce,
        }
    }
}

/// The result of one `queue` or `replay`.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Records appended to `out` by this step.
    pub records: usize,
    /// Raw bytes consumed, including bad records.
    pub bytes: u64,
    pub errors: Vec<InputError>,
    /// The source has no more input, now or later.
    pub end_of_input: bool,
    pub resume: Resume,
}

/// Bounds on one `queue` call. A step stops at the first bound reached; a single
/// record larger than `max_bytes` still makes a step of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    pub max_records: usize,
    pub max_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The external system (e.g. the file system) failed; retrying may help.
    #[error("source {name}: cannot read {path}: {error}")]
    Io {
        name: String,
        path: String,
        #[source]
        error: std::io::Error,
    },
    /// The input changed since the step was first read: exactly-once cannot hold.
    #[error(
        "source {name}: replayed step {position} differs from the one first read \
         (hash {actual:016x}, journaled {expected:016x}): the input changed since \
         it was read; restore it, or reset the pipeline's recovery log and store"
    )]
    ReplayMismatch {
        name: String,
        position: Value,
        expected: u64,
        actual: u64,
    },
    /// A resume the runtime handed over is not one this source produced.
    #[error("source {name}: cannot {action} {resume}: {reason}")]
    BadResume {
        name: String,
        action: &'static str,
        resume: Value,
        reason: String,
    },
    /// The source's definition cannot work (user error).
    #[error("source {name}: {reason}")]
    Config { name: String, reason: String },
}

/// A reader driven by the runtime's commands (see the module docs).
#[async_trait::async_trait]
pub trait Source: Send {
    fn name(&self) -> &str;
    fn fault_tolerance(&self) -> FaultTolerance;
    /// Restores a committed position: the `position` of a step's [`Resume`].
    async fn seek(&mut self, position: &Value) -> Result<(), SourceError>;
    /// Re-reads exactly the step `step` describes and leaves the source after it.
    async fn replay(&mut self, step: &Resume, out: &mut Records) -> Result<Step, SourceError>;
    /// Reads the next step, within `limits`. A step that fills its limits says more input
    /// is ready at once (a backlog), and the runtime then fills the transaction to its
    /// bounds; a source returns less only when it has caught up, else transactions stay
    /// small while it is behind.
    async fn queue(&mut self, limits: QueueLimits, out: &mut Records) -> Result<Step, SourceError>;
    /// Start or continue reading ahead.
    fn extend(&mut self) {}
    /// Stop reading ahead.
    fn pause(&mut self) {}
    /// Release resources; no command follows.
    async fn disconnect(&mut self) {}
}

/// Opens the source `name` as defined in the pipeline file, at the start of its input.
pub fn open_source(name: &str, def: &SourceDef) -> Result<Box<dyn Source>, SourceError> {
    Ok(match def.kind() {
        SourceKind::File(file) => Box::new(file::FileSource::new(name, file)),
        SourceKind::Datagen(def) => Box::new(datagen::DatagenSource::new(name, def)?),
    })
}

/// The position of a step of a built-in source: the cursors before and after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Span<C> {
    pub begin: C,
    pub end: C,
}

impl<C: Serialize + DeserializeOwned> Span<C> {
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("a span serializes")
    }

    /// Reads a span back from a resume position this source kind produced.
    pub fn from_value(
        name: &str,
        action: &'static str,
        value: &Value,
    ) -> Result<Self, SourceError> {
        serde_json::from_value(value.clone()).map_err(|e| SourceError::BadResume {
            name: name.to_string(),
            action,
            resume: value.clone(),
            reason: e.to_string(),
        })
    }

    /// The `Replay` resume of a built-in (re-readable) source's step.
    pub fn replay(&self, hash: u64) -> Resume {
        Resume::Replay {
            position: self.to_value(),
            data: None,
            hash,
        }
    }
}

/// The span a built-in source re-reads to replay `step`.
pub(crate) fn replay_target<C: Serialize + DeserializeOwned>(
    name: &str,
    step: &Resume,
) -> Result<Span<C>, SourceError> {
    match step {
        Resume::Replay {
            position,
            data: None,
            ..
        } => Span::from_value(name, "replay", position),
        other => Err(SourceError::BadResume {
            name: name.to_string(),
            action: "replay",
            resume: serde_json::to_value(other).expect("a resume serializes"),
            reason: "this source only replays by position".to_string(),
        }),
    }
}

/// Fails with [`SourceError::ReplayMismatch`] unless a replayed step hashes as journaled.
pub(crate) fn check_replay(name: &str, step: &Resume, actual: u64) -> Result<(), SourceError> {
    match step {
        Resume::Replay { position, hash, .. } if *hash != actual => {
            Err(SourceError::ReplayMismatch {
                name: name.to_string(),
                position: position.clone(),
                expected: *hash,
                actual,
            })
        }
        _ => Ok(()),
    }
}

/// The stable 64-bit hash of a step's raw records: HighwayHash-64 with a fixed key, so
/// it is the same across processes, platforms and releases (unlike `DefaultHasher`).
#[derive(Clone)]
pub struct StepHasher(HighwayHasher);

impl StepHasher {
    /// "sluice step hash" spelled in ASCII over four words; any fixed key would do.
    const KEY: [u64; 4] = [
        0x736c_7569_6365_2073,
        0x7465_7020_6861_7368,
        0x0000_0000_0000_0001,
        0x0000_0000_0000_0002,
    ];

    pub fn new() -> StepHasher {
        StepHasher(HighwayHasher::new(Key(Self::KEY)))
    }

    pub fn append(&mut self, bytes: &[u8]) {
        self.0.append(bytes);
    }

    pub fn finish(self) -> u64 {
        self.0.finalize64()
    }
}

impl Default for StepHasher {
    fn default() -> Self {
        StepHasher::new()
    }
}
