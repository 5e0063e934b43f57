//! Descriptors and the exactly-once table commit.
//!
//! A descriptor is what `pre_commit` returns and the recovery log keeps as the decision.
//! It is cumulative: it lists the staged files of every decided epoch not yet in a table
//! snapshot (with `commit_every > 1`) and of its own epoch, so the log's last descriptor
//! alone is enough to finish all of them after a crash.
//!
//! ```text
//!  epoch:        4        5        6 (due: 6 % 3 == 0)
//!  descriptor:  [4]     [4,5]    [4,5,6] commit ─▶ one fast append, summary sluice.txn = 6
//! ```
//!
//! Each snapshot we commit carries `sluice.deployment`, `sluice.materialization` (the
//! sink), `sluice.generation` (the recovery log's [`Generation`]) and `sluice.txn` (the
//! epoch that committed it) in its summary. Epochs are committed in order and all at
//! once per table, so a table holds epoch `e`'s files iff an ancestor of its current
//! snapshot has our generation and `sluice.txn >= e`. Another generation's snapshots
//! (a recovery log removed and started over, its transactions numbered anew) never
//! count: their `sluice.txn` says nothing of this generation's epochs. Applying a descriptor
//! (again) therefore walks the ancestry of the current snapshot ([`committed_txn`]),
//! keeps only the epochs above it ([`decide`], pure), and appends those on top of
//! exactly the metadata it read (a pinned catalog): a concurrent commit fails the swap
//! and the walk starts over. iceberg's duplicate-file check stays on behind ours: a
//! staged file the table holds already although the ancestry does not say so (an
//! expired ancestor) is `Corrupt`, never appended twice.
//!
//! An upsert table's epoch (`upsert.rs`) stages position delete files beside its data
//! files, listed in the same descriptor (a `StagedFile` whose `data_file` says its
//! content); its commit is one row-delta snapshot of both (`rowdelta.rs`) under the same
//! rules: the ancestry walk, the pinned metadata, the catalog's compare-and-swap.
//!
//! A descriptor also records what each table was known to hold when it was made
//! ([`TableMark`]: its `table-uuid` and the highest `sluice.txn` committed to it). A
//! table only gains transactions, so one that holds fewer, or is another table of the
//! same name, lost what the log committed to it: rolled back to an older snapshot or
//! backup, or dropped and created again. Applying the descriptor there would append its
//! pending epochs above a hole; [`check_mark`] refuses it instead.

use crate::catalog::SqlCatalog;
use iceberg::spec::{DataContentType, DataFile, TableMetadata, deserialize_data_file_from_json};
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::{Catalog, ErrorKind, TableIdent};
use serde::{Deserialize, Serialize};
use sluice_sink_sdk::SinkError;
use std::collections::{BTreeMap, HashMap};

pub const SUMMARY_DEPLOYMENT: &str = "sluice.deployment";
pub const SUMMARY_MATERIALIZATION: &str = "sluice.materialization";
pub const SUMMARY_TXN: &str = "sluice.txn";
pub const SUMMARY_GENERATION: &str = "sluice.generation";
/// The folder under a table's data location that holds this sink's staging.
pub const STAGING_DIR: &str = "_sluice";

/// The descriptor format written by this version.
pub const DESCRIPTOR_VERSION: u32 = 1;
/// Swaps lost to a concurrent writer before the commit gives up (retryably).
const COMMIT_ATTEMPTS: usize = 5;

/// Whose snapshots these are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub deployment: String,
    pub materialization: String,
}

/// The generation of a recovery log's run of the sink: minted when the log holds no
/// descriptor yet (a new log, or one after a reset), then carried by every descriptor,
/// so every snapshot of the run names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Generation {
    /// 16 lowercase hex digits: milliseconds since the epoch (48 bits), 16 random bits.
    pub id: String,
    /// The log's descriptors predate generations: snapshots of ours that name no
    /// generation were committed by this log (the release before), and count.
    #[serde(default)]
    pub adopts_unstamped: bool,
}

