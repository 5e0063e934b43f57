//! RFC 6901 JSON pointers. (stub: owned by the pointer/tuple/hash work)

use serde_json::Value;

/// A parsed JSON pointer such as `/user/name` or `/a~1b/0`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Pointer {
    tokens: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
#[error("invalid JSON pointer {pointer:?}: {reason}")]
pub struct PointerError {
    pub pointer: String,
    pub reason: String,
}

impl Pointer {
    /// Parses `""` (the whole document) or `/token/token...`, unescaping `~1` and `~0`.
    pub fn parse(_s: &str) -> Result<Pointer, PointerError> {
        todo!()
    }
    /// The value at this location, if present. Array tokens are decimal indices.
    pub fn query<'v>(&self, _doc: &'v Value) -> Option<&'v Value> {
        todo!()
    }
}
