//! What the user writes under `airbyte:` or `singer:`: which connector runs (by name, or
//! its command), the connector's own configuration (inline or a file), the streams read
//! and how long the connector may stay silent. Both kinds read the same keys (a tap has
//! no sync modes: `sync_mode` is refused under `singer:`). Strict: unknown keys are
//! errors.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value};
use sluice_source_sdk::InvalidConfig;
use sluice_source_sdk::config::{de_duration, duration_schema, resolve_path, ser_duration};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// An Airbyte source connector or a Singer tap, run as a process over its protocol.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Connector")]
pub struct ConnectorConfig {
    /// The connector's name: `faker` runs `source-faker` (airbyte) or `tap-faker`
    /// (singer), found on PATH. Give this or `command`.
    #[serde(default)]
    #[schemars(with = "String", length(min = 1))]
    pub connector: Option<String>,
    /// The program that runs the connector and its first arguments, instead of the one
    /// `connector` names (`[/opt/venv/bin/source-faker]`, `[python3, -m, tap_jsonl]`);
    /// the protocol's sub-commands and options follow them.
    #[serde(default)]
    #[schemars(with = "Vec<String>", length(min = 1))]
    pub command: Option<Vec<String>>,
    /// The connector's own configuration: an object, or the path of a JSON file holding
    /// it (relative to the pipeline file's folder).
    #[serde(default = "empty_settings")]
    pub config: Settings,
    /// The streams read, all into the source's target collection (one stream a source,
    /// unless several share a schema and key).
    #[serde(default)]
    pub streams: Vec<StreamSelect>,
    /// How long the connector may stay silent (no message on its output) before it is
    /// taken to hang: it is stopped and the source fails, retryably.
    #[serde(
        default = "default_timeout",
        deserialize_with = "de_duration",
        serialize_with = "ser_duration"
    )]
    #[schemars(schema_with = "duration_schema")]
    pub timeout: Duration,
}

/// The connector's configuration, inline or in a file.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum Settings {
    /// The configuration itself.
    Inline(Map<String, Value>),
    /// A JSON file holding it.
    File(PathBuf),
}

/// One stream of the connector's catalog, selected.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StreamSelect {
    /// The stream's name in the connector's catalog (`sluice discover` lists them).
    #[schemars(length(min = 1))]
    pub name: String,
    /// The stream's key as JSON pointers (`[/id]`), told to the connector; by default
    /// the primary key the connector reports.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub key: Option<Vec<String>>,
    /// airbyte only: incremental (resume from the connector's state) or full_refresh
    /// (read everything at each run); by default incremental when the stream supports
    /// it.
    #[serde(default)]
    #[schemars(with = "SyncMode")]
    pub sync_mode: Option<SyncMode>,
}

/// How an Airbyte stream is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SyncMode {
    /// Only what changed since the state the connector is given.
    Incremental,
    /// Everything, at each run.
    FullRefresh,
}

impl SyncMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SyncMode::Incremental => "incremental",
            SyncMode::FullRefresh => "full_refresh",
        }
    }
}

fn empty_settings() -> Settings {
    Settings::Inline(Map::new())
}

/// Ten minutes: a connector paging through a slow API may be silent for minutes
/// between pages; one silent for longer is taken to hang.
fn default_timeout() -> Duration {
    Duration::from_secs(600)
}