impl Generation {
    /// A new generation (the same shape as an output's, `sluice_output_sdk::generation`;
    /// no dependency on it: a connector depends on its own SDK only).
    pub fn mint(adopts_unstamped: bool) -> Generation {
        use std::hash::{BuildHasher, RandomState};
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let random = RandomState::new().hash_one((now.as_nanos(), std::process::id()));
        let millis = (now.as_millis() as u64) & ((1 << 48) - 1);
        Generation {
            id: format!("{:016x}", millis << 16 | (random & 0xffff)),
            adopts_unstamped,
        }
    }

    /// Whether a snapshot whose summary names `stamped` (`None`: no generation) was
    /// committed by this generation.
    pub fn owns(&self, stamped: Option<&String>) -> bool {
        match stamped {
            Some(id) => *id == self.id,
            None => self.adopts_unstamped,
        }
    }
}

/// One staged Parquet data file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedFile {
    /// The table's name in the namespace.
    pub table: String,
    pub path: String,
    pub size: u64,
    pub records: u64,
    /// The table schema the file was written with.
    pub schema_id: i32,
    pub spec_id: i32,
    /// iceberg's DataFile as JSON (`serialize_data_file_to_json`): column sizes, counts
    /// and bounds, so the manifest entry is what the writer measured.
    pub data_file: String,
}

/// The files one epoch staged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochFiles {
    pub epoch: u64,
    pub files: Vec<StagedFile>,
}

/// The decision `pre_commit` returns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Descriptor {
    pub version: u32,
    pub deployment: String,
    pub materialization: String,
    /// The epoch that made this descriptor.
    pub epoch: u64,
    /// Whether applying it commits a snapshot (else its epochs stay staged, decided).
    pub commit: bool,
    /// Oldest first, ending with `epoch`'s own (which may stage nothing).
    pub epochs: Vec<EpochFiles>,
    /// The run's generation; `None` in a descriptor of the release before generations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<Generation>,
    /// What each table (by name in the namespace) was known to hold of `generation`
    /// when the descriptor was made; empty in a descriptor of an earlier release, whose
    /// tables are then not checked.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tables: BTreeMap<String, TableMark>,
}

/// What a table was known to hold: a lower bound, since a table only gains
/// transactions.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableMark {
    /// The table's `table-uuid`, which a table created again under the same name does
    /// not share.
    pub uuid: String,
    /// The highest `sluice.txn` of the generation that a snapshot of it records.
    pub txn: u64,
}

/// Refuses table `ident` (its metadata, and `committed`, its highest transaction of the
/// run's generation) when it holds less than `mark` says it did: the transactions the
/// recovery log committed to it in between are gone, and would stay gone under the
/// pending epochs appended above them.
pub fn check_mark(
    ident: &TableIdent,
    metadata: &TableMetadata,
    committed: Option<u64>,
    mark: &TableMark,
) -> Result<(), SinkError> {
    const START_OVER: &str = "or, to start over, drop the table, remove the \
                              materialization's recovery log folder and run `sluice apply`";
    let uuid = metadata.uuid().to_string();
    if uuid != mark.uuid {
        return Err(SinkError::Config(format!(
            "Iceberg table {ident} is not the table the recovery log committed to (its \
             table-uuid is {uuid}, the log's is {}): it was dropped and created again, or its \
             catalog replaced, so the transactions the log committed to it, up to {}, are \
             missing from it. Restore the table from a backup no older than that, {START_OVER}",
            mark.uuid, mark.txn
        )));
    }
    let held = committed.unwrap_or(0);
    if held < mark.txn {
        return Err(SinkError::Config(format!(
            "Iceberg table {ident} holds transactions up to {} of this run, but its recovery \
             log committed transactions up to {} to it: the table was rolled back (its \
             catalog or metadata restored from an older backup, or its current snapshot set \
             back), or its snapshots down to {} expired, so the transactions between would be \
             missing from it. Restore the table's newest metadata, {START_OVER}",
            committed.map_or("none".to_string(), |c| c.to_string()),
            mark.txn,
            mark.txn
        )));
    }
    Ok(())
}

