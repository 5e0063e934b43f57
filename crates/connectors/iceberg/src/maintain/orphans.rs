//! Orphan removal: the files under a table's location that no snapshot, no manifest and
//! no logged metadata file references (the metadata, manifests and manifest lists of
//! commits cut short before their swap, a lost compaction's files, files expired
//! before a crash removed them, staging of committed epochs left behind), once older
//! than `orphan_age`.
//!
//! The sink's staging folders (`<data>/_sluice/<attempt>/<generation>-<epoch>/`) of
//! epochs above the table's last commit of that generation are left alone whatever
//! their age: such an epoch may be decided, its descriptor waiting in the recovery log
//! to be applied at the next start, which needs its files (the sink's abort cleaner
//! removes the undecided ones). A generation whose snapshots are all expired, or were
//! never committed, keeps its staging for the same reason.

use super::{Options, ancestry, load};
use crate::catalog::SqlCatalog;
use crate::commit::{STAGING_DIR, epoch_folder};
use crate::commit::{SUMMARY_DEPLOYMENT, SUMMARY_GENERATION, SUMMARY_TXN};
use iceberg::TableIdent;
use iceberg::spec::TableMetadata;
use sluice_sink_sdk::Result;
use std::collections::HashMap;
use std::time::SystemTime;

/// The highest `sluice.txn` in the current ancestry per generation (`None`: snapshots
/// of ours from before generations).
fn committed_by_generation(md: &TableMetadata) -> HashMap<Option<String>, u64> {
    let mut out: HashMap<Option<String>, u64> = HashMap::new();
    for s in ancestry(md) {
        let p = &s.summary().additional_properties;
        if !p.contains_key(SUMMARY_DEPLOYMENT) {
            continue;
        }
        if let Some(txn) = p.get(SUMMARY_TXN).and_then(|t| t.parse::<u64>().ok()) {
            let best = out.entry(p.get(SUMMARY_GENERATION).cloned()).or_default();
            *best = (*best).max(txn);
        }
    }
    out
}

/// Pure: whether `path` is sink staging that the table has not committed through, so
/// only the sink may judge it.
fn sink_owned(path: &str, committed: &HashMap<Option<String>, u64>) -> bool {
    let marker = format!("/data/{STAGING_DIR}/");
    let Some((_, rest)) = path.split_once(&marker) else {
        return false;
    };
    // `<attempt>/<epoch folder>/<file>`
    let mut parts = rest.split('/');
    let (Some(_attempt), Some(folder), Some(_file)) = (parts.next(), parts.next(), parts.next())
    else {
        return false;
    };
    match epoch_folder(folder) {
        Some((generation, epoch)) => committed.get(&generation).is_none_or(|c| epoch > *c),
        None => false,
    }
}

/// Removes the orphans of table `ident`: how many (with `dry_run`, would be).
pub(super) async fn remove_orphans(
    catalog: &SqlCatalog,
    ident: &TableIdent,
    options: &Options,
) -> Result<usize> {
    let table = load(catalog, ident).await?;
    let referenced = crate::read::referenced_files(&table).await?;
    let committed = committed_by_generation(table.metadata());
    let location = table
        .metadata()
        .location()
        .trim_end_matches('/')
        .to_string();
    let now = SystemTime::now();
    let orphans: Vec<String> = catalog
        .storage()
        .list_modified(&location)
        .await?
        .into_iter()
        .filter(|(path, written)| {
            !referenced.contains(path)
                && now.duration_since(*written).unwrap_or_default() >= options.orphan_age
                && !sink_owned(path, &committed)
        })
        .map(|(path, _)| path)
        .collect();
    if options.dry_run || orphans.is_empty() {
        return Ok(orphans.len());
    }
    for path in &orphans {
        tracing::info!(table = %ident, %path, "removing an orphaned file");
    }
    catalog.storage().delete(&orphans).await?;
    catalog.storage().remove_empty_dirs(&location).await;
    Ok(orphans.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_above_the_last_commit_of_its_generation_is_the_sinks() {
        let committed = HashMap::from([(Some("g1".to_string()), 5), (None, 2)]);
        let at = |folder: &str| {
            format!("s3://b/w/ns.db/t/data/_sluice/dep-lake-1/{folder}/b0-x-00000.parquet")
        };
        assert!(!sink_owned(&at("g1-5"), &committed), "committed");
        assert!(sink_owned(&at("g1-6"), &committed), "maybe decided");
        assert!(
            sink_owned(&at("g2-1"), &committed),
            "a generation never seen"
        );
        assert!(
            !sink_owned(&at("2"), &committed),
            "before generations, committed"
        );
        assert!(sink_owned(&at("3"), &committed));
        assert!(!sink_owned("s3://b/w/ns.db/t/metadata/x.avro", &committed));
        assert!(!sink_owned(
            "s3://b/w/ns.db/t/data/compacted-1-00000.parquet",
            &committed
        ));
    }
}
