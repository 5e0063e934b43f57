//! The Singer protocol: a tap run as `tap --config F --discover` (the catalog, one
//! JSON document on stdout) and `tap --config F --catalog C [--state S]` (messages one
//! JSON object a line).
//!
//! | message | what the source does |
//! |---|---|
//! | RECORD | `record`'s text becomes a document |
//! | STATE | ends a step; its `value` is the state resumed from, whole |
//! | SCHEMA, ACTIVATE_VERSION, BATCH | nothing (schemas come from discover) |
//!
//! A tap has no `check`: discover stands in for it. The catalog a read is given is the
//! discovered one, keeping the selected streams, each marked `selected` in its
//! top-level metadata and keyed as the pipeline says (`key_properties`: top-level
//! properties only).

use crate::config::{StreamSelect, pointer_segments};
use crate::protocol::{self, Message, Protocol, Stream, args, key_of};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use std::borrow::Cow;
use std::ffi::OsString;
use std::path::Path;

/// The `singer` protocol.
pub struct Singer;

#[derive(Deserialize)]
struct Line<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    stream: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    record: Option<&'a RawValue>,
    #[serde(default)]
    value: Option<Value>,
}

impl Protocol for Singer {
    const NAME: &'static str = "singer";
    const PREFIX: &'static str = "tap";
    /// The latest STATE's value (null: none).
    type State = Value;