impl Descriptor {
    pub fn parse(value: &serde_json::Value, owner: &Owner) -> Result<Descriptor, SinkError> {
        let d: Descriptor = serde_json::from_value(value.clone()).map_err(|e| {
            SinkError::Corrupt(format!("an Iceberg descriptor cannot be read: {e}"))
        })?;
        if d.version != DESCRIPTOR_VERSION {
            return Err(SinkError::Corrupt(format!(
                "an Iceberg descriptor has version {}, this sink writes {DESCRIPTOR_VERSION}",
                d.version
            )));
        }
        if d.deployment != owner.deployment || d.materialization != owner.materialization {
            return Err(SinkError::Corrupt(format!(
                "an Iceberg descriptor of {}/{} was handed to {}/{}",
                d.deployment, d.materialization, owner.deployment, owner.materialization
            )));
        }
        Ok(d)
    }
}

/// The highest `sluice.txn` of `owner`'s `generation` among the current snapshot and its
/// ancestors.
pub fn committed_txn(
    metadata: &TableMetadata,
    owner: &Owner,
    generation: &Generation,
) -> Result<Option<u64>, SinkError> {
    let mut best: Option<u64> = None;
    let mut next = metadata.current_snapshot_id();
    let mut steps = 0usize;
    while let Some(id) = next {
        // An expired ancestor ends the history we can see.
        let Some(snapshot) = metadata.snapshot_by_id(id) else {
            break;
        };
        let p = &snapshot.summary().additional_properties;
        if p.get(SUMMARY_DEPLOYMENT) == Some(&owner.deployment)
            && p.get(SUMMARY_MATERIALIZATION) == Some(&owner.materialization)
            && generation.owns(p.get(SUMMARY_GENERATION))
        {
            let txn = p
                .get(SUMMARY_TXN)
                .and_then(|t| t.parse::<u64>().ok())
                .ok_or_else(|| {
                    SinkError::Corrupt(format!(
                        "snapshot {id} of {} has no readable {SUMMARY_TXN}",
                        owner.materialization
                    ))
                })?;
            best = best.max(Some(txn));
        }
        next = snapshot.parent_snapshot_id();
        steps += 1;
        if steps > metadata.snapshots().len() {
            return Err(SinkError::Corrupt(
                "the table's snapshot ancestry has a cycle".into(),
            ));
        }
    }
    Ok(best)
}

/// What applying the pending epochs to one table does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// The table holds them all already (or none staged anything for it).
    Skip,
    /// Append these files in one snapshot.
    Append(Vec<StagedFile>),
}

/// Pure: the files of `table` in `pending` that a table whose highest committed epoch
/// is `committed` lacks, to be committed as transaction `txn`.
pub fn decide(committed: Option<u64>, txn: u64, table: &str, pending: &[EpochFiles]) -> Decision {
    if committed.is_some_and(|c| c >= txn) {
        return Decision::Skip;
    }
    let files: Vec<StagedFile> = pending
        .iter()
        .filter(|e| committed.is_none_or(|c| e.epoch > c))
        .flat_map(|e| e.files.iter().filter(|f| f.table == table).cloned())
        .collect();
    if files.is_empty() {
        Decision::Skip
    } else {
        Decision::Append(files)
    }
}

fn external(what: &str, e: iceberg::Error) -> SinkError {
    SinkError::External(format!("{what}: {e}"))
}

/// What [`commit_table`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    /// Whether it added a snapshot.
    pub added: bool,
    /// What the table holds now.
    pub mark: TableMark,
}

