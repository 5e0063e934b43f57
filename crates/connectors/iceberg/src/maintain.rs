//! Table maintenance: what a streaming writer's many small commits leave behind, cleaned
//! up in three steps, each one catalog commit (or none), each safe beside a running sink.
//!
//! ```text
//!  compact   small data files (< target_file_size) and the position deletes that apply
//!            to them ─▶ target-sized files of their live rows: one `replace` snapshot
//!  expire    snapshots beyond the newest keep_snapshots and older than snapshot_age
//!            ─▶ one metadata commit removing them; then the files only they referenced
//!  orphans   files under the table's location no snapshot references, older than
//!            orphan_age ─▶ removed (the sink's staging above its last commit excepted)
//! ```
//!
//! Exactly once, as the sink's own commits are: every step computes its commit on the
//! metadata it read and swaps it in through the catalog pinned to that metadata
//! (`catalog.rs`), so a sink commit in between fails the swap and the step starts over
//! (or gives up cleanly); files a step wrote before a lost swap are removed, and those
//! of an attempt cut short are orphans the next run removes. Files are removed only
//! after the commit that unreferences them.
//!
//! What keeps the sink's exactly-once walk right (`commit.rs`'s `committed_txn` reads
//! the ancestry of the current snapshot, and stops at the first expired one):
//! - a compaction snapshot carries the `sluice.*` properties of the newest snapshot of
//!   ours below it (deployment, materialization, generation, and `sluice.txn`, the
//!   highest transaction the table already holds), so the walk finds what the table
//!   holds in it even once every older snapshot has expired;
//! - expiry keeps the current snapshot's ancestry unbroken down to the newest snapshot
//!   of each materialization that wrote the table (a run's older generations, replaced
//!   by a reset, never commit again);
//! - orphan removal leaves the sink's staging folders of epochs above the table's last
//!   commit of their generation alone: those may be decided and not yet applied (the
//!   recovery log is not read; the sink's own abort cleaner removes undecided ones).
//!
//! An upsert table's index of live rows (`index.rs`) notices a snapshot it did not write
//! (a `replace`, or an expired snapshot it reflected) and rebuilds from the table; an
//! upsert epoch whose deletes were staged before a compaction committed is rebased onto
//! the rewritten rows at its commit (`rowdelta/rebase.rs`).

mod compact;
mod expire;
mod orphans;

use crate::catalog::SqlCatalog;
use crate::config::MaintenanceConfig;
use iceberg::Catalog;
pub use iceberg::TableIdent;
use iceberg::spec::{DataContentType, TableMetadata};
use iceberg::table::Table;
use serde::Serialize;
use sluice_sink_sdk::{Result, SinkError};
use std::time::Duration;

pub use crate::config::{DEFAULT_KEEP_SNAPSHOTS, DEFAULT_ORPHAN_AGE, DEFAULT_SNAPSHOT_AGE};

/// The summary property a maintenance snapshot carries beside ours: which step made it.
pub const SUMMARY_MAINTENANCE: &str = "sluice.maintenance";
/// Swaps a step may lose to concurrent commits before it gives up for this run.
const ATTEMPTS: usize = 3;

/// Table `table` of namespace `namespace` (dots separate its levels).
pub fn table_ident(namespace: &str, table: &str) -> Result<TableIdent> {
    let ns = iceberg::NamespaceIdent::from_strs(namespace.split('.'))
        .map_err(|e| SinkError::Config(format!("namespace {namespace:?}: {e}")))?;
    Ok(TableIdent::new(ns, table.to_string()))
}

/// What the steps keep and aim for (`keep_snapshots` at least 2: compaction runs only
/// where it leaves two or more files or deletes behind it, so with the snapshot before
/// it kept, the files an upsert transaction in flight names stay readable until that
/// transaction commits: `rowdelta/rebase.rs`).
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    pub target_file_size: u64,
    pub keep_snapshots: u32,
    pub snapshot_age: Duration,
    pub orphan_age: Duration,
    /// Plan only: report what each step would do, change nothing.
    pub dry_run: bool,
}

impl From<&MaintenanceConfig> for Options {
    fn from(c: &MaintenanceConfig) -> Options {
        Options {
            target_file_size: c.target_file_size,
            keep_snapshots: c.keep_snapshots,
            snapshot_age: c.snapshot_age,
            orphan_age: c.orphan_age,
            dry_run: false,
        }
    }
}

impl Default for Options {
    fn default() -> Options {
        Options::from(&MaintenanceConfig::default())
    }
}

/// What maintenance did to one table (with `dry_run`, what it would do: the `after`
/// counts then assume the compaction's estimate).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TableReport {
    /// `namespace.table`.
    pub table: String,
    pub data_files_before: usize,
    pub data_files_after: usize,
    pub delete_files_before: usize,
    pub delete_files_after: usize,
    pub snapshots_expired: usize,
    pub orphans_removed: usize,
}

/// One step's outcome, as its progress line says it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Data files and delete files replaced, data files written (`None`: nothing to do,
    /// or the swap was lost to concurrent commits every time).
    Compacted(Option<(usize, usize, usize)>),
    Expired {
        snapshots: usize,
        files: usize,
    },
    OrphansRemoved(usize),
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Step::Compacted(None) => write!(f, "compact: nothing to compact"),
            Step::Compacted(Some((data, deletes, written))) => write!(
                f,
                "compact: {data} data files and {deletes} delete files into {written} data files"
            ),
            Step::Expired { snapshots, files } => write!(
                f,
                "expire: {snapshots} snapshots, {files} files only they referenced"
            ),
            Step::OrphansRemoved(n) => write!(f, "orphans: {n} files removed"),
        }
    }
}

