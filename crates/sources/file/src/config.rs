//! What the user writes: `file: {path: data/views.jsonl, format: json}`, with
//! `follow` and `max_document_size` optional. Strict: unknown keys are errors.

use serde::Deserialize;
use sluice_source_sdk::config::de_bytes;
use std::path::PathBuf;

/// JSON schema of [`FileConfig`] (what `sluice schema file` prints).
pub const SCHEMA: &str = r#"{
  "$schema": "http://json-schema.org/draft-07/schema#",
  "title": "File",
  "type": "object",
  "required": ["path", "format"],
  "additionalProperties": false,
  "properties": {
    "path": {"type": "string", "minLength": 1, "description": "The file read; relative to the pipeline file's folder."},
    "format": {"type": "string", "enum": ["json", "csv"], "description": "json: one JSON document a line; csv: RFC 4180 with a header row naming the properties."},
    "follow": {"type": "boolean", "default": false, "description": "Keep tailing the file as it grows (sluice run --follow tails every file); the source then never ends."},
    "max_document_size": {"type": ["integer", "string"], "default": "16MiB", "description": "The largest record read as a document, in bytes or as a size (16MiB); a larger one is bad input, streamed past without being held."}
  }
}"#;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Relative to the pipeline file's folder.
    pub path: PathBuf,
    pub format: FileFormat,
    /// Keep tailing the file as it grows; the source never ends.
    #[serde(default)]
    pub follow: bool,
    /// The largest record (line, or CSV row) read as a document. A larger one is bad
    /// input (it fails the transaction, or is skipped with `on_error: skip`) and is
    /// streamed past without being held in memory. An integer or `"16MiB"`.
    #[serde(default = "default_max_document_size", deserialize_with = "de_bytes")]
    pub max_document_size: u64,
}

/// 16 MiB per document: far above any reasonable keyed change document, and small
/// enough that the one being parsed (its text and its parsed document, several times
/// the text) stays well inside the default memory budget.
pub const DEFAULT_MAX_DOCUMENT_SIZE: u64 = 16 << 20;

fn default_max_document_size() -> u64 {
    DEFAULT_MAX_DOCUMENT_SIZE
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileFormat {
    /// One JSON document per line.
    Json,
    /// RFC 4180 CSV with a header row naming the properties.
    Csv,
}
