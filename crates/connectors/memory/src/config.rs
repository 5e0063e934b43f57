//! What the user writes: the endpoint configuration `{ "path"?: string }` and a
//! binding's resource `{ "table": string, "delta_updates"?: bool }`, with the JSON
//! schemas Spec returns. Both refuse unknown fields, so a misspelled setting is an
//! error naming it rather than silently ignored.

use schemars::JsonSchema;
use serde::Deserialize;
use sluice_config::schema_for;
use sluice_driver_sdk::{Error, Result, flow};
use std::path::PathBuf;
use std::sync::LazyLock;

/// JSON schema of [`EndpointConfig`], derived once.
pub static ENDPOINT_SCHEMA: LazyLock<String> =
    LazyLock::new(|| schema_for::<EndpointConfig>().to_string());

/// JSON schema of [`ResourceConfig`], derived once.
pub static RESOURCE_SCHEMA: LazyLock<String> =
    LazyLock::new(|| schema_for::<ResourceConfig>().to_string());

/// Tables in memory, or in one JSON file.
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Memory endpoint")]
pub struct EndpointConfig {
    /// File holding the whole state; shared by processes. Omit to keep the state in
    /// memory.
    #[serde(default)]
    #[schemars(with = "PathBuf")]
    pub path: Option<PathBuf>,
}

/// A binding's table.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Memory table")]
pub struct ResourceConfig {
    /// The table's name.
    pub table: String,
    /// Append every stored document as a new row instead of keeping one row per key.
    #[serde(default)]
    pub delta_updates: bool,
}

/// Parses `json` (empty: `{}`) as the `what` of the memory driver.
pub fn parse<'a, T: Deserialize<'a>>(what: &str, json: &'a str) -> Result<T> {
    let json = if json.trim().is_empty() { "{}" } else { json };
    serde_json::from_str(json)
        .map_err(|e| Error::Config(format!("{what} of the memory driver: {e} (in {json})")))
}

/// The tables of a materialization's bindings, in binding order.
pub fn binding_tables(spec: &flow::MaterializationSpec) -> Result<Vec<(String, bool)>> {
    spec.bindings
        .iter()
        .map(|b| {
            let resource: ResourceConfig = parse("resource config", &b.resource_spec_json)?;
            Ok((resource.table, b.delta_updates))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use sluice_testkit::schema::assert_schema_judges;

    #[test]
    fn the_schemas_take_the_examples_and_refuse_an_unknown_key() {
        let endpoint: Value = serde_json::from_str(&ENDPOINT_SCHEMA).unwrap();
        assert_schema_judges(
            &endpoint,
            &[json!({}), json!({"path": "state.json"})],
            &[json!({"pth": "state.json"})],
        );
        let resource: Value = serde_json::from_str(&RESOURCE_SCHEMA).unwrap();
        assert_schema_judges(
            &resource,
            &[json!({"table": "views", "delta_updates": true})],
            &[json!({"table": "views", "schema": "s"}), json!({})],
        );
    }
}