    fn parse(line: &[u8]) -> Result<Message<'_>, serde_json::Error> {
        let line: Line<'_> = serde_json::from_slice(line)?;
        let kind = line.kind.clone();
        Ok(match (&*kind, line) {
            (
                "RECORD",
                Line {
                    stream: Some(stream),
                    record: Some(data),
                    ..
                },
            ) => Message::Record { stream, data },
            ("STATE", Line { value: Some(v), .. }) => Message::State(v),
            _ => Message::Other,
        })
    }

    fn state_from(file: &Value) -> Result<Value, String> {
        Ok(file.clone())
    }

    fn absorb(state: &mut Value, message: Value) -> Result<Value, String> {
        *state = message;
        Ok(state.clone())
    }

    fn has_state(state: &Value) -> bool {
        !state.is_null()
    }

    fn file(state: &Value) -> Value {
        state.clone()
    }

    fn catalog(output: &[u8]) -> Result<Vec<Stream>, String> {
        let catalog: Value = serde_json::from_slice(output)
            .map_err(|e| format!("the tap's catalog is not JSON ({e})"))?;
        let Some(streams) = catalog["streams"].as_array() else {
            return Err(format!("the tap's catalog has no streams array: {catalog}"));
        };
        streams
            .iter()
            .map(|raw| {
                let name = raw["tap_stream_id"]
                    .as_str()
                    .or(raw["stream"].as_str())
                    .ok_or("a stream without tap_stream_id")?;
                let key = raw["key_properties"]
                    .as_array()
                    .map(|keys| {
                        keys.iter()
                            .filter_map(Value::as_str)
                            .map(|k| protocol::pointer(&[k.to_string()]))
                            .collect()
                    })
                    .unwrap_or_default();
                Ok(Stream {
                    name: name.to_string(),
                    schema: raw["schema"].clone(),
                    key,
                    incremental: raw["replication_method"] == "INCREMENTAL",
                    raw: raw.clone(),
                })
            })
            .collect()
    }

    fn configured(offered: &[Stream], selected: &[StreamSelect]) -> Result<Value, String> {
        let mut streams = Vec::new();
        for (stream, select) in protocol::select(offered, selected)? {
            let mut raw = stream.raw.clone();
            let mut keys = Vec::new();
            for pointer in key_of(stream, select) {
                match pointer_segments(&pointer).as_slice() {
                    [property] => keys.push(property.clone()),
                    _ => {
                        return Err(format!(
                            "stream {:?}: a tap's key is top-level properties, not {pointer}",
                            stream.name
                        ));
                    }
                }
            }
            raw["key_properties"] = json!(keys);
            let metadata = raw["metadata"].as_array_mut();
            let top = metadata.and_then(|all| {
                all.iter_mut()
                    .find(|m| m["breadcrumb"].as_array().is_some_and(Vec::is_empty))
            });
            match top {
                Some(entry) => entry["metadata"]["selected"] = json!(true),
                None => {
                    let entry = json!({"breadcrumb": [], "metadata": {"selected": true}});
                    match raw["metadata"].as_array_mut() {
                        Some(all) => all.push(entry),
                        None => raw["metadata"] = json!([entry]),
                    }
                }
            }
            streams.push(raw);
        }
        Ok(json!({ "streams": streams }))
    }

    fn spec_args() -> Option<Vec<OsString>> {
        None
    }

    fn defaults(_: &[u8]) -> Map<String, Value> {
        Map::new()
    }

    fn discover_args(config: &Path) -> Vec<OsString> {
        args([&"--config", &config, &"--discover"])
    }

    fn check_args(_: &Path) -> Option<Vec<OsString>> {
        None
    }

    fn read_args(config: &Path, catalog: &Path, state: Option<&Path>) -> Vec<OsString> {
        let mut all = args([&"--config", &config, &"--catalog", &catalog]);
        if let Some(state) = state {
            all.extend(args([&"--state", &state]));
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_states_are_read_and_the_rest_passed_over() {
        let line =
            br#"{"type":"RECORD","stream":"items","record":{"id":1,"v":"a"},"time_extracted":"x"}"#;
        let Message::Record { stream, data } = Singer::parse(line).unwrap() else {
            panic!("not a record")
        };
        assert_eq!((&*stream, data.get()), ("items", r#"{"id":1,"v":"a"}"#));
        let state = br#"{"type":"STATE","value":{"bookmarks":{"items":{"v":2}}}}"#;
        let Message::State(value) = Singer::parse(state).unwrap() else {
            panic!("not a state")
        };
        let mut held = Value::Null;
        assert!(!Singer::has_state(&held));
        let file = Singer::absorb(&mut held, value).unwrap();
        assert_eq!(file, json!({"bookmarks": {"items": {"v": 2}}}));
        assert_eq!(Singer::state_from(&file).unwrap(), held);
        let schema = br#"{"type":"SCHEMA","stream":"items","schema":{},"key_properties":["id"]}"#;
        assert!(matches!(Singer::parse(schema).unwrap(), Message::Other));
    }

    #[test]
    fn the_read_catalog_marks_the_selected_streams_with_their_keys() {
        let discovered = json!({"streams": [
            {"tap_stream_id": "items", "stream": "items", "key_properties": ["id"],
             "replication_method": "INCREMENTAL", "schema": {"type": "object"},
             "metadata": [{"breadcrumb": [], "metadata": {"inclusion": "available"}},
                          {"breadcrumb": ["properties", "id"], "metadata": {}}]},
            {"tap_stream_id": "other", "schema": {}}]});
        let offered = Singer::catalog(discovered.to_string().as_bytes()).unwrap();
        assert_eq!(offered[0].key, vec!["/id"]);
        assert!(offered[0].incremental);
        let select = StreamSelect {
            name: "items".into(),
            key: Some(vec!["/v".into()]),
            sync_mode: None,
        };
        let catalog = Singer::configured(&offered, std::slice::from_ref(&select)).unwrap();
        let streams = catalog["streams"].as_array().unwrap();
        assert_eq!(streams.len(), 1, "only the selected stream");
        assert_eq!(streams[0]["key_properties"], json!(["v"]));
        assert_eq!(streams[0]["metadata"][0]["metadata"]["selected"], true);
        let nested = StreamSelect {
            key: Some(vec!["/a/b".into()]),
            ..select
        };
        let err = Singer::configured(&offered, &[nested]).unwrap_err();
        assert!(err.contains("top-level"), "{err}");
    }
}
