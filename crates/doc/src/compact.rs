//! A compact in-memory document: what the combiner keeps for each key.
//!
//! ```text
//!  Value::Object(BTreeMap)  ──From──▶  Doc::Object(Box<[Field { name, value }]>)  (sorted by name)
//!  Value::Array(Vec)        ──From──▶  Doc::Array(Box<[Doc]>)
//!  Value::Number(n)         ──From──▶  Doc::PosInt(u64) | Doc::NegInt(i64) | Doc::Float(f64)
//!  Value::String(String)    ──From──▶  Doc::String(Box<str>)          (moved, not copied)
//! ```
//!
//! Why: a parsed `serde_json::Value` object is a `BTreeMap` whose every node is a ~640-byte
//! block, even for two properties, so a 150-byte document costs ~1.8 KiB. A `Doc` is 24
//! bytes, an object one exact-size block of 40-byte fields, so the same document costs
//! ~600 bytes and far fewer cache lines.
//!
//! Invariants:
//! - An object's fields are sorted by name (byte order, as `serde_json::Map` iterates
//!   them) and names are unique, so two objects merge by walking both in tandem.
//! - Numbers keep serde_json's own classes: `PosInt` for integers ≥ 0 that fit a `u64`,
//!   `NegInt` for negative integers that fit an `i64`, `Float` (always finite) for the
//!   rest, so `Value → Doc → Value` is the identity, numbers included.

use serde_json::{Map, Number, Value};

/// One JSON value in its compact form. See the module docs.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Doc {
    #[default]
    Null,
    Bool(bool),
    PosInt(u64),
    NegInt(i64),
    Float(f64),
    String(Box<str>),
    Array(Box<[Doc]>),
    /// Sorted by name, names unique.
    Object(Box<[Field]>),
}

/// One property of a compact object.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    pub name: Box<str>,
    pub value: Doc,
}

impl Doc {
    /// The number this is, as serde_json's `Number` (no allocation).
    pub fn as_number(&self) -> Option<Number> {
        match *self {
            Doc::PosInt(n) => Some(n.into()),
            Doc::NegInt(n) => Some(n.into()),
            Doc::Float(f) => Number::from_f64(f),
            _ => None,
        }
    }

    /// The compact form of a number, in serde_json's classes (see the module invariants).
    pub fn from_number(n: &Number) -> Doc {
        if let Some(u) = n.as_u64() {
            Doc::PosInt(u)
        } else if let Some(i) = n.as_i64() {
            Doc::NegInt(i)
        } else {
            // Without `arbitrary_precision`, every other Number is a finite f64.
            Doc::Float(n.as_f64().unwrap_or_default())
        }
    }
}

impl From<Value> for Doc {
    /// Moves the strings and property names of `value` (a `String` of exact capacity, as
    /// serde_json parses them, becomes a `Box<str>` without copying).
    fn from(value: Value) -> Doc {
        match value {
            Value::Null => Doc::Null,
            Value::Bool(b) => Doc::Bool(b),
            Value::Number(n) => Doc::from_number(&n),
            Value::String(s) => Doc::String(s.into_boxed_str()),
            Value::Array(items) => Doc::Array(items.into_iter().map(Doc::from).collect()),
            Value::Object(map) => Doc::Object(
                map.into_iter()
                    .map(|(name, value)| Field {
                        name: name.into_boxed_str(),
                        value: Doc::from(value),
                    })
                    .collect(),
            ),
        }
    }
}

impl From<&Value> for Doc {
    fn from(value: &Value) -> Doc {
        match value {
            Value::Null => Doc::Null,
            Value::Bool(b) => Doc::Bool(*b),
            Value::Number(n) => Doc::from_number(n),
            Value::String(s) => Doc::String(s.as_str().into()),
            Value::Array(items) => Doc::Array(items.iter().map(Doc::from).collect()),
            Value::Object(map) => Doc::Object(
                map.iter()
                    .map(|(name, value)| Field {
                        name: name.as_str().into(),
                        value: Doc::from(value),
                    })
                    .collect(),
            ),
        }
    }
}

impl From<Doc> for Value {
    fn from(doc: Doc) -> Value {
        match doc {
            Doc::Null => Value::Null,
            Doc::Bool(b) => Value::Bool(b),
            Doc::PosInt(n) => Value::Number(n.into()),
            Doc::NegInt(n) => Value::Number(n.into()),
            Doc::Float(f) => Number::from_f64(f).map_or(Value::Null, Value::Number),
            Doc::String(s) => Value::String(s.into_string()),
            Doc::Array(items) => {
                Value::Array(items.into_vec().into_iter().map(Value::from).collect())
            }
            Doc::Object(fields) => Value::Object(
                fields
                    .into_vec()
                    .into_iter()
                    .map(|field| (field.name.into_string(), Value::from(field.value)))
                    .collect::<Map<String, Value>>(),
            ),
        }
    }
}
