//! `mode: upsert`: the table is the view, one live row per key.
//!
//! ```text
//!  load(keys)          index: each key's document (as of the last applied epoch)
//!  write_batch         per row: its key's live row (index) ─▶ a position delete (file, pos);
//!                      _op U ─▶ the new row to the epoch's data files; _op D ─▶ nothing more
//!  pre_commit          data files closed; the deletes ─▶ one position delete file per table,
//!                      in the epoch's staging folder; the descriptor lists both
//!  commit_epoch        one snapshot of both (rowdelta.rs), exactly once as an append is
//!                      (commit.rs); then `sync`: the index rolled forward to the table
//! ```
//!
//! The index ([`Index`]) is rebuilt or rolled forward from the table ([`sync`]), never
//! trusted past it: at start (after the decided descriptor is applied again) and after
//! every commit, it is brought to the table's current snapshot. A snapshot it rolls
//! forward through is read for what it added: its position delete files remove the rows
//! they name, then its data files' rows become the live rows of their keys. Any other
//! history (a snapshot that is not an append or overwrite, an ancestry that does not
//! reach the snapshot the index reflects, another table uuid) rebuilds it from a scan of
//! the live rows: every live data file's rows less the positions live delete files name.
//!
//! Why the positions are right: an epoch's deletes are looked up in an index that
//! reflects the table after the epoch before (Loads and epochs wait for the prior
//! epoch's `commit_epoch`, and `begin_epoch` refuses to start on an index behind its own
//! pre-committed epoch), `commit_every` is 1 for a sink with an upsert table, and a
//! position names a row of a file committed in an earlier snapshot. A key appears at
//! most once per epoch (the runtime reduces per key per transaction): a second row of
//! one key in an epoch is refused rather than written twice.

use crate::catalog::SqlCatalog;
use crate::commit::StagedFile;
use crate::config::{Mode, ResourceConfig};
use crate::index::{Index, Reflects, RowAt};
use arrow_array::cast::AsArray;
use arrow_array::types::{Float64Type, Int32Type, Int64Type};
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use iceberg::spec::{
    DataContentType, ManifestStatus, Operation, SnapshotRef, serialize_data_file_to_json,
};
use iceberg::table::Table;
use iceberg::{Catalog, TableIdent};
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use sluice_sink_sdk::arrow::{OP_COLUMN, document_column};
use sluice_sink_sdk::{Result, SinkBinding, SinkError};
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::path::{Path, PathBuf};

/// Rows read back from a file per batch, when the index is synced.
const READ_BATCH_ROWS: usize = 8 * 1024;

/// An upsert table's columns, as the sink binds it.
#[derive(Debug, Clone)]
pub struct Upsert {
    /// The table's name (the index's `tbl`).
    pub table: String,
    pub key: Vec<String>,
    /// The document column (what Load hands back).
    pub document: String,
}

/// The rows of a key column as JSON text, the index's key: `[1,"a"]`.
pub fn key_texts(batch: &RecordBatch, key: &[String]) -> Result<Vec<String>> {
    let rows = batch.num_rows();
    let mut parts: Vec<Vec<serde_json::Value>> = vec![Vec::with_capacity(key.len()); rows];
    for name in key {
        let column = batch
            .column_by_name(name)
            .ok_or_else(|| SinkError::Schema(format!("a batch has no key column {name:?}")))?;
        for (row, part) in parts.iter_mut().enumerate() {
            part.push(json_value(column.as_ref(), row, name)?);
        }
    }
    Ok(parts
        .into_iter()
        .map(|p| serde_json::Value::Array(p).to_string())
        .collect())
}

