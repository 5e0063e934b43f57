//! What the user writes: `files: {directory}` and per binding `{path}`.

use serde::Deserialize;
pub use sluice_output_sdk::config::parse;
use std::path::PathBuf;

pub const ENDPOINT_SCHEMA: &str = r#"{
  "type": "object",
  "required": ["directory"],
  "additionalProperties": false,
  "properties": {
    "directory": {"type": "string", "description": "The folder bindings write under (relative to the pipeline file)"},
    "max_buffer_size_bytes": {"type": "integer", "minimum": 1, "default": 1048576,
      "description": "Bytes of encoded changes buffered before they are written"}
  }
}"#;

pub const RESOURCE_SCHEMA: &str = r#"{
  "type": "object",
  "required": ["path"],
  "additionalProperties": true,
  "properties": {
    "path": {"type": "string", "description": "The binding's folder, under the endpoint's directory"}
  }
}"#;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub directory: PathBuf,
    #[serde(default = "default_buffer")]
    pub max_buffer_size_bytes: usize,
}

fn default_buffer() -> usize {
    1 << 20
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resource {
    pub path: String,
}
