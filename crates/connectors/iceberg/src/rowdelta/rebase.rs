//! An upsert epoch's position deletes rebased onto a compaction that committed while
//! the epoch was in flight (`sluice maintain` racing a running sink).
//!
//! ```text
//!  epoch N looks up key k at (f1, 7)      index reflects snapshot S
//!  maintain: replace snapshot C           f1's live rows ─▶ compacted-…-00000.parquet
//!  commit of N on top of C                (f1, 7) names a file C removed: the row's copy
//!                                         (the same values, found in C's compacted files)
//!                                         is deleted instead, in a new delete file
//! ```
//!
//! Why a copy is found by its values: a compaction copies live rows verbatim (every
//! column, `_txn` included), and an upsert table holds one live row per key, so a live
//! row's values name it uniquely. The stale row is read from the removed file itself,
//! which the snapshot before the compaction still references: maintenance keeps at
//! least two snapshots, and compacts only where that leaves a change behind it, so a
//! second compaction needs a commit first (and the transaction in flight commits before
//! any other of the sink). Should the file be gone anyway (another tool's expiry), the
//! commit fails naming it, never guessing.
//!
//! Only the conflict path reads data files: a commit whose deletes name live files only
//! (every commit without a compaction in between) reads the live data manifests alone.

use super::write_position_deletes;
use crate::read::json_value;
use iceberg::spec::{DataContentType, DataFile};
use iceberg::table::Table;
use iceberg::{Error, ErrorKind};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use std::collections::{HashMap, HashSet};

/// What a compaction's new data files are named after: `<data>/compacted-<snapshot>-…`.
pub(crate) const COMPACTED_PREFIX: &str = "compacted-";

fn failed(what: String) -> Error {
    Error::new(ErrorKind::Unexpected, what)
}

/// `files` with each position delete file that names a row of a data file no longer
/// live in `table` replaced by one naming the row's copy (written beside it, named
/// after `snapshot_id`). Files of other content pass unchanged.
pub(crate) async fn rebase_deletes(
    table: &Table,
    files: Vec<DataFile>,
    snapshot_id: i64,
) -> iceberg::Result<Vec<DataFile>> {
    if files
        .iter()
        .all(|f| f.content_type() != DataContentType::PositionDeletes)
    {
        return Ok(files);
    }
    let live = live_data_files(table).await?;
    let mut out = Vec::with_capacity(files.len());
    for file in files {
        if file.content_type() != DataContentType::PositionDeletes {
            out.push(file);
            continue;
        }
        let deletes = read_deletes(table, file.file_path()).await?;
        if deletes.iter().all(|(path, _)| live.contains(path)) {
            out.push(file);
            continue;
        }
        tracing::info!(
            table = %table.identifier(),
            deletes = file.file_path(),
            "a compaction rewrote rows this commit deletes: deleting their copies"
        );
        let rebased = rebase(table, &live, deletes).await?;
        let path = format!(
            "{}-rebased-{snapshot_id}.parquet",
            file.file_path().trim_end_matches(".parquet")
        );
        let written = write_position_deletes(
            table.file_io(),
            &path,
            table.metadata().default_partition_spec_id(),
            rebased,
        )
        .await
        .map_err(|e| failed(e.to_string()))?;
        out.push(written);
    }
    Ok(out)
}

/// The paths of the data files live in `table`'s current snapshot.
async fn live_data_files(table: &Table) -> iceberg::Result<HashSet<String>> {
    let mut live = HashSet::new();
    for manifest in crate::rowdelta::current_manifests(table).await? {
        if manifest.content != iceberg::spec::ManifestContentType::Data {
            continue;
        }
        let manifest = manifest.load_manifest(table.file_io()).await?;
        for entry in manifest.entries() {
            if entry.is_alive() {
                live.insert(entry.file_path().to_string());
            }
        }
    }
    Ok(live)
}

/// `(data file, position)` of every row of position delete file `path`.
async fn read_deletes(table: &Table, path: &str) -> iceberg::Result<Vec<(String, i64)>> {
    let mut out = Vec::new();
    read_rows(table, path, |batch| {
        let files = batch.column_by_name("file_path");
        let pos = batch.column_by_name("pos");
        let (Some(files), Some(pos)) = (files, pos) else {
            return Err(failed(format!("{path} is not a position delete file")));
        };
        for i in 0..batch.num_rows() {
            let file = json_value(files.as_ref(), i).map_err(|e| failed(e.to_string()))?;
            let pos = json_value(pos.as_ref(), i).map_err(|e| failed(e.to_string()))?;
            match (file.as_str(), pos.as_i64()) {
                (Some(f), Some(p)) => out.push((f.to_string(), p)),
                _ => return Err(failed(format!("{path} has a malformed row {i}"))),
            }
        }
        Ok(())
    })
    .await?;
    Ok(out)
}

