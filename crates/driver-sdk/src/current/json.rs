//! Flow's JSON codec of the current protocol's `Request` and `Response`: what a
//! connector speaking JSON reads and writes, one object per line on stdio.
//!
//! It is the proto3 JSON mapping (camelCase names, 64-bit integers as strings, bytes as
//! base64, enums by name, default values left out), with Flow's changes:
//!
//! - every `*_json` field (JSON text in bytes or a string) is the JSON value itself,
//!   under the name without `_json`: `config_json` is `"config": {...}`, `doc_json` is
//!   `"doc"`, `resource_config_json` is `"resourceConfig"`;
//! - every `*_json_map` field (a map of JSON texts) is an object of JSON values under the
//!   name without `_json_map` (`field_config_json_map` is `"fieldConfig"`), except the
//!   two OAuth2 response maps, which Flow names `accessTokenResponseMap` and
//!   `refreshTokenResponseMap` (its regression snapshots);
//! - `internal` is `"$internal"`.
//!
//! ```text
//!  cm::Request ──prost──▶ bytes ──DynamicMessage──▶ proto3 JSON ──to_flow──▶ Flow JSON
//!  cm::Request ◀──prost── bytes ◀──DynamicMessage── proto3 JSON ◀─from_flow── Flow JSON
//! ```
//!
//! One generic mechanism, no serializer per message: `prost-reflect` maps any message of
//! [`sluice_proto::current::DESCRIPTOR_SET`] to and from proto3 JSON, and one pass, walked
//! beside the message's descriptor (so that a map key or a document property that
//! happens to end in `Json` is never renamed), applies Flow's renames.
//!
//! Decoding ignores fields the protos do not declare: Flow's runtime sends more than a
//! materialization connector reads (shard templates, partition selectors, state
//! patches), and a connector must not fail on them.
//!
//! Raw JSON values (documents, keys, configs) pass through as text, never parsed into a
//! tree: their properties keep their order and their numbers every digit, as with
//! Flow's own codec. Only a line break between tokens becomes a space, so that a message
//! stays one line. Bytes in a `*_json` field that are not JSON (a peer's bug) are
//! written as a JSON string of their text, so the encoder never fails.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use prost::Message;
use prost_reflect::{
    DescriptorPool, DeserializeOptions, DynamicMessage, FieldDescriptor, Kind, MessageDescriptor,
    SerializeOptions,
};
use serde::de::IgnoredAny;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use sluice_proto::current::{self, materialize as cm};
use std::collections::HashMap;
use std::sync::LazyLock;

/// The current protocol's descriptors, decoded once.
static POOL: LazyLock<DescriptorPool> = LazyLock::new(|| {
    DescriptorPool::decode(current::DESCRIPTOR_SET)
        .expect("sluice-proto's descriptor set of the current protocol decodes")
});

/// Fields whose Flow name does not follow the `_json` / `_json_map` rule.
const FLOW_NAMES: &[(&str, &str)] = &[
    ("access_token_response_json_map", "accessTokenResponseMap"),
    ("refresh_token_response_json_map", "refreshTokenResponseMap"),
    ("internal", "$internal"),
];

fn descriptor(name: &str) -> MessageDescriptor {
    POOL.get_message_by_name(name)
        .unwrap_or_else(|| panic!("the current protocol's descriptors hold {name}"))
}

/// `request` as one line of Flow's JSON (no newline).
pub fn encode_request(request: &cm::Request) -> Vec<u8> {
    encode(request, "materialize.Request")
}

/// `response` as one line of Flow's JSON (no newline).
pub fn encode_response(response: &cm::Response) -> Vec<u8> {
    encode(response, "materialize.Response")
}

/// A `Request` from Flow's JSON; the error says what is wrong with it.
pub fn decode_request(json: &[u8]) -> Result<cm::Request, String> {
    decode(json, "materialize.Request")
}

/// A `Response` from Flow's JSON; the error says what is wrong with it.
pub fn decode_response(json: &[u8]) -> Result<cm::Response, String> {
    decode(json, "materialize.Response")
}

