//! `sluice schema`: the JSON schema of a connector's configuration, derived from the
//! type the pipeline file is parsed with (a source kind's configuration, an endpoint's
//! Spec), as JSON or as the reference tables the connector pages of `docs/` include.
//!
//! A name may be both a source and an endpoint (`kafka`, `nats`): both are printed.

use anyhow::{Context, bail};
use clap::Args;
use serde_json::{Map, Value};
use sluice_app::registry;
use sluice_runtime::registry::Registry;
use std::fmt::Write as _;

#[derive(Args)]
pub struct SchemaArgs {
    /// The connector: a source kind (`file`, `kafka`, …) or an endpoint kind (`sqlite`,
    /// `postgres`, …). Without one, lists them.
    pub connector: Option<String>,
    /// Print the reference tables of `docs/connectors/` instead of JSON.
    #[arg(long)]
    pub markdown: bool,
}

pub fn main(args: SchemaArgs) -> anyhow::Result<()> {
    let registry = registry();
    let Some(name) = args.connector else {
        println!("sources:   {}", registry.source_names().join(", "));
        println!("endpoints: {}", registry.driver_names().join(", "));
        return Ok(());
    };
    let schemas = schemas(&registry, &name)?;
    if args.markdown {
        print!("{}", markdown(&name, &schemas));
    } else {
        println!("{}", serde_json::to_string_pretty(&schemas)?);
    }
    Ok(())
}

/// `{"source"?: schema, "endpoint"?: schema, "resource"?: schema}` of the connector
/// `name`; an unknown name is an error listing the known ones.
pub fn schemas(registry: &Registry, name: &str) -> anyhow::Result<Map<String, Value>> {
    let mut schemas = Map::new();
    if let Some(kind) = registry.source(name) {
        schemas.insert("source".into(), kind.schema());
    }
    if let Some(kind) = registry.driver(name) {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .context("starting a runtime")?;
        let endpoint = runtime
            .block_on(kind.schemas())
            .map_err(anyhow::Error::msg)?;
        schemas.insert("endpoint".into(), endpoint.endpoint);
        schemas.insert("resource".into(), endpoint.resource);
    }
    if schemas.is_empty() {
        bail!(
            "no connector is named `{name}`: the sources are {} and the endpoints {}",
            registry.source_names().join(", "),
            registry.driver_names().join(", ")
        );
    }
    Ok(schemas)
}

/// The reference tables of `schemas`: one per part, each key with its type, default,
/// and description.
pub fn markdown(name: &str, schemas: &Map<String, Value>) -> String {
    let parts = [
        ("source", format!("sources.<name>.{name}")),
        (
            "endpoint",
            format!("materializations.<name>.endpoint.{name}"),
        ),
        (
            "resource",
            "materializations.<name>.bindings[].resource".into(),
        ),
    ];
    let mut out = String::new();
    for (part, place) in parts {
        if let Some(schema) = schemas.get(part) {
            if !out.is_empty() {
                out.push('\n');
            }
            let _ = writeln!(out, "**`{place}`**\n");
            out.push_str(&table(schema));
        }
    }
    out
}

fn table(schema: &Value) -> String {
    let mut out = String::new();
    if let Some(description) = schema.get("description").and_then(Value::as_str) {
        let _ = writeln!(out, "{}\n", cell(description));
    }
    let empty = Map::new();
    let properties = schema
        .get("properties")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    if properties.is_empty() {
        return out;
    }
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|keys| keys.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    out.push_str("| key | type | default | description |\n|---|---|---|---|\n");
    for (key, property) in properties {
        let key = if required.contains(&key.as_str()) {
            format!("`{key}` (required)")
        } else {
            format!("`{key}`")
        };
        let default = property
            .get("default")
            .map(|value| format!("`{value}`"))
            .unwrap_or_default();
        let description = property
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "| {key} | {} | {} | {} |",
            cell(&type_of(property)),
            cell(&default),
            cell(description)
        );
    }
    out
}

/// A property's type in words: `string`, `` `json` \| `csv` ``, `array of string`,
/// `integer or string`.
fn type_of(property: &Value) -> String {
    if let Some(value) = property.get("const") {
        return format!("`{value}`");
    }
    if let Some(values) = property.get("enum").and_then(Value::as_array) {
        let values: Vec<String> = values
            .iter()
            .map(|value| match value {
                Value::String(text) => format!("`{text}`"),
                other => format!("`{other}`"),
            })
            .collect();
        return values.join(" \\| ");
    }
    if let Some(alternatives) = property.get("oneOf").and_then(Value::as_array) {
        let alternatives: Vec<String> = alternatives.iter().map(type_of).collect();
        return alternatives.join(" or ");
    }
    let named = |kind: &str| match kind {
        "array" => match property.get("items") {
            Some(items) => format!("array of {}", type_of(items)),
            None => "array".into(),
        },
        "object" => match property.get("additionalProperties") {
            Some(values @ Value::Object(_)) => format!("object of {}", type_of(values)),
            _ => "object".into(),
        },
        other => other.into(),
    };
    match property.get("type") {
        Some(Value::String(kind)) => named(kind),
        Some(Value::Array(kinds)) => kinds
            .iter()
            .filter_map(Value::as_str)
            .map(named)
            .collect::<Vec<_>>()
            .join(" or "),
        _ => "any".into(),
    }
}

