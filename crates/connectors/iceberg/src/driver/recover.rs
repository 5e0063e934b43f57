//! Recovery of the Iceberg sink: what a restart finds in the warehouse and the tables
//! made right before the first epoch, and what must not be made right refused.
//!
//! ```text
//!  undecided epochs' staging ─▶ removed (unless the cleaner did it)
//!  decided descriptor        ─▶ its generation adopted; applied (unless the committer did)
//!  a table behind the log    ─▶ refused: the table rolled back, or recreated, losing
//!                               transactions the log committed to it
//!  a table ahead of the log  ─▶ refused: a log restored from an older backup, or the
//!                               view (upsert) or change log of another run: a log
//!                               removed, a cluster's etcd keys deleted (the operator
//!                               chooses)
//!  the upsert index          ─▶ brought to the tables
//!  our staging folders       ─▶ files no snapshot and no decided epoch holds, removed
//! ```

use super::detached::{intent_prefixes, remove_staging};
use super::{IcebergSink, Result, load_optional};
use crate::commit::{self, Descriptor, Generation, Owner, epoch_folder};
use iceberg::Catalog;
use sluice_sink_sdk::{Recovery, SinkError};
use std::collections::{HashMap, HashSet};

impl IcebergSink {
    /// `EpochSink::recover`: undecided staging removed, the generation taken from the
    /// decided descriptor (or minted), that descriptor applied, tables ahead of the log
    /// refused, the upsert index brought to the tables, and orphans swept.
    pub(super) async fn recover_tables(&mut self, recovery: &Recovery) -> Result<()> {
        if !recovery.undecided_cleaned {
            for undecided in &recovery.undecided {
                for p in intent_prefixes(undecided)? {
                    self.remove_prefix(p).await?;
                }
            }
        }
        let decided = match &recovery.decided {
            Some(decided) => Some(Descriptor::parse(&decided.descriptor, &self.owner()?)?),
            None => None,
        };
        let generation = match decided.as_ref().map(|d| d.generation.clone()) {
            Some(Some(generation)) => generation,
            // Decided by the release before generations: its snapshots are this log's.
            Some(None) => Generation::mint(true),
            // A new log (or one that never decided anything to apply): a new generation.
            None => Generation::mint(false),
        };
        tracing::info!(
            generation = generation.id,
            adopts_unstamped = generation.adopts_unstamped,
            "the Iceberg sink's generation"
        );
        self.generation = Some(generation);
        let decided_epoch = decided.as_ref().map(|d| d.epoch);
        if let Some(d) = decided {
            let bound: HashSet<&str> = self.tables.iter().map(|t| t.ident.name()).collect();
            self.held = (d.tables.into_iter())
                .filter(|(table, _)| bound.contains(table.as_str()))
                .collect();
            self.refuse_tables_behind_the_log().await?;
            self.pending = d.epochs;
            if d.commit {
                if recovery.decided_applied {
                    // The committer put them in the tables already.
                    self.pending.clear();
                } else {
                    self.commit_pending(d.epoch).await?;
                }
            }
        }
        self.refuse_tables_ahead_of_the_log(decided_epoch).await?;
        self.sync_upsert().await?;
        self.sweep_orphans().await
    }

    /// Refuses a table holding less than the decided descriptor says it did
    /// ([`commit::check_mark`]), whether or not that descriptor commits anything now:
    /// the next epochs would be appended above the transactions it lost.
    async fn refuse_tables_behind_the_log(&self) -> Result<()> {
        let catalog = self.catalog.clone().expect("open");
        let owner = self.owner()?;
        let generation = self.generation()?;
        for bound in &self.tables {
            let Some(mark) = self.held.get(bound.ident.name()) else {
                continue;
            };
            let table = catalog
                .load_table(&bound.ident)
                .await
                .map_err(|e| SinkError::External(format!("cannot load {}: {e}", bound.ident)))?;
            let committed = commit::committed_txn(table.metadata(), &owner, generation)?;
            commit::check_mark(&bound.ident, table.metadata(), committed, mark)?;
        }
        Ok(())
    }

    /// Refuses a table that is ahead of the recovery log, which the log's next epochs
    /// would then be applied to twice:
    /// - a table holding an epoch of this generation above the last one the log
    ///   decided (`decided`): the log was restored from an older backup, so its
    ///   transactions after that would be read and numbered again, and skipped or
    ///   counted twice where their boundaries differ from the first time's;
    /// - a table whose last snapshot is this materialization's of another run
    ///   ([`another_run`]): an upsert table's of another deployment or generation, a
    ///   change log's of another deployment.
    ///
    /// Either way the operator chooses: restore the newest log, or drop the table.
    async fn refuse_tables_ahead_of_the_log(&self, decided: Option<u64>) -> Result<()> {
        let Some(catalog) = self.catalog.clone() else {
            return Ok(());
        };
        let owner = self.owner()?;
        let generation = self.generation()?;
        for (binding, bound) in self.tables.iter().enumerate() {
            let Some(table) = load_optional(&catalog, &bound.ident).await? else {
                continue;
            };
            let committed = commit::committed_txn(table.metadata(), &owner, generation)?;
            if let Some(committed) = committed.filter(|&c| decided.is_none_or(|d| c > d)) {
                return Err(SinkError::Config(format!(
                    "Iceberg table {} holds epoch {committed} of materialization {}, but its \
                     recovery log decided {}: the log was restored from an older backup, and \
                     the transactions after it would be applied to the table again. Restore \
                     the newest copy of the recovery log, or, to start over, drop the table, \
                     remove the materialization's recovery log folder and run `sluice apply`",
                    bound.ident,
                    owner.materialization,
                    decided.map_or("no epoch".to_string(), |d| format!("epochs up to {d} only")),
                )));
            }
            let Some(last) = table.metadata().current_snapshot() else {
                continue;
            };
            let upsert = self.upsert.is_upsert(binding);
            let summary = &last.summary().additional_properties;
            if let Some(refusal) = another_run(summary, &owner, generation, upsert) {
                return Err(SinkError::Config(format!(
                    "Iceberg table {} {refusal}",
                    bound.ident
                )));
            }
        }
        Ok(())
    }