fn encode<M: Message>(message: &M, name: &str) -> Vec<u8> {
    let desc = descriptor(name);
    let dynamic = DynamicMessage::decode(desc.clone(), message.encode_to_vec().as_slice())
        .expect("a message's own encoding decodes by its descriptor");
    let options = SerializeOptions::new(); // camelCase, defaults skipped, int64 as strings
    let value = dynamic
        .serialize_with_options(serde_json::value::Serializer, &options)
        .expect("a message serializes to a JSON value");
    let mut out = Vec::with_capacity(message.encoded_len() * 2);
    write_flow(&desc, value, &mut out);
    out
}

fn decode<M: Message + Default>(json: &[u8], name: &str) -> Result<M, String> {
    let desc = descriptor(name);
    let text = std::str::from_utf8(json).map_err(|e| format!("a {name} that is not UTF-8: {e}"))?;
    let raw: &RawValue =
        serde_json::from_str(text).map_err(|e| format!("a {name} that is not JSON: {e}"))?;
    let value = from_flow(&desc, raw).map_err(|e| format!("{name}: {e}"))?;
    let options = DeserializeOptions::new().deny_unknown_fields(false);
    let dynamic = DynamicMessage::deserialize_with_options(desc, value, &options)
        .map_err(|e| format!("{name}: {e}"))?;
    M::decode(dynamic.encode_to_vec().as_slice()).map_err(|e| format!("{name}: {e}"))
}

/// How a field of the protos is spelled in Flow's JSON.
enum Flow {
    /// JSON text, written as the value itself.
    Raw(String),
    /// A map of JSON texts, written as an object of the values themselves.
    RawMap(String),
    /// As proto3 JSON has it, under this name.
    Plain(String),
}

fn flow_name(field: &FieldDescriptor) -> Flow {
    let name = field.name();
    if let Some((_, flow)) = FLOW_NAMES.iter().find(|(proto, _)| *proto == name) {
        return if name.ends_with("_json_map") {
            Flow::RawMap(flow.to_string())
        } else {
            Flow::Plain(flow.to_string())
        };
    }
    if let Some(stem) = name.strip_suffix("_json_map") {
        Flow::RawMap(camel(stem))
    } else if let Some(stem) = name.strip_suffix("_json") {
        Flow::Raw(camel(stem))
    } else {
        Flow::Plain(field.json_name().to_string())
    }
}

/// proto3's JSON name of a field name: `resource_config` is `resourceConfig`.
fn camel(snake: &str) -> String {
    let mut out = String::with_capacity(snake.len());
    let mut upper = false;
    for c in snake.chars() {
        match c {
            '_' => upper = true,
            c if upper => {
                out.extend(c.to_uppercase());
                upper = false;
            }
            c => out.push(c),
        }
    }
    out
}

/// The message type of a field's values, if they are messages (for a map, of its
/// values).
fn message_values(field: &FieldDescriptor) -> Option<MessageDescriptor> {
    match field.kind() {
        Kind::Message(entry) if field.is_map() => match entry.map_entry_value_field().kind() {
            Kind::Message(value) => Some(value),
            _ => None,
        },
        Kind::Message(message) => Some(message),
        _ => None,
    }
}

/// Whether the JSON text of `field` (or of its map values) is held in bytes.
fn bytes_valued(field: &FieldDescriptor) -> bool {
    let kind = match field.kind() {
        Kind::Message(entry) if field.is_map() => entry.map_entry_value_field().kind(),
        kind => kind,
    };
    matches!(kind, Kind::Bytes)
}

fn write_key(key: &str, first: &mut bool, out: &mut Vec<u8>) {
    if !std::mem::take(first) {
        out.push(b',');
    }
    serde_json::to_writer(&mut *out, key).expect("a string serializes");
    out.push(b':');
}

