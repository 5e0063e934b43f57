//! `sluice discover <airbyte|singer> --config FILE` (or `--connector NAME`): runs the connector's discover and
//! prints a pipeline that runs as printed: a collection per stream with the JSON schema
//! the connector reports (its key properties made required, as a collection's key must
//! be), a source per stream, and a materialization binding each into SQLite (default)
//! or PostgreSQL (`--postgres URL`).
//!
//! An Airbyte connector's inline configuration gets the defaults its spec declares
//! for the keys it leaves out (faker needs its `count`), and the printed source holds
//! them.
//!
//! FILE holds what the pipeline file would hold under the kind's key (YAML or JSON):
//! `{connector: faker, config: {seed: 1}}`; its `streams`, if any, choose the streams
//! printed, else every stream with a key is. A stream without one is left out, named
//! in a comment: give it a `key` under `streams` and discover again.

use anyhow::{Context, bail};
use clap::Args;
use serde_json::{Map, Value, json};
use sluice_airbyte_source::config::{ConnectorConfig, Settings};
use sluice_airbyte_source::protocol::key_of;
use sluice_airbyte_source::{Airbyte, Singer, Stream, discover};
use std::path::{Path, PathBuf};

#[derive(Args)]
pub struct DiscoverArgs {
    /// The protocol: `airbyte` (a source connector) or `singer` (a tap).
    pub kind: String,
    /// The source's configuration as written under the kind's key in a pipeline file
    /// (YAML or JSON): `{connector: faker, config: {seed: 1}}`.
    #[arg(
        long,
        required_unless_present = "connector",
        conflicts_with = "connector"
    )]
    pub config: Option<PathBuf>,
    /// Instead of `--config`: the connector's name alone (`faker`: `source-faker` or
    /// `tap-faker` on PATH), with an empty configuration of its own.
    #[arg(long)]
    pub connector: Option<String>,
    /// Materialize into this PostgreSQL server instead of a SQLite file
    /// (`postgres://postgres@127.0.0.1:5432/test`).
    #[arg(long)]
    pub postgres: Option<String>,
    /// The SQLite file written (relative to where the pipeline file is run from).
    #[arg(long, default_value = "out/discovered.db")]
    pub sqlite: String,
}

pub fn main(args: DiscoverArgs) -> anyhow::Result<()> {
    let (value, place, base) = match (&args.config, &args.connector) {
        (Some(path), _) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            let value: Value = serde_yaml_ng::from_str(&text)
                .with_context(|| format!("{} is not YAML or JSON", path.display()))?;
            let base = path.parent().unwrap_or(Path::new(".")).to_path_buf();
            (value, path.display().to_string(), base)
        }
        (None, name) => (
            json!({ "connector": name }),
            "--connector".into(),
            PathBuf::from("."),
        ),
    };
    let mut config: ConnectorConfig =
        sluice_source_sdk::config::parse(value).map_err(|e| anyhow::anyhow!("{place}: {e}"))?;
    config
        .prepare(&base, &args.kind, false)
        .map_err(|e| anyhow::anyhow!("{place}: {e}"))?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting a runtime")?;
    let name = format!("discover-{}", args.kind);
    let (config, streams) = match args.kind.as_str() {
        "airbyte" => runtime.block_on(discover::<Airbyte>(&name, &config))?,
        "singer" => runtime.block_on(discover::<Singer>(&name, &config))?,
        other => bail!("`sluice discover` knows airbyte and singer, not {other:?}"),
    };
    print!("{}", pipeline(&args, &place, &config, &streams)?);
    Ok(())
}

