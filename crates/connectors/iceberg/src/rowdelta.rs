//! The row-delta commit iceberg 0.10 lacks: new data files and position delete files in
//! ONE snapshot (operation `overwrite`), and the position delete files themselves.
//!
//! ```text
//!  snapshot S (parent P, sequence number n = next)
//!    manifest list snap-S-…avro: P's live manifests, then
//!      data manifest   (v2 data):    the added data files,   status ADDED, sequence n
//!      delete manifest (v2 deletes): the added delete files, status ADDED, sequence n
//!    summary: added-* of the files, sluice.* of the commit, operation overwrite
//!  catalog: compare-and-swap from exactly the metadata the caller read (a pinned catalog)
//! ```
//!
//! A position delete file (`file_path`, `pos`; Iceberg's reserved field ids 2147483546
//! and 2147483545, sorted by path then position) names rows of data files committed in
//! EARLIER snapshots only: readers apply a delete file to the data files of a lower
//! sequence number (pyiceberg strictly lower), and the sink never deletes a row written
//! in the same epoch (the runtime reduces each key once per transaction). Position
//! deletes are what pyiceberg applies; equality deletes are not, and are deprecated in
//! format v3.
//!
//! The files are written whole (one object each, a fresh name per epoch and process,
//! through the table's `FileIO`); the manifests and the manifest list are named by the
//! new snapshot's random id, so a retried commit never rewrites a file another attempt
//! wrote. Writing manifests and the manifest list, and committing a snapshot of them
//! ([`write_manifest`], [`commit_snapshot`]), is shared with maintenance's compaction
//! (`maintain/compact.rs`), whose `replace` snapshot is made the same way.

pub(crate) mod rebase;

use crate::catalog::SqlCatalog;
use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema as ArrowSchema};
use iceberg::spec::{
    DataContentType, DataFile, DataFileBuilder, DataFileFormat, FormatVersion, MAIN_BRANCH,
    ManifestContentType, ManifestFile, ManifestListWriter, ManifestWriterBuilder, Operation,
    Snapshot, SnapshotReference, SnapshotRetention, SnapshotSummaryCollector, Struct, Summary,
};
use iceberg::table::Table;
use iceberg::{Error, ErrorKind, TableRequirement, TableUpdate};
use parquet::arrow::{ArrowWriter, PARQUET_FIELD_ID_META_KEY};
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use sluice_sink_sdk::{Result, SinkError};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Iceberg's reserved field ids of a position delete file's columns.
pub const FILE_PATH_ID: i32 = 2147483546;
pub const POS_ID: i32 = 2147483545;

/// The Arrow schema of a position delete file.
fn delete_schema() -> Arc<ArrowSchema> {
    let field = |name: &str, t: DataType, id: i32| {
        Field::new(name, t, false)
            .with_metadata([(PARQUET_FIELD_ID_META_KEY.to_string(), id.to_string())].into())
    };
    Arc::new(ArrowSchema::new(vec![
        field("file_path", DataType::Utf8, FILE_PATH_ID),
        field("pos", DataType::Int64, POS_ID),
    ]))
}

/// Writes `deletes` (data file, row position) as one position delete file at `path`,
/// sorted as the spec asks; returns its `DataFile` (content: position deletes).
pub async fn write_position_deletes(
    file_io: &iceberg::io::FileIO,
    path: &str,
    spec_id: i32,
    mut deletes: Vec<(String, i64)>,
) -> Result<DataFile> {
    deletes.sort();
    let records = deletes.len() as u64;
    let referenced = match deletes.first() {
        Some((first, _)) if deletes.iter().all(|(f, _)| f == first) => Some(first.clone()),
        _ => None,
    };
    let batch = RecordBatch::try_new(
        delete_schema(),
        vec![
            Arc::new(StringArray::from_iter_values(deletes.iter().map(|d| &d.0))) as ArrayRef,
            Arc::new(Int64Array::from_iter_values(deletes.iter().map(|d| d.1))),
        ],
    )
    .map_err(|e| SinkError::Corrupt(format!("a position delete batch: {e}")))?;
    drop(deletes);
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .build();
    let mut bytes = Vec::new();
    let mut writer = ArrowWriter::try_new(&mut bytes, batch.schema(), Some(props))
        .and_then(|mut w| w.write(&batch).map(|()| w))
        .map_err(|e| SinkError::External(format!("cannot encode {path}: {e}")))?;
    writer
        .finish()
        .map_err(|e| SinkError::External(format!("cannot encode {path}: {e}")))?;
    drop(writer);
    let size = bytes.len() as u64;
    file_io
        .new_output(path)
        .map_err(|e| SinkError::External(format!("cannot create {path}: {e}")))?
        .write(bytes.into())
        .await
        .map_err(|e| SinkError::External(format!("cannot write {path}: {e}")))?;
    DataFileBuilder::default()
        .content(DataContentType::PositionDeletes)
        .file_path(path.to_string())
        .file_format(DataFileFormat::Parquet)
        .partition(Struct::empty())
        .partition_spec_id(spec_id)
        .record_count(records)
        .file_size_in_bytes(size)
        .referenced_data_file(referenced)
        .build()
        .map_err(|e| SinkError::Corrupt(format!("describing {path}: {e}")))
}