fn json_value(column: &dyn Array, row: usize, name: &str) -> Result<serde_json::Value> {
    use serde_json::Value;
    if column.is_null(row) {
        return Ok(Value::Null);
    }
    Ok(match column.data_type() {
        DataType::Int64 => Value::from(column.as_primitive::<Int64Type>().value(row)),
        DataType::Int32 => Value::from(column.as_primitive::<Int32Type>().value(row)),
        DataType::Float64 => Value::from(column.as_primitive::<Float64Type>().value(row)),
        DataType::Boolean => Value::from(column.as_boolean().value(row)),
        DataType::Utf8 => Value::from(column.as_string::<i32>().value(row)),
        DataType::LargeUtf8 => Value::from(column.as_string::<i64>().value(row)),
        DataType::Utf8View => Value::from(column.as_string_view().value(row)),
        other => {
            return Err(SinkError::Schema(format!(
                "key column {name:?} is {other}, which an upsert table cannot key by"
            )));
        }
    })
}

fn text_column<'a>(batch: &'a RecordBatch, name: &str) -> Result<Vec<&'a str>> {
    let column = batch
        .column_by_name(name)
        .ok_or_else(|| SinkError::Schema(format!("a batch has no column {name:?}")))?;
    let rows = 0..column.len();
    Ok(match column.data_type() {
        DataType::Utf8 => rows.map(|r| column.as_string::<i32>().value(r)).collect(),
        DataType::LargeUtf8 => rows.map(|r| column.as_string::<i64>().value(r)).collect(),
        DataType::Utf8View => rows.map(|r| column.as_string_view().value(r)).collect(),
        other => {
            return Err(SinkError::Schema(format!(
                "column {name:?} is {other}, not text"
            )));
        }
    })
}

/// What an upsert table's epoch in progress has staged beyond its data files.
#[derive(Default)]
struct EpochDeletes {
    /// The live rows the epoch replaces or deletes.
    pub deletes: Vec<(String, i64)>,
    /// Hashes of the keys the epoch wrote: a key twice in one epoch is refused.
    seen: HashSet<u64>,
    hasher: RandomState,
}

/// Takes one binding batch of an upsert table into the epoch: the position deletes of
/// its keys' live rows go to `epoch`; returns the row ranges to write (the `U` rows,
/// as `(offset, length)` runs).
async fn stage(
    index: &Index,
    upsert: &Upsert,
    batch: &RecordBatch,
    epoch: &mut EpochDeletes,
) -> Result<Vec<(usize, usize)>> {
    let keys = key_texts(batch, &upsert.key)?;
    for k in &keys {
        if !epoch.seen.insert(epoch.hasher.hash_one(k)) {
            return Err(SinkError::Corrupt(format!(
                "key {k} of Iceberg table {} came twice in one transaction: the runtime \
                 reduces each key once per transaction",
                upsert.table
            )));
        }
    }
    let ops = text_column(batch, OP_COLUMN)?;
    let live = index.rows_at(&upsert.table, keys).await?;
    epoch
        .deletes
        .extend(live.into_iter().flatten().map(|at| (at.file, at.pos)));
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for (row, op) in ops.iter().enumerate() {
        if *op != "U" {
            continue;
        }
        match runs.last_mut() {
            Some((start, len)) if *start + *len == row => *len += 1,
            _ => runs.push((row, 1)),
        }
    }
    Ok(runs)
}

/// The sink's upsert side: its index, which bindings are upsert tables, and what the
/// epoch in progress deletes of each. Empty (every call a no-op) for a sink of change
/// logs only.
#[derive(Default)]
pub struct UpsertState {
    state_dir: Option<PathBuf>,
    index: Option<Index>,
    /// Per binding: `Some` for an upsert table.
    tables: Vec<Option<Upsert>>,
    /// Per binding: the epoch in progress's deletes.
    epoch: Vec<EpochDeletes>,
}

impl UpsertState {
    pub fn bind_state_dir(&mut self, dir: &Path) {
        self.state_dir = Some(dir.to_path_buf());
    }

