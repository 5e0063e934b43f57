//! The reference driver: tables in memory (or in one JSON file), authoritative, fenced.
//!
//! [`MemoryDriver`] follows [`sluice_driver_sdk::CommitPattern::RemoteAuthoritative`]
//! through the SDK's [`sluice_driver_sdk::fence::FencedStore`]: its commit writes the
//! rows, the runtime checkpoint and a fence check in one step, and after `open` returns
//! every earlier instance of an overlapping key range is fenced. It claims every
//! capability of the conformance suite (deletes, delta updates, strict `exists` checks).
//!
//! The standard connector layout:
//! - [`config`]: what the user writes (`{path?}`, the resource `{table, delta_updates?}`)
//!   and its JSON schemas;
//! - [`driver`]: Spec, Validate, Apply and Open;
//! - `transactor`: loads, stores and the fenced, atomic commit;
//! - `client`: the state, in memory or in one file rewritten atomically under a lock.

mod client;
pub mod config;
pub mod driver;
mod transactor;

pub use client::Row;
pub use driver::MemoryDriver;
