//! An exactly-once Apache Iceberg sink of the epoch contract.
//!
//! Each binding is one Iceberg table: the binding's columns, then `_txn` (the
//! transaction that wrote the row) and `_op` (`U` or `D`). Each transaction appends its
//! reduced changes per key, so the table is a change log of the collection. Data files
//! are staged per epoch under the table's data location, named by the artifact intent
//! before anything is written; the decision (the recovery log's commit) lists them; then
//! a fast-append snapshot makes them visible, once: its summary records the
//! materialization and the transaction, and a re-applied decision whose transaction an
//! ancestor snapshot already holds changes nothing ([`commit`]).
//!
//! The catalog is our own SQL catalog over SQLite or PostgreSQL ([`catalog`]) in
//! pyiceberg's `SqlCatalog` layout, so pyiceberg reads the tables through the same file
//! (or database).
//!
//! Layout: `config.rs` (what the user writes), `driver.rs` (the [`EpochSink`]),
//! `staging.rs` (Parquet writers, file walks), `catalog.rs` (talking to the catalog), `schema.rs` and `commit.rs` (pure decisions:
//! schema evolution, which epochs a table still lacks), `read.rs` (reading back, for
//! tests and benches).
//!
//! [`EpochSink`]: sluice_sink_sdk::EpochSink

pub mod catalog;
pub mod commit;
pub mod config;
mod driver;
pub mod read;
pub mod schema;
mod staging;

pub use catalog::{CATALOG_NAME, CatalogLocation, SqlCatalog};
pub use config::{EndpointConfig, ResourceConfig};
pub use driver::{IcebergSink, STAGING_DIR};
pub use read::{open_catalog, orphan_files, read_rows, referenced_files};
