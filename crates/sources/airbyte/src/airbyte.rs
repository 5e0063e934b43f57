//! The Airbyte protocol (v0): messages one JSON object a line on stdout, sub-commands
//! `spec`, `check --config`, `discover --config`, `read --config --catalog [--state]`.
//!
//! | message | what the source does |
//! |---|---|
//! | RECORD | `record.data`'s text becomes a document |
//! | STATE | ends a step; folded into the state resumed from ([`AirbyteState`]) |
//! | LOG | logged under the source's name; an ERROR/FATAL one kept for a failure |
//! | TRACE error | the failure's message (`config_error`: not retried) |
//! | TRACE estimate | rows to come, for the progress line (`Source::lag`) |
//! | CATALOG, CONNECTION_STATUS | `discover`'s and `check`'s answers |
//! | SPEC, TRACE stream status, CONTROL | nothing |
//!
//! States come in three forms, and what is handed back with `--state` follows them:
//! per-stream (`type: STREAM`: the latest message of each stream, as an array), global
//! (`type: GLOBAL`: the latest message alone, as an array of one) and legacy (`data`
//! only: that object). The connector's counts (`sourceStats`) are dropped: they describe
//! one run, not where to resume.

use crate::config::StreamSelect;
use crate::protocol::{self, Message, Protocol, Stream, args, key_of, key_paths, mode_of};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use std::borrow::Cow;
use std::ffi::OsString;
use std::path::Path;

/// The `airbyte` protocol.
pub struct Airbyte;

/// The state folded from a read's STATE messages (see the module docs).
#[derive(Debug, Clone, PartialEq, Default)]
pub enum AirbyteState {
    #[default]
    None,
    /// The latest message of each stream, in the order streams first reported.
    Streams(Vec<(Value, Value)>),
    Global(Value),
    Legacy(Value),
}

#[derive(Deserialize)]
struct Line<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    record: Option<RecordMessage<'a>>,
    #[serde(default)]
    state: Option<Value>,
    #[serde(default)]
    log: Option<LogMessage>,
    #[serde(default)]
    trace: Option<Value>,
    #[serde(default)]
    catalog: Option<Value>,
    #[serde(default, rename = "connectionStatus")]
    connection_status: Option<StatusMessage>,
}

#[derive(Deserialize)]
struct RecordMessage<'a> {
    #[serde(borrow)]
    stream: Cow<'a, str>,
    #[serde(borrow)]
    data: &'a RawValue,
}

#[derive(Deserialize)]
struct LogMessage {
    level: String,
    message: String,
}

#[derive(Deserialize)]
struct StatusMessage {
    status: String,
    #[serde(default)]
    message: Option<String>,
}

impl Protocol for Airbyte {
    const NAME: &'static str = "airbyte";
    const PREFIX: &'static str = "source";
    type State = AirbyteState;

