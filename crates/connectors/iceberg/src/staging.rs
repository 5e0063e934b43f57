//! Staging on the local filesystem: the Parquet writers of an epoch (rolled at the
//! target size, named `b<binding>-<process nonce>-<n>.parquet` so no name is ever
//! written twice), a binding's batch as the table's, and the file walks the abort
//! cleaner and the orphan check share.
//!
//! The walks and removals are synchronous `std::fs` calls on the caller's worker, as
//! iceberg's own local storage is: they touch one table's staging folder.

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray, new_null_array};
use arrow_schema::SchemaRef;
use iceberg::spec::DataFileFormat;
use iceberg::writer::IcebergWriterBuilder;
use iceberg::writer::base_writer::data_file_writer::{DataFileWriter, DataFileWriterBuilder};
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use sluice_sink_sdk::arrow::OP_COLUMN;
use sluice_sink_sdk::{Result, SinkError};
use std::sync::Arc;

use crate::schema::TXN_COLUMN;

pub(crate) type Writer =
    DataFileWriter<ParquetWriterBuilder, DefaultLocationGenerator, DefaultFileNameGenerator>;

pub(crate) struct WriterSpec {
    pub file_io: iceberg::io::FileIO,
    pub schema: iceberg::spec::SchemaRef,
    pub ident: String,
    pub location: String,
    pub prefix: String,
    pub target_file_size: usize,
}

pub(crate) async fn new_writer(spec: WriterSpec) -> Result<Writer> {
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .build();
    let parquet = ParquetWriterBuilder::new(props, spec.schema);
    let rolling = RollingFileWriterBuilder::new(
        parquet,
        spec.target_file_size,
        spec.file_io,
        DefaultLocationGenerator::with_data_location(spec.location),
        DefaultFileNameGenerator::new(spec.prefix, None, DataFileFormat::Parquet),
    );
    DataFileWriterBuilder::new(rolling)
        .build(None)
        .await
        .map_err(|e| {
            SinkError::External(format!("cannot start a data file of {}: {e}", spec.ident))
        })
}

/// `/path` of a `file://` location.
pub(crate) fn local_path(location: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(location.strip_prefix("file://").unwrap_or(location))
}

/// Every regular file under `dir` (none when it does not exist).
pub(crate) fn list_files(dir: &std::path::Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                stack.push(entry.path());
            } else {
                out.push(entry.path());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Removes the empty epoch folders under `dir` (best effort: a leftover folder is harmless).
pub(crate) fn remove_empty_dirs(dir: &std::path::Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_empty_dirs(&entry.path());
                let _ = std::fs::remove_dir(entry.path());
            }
        }
    }
}

/// The binding's batch as the table's: its columns by name, `_txn`, `_op` (`U` when the
/// binding has none), nulls for optional table columns the binding lacks.
pub(crate) fn table_batch(
    schema: &SchemaRef,
    table: &str,
    batch: &RecordBatch,
    epoch: u64,
) -> Result<RecordBatch> {
    let rows = batch.num_rows();
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(schema.fields().len());
    for field in schema.fields() {
        let name = field.name().as_str();
        let column: ArrayRef = if name == TXN_COLUMN {
            Arc::new(Int64Array::from_value(epoch as i64, rows))
        } else if let Some(c) = batch.column_by_name(name) {
            if c.data_type() != field.data_type() {
                return Err(SinkError::Schema(format!(
                    "field {name:?} of {} is {}, but a batch holds {}: run `sluice apply`",
                    table,
                    field.data_type(),
                    c.data_type()
                )));
            }
            c.clone()
        } else if name == OP_COLUMN {
            Arc::new(StringArray::from_iter_values(std::iter::repeat_n(
                "U", rows,
            )))
        } else if field.is_nullable() {
            new_null_array(field.data_type(), rows)
        } else {
            return Err(SinkError::Schema(format!(
                "required field {name:?} of {} is not in the binding",
                table
            )));
        };
        columns.push(column);
    }
    RecordBatch::try_new(schema.clone(), columns)
        .map_err(|e| SinkError::Schema(format!("a batch does not fit {}: {e}", table)))
}
