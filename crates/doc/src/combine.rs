//! The memory-bounded combiner. (stub: owned by the combiner work)

use serde_json::Value;

/// One fully combined document, drained in (binding, packed key) order.
#[derive(Debug, Clone, PartialEq)]
pub struct Drained {
    pub binding: u32,
    pub key: Vec<u8>,
    pub doc: Value,
    /// Combined from a loaded full document ("left"), not only from new ones.
    pub full: bool,
}

pub struct Combiner {}
