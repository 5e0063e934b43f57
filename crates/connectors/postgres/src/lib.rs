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
//! - [`client`]: the catalog, and the client calls the SQL kit's Apply planner and
//!   fencing protocol run.
//! - The endpoint config, TLS (`sslmode`, `sslrootcert`), connecting and the
//!   classification of the server's errors are `sluice_pg_client`'s, which the output
//!   SDK's view shares.
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
mod transactor;

pub use driver::PostgresDriver;
