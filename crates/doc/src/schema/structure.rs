//! The verdict of a schema that only says which types values have and which properties
//! objects hold (`type`, `properties`, `required`, `additionalProperties`, the items of
//! arrays, boolean schemas, and annotations such as `reduce` or `format`): what collection
//! schemas mostly are. Items are read in the schema's dialect ([`super::dialect`]): in
//! 2019-09 (Flow's, the default) `items` is one schema for every item or an array of
//! schemas for the first ones, `additionalItems` then covering the rest; in 2020-12 those
//! are `prefixItems` and `items`.
//!
//! jsonschema's generic validator costs ~900 instructions on the combine bench's
//! document; a walk of the document beside a tree of these few keywords ~650 (both sides
//! of an object are sorted by name, so properties pair up in one forward walk). Like the parser's fast path, this only decides valid or invalid:
//! reports of invalid documents still come from jsonschema, and a schema using any other
//! keyword anywhere is left to jsonschema whole ([`Structure::of`] is `None`). A property
//! test holds the verdicts equal to jsonschema's.

use super::Types;
use crate::compact::{Doc, Field, field_named, next_named};
use jsonschema::Draft;
use serde_json::Value;

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
    /// The schemas of the first items, in order.
    prefix: Box<[Structure]>,
    /// The schema of the items past `prefix` (`None`: any value).
    items: Option<Box<Structure>>,
}

#[derive(Debug)]
struct Property {
    name: Box<str>,
    schema: Structure,
    required: bool,
}

/// Keywords that never change a verdict. `format` is one in the two drafts read here, as
/// jsonschema is configured ([`super::validator_options`]).
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

/// The drafts whose keywords this reads as jsonschema does, with the `$schema` naming
/// each. (Others differ: draft 4 has no integer-valued floats, formats assert before
/// 2019-09.)
const DRAFTS: [(Draft, &str); 2] = [
    (
        Draft::Draft201909,
        "https://json-schema.org/draft/2019-09/schema",
    ),
    (
        Draft::Draft202012,
        "https://json-schema.org/draft/2020-12/schema",
    ),
];

impl Structure {
    fn any() -> Structure {
        Structure {
            types: Types::ALL.0,
            properties: Box::default(),
            required_listed: 0,
            required_unlisted: Box::default(),
            additional: None,
            prefix: Box::default(),
            items: None,
        }
    }

    /// The structure of a compiled (so well-formed) collection schema, or `None` if it, or
    /// any of its subschemas, uses a keyword this does not read, or its dialect is not one
    /// of [`DRAFTS`].
    pub(super) fn of(root: &Value) -> Option<Structure> {
        let draft = super::dialect(root);
        let (_, uri) = DRAFTS.iter().find(|(d, _)| *d == draft)?;
        Structure::read(root, draft, uri)
    }

    /// [`Structure::of`] a subschema read in `draft`, whose `$schema` is `uri`.
    fn read(schema: &Value, draft: Draft, uri: &str) -> Option<Structure> {
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
        let read = |schema: &Value| Structure::read(schema, draft, uri);
        let read_all = |schemas: &Value| -> Option<Box<[Structure]>> {
            schemas.as_array()?.iter().map(read).collect()
        };
        let draft2019 = draft == Draft::Draft201909;
        let tuple = draft2019 && keywords.get("items").is_some_and(Value::is_array);
        let mut structure = Structure::any();
        let (mut properties, mut required) = (Vec::new(), Vec::new());
        for (keyword, value) in keywords {
            match keyword.as_str() {
                "type" => structure.types = types_named(value)?,
                "properties" => {
                    for (name, schema) in value.as_object()? {
                        properties.push(Property {
                            name: name.as_str().into(),
                            schema: read(schema)?,
                            required: false,
                        });
                    }
                }
                "required" => {
                    for name in value.as_array()? {
                        required.push(name.as_str()?);
                    }
                }
                "additionalProperties" => structure.additional = Some(Box::new(read(value)?)),
                "items" if tuple => structure.prefix = read_all(value)?,
                "items" if !value.is_array() => structure.items = Some(Box::new(read(value)?)),
                "prefixItems" if !draft2019 => structure.prefix = read_all(value)?,
                // In 2019-09, the rest of a tuple; without one, no keyword at all.
                "additionalItems" if tuple => structure.items = Some(Box::new(read(value)?)),
                "additionalItems" if draft2019 => {}
                "$schema" if value.as_str()? == uri => {}
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
        let (first, rest) = items.split_at(self.prefix.len().min(items.len()));
        first
            .iter()
            .zip(&self.prefix)
            .all(|(item, schema)| schema.admits(item))
            && (self.items.as_deref())
                .is_none_or(|schema| rest.iter().all(|item| schema.admits(item)))
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
fn types_named(value: &Value) -> Option<u8> {
    let bits = |name: &Value| Some(Types::of_name(name.as_str()?)).filter(|&b| b != 0);
    match value {
        Value::Array(names) => names
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
            // Items in 2019-09, the default (formats are annotations there too) ...
            json!({"items": [{"type": "string"}], "additionalItems": {"type": "integer"}}),
            json!({"items": {"type": "string"}, "additionalItems": false}),
            json!({"$schema": "https://json-schema.org/draft/2019-09/schema", "format": "date"}),
            // ... and in 2020-12.
            json!({"$schema": "https://json-schema.org/draft/2020-12/schema",
                   "prefixItems": [{"type": "string"}], "items": false}),
        ];
        for schema in read {
            assert!(Structure::of(&schema).is_some(), "{schema}");
        }
        let left = [
            json!({"minimum": 1}),
            json!({"$schema": "http://json-schema.org/draft-07/schema#", "format": "date"}),
            json!({"$schema": "http://json-schema.org/draft-04/schema#"}),
            // Not keywords of the dialect: left to jsonschema, which ignores them.
            json!({"prefixItems": [{"type": "string"}]}),
            json!({"$schema": "https://json-schema.org/draft/2020-12/schema", "additionalItems": false}),
            // A nested `$schema` of another dialect.
            json!({"properties": {"a": {"$schema": "https://json-schema.org/draft/2020-12/schema"}}}),
            json!({"properties": {"a": {"properties": {"b": {"$ref": "#"}}}}}),
            json!({"additionalProperties": {"items": {"enum": [1]}}}),
            json!({"type": "object", "patternProperties": {"^x": true}}),
        ];
        for schema in left {
            assert!(Structure::of(&schema).is_none(), "{schema}");
        }
    }
}
