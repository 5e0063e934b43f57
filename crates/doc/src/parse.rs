//! Parsing JSON text into a reused `serde_json::Value`, without allocating when the new
//! document has the shape of the previous one.
//!
//! ```text
//!  bytes ──serde_json tokenizer──▶ InPlace visitor ──▶ the Value it held, overwritten:
//!    object: each property found in the old map is parsed into its old slot; new ones are
//!            inserted after the object ends; properties the text lacks are removed
//!    array:  items parsed into the old slots, extra slots truncated
//!    string: cleared and refilled (keeps its capacity)
//! ```
//!
//! A source of same-shaped documents (every line of one collection) then parses with no
//! allocation at all: no `BTreeMap` node, no key, no string. That is most of the cost of
//! `serde_json::from_slice::<Value>` on small documents.
//!
//! Postcondition: after `parse_into` returns `Ok`, `value` equals
//! `serde_json::from_slice::<Value>(bytes)` whatever it held before (duplicate
//! properties: the last one wins, as in serde_json). After an error `value` is unspecified
//! but still a valid `Value` that the next call overwrites.

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};
use std::borrow::Cow;
use std::fmt;

/// Objects with more properties than this are rebuilt rather than reused: the slots seen
/// are tracked in a fixed array of this size.
const REUSED_PROPERTIES: usize = 16;

/// Parses the JSON text `bytes` into `value`, reusing its allocations (see module docs).
///
/// The text is checked to be UTF-8 once, whole (fast, vectorized), so the tokenizer can
/// read it as a `str` instead of validating every string it contains on its own; text
/// that is not UTF-8 goes through the byte reader for serde_json's own error.
pub fn parse_into(bytes: &[u8], value: &mut Value) -> Result<(), serde_json::Error> {
    match std::str::from_utf8(bytes) {
        Ok(text) => parse_with(serde_json::Deserializer::from_str(text), value),
        Err(_) => parse_with(serde_json::Deserializer::from_slice(bytes), value),
    }
}

fn parse_with<'de, R: serde_json::de::Read<'de>>(
    mut de: serde_json::Deserializer<R>,
    value: &mut Value,
) -> Result<(), serde_json::Error> {
    InPlace(value).deserialize(&mut de)?;
    de.end()
}

struct InPlace<'v>(&'v mut Value);

impl<'de> DeserializeSeed<'de> for InPlace<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<(), D::Error> {
        de.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for InPlace<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, b: bool) -> Result<(), E> {
        *self.0 = Value::Bool(b);
        Ok(())
    }

    fn visit_u64<E>(self, n: u64) -> Result<(), E> {
        *self.0 = Value::Number(n.into());
        Ok(())
    }

    fn visit_i64<E>(self, n: i64) -> Result<(), E> {
        *self.0 = Value::Number(n.into());
        Ok(())
    }

    fn visit_f64<E>(self, f: f64) -> Result<(), E> {
        *self.0 = Number::from_f64(f).map_or(Value::Null, Value::Number);
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        *self.0 = Value::Null;
        Ok(())
    }

    fn visit_str<E>(self, s: &str) -> Result<(), E> {
        match self.0 {
            Value::String(old) => {
                old.clear();
                old.push_str(s);
            }
            other => *other = Value::String(s.to_owned()),
        }
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        if !self.0.is_array() {
            *self.0 = Value::Array(Vec::new());
        }
        let Value::Array(items) = self.0 else {
            unreachable!("made an array above")
        };
        let mut len = 0;
        loop {
            if len == items.len() {
                items.push(Value::Null);
            }
            if seq.next_element_seed(InPlace(&mut items[len]))?.is_none() {
                break;
            }
            len += 1;
        }
        items.truncate(len);
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<(), A::Error> {
        if !self.0.is_object() {
            *self.0 = Value::Object(Map::new());
        }
        let Value::Object(map) = self.0 else {
            unreachable!("made an object above")
        };
        if map.len() > REUSED_PROPERTIES {
            map.clear();
        }
        // The slots reused so far, by address: no insertion happens before the loop ends,
        // so they stay put, and a repeated property is counted once.
        let mut seen = [std::ptr::null::<Value>(); REUSED_PROPERTIES];
        let mut seen_len = 0;
        let mut added: Vec<(String, Value)> = Vec::new();
        while let Some(name) = access.next_key_seed(Name)? {
            match map.get_mut(name.as_ref()) {
                Some(slot) => {
                    let at = &raw const *slot;
                    if !seen[..seen_len].contains(&at) {
                        seen[seen_len] = at;
                        seen_len += 1;
                    }
                    access.next_value_seed(InPlace(slot))?;
                }
                None => {
                    let mut value = Value::Null;
                    access.next_value_seed(InPlace(&mut value))?;
                    added.push((name.into_owned(), value));
                }
            }
        }
        if seen_len < map.len() {
            // Found by address before removing anything: removal shifts the slots.
            let seen = &seen[..seen_len];
            let stale: Vec<String> = (map.iter())
                .filter(|(_, slot)| !seen.contains(&(&raw const **slot)))
                .map(|(name, _)| name.clone())
                .collect();
            for name in stale {
                map.remove(&name);
            }
        }
        // In text order, so a repeated new property keeps its last value.
        for (name, value) in added {
            map.insert(name, value);
        }
        Ok(())
    }
}

/// A property name, borrowed from the input when it has no escapes.
struct Name;

impl<'de> DeserializeSeed<'de> for Name {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, de: D) -> Result<Cow<'de, str>, D::Error> {
        de.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for Name {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a property name")
    }

    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(s))
    }

    fn visit_str<E>(self, s: &str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(s.to_owned()))
    }

    fn visit_string<E>(self, s: String) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(s))
    }
}
