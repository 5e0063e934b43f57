//! Staging in the warehouse: the Parquet writers of an epoch (rolled at the target size,
//! named `b<binding>-<process nonce>-<n>.parquet` so no name is ever written twice, on a
//! local disk or an object store alike: see `storage.rs`), and a binding's batch as the
//! table's. The file walks the abort cleaner and the orphan check share are the
//! warehouse's (`storage::WarehouseIo`).
//!
//! Each writer's task is spawned on the sink's [`TaskTracker`], and a [`Staging`]
//! dropped unclosed (its sink retired mid-call) aborts it: the driver awaits the tracker
//! before the next instance of the sink starts, so no writer of a retired instance writes
//! into staging the next one is cleaning.

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray, new_null_array};
use arrow_schema::SchemaRef;
use iceberg::spec::{DataFile, DataFileFormat};
use iceberg::writer::base_writer::data_file_writer::{DataFileWriter, DataFileWriterBuilder};
use iceberg::writer::file_writer::ParquetWriterBuilder;
use iceberg::writer::file_writer::location_generator::{
    DefaultFileNameGenerator, DefaultLocationGenerator,
};
use iceberg::writer::file_writer::rolling_writer::RollingFileWriterBuilder;
use iceberg::writer::{IcebergWriter, IcebergWriterBuilder};
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use sluice_sink_sdk::arrow::OP_COLUMN;
use sluice_sink_sdk::{Result, SinkError, TaskTracker};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::schema::TXN_COLUMN;

type Writer =
    DataFileWriter<ParquetWriterBuilder, DefaultLocationGenerator, DefaultFileNameGenerator>;

pub(crate) struct WriterSpec {
    pub file_io: iceberg::io::FileIO,
    pub schema: iceberg::spec::SchemaRef,
    pub ident: String,
    pub location: String,
    pub prefix: String,
    pub target_file_size: usize,
}

/// A binding's Parquet writer of one epoch, on a task of its own: [`Staging::write`]
/// queues a batch and returns at once unless one already waits, so the sink builds the
/// next batch while this one is encoded and written (at most one batch queued, one
/// being written). [`Staging::close`] returns the staged files, or the first failure;
/// dropped otherwise, it aborts its task.
pub(crate) struct Staging {
    /// `None` once closed or abandoned.
    batches: Option<mpsc::Sender<RecordBatch>>,
    /// `None` once a failed write has taken its error, or closed or abandoned.
    task: Option<JoinHandle<Result<Vec<DataFile>>>>,
}

impl Drop for Staging {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl Staging {
    /// Starts the writer of `spec` (its first file is created with its first batch), its
    /// task counted by `tasks`.
    pub(crate) async fn start(spec: WriterSpec, tasks: &TaskTracker) -> Result<Staging> {
        let ident = spec.ident.clone();
        let mut writer = new_writer(spec).await?;
        let (batches, mut queued) = mpsc::channel::<RecordBatch>(1);
        let task = tasks.spawn(async move {
            while let Some(batch) = queued.recv().await {
                writer.write(batch).await.map_err(|e| {
                    SinkError::External(format!("cannot write a data file of {ident}: {e}"))
                })?;
            }
            // Returns only after every file is closed: fsynced locally (LocalFsStorage),
            // its upload completed on S3.
            writer.close().await.map_err(|e| {
                SinkError::External(format!("cannot close a data file of {ident}: {e}"))
            })
        });
        Ok(Staging {
            batches: Some(batches),
            task: Some(task),
        })
    }

    /// Queues `batch`; waits only while the batch before it is still queued.
    pub(crate) async fn write(&mut self, batch: RecordBatch) -> Result<()> {
        let Some(batches) = &self.batches else {
            return Err(SinkError::Corrupt("a staging writer was closed".into()));
        };
        if batches.send(batch).await.is_ok() {
            return Ok(());
        }
        // The task ended early: a write failed, and its error is the answer.
        match self.task.take() {
            Some(task) => finished(task).await.and(Err(SinkError::Corrupt(
                "a staging writer ended before its epoch did".into(),
            ))),
            None => Err(SinkError::Corrupt("a staging writer failed before".into())),
        }
    }

    /// Writes what is queued, closes the files (fsynced, or uploaded), and returns them.
    pub(crate) async fn close(mut self) -> Result<Vec<DataFile>> {
        drop(self.batches.take());
        match self.task.take() {
            Some(task) => finished(task).await,
            None => Err(SinkError::Corrupt("a staging writer failed before".into())),
        }
    }

    /// Stops the writer where it is, and returns once it has stopped: nothing it does
    /// lands after this (a rollback removes its folder next).
    pub(crate) async fn abandon(mut self) {
        drop(self.batches.take());
        if let Some(task) = self.task.take() {
            task.abort();
            let _ = task.await;
        }
    }
}

/// The end of a staging writer's task.
async fn finished(task: JoinHandle<Result<Vec<DataFile>>>) -> Result<Vec<DataFile>> {
    task.await
        .map_err(|e| SinkError::External(format!("a staging writer stopped: {e}")))?
}

async fn new_writer(spec: WriterSpec) -> Result<Writer> {
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
