//! What the user writes: `file: {path: data/views.jsonl, format: json}`, with
//! `follow` and `max_document_size` optional. Strict: unknown keys are errors.

use schemars::JsonSchema;
use serde::Deserialize;
use sluice_source_sdk::config::{bytes_schema, de_bytes, ser_bytes};
use std::path::PathBuf;

/// A file of JSON lines, or CSV with a header row, read once or followed as it grows.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "File")]
pub struct FileConfig {
    /// The file read; relative to the pipeline file's folder.
    #[schemars(length(min = 1))]
    pub path: PathBuf,
    /// json: one JSON document a line; csv: RFC 4180 with a header row naming the
    /// properties.
    pub format: FileFormat,
    /// Keep tailing the file as it grows (sluice run --follow tails every file); the
    /// source then never ends.
    #[serde(default)]
    pub follow: bool,
    /// The largest record read as a document, in bytes or as a size (16MiB); a larger
    /// one is bad input, streamed past without being held.
    // A larger record fails the transaction, or is skipped with `on_error: skip`.
    #[serde(
        default = "default_max_document_size",
        deserialize_with = "de_bytes",
        serialize_with = "ser_bytes"
    )]
    #[schemars(schema_with = "bytes_schema")]
    pub max_document_size: u64,
}

/// 16 MiB per document: far above any reasonable keyed change document, and small
/// enough that the one being parsed (its text and its parsed document, several times
/// the text) stays well inside the default memory budget.
pub const DEFAULT_MAX_DOCUMENT_SIZE: u64 = 16 << 20;

fn default_max_document_size() -> u64 {
    DEFAULT_MAX_DOCUMENT_SIZE
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileFormat {
    /// One JSON document per line.
    Json,
    /// RFC 4180 CSV with a header row naming the properties.
    Csv,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use sluice_source_sdk::config::schema_for;
    use sluice_testkit::schema::assert_schema_judges;

    #[test]
    fn the_schema_takes_the_examples_and_refuses_an_unknown_key() {
        assert_schema_judges(
            &schema_for::<FileConfig>(),
            &[
                json!({"path": "data/views.jsonl", "format": "json"}),
                json!({"path": "v.csv", "format": "csv", "follow": true,
                       "max_document_size": "1MiB"}),
                json!({"path": "v.csv", "format": "csv", "max_document_size": 4096}),
            ],
            &[
                json!({"path": "v.jsonl", "format": "json", "folow": true}),
                json!({"path": "v.jsonl", "format": "yaml"}),
                json!({"format": "json"}),
            ],
        );
    }
}