    /// Binds `bindings` (their resources parsed): the upsert ones need the document,
    /// `commit_every: 1` and a state folder; their index is opened.
    pub async fn open(&mut self, bindings: &[SinkBinding], commit_every: u64) -> Result<()> {
        let mut tables = Vec::with_capacity(bindings.len());
        for b in bindings {
            let resource = ResourceConfig::parse(&b.resource)?;
            if resource.mode != Mode::Upsert {
                tables.push(None);
                continue;
            }
            let table = resource.table;
            let document = document_column(&b.schema).ok_or_else(|| {
                SinkError::Config(format!(
                    "Iceberg table {table} is `mode: upsert`, which keeps each key's document \
                     to answer Load: select the document (it is required, do not exclude it)"
                ))
            })?;
            if commit_every != 1 {
                return Err(SinkError::Config(format!(
                    "Iceberg table {table} is `mode: upsert`, whose index of live rows must \
                     match the table after every epoch: set `commit_every: 1` (it is \
                     {commit_every})"
                )));
            }
            tables.push(Some(Upsert {
                document: document.to_string(),
                key: b.key.clone(),
                table,
            }));
        }
        if tables.iter().any(Option::is_some) && self.index.is_none() {
            let dir = self.state_dir.as_ref().ok_or_else(|| {
                SinkError::Config(
                    "an Iceberg `mode: upsert` table keeps its index in the endpoint's state \
                     folder, and the runtime gave none"
                        .into(),
                )
            })?;
            self.index = Some(Index::open(dir).await?);
        }
        self.epoch = tables.iter().map(|_| EpochDeletes::default()).collect();
        self.tables = tables;
        Ok(())
    }

    fn index(&self) -> Result<&Index> {
        self.index
            .as_ref()
            .ok_or_else(|| SinkError::Corrupt("the upsert index is not open".into()))
    }

    fn table(&self, binding: usize) -> Option<&Upsert> {
        self.tables.get(binding).and_then(Option::as_ref)
    }

    /// Whether binding `binding` is an upsert table.
    pub fn is_upsert(&self, binding: usize) -> bool {
        self.table(binding).is_some()
    }

    /// Starts an epoch: `unapplied` says whether an epoch was pre-committed and not yet
    /// applied, when the index would be behind the table the new epoch's deletes name.
    pub fn begin(&mut self, epoch: u64, unapplied: bool) -> Result<()> {
        if unapplied && self.tables.iter().any(Option::is_some) {
            return Err(SinkError::Corrupt(format!(
                "epoch {epoch} began before the epoch pre-committed last was applied: an \
                 upsert table's deletes would name rows its index does not hold yet"
            )));
        }
        self.rollback();
        Ok(())
    }

    /// Forgets what the epoch in progress staged.
    pub fn rollback(&mut self) {
        for e in &mut self.epoch {
            *e = EpochDeletes::default();
        }
    }

    /// For an upsert binding, the row runs of `batch` to write (its `U` rows), its
    /// deletes taken into the epoch; `None` for a change log.
    pub async fn stage(
        &mut self,
        binding: usize,
        batch: &RecordBatch,
    ) -> Result<Option<Vec<(usize, usize)>>> {
        let Some(upsert) = self.table(binding).cloned() else {
            return Ok(None);
        };
        let index = self.index()?.clone();
        stage(&index, &upsert, batch, &mut self.epoch[binding])
            .await
            .map(Some)
    }

    /// The position delete file of binding `binding`'s epoch, if it deletes anything.
    pub async fn stage_deletes(
        &mut self,
        binding: usize,
        spec: DeleteSpec<'_>,
    ) -> Result<Option<StagedFile>> {
        let Some(upsert) = self.table(binding).cloned() else {
            return Ok(None);
        };
        let epoch = std::mem::take(&mut self.epoch[binding]);
        stage_deletes(spec, &upsert, epoch).await
    }

    /// Brings the index to the tables (`idents`, per binding) after a commit or at start.
    pub async fn sync(&self, catalog: &SqlCatalog, idents: &[TableIdent]) -> Result<()> {
        let tables: Vec<(TableIdent, Upsert)> = (idents.iter().zip(&self.tables))
            .filter_map(|(ident, u)| Some((ident.clone(), u.clone()?)))
            .collect();
        if tables.is_empty() {
            return Ok(());
        }
        sync_tables(self.index()?, catalog, tables).await
    }