impl ConnectorConfig {
    /// The checks serde cannot make, the config file resolved against `base_dir`;
    /// `streams_needed`: false for `sluice discover`, which lists them.
    pub fn prepare(
        &mut self,
        base_dir: &Path,
        protocol: &str,
        streams_needed: bool,
    ) -> Result<(), InvalidConfig> {
        if self.connector.is_some() == self.command.is_some() {
            return Err(invalid(
                "",
                "give the connector's name (`connector: faker`) or its `command`, one of them",
            ));
        }
        if let Settings::File(path) = &mut self.config {
            resolve_path(path, base_dir);
        }
        if streams_needed && self.streams.is_empty() {
            return Err(invalid(
                "streams",
                "select at least one stream (`sluice discover` lists the connector's)",
            ));
        }
        for (i, stream) in self.streams.iter().enumerate() {
            if protocol == "singer" && stream.sync_mode.is_some() {
                return Err(invalid(
                    &format!("streams[{i}].sync_mode"),
                    "a tap has no sync modes: its replication method is its own",
                ));
            }
            for pointer in stream.key.iter().flatten() {
                if !pointer.starts_with('/') || pointer.len() == 1 {
                    return Err(invalid(
                        &format!("streams[{i}].key"),
                        &format!("{pointer:?} is not a JSON pointer to a property (`/id`)"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The program and first arguments: `command`, or `<prefix>-<connector>`.
    pub fn program(&self, prefix: &str) -> Vec<String> {
        match (&self.command, &self.connector) {
            (Some(command), _) => command.clone(),
            (None, Some(name)) => vec![format!("{prefix}-{name}")],
            (None, None) => unreachable!("prepare requires one of them"),
        }
    }
}

fn invalid(place: &str, message: &str) -> InvalidConfig {
    InvalidConfig::new(place, message)
}

/// A JSON pointer's segments, unescaped (`/a~1b/c` → `["a/b", "c"]`).
pub fn pointer_segments(pointer: &str) -> Vec<String> {
    pointer
        .split('/')
        .skip(1)
        .map(|s| s.replace("~1", "/").replace("~0", "~"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use sluice_source_sdk::config::{parse, schema_for};
    use sluice_testkit::schema::assert_schema_judges;

    #[test]
    fn the_schema_takes_the_examples_and_refuses_an_unknown_key() {
        assert_schema_judges(
            &schema_for::<ConnectorConfig>(),
            &[
                json!({"connector": "faker", "config": {"seed": 1}, "streams": [{"name": "users"}]}),
                json!({"command": ["/venv/bin/tap-jsonl"], "config": "tap.json",
                       "streams": [{"name": "items", "key": ["/id"]}], "timeout": "1m"}),
                json!({"connector": "file", "streams": [{"name": "a", "sync_mode": "full_refresh"}]}),
            ],
            &[
                json!({"connector": "faker", "stream": [{"name": "users"}]}),
                json!({"connector": "faker", "streams": [{"name": "users", "sync_mode": "cdc"}]}),
                json!({"connector": "faker", "timeout": 5}),
            ],
        );
    }

    fn prepared(value: Value, protocol: &str) -> Result<ConnectorConfig, InvalidConfig> {
        let mut config: ConnectorConfig = parse(value)?;
        config.prepare(Path::new("/pipelines"), protocol, true)?;
        Ok(config)
    }

    #[test]
    fn a_connector_is_named_or_given_as_a_command_never_both() {
        let named = prepared(
            json!({"connector": "faker", "streams": [{"name": "u"}]}),
            "airbyte",
        );
        assert_eq!(named.unwrap().program("source"), vec!["source-faker"]);
        let both = prepared(
            json!({"connector": "faker", "command": ["x"], "streams": [{"name": "u"}]}),
            "airbyte",
        );
        assert!(both.unwrap_err().to_string().contains("one of them"));
        let neither = prepared(json!({"streams": [{"name": "u"}]}), "airbyte");
        assert!(neither.is_err());
    }

    #[test]
    fn a_config_file_is_relative_to_the_pipeline_and_streams_are_required() {
        let config = prepared(
            json!({"connector": "jsonl", "config": "tap.json", "streams": [{"name": "u"}]}),
            "singer",
        )
        .unwrap();
        assert_eq!(config.config, Settings::File("/pipelines/tap.json".into()));
        let none = prepared(json!({"connector": "faker"}), "airbyte").unwrap_err();
        assert!(none.to_string().contains("sluice discover"), "{none}");
        let mode = prepared(
            json!({"connector": "jsonl", "streams": [{"name": "u", "sync_mode": "incremental"}]}),
            "singer",
        )
        .unwrap_err();
        assert!(mode.to_string().contains("no sync modes"), "{mode}");
        let key = prepared(
            json!({"connector": "faker", "streams": [{"name": "u", "key": ["id"]}]}),
            "airbyte",
        )
        .unwrap_err();
        assert!(key.to_string().contains("JSON pointer"), "{key}");
    }

    #[test]
    fn pointers_unescape_into_segments() {
        assert_eq!(pointer_segments("/a~1b/c~0"), vec!["a/b", "c~"]);
    }
}
