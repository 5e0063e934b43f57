//! What the user writes: `files: {directory}` and per binding `{path}`.

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;
use sluice_output_sdk::OutputError;
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

/// Parses `value` strictly, the error naming the place.
pub fn parse<T: DeserializeOwned>(value: &Value) -> Result<T, OutputError> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        OutputError::Config(if path == "." {
            e.inner().to_string()
        } else {
            format!("{path}: {}", e.inner())
        })
    })
}