    /// The documents of `keys` (a batch of binding `binding`'s key columns).
    pub async fn load(&self, binding: usize, keys: &RecordBatch) -> Result<Vec<String>> {
        let upsert = self.table(binding).ok_or_else(|| {
            SinkError::Corrupt(format!(
                "binding {binding} was loaded, but it is a change log (`mode: changelog`)"
            ))
        })?;
        let keys = key_texts(keys, &upsert.key)?;
        self.index()?.docs(&upsert.table, keys).await
    }
}

/// Whether `resource` is an upsert table's (a standard binding).
pub fn is_upsert(resource: &serde_json::Value) -> Result<bool> {
    Ok(ResourceConfig::parse(resource)?.mode == Mode::Upsert)
}

/// Where an upsert table's epoch files go, and how they are described.
pub struct DeleteSpec<'a> {
    pub file_io: &'a iceberg::io::FileIO,
    /// The epoch's staging folder of the table.
    pub location: String,
    /// Unique per process and binding (the data files' prefix).
    pub prefix: String,
    pub schema_id: i32,
    pub spec_id: i32,
    pub partition_type: &'a iceberg::spec::StructType,
    pub format_version: iceberg::spec::FormatVersion,
}

/// Writes the epoch's position deletes of `upsert`'s table (if any) as one file in its
/// staging folder: the descriptor's entry for it.
async fn stage_deletes(
    spec: DeleteSpec<'_>,
    upsert: &Upsert,
    epoch: EpochDeletes,
) -> Result<Option<StagedFile>> {
    if epoch.deletes.is_empty() {
        return Ok(None);
    }
    let path = format!("{}/{}-deletes.parquet", spec.location, spec.prefix);
    let file =
        crate::rowdelta::write_position_deletes(spec.file_io, &path, spec.spec_id, epoch.deletes)
            .await?;
    let (size, records) = (file.file_size_in_bytes(), file.record_count());
    let data_file = serialize_data_file_to_json(file, spec.partition_type, spec.format_version)
        .map_err(|e| SinkError::External(format!("cannot describe {path}: {e}")))?;
    Ok(Some(StagedFile {
        table: upsert.table.clone(),
        path,
        size,
        records,
        schema_id: spec.schema_id,
        spec_id: spec.spec_id,
        data_file,
    }))
}

/// Brings the index of each upsert table to its table's current snapshot ([`sync`]).
async fn sync_tables(
    index: &Index,
    catalog: &SqlCatalog,
    tables: Vec<(TableIdent, Upsert)>,
) -> Result<()> {
    for (ident, upsert) in tables {
        let table = catalog
            .load_table(&ident)
            .await
            .map_err(|e| SinkError::External(format!("cannot load Iceberg table {ident}: {e}")))?;
        sync(index, &table, &upsert).await?;
    }
    Ok(())
}

/// Brings `index` to `table`'s current snapshot: rolled forward through the snapshots
/// since the one it reflects, or rebuilt from the live rows. Postcondition: the index
/// reflects the current snapshot, and holds each live row's key, place and document.
pub async fn sync(index: &Index, table: &Table, upsert: &Upsert) -> Result<()> {
    let md = table.metadata();
    let uuid = md.uuid().to_string();
    let target = Reflects {
        uuid: uuid.clone(),
        snapshot: md.current_snapshot_id(),
    };
    let reflects = index.reflects(&upsert.table).await?;
    if reflects.as_ref() == Some(&target) {
        return Ok(());
    }
    if let Some(chain) = reflects.and_then(|r| chain_since(table, &r, &uuid)) {
        for snapshot in chain {
            roll_forward(index, table, upsert, &snapshot).await?;
        }
        return Ok(());
    }
    tracing::info!(
        table = upsert.table,
        "rebuilding the upsert index from the table's live rows"
    );
    rebuild(index, table, upsert, target).await
}

/// The snapshots after `from`, oldest first, if the current snapshot descends from it
/// through appends and overwrites only (what a roll forward can follow).
fn chain_since(table: &Table, from: &Reflects, uuid: &str) -> Option<Vec<SnapshotRef>> {
    if from.uuid != uuid {
        return None;
    }
    let md = table.metadata();
    let mut chain = Vec::new();
    let mut next = md.current_snapshot_id();
    while next != from.snapshot {
        let snapshot = md.snapshot_by_id(next?)?;
        if !matches!(
            snapshot.summary().operation,
            Operation::Append | Operation::Overwrite
        ) || chain.len() > md.snapshots().len()
        {
            return None;
        }
        next = snapshot.parent_snapshot_id();
        chain.push(snapshot.clone());
    }
    chain.reverse();
    Some(chain)
}