/// Commits `pending`'s files of table `ident` as transaction `txn` of `generation`,
/// exactly once, into a table holding at least `mark` ([`check_mark`]). Postcondition:
/// the table holds every pending file of the table, once.
pub async fn commit_table(
    catalog: &SqlCatalog,
    ident: &TableIdent,
    owner: &Owner,
    generation: &Generation,
    txn: u64,
    pending: &[EpochFiles],
    mark: Option<&TableMark>,
) -> Result<Committed, SinkError> {
    for _ in 0..COMMIT_ATTEMPTS {
        let table = catalog
            .load_table(ident)
            .await
            .map_err(|e| external(&format!("cannot load Iceberg table {ident}"), e))?;
        let metadata = table.metadata();
        let committed = committed_txn(metadata, owner, generation)?;
        if let Some(mark) = mark {
            check_mark(ident, metadata, committed, mark)?;
        }
        let uuid = metadata.uuid().to_string();
        let files = match decide(committed, txn, ident.name(), pending) {
            Decision::Skip => {
                let txn = committed.unwrap_or(0);
                let mark = TableMark { uuid, txn };
                return Ok(Committed { added: false, mark });
            }
            Decision::Append(files) => files,
        };
        let mut data_files: Vec<DataFile> = Vec::with_capacity(files.len());
        for f in &files {
            data_files.push(rebuild_data_file(metadata, f)?);
            let exists = catalog
                .file_io()
                .exists(&f.path)
                .await
                .map_err(|e| external("cannot check a staged file", e))?;
            if !exists {
                return Err(SinkError::Corrupt(format!(
                    "staged data file {} of decided epochs is gone before its commit",
                    f.path
                )));
            }
        }
        let base = table
            .metadata_location_result()
            .map_err(|e| external("table", e))?;
        let pinned = catalog.pinned(base);
        let properties = HashMap::from([
            (SUMMARY_DEPLOYMENT.to_string(), owner.deployment.clone()),
            (
                SUMMARY_MATERIALIZATION.to_string(),
                owner.materialization.clone(),
            ),
            (SUMMARY_TXN.to_string(), txn.to_string()),
            (SUMMARY_GENERATION.to_string(), generation.id.clone()),
        ]);
        // Deletes (an upsert table's epoch): one row-delta snapshot of both; else iceberg's
        // fast append.
        let committed = if data_files
            .iter()
            .any(|f| f.content_type() != DataContentType::Data)
        {
            crate::rowdelta::commit(&pinned, &table, data_files, properties).await
        } else {
            let tx = Transaction::new(&table);
            let append = tx
                .fast_append()
                .set_snapshot_properties(properties)
                .add_data_files(data_files);
            let tx = append
                .apply(tx)
                .map_err(|e| external("cannot stage the append", e))?;
            tx.commit(&pinned).await
        };
        match committed {
            Ok(_) => {
                let mark = TableMark { uuid, txn };
                return Ok(Committed { added: true, mark });
            }
            Err(e) if e.kind() == ErrorKind::CatalogCommitConflicts => {
                tracing::info!(table = %ident, txn, "Iceberg commit lost a swap; reading the table again");
                continue;
            }
            // iceberg's own duplicate check (it reads the current snapshot's manifests):
            // our files are in the table though no ancestor we can see holds our txn
            // (an expired ancestor?). Fail closed rather than guess.
            Err(e)
                if e.kind() == ErrorKind::DataInvalid
                    && e.message().contains("already referenced by table") =>
            {
                return Err(SinkError::Corrupt(format!(
                    "Iceberg table {ident} already holds staged files of transaction {txn}, \
                     but no snapshot in its ancestry records {} of generation {} with \
                     {SUMMARY_TXN} >= {txn}: {e}",
                    owner.materialization, generation.id
                )));
            }
            Err(e) => {
                return Err(external(
                    &format!("cannot commit to Iceberg table {ident}"),
                    e,
                ));
            }
        }
    }
    Err(SinkError::External(format!(
        "Iceberg table {ident}: {COMMIT_ATTEMPTS} commits in a row lost to concurrent writers"
    )))
}

