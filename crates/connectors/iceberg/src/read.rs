//! Reading tables back, for tests, benches and torture runs: every row as a JSON object
//! (through iceberg's own scan), and the files under the warehouse that no table's
//! current metadata references (the orphan check).

use crate::catalog::SqlCatalog;
use crate::storage::Warehouse;
use arrow_array::{
    Array, BooleanArray, Float64Array, Int32Array, Int64Array, RecordBatch, StringArray,
};
use arrow_schema::DataType;
use futures::TryStreamExt;
use iceberg::spec::SnapshotRef;
use iceberg::table::Table;
use iceberg::{Catalog, NamespaceIdent, TableIdent};
use serde_json::{Map, Value};
use sluice_sink_sdk::SinkError;
use std::collections::HashSet;
use std::path::Path;

fn external(what: String, e: iceberg::Error) -> SinkError {
    SinkError::External(format!("{what}: {e}"))
}

/// Opens the SQLite catalog at `catalog` with its warehouse `warehouse` (a local folder,
/// or an S3 location with its settings).
pub async fn open_catalog(
    catalog: &Path,
    warehouse: impl Into<Warehouse>,
) -> Result<SqlCatalog, SinkError> {
    SqlCatalog::open(catalog, warehouse)
        .await
        .map_err(|e| external(format!("cannot open catalog {}", catalog.display()), e))
}

/// Every row of table `namespace.table` at its current snapshot, as JSON objects (in
/// file order; no rows when the table has no snapshot).
pub async fn read_rows(
    catalog: &SqlCatalog,
    namespace: &str,
    table: &str,
) -> Result<Vec<Map<String, Value>>, SinkError> {
    let ns = NamespaceIdent::from_strs(namespace.split('.'))
        .map_err(|e| SinkError::Config(e.to_string()))?;
    let ident = TableIdent::new(ns, table.to_string());
    let table = catalog
        .load_table(&ident)
        .await
        .map_err(|e| external(format!("cannot load {ident}"), e))?;
    if table.metadata().current_snapshot().is_none() {
        return Ok(Vec::new());
    }
    let scan = table
        .scan()
        .select_all()
        .build()
        .map_err(|e| external(format!("cannot scan {ident}"), e))?;
    let batches: Vec<RecordBatch> = scan
        .to_arrow()
        .await
        .map_err(|e| external(format!("cannot scan {ident}"), e))?
        .try_collect()
        .await
        .map_err(|e| external(format!("cannot read {ident}"), e))?;
    let mut rows = Vec::new();
    for batch in &batches {
        for i in 0..batch.num_rows() {
            let mut row = Map::new();
            for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
                row.insert(field.name().clone(), json_value(column.as_ref(), i)?);
            }
            rows.push(row);
        }
    }
    Ok(rows)
}

pub(crate) fn json_value(column: &dyn Array, i: usize) -> Result<Value, SinkError> {
    if column.is_null(i) {
        return Ok(Value::Null);
    }
    let any = column.as_any();
    Ok(match column.data_type() {
        DataType::Int64 => Value::from(any.downcast_ref::<Int64Array>().expect("Int64").value(i)),
        DataType::Int32 => Value::from(any.downcast_ref::<Int32Array>().expect("Int32").value(i)),
        DataType::Float64 => Value::from(
            any.downcast_ref::<Float64Array>()
                .expect("Float64")
                .value(i),
        ),
        DataType::Boolean => Value::from(
            any.downcast_ref::<BooleanArray>()
                .expect("Boolean")
                .value(i),
        ),
        DataType::Utf8 => Value::from(any.downcast_ref::<StringArray>().expect("Utf8").value(i)),
        other => {
            return Err(SinkError::Corrupt(format!(
                "a column of type {other} cannot be read back"
            )));
        }
    })
}

/// Every file the table's current metadata references: its metadata files (current and
/// logged), each snapshot's manifest list, manifests and data files.
pub async fn referenced_files(table: &Table) -> Result<HashSet<String>, SinkError> {
    let md = table.metadata();
    let snapshots: Vec<SnapshotRef> = md.snapshots().cloned().collect();
    let mut out = snapshot_files(table, &snapshots, false).await?;
    if let Some(l) = table.metadata_location() {
        out.insert(l.to_string());
    }
    for entry in md.metadata_log() {
        out.insert(entry.metadata_file.clone());
    }
    Ok(out)
}

/// The manifest lists, manifests and files of `snapshots` of `table` (with
/// `alive_only`, only the files their manifests list as live: a file a snapshot removed
/// is listed, deleted, in its manifests).
pub async fn snapshot_files(
    table: &Table,
    snapshots: &[SnapshotRef],
    alive_only: bool,
) -> Result<HashSet<String>, SinkError> {
    let mut out = HashSet::new();
    let mut manifests = HashSet::new();
    for snapshot in snapshots {
        out.insert(snapshot.manifest_list().to_string());
        let list = table
            .manifest_list_reader(snapshot)
            .load()
            .await
            .map_err(|e| {
                external(
                    format!("cannot read the manifest list of {}", table.identifier()),
                    e,
                )
            })?;
        for m in list.entries() {
            if manifests.insert(m.manifest_path.clone()) {
                let manifest = m.load_manifest(table.file_io()).await.map_err(|e| {
                    external(format!("cannot read manifest {}", m.manifest_path), e)
                })?;
                for entry in manifest.entries() {
                    if entry.is_alive() || !alive_only {
                        out.insert(entry.file_path().to_string());
                    }
                }
            }
        }
    }
    out.extend(manifests);
    Ok(out)
}

/// The files under the warehouse that no table of the catalog references (see
/// [`referenced_files`]), as `file://` or `s3://` locations, sorted. Empty for a clean
/// warehouse.
pub async fn orphan_files(catalog: &SqlCatalog) -> Result<Vec<String>, SinkError> {
    let mut referenced = HashSet::new();
    let mut pending = vec![None];
    while let Some(parent) = pending.pop() {
        let namespaces = catalog
            .list_namespaces(parent.as_ref())
            .await
            .map_err(|e| external("cannot list namespaces".into(), e))?;
        for ns in namespaces {
            for ident in catalog
                .list_tables(&ns)
                .await
                .map_err(|e| external("cannot list tables".into(), e))?
            {
                let table = catalog
                    .load_table(&ident)
                    .await
                    .map_err(|e| external(format!("cannot load {ident}"), e))?;
                referenced.extend(referenced_files(&table).await?);
            }
            pending.push(Some(ns));
        }
    }
    let files = catalog.storage().list(catalog.warehouse()).await?;
    Ok(files
        .into_iter()
        .filter(|p| !referenced.contains(p))
        .collect())
}

/// The Parquet data files among [`orphan_files`]: none may be left after a clean run (the
/// abort cleaner removes every undecided epoch's staging). A commit cut between writing
/// its metadata and swapping the catalog leaves metadata and manifest files no snapshot
/// references, as every Iceberg writer does; those are for a maintenance job's orphan
/// removal, so they are not counted here.
pub async fn orphan_data_files(catalog: &SqlCatalog) -> Result<Vec<String>, SinkError> {
    let mut orphans = orphan_files(catalog).await?;
    orphans.retain(|f| f.ends_with(".parquet"));
    Ok(orphans)
}
