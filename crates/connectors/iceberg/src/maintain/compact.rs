//! Compaction: a table's small data files and the position deletes that apply to them,
//! rewritten as target-sized files of their live rows, in one `replace` snapshot.
//!
//! ```text
//!  current snapshot: live entries ─▶ candidates: data files < target_file_size
//!                                    removable deletes: every row names a candidate
//!                                    (or a file no longer live)
//!  scan (iceberg's reader, deletes applied) of the candidates, oldest sequence first
//!    ─▶ <data>/compacted-<snapshot>-….parquet, rolled at target_file_size
//!  snapshot (replace): untouched manifests carried; one data and one delete manifest of
//!    the touched ones' entries (removed ─▶ DELETED, kept ─▶ EXISTING) and the new files
//!    (ADDED at the new sequence number: later deletes apply to them, earlier ones not)
//! ```
//!
//! Rows keep their file order within the oldest-first candidates, so a change log's
//! `_txn` order is kept. The new files' data sequence number is the snapshot's: a
//! delete file kept (it names other files too) has a lower one and cannot apply to them.

use super::{ATTEMPTS, Options, SUMMARY_MAINTENANCE, ancestry, external, load};
use crate::catalog::SqlCatalog;
use crate::commit::SUMMARY_DEPLOYMENT;
use crate::rowdelta::rebase::COMPACTED_PREFIX;
use crate::rowdelta::{self, Entry, NewSnapshot};
use crate::staging::{Staging, WriterSpec};
use arrow_array::RecordBatch;
use futures::{StreamExt, TryStreamExt};
use iceberg::spec::{
    DataContentType, DataFile, ManifestContentType, ManifestEntryRef, ManifestFile, Operation,
    SnapshotSummaryCollector,
};
use iceberg::table::Table;
use iceberg::{ErrorKind, TableIdent};
use sluice_sink_sdk::{Result, SinkError, TaskTracker};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// The live entries of the current snapshot, by the manifest that lists them.
struct Live {
    manifests: Vec<(ManifestFile, Vec<ManifestEntryRef>)>,
}

/// What one compaction replaces.
struct Plan {
    /// Candidates, oldest data sequence number first.
    data: Vec<ManifestEntryRef>,
    deletes: Vec<ManifestEntryRef>,
    /// Bytes of the candidates (for a dry run's estimate).
    bytes: u64,
}

/// Compacts table `ident`: `(data files, delete files replaced, data files written)`,
/// or `None` when there is nothing to compact or every swap was lost.
pub(super) async fn compact(
    catalog: &SqlCatalog,
    ident: &TableIdent,
    options: &Options,
) -> Result<Option<(usize, usize, usize)>> {
    for _ in 0..ATTEMPTS {
        let table = load(catalog, ident).await?;
        if table.metadata().current_snapshot().is_none() {
            return Ok(None);
        }
        let live = live_entries(&table).await?;
        let Some(plan) = plan(&table, &live, options.target_file_size).await? else {
            return Ok(None);
        };
        let (data, deletes) = (plan.data.len(), plan.deletes.len());
        if options.dry_run {
            let written = plan.bytes.div_ceil(options.target_file_size).max(1) as usize;
            return Ok(Some((data, deletes, written)));
        }
        let snapshot_id = rowdelta::new_snapshot_id(&table);
        let written = rewrite(&table, &plan, snapshot_id, options.target_file_size).await?;
        let paths: Vec<String> = written.iter().map(|f| f.file_path().to_string()).collect();
        let count = written.len();
        let base = table
            .metadata_location_result()
            .map_err(|e| external(format!("{ident}"), e))?;
        let pinned = catalog.pinned(base);
        let new = snapshot(&table, &live, &plan, written, snapshot_id).await?;
        match rowdelta::commit_snapshot(&pinned, &table, new).await {
            Ok(_) => return Ok(Some((data, deletes, count))),
            Err(e) if e.kind() == ErrorKind::CatalogCommitConflicts => {
                tracing::info!(table = %ident, "compaction lost its swap to a concurrent commit; planning again");
                // Nothing references them: the swap did not happen.
                catalog.storage().delete(&paths).await?;
            }
            Err(e) => {
                return Err(external(
                    format!("cannot commit the compaction of {ident}"),
                    e,
                ));
            }
        }
    }
    tracing::warn!(table = %ident, "compaction lost {ATTEMPTS} swaps in a row to concurrent commits; left for the next run");
    Ok(None)
}