/// Reads every batch of Parquet file `path` into `each`.
async fn read_rows(
    table: &Table,
    path: &str,
    mut each: impl FnMut(&arrow_array::RecordBatch) -> iceberg::Result<()>,
) -> iceberg::Result<()> {
    let bytes = table.file_io().new_input(path)?.read().await?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(bytes)
        .and_then(|b| b.build())
        .map_err(|e| failed(format!("cannot read {path}: {e}")))?;
    for batch in reader {
        each(&batch.map_err(|e| failed(format!("cannot read {path}: {e}")))?)?;
    }
    Ok(())
}

/// A row's values in `columns`' order, as JSON text (absent columns as null).
fn row_text(
    batch: &arrow_array::RecordBatch,
    columns: &[String],
    row: usize,
) -> iceberg::Result<String> {
    let mut values = Vec::with_capacity(columns.len());
    for name in columns {
        values.push(match batch.column_by_name(name) {
            Some(c) => json_value(c.as_ref(), row).map_err(|e| failed(e.to_string()))?,
            None => serde_json::Value::Null,
        });
    }
    Ok(serde_json::Value::Array(values).to_string())
}

/// `deletes` with those naming files not `live` pointed at their rows' copies in the
/// table's compacted files.
async fn rebase(
    table: &Table,
    live: &HashSet<String>,
    deletes: Vec<(String, i64)>,
) -> iceberg::Result<Vec<(String, i64)>> {
    let (mut out, stale): (Vec<_>, Vec<_>) = deletes
        .into_iter()
        .partition(|(path, _)| live.contains(path));
    let mut by_file: HashMap<String, HashSet<i64>> = HashMap::new();
    for (path, pos) in stale {
        by_file.entry(path).or_default().insert(pos);
    }
    // The stale rows' values, read from the files the compaction removed.
    let mut columns: Option<Vec<String>> = None;
    let mut wanted: HashMap<String, (String, i64)> = HashMap::new();
    for (path, positions) in &by_file {
        let mut at = 0i64;
        read_rows(table, path, |batch| {
            let names = columns.get_or_insert_with(|| {
                (batch.schema().fields().iter())
                    .map(|f| f.name().clone())
                    .collect()
            });
            for row in 0..batch.num_rows() {
                if positions.contains(&at) {
                    wanted.insert(row_text(batch, names, row)?, (path.clone(), at));
                }
                at += 1;
            }
            Ok(())
        })
        .await
        .map_err(|e| {
            failed(format!(
                "a staged position delete names rows of {path}, which a compaction rewrote, \
                 and that file cannot be read to find them ({e}): the snapshots that held it \
                 were expired before the epoch committed"
            ))
        })?;
    }
    let columns = columns.unwrap_or_default();
    let mut compacted: Vec<&String> = live
        .iter()
        .filter(|p| {
            p.rsplit('/')
                .next()
                .is_some_and(|name| name.starts_with(COMPACTED_PREFIX))
        })
        .collect();
    compacted.sort();
    for path in compacted {
        if wanted.is_empty() {
            break;
        }
        let mut at = 0i64;
        read_rows(table, path, |batch| {
            for row in 0..batch.num_rows() {
                if wanted.remove(&row_text(batch, &columns, row)?).is_some() {
                    out.push((path.clone(), at));
                }
                at += 1;
            }
            Ok(())
        })
        .await?;
    }
    if let Some((_, (path, pos))) = wanted.into_iter().next() {
        return Err(failed(format!(
            "a staged position delete names row {pos} of {path}, which a compaction rewrote, \
             and no live compacted file holds its copy"
        )));
    }
    Ok(out)
}

/// The data files position delete file `path` names, each once.
pub(crate) async fn deleted_files(table: &Table, path: &str) -> iceberg::Result<Vec<String>> {
    let mut files: Vec<String> = read_deletes(table, path)
        .await?
        .into_iter()
        .map(|(f, _)| f)
        .collect();
    files.sort();
    files.dedup();
    Ok(files)
}