/// Text fit for a table cell: on one line, its pipes escaped (once), and `<` and `>`
/// as entities (`<token>` is no HTML tag).
fn cell(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut previous = ' ';
    for c in text.chars() {
        match c {
            '\n' => out.push(' '),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '|' if previous != '\\' => out.push_str("\\|"),
            c => out.push(c),
        }
        previous = c;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// An example of the schemas' shape.
    fn example() -> Map<String, Value> {
        let schema = json!({
            "description": "A thing.",
            "required": ["path"],
            "properties": {
                "path": {"type": "string", "description": "Where | it is, <here>."},
                "format": {"enum": ["json", "csv"], "default": "json"},
                "size": {"type": ["integer", "string"], "default": "16MiB"},
                "brokers": {"type": "array", "items": {"type": "string"}},
                "start": {"oneOf": [{"enum": ["first"]}, {"type": "integer"}]},
                "delta": {"const": false},
            }
        });
        let mut schemas = Map::new();
        schemas.insert("source".into(), schema);
        schemas
    }

    #[test]
    fn every_key_is_a_row_with_its_type_default_and_description() {
        let text = markdown("thing", &example());
        assert_eq!(
            text,
            "**`sources.<name>.thing`**\n\nA thing.\n\n\
             | key | type | default | description |\n|---|---|---|---|\n\
             | `brokers` | array of string |  |  |\n\
             | `delta` | `false` |  |  |\n\
             | `format` | `json` \\| `csv` | `\"json\"` |  |\n\
             | `path` (required) | string |  | Where \\| it is, &lt;here&gt;. |\n\
             | `size` | integer or string | `\"16MiB\"` |  |\n\
             | `start` | `first` or integer |  |  |\n"
        );
    }

    #[test]
    fn a_name_both_source_and_endpoint_has_both_and_an_unknown_one_lists_the_names() {
        let registry = registry();
        let kafka = schemas(&registry, "kafka").unwrap();
        let parts: Vec<&str> = kafka.keys().map(String::as_str).collect();
        assert_eq!(parts, ["endpoint", "resource", "source"]);
        let e = schemas(&registry, "kafak").unwrap_err().to_string();
        assert!(
            e.starts_with("no connector is named `kafak`: the sources are "),
            "{e}"
        );
        assert!(e.contains("postgres_cdc") && e.contains("sqlite"), "{e}");
    }

    /// Every key a connector's configuration accepts is in its schema, and every key of
    /// the schema is accepted: serde's error for an unknown key lists the keys it takes.
    #[test]
    fn each_schema_names_exactly_the_keys_its_configuration_takes() {
        let registry = registry();
        let base = std::path::Path::new("/");
        let probe = || json!({"sluice_probe": 1});
        let mut checked = 0;
        for name in registry.source_names() {
            let kind = registry.source(name).unwrap();
            let error = kind.parse(probe(), base).unwrap_err().to_string();
            let schema = &schemas(&registry, name).unwrap()["source"];
            assert_eq!(keys_of(schema), accepted(&error), "source {name}: {error}");
            checked += 1;
        }
        for name in registry.driver_names() {
            let kind = registry.driver(name).unwrap();
            let error = kind.parse(probe(), base).unwrap_err().to_string();
            let schema = &schemas(&registry, name).unwrap()["endpoint"];
            assert_eq!(
                keys_of(schema),
                accepted(&error),
                "endpoint {name}: {error}"
            );
            checked += 1;
        }
        assert!(checked >= 15, "{checked} connectors");
    }

    fn keys_of(schema: &Value) -> Vec<String> {
        let mut keys: Vec<String> = schema["properties"]
            .as_object()
            .map(|properties| properties.keys().cloned().collect())
            .unwrap_or_default();
        keys.sort();
        keys
    }

    /// The keys serde's "unknown field `x`, expected one of `a`, `b`" lists.
    fn accepted(error: &str) -> Vec<String> {
        let list = error
            .split_once("expected one of ")
            .or_else(|| error.split_once("expected "))
            .map(|(_, list)| list)
            .unwrap_or_else(|| panic!("no list of keys in {error:?}"));
        // "`a`, `b`" or "`a` or `b`": every other backtick-quoted word.
        let mut keys: Vec<String> = list
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_owned)
            .collect();
        keys.sort();
        keys
    }
}