async fn live_entries(table: &Table) -> Result<Live> {
    let mut manifests = Vec::new();
    let listed = rowdelta::current_manifests(table)
        .await
        .map_err(|e| external(format!("cannot read {}", table.identifier()), e))?;
    for m in listed {
        let manifest = m
            .load_manifest(table.file_io())
            .await
            .map_err(|e| external(format!("cannot read manifest {}", m.manifest_path), e))?;
        let entries = manifest
            .entries()
            .iter()
            .filter(|e| e.is_alive())
            .cloned()
            .collect();
        manifests.push((m, entries));
    }
    Ok(Live { manifests })
}

/// What to replace: the small data files, and the delete files all of whose rows name
/// them (or files no longer live); `None` when that would not reduce the files.
async fn plan(table: &Table, live: &Live, target: u64) -> Result<Option<Plan>> {
    let entries = || live.manifests.iter().flat_map(|(_, e)| e.iter());
    if entries().any(|e| e.content_type() == DataContentType::EqualityDeletes) {
        tracing::warn!(table = %table.identifier(), "the table has equality deletes, which compaction does not apply: not compacted");
        return Ok(None);
    }
    let live_data: HashSet<&str> = entries()
        .filter(|e| e.content_type() == DataContentType::Data)
        .map(|e| e.file_path())
        .collect();
    let mut data: Vec<ManifestEntryRef> = entries()
        .filter(|e| e.content_type() == DataContentType::Data && e.file_size_in_bytes() < target)
        .cloned()
        .collect();
    data.sort_by(|a, b| {
        (a.sequence_number(), a.file_path()).cmp(&(b.sequence_number(), b.file_path()))
    });
    let candidates: HashSet<&str> = data.iter().map(|e| e.file_path()).collect();
    let mut deletes = Vec::new();
    for entry in entries().filter(|e| e.content_type() == DataContentType::PositionDeletes) {
        let named = match entry.data_file().referenced_data_file() {
            Some(one) => vec![one],
            None => crate::rowdelta::rebase::deleted_files(table, entry.file_path())
                .await
                .map_err(|e| external(format!("cannot read {}", entry.file_path()), e))?,
        };
        if named
            .iter()
            .all(|f| candidates.contains(f.as_str()) || !live_data.contains(f.as_str()))
        {
            deletes.push(entry.clone());
        }
    }
    if data.len() < 2 && deletes.is_empty() {
        return Ok(None);
    }
    let bytes = data.iter().map(|e| e.file_size_in_bytes()).sum();
    Ok(Some(Plan {
        data,
        deletes,
        bytes,
    }))
}

/// Writes the live rows of `plan`'s data files (their deletes applied by iceberg's
/// reader) as new data files, in order.
async fn rewrite(
    table: &Table,
    plan: &Plan,
    snapshot_id: i64,
    target: u64,
) -> Result<Vec<DataFile>> {
    let ident = table.identifier().to_string();
    let md = table.metadata();
    let ext = |e: iceberg::Error| external(format!("cannot read {ident} to compact it"), e);
    let order: HashMap<&str, usize> = (plan.data.iter().enumerate())
        .map(|(i, e)| (e.file_path(), i))
        .collect();
    let mut tasks: Vec<_> = table
        .scan()
        .select_all()
        .build()
        .map_err(ext)?
        .plan_files()
        .await
        .map_err(ext)?
        .try_filter(|t| futures::future::ready(order.contains_key(t.data_file_path.as_str())))
        .try_collect()
        .await
        .map_err(ext)?;
    tasks.sort_by_key(|t: &iceberg::scan::FileScanTask| order[t.data_file_path.as_str()]);
    let schema = md.current_schema().clone();
    let arrow = Arc::new(
        iceberg::arrow::schema_to_arrow_schema(&schema)
            .map_err(|e| SinkError::Corrupt(format!("{ident}: {e}")))?,
    );
    let spec = WriterSpec {
        file_io: table.file_io().clone(),
        schema,
        ident: ident.clone(),
        location: format!("{}/data", md.location().trim_end_matches('/')),
        prefix: format!("{COMPACTED_PREFIX}{snapshot_id}"),
        target_file_size: target as usize,
    };
    let tracker = TaskTracker::new();
    let mut writer = Staging::start(spec, &tracker).await?;
    let mut batches = table
        .reader_builder()
        .with_data_file_concurrency_limit(1)
        .build()
        .read(futures::stream::iter(tasks.into_iter().map(Ok)).boxed())
        .map_err(ext)?
        .stream();
    while let Some(batch) = batches.next().await {
        let batch = batch.map_err(ext)?;
        if batch.num_rows() == 0 {
            continue;
        }
        let batch = RecordBatch::try_new(arrow.clone(), batch.columns().to_vec())
            .map_err(|e| SinkError::Corrupt(format!("a row of {ident} read back: {e}")))?;
        writer.write(batch).await?;
    }
    writer.close().await
}

