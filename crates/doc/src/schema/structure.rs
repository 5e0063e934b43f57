//! The verdict of a schema that only says which types values have and which properties
//! objects hold (`type`, `properties`, `required`, `additionalProperties`, object-form
//! `items`, boolean schemas, and annotations such as `reduce` or `format`; draft
//! 2020-12): what collection schemas mostly are.
//!
//! jsonschema's generic validator costs ~900 instructions on the combine bench's
//! document; a walk of the document beside a tree of these few keywords ~650 (both sides
//! of an object are sorted by name, so properties pair up in one forward walk). Like the parser's fast path, this only decides valid or invalid:
//! reports of invalid documents still come from jsonschema, and a schema using any other
//! keyword anywhere is left to jsonschema whole ([`Structure::of`] is `None`). A property
//! test holds the verdicts equal to jsonschema's.

use super::Types;
use crate::compact::{Doc, Field, field_named, next_named};

/// A schema (or subschema) of the narrow kind described in the module docs.
#[derive(Debug)]
pub(super) struct Structure {
    /// [`Types`] bits a value may have (all of them without a `type` keyword; none for
    /// the `false` schema).
    types: u8,
    /// `properties`, sorted by name as a document's fields are.
    properties: Box<[Property]>,
    /// How many of `properties` are `required`: the walk counts them as it meets them.
    required_listed: usize,
    /// The `required` names `properties` does not list, looked up one by one.
    required_unlisted: Box<[Box<str>]>,
    /// `additionalProperties`: the schema of unlisted properties (`None`: any value).
    additional: Option<Box<Structure>>,
    /// `items` (`None`: any value).
    items: Option<Box<Structure>>,
}

#[derive(Debug)]
struct Property {
    name: Box<str>,
    schema: Structure,
    required: bool,
}

/// Keywords that never change a verdict. `format` is one in draft 2020-12 as jsonschema
/// is configured here (an option would make it assert; [`DRAFT`] excludes the drafts
/// whose dialects may).
const ANNOTATIONS: [&str; 10] = [
    "reduce",
    "format",
    "title",
    "description",
    "default",
    "examples",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
];

/// The draft whose keywords this reads as jsonschema does; the default, without
/// `$schema`. (Others differ: draft 4 has no integer-valued floats, `items` is an array
/// before 2020-12, formats may assert in 2019-09.)
const DRAFT: &str = "https://json-schema.org/draft/2020-12/schema";

impl Structure {
    fn any() -> Structure {
        Structure {
            types: Types::ALL.0,
            properties: Box::default(),
            required_listed: 0,
            required_unlisted: Box::default(),
            additional: None,
            items: None,
        }
    }

    /// The structure of a compiled (so well-formed) schema, or `None` if it, or any of
    /// its subschemas, uses a keyword this does not read.
    pub(super) fn of(schema: &serde_json::Value) -> Option<Structure> {
        use serde_json::Value;
        let keywords = match schema {
            Value::Bool(true) => return Some(Structure::any()),
            Value::Bool(false) => {
                return Some(Structure {
                    types: 0,
                    ..Structure::any()
                });
            }
            Value::Object(keywords) => keywords,
            _ => return None,
        };
        let mut structure = Structure::any();
        let (mut properties, mut required) = (Vec::new(), Vec::new());
        for (keyword, value) in keywords {
            match keyword.as_str() {
                "type" => structure.types = types_named(value)?,
                "properties" => {
                    for (name, schema) in value.as_object()? {
                        properties.push(Property {
                            name: name.as_str().into(),
                            schema: Structure::of(schema)?,
                            required: false,
                        });
                    }
                }
                "required" => {
                    for name in value.as_array()? {
                        required.push(name.as_str()?);
                    }
                }
                "additionalProperties" => {
                    structure.additional = Some(Box::new(Structure::of(value)?));
                }
                "items" if !value.is_array() => {
                    structure.items = Some(Box::new(Structure::of(value)?));
                }
                "$schema" if value.as_str()? == DRAFT => {}
                annotation if ANNOTATIONS.contains(&annotation) => {}
                _ => return None,
            }
        }
        required.sort_unstable();
        required.dedup();
        for property in &mut properties {
            property.required = required.contains(&&*property.name);
        }
        properties.sort_unstable_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
        structure.required_listed = properties.iter().filter(|p| p.required).count();
        structure.required_unlisted = (required.into_iter())
            .filter(|name| !properties.iter().any(|p| &*p.name == *name))
            .map(Box::from)
            .collect();
        structure.properties = properties.into();
        Some(structure)
    }

