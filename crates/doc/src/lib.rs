//! JSON documents: everything Sluice knows about a document without any I/O.
//!
//! ```text
//!  bytes ──parse──▶ Value ──Schema::validate──▶ Value ──KeyExtractor::pack──▶ packed key
//!                                                  │                              │
//!                                                  └──── Combiner (reduce by key, spill, drain in key order)
//! ```
//!
//! - [`ptr`]: RFC 6901 JSON pointers.
//! - [`tuple`]: FoundationDB tuple packing of key values (order-preserving bytes).
//! - [`hash`]: the 32-bit key hash that key ranges are defined over.
//! - [`hex`]: hex text of bytes (packed keys where only text goes).
//! - [`schema`]: JSON Schema validation, `reduce` annotations and projections.
//! - [`reduce`]: the reduction strategies.
//! - [`combine`]: the memory-bounded combiner.
//! - [`compact`]: the compact document the combiner keeps per key.
//! - [`parse`]: JSON text straight into a compact [`compact::Doc`] ([`parse::DocParser`]).

pub mod combine;
pub mod compact;
pub mod hash;
pub mod hex;
pub mod keyscan;
pub mod parse;
pub mod ptr;
pub mod reduce;
pub mod schema;
pub mod tuple;

pub use combine::{Combiner, Drained};
pub use hash::{KeyRange, key_hash};
pub use ptr::Pointer;
pub use reduce::{ReduceError, Reducer, Strategy};
pub use schema::Schema;
pub use tuple::KeyExtractor;