/// Writes `value`, the proto3 JSON of a `desc` message, as Flow's JSON.
fn write_flow(desc: &MessageDescriptor, value: Value, out: &mut Vec<u8>) {
    let Value::Object(mut proto) = value else {
        serde_json::to_writer(&mut *out, &value).expect("a JSON value serializes");
        return;
    };
    out.push(b'{');
    let mut first = true;
    for field in desc.fields() {
        let Some(v) = proto.remove(field.json_name()) else {
            continue;
        };
        match flow_name(&field) {
            Flow::Raw(name) => {
                write_key(&name, &mut first, out);
                write_raw(&field, v, out);
            }
            Flow::RawMap(name) => {
                write_key(&name, &mut first, out);
                let Value::Object(entries) = v else {
                    serde_json::to_writer(&mut *out, &v).expect("a JSON value serializes");
                    continue;
                };
                out.push(b'{');
                let mut first = true;
                for (k, v) in entries {
                    write_key(&k, &mut first, out);
                    write_raw(&field, v, out);
                }
                out.push(b'}');
            }
            Flow::Plain(name) => {
                write_key(&name, &mut first, out);
                match (message_values(&field), v) {
                    (Some(md), Value::Array(items)) if field.is_list() => {
                        out.push(b'[');
                        for (i, item) in items.into_iter().enumerate() {
                            if i > 0 {
                                out.push(b',');
                            }
                            write_flow(&md, item, out);
                        }
                        out.push(b']');
                    }
                    (Some(md), Value::Object(entries)) if field.is_map() => {
                        out.push(b'{');
                        let mut first = true;
                        for (k, v) in entries {
                            write_key(&k, &mut first, out);
                            write_flow(&md, v, out);
                        }
                        out.push(b'}');
                    }
                    (Some(md), v) if !field.is_list() && !field.is_map() => write_flow(&md, v, out),
                    (_, v) => {
                        serde_json::to_writer(&mut *out, &v).expect("a JSON value serializes")
                    }
                }
            }
        }
    }
    out.push(b'}');
}

/// Writes the JSON text that `v`, the proto3 JSON of `field` (base64 of bytes, or a
/// string), holds, as it is: byte for byte, but for line breaks between tokens, which
/// become spaces so the message stays on one line (JSON text has no raw line break
/// inside a string).
fn write_raw(field: &FieldDescriptor, v: Value, out: &mut Vec<u8>) {
    let text = match v {
        Value::String(s) if bytes_valued(field) => match BASE64.decode(s.as_bytes()) {
            Ok(bytes) => bytes,
            Err(_) => s.into_bytes(),
        },
        Value::String(s) => s.into_bytes(),
        other => other.to_string().into_bytes(),
    };
    if serde_json::from_slice::<IgnoredAny>(&text).is_ok() {
        out.extend(
            text.iter()
                .map(|&b| if b == b'\n' || b == b'\r' { b' ' } else { b }),
        );
    } else {
        let text = String::from_utf8_lossy(&text);
        serde_json::to_writer(&mut *out, &*text).expect("a string serializes");
    }
}

fn parse<'a, T: serde::Deserialize<'a>>(name: &str, raw: &'a RawValue) -> Result<T, String> {
    serde_json::from_str(raw.get()).map_err(|e| format!("{name:?}: {e}"))
}

/// The proto3 JSON of a `desc` message written in Flow's JSON as `raw`. Raw JSON values
/// are taken as their text, never parsed into a tree. Fields the protos do not declare
/// are dropped (the deserializer would skip them).
fn from_flow(desc: &MessageDescriptor, raw: &RawValue) -> Result<Value, String> {
    let mut flow: HashMap<String, &RawValue> = match raw.get() {
        "null" => return Ok(Value::Null),
        text if text.starts_with('{') => parse("message", raw)?,
        _ => return parse("message", raw), // the deserializer says what is wrong
    };
    let mut proto = Map::with_capacity(flow.len());
    for field in desc.fields() {
        match flow_name(&field) {
            Flow::Raw(name) => {
                if let Some(v) = flow.remove(&name) {
                    proto.insert(field.json_name().to_string(), json_text(&field, v));
                }
            }
            Flow::RawMap(name) => {
                let Some(v) = flow.remove(&name) else {
                    continue;
                };
                let entries: Vec<(String, &RawValue)> =
                    parse::<HashMap<String, &RawValue>>(&name, v)?
                        .into_iter()
                        .collect();
                let entries = entries
                    .into_iter()
                    .map(|(k, v)| (k, json_text(&field, v)))
                    .collect();
                proto.insert(field.json_name().to_string(), Value::Object(entries));
            }
            Flow::Plain(name) => {
                // proto3 JSON also accepts a field's proto name.
                let Some(v) = flow.remove(&name).or_else(|| flow.remove(field.name())) else {
                    continue;
                };
                let v = match message_values(&field) {
                    Some(md) if field.is_list() && v.get().starts_with('[') => {
                        let items: Vec<&RawValue> = parse(&name, v)?;
                        let items = items.into_iter().map(|item| from_flow(&md, item));
                        Value::Array(items.collect::<Result<_, _>>()?)
                    }
                    Some(md) if field.is_map() && v.get().starts_with('{') => {
                        let entries: HashMap<String, &RawValue> = parse(&name, v)?;
                        let entries = entries
                            .into_iter()
                            .map(|(k, v)| Ok((k, from_flow(&md, v)?)))
                            .collect::<Result<Map<_, _>, String>>()?;
                        Value::Object(entries)
                    }
                    Some(md) if !field.is_list() && !field.is_map() => from_flow(&md, v)?,
                    _ => parse(&name, v)?,
                };
                proto.insert(field.json_name().to_string(), v);
            }
        }
    }
    Ok(Value::Object(proto))
}

