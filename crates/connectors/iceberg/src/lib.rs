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
//! A binding of `mode: upsert` is the view instead: a standard binding (the runtime
//! loads each key's document from the sink's index), one live row per key, each epoch's
//! replaced and deleted rows named by a position delete file committed with its new
//! rows in one row-delta snapshot ([`upsert`], [`rowdelta`], [`index`]).
//!
//! The catalog is our own SQL catalog over SQLite or PostgreSQL ([`catalog`]) in
//! pyiceberg's `SqlCatalog` layout, so pyiceberg reads the tables through the same file
//! (or database).
//!
//! Layout: `config.rs` (what the user writes), `driver/` (the [`EpochSink`]; `recover.rs`, `detached.rs`: the committer and cleaner that need no writer),
//! `staging.rs` (Parquet writers), `storage.rs` (the warehouse: a local folder or S3;
//! iceberg's file IO, listing, removal), `catalog.rs` (talking to the catalog), `schema.rs` and `commit.rs` (pure decisions:
//! schema evolution, which epochs a table still lacks), `upsert.rs`, `index.rs` and
//! `rowdelta.rs` (`mode: upsert`: the epoch's deletes, the index of live rows, the
//! row-delta commit), `rowdelta/rebase.rs` (an upsert epoch's deletes rebased onto a compaction
//! that committed while it was in flight), `maintain.rs` and `maintain/` (compaction,
//! snapshot expiry, orphan removal: `sluice maintain` and `maintenance:`), `read.rs`
//! (reading back, for tests and benches).
//!
//! [`EpochSink`]: sluice_sink_sdk::EpochSink

pub mod catalog;
pub mod commit;
pub mod config;
mod driver;
pub mod index;
pub mod maintain;
pub mod read;
pub mod rowdelta;
pub mod schema;
mod staging;
pub mod storage;
pub mod upsert;

pub use catalog::{CATALOG_NAME, CatalogLocation, SqlCatalog};
pub use commit::STAGING_DIR;
pub use config::{EndpointConfig, ResourceConfig};
pub use driver::{IcebergCleaner, IcebergCommitter, IcebergSink, WRITE_TIMEOUT};
pub use read::{open_catalog, orphan_data_files, orphan_files, read_rows, referenced_files};
pub use storage::{Warehouse, WarehouseIo};

use serde_json::Value;
use sluice_sink_sdk::{EpochSink, SinkError, SinkKind};

/// The independent reader: a Python script that reads a table through pyiceberg's
/// `SqlCatalog` over the same catalog file ([`pyiceberg_read`]).
pub const READ_TABLE_PY: &str = include_str!("../read_table.py");

/// Reads table `ident` (`namespace.table`) of the SQLite catalog `catalog`
/// independently, through pyiceberg (`python3` running [`READ_TABLE_PY`]) over the same
/// warehouse (a local folder, or an S3 location: pyiceberg is given its settings): each
/// row as a JSON object, or with `snapshots` each snapshot's summary, oldest first. For
/// tests, `sluice torture` and benches; the error says how to install pyiceberg.
pub fn pyiceberg_read(
    catalog: &std::path::Path,
    warehouse: impl Into<Warehouse>,
    ident: &str,
    snapshots: bool,
) -> Result<Vec<Value>, String> {
    let (location, s3) = match warehouse.into() {
        Warehouse::Local(dir) => (format!("file://{}", dir.display()), None),
        Warehouse::S3 { url, settings } => (
            url.to_string(),
            Some(serde_json::to_string(&settings).map_err(|e| e.to_string())?),
        ),
    };
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(READ_TABLE_PY)
        .arg(catalog)
        .arg(location)
        .arg(ident)
        .args(snapshots.then_some("--snapshots"))
        .args(s3.iter().flat_map(|s3| ["--s3", s3.as_str()]))
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