/// The live files of `snapshot`, or with `added_by` only those it added: (data files,
/// position delete files).
async fn files_of(
    table: &Table,
    snapshot: &SnapshotRef,
    added_by: Option<i64>,
) -> Result<(Vec<String>, Vec<String>)> {
    let ext = |e: iceberg::Error| {
        SinkError::External(format!(
            "cannot read {}'s manifests: {e}",
            table.identifier()
        ))
    };
    let list = table
        .manifest_list_reader(snapshot)
        .load()
        .await
        .map_err(ext)?;
    let (mut data, mut deletes) = (Vec::new(), Vec::new());
    for manifest in list.entries() {
        if added_by.is_some_and(|id| manifest.added_snapshot_id != id) {
            continue;
        }
        let manifest = manifest.load_manifest(table.file_io()).await.map_err(ext)?;
        for entry in manifest.entries() {
            let wanted = match added_by {
                Some(id) => {
                    entry.status() == ManifestStatus::Added && entry.snapshot_id() == Some(id)
                }
                None => entry.is_alive(),
            };
            if !wanted {
                continue;
            }
            let path = entry.file_path().to_string();
            match entry.content_type() {
                DataContentType::Data => data.push(path),
                DataContentType::PositionDeletes => deletes.push(path),
                DataContentType::EqualityDeletes => {
                    return Err(SinkError::Corrupt(format!(
                        "Iceberg table {} has equality delete file {path}, which this sink \
                         never writes: an upsert table must be written by it alone",
                        table.identifier()
                    )));
                }
            }
        }
    }
    Ok((data, deletes))
}

/// Reads `path` back in batches of `columns`.
async fn read_file(
    table: &Table,
    path: &str,
    columns: &[&str],
) -> Result<ParquetRecordBatchReader> {
    let ext = |e: String| SinkError::External(format!("cannot read {path}: {e}"));
    let bytes = (table.file_io().new_input(path))
        .map_err(|e| ext(e.to_string()))?
        .read()
        .await
        .map_err(|e| ext(e.to_string()))?;
    let builder =
        ParquetRecordBatchReaderBuilder::try_new(bytes).map_err(|e| ext(e.to_string()))?;
    let mask = ProjectionMask::columns(builder.parquet_schema(), columns.iter().copied());
    builder
        .with_projection(mask)
        .with_batch_size(READ_BATCH_ROWS)
        .build()
        .map_err(|e| ext(e.to_string()))
}

/// The next batch of a reader of `path`.
fn next_batch(
    path: &str,
    batch: Option<std::result::Result<RecordBatch, arrow_schema::ArrowError>>,
) -> Result<Option<RecordBatch>> {
    batch
        .transpose()
        .map_err(|e| SinkError::External(format!("cannot read {path}: {e}")))
}

/// The `(file_path, pos)` rows of position delete file `path`.
async fn read_deletes(table: &Table, path: &str, mut each: impl FnMut(&str, i64)) -> Result<()> {
    let mut reader = read_file(table, path, &["file_path", "pos"]).await?;
    while let Some(batch) = next_batch(path, reader.next())? {
        let files = text_column(&batch, "file_path")?;
        let pos = batch
            .column_by_name("pos")
            .and_then(|c| c.as_primitive_opt::<Int64Type>())
            .ok_or_else(|| SinkError::Corrupt(format!("delete file {path} has no long pos")))?;
        for (f, p) in files.iter().zip(pos.values()) {
            each(f, *p);
        }
    }
    Ok(())
}

