//! Collection schemas: validation, reduction annotations and type inference.
//!
//! ```text
//!  schema JSON ──compile──▶ Schema { validator (jsonschema over Doc), reducer (reduce::build), source }
//!  document (Doc) ──validate_doc──▶ Ok | ValidationError { pointer, reason }
//!  pointer ──inference──▶ Inference { types, must_exist, format, default }
//! ```
//!
//! `validate_doc` is on the hot path (every document read from a source): it asks for a
//! verdict only, from a walk beside the schema's [`structure`] where the schema is made of
//! types and properties alone, else from the validator's boolean fast path over the
//! compact document itself ([`instance`]); only an invalid document has its errors walked
//! by the validator. `validate` of a `Value` converts first.
//!
//! Inference walks the schema source along the pointer. Conjunctions (the schema's own
//! keywords, a local `$ref`, `allOf`) intersect types and any of them requiring the
//! location makes it exist; disjunctions (`anyOf`, `oneOf`) unite types and a location
//! exists only if every branch requires it. A `format` or `default` is the first a
//! conjunction gives, and a disjunction's only if all its branches agree. Child schemas of a property are
//! `properties` and matching `patternProperties`, else `additionalProperties`; of an
//! array index, in the schema's dialect ([`dialect`]: 2019-09 unless `$schema` says
//! otherwise, as Flow reads schemas), array-form `items` else `additionalItems`, or
//! object-form `items` (2020-12: `prefixItems`, else `items`). Following `$ref`
//! stops after [`REF_DEPTH_LIMIT`] hops, which only a cyclic schema reaches.

pub(crate) mod condition;
mod instance;
mod structure;

use crate::compact::Doc;
use crate::reduce::build;
use crate::{Pointer, Reducer};
use instance::CompactJson;
use jsonschema::Draft;
use jsonschema::error::ValidationErrorKind;
use regex::Regex;
use serde_json::{Map, Value};
use structure::Structure;

#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    /// The JSON Schema itself does not compile.
    #[error("invalid schema: {0}")]
    Invalid(String),
    /// A `reduce` annotation (or what it depends on) is malformed.
    #[error("invalid reduce annotation at {location}: {reason}")]
    Reduce { location: String, reason: String },
}

#[derive(Debug, thiserror::Error)]
#[error("document is invalid at {}: {reason}", if .pointer.is_empty() { "the document root" } else { .pointer.as_str() })]
pub struct ValidationError {
    /// JSON pointer of the offending location in the document (`""` for the root).
    pub pointer: String,
    pub reason: String,
}

/// A type inferred for one location of the schema, for drivers choosing column types.
#[derive(Debug, Clone, PartialEq)]
pub struct Inference {
    /// JSON types possible here: "null", "boolean", "integer", "number", "string", "array", "object".
    pub types: Vec<String>,
    /// The location always exists (required all the way from the root).
    pub must_exist: bool,
    /// The `format` of a string, e.g. "date-time".
    pub format: Option<String>,
    /// The schema's `default` here: what a key location a document lacks packs as. Like
    /// Flow's, it does not make the location exist (only `required` does).
    pub default: Option<Value>,
}

/// A compiled collection schema: validator, reductions, inference.
pub struct Schema {
    reducer: Reducer,
    validator: jsonschema::Validator<CompactJson>,
    /// The verdict's fast path, for schemas that only constrain types and properties.
    structure: Option<Structure>,
    source: Value,
}

impl std::fmt::Debug for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schema")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// The draft a collection schema is read in: the one its `$schema` declares, else 2019-09,
/// as Flow reads schemas (so array-form `items` and `additionalItems` mean what they mean
/// there). `Draft::Unknown` for a custom meta-schema, which jsonschema resolves itself.
pub(crate) fn dialect(root: &Value) -> Draft {
    Draft::Draft201909.detect(root)
}

/// The options every validator of a collection schema compiles with: the whole schema's,
/// and those of the subschemas that reductions test against a document's values. One
/// place decides the dialect a schema is read in, so both always agree. `format` is left
/// as jsonschema reads each draft: an annotation in 2019-09 and 2020-12 (so the fast path,
/// [`structure`], skips it), an assertion in the older drafts a `$schema` may declare.
/// (Flow asserts formats, of its own set; Sluice does not yet.)
pub(crate) fn validator_options<'i>(
    root: &Value,
) -> jsonschema::ValidationOptions<'i, std::sync::Arc<dyn jsonschema::Retrieve>, CompactJson> {
    let options = jsonschema::options_for::<CompactJson>();
    match dialect(root) {
        Draft::Unknown => options,
        draft => options.with_draft(draft),
    }
}

