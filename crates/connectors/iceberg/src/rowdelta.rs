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
//! wrote.

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
use std::collections::HashMap;
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
fn new_snapshot_id(table: &Table) -> i64 {
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

/// Commits `files` (data files and position delete files) to `table` as one snapshot
/// with `properties` in its summary, through `catalog` (pinned to the metadata `table`
/// was read at). Format v2 only.
pub async fn commit(
    catalog: &SqlCatalog,
    table: &Table,
    files: Vec<DataFile>,
    properties: HashMap<String, String>,
) -> iceberg::Result<Table> {
    let md = table.metadata();
    if md.format_version() != FormatVersion::V2 {
        return Err(Error::new(
            ErrorKind::FeatureUnsupported,
            format!(
                "upsert commits position deletes to format v2 tables; {} is {}",
                table.identifier(),
                md.format_version()
            ),
        ));
    }
    let file_io = table.file_io();
    let snapshot_id = new_snapshot_id(table);
    let sequence = md.next_sequence_number();
    let parent = md.current_snapshot_id();
    let schema = md.current_schema().clone();
    let spec = md.default_partition_spec().clone();
    let meta_dir = format!("{}/metadata", md.location().trim_end_matches('/'));

    let mut manifests: Vec<ManifestFile> = match md.current_snapshot() {
        Some(current) => table
            .manifest_list_reader(current)
            .load()
            .await?
            .consume_entries()
            .into_iter()
            .filter(|m| m.has_added_files() || m.has_existing_files() || m.has_deleted_files())
            .collect(),
        None => Vec::new(),
    };
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
        let path = format!("{meta_dir}/sluice-{snapshot_id}-m{n}.avro");
        let builder = ManifestWriterBuilder::new(
            file_io.new_output(&path)?,
            Some(snapshot_id),
            schema.clone(),
            spec.as_ref().clone(),
        );
        let mut writer = match content {
            ManifestContentType::Data => builder.build_v2_data(),
            ManifestContentType::Deletes => builder.build_v2_deletes(),
        };
        for f in group {
            writer.add_file(f, sequence)?;
        }
        manifests.push(writer.write_manifest_file().await?);
    }

    let list_path = format!("{meta_dir}/snap-{snapshot_id}-sluice.avro");
    let mut list = ManifestListWriter::v2(
        file_io.new_output(&list_path)?.writer().await?,
        snapshot_id,
        parent,
        sequence,
    );
    list.add_manifests(manifests.into_iter())?;
    list.close().await?;

    let mut additional = properties;
    additional.extend(summary.build());
    let snapshot = Snapshot::builder()
        .with_manifest_list(list_path)
        .with_snapshot_id(snapshot_id)
        .with_parent_snapshot_id(parent)
        .with_sequence_number(sequence)
        .with_summary(Summary {
            operation: if has_deletes {
                Operation::Overwrite
            } else {
                Operation::Append
            },
            additional_properties: additional,
        })
        .with_schema_id(md.current_schema_id())
        .with_timestamp_ms(now_ms())
        .build();
    let updates = vec![
        TableUpdate::AddSnapshot { snapshot },
        TableUpdate::SetSnapshotRef {
            ref_name: MAIN_BRANCH.to_string(),
            reference: SnapshotReference::new(
                snapshot_id,
                SnapshotRetention::branch(None, None, None),
            ),
        },
    ];
    let requirements = vec![
        TableRequirement::UuidMatch { uuid: md.uuid() },
        TableRequirement::RefSnapshotIdMatch {
            r#ref: MAIN_BRANCH.to_string(),
            snapshot_id: parent,
        },
    ];
    catalog
        .commit_updates(table.identifier(), requirements, updates)
        .await
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}
