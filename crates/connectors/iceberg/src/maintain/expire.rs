//! Snapshot expiry: one metadata commit removing the snapshots nobody needs, then the
//! files only they referenced.
//!
//! ```text
//!  ancestry of the current snapshot, newest first:  C  P1  P2 … Pk | Pk+1 …
//!  kept: the newest max(keep_snapshots, depth) of it, where depth reaches the newest
//!        snapshot of each materialization that wrote the table (the exactly-once walk
//!        stops at the first expired ancestor, so what it needs is kept unbroken);
//!        any snapshot younger than snapshot_age
//!  removed: the rest; then the manifest lists, manifests and data files that no kept
//!           snapshot references (after the swap, never before)
//! ```

use super::{ATTEMPTS, Options, ancestry, external, load};
use crate::catalog::SqlCatalog;
use crate::commit::{SUMMARY_DEPLOYMENT, SUMMARY_MATERIALIZATION};
use crate::read::snapshot_files;
use iceberg::spec::TableMetadata;
use iceberg::{ErrorKind, TableIdent, TableUpdate};
use sluice_sink_sdk::Result;
use std::collections::HashSet;
use std::time::{Duration, SystemTime};

/// Pure: the snapshot ids of `md` to expire, as of `now_ms`.
pub(super) fn to_expire(md: &TableMetadata, keep: u32, age: Duration, now_ms: i64) -> Vec<i64> {
    let chain = ancestry(md);
    let mut seen = HashSet::new();
    let mut depth = 0;
    for (i, s) in chain.iter().enumerate() {
        let p = &s.summary().additional_properties;
        if let (Some(d), Some(m)) = (p.get(SUMMARY_DEPLOYMENT), p.get(SUMMARY_MATERIALIZATION))
            && seen.insert((d.clone(), m.clone()))
        {
            depth = i + 1;
        }
    }
    let kept: HashSet<i64> = chain
        .iter()
        .take(depth.max(keep as usize))
        .map(|s| s.snapshot_id())
        .collect();
    // The one ref the sink and maintenance write is `main`, the chain's head (iceberg
    // 0.10 lists no others; the builder drops a ref whose snapshot is removed).
    let oldest_kept = now_ms.saturating_sub(age.as_millis() as i64);
    let mut out: Vec<i64> = md
        .snapshots()
        .filter(|s| !kept.contains(&s.snapshot_id()) && s.timestamp_ms() < oldest_kept)
        .map(|s| s.snapshot_id())
        .collect();
    out.sort();
    out
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

/// Expires table `ident`'s old snapshots: `(snapshots expired, files removed)`.
pub(super) async fn expire(
    catalog: &SqlCatalog,
    ident: &TableIdent,
    options: &Options,
) -> Result<(usize, usize)> {
    for _ in 0..ATTEMPTS {
        let table = load(catalog, ident).await?;
        let md = table.metadata();
        let expired = to_expire(md, options.keep_snapshots, options.snapshot_age, now_ms());
        if expired.is_empty() || options.dry_run {
            return Ok((expired.len(), 0));
        }
        let gone: HashSet<i64> = expired.iter().copied().collect();
        let (old, kept): (Vec<_>, Vec<_>) = md
            .snapshots()
            .cloned()
            .partition(|s| gone.contains(&s.snapshot_id()));
        let kept_files = snapshot_files(&table, &kept, true).await?;
        let mut unreferenced: Vec<String> = snapshot_files(&table, &old, false)
            .await?
            .into_iter()
            .filter(|f| !kept_files.contains(f))
            .collect();
        unreferenced.sort();
        let base = table
            .metadata_location_result()
            .map_err(|e| external(format!("{ident}"), e))?;
        let updates = vec![TableUpdate::RemoveSnapshots {
            snapshot_ids: expired.clone(),
        }];
        let committed = catalog
            .pinned(base)
            .commit_updates(ident, crate::rowdelta::on_top_of(&table), updates)
            .await;
        match committed {
            Ok(_) => {
                // After the swap: no kept snapshot names them.
                catalog.storage().delete(&unreferenced).await?;
                return Ok((expired.len(), unreferenced.len()));
            }
            Err(e) if e.kind() == ErrorKind::CatalogCommitConflicts => {
                tracing::info!(table = %ident, "expiry lost its swap to a concurrent commit; planning again");
            }
            Err(e) => return Err(external(format!("cannot expire snapshots of {ident}"), e)),
        }
    }
    tracing::warn!(table = %ident, "expiry lost {ATTEMPTS} swaps in a row to concurrent commits; left for the next run");
    Ok((0, 0))
}
