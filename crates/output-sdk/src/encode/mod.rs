//! Changes to messages: a binding's [`Format`] turns each [`Change`] into one or more
//! messages (a key and a value) appended to a [`Buffer`], which numbers them within
//! their transaction.
//!
//! | format | value of a message | an update is |
//! |---|---|---|
//! | `json` | Feldera's `insert_delete`: `{"insert": doc}` or `{"delete": doc}` | a delete of the old document, then an insert of the new |
//! | `debezium` | `{"before", "after", "op": c/u/d/r, "source": {"connector", "materialization", "txn"}}` | one message |
//! | `csv` | one row: the selected fields, then `_op` (`insert` or `delete`) | two rows, as `json` |
//! | `avro` | the selected fields and `_op` as an Avro record (optionally in Confluent's framing) | two records, as `json` |
//!
//! Keys are encoded apart from values: a JSON object of the key fields (an Avro record
//! of them for `avro`).

mod avro;
mod csv;
mod json;

pub use avro::schemas as avro_schemas;
pub use csv::read_row as read_csv_row;

use crate::change::Change;
use crate::{OutputError, Result};
use serde::Deserialize;
use serde_json::Value;
use sluice_driver_sdk::flow::{self, materialization_spec::Binding};
use sluice_sink_sdk::arrow::ColumnKind;
use std::collections::HashMap;
use std::ops::Range;

/// How a binding's changes are encoded.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Format {
    #[default]
    Json,
    Debezium,
    Csv,
    Avro,
}

impl Format {
    /// The file name extension of a file of this format.
    pub fn extension(self) -> &'static str {
        match self {
            Format::Json | Format::Debezium => "jsonl",
            Format::Csv => "csv",
            Format::Avro => "avro",
        }
    }

    /// Whether each message ends with a newline, so that messages written back to back
    /// make a file of lines.
    pub fn is_line_oriented(self) -> bool {
        !matches!(self, Format::Avro)
    }
}

/// The encoding settings of a binding's resource (beside its destination).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Encoding {
    #[serde(default)]
    pub format: Format,
    /// Avro only: frame each value in Confluent's wire format with this schema id.
    #[serde(default)]
    pub schema_id: Option<u32>,
    /// Avro only: frame each key in Confluent's wire format with this schema id.
    #[serde(default)]
    pub key_schema_id: Option<u32>,
}

/// One selected field of a binding.
#[derive(Debug, Clone)]
pub struct Field {
    pub name: String,
    /// Its JSON pointer in the document.
    pub ptr: String,
    pub kind: ColumnKind,
    pub nullable: bool,
}

impl Field {
    /// Its value in `doc` (`None`: absent).
    pub fn get<'v>(&self, doc: &'v Value) -> Option<&'v Value> {
        if self.ptr.is_empty() {
            Some(doc)
        } else {
            doc.pointer(&self.ptr)
        }
    }
}

/// What an encoder knows of its binding.
#[derive(Debug, Clone)]
pub struct Fields {
    pub materialization: String,
    /// The binding's name for schemas (its resource path, joined).
    pub name: String,
    pub keys: Vec<Field>,
    /// The other selected fields, the document's own field excluded.
    pub values: Vec<Field>,
}

impl Fields {
    /// The selected fields of `binding` of `materialization`.
    pub fn of(materialization: &str, binding: &Binding) -> Result<Fields> {
        let collection = binding.collection.as_ref();
        let projections: HashMap<&str, &flow::Projection> = collection
            .map(|c| {
                c.projections
                    .iter()
                    .map(|p| (p.field.as_str(), p))
                    .collect()
            })
            .unwrap_or_default();
        let selection = binding.field_selection.clone().unwrap_or_default();
        let field = |name: &String, is_key: bool| -> Result<Field> {
            let projection = projections.get(name.as_str()).ok_or_else(|| {
                OutputError::Config(format!("field {name:?} is selected but has no projection"))
            })?;
            let inference = projection.inference.clone().unwrap_or_default();
            Ok(Field {
                name: name.clone(),
                ptr: projection.ptr.clone(),
                kind: ColumnKind::infer(&inference.types),
                nullable: !is_key
                    && (!inference.must_exist || inference.types.iter().any(|t| t == "null")),
            })
        };
        Ok(Fields {
            materialization: materialization.to_string(),
            name: binding.resource_path.join("."),
            keys: (selection.keys.iter())
                .map(|k| field(k, true))
                .collect::<Result<_>>()?,
            values: (selection.values.iter())
                .map(|v| field(v, false))
                .collect::<Result<_>>()?,
        })
    }

