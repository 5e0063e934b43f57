//! What the user writes: the endpoint configuration `{ "path"?: string }` and a
//! binding's resource `{ "table": string, "delta_updates"?: bool }`, with the JSON
//! schemas Spec returns. Both refuse unknown fields, so a misspelled setting is an
//! error naming it rather than silently ignored.

use serde::Deserialize;
use sluice_driver_sdk::{Error, Result, flow};
use std::path::PathBuf;

pub const ENDPOINT_SCHEMA: &str = r#"{"type":"object","properties":{"path":{"type":"string","description":"File holding the whole state; shared by processes. Omit to keep the state in memory."}},"additionalProperties":false}"#;
pub const RESOURCE_SCHEMA: &str = r#"{"type":"object","properties":{"table":{"type":"string"},"delta_updates":{"type":"boolean"}},"required":["table"],"additionalProperties":false}"#;

/// The endpoint configuration: `{ "path"?: string }`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndpointConfig {
    pub path: Option<PathBuf>,
}

/// The resource configuration of a binding: `{ "table": string, "delta_updates"?: bool }`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceConfig {
    pub table: String,
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