    /// Removes the files under our attempt prefixes that no snapshot of the table and no
    /// decided pending epoch holds, in this generation's epoch folders above the table's
    /// last epoch of it (`sluice.txn`): the folders of committed epochs are left alone,
    /// so a clean restart reads no manifest, and so are another generation's (a run
    /// before a reset: what it left is not this run's to judge). A file is removed only
    /// after the manifests of every snapshot were read and none names it (the ancestry
    /// alone could undercount, after an expired snapshot).
    async fn sweep_orphans(&mut self) -> Result<()> {
        let catalog = self.catalog.clone().expect("open");
        let owner = self.owner()?;
        let generation = self.generation()?.clone();
        let keep: HashSet<&str> = self
            .pending
            .iter()
            .flat_map(|e| e.files.iter().map(|f| f.path.as_str()))
            .collect();
        for bound in &self.tables {
            let dir = format!("{}/", bound.attempt_prefix);
            let files = catalog.storage().list(&bound.attempt_prefix).await?;
            if files.is_empty() {
                continue;
            }
            let table = catalog
                .load_table(&bound.ident)
                .await
                .map_err(|e| SinkError::External(format!("cannot load {}: {e}", bound.ident)))?;
            let committed = commit::committed_txn(table.metadata(), &owner, &generation)?;
            let candidates: Vec<String> = files
                .into_iter()
                .filter(|p| {
                    // `<attempt prefix>/<generation>-<epoch>/<file>` (`<epoch>` before
                    // generations); anything else is a candidate too.
                    let folder = (p.strip_prefix(&dir))
                        .and_then(|rest| rest.split('/').next().filter(|_| rest.contains('/')));
                    match folder.map(epoch_folder) {
                        Some(Some((of, _))) if !generation.owns(of.as_ref()) => false,
                        Some(Some((_, e))) => committed.is_none_or(|c| e > c),
                        _ => true,
                    }
                })
                .filter(|p| !keep.contains(p.as_str()))
                .collect();
            if candidates.is_empty() {
                continue;
            }
            let referenced = crate::read::referenced_files(&table).await?;
            for path in candidates {
                if !referenced.contains(&path) {
                    tracing::info!(%path, "removing an orphaned Iceberg staging file");
                    catalog
                        .file_io()
                        .delete(&path)
                        .await
                        .map_err(|e| SinkError::External(format!("cannot remove {path}: {e}")))?;
                }
            }
            catalog
                .storage()
                .remove_empty_dirs(&bound.attempt_prefix)
                .await;
        }
        Ok(())
    }

    /// Removes a staging prefix an intent named, after checking it is ours.
    pub(super) async fn remove_prefix(&mut self, prefix: &str) -> Result<()> {
        let attempt = self.attempt()?;
        let catalog = self.catalog.as_ref().expect("open");
        // Ours: under a bound table's attempt prefix, or (a table since unbound) under
        // the warehouse with our attempt's folder in it.
        let of_bound = self
            .tables
            .iter()
            .any(|t| prefix.starts_with(&format!("{}/", t.attempt_prefix)));
        remove_staging(catalog.storage(), &attempt, of_bound, prefix).await
    }
}

/// Why a table whose last snapshot's `summary` is this materialization's of another run
/// than `owner`'s `generation` is refused, if it is:
/// - an upsert table's of another deployment or generation: the recovery log (and the
///   deployment id beside it, or a cluster's etcd keys) was removed or replaced, or
///   another copy of the pipeline writes the table, so the input would be read again
///   from the beginning and reduced onto the rows that run left (which Load answers);
/// - a change log's of another deployment: the same loss, with the input appended
///   again, every change twice. Another generation of this deployment is a recovery
///   log folder removed on purpose (a start over, documented): its generation tells its
///   rows apart, and it is taken.
fn another_run(
    summary: &HashMap<String, String>,
    owner: &Owner,
    generation: &Generation,
    upsert: bool,
) -> Option<String> {
    if summary.get(commit::SUMMARY_MATERIALIZATION) != Some(&owner.materialization) {
        return None;
    }
    let stamped = summary.get(commit::SUMMARY_GENERATION);
    let same_deployment = summary.get(commit::SUMMARY_DEPLOYMENT) == Some(&owner.deployment);
    let (what, twice) = match upsert {
        true if same_deployment && generation.owns(stamped) => return None,
        true => ("(mode: upsert) holds the view", "reduced onto those rows"),
        false if same_deployment => return None,
        false => ("holds the change log", "appended to it again"),
    };
    Some(format!(
        "{what} of another run of materialization {} (deployment {}, generation {}): its \
         recovery log was removed or replaced (with a cluster: its etcd keys were deleted, \
         the shard's log and the deployment id with them), or another copy of the pipeline \
         writes the table, so the input would be read again from the beginning and \
         {twice}, counting it twice. Drop the table and run `sluice apply` to start over, \
         or restore the recovery log (with a cluster: its etcd keys)",
        owner.materialization,
        summary
            .get(commit::SUMMARY_DEPLOYMENT)
            .map_or("?", String::as_str),
        stamped.map_or("from before generations", String::as_str),
    ))
}