impl Schema {
    pub fn compile(schema: &Value) -> Result<Schema, SchemaError> {
        let validator = validator_options(schema).build(schema).map_err(|err| {
            let at = err.schema_path().as_str().to_string();
            SchemaError::Invalid(if at.is_empty() {
                err.to_string()
            } else {
                format!("{err} (at #{at})")
            })
        })?;
        let reducer = build::build(schema)?;
        Ok(Schema {
            reducer,
            validator,
            structure: Structure::of(schema),
            source: schema.clone(),
        })
    }

    /// [`Schema::validate_doc`] of a `Value` (converted first: for cold paths).
    pub fn validate(&self, doc: &Value) -> Result<(), ValidationError> {
        self.validate_doc(&Doc::from(doc))
    }

    pub fn validate_doc(&self, doc: &Doc) -> Result<(), ValidationError> {
        let valid = match &self.structure {
            Some(structure) => structure.admits(doc),
            None => self.validator.is_valid(doc),
        };
        if valid {
            return Ok(());
        }
        let err = self.validator.iter_errors(doc).next();
        Err(match err {
            Some(err) => {
                let at = err.instance_path().as_str().to_string();
                let location = err.schema_path().as_str().to_string();
                // Point at the property itself where the error is about one property.
                match err.kind() {
                    ValidationErrorKind::Required { property } => ValidationError {
                        pointer: format!("{at}/{}", escape_token(property.as_str().unwrap_or(""))),
                        reason: format!("missing (required by schema location #{location})"),
                    },
                    ValidationErrorKind::AdditionalProperties { unexpected }
                        if unexpected.len() == 1 =>
                    {
                        ValidationError {
                            pointer: format!("{at}/{}", escape_token(&unexpected[0])),
                            reason: format!(
                                "unknown property (not allowed by schema location #{location}; check its spelling)"
                            ),
                        }
                    }
                    _ => ValidationError {
                        pointer: at,
                        reason: format!("{err} (schema location #{location})"),
                    },
                }
            }
            None => ValidationError {
                pointer: String::new(),
                reason: "does not match the schema".to_string(),
            },
        })
    }

    pub fn reducer(&self) -> &Reducer {
        &self.reducer
    }

    /// The schema as written.
    pub fn source(&self) -> &Value {
        &self.source
    }

    fn walker(&self) -> Walker<'_> {
        Walker {
            root: &self.source,
            draft: dialect(&self.source),
        }
    }

    /// What the schema says about one location.
    pub fn inference(&self, ptr: &Pointer) -> Inference {
        let tokens: Vec<&str> = ptr.tokens().collect();
        let shape = self.walker().shape(&self.source, &tokens, 0);
        Inference {
            types: shape.types.names(),
            must_exist: shape.must_exist,
            format: shape.format,
            default: shape.default,
        }
    }

    /// Top-level properties (name, pointer) that a materialization may project as fields,
    /// sorted by name: `properties` of the root and of its local `$ref`s and `allOf`s.
    pub fn top_level_properties(&self) -> Vec<(String, Pointer)> {
        let mut names = Vec::new();
        self.walker().property_names(&self.source, 0, &mut names);
        names.sort();
        names.dedup();
        names
            .into_iter()
            .filter_map(|name| {
                let escaped = name.replace('~', "~0").replace('/', "~1");
                Pointer::parse(&format!("/{escaped}"))
                    .ok()
                    .map(|ptr| (name, ptr))
            })
            .collect()
    }
}

/// `$ref` hops followed by inference before a location counts as unconstrained.
const REF_DEPTH_LIMIT: usize = 32;

/// A set of JSON types as bits; `number` is `INTEGER | FRACTIONAL`.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Types(u8);

impl Types {
    const NULL: u8 = 1;
    const BOOLEAN: u8 = 2;
    const INTEGER: u8 = 4;
    const FRACTIONAL: u8 = 8;
    const STRING: u8 = 16;
    const ARRAY: u8 = 32;
    const OBJECT: u8 = 64;
    const ALL: Types = Types(127);

