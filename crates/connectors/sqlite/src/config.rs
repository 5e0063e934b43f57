//! What the user writes: the endpoint (`{"path": "out/views.db"}`) and each binding's
//! resource (`{"table": "pageviews"}`), with the JSON schemas that Spec returns.
//!
//! Parsing is strict: unknown properties are errors, and every error names the field
//! that is wrong (`endpoint config: table: invalid type ...`), so a pipeline author can
//! find it in their file.

use serde::Deserialize;
use sluice_driver::config::parse;
use sluice_driver::{Error, Result};
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
pub const RESOURCE_SCHEMA: &str = r#"{
  "$schema": "http://json-schema.org/draft-07/schema#",
  "title": "SQLite table",
  "type": "object",
  "required": ["table"],
  "additionalProperties": false,
  "properties": {
    "table": {
      "type": "string",
      "minLength": 1,
      "description": "Name of the table to materialize into (any name: it is always quoted)."
    },
    "delta_updates": {
      "type": "boolean",
      "default": false,
      "description": "Append every stored document as a new row instead of keeping one row per key."
    }
  }
}"#;

/// The endpoint: one SQLite database file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    pub path: PathBuf,
}

/// One binding's resource: a table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceConfig {
    pub table: String,
    #[serde(default)]
    pub delta_updates: bool,
}

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

impl ResourceConfig {
    pub fn parse(json: &str) -> Result<Self> {
        let config: Self = parse("resource config", json)?;
        if config.table.is_empty() {
            return Err(Error::Config(
                "resource config: table: must not be empty (e.g. \"pageviews\")".into(),
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
    fn wrong_type_names_the_field() {
        let err = ResourceConfig::parse(r#"{"table": 5}"#).unwrap_err();
        assert!(
            err.to_string()
                .contains("resource config: table: invalid type"),
            "{err}"
        );
    }

    #[test]
    fn missing_and_unknown_fields_are_named() {
        let err = EndpointConfig::parse(r#"{}"#).unwrap_err();
        assert!(err.to_string().contains("missing field `path`"), "{err}");
        let err = ResourceConfig::parse(r#"{"table": "t", "tabel": "u"}"#).unwrap_err();
        assert!(err.to_string().contains("unknown field `tabel`"), "{err}");
    }

    #[test]
    fn empty_table_is_refused() {
        let err = ResourceConfig::parse(r#"{"table": ""}"#).unwrap_err();
        assert!(
            err.to_string().contains("table: must not be empty"),
            "{err}"
        );
    }

    #[test]
    fn schemas_are_json() {
        for schema in [ENDPOINT_SCHEMA, RESOURCE_SCHEMA] {
            serde_json::from_str::<serde_json::Value>(schema).unwrap();
        }
    }
}
