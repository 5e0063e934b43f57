//! FoundationDB tuple packing of JSON key values. (stub)

use crate::ptr::Pointer;
use serde_json::Value;

#[derive(Debug, thiserror::Error)]
pub enum TupleError {
    #[error("malformed packed tuple at byte {offset}: {reason}")]
    Malformed { offset: usize, reason: String },
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("document is missing required key location {pointer}")]
    Missing { pointer: String },
}

/// Appends the tuple encoding of one JSON value to `out`.
pub fn pack_value(_value: &Value, _out: &mut Vec<u8>) {
    todo!()
}

/// Decodes a packed tuple (concatenated elements) back into JSON values.
pub fn unpack(_packed: &[u8]) -> Result<Vec<Value>, TupleError> {
    todo!()
}

/// Extracts and packs a collection key (a list of pointers) from documents.
#[derive(Debug, Clone)]
pub struct KeyExtractor {
    pointers: Vec<Pointer>,
    required: Vec<bool>,
}

impl KeyExtractor {
    /// `required[i]` says whether a missing `pointers[i]` is an error (else it packs as null).
    pub fn new(pointers: Vec<Pointer>, required: Vec<bool>) -> Self {
        KeyExtractor { pointers, required }
    }
    /// Appends the packed key of `doc` to `out`.
    pub fn pack(&self, _doc: &Value, _out: &mut Vec<u8>) -> Result<(), KeyError> {
        let _ = (&self.pointers, &self.required);
        todo!()
    }
}
