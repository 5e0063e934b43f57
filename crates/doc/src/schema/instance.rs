//! The compact [`Doc`] as an instance the JSON Schema validator reads directly.
//!
//! jsonschema's validators are generic over a JSON representation ([`Json`]); this is
//! ours, so a document is validated in the form the combiner keeps, with no
//! `serde_json::Value` built for it. Objects are `&[Field]` sorted by name, so a
//! property lookup is a binary search; numbers report through `serde_json::Number`
//! (built without allocating), as every representation does.
//!
//! Only cold paths convert to a `Value`: error reports and `enum`/`const`/`uniqueItems`
//! over containers.

use crate::compact::{Doc, Field, Str, field_named};
use jsonschema::json::{Array, Json, Node, NodeIdentity, Object, cmp};
use jsonschema::types::JsonType;
use serde_json::{Number, Value};
use std::borrow::Cow;

/// The compact document representation (see the module docs).
pub struct CompactJson;

impl Json for CompactJson {
    type Node<'a> = &'a Doc;
    type PreparedKey = Box<str>;
    type StringBuffer = ();

    // A lookup is a binary search comparing names with `memcmp`, like serde_json's
    // `BTreeMap`, so the same trade-off between a members pass and lookups applies.
    const KEYS_PER_LOOKUP: usize = 2;
    const ACYCLIC: bool = true;

    fn prepare_key(key: &str) -> Box<str> {
        key.into()
    }

    fn with_string_node<T>((): &mut (), string: &str, f: impl FnOnce(&Doc) -> T) -> T {
        f(&Doc::String(Str::new(string)))
    }
}

impl<'a> Node<'a, CompactJson> for &'a Doc {
    type Object = &'a [Field];
    type Array = &'a [Doc];
    type Number = Number;

    fn as_object(&self) -> Option<&'a [Field]> {
        match self {
            Doc::Object(fields) => Some(fields),
            _ => None,
        }
    }

    fn as_array(&self) -> Option<&'a [Doc]> {
        match self {
            Doc::Array(items) => Some(items),
            _ => None,
        }
    }

    fn as_string(&self) -> Option<Cow<'a, str>> {
        match self {
            Doc::String(s) => Some(Cow::Borrowed(s.as_str())),
            _ => None,
        }
    }

    fn as_number(&self) -> Option<Number> {
        Doc::as_number(self)
    }

    fn is_number(&self) -> bool {
        matches!(self, Doc::PosInt(_) | Doc::NegInt(_) | Doc::Float(_))
    }

    fn as_boolean(&self) -> Option<bool> {
        match self {
            Doc::Bool(b) => Some(*b),
            _ => None,
        }
    }

    fn is_null(&self) -> bool {
        matches!(self, Doc::Null)
    }

    fn json_type(&self) -> JsonType {
        match self {
            Doc::Null => JsonType::Null,
            Doc::Bool(_) => JsonType::Boolean,
            Doc::PosInt(_) | Doc::NegInt(_) | Doc::Float(_) => JsonType::Number,
            Doc::String(_) => JsonType::String,
            Doc::Array(_) => JsonType::Array,
            Doc::Object(_) => JsonType::Object,
        }
    }

    fn string_length(&self) -> Option<u64> {
        let Doc::String(s) = self else { return None };
        let s = s.as_str();
        // A code point starts at every byte that is not a UTF-8 continuation byte.
        Some(s.bytes().filter(|b| (b & 0xC0) != 0x80).count() as u64)
    }

    fn equals_value(&self, expected: &Value) -> bool {
        match (self, expected) {
            (Doc::String(s), Value::String(e)) => s.as_str() == e,
            (Doc::Bool(b), Value::Bool(e)) => b == e,
            (Doc::Null, Value::Null) => true,
            (Doc::PosInt(_) | Doc::NegInt(_) | Doc::Float(_), Value::Number(e)) => {
                Doc::as_number(self).is_some_and(|n| cmp::equal_numbers(&n, e))
            }
            (Doc::Array(_) | Doc::Object(_), Value::Array(_) | Value::Object(_)) => {
                cmp::equal(&self.to_value(), expected)
            }
            _ => false,
        }
    }

    fn to_value(&self) -> Cow<'a, Value> {
        Cow::Owned(Value::from((*self).clone()))
    }

    fn identity(&self) -> Option<NodeIdentity> {
        Some(NodeIdentity::new(std::ptr::from_ref::<Doc>(self) as usize))
    }
}

impl<'a> Object<'a, CompactJson> for &'a [Field] {
    type Node = &'a Doc;
    type MemberName = &'a str;
    type MembersIter = Members<'a>;

    fn len(&self) -> usize {
        <[Field]>::len(self)
    }

    fn get(&self, key: &Box<str>) -> Option<&'a Doc> {
        field_named(self, key).map(|field| &field.value)
    }

    fn members(&self) -> Members<'a> {
        Members(self.iter())
    }
}

/// An object's properties in name order, as the validator walks them.
pub struct Members<'a>(std::slice::Iter<'a, Field>);

impl<'a> Iterator for Members<'a> {
    type Item = (&'a str, &'a Doc);

    fn next(&mut self) -> Option<Self::Item> {
        self.0
            .next()
            .map(|field| (field.name.as_str(), &field.value))
    }
}

impl<'a> Array<'a, CompactJson> for &'a [Doc] {
    type Node = &'a Doc;
    type ElementsIter = std::slice::Iter<'a, Doc>;

    fn len(&self) -> usize {
        <[Doc]>::len(self)
    }

    fn elements(&self) -> std::slice::Iter<'a, Doc> {
        self.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::CompactJson;
    use crate::compact::Doc;
    use jsonschema::json::conformance;

    /// jsonschema's own check of a representation: lookups, code-point lengths, numeric
    /// equality across integer and float, node identities, string nodes.
    #[test]
    fn the_compact_document_meets_the_validators_contract() {
        let doc = Doc::from(conformance::document());
        conformance::assert_conformance::<CompactJson>(&&doc);
    }
}