/// A snapshot id no snapshot of `table` has: positive, random.
pub(crate) fn new_snapshot_id(table: &Table) -> i64 {
    use std::hash::{BuildHasher, RandomState};
    let state = RandomState::new();
    let mut salt = 0u64;
    loop {
        let id = (state.hash_one((std::process::id(), salt)) >> 1) as i64;
        if id != 0 && table.metadata().snapshot_by_id(id).is_none() {
            return id;
        }
        salt += 1;
    }
}

/// Format v2, which position deletes and our manifests need.
pub(crate) fn require_v2(table: &Table, what: &str) -> iceberg::Result<()> {
    let version = table.metadata().format_version();
    if version != FormatVersion::V2 {
        return Err(Error::new(
            ErrorKind::FeatureUnsupported,
            format!(
                "{what} writes format v2 manifests; {} is {version}",
                table.identifier()
            ),
        ));
    }
    Ok(())
}

/// The manifests of `table`'s current snapshot that still list a file (none without a
/// snapshot).
pub(crate) async fn current_manifests(table: &Table) -> iceberg::Result<Vec<ManifestFile>> {
    Ok(match table.metadata().current_snapshot() {
        Some(current) => table
            .manifest_list_reader(current)
            .load()
            .await?
            .consume_entries()
            .into_iter()
            .filter(|m| m.has_added_files() || m.has_existing_files() || m.has_deleted_files())
            .collect(),
        None => Vec::new(),
    })
}

/// One entry of a manifest a new snapshot writes.
pub(crate) enum Entry {
    /// A file the snapshot adds (its data sequence number: the snapshot's).
    Added(DataFile),
    /// A file an earlier snapshot added, still live: its numbers kept.
    Existing {
        file: DataFile,
        snapshot_id: i64,
        sequence: i64,
        file_sequence: Option<i64>,
    },
    /// A file the snapshot removes: its numbers kept.
    Deleted {
        file: DataFile,
        sequence: i64,
        file_sequence: Option<i64>,
    },
}

/// Writes `entries` as one v2 manifest of `content` named `sluice-<snapshot>-<name>.avro`
/// in `table`'s metadata folder, for snapshot `snapshot_id` of sequence `sequence`.
pub(crate) async fn write_manifest(
    table: &Table,
    snapshot_id: i64,
    sequence: i64,
    name: &str,
    content: ManifestContentType,
    entries: Vec<Entry>,
) -> iceberg::Result<ManifestFile> {
    let md = table.metadata();
    let path = format!("{}/sluice-{snapshot_id}-{name}.avro", meta_dir(table));
    let builder = ManifestWriterBuilder::new(
        table.file_io().new_output(&path)?,
        Some(snapshot_id),
        md.current_schema().clone(),
        md.default_partition_spec().as_ref().clone(),
    );
    let mut writer = match content {
        ManifestContentType::Data => builder.build_v2_data(),
        ManifestContentType::Deletes => builder.build_v2_deletes(),
    };
    for entry in entries {
        match entry {
            Entry::Added(file) => writer.add_file(file, sequence)?,
            Entry::Existing {
                file,
                snapshot_id,
                sequence,
                file_sequence,
            } => writer.add_existing_file(file, snapshot_id, sequence, file_sequence)?,
            Entry::Deleted {
                file,
                sequence,
                file_sequence,
            } => writer.add_delete_file(file, sequence, file_sequence)?,
        }
    }
    writer.write_manifest_file().await
}

fn meta_dir(table: &Table) -> String {
    format!(
        "{}/metadata",
        table.metadata().location().trim_end_matches('/')
    )
}

/// A snapshot to commit: its manifests (written, or carried from the parent), what it is.
pub(crate) struct NewSnapshot {
    pub snapshot_id: i64,
    pub sequence: i64,
    pub manifests: Vec<ManifestFile>,
    pub operation: Operation,
    /// Our `sluice.*` properties and iceberg's `added-*`/`deleted-*` counts.
    pub summary: HashMap<String, String>,
}

