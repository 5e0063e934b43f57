//! The PostgreSQL driver, in the authoritative commit pattern: each transaction's rows,
//! the runtime checkpoint and a fence check commit in one PostgreSQL transaction, so a
//! crash at any point leaves the database holding exactly the effects of the checkpoint
//! it holds, and a zombie shard can never commit after a newer instance has opened.
//! Rows move in bulk (COPY), keys are looked up in batches (one query per Load message).
//!
//! - [`config`]: what the user writes (`{"url": ..., "schema": ...}`, `{"table": ...}`)
//!   and its schemas.
//! - [`sql`]: tables, statements (Apply's DDL and the fencing statements included) and
//!   the text forms of values (COPY rows, key arrays); pure.
//! - [`tls`]: `sslmode` and `sslrootcert` as libpq reads them, over rustls.
//! - [`client`]: connections, error classification, the catalog, and the client calls
//!   the SQL kit's Apply planner and fencing protocol run.
//! - [`PostgresDriver`] (`driver.rs`): Spec, Validate, Apply and Open.
//! - `transactor.rs`: loads, stores and commits of one shard (a `FencedStore`).
//!
//! ```text
//!   <schema>.sluice_checkpoints(materialization, key_begin, key_end, fence, checkpoint)
//!   <schema>.<table per binding>(keys…, values…, flow_document)  PRIMARY KEY(keys…) unless delta
//! ```

pub mod client;
pub mod config;
mod driver;
pub mod sql;
pub mod tls;
mod transactor;

pub use driver::PostgresDriver;