/// The `sluice.*` properties of the newest snapshot of ours in the current ancestry:
/// what a maintenance snapshot carries, so the sink's walk still finds them.
pub(super) fn carried_properties(table: &Table) -> HashMap<String, String> {
    ancestry(table.metadata())
        .iter()
        .map(|s| &s.summary().additional_properties)
        .find(|p| p.contains_key(SUMMARY_DEPLOYMENT))
        .map(|p| {
            p.iter()
                .filter(|(k, _)| k.starts_with("sluice.") && k.as_str() != SUMMARY_MAINTENANCE)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// The replace snapshot: untouched manifests carried, the touched ones' entries
/// rewritten (replaced ─▶ deleted, the rest existing), the new files added.
async fn snapshot(
    table: &Table,
    live: &Live,
    plan: &Plan,
    written: Vec<DataFile>,
    snapshot_id: i64,
) -> Result<NewSnapshot> {
    let md = table.metadata();
    let sequence = md.next_sequence_number();
    let replaced: HashSet<&str> = (plan.data.iter().chain(&plan.deletes))
        .map(|e| e.file_path())
        .collect();
    let (schema, spec) = (
        md.current_schema().clone(),
        md.default_partition_spec().clone(),
    );
    let mut summary = SnapshotSummaryCollector::default();
    let mut manifests = Vec::new();
    let (mut data, mut deletes): (Vec<Entry>, Vec<Entry>) = (Vec::new(), Vec::new());
    for (manifest, entries) in &live.manifests {
        if !entries.iter().any(|e| replaced.contains(e.file_path())) {
            manifests.push(manifest.clone());
            continue;
        }
        for e in entries {
            let file = e.data_file().clone();
            let sequence = e.sequence_number().unwrap_or(manifest.sequence_number);
            let file_sequence = e.file_sequence_number.or(Some(sequence));
            let entry = if replaced.contains(e.file_path()) {
                summary.remove_file(&file, schema.clone(), spec.clone());
                Entry::Deleted {
                    file,
                    sequence,
                    file_sequence,
                }
            } else {
                Entry::Existing {
                    file,
                    snapshot_id: e.snapshot_id().unwrap_or(manifest.added_snapshot_id),
                    sequence,
                    file_sequence,
                }
            };
            match manifest.content {
                ManifestContentType::Data => data.push(entry),
                ManifestContentType::Deletes => deletes.push(entry),
            }
        }
    }
    for file in written {
        summary.add_file(&file, schema.clone(), spec.clone());
        data.push(Entry::Added(file));
    }
    for (name, content, entries) in [
        ("c0", ManifestContentType::Data, data),
        ("c1", ManifestContentType::Deletes, deletes),
    ] {
        if entries.is_empty() {
            continue;
        }
        let written =
            rowdelta::write_manifest(table, snapshot_id, sequence, name, content, entries)
                .await
                .map_err(|e| {
                    external(
                        format!("cannot write a manifest of {}", table.identifier()),
                        e,
                    )
                })?;
        manifests.push(written);
    }
    let mut properties = carried_properties(table);
    properties.insert(SUMMARY_MAINTENANCE.into(), "compaction".into());
    properties.extend(summary.build());
    Ok(NewSnapshot {
        snapshot_id,
        sequence,
        manifests,
        operation: Operation::Replace,
        summary: properties,
    })
}
