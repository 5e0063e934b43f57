//! A fetched message as a document: its value's JSON text, with the message's metadata
//! spliced in as text (no parse), its position for errors, and its share of the step
//! hash.
//!
//! With `meta: _meta`, a value `{"id":1}` becomes
//! `{"_meta":{"topic":"views","partition":2,"offset":17,"timestamp":1700000000000,"key":"k1","headers":{"h":"v"}},"id":1}`:
//! the timestamp in milliseconds since the Unix epoch, the key and header values as
//! strings when they are UTF-8, else base64 (standard alphabet, padded), a missing key
//! `null`. A value that is not a JSON object (its first non-blank byte is not `{`), and
//! a message without a value (a tombstone), are bad input reported at the message's
//! position; text after the `{` is not checked here: the combiner parses it.

use base64::Engine;
use rskafka::record::RecordAndOffset;
use sluice_source_sdk::{InputError, Position, Records, Step, StepHasher, Unit};
use std::collections::BTreeMap;
use std::sync::Arc;

/// How a source turns messages into documents.
pub(crate) struct Documents {
    topic: String,
    /// `"_meta":` as JSON text, or `None` for no metadata.
    meta_key: Option<Vec<u8>>,
    meta_name: Option<String>,
    /// `topic <t> partition <p>`, shared by the positions of a partition's messages.
    sources: BTreeMap<i32, Arc<str>>,
}

/// What one step (or replay) consumed so far.
#[derive(Default)]
pub(crate) struct Acc {
    pub records: usize,
    pub bytes: u64,
    pub errors: Vec<InputError>,
    pub hasher: StepHasher,
}

impl Acc {
    pub(crate) fn into_step(self, end_of_input: bool, resume: sluice_source_sdk::Resume) -> Step {
        Step {
            records: self.records,
            bytes: self.bytes,
            errors: self.errors,
            end_of_input,
            advances: false,
            unit_continues: false,
            resume,
        }
    }
}

impl Documents {
    pub(crate) fn new(topic: &str, meta: Option<&str>) -> Documents {
        Documents {
            topic: topic.to_string(),
            meta_key: meta.map(|name| {
                let mut key = serde_json::to_vec(name).expect("a string serializes");
                key.push(b':');
                key
            }),
            meta_name: meta.map(str::to_string),
            sources: BTreeMap::new(),
        }
    }

    pub(crate) fn position(&mut self, partition: i32, offset: i64) -> Position {
        let topic = &self.topic;
        let source = self
            .sources
            .entry(partition)
            .or_insert_with(|| format!("topic {topic} partition {partition}").into())
            .clone();
        Position::in_log(source, Unit::Offset, offset as u64, partition as u64)
    }

    /// Hashes the message and appends its document to `out` (or its error to `acc`).
    pub(crate) fn emit(
        &mut self,
        partition: i32,
        message: &RecordAndOffset,
        out: &mut Records,
        acc: &mut Acc,
    ) {
        hash(&mut acc.hasher, partition, message);
        let record = &message.record;
        let bytes = record.approximate_size();
        acc.bytes += bytes as u64;
        let position = self.position(partition, message.offset);
        let Some(value) = &record.value else {
            acc.errors.push(InputError::new(
                position,
                b"",
                "the message has no value (a tombstone), so it holds no document",
            ));
            return;
        };
        let Some(meta_key) = &self.meta_key else {
            out.push_json(value, position, bytes);
            acc.records += 1;
            return;
        };
        let open = value.iter().position(|b| !b.is_ascii_whitespace());
        let Some(open) = open.filter(|&i| value[i] == b'{') else {
            let name = self.meta_name.as_deref().unwrap_or_default();
            acc.errors.push(InputError::new(
                position,
                value,
                format!(
                    "the message value is not a JSON object, so its metadata cannot be \
                     added at /{name} (set meta: null to read any JSON value)"
                ),
            ));
            return;
        };
        let rest = &value[open + 1..];
        let empty = rest
            .iter()
            .find(|b| !b.is_ascii_whitespace())
            .is_some_and(|&b| b == b'}');
        out.push_json_with(position, |buf| {
            buf.push(b'{');
            buf.extend_from_slice(meta_key);
            write_meta(buf, &self.topic, partition, message);
            if !empty {
                buf.push(b',');
            }
            buf.extend_from_slice(rest);
        });
        acc.records += 1;
    }
}

/// The metadata object of a message as JSON text.
fn write_meta(buf: &mut Vec<u8>, topic: &str, partition: i32, message: &RecordAndOffset) {
    let record = &message.record;
    buf.extend_from_slice(b"{\"topic\":");
    write_string(buf, topic);
    buf.extend_from_slice(
        format!(
            ",\"partition\":{partition},\"offset\":{},\"timestamp\":{},\"key\":",
            message.offset,
            record.timestamp.timestamp_millis()
        )
        .as_bytes(),
    );
    match &record.key {
        Some(key) => write_bytes(buf, key),
        None => buf.extend_from_slice(b"null"),
    }
    buf.extend_from_slice(b",\"headers\":{");
    for (i, (name, value)) in record.headers.iter().enumerate() {
        if i > 0 {
            buf.push(b',');
        }
        write_string(buf, name);
        buf.push(b':');
        write_bytes(buf, value);
    }
    buf.extend_from_slice(b"}}");
}

