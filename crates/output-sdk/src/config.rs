//! Strict parsing of what the user writes for an output kind: unknown keys are errors,
//! and every error names its place (`topic: invalid type: …`).

use crate::OutputError;
use serde::de::DeserializeOwned;
use serde_json::Value;

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