/// Writes `new`'s manifest list and commits it as `table`'s next snapshot on `main`
/// through `catalog` (pinned to the metadata `table` was read at): the compare-and-swap
/// is the commit point; a lost swap leaves the list and manifests as orphans.
pub(crate) async fn commit_snapshot(
    catalog: &SqlCatalog,
    table: &Table,
    new: NewSnapshot,
) -> iceberg::Result<Table> {
    let md = table.metadata();
    let parent = md.current_snapshot_id();
    let list_path = format!("{}/snap-{}-sluice.avro", meta_dir(table), new.snapshot_id);
    let mut list = ManifestListWriter::v2(
        table.file_io().new_output(&list_path)?.writer().await?,
        new.snapshot_id,
        parent,
        new.sequence,
    );
    list.add_manifests(new.manifests.into_iter())?;
    list.close().await?;
    let snapshot = Snapshot::builder()
        .with_manifest_list(list_path)
        .with_snapshot_id(new.snapshot_id)
        .with_parent_snapshot_id(parent)
        .with_sequence_number(new.sequence)
        .with_summary(Summary {
            operation: new.operation,
            additional_properties: new.summary,
        })
        .with_schema_id(md.current_schema_id())
        .with_timestamp_ms(now_ms())
        .build();
    let updates = vec![
        TableUpdate::AddSnapshot { snapshot },
        TableUpdate::SetSnapshotRef {
            ref_name: MAIN_BRANCH.to_string(),
            reference: SnapshotReference::new(
                new.snapshot_id,
                SnapshotRetention::branch(None, None, None),
            ),
        },
    ];
    catalog
        .commit_updates(table.identifier(), on_top_of(table), updates)
        .await
}

/// What a commit computed on `table` requires: the same table, `main` where it was.
pub(crate) fn on_top_of(table: &Table) -> Vec<TableRequirement> {
    let md = table.metadata();
    vec![
        TableRequirement::UuidMatch { uuid: md.uuid() },
        TableRequirement::RefSnapshotIdMatch {
            r#ref: MAIN_BRANCH.to_string(),
            snapshot_id: md.current_snapshot_id(),
        },
    ]
}

/// Commits `files` (data files and position delete files) to `table` as one snapshot
/// with `properties` in its summary, through `catalog` (pinned to the metadata `table`
/// was read at). Position deletes naming rows of data files a compaction rewrote since
/// they were staged are pointed at the rows' copies first (`rowdelta/rebase.rs`). Format v2 only.
pub async fn commit(
    catalog: &SqlCatalog,
    table: &Table,
    files: Vec<DataFile>,
    properties: HashMap<String, String>,
) -> iceberg::Result<Table> {
    require_v2(table, "an upsert commit")?;
    let md = table.metadata();
    let snapshot_id = new_snapshot_id(table);
    let sequence = md.next_sequence_number();
    let schema = md.current_schema().clone();
    let spec = md.default_partition_spec().clone();
    let mut manifests = current_manifests(table).await?;
    let staged: HashSet<String> = files.iter().map(|f| f.file_path().to_string()).collect();
    let files = rebase::rebase_deletes(table, files, snapshot_id).await?;
    let committing: HashSet<String> = files.iter().map(|f| f.file_path().to_string()).collect();
    let mut summary = SnapshotSummaryCollector::default();
    for f in &files {
        summary.add_file(f, schema.clone(), spec.clone());
    }
    let has_deletes = files
        .iter()
        .any(|f| f.content_type() != DataContentType::Data);
    let (data, deletes): (Vec<DataFile>, Vec<DataFile>) = files
        .into_iter()
        .partition(|f| f.content_type() == DataContentType::Data);
    for (n, (content, group)) in [
        (ManifestContentType::Data, data),
        (ManifestContentType::Deletes, deletes),
    ]
    .into_iter()
    .enumerate()
    {
        if group.is_empty() {
            continue;
        }
        let entries = group.into_iter().map(Entry::Added).collect();
        let name = format!("m{n}");
        manifests
            .push(write_manifest(table, snapshot_id, sequence, &name, content, entries).await?);
    }
    let mut additional = properties;
    additional.extend(summary.build());
    let new = NewSnapshot {
        snapshot_id,
        sequence,
        manifests,
        operation: if has_deletes {
            Operation::Overwrite
        } else {
            Operation::Append
        },
        summary: additional,
    };
    let committed = commit_snapshot(catalog, table, new).await;
    // What no snapshot will reference: the staged delete files a rebase replaced, once
    // committed; the rebased ones, if not (the next attempt writes its own).
    let (unreferenced, of) = match &committed {
        Ok(_) => (staged.difference(&committing), "replaced by its rebase"),
        Err(_) => (committing.difference(&staged), "of a commit that failed"),
    };
    for path in unreferenced {
        if let Err(e) = table.file_io().delete(path).await {
            tracing::warn!(%path, error = %e, "cannot remove a position delete file {of}");
        }
    }
    committed
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}
