//! `sources:`: what the runtime reads of each source (its target collection, what to do
//! with bad input, its read-ahead, its envelope); the rest is its kind's (`kinds.rs`).

use crate::envelope::Envelope;
use serde::Deserialize;
use serde_json::{Map, Value};
use sluice_source_sdk::SourceConfig;
use sluice_source_sdk::config::de_bytes;
use std::path::{Path, PathBuf};

/// A source writes into one collection; what it reads is up to its kind.
#[derive(Debug, Clone)]
pub struct SourceDef {
    pub target: String,
    pub on_error: OnError,
    /// With `on_error: skip`: the JSON-lines file rejected documents are appended to;
    /// defaults to `<recovery_log>/<materialization>/dead-letters.jsonl`.
    pub dead_letter: Option<PathBuf>,
    /// How much the source may read ahead before the runtime pauses it.
    pub read_ahead: ReadAhead,
    /// How its records wrap their documents (change events).
    pub envelope: Envelope,
    /// Why it cannot be read by several shards at once, or move between a cluster's
    /// members ([`sluice_source_sdk::SourceKind::PINNED`]).
    pub pinned: Option<&'static str>,
    /// Why it is read by one shard only, though it can move between a cluster's
    /// members ([`sluice_source_sdk::SourceKind::SINGLETON`]).
    pub singleton: Option<&'static str>,
    /// The source's kind (`file`, `datagen`) and its configuration, parsed by the kind.
    pub config: SourceConfig,
}

/// The runtime's backpressure on a source that reads ahead (a broker's): above either
/// bound of what it buffered, not yet queued, it is paused (`Source::pause`), and
/// extended again once its buffer is below both. Sources that read on demand (files,
/// datagen) buffer nothing and are never paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadAhead {
    pub max_queued_records: usize,
    pub max_queued_bytes: u64,
}

impl Default for ReadAhead {
    fn default() -> Self {
        ReadAhead {
            max_queued_records: default_max_queued_records(),
            max_queued_bytes: default_max_queued_bytes(),
        }
    }
}

/// Enough for several fetches of a broker ahead of the loop, so reading never waits
/// on the network while a transaction commits.
fn default_max_queued_records() -> usize {
    100_000
}

/// 16 MiB: a few of a broker's fetches, and small beside the combiners' budgets (the
/// README's memory bound counts it per source).
fn default_max_queued_bytes() -> u64 {
    16 << 20
}

/// A source as written: the runtime's keys, and the others (exactly one: its kind).
#[derive(Deserialize)]
pub(super) struct SourceFile {
    /// Checked after the kinds, so that a misspelt `target` is named as the unknown key
    /// it is, not reported as a missing `target`.
    #[serde(default)]
    pub(super) target: Option<String>,
    #[serde(default)]
    pub(super) on_error: OnError,
    #[serde(default)]
    pub(super) dead_letter: Option<PathBuf>,
    #[serde(default = "default_max_queued_records")]
    pub(super) max_queued_records: usize,
    #[serde(default = "default_max_queued_bytes", deserialize_with = "de_bytes")]
    pub(super) max_queued_bytes: u64,
    #[serde(default)]
    pub(super) envelope: Envelope,
    #[serde(flatten)]
    pub(super) kinds: Map<String, Value>,
}

impl SourceDef {
    /// Where a materialization whose recovery log is `log_dir` writes this source's
    /// rejected documents; `None` unless `on_error: skip`.
    pub fn dead_letter_path(&self, log_dir: &Path) -> Option<PathBuf> {
        match self.on_error {
            OnError::Fail => None,
            OnError::Skip => Some(
                self.dead_letter
                    .clone()
                    .unwrap_or_else(|| log_dir.join(DEAD_LETTER_FILE)),
            ),
        }
    }
}

/// The file name of a materialization's default dead-letter file, in its recovery log.
pub const DEAD_LETTER_FILE: &str = "dead-letters.jsonl";

/// The keys of a source besides its kind ([`SourceFile`]), for naming a misspelt one.
pub(super) const SOURCE_FIELDS: &[&str] = &[
    "target",
    "on_error",
    "dead_letter",
    "max_queued_records",
    "max_queued_bytes",
    "envelope",
];

/// What to do with a document of this source that is bad input: unparseable (malformed
/// JSON or CSV, invalid UTF-8, above `max_document_size`), invalid against the schema,
/// without its key, or failing to reduce with the documents of its transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Stop the pipeline; the transaction that saw it does not commit.
    #[default]
    Fail,
    /// Append it, with its reason and position, to the dead-letter file (durably,
    /// before its transaction commits) and go on without it. A reduction that fails
    /// only against the stored document or across spilled runs still stops the
    /// pipeline: no single document can be blamed for it.
    Skip,
}
