//! Collection schemas. (stub: owned by the schema/reduce work)

use crate::{Pointer, Reducer};
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum SchemaError {
    #[error("invalid schema: {0}")]
    Invalid(String),
}

#[derive(Debug, thiserror::Error)]
#[error("document is invalid at {pointer}: {reason}")]
pub struct ValidationError {
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
}

/// A compiled collection schema: validator, reductions, inference.
pub struct Schema {
    reducer: Reducer,
}

impl Schema {
    pub fn compile(_schema: &Value) -> Result<Schema, SchemaError> {
        todo!()
    }
    pub fn validate(&self, _doc: &Value) -> Result<(), ValidationError> {
        todo!()
    }
    pub fn reducer(&self) -> &Reducer {
        &self.reducer
    }
    /// What the schema says about one location.
    pub fn inference(&self, _ptr: &Pointer) -> Inference {
        todo!()
    }
    /// Top-level properties (name, pointer) that a materialization may project as fields.
    pub fn top_level_properties(&self) -> Vec<(String, Pointer)> {
        todo!()
    }
}
