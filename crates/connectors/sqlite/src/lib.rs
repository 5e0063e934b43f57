//! The SQLite driver, Sluice's embedded default store, in the authoritative commit
//! pattern: each transaction's rows, the runtime checkpoint and a fence check commit in
//! one SQLite transaction, so a crash at any point leaves the database holding exactly
//! the effects of the checkpoint it holds, and a zombie shard can never commit after a
//! newer instance has opened.
//!
//! - [`config`]: what the user writes (`{"path": ...}`, `{"table": ...}`) and its schemas.
//! - [`sql`]: tables, statements and value conversion (pure).
//! - [`client`]: opening the database (each connection on its own thread), error
//!   classification, the catalog and the client calls of fencing.
//! - [`SqliteDriver`] (`driver.rs`): Spec, Validate, Apply and Open.
//! - `transactor.rs`: loads, stores and commits of one shard (a `FencedStore`).
//!
//! ```text
//!   sluice_checkpoints(materialization, key_begin, key_end, fence, checkpoint)
//!   <table per binding>(keys…, values…, flow_document)   PRIMARY KEY(keys…) unless delta
//! ```

pub mod client;
pub mod config;
mod driver;
pub mod sql;
mod transactor;

pub use driver::SqliteDriver;