    /// Whether `doc` is valid against this schema. Inline: most values are scalars, whose
    /// check is their type's bit; containers are walked out of line.
    #[inline]
    pub(super) fn admits(&self, doc: &Doc) -> bool {
        self.types & types_of(doc) != 0
            && match doc {
                Doc::Object(fields) => self.admits_fields(fields),
                Doc::Array(items) => self.admits_items(items),
                _ => true,
            }
    }

    #[inline(never)]
    fn admits_items(&self, items: &[Doc]) -> bool {
        (self.items.as_deref()).is_none_or(|schema| items.iter().all(|item| schema.admits(item)))
    }

    #[inline(never)]
    fn admits_fields(&self, fields: &[Field]) -> bool {
        let mut listed = self.properties.iter().peekable();
        let mut required = 0;
        let all_admitted = fields.iter().all(|field| {
            let name = field.name.as_bytes();
            let schema = match next_named(&mut listed, name, |p| p.name.as_bytes()) {
                Some(property) => {
                    required += usize::from(property.required);
                    Some(&property.schema)
                }
                None => self.additional.as_deref(),
            };
            schema.is_none_or(|schema| schema.admits(&field.value))
        });
        all_admitted
            && required == self.required_listed
            && (self.required_unlisted.iter()).all(|name| field_named(fields, name).is_some())
    }
}

/// The [`Types`] bits of a `type` keyword's value.
fn types_named(value: &serde_json::Value) -> Option<u8> {
    let bits = |name: &serde_json::Value| Some(Types::of_name(name.as_str()?)).filter(|&b| b != 0);
    match value {
        serde_json::Value::Array(names) => names
            .iter()
            .try_fold(0, |all, name| Some(all | bits(name)?)),
        name => bits(name),
    }
}

/// The [`Types`] bits of a value: a float with no fraction is an integer too, as JSON
/// Schema (and jsonschema) has it.
fn types_of(doc: &Doc) -> u8 {
    match doc {
        Doc::Null => Types::NULL,
        Doc::Bool(_) => Types::BOOLEAN,
        Doc::PosInt(_) | Doc::NegInt(_) => Types::INTEGER,
        Doc::Float(f) if f.fract() == 0.0 => Types::INTEGER | Types::FRACTIONAL,
        Doc::Float(_) => Types::FRACTIONAL,
        Doc::String(_) => Types::STRING,
        Doc::Array(_) => Types::ARRAY,
        Doc::Object(_) => Types::OBJECT,
    }
}

#[cfg(test)]
mod tests {
    use super::Structure;
    use serde_json::json;

    /// Only schemas made of the keywords read here have a structure; one other keyword,
    /// however deep, leaves the whole schema to jsonschema.
    #[test]
    fn only_schemas_of_the_read_keywords_have_a_structure() {
        let read = [
            json!(true),
            json!(false),
            json!({}),
            json!({"type": ["string", "null"], "title": "t", "reduce": {"strategy": "sum"}}),
            json!({"type": "string", "format": "date-time"}),
            json!({"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
                   "required": ["a"], "properties": {"a": {"items": {"type": "integer"}}},
                   "additionalProperties": false}),
        ];
        for schema in read {
            assert!(Structure::of(&schema).is_some(), "{schema}");
        }
        let left = [
            json!({"minimum": 1}),
            json!({"$schema": "https://json-schema.org/draft/2019-09/schema", "format": "date"}),
            json!({"items": [{"type": "string"}]}),
            json!({"$schema": "http://json-schema.org/draft-04/schema#"}),
            json!({"properties": {"a": {"properties": {"b": {"$ref": "#"}}}}}),
            json!({"additionalProperties": {"items": {"enum": [1]}}}),
            json!({"type": "object", "patternProperties": {"^x": true}}),
        ];
        for schema in left {
            assert!(Structure::of(&schema).is_none(), "{schema}");
        }
    }
}