/// Adds data file `path`'s rows to the index update in progress, but those `dead`.
async fn add_rows(
    index: &Index,
    table: &Table,
    upsert: &Upsert,
    path: &str,
    dead: Option<&HashSet<i64>>,
) -> Result<()> {
    let mut columns: Vec<&str> = upsert.key.iter().map(String::as_str).collect();
    columns.push(&upsert.document);
    let mut at = 0i64;
    let mut reader = read_file(table, path, &columns).await?;
    while let Some(batch) = next_batch(path, reader.next())? {
        let keys = key_texts(&batch, &upsert.key)?;
        let docs = text_column(&batch, &upsert.document)?;
        let mut rows = Vec::with_capacity(keys.len());
        for (key, doc) in keys.into_iter().zip(docs) {
            if !dead.is_some_and(|d| d.contains(&at)) {
                let place = RowAt {
                    file: path.to_string(),
                    pos: at,
                };
                rows.push((key, place, doc.to_string()));
            }
            at += 1;
        }
        index.add(&upsert.table, rows).await?;
    }
    Ok(())
}

/// Applies what `snapshot` added: its deletes, then its rows.
async fn roll_forward(
    index: &Index,
    table: &Table,
    upsert: &Upsert,
    snapshot: &SnapshotRef,
) -> Result<()> {
    let id = snapshot.snapshot_id();
    let (data, deletes) = files_of(table, snapshot, Some(id)).await?;
    index.begin(&upsert.table, false).await?;
    let applied = async {
        for path in &deletes {
            let mut at = Vec::new();
            read_deletes(table, path, |f, p| {
                at.push(RowAt {
                    file: f.to_string(),
                    pos: p,
                })
            })
            .await?;
            index.remove_at(&upsert.table, at).await?;
        }
        for path in &data {
            add_rows(index, table, upsert, path, None).await?;
        }
        let reflects = Reflects {
            uuid: table.metadata().uuid().to_string(),
            snapshot: Some(id),
        };
        index.commit(&upsert.table, reflects).await
    };
    match applied.await {
        Ok(()) => Ok(()),
        Err(e) => {
            index.rollback().await?;
            Err(e)
        }
    }
}

/// Rebuilds the index of `upsert` from the live rows of `table`'s current snapshot.
async fn rebuild(index: &Index, table: &Table, upsert: &Upsert, target: Reflects) -> Result<()> {
    index.begin(&upsert.table, true).await?;
    let built = async {
        if let Some(current) = table.metadata().current_snapshot() {
            let (data, deletes) = files_of(table, current, None).await?;
            let mut dead: HashMap<String, HashSet<i64>> = HashMap::new();
            for path in &deletes {
                read_deletes(table, path, |f, p| {
                    dead.entry(f.to_string()).or_default().insert(p);
                })
                .await?;
            }
            for path in &data {
                add_rows(index, table, upsert, path, dead.get(path)).await?;
            }
        }
        index.commit(&upsert.table, target).await
    };
    match built.await {
        Ok(()) => Ok(()),
        Err(e) => {
            index.rollback().await?;
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{ArrayRef, BooleanArray, Float64Array, Int64Array, StringArray};
    use std::sync::Arc;

    #[test]
    fn keys_read_the_same_from_any_text_layout_and_compose() {
        let batch = RecordBatch::try_from_iter([
            ("id", Arc::new(Int64Array::from(vec![1, 2])) as ArrayRef),
            (
                "s",
                Arc::new(StringArray::from(vec!["a", "b\"c"])) as ArrayRef,
            ),
            (
                "f",
                Arc::new(Float64Array::from(vec![0.5, 2.0])) as ArrayRef,
            ),
            (
                "b",
                Arc::new(BooleanArray::from(vec![true, false])) as ArrayRef,
            ),
        ])
        .unwrap();
        let key = ["id", "s", "f", "b"].map(String::from);
        assert_eq!(
            key_texts(&batch, &key).unwrap(),
            [r#"[1,"a",0.5,true]"#, r#"[2,"b\"c",2.0,false]"#]
        );
        let large = RecordBatch::try_from_iter([(
            "s",
            Arc::new(arrow_array::LargeStringArray::from(vec!["a"])) as ArrayRef,
        )])
        .unwrap();
        assert_eq!(key_texts(&large, &["s".into()]).unwrap(), [r#"["a"]"#]);
    }
}