/// The pipeline file printed (see the module docs).
fn pipeline(
    args: &DiscoverArgs,
    place: &str,
    config: &ConnectorConfig,
    offered: &[Stream],
) -> anyhow::Result<String> {
    let chosen: Vec<(&Stream, Vec<String>)> = if config.streams.is_empty() {
        offered.iter().map(|s| (s, s.key.clone())).collect()
    } else {
        let selected = sluice_airbyte_source::protocol::select(offered, &config.streams)
            .map_err(anyhow::Error::msg)?;
        selected
            .into_iter()
            .map(|(s, select)| (s, key_of(s, select)))
            .collect()
    };
    let (keyed, keyless): (Vec<_>, Vec<_>) = chosen.into_iter().partition(|(_, k)| !k.is_empty());
    let mut collections = Map::new();
    let mut sources = Map::new();
    let mut bindings = Vec::new();
    let kind = args.kind.as_str();
    for (stream, key) in &keyed {
        collections.insert(
            stream.name.clone(),
            json!({"key": key, "schema": keyed_schema(&stream.schema, key)}),
        );
        let mut source = Map::new();
        if let Some(connector) = &config.connector {
            source.insert("connector".into(), json!(connector));
        }
        if let Some(command) = &config.command {
            source.insert("command".into(), json!(command));
        }
        source.insert(
            "config".into(),
            match &config.config {
                Settings::Inline(settings) => Value::Object(settings.clone()),
                Settings::File(path) => json!(path),
            },
        );
        let mut select = json!({"name": stream.name});
        if *key != stream.key {
            select["key"] = json!(key);
        }
        source.insert("streams".into(), json!([select]));
        sources.insert(
            stream.name.clone(),
            json!({"target": stream.name, kind: Value::Object(source)}),
        );
        bindings.push(json!({"source": stream.name, "resource": {"table": table(&stream.name)}}));
    }
    if keyed.is_empty() {
        bail!(
            "no stream has a key: choose one for each stream read (`streams: [{{name: …, \
             key: [/id]}}]` in {place})"
        );
    }
    let endpoint = match &args.postgres {
        Some(url) => json!({"postgres": {"url": url}}),
        None => json!({"sqlite": {"path": args.sqlite}}),
    };
    let file = json!({
        "collections": collections,
        "sources": sources,
        "materializations": {kind: {"endpoint": endpoint, "bindings": bindings}},
    });
    let mut out = format!(
        "# Printed by `sluice discover {kind}` ({place}): a collection per stream with\n\
         # the schema the connector reports, and each stream bound into a table. Run it as\n\
         # it is (`sluice run`), or edit the keys, reductions and tables first.\n"
    );
    if !keyless.is_empty() {
        let names: Vec<&str> = keyless.iter().map(|(s, _)| s.name.as_str()).collect();
        out.push_str(&format!(
            "# Left out, as the connector reports no key for them (give one with\n\
             # `streams: [{{name: …, key: [/id]}}]` and discover again): {}\n",
            names.join(", ")
        ));
    }
    out.push_str(&serde_yaml_ng::to_string(&file)?);
    Ok(out)
}

/// The stream's schema with its key properties required (a collection's key must be),
/// an object type where the connector gave none, and no `format`: Sluice checks
/// formats, and connectors do not hold to theirs (faker's `date-time` purchases carry
/// no time zone).
fn keyed_schema(schema: &Value, key: &[String]) -> Value {
    let mut schema = match schema {
        Value::Object(_) => schema.clone(),
        _ => json!({"type": "object"}),
    };
    drop_formats(&mut schema);
    let mut required = schema["required"].as_array().cloned().unwrap_or_default();
    for pointer in key {
        // Nested keys stay as the connector describes them: only a top-level property
        // can be made required here.
        let segments = sluice_airbyte_source::config::pointer_segments(pointer);
        if let [top] = segments.as_slice()
            && !required.iter().any(|r| r == top)
        {
            required.push(json!(top));
        }
    }
    schema["required"] = json!(required);
    schema
}

/// Removes every `format` keyword of a schema (not a property named `format`).
fn drop_formats(schema: &mut Value) {
    match schema {
        Value::Object(keywords) => {
            if keywords.get("format").is_some_and(Value::is_string) {
                keywords.remove("format");
            }
            for (keyword, sub) in keywords.iter_mut() {
                match keyword.as_str() {
                    // Property names, not keywords, at the next level.
                    "properties" | "patternProperties" | "$defs" | "definitions" => {
                        for sub in sub.as_object_mut().into_iter().flat_map(|m| m.values_mut()) {
                            drop_formats(sub);
                        }
                    }
                    _ => drop_formats(sub),
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(drop_formats),
        _ => {}
    }
}

/// A table name from a stream name: letters, digits and underscores.
fn table(stream: &str) -> String {
    stream
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_properties_become_required_and_names_become_tables() {
        let schema = json!({"type": "object", "properties": {"id": {"type": "integer"}}});
        let keyed = keyed_schema(&schema, &["/id".to_string()]);
        assert_eq!(keyed["required"], json!(["id"]));
        assert_eq!(
            keyed_schema(&keyed, &["/id".to_string()])["required"],
            json!(["id"])
        );
        assert_eq!(table("Public.Users-2"), "public_users_2");
        let dated = json!({"type": "object", "properties": {
            "at": {"type": "string", "format": "date-time"},
            "format": {"type": "string"},
            "list": {"items": {"anyOf": [{"format": "uuid"}]}}}});
        let kept = keyed_schema(&dated, &[]);
        assert_eq!(kept["properties"]["at"], json!({"type": "string"}));
        assert_eq!(
            kept["properties"]["format"],
            json!({"type": "string"}),
            "a property"
        );
        assert_eq!(kept["properties"]["list"]["items"]["anyOf"][0], json!({}));
    }
}