    /// The keys, then the values.
    pub fn all(&self) -> impl Iterator<Item = &Field> {
        self.keys.iter().chain(&self.values)
    }

    /// The key of `doc` as a JSON object of the key fields, appended to `out`.
    pub fn write_json_key(&self, doc: &Value, out: &mut Vec<u8>) {
        out.push(b'{');
        for (i, key) in self.keys.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            write_json(&Value::String(key.name.clone()), out);
            out.push(b':');
            write_json(key.get(doc).unwrap_or(&Value::Null), out);
        }
        out.push(b'}');
    }
}

fn write_json(value: &Value, out: &mut Vec<u8>) {
    serde_json::to_writer(out, value).expect("writing JSON to a Vec cannot fail");
}

/// Turns a binding's changes into messages.
pub trait Encoder: Send {
    /// What a file of this format starts with (a CSV header line).
    fn header(&self) -> Option<Vec<u8>> {
        None
    }

    /// Appends the messages of `change` to `out`.
    fn encode(&mut self, change: &Change<'_>, out: &mut Buffer) -> Result<()>;
}

/// The encoder of `encoding` for a binding of `fields`.
pub fn encoder(encoding: &Encoding, fields: Fields) -> Result<Box<dyn Encoder>> {
    if encoding.format != Format::Avro
        && (encoding.schema_id.is_some() || encoding.key_schema_id.is_some())
    {
        return Err(OutputError::Config(
            "schema_id and key_schema_id are for format avro only".into(),
        ));
    }
    Ok(match encoding.format {
        Format::Json => Box::new(json::InsertDelete::new(fields)),
        Format::Debezium => Box::new(json::Debezium::new(fields)),
        Format::Csv => Box::new(csv::Csv::new(fields)),
        Format::Avro => Box::new(avro::Avro::new(
            fields,
            encoding.schema_id,
            encoding.key_schema_id,
        )?),
    })
}

/// A message of a batch: its transaction, its index within the transaction's batch,
/// its document's packed key, its key and its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message<'a> {
    pub txn: u64,
    pub index: u64,
    /// The key of the document it is a change of, packed as the runtime packs keys;
    /// empty for messages pushed with no change begun.
    pub packed_key: &'a [u8],
    pub key: &'a [u8],
    pub value: &'a [u8],
}

impl Message<'_> {
    /// The key hash of the document it is a change of: [`sluice_doc::key_hash`] of the
    /// packed key, the hash the runtime routes documents and ranges shards by (what a
    /// key-range partitioner places it by). Hashed at each call, as only such a
    /// partitioner asks: the other outputs do not pay for it.
    pub fn key_hash(&self) -> u32 {
        sluice_doc::key_hash(self.packed_key)
    }
}

#[derive(Debug, Clone)]
struct Span {
    key_end: usize,
    value_end: usize,
    /// Its change's packed key in [`Buffer::packed_keys`].
    packed_key: Range<usize>,
}

/// Encoded messages of one transaction's batch, numbered from 0 across the pushes of
/// the batch.
#[derive(Debug, Default)]
pub struct Buffer {
    txn: u64,
    data: Vec<u8>,
    spans: Vec<Span>,
    /// The index of the first message held.
    first_index: u64,
    /// The packed keys of the changes of the messages held, back to back, and of the
    /// change being encoded ([`Buffer::begin_change`]), at `change`.
    packed_keys: Vec<u8>,
    change: Range<usize>,
}

