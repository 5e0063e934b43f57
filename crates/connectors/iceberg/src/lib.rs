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
pub use driver::{IcebergCleaner, IcebergCommitter, IcebergSink, STAGING_DIR, WRITE_TIMEOUT};
pub use read::{open_catalog, orphan_data_files, orphan_files, read_rows, referenced_files};

use serde_json::Value;
use sluice_sink_sdk::{EpochSink, SinkError, SinkKind};

/// The independent reader: a Python script that reads a table through pyiceberg's
/// `SqlCatalog` over the same catalog file ([`pyiceberg_read`]).
pub const READ_TABLE_PY: &str = include_str!("../read_table.py");

/// Reads table `ident` (`namespace.table`) of the SQLite catalog `catalog`
/// independently, through pyiceberg (`python3` running [`READ_TABLE_PY`]): each row as a
/// JSON object, or with `snapshots` each snapshot's summary, oldest first. For tests,
/// `sluice torture` and benches; the error says how to install pyiceberg.
pub fn pyiceberg_read(
    catalog: &std::path::Path,
    warehouse: &std::path::Path,
    ident: &str,
    snapshots: bool,
) -> Result<Vec<Value>, String> {
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(READ_TABLE_PY)
        .arg(catalog)
        .arg(warehouse)
        .arg(ident)
        .args(snapshots.then_some("--snapshots"))
        .output()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "pyiceberg could not read {ident} (is `pyiceberg[sql-sqlite,pyarrow]` installed? \
             .ci/services installs it): {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|line| {
            serde_json::from_str(line).map_err(|e| format!("pyiceberg printed {line:?}: {e}"))
        })
        .collect()
}

/// Fail points of this sink (feature `failpoints`), for `sluice torture`: between
/// writing a snapshot's metadata and swapping the catalog to it, mid-apply.
pub const MID_APPLY: &str = "iceberg::mid-apply";
pub const FAIL_POINTS: &[&str] = &[MID_APPLY];

/// The `iceberg:` endpoint kind, as a binary registers it.
pub fn kind() -> SinkKind {
    SinkKind {
        name: "iceberg",
        paths: &["catalog", "warehouse"],
        endpoint_schema: config::endpoint_schema,
        resource_schema: config::resource_schema,
        build: |config| Ok(Box::new(IcebergSink::new(config)?) as Box<dyn EpochSink>),
        resource_path: |resource: &Value| -> Result<Vec<String>, SinkError> {
            Ok(vec![ResourceConfig::parse(resource)?.table])
        },
    }
}