    fn parse(line: &[u8]) -> Result<Message<'_>, serde_json::Error> {
        let line: Line<'_> = serde_json::from_slice(line)?;
        let kind = line.kind.clone();
        Ok(match (&*kind, line) {
            (
                "RECORD",
                Line {
                    record: Some(r), ..
                },
            ) => Message::Record {
                stream: r.stream,
                data: r.data,
            },
            ("STATE", Line { state: Some(s), .. }) => Message::State(s),
            ("LOG", Line { log: Some(log), .. }) => Message::Log {
                error: matches!(log.level.as_str(), "ERROR" | "FATAL"),
                message: log.message,
            },
            ("TRACE", Line { trace: Some(t), .. }) => trace(&t),
            (
                "CATALOG",
                Line {
                    catalog: Some(c), ..
                },
            ) => Message::Catalog(c),
            (
                "CONNECTION_STATUS",
                Line {
                    connection_status: Some(s),
                    ..
                },
            ) => Message::Status(if s.status == "SUCCEEDED" {
                Ok(())
            } else {
                Err(s
                    .message
                    .unwrap_or_else(|| format!("the check answered {}", s.status)))
            }),
            _ => Message::Other,
        })
    }

    fn state_from(file: &Value) -> Result<AirbyteState, String> {
        match file {
            Value::Null => Ok(AirbyteState::None),
            Value::Object(_) => Ok(AirbyteState::Legacy(file.clone())),
            Value::Array(messages) => {
                let mut state = AirbyteState::None;
                for message in messages {
                    Airbyte::absorb(&mut state, message.clone())?;
                }
                Ok(state)
            }
            other => Err(format!(
                "an Airbyte state is an array or an object, not {other}"
            )),
        }
    }

    fn absorb(state: &mut AirbyteState, mut message: Value) -> Result<Value, String> {
        let Some(fields) = message.as_object_mut() else {
            return Err(format!(
                "a STATE message's state is an object, not {message}"
            ));
        };
        fields.remove("sourceStats");
        fields.remove("destinationStats");
        let kind = fields
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("LEGACY");
        match kind {
            "STREAM" => {
                let descriptor = message
                    .pointer("/stream/stream_descriptor")
                    .cloned()
                    .ok_or("a STREAM state without stream.stream_descriptor")?;
                if !matches!(state, AirbyteState::Streams(_)) {
                    *state = AirbyteState::Streams(Vec::new());
                }
                let AirbyteState::Streams(streams) = state else {
                    unreachable!("made a per-stream state above")
                };
                match streams.iter_mut().find(|(d, _)| *d == descriptor) {
                    Some((_, latest)) => *latest = message,
                    None => streams.push((descriptor, message)),
                }
            }
            "GLOBAL" => *state = AirbyteState::Global(message),
            "LEGACY" => {
                let data = fields.remove("data").ok_or("a LEGACY state without data")?;
                *state = AirbyteState::Legacy(data);
            }
            other => return Err(format!("a STATE message of unknown type {other:?}")),
        }
        Ok(Airbyte::file(state))
    }

    fn has_state(state: &AirbyteState) -> bool {
        *state != AirbyteState::None
    }

    fn file(state: &AirbyteState) -> Value {
        match state {
            AirbyteState::None => Value::Null,
            AirbyteState::Streams(streams) => {
                Value::Array(streams.iter().map(|(_, m)| m.clone()).collect())
            }
            AirbyteState::Global(message) => Value::Array(vec![message.clone()]),
            AirbyteState::Legacy(data) => data.clone(),
        }
    }

    fn catalog(output: &[u8]) -> Result<Vec<Stream>, String> {
        let mut failure = None;
        for line in output.split(|b| *b == b'\n') {
            match Airbyte::parse(line) {
                Ok(Message::Catalog(catalog)) => return streams(&catalog),
                Ok(Message::Error { message, .. }) => failure = Some(message),
                Ok(Message::Log {
                    error: true,
                    message,
                }) => failure = failure.or(Some(message)),
                _ => {}
            }
        }
        Err(failure.unwrap_or_else(|| "discover answered no CATALOG message".to_string()))
    }

    fn configured(offered: &[Stream], selected: &[StreamSelect]) -> Result<Value, String> {
        let streams: Vec<Value> = protocol::select(offered, selected)?
            .into_iter()
            .map(|(stream, select)| {
                let mode = mode_of(stream, select);
                let mut configured = json!({
                    "stream": stream.raw,
                    "sync_mode": mode.as_str(),
                    "destination_sync_mode": "append",
                });
                let key = key_of(stream, select);
                if !key.is_empty() {
                    configured["primary_key"] = json!(key_paths(&key));
                }
                if let Some(cursor) = stream.raw.get("default_cursor_field") {
                    configured["cursor_field"] = cursor.clone();
                }
                configured
            })
            .collect();
        Ok(json!({ "streams": streams }))
    }

    fn spec_args() -> Option<Vec<OsString>> {
        Some(args([&"spec"]))
    }

    fn defaults(spec: &[u8]) -> Map<String, Value> {
        let spec = spec.split(|b| *b == b'\n').find_map(|line| {
            let message: Value = serde_json::from_slice(line).ok()?;
            (message["type"] == "SPEC").then_some(message)
        });
        let properties = spec
            .as_ref()
            .and_then(|s| s.pointer("/spec/connectionSpecification/properties"))
            .and_then(Value::as_object);
        (properties.into_iter().flatten())
            .filter_map(|(key, property)| Some((key.clone(), property.get("default")?.clone())))
            .collect()
    }

    fn discover_args(config: &Path) -> Vec<OsString> {
        args([&"discover", &"--config", &config])
    }

    fn check_args(config: &Path) -> Option<Vec<OsString>> {
        Some(args([&"check", &"--config", &config]))
    }

    fn read_args(config: &Path, catalog: &Path, state: Option<&Path>) -> Vec<OsString> {
        let mut all = args([&"read", &"--config", &config, &"--catalog", &catalog]);
        if let Some(state) = state {
            all.extend(args([&"--state", &state]));
        }
        all
    }
}

/// A TRACE message: an error or an estimate; other traces are nothing to act on.
fn trace(trace: &Value) -> Message<'static> {
    match trace.get("type").and_then(Value::as_str) {
        Some("ERROR") => {
            let error = &trace["error"];
            // The user-facing message, and the internal one that says what broke.
            let message = match (
                error["message"].as_str(),
                error["internal_message"].as_str(),
            ) {
                (Some(shown), Some(internal)) if shown != internal => {
                    format!("{shown} ({internal})")
                }
                (Some(one), _) | (None, Some(one)) => one.to_string(),
                (None, None) => "the connector reported an error without a message".to_string(),
            };
            Message::Error {
                message,
                config: error["failure_type"] == "config_error",
            }
        }
        Some("ESTIMATE") => {
            let estimate = &trace["estimate"];
            match (estimate["name"].as_str(), estimate["row_estimate"].as_u64()) {
                (Some(stream), Some(rows)) => Message::Estimate {
                    stream: stream.to_string(),
                    rows,
                },
                _ => Message::Other,
            }
        }
        _ => Message::Other,
    }
}

/// The streams of a CATALOG message's catalog.
fn streams(catalog: &Value) -> Result<Vec<Stream>, String> {
    let Some(streams) = catalog["streams"].as_array() else {
        return Err(format!("the catalog has no streams array: {catalog}"));
    };
    streams
        .iter()
        .map(|raw| {
            let name = raw["name"].as_str().ok_or("a stream without a name")?;
            let key = raw["source_defined_primary_key"]
                .as_array()
                .map(|paths| {
                    paths
                        .iter()
                        .filter_map(|path| {
                            let path: Option<Vec<String>> = path
                                .as_array()?
                                .iter()
                                .map(|s| s.as_str().map(str::to_string))
                                .collect();
                            path.map(|p| protocol::pointer(&p))
                        })
                        .collect()
                })
                .unwrap_or_default();
            let incremental = raw["supported_sync_modes"]
                .as_array()
                .is_some_and(|modes| modes.iter().any(|m| m == "incremental"));
            Ok(Stream {
                name: name.to_string(),
                schema: raw["json_schema"].clone(),
                key,
                incremental,
                raw: raw.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
#[path = "airbyte_tests.rs"]
mod tests;