fn write_string(buf: &mut Vec<u8>, s: &str) {
    serde_json::to_writer(buf, s).expect("a string serializes");
}

/// A JSON string: the bytes when UTF-8, else their base64.
fn write_bytes(buf: &mut Vec<u8>, bytes: &[u8]) {
    match std::str::from_utf8(bytes) {
        Ok(text) => write_string(buf, text),
        Err(_) => write_string(
            buf,
            &base64::engine::general_purpose::STANDARD.encode(bytes),
        ),
    }
}

/// Everything a document is made of, length-prefixed, so that a replay that reads
/// anything different (another key, value, header or timestamp) hashes differently.
fn hash(hasher: &mut StepHasher, partition: i32, message: &RecordAndOffset) {
    let record = &message.record;
    hasher.append(&partition.to_le_bytes());
    hasher.append(&message.offset.to_le_bytes());
    hasher.append(&record.timestamp.timestamp_millis().to_le_bytes());
    for part in [&record.key, &record.value] {
        match part {
            Some(bytes) => {
                hasher.append(&(bytes.len() as u64).to_le_bytes());
                hasher.append(bytes);
            }
            None => hasher.append(&u64::MAX.to_le_bytes()),
        }
    }
    hasher.append(&(record.headers.len() as u64).to_le_bytes());
    for (name, value) in &record.headers {
        hasher.append(&(name.len() as u64).to_le_bytes());
        hasher.append(name.as_bytes());
        hasher.append(&(value.len() as u64).to_le_bytes());
        hasher.append(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rskafka::chrono::DateTime;
    use rskafka::record::Record;
    use sluice_source_sdk::testing::texts;

    fn message(key: Option<&[u8]>, value: Option<&[u8]>) -> RecordAndOffset {
        RecordAndOffset {
            record: Record {
                key: key.map(<[u8]>::to_vec),
                value: value.map(<[u8]>::to_vec),
                headers: [
                    ("h".to_string(), b"v".to_vec()),
                    ("bin".to_string(), vec![0xff, 0]),
                ]
                .into(),
                timestamp: DateTime::from_timestamp_millis(1_700_000_000_123).unwrap(),
            },
            offset: 17,
        }
    }

    fn emit(meta: Option<&str>, message: &RecordAndOffset) -> (Vec<String>, Acc) {
        let mut documents = Documents::new("views", meta);
        let (mut out, mut acc) = (Records::default(), Acc::default());
        documents.emit(2, message, &mut out, &mut acc);
        (texts(&mut out), acc)
    }

    #[test]
    fn metadata_is_spliced_into_the_object() {
        let (docs, acc) = emit(Some("_meta"), &message(Some(b"k1"), Some(b" {\"id\":1}")));
        assert!(acc.errors.is_empty());
        let doc: serde_json::Value = serde_json::from_str(&docs[0]).unwrap();
        assert_eq!(
            doc,
            serde_json::json!({"id": 1, "_meta": {"topic": "views", "partition": 2,
                "offset": 17, "timestamp": 1_700_000_000_123i64, "key": "k1",
                "headers": {"h": "v", "bin": "/wA="}}})
        );
        let (docs, _) = emit(Some("m"), &message(Some(&[0xfe]), Some(b"{ }")));
        let doc: serde_json::Value = serde_json::from_str(&docs[0]).unwrap();
        assert_eq!(doc["m"]["key"], "/g==");
        assert_eq!(doc.as_object().unwrap().len(), 1);
        let (docs, _) = emit(Some("m"), &message(None, Some(b"{}")));
        let doc: serde_json::Value = serde_json::from_str(&docs[0]).unwrap();
        assert_eq!(doc["m"]["key"], serde_json::Value::Null);
    }

    #[test]
    fn without_meta_the_value_is_the_document() {
        let (docs, _) = emit(None, &message(Some(b"k"), Some(b"[1,2]")));
        assert_eq!(docs, vec!["[1,2]"]);
    }

    #[test]
    fn non_objects_and_tombstones_are_bad_input_at_their_offset() {
        for value in [Some(&b"[1]"[..]), Some(b""), None] {
            let (docs, acc) = emit(Some("_meta"), &message(None, value));
            assert!(docs.is_empty());
            assert_eq!(acc.errors.len(), 1);
            let error = acc.errors[0].to_string();
            assert!(
                error.starts_with("topic views partition 2 offset 17: "),
                "{error}"
            );
        }
    }

    #[test]
    fn the_hash_covers_key_value_headers_and_timestamp() {
        let base = message(Some(b"k"), Some(b"{}"));
        let hash_of = |m: &RecordAndOffset| {
            let mut h = StepHasher::new();
            hash(&mut h, 0, m);
            h.finish()
        };
        let mut changed = vec![base.clone(); 4];
        changed[0].record.key = None;
        changed[1].record.value = Some(b"{ }".to_vec());
        changed[2].record.headers.clear();
        changed[3].offset += 1;
        for other in &changed {
            assert_ne!(hash_of(&base), hash_of(other), "{other:?}");
        }
    }
}