impl Buffer {
    /// Starts transaction `txn`'s batch: empty, numbering from 0.
    pub fn start(&mut self, txn: u64) {
        self.txn = txn;
        self.data.clear();
        self.spans.clear();
        self.first_index = 0;
        self.packed_keys.clear();
        self.change = 0..0;
    }

    /// Begins the change of the document whose key is packed as `packed_key` (the
    /// runtime's packing): the messages pushed until the next change carry it. Kept
    /// once per change, whatever number of messages its format makes of it.
    pub fn begin_change(&mut self, packed_key: &[u8]) {
        // The key of a change that made no message is not kept.
        let used = self.spans.last().map_or(0, |span| span.packed_key.end);
        self.packed_keys.truncate(used);
        self.packed_keys.extend_from_slice(packed_key);
        self.change = used..self.packed_keys.len();
    }

    /// Appends a message of the change begun last.
    pub fn push(&mut self, key: &[u8], value: &[u8]) {
        self.data.extend_from_slice(key);
        let key_end = self.data.len();
        self.data.extend_from_slice(value);
        self.spans.push(Span {
            key_end,
            value_end: self.data.len(),
            packed_key: self.change.clone(),
        });
    }

    /// Bytes of keys and values held.
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    pub fn txn(&self) -> u64 {
        self.txn
    }

    /// The messages held, in order.
    pub fn messages(&self) -> impl ExactSizeIterator<Item = Message<'_>> + '_ {
        let mut start = 0;
        self.spans.iter().enumerate().map(move |(i, span)| {
            let message = Message {
                txn: self.txn,
                index: self.first_index + i as u64,
                packed_key: &self.packed_keys[span.packed_key.clone()],
                key: &self.data[start..span.key_end],
                value: &self.data[span.key_end..span.value_end],
            };
            start = span.value_end;
            message
        })
    }

    /// Forgets the messages held (they were pushed); numbering goes on, as does the
    /// change being encoded.
    pub fn pushed(&mut self) {
        self.first_index += self.spans.len() as u64;
        self.data.clear();
        self.spans.clear();
        self.packed_keys.drain(..self.change.start);
        self.change = 0..self.packed_keys.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_numbered_across_pushes() {
        let mut buffer = Buffer::default();
        buffer.start(7);
        buffer.begin_change(b"packed");
        buffer.push(b"k1", b"v1");
        buffer.push(b"", b"v2");
        let got: Vec<_> = buffer.messages().collect();
        assert_eq!(
            got[0],
            Message {
                txn: 7,
                index: 0,
                packed_key: b"packed",
                key: b"k1",
                value: b"v1"
            }
        );
        assert_eq!(
            got[1],
            Message {
                txn: 7,
                index: 1,
                packed_key: b"packed",
                key: b"",
                value: b"v2"
            }
        );
        assert_eq!(got[0].key_hash(), sluice_doc::key_hash(b"packed"));
        buffer.pushed();
        assert!(buffer.is_empty());
        buffer.push(b"k3", b"v3");
        let third = buffer.messages().next().unwrap();
        assert_eq!((third.index, third.packed_key), (2, &b"packed"[..]));
        // A change without messages, then one with.
        buffer.begin_change(b"none");
        buffer.begin_change(b"next");
        buffer.push(b"k4", b"v4");
        let keys: Vec<&[u8]> = buffer.messages().map(|m| m.packed_key).collect();
        assert_eq!(keys, [&b"packed"[..], b"next"]);
        buffer.start(8);
        buffer.push(b"k", b"v");
        let first = buffer.messages().next().unwrap();
        assert_eq!(
            (first.index, first.packed_key),
            (0, &b""[..]),
            "a new batch, no change begun"
        );
        assert_eq!(buffer.txn(), 8);
    }
}