pub(crate) fn external(what: String, e: iceberg::Error) -> SinkError {
    SinkError::External(format!("{what}: {e}"))
}

pub(crate) async fn load(catalog: &SqlCatalog, ident: &TableIdent) -> Result<Table> {
    catalog
        .load_table(ident)
        .await
        .map_err(|e| external(format!("cannot load Iceberg table {ident}"), e))
}

/// Counts of the live data files and delete files of `table`'s current snapshot.
pub(crate) async fn live_counts(table: &Table) -> Result<(usize, usize)> {
    let (mut data, mut deletes) = (0, 0);
    let manifests = crate::rowdelta::current_manifests(table)
        .await
        .map_err(|e| external(format!("cannot read {}", table.identifier()), e))?;
    for m in manifests {
        let manifest = m
            .load_manifest(table.file_io())
            .await
            .map_err(|e| external(format!("cannot read manifest {}", m.manifest_path), e))?;
        for entry in manifest.entries().iter().filter(|e| e.is_alive()) {
            match entry.content_type() {
                DataContentType::Data => data += 1,
                _ => deletes += 1,
            }
        }
    }
    Ok((data, deletes))
}

/// The snapshots from the current one down its parents, newest first, as far as they
/// are kept.
pub(crate) fn ancestry(md: &TableMetadata) -> Vec<iceberg::spec::SnapshotRef> {
    let mut out = Vec::new();
    let mut next = md.current_snapshot_id();
    while let Some(snapshot) = next.and_then(|id| md.snapshot_by_id(id)) {
        if out.len() > md.snapshots().len() {
            break; // a cycle: the walk in commit.rs reports it
        }
        next = snapshot.parent_snapshot_id();
        out.push(snapshot.clone());
    }
    out
}

/// Runs the three steps on table `ident`, each one commit, calling `progress` after
/// each. Postcondition (unless `dry_run`): the table's rows are those it had.
pub async fn maintain_table(
    catalog: &SqlCatalog,
    ident: &TableIdent,
    options: &Options,
    progress: &mut (dyn FnMut(&Step) + Send),
) -> Result<TableReport> {
    if options.keep_snapshots < 2 {
        return Err(SinkError::Config(format!(
            "maintenance of {ident}: keep_snapshots {} is below 2",
            options.keep_snapshots
        )));
    }
    let (data_files_before, delete_files_before) =
        live_counts(&load(catalog, ident).await?).await?;
    let compacted = compact::compact(catalog, ident, options).await?;
    progress(&Step::Compacted(compacted));
    let (snapshots, files) = expire::expire(catalog, ident, options).await?;
    progress(&Step::Expired { snapshots, files });
    let orphans = orphans::remove_orphans(catalog, ident, options).await?;
    progress(&Step::OrphansRemoved(orphans));
    let (data_files_after, delete_files_after) = match (options.dry_run, compacted) {
        (false, _) => live_counts(&load(catalog, ident).await?).await?,
        (true, None) => (data_files_before, delete_files_before),
        (true, Some((data, deletes, written))) => (
            data_files_before - data + written,
            delete_files_before - deletes,
        ),
    };
    Ok(TableReport {
        table: ident.to_string(),
        data_files_before,
        data_files_after,
        delete_files_before,
        delete_files_after,
        snapshots_expired: snapshots,
        orphans_removed: orphans,
    })
}

/// Automatic maintenance (`maintenance:` of the endpoint): after every `every` table
/// commits of the sink, the steps on its tables, outside the commit. A failure is
/// logged and tried again after the next commit, never the transaction's.
#[derive(Debug, Default)]
pub(crate) struct AutoMaintenance {
    config: Option<MaintenanceConfig>,
    /// Commits since maintenance last ran whole.
    commits: u64,
}

/// How long automatic maintenance may take inside a `commit_epoch` call: half of its
/// deadline (`WRITE_TIMEOUT`), so the call itself never times out. A step cut short
/// leaves orphans the next run removes (its swap is atomic).
const AUTO_DEADLINE: Duration = Duration::from_secs(60);

impl AutoMaintenance {
    pub(crate) fn new(config: Option<MaintenanceConfig>) -> AutoMaintenance {
        AutoMaintenance { config, commits: 0 }
    }

    /// Counts a table commit; every `every`, maintains `tables`.
    pub(crate) async fn after_commit(&mut self, catalog: &SqlCatalog, tables: &[TableIdent]) {
        let Some(config) = &self.config else { return };
        self.commits += 1;
        if self.commits < config.every {
            return;
        }
        let options = Options::from(config);
        let run = async {
            for ident in tables {
                let mut log = |step: &Step| tracing::info!(table = %ident, "maintenance {step}");
                maintain_table(catalog, ident, &options, &mut log).await?;
            }
            Ok::<_, SinkError>(())
        };
        match tokio::time::timeout(AUTO_DEADLINE, run).await {
            Ok(Ok(())) => self.commits = 0,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "Iceberg maintenance failed; it runs again after the next commit")
            }
            Err(_) => tracing::warn!(
                "Iceberg maintenance took longer than {AUTO_DEADLINE:?}; it runs again after the next commit"
            ),
        }
    }
}