/// `raw` as the proto3 JSON of `field`'s JSON text: base64 of the text for bytes, the
/// text as a string otherwise.
fn json_text(field: &FieldDescriptor, raw: &RawValue) -> Value {
    if bytes_valued(field) {
        Value::String(BASE64.encode(raw.get()))
    } else {
        Value::String(raw.get().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_flow() {
        assert_eq!(camel("resource_config"), "resourceConfig");
        assert_eq!(camel("config_schema"), "configSchema");
        let load = descriptor("materialize.Request.Load");
        let name = |field: &str| match flow_name(&load.get_field_by_name(field).unwrap()) {
            Flow::Raw(n) | Flow::RawMap(n) | Flow::Plain(n) => n,
        };
        assert_eq!(name("key_json"), "key");
        assert_eq!(name("key_packed"), "keyPacked");
    }

    #[test]
    fn a_document_property_ending_in_json_is_not_renamed() {
        let request = cm::Request {
            load: Some(cm::request::Load {
                binding: 1,
                key_json: br#"{"fooJson":"x","bar_json":1}"#.to_vec(),
                key_packed: vec![2, 0x61, 0],
            }),
            ..Default::default()
        };
        let line = encode_request(&request);
        assert_eq!(
            String::from_utf8(line.clone()).unwrap(),
            r#"{"load":{"binding":1,"key":{"fooJson":"x","bar_json":1},"keyPacked":"AmEA"}}"#
        );
        assert_eq!(decode_request(&line).unwrap().load, request.load);
    }

    #[test]
    fn a_document_keeps_its_text_but_for_line_breaks() {
        let doc = b"{\"z\": 1,\n \"a\": 12345678901234567890.000000000001}";
        let response = cm::Response {
            loaded: Some(cm::response::Loaded {
                binding: 2,
                doc_json: doc.to_vec(),
            }),
            ..Default::default()
        };
        let line = encode_response(&response);
        let want = b"{\"loaded\":{\"binding\":2,\"doc\":{\"z\": 1,  \"a\": 12345678901234567890.000000000001}}}";
        assert_eq!(
            String::from_utf8_lossy(&line),
            String::from_utf8_lossy(want)
        );
        let loaded = decode_response(&line).unwrap().loaded.unwrap();
        assert_eq!(
            loaded.doc_json,
            b"{\"z\": 1,  \"a\": 12345678901234567890.000000000001}"
        );
    }

    #[test]
    fn bytes_that_are_not_json_are_written_as_a_string() {
        let response = cm::Response {
            loaded: Some(cm::response::Loaded {
                binding: 0,
                doc_json: b"not json".to_vec(),
            }),
            ..Default::default()
        };
        let value: Value = serde_json::from_slice(&encode_response(&response)).unwrap();
        assert_eq!(value, serde_json::json!({"loaded": {"doc": "not json"}}));
    }

    #[test]
    fn json_that_is_not_a_request_is_an_error_naming_it() {
        let err = decode_request(b"{\"load\": [1]}").unwrap_err();
        assert!(err.contains("materialize.Request"), "{err}");
        let err = decode_request(b"not json").unwrap_err();
        assert!(err.contains("not JSON"), "{err}");
    }
}