    fn of_name(name: &str) -> u8 {
        match name {
            "null" => Self::NULL,
            "boolean" => Self::BOOLEAN,
            "integer" => Self::INTEGER,
            "number" => Self::INTEGER | Self::FRACTIONAL,
            "string" => Self::STRING,
            "array" => Self::ARRAY,
            "object" => Self::OBJECT,
            _ => 0,
        }
    }

    fn of_value(v: &Value) -> u8 {
        match v {
            Value::Null => Self::NULL,
            Value::Bool(_) => Self::BOOLEAN,
            Value::Number(n) if n.is_f64() => Self::FRACTIONAL,
            Value::Number(_) => Self::INTEGER,
            Value::String(_) => Self::STRING,
            Value::Array(_) => Self::ARRAY,
            Value::Object(_) => Self::OBJECT,
        }
    }

    /// Sorted names; `number` stands for any number, `integer` for integers only.
    fn names(self) -> Vec<String> {
        let number = if self.0 & Self::FRACTIONAL != 0 {
            Some("number")
        } else if self.0 & Self::INTEGER != 0 {
            Some("integer")
        } else {
            None
        };
        [
            (Self::ARRAY, Some("array")),
            (Self::BOOLEAN, Some("boolean")),
            (Self::INTEGER, number.filter(|n| *n == "integer")),
            (Self::NULL, Some("null")),
            (
                Self::FRACTIONAL | Self::INTEGER,
                number.filter(|n| *n == "number"),
            ),
            (Self::OBJECT, Some("object")),
            (Self::STRING, Some("string")),
        ]
        .into_iter()
        .filter(|(bits, _)| self.0 & bits != 0)
        .filter_map(|(_, name)| name.map(str::to_string))
        .collect()
    }
}

/// What is known about a location.
#[derive(Debug, Clone)]
struct Shape {
    types: Types,
    must_exist: bool,
    format: Option<String>,
    default: Option<Value>,
}

impl Shape {
    const UNCONSTRAINED: Shape = Shape {
        types: Types::ALL,
        must_exist: false,
        format: None,
        default: None,
    };

    /// Both hold.
    fn and(self, other: Shape) -> Shape {
        Shape {
            types: Types(self.types.0 & other.types.0),
            must_exist: self.must_exist || other.must_exist,
            format: self.format.or(other.format),
            default: self.default.or(other.default),
        }
    }

    /// One of them holds.
    fn or(self, other: Shape) -> Shape {
        Shape {
            types: Types(self.types.0 | other.types.0),
            must_exist: self.must_exist && other.must_exist,
            format: if self.format == other.format {
                self.format
            } else {
                None
            },
            default: if self.default == other.default {
                self.default
            } else {
                None
            },
        }
    }
}

struct Walker<'s> {
    root: &'s Value,
    /// The dialect, which says which keywords hold an array's items.
    draft: Draft,
}

