//! What the user writes: the endpoint (`{"path": "out/views.db"}`) and each binding's
//! resource (`{"table": "pageviews"}`), with the JSON schemas that Spec returns.
//!
//! Parsing is strict: unknown properties are errors, and every error names the field
//! that is wrong (`endpoint config: table: invalid type ...`), so a pipeline author can
//! find it in their file.

use serde::Deserialize;
use sluice_driver_sdk::{Error, Result};
use sluice_sqlkit::config::{TableResource, parse, table_resource_schema};
use std::path::PathBuf;

/// Where the documentation of this driver lives (returned by Spec).
pub const DOCUMENTATION_URL: &str =
    "https://github.com/sluice-rs/sluice/tree/main/crates/connectors/sqlite";

/// JSON schema of [`EndpointConfig`].
pub const ENDPOINT_SCHEMA: &str = r#"{
  "$schema": "http://json-schema.org/draft-07/schema#",
  "title": "SQLite endpoint",
  "type": "object",
  "required": ["path"],
  "additionalProperties": false,
  "properties": {
    "path": {
      "type": "string",
      "minLength": 1,
      "description": "Path of the database file; it and its parent directories are created if missing."
    }
  }
}"#;

/// JSON schema of [`ResourceConfig`].
pub fn resource_schema() -> String {
    table_resource_schema("SQLite table", None)
}

/// The endpoint: one SQLite database file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    pub path: PathBuf,
}

/// One binding's resource: a table (of any name length), parsed with
/// [`ResourceConfig::parse`]`(json, None)`.
pub type ResourceConfig = TableResource;

impl EndpointConfig {
    pub fn parse(json: &str) -> Result<Self> {
        let config: Self = parse("endpoint config", json)?;
        if config.path.as_os_str().is_empty() {
            return Err(Error::Config(
                "endpoint config: path: must not be empty (e.g. \"out/views.db\")".into(),
            ));
        }
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_parses_a_path() {
        let config = EndpointConfig::parse(r#"{"path": "out/views.db"}"#).unwrap();
        assert_eq!(config.path, PathBuf::from("out/views.db"));
    }

    #[test]
    fn missing_and_unknown_fields_are_named() {
        let err = EndpointConfig::parse(r#"{}"#).unwrap_err();
        assert!(err.to_string().contains("missing field `path`"), "{err}");
        let err = EndpointConfig::parse(r#"{"path": "a", "pth": "b"}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `pth`"), "{err}");
    }

    #[test]
    fn table_names_of_any_length_are_accepted() {
        let long = "x".repeat(1000);
        let json = format!(r#"{{"table": "{long}"}}"#);
        assert_eq!(ResourceConfig::parse(&json, None).unwrap().table, long);
    }

    #[test]
    fn the_endpoint_schema_is_json() {
        serde_json::from_str::<serde_json::Value>(ENDPOINT_SCHEMA).unwrap();
    }
}