fn rebuild_data_file(metadata: &TableMetadata, f: &StagedFile) -> Result<DataFile, SinkError> {
    let schema = metadata.schema_by_id(f.schema_id).ok_or_else(|| {
        SinkError::Corrupt(format!(
            "staged file {} was written with schema {}, which the table no longer has",
            f.path, f.schema_id
        ))
    })?;
    let spec = metadata.partition_spec_by_id(f.spec_id).ok_or_else(|| {
        SinkError::Corrupt(format!(
            "staged file {} names partition spec {}",
            f.path, f.spec_id
        ))
    })?;
    let partition_type = spec
        .partition_type(schema)
        .map_err(|e| SinkError::Corrupt(format!("partition type: {e}")))?;
    deserialize_data_file_from_json(&f.data_file, f.spec_id, &partition_type, schema)
        .map_err(|e| SinkError::Corrupt(format!("staged file {} cannot be described: {e}", f.path)))
}

/// An epoch folder's generation (`None`: before generations) and epoch, from its name
/// (`<generation>-<epoch>` or `<epoch>`); `None`: not an epoch folder.
pub(crate) fn epoch_folder(name: &str) -> Option<(Option<String>, u64)> {
    match name.split_once('-') {
        Some((generation, epoch)) => Some((Some(generation.to_string()), epoch.parse().ok()?)),
        None => Some((None, name.parse().ok()?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(table: &str, path: &str) -> StagedFile {
        StagedFile {
            table: table.into(),
            path: path.into(),
            size: 1,
            records: 1,
            schema_id: 0,
            spec_id: 0,
            data_file: String::new(),
        }
    }

    fn pending() -> Vec<EpochFiles> {
        vec![
            EpochFiles {
                epoch: 4,
                files: vec![file("a", "a4"), file("b", "b4")],
            },
            EpochFiles {
                epoch: 5,
                files: vec![],
            },
            EpochFiles {
                epoch: 6,
                files: vec![file("a", "a6")],
            },
        ]
    }

    #[test]
    fn an_untouched_table_takes_every_pending_file_of_it() {
        let d = decide(None, 6, "a", &pending());
        assert_eq!(d, Decision::Append(vec![file("a", "a4"), file("a", "a6")]));
    }

    #[test]
    fn a_table_at_or_past_the_txn_is_skipped() {
        assert_eq!(decide(Some(6), 6, "a", &pending()), Decision::Skip);
        assert_eq!(decide(Some(9), 6, "a", &pending()), Decision::Skip);
    }

    #[test]
    fn a_descriptor_of_the_release_before_generations_reads_with_none() {
        // Frozen: a descriptor as the release before generations wrote it.
        let old = serde_json::json!({"version": 1, "deployment": "d", "materialization": "m",
            "epoch": 4, "commit": true, "epochs": [{"epoch": 4, "files": []}]});
        let owner = Owner {
            deployment: "d".into(),
            materialization: "m".into(),
        };
        let d = Descriptor::parse(&old, &owner).unwrap();
        assert_eq!(d.generation, None);
        let new = Descriptor {
            generation: Some(Generation::mint(false)),
            ..d
        };
        let value = serde_json::to_value(&new).unwrap();
        assert_eq!(Descriptor::parse(&value, &owner).unwrap(), new);
    }

    #[test]
    fn only_its_own_generations_snapshots_count_for_a_generation() {
        let ours = Generation::mint(false);
        let other = Generation::mint(false).id;
        assert!(ours.owns(Some(&ours.id)));
        assert!(!ours.owns(Some(&other)), "a reset's older run");
        assert!(
            !ours.owns(None),
            "the release before generations, of an older log"
        );
        let upgraded = Generation {
            adopts_unstamped: true,
            ..ours.clone()
        };
        assert!(upgraded.owns(None));
        assert!(!upgraded.owns(Some(&other)));
        assert_eq!(ours.id.len(), 16);
    }

    #[test]
    fn epochs_already_committed_are_left_out() {
        // Epoch 4 went in with an earlier commit (at close): only 6 remains.
        assert_eq!(
            decide(Some(4), 6, "a", &pending()),
            Decision::Append(vec![file("a", "a6")])
        );
        assert_eq!(decide(Some(4), 6, "b", &pending()), Decision::Skip);
    }
}