impl<'s> Walker<'s> {
    /// The target of a local `$ref`, unless `depth` hops were already followed.
    fn ref_target(&self, keywords: &Map<String, Value>, depth: usize) -> Option<&'s Value> {
        let reference = keywords.get("$ref")?.as_str()?;
        if depth >= REF_DEPTH_LIMIT {
            return None;
        }
        self.root.pointer(reference.strip_prefix('#')?)
    }

    /// The shape of the location `tokens` below a document valid against `schema`.
    fn shape(&self, schema: &'s Value, tokens: &[&str], depth: usize) -> Shape {
        let keywords = match schema {
            Value::Object(keywords) => keywords,
            Value::Bool(false) => {
                return Shape {
                    types: Types(0),
                    ..Shape::UNCONSTRAINED
                };
            }
            _ => {
                return Shape {
                    must_exist: tokens.is_empty(),
                    ..Shape::UNCONSTRAINED
                };
            }
        };
        let mut shape = match tokens.split_first() {
            None => self.own_shape(keywords),
            Some((token, rest)) => self.child_shape(keywords, token, rest, depth),
        };
        if let Some(target) = self.ref_target(keywords, depth) {
            shape = shape.and(self.shape(target, tokens, depth + 1));
        }
        if let Some(Value::Array(all)) = keywords.get("allOf") {
            for sub in all {
                shape = shape.and(self.shape(sub, tokens, depth));
            }
        }
        for word in ["anyOf", "oneOf"] {
            if let Some(Value::Array(branches)) = keywords.get(word) {
                let union = branches
                    .iter()
                    .map(|sub| self.shape(sub, tokens, depth))
                    .reduce(Shape::or);
                if let Some(union) = union {
                    shape = shape.and(union);
                }
            }
        }
        shape
    }

    /// The shape the keywords of one schema give the location they describe.
    fn own_shape(&self, keywords: &Map<String, Value>) -> Shape {
        let mut types = match keywords.get("type") {
            Some(Value::String(name)) => Types(Types::of_name(name)),
            Some(Value::Array(names)) => Types(
                names
                    .iter()
                    .filter_map(Value::as_str)
                    .map(Types::of_name)
                    .fold(0, |a, b| a | b),
            ),
            _ => Types::ALL,
        };
        if let Some(value) = keywords.get("const") {
            types.0 &= Types::of_value(value);
        }
        if let Some(Value::Array(values)) = keywords.get("enum") {
            types.0 &= values.iter().map(Types::of_value).fold(0, |a, b| a | b);
        }
        let format = keywords
            .get("format")
            .and_then(Value::as_str)
            .map(str::to_string);
        Shape {
            types,
            must_exist: true,
            format,
            default: keywords.get("default").cloned(),
        }
    }

    /// The shape of `rest` below the child `token` of the location `keywords` describe.
    fn child_shape(
        &self,
        keywords: &'s Map<String, Value>,
        token: &str,
        rest: &[&str],
        depth: usize,
    ) -> Shape {
        let mut children: Vec<&'s Value> = Vec::new();
        let mut exists = false;
        // As a property of an object.
        if let Some(sub) = keywords.get("properties").and_then(|p| p.get(token)) {
            children.push(sub);
        }
        if let Some(Value::Object(patterns)) = keywords.get("patternProperties") {
            children.extend(
                patterns
                    .iter()
                    .filter(|(p, _)| Regex::new(p).is_ok_and(|re| re.is_match(token)))
                    .map(|(_, sub)| sub),
            );
        }
        if children.is_empty() {
            children.extend(keywords.get("additionalProperties"));
        }
        if let Some(Value::Array(required)) = keywords.get("required") {
            exists |= required.iter().any(|r| r.as_str() == Some(token));
        }
        // As an item of an array.
        if let Ok(index) = token.parse::<usize>() {
            let (prefix, rest) = self.items_of(keywords);
            match prefix.and_then(|p| p.get(index)) {
                Some(sub) => children.push(sub),
                None => children.extend(rest),
            }
            exists |= keywords
                .get("minItems")
                .and_then(Value::as_u64)
                .is_some_and(|min| min > index as u64);
        }
        let shape = match children
            .into_iter()
            .map(|sub| self.shape(sub, rest, depth))
            .reduce(Shape::and)
        {
            Some(shape) => shape,
            None => Shape {
                must_exist: rest.is_empty(),
                ..Shape::UNCONSTRAINED
            },
        };
        Shape {
            must_exist: exists && shape.must_exist,
            ..shape
        }
    }

    /// The schemas of an array's first items (an array of them) and of the items past
    /// those: `prefixItems` and `items` in 2020-12; before, array-form `items` and
    /// `additionalItems`, or `items` for every item.
    fn items_of(&self, keywords: &'s Map<String, Value>) -> (Option<&'s Value>, Option<&'s Value>) {
        let items = keywords.get("items");
        if self.draft == Draft::Draft202012 {
            return (keywords.get("prefixItems"), items);
        }
        match items {
            Some(tuple @ Value::Array(_)) => (Some(tuple), keywords.get("additionalItems")),
            items => (None, items),
        }
    }

    fn property_names(&self, schema: &'s Value, depth: usize, out: &mut Vec<String>) {
        let Value::Object(keywords) = schema else {
            return;
        };
        if let Some(Value::Object(properties)) = keywords.get("properties") {
            out.extend(properties.keys().cloned());
        }
        if let Some(target) = self.ref_target(keywords, depth) {
            self.property_names(target, depth + 1, out);
        }
        if let Some(Value::Array(all)) = keywords.get("allOf") {
            for sub in all {
                self.property_names(sub, depth, out);
            }
        }
    }
}

/// Escapes one JSON pointer token (RFC 6901).
fn escape_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}
