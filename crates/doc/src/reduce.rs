//! Reduction strategies. (stub: owned by the schema/reduce work)

use serde_json::Value;

/// How two documents (or two values at one location) combine.
#[derive(Debug, Clone, PartialEq)]
pub enum Strategy {
    LastWriteWins,
    FirstWriteWins,
    Sum,
    Minimize { key: Vec<crate::Pointer> },
    Maximize { key: Vec<crate::Pointer> },
    Merge { key: Vec<crate::Pointer> },
    Append,
    Set { key: Vec<crate::Pointer> },
}

/// The tree of strategies located in a schema, mirroring the document's shape.
#[derive(Debug, Clone)]
pub struct Reducer {
    pub strategy: Strategy,
}

#[derive(Debug, thiserror::Error)]
#[error("while reducing {location}: {reason}")]
pub struct ReduceError {
    /// JSON pointer of the location being reduced.
    pub location: String,
    pub reason: String,
}

impl Reducer {
    /// Reduces `rhs` into `lhs` in place (`lhs` came first). `full` says `lhs` is a complete
    /// document (e.g. loaded from the store), which lets `set` apply and drop removals.
    pub fn reduce(&self, _lhs: &mut Value, _rhs: Value, _full: bool) -> Result<(), ReduceError> {
        todo!()
    }
}
