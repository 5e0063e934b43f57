//! What the user writes: the endpoint (`{"path": "out/views.db"}`) and each binding's
//! resource (`{"table": "pageviews"}`), with the JSON schemas that Spec returns.
//!
//! Parsing is strict: unknown properties are errors, and every error names the field
//! that is wrong (`endpoint config: table: invalid type ...`), so a pipeline author can
//! find it in their file.

use schemars::JsonSchema;
use serde::Deserialize;
use sluice_config::schema_for;
use sluice_driver_sdk::{Error, Result};
use sluice_sqlkit::config::{TableResource, parse, table_resource_schema};
use std::path::PathBuf;
use std::sync::LazyLock;

/// Where the documentation of this driver lives (returned by Spec).
pub const DOCUMENTATION_URL: &str =
    "https://github.com/sluice-rs/sluice/tree/main/crates/connectors/sqlite";

/// JSON schema of [`EndpointConfig`], derived once.
pub static ENDPOINT_SCHEMA: LazyLock<String> =
    LazyLock::new(|| schema_for::<EndpointConfig>().to_string());

/// JSON schema of [`ResourceConfig`].
pub fn resource_schema() -> String {
    table_resource_schema("SQLite table", None)
}

/// One SQLite database file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "SQLite endpoint")]
pub struct EndpointConfig {
    /// Path of the database file; it and its parent directories are created if
    /// missing.
    #[schemars(length(min = 1))]
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
    use serde_json::{Value, json};
    use sluice_testkit::schema::assert_schema_judges;

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
    fn the_schemas_take_the_examples_and_refuse_an_unknown_key() {
        let endpoint: Value = serde_json::from_str(&ENDPOINT_SCHEMA).unwrap();
        assert_schema_judges(
            &endpoint,
            &[json!({"path": "out/views.db"})],
            &[
                json!({"path": "a", "pth": "b"}),
                json!({"path": ""}),
                json!({}),
            ],
        );
        let resource: Value = serde_json::from_str(&resource_schema()).unwrap();
        assert_eq!(resource["title"], "SQLite table");
        assert_schema_judges(
            &resource,
            &[json!({"table": "pageviews", "delta_updates": true})],
            &[json!({"table": "pageviews", "schema": "s"})],
        );
    }
}
