//! The runtime side: [`IcebergSink`], an [`EpochSink`] appending each transaction's
//! change log to one Iceberg table per binding, exactly once.
//!
//! ```text
//!  begin_epoch(N)     writers under <table>/data/_sluice/<attempt>/<generation>-<N>/  (the artifact intent)
//!  write_batch        + _txn = N (+ _op U when the binding has none) ─▶ Parquet, rolled at target_file_size
//!  pre_commit(N)      close (fsync) ─▶ descriptor {epochs since the last table commit + N, commit: N % commit_every == 0,
//!                                     each table's uuid and last sluice.txn as far as known}
//!  commit_epoch(N,d)  d.commit: one fast append per table, summary sluice.generation = G, sluice.txn = N,
//!                     skipped where an ancestor of generation G has txn >= N;
//!                     refused where the table holds less than d says it did
//!                     else: d's epochs stay staged, decided, until a due epoch or close
//!  recover            remove undecided epochs' prefixes; re-apply the decided descriptor
//!                     (each unless the handles below did it before `open`);
//!                     remove every file under our attempt prefix, above the table's last
//!                     epoch of ours, that no snapshot and no decided epoch holds
//! ```
//!
//! The commit and the cleanup need no writer: [`IcebergCommitter`] applies a decided
//! descriptor and [`IcebergCleaner`] removes undecided staging from the configuration
//! and the runtime context alone (the catalog is opened on first use), so recovery runs
//! them before the writer opens, and they could run anywhere the warehouse is.
//!
//! Lifecycle: retired after a cancelled call (the default policy: the writers' tasks
//! and the pending state are not audited for a dropped call), every writer task on the
//! sink's [`TaskTracker`], each call bounded by [`WRITE_TIMEOUT`]. No `flush` of its
//! own: a batch goes to its writer's task as soon as it is written, and the driver's
//! interval flush (none asked) would only hand over what the driver holds.
//!
//! The generation G is the recovery log's: taken from the decided descriptor at
//! `recover`, minted when the log has none (a new log, or one started over after a
//! reset), and written in every descriptor after. Snapshots and staging folders of
//! another generation are never this one's: a reset's new log numbers its epochs anew,
//! and an older run's `sluice.txn` must not hide them, nor its folders be removed as
//! this run's.
//!
//! `commit_every`: an epoch whose number is a multiple commits; the ones between are
//! decided in the recovery log (their descriptors list their files) but not visible in
//! the table until then. `close` commits what is decided and pending, so a pipeline that
//! stops leaves nothing decided outside the table. Epoch numbers, not counts, decide
//! the cadence, so a restart keeps it without state of its own.
//!
//! Threads: a binding's Parquet writer of an epoch runs on a task of its own
//! (`staging::Staging`: the next batch is built while one is encoded, one queued at
//! most); the rest runs on the caller's task. The SQLite catalog hops to the blocking
//! pool per statement, and iceberg's local file writes are synchronous `std::fs` calls
//! on the writing worker (Parquet pages are buffered, a write reaches the disk at most
//! once per row group).

mod detached;
mod recover;

use detached::{Detached, commit_epochs};
pub use detached::{IcebergCleaner, IcebergCommitter};

use crate::catalog::{CatalogLocation, SqlCatalog};
use crate::commit::{
    DESCRIPTOR_VERSION, Descriptor, EpochFiles, Generation, Owner, STAGING_DIR, StagedFile,
    TableMark,
};
use crate::config::{EndpointConfig, ResourceConfig};
use crate::maintain::AutoMaintenance;
use crate::schema::{self, Column, TableChange};
use crate::staging::{Staging, WriterSpec, table_batch};
use crate::upsert::{self, UpsertState};
use arrow_array::RecordBatch;
use arrow_schema::SchemaRef;
use async_trait::async_trait;
use iceberg::spec::serialize_data_file_to_json;
use iceberg::table::Table;
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::{Catalog, NamespaceIdent, TableCreation, TableIdent};
use serde_json::{Value, json};
use sluice_sink_sdk::{
    AbortCleaner, Consistency, EpochCommitter, EpochSink, InputMode, Placement, Recovery, Result,
    RuntimeContext, SchemaPlan, SinkBinding, SinkContract, SinkError, TaskTracker, WriteResult,
};
use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

/// The deadline of each call: two minutes. The slowest healthy call is `pre_commit`
/// closing an epoch's files (the last row group of each, up to the target size, encoded
/// and fsynced) or `commit_epoch` retrying a contended catalog swap a few times: seconds
/// each; the runtime's own wait on the driver (five minutes by default) stays longer.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(120);

/// One binding's table, once open.
struct Bound {
    ident: TableIdent,
    /// The table's current schema as Arrow, with field ids.
    arrow: SchemaRef,
    schema_id: i32,
    spec_id: i32,
    partition_type: iceberg::spec::StructType,
    format_version: iceberg::spec::FormatVersion,
    /// `<data location>/_sluice/<attempt>`.
    attempt_prefix: String,
    schema: iceberg::spec::SchemaRef,
}

/// Where the sink is in its epoch.
enum Epoch {
    Idle,
    Staging {
        epoch: u64,
        writers: Vec<Option<Staging>>,
    },
}

/// The Iceberg epoch sink.
pub struct IcebergSink {
    config: EndpointConfig,
    context: Option<RuntimeContext>,
    catalog: Option<SqlCatalog>,
    tables: Vec<Bound>,
    epoch: Epoch,
    /// Pre-committed epochs whose decision has not been applied yet (oldest first).
    prepared: Vec<EpochFiles>,
    /// Decided epochs not yet in a table snapshot (oldest first).
    pending: Vec<EpochFiles>,
    /// What each table is known to hold of the generation (`commit::TableMark`),
    /// written in every descriptor; updated together with `pending`, so a descriptor's
    /// marks and epochs together cover everything decided.
    held: BTreeMap<String, TableMark>,
    /// Makes file names unique per process, so a name is never written twice.
    nonce: String,
    /// The recovery log's generation, known from `recover` on.
    generation: Option<Generation>,
    /// Every staging writer's task.
    tasks: TaskTracker,
    /// The upsert tables' index and epoch deletes (`upsert.rs`).
    upsert: UpsertState,
    /// `maintenance:` of the endpoint, run after every N commits (`maintain.rs`).
    maintenance: AutoMaintenance,
}

impl IcebergSink {
    pub fn new(endpoint: &Value) -> Result<IcebergSink> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let config = EndpointConfig::parse(endpoint)?;
        Ok(IcebergSink {
            maintenance: AutoMaintenance::new(config.maintenance.clone()),
            config,
            context: None,
            catalog: None,
            tables: Vec::new(),
            epoch: Epoch::Idle,
            prepared: Vec::new(),
            pending: Vec::new(),
            held: BTreeMap::new(),
            nonce: format!("{:x}{:x}", std::process::id(), nanos & 0xffff_ffff_ffff),
            generation: None,
            tasks: TaskTracker::new(),
            upsert: UpsertState::default(),
        })
    }

    fn namespace(&self) -> Result<NamespaceIdent> {
        namespace(&self.config)
    }

    async fn catalog(&mut self) -> Result<SqlCatalog> {
        if let Some(c) = &self.catalog {
            return Ok(c.clone());
        }
        let c = SqlCatalog::connect(&self.config.catalog_location(), self.config.warehouse()?)
            .await
            .map_err(|e| SinkError::External(format!("cannot open the Iceberg catalog: {e}")))?;
        self.catalog = Some(c.clone());
        Ok(c)
    }

    fn context(&self) -> Result<&RuntimeContext> {
        self.context.as_ref().ok_or_else(|| {
            SinkError::Config(
                "the Iceberg sink was opened before its runtime context was bound".into(),
            )
        })
    }

    fn owner(&self) -> Result<Owner> {
        let c = self.context()?;
        Ok(Owner {
            deployment: c.deployment_id.clone(),
            materialization: c.sink_id.clone(),
        })
    }

    fn attempt(&self) -> Result<String> {
        Ok(attempt(self.context()?))
    }

    fn generation(&self) -> Result<&Generation> {
        self.generation.as_ref().ok_or_else(|| {
            SinkError::Corrupt("the Iceberg sink was used before it recovered".into())
        })
    }

    /// `<attempt prefix>/<generation>-<epoch>`.
    fn epoch_prefix(&self, bound: &Bound, epoch: u64) -> Result<String> {
        Ok(format!(
            "{}/{}-{epoch}",
            bound.attempt_prefix,
            self.generation()?.id
        ))
    }

    async fn plan(&mut self, bindings: &[SinkBinding]) -> Result<Vec<TableChange>> {
        let ns = self.namespace()?;
        // Read-only where it can be: a SQLite catalog that does not exist yet is not
        // created to be read (every table is then to create).
        let catalog_exists = match self.config.catalog_location() {
            CatalogLocation::Sqlite(path) => path.exists(),
            CatalogLocation::Postgres(_) => true,
        };
        let catalog = if catalog_exists {
            Some(self.catalog().await?)
        } else {
            None
        };
        let mut changes = Vec::new();
        let mut seen = HashSet::new();
        for b in bindings {
            let resource = ResourceConfig::parse(&b.resource)?;
            if !seen.insert(resource.table.clone()) {
                return Err(SinkError::Config(format!(
                    "two bindings write Iceberg table {}.{}",
                    self.config.namespace, resource.table
                )));
            }
            let columns = schema::table_columns(&b.schema)?;
            let ident = TableIdent::new(ns.clone(), resource.table.clone());
            let table = match &catalog {
                Some(c) => load_optional(c, &ident).await?,
                None => None,
            };
            match table {
                None => changes.push(TableChange::Create {
                    table: resource.table,
                    columns,
                }),
                Some(t) => {
                    let add = schema::columns_to_add(
                        &ident.to_string(),
                        t.metadata().current_schema(),
                        &columns,
                    )?;
                    if !add.is_empty() {
                        changes.push(TableChange::AddColumns {
                            table: resource.table,
                            columns: add,
                        });
                    }
                }
            }
        }
        Ok(changes)
    }

    /// Closes epoch `epoch`'s writers: the files it staged (fsynced).
    async fn close_writers(
        &mut self,
        epoch: u64,
        writers: Vec<Option<Staging>>,
    ) -> Result<EpochFiles> {
        let mut files = Vec::new();
        for (bound, writer) in self.tables.iter().zip(writers) {
            let Some(writer) = writer else { continue };
            let data_files = writer.close().await?;
            for df in data_files {
                let (path, size, records) = (
                    df.file_path().to_string(),
                    df.file_size_in_bytes(),
                    df.record_count(),
                );
                let data_file =
                    serialize_data_file_to_json(df, &bound.partition_type, bound.format_version)
                        .map_err(|e| SinkError::External(format!("cannot describe {path}: {e}")))?;
                files.push(StagedFile {
                    table: bound.ident.name().to_string(),
                    path,
                    size,
                    records,
                    schema_id: bound.schema_id,
                    spec_id: bound.spec_id,
                    data_file,
                });
            }
        }
        Ok(EpochFiles { epoch, files })
    }

    /// What a new writer of binding `binding` in epoch `epoch` needs, owned (the
    /// writer is built without borrowing the sink across an await).
    fn writer_spec(&self, binding: usize, epoch: u64) -> Result<WriterSpec> {
        let bound = &self.tables[binding];
        Ok(WriterSpec {
            file_io: self.catalog.as_ref().expect("open").file_io().clone(),
            schema: bound.schema.clone(),
            ident: bound.ident.to_string(),
            location: self.epoch_prefix(bound, epoch)?,
            prefix: format!("b{binding}-{}", self.nonce),
            target_file_size: self.config.target_file_size as usize,
        })
    }

    /// Commits the decided pending epochs to every table as transaction `txn`.
    async fn commit_pending(&mut self, txn: u64) -> Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let catalog = self.catalog.clone().expect("open");
        let owner = self.owner()?;
        let generation = self.generation()?.clone();
        let ns = self.namespace()?;
        let held = commit_epochs(
            &catalog,
            &ns,
            &owner,
            &generation,
            txn,
            &self.pending,
            &self.held,
        )
        .await?;
        self.held.extend(held);
        self.pending.clear();
        Ok(())
    }

    /// Brings the upsert tables' index to the tables (`upsert::sync`).
    async fn sync_upsert(&mut self) -> Result<()> {
        let Some(catalog) = self.catalog.clone() else {
            return Ok(());
        };
        let idents: Vec<TableIdent> = self.tables.iter().map(|b| b.ident.clone()).collect();
        self.upsert.sync(&catalog, &idents).await
    }

    /// The position delete files of epoch `epoch`'s upsert tables, in its staging.
    async fn stage_upsert_deletes(&mut self, epoch: u64) -> Result<Vec<StagedFile>> {
        let mut files = Vec::new();
        for (binding, bound) in self.tables.iter().enumerate() {
            if !self.upsert.is_upsert(binding) {
                continue;
            }
            let spec = upsert::DeleteSpec {
                file_io: self.catalog.as_ref().expect("open").file_io(),
                location: self.epoch_prefix(bound, epoch)?,
                prefix: format!("b{binding}-{}", self.nonce),
                schema_id: bound.schema_id,
                spec_id: bound.spec_id,
                partition_type: &bound.partition_type,
                format_version: bound.format_version,
            };
            files.extend(self.upsert.stage_deletes(binding, spec).await?);
        }
        Ok(files)
    }
}

/// The configured namespace.
fn namespace(config: &EndpointConfig) -> Result<NamespaceIdent> {
    NamespaceIdent::from_strs(config.namespace.split('.'))
        .map_err(|e| SinkError::Config(format!("namespace: {e}")))
}

/// `<deployment>-<sink>-<participant>`, with anything but `[A-Za-z0-9_.-]` as `_`.
fn attempt(c: &RuntimeContext) -> String {
    let raw = format!("{}-{}-{}", c.deployment_id, c.sink_id, c.participant_id);
    raw.chars()
        .map(|ch| {
            if ch.is_ascii_alphanumeric() || "_.-".contains(ch) {
                ch
            } else {
                '_'
            }
        })
        .collect()
}

fn owner(c: &RuntimeContext) -> Owner {
    Owner {
        deployment: c.deployment_id.clone(),
        materialization: c.sink_id.clone(),
    }
}

async fn load_optional(catalog: &SqlCatalog, ident: &TableIdent) -> Result<Option<Table>> {
    let exists = catalog
        .table_exists(ident)
        .await
        .map_err(|e| SinkError::External(format!("Iceberg catalog: {e}")))?;
    if !exists {
        return Ok(None);
    }
    catalog
        .load_table(ident)
        .await
        .map(Some)
        .map_err(|e| SinkError::External(format!("cannot load Iceberg table {ident}: {e}")))
}

#[async_trait]
impl EpochSink for IcebergSink {
    fn contract(&self) -> SinkContract {
        SinkContract {
            consistency: Consistency::CheckpointCommittable,
            placement: Placement::Singleton,
            input: InputMode::FullChangelog,
        }
    }

    /// An upsert table applies keyed mutations by its key columns; a change log (rows
    /// never replaced or deleted in place) none.
    fn keyed_mutation_key(&self, binding: &SinkBinding) -> Option<Vec<String>> {
        upsert::is_upsert(&binding.resource)
            .ok()?
            .then(|| binding.key.clone())
    }

    fn bind_runtime_context(&mut self, context: RuntimeContext) -> Result<()> {
        self.context = Some(context);
        Ok(())
    }

    fn bind_state_dir(&mut self, dir: &std::path::Path) -> Result<()> {
        self.upsert.bind_state_dir(dir);
        Ok(())
    }

    fn loads(&self, resource: &Value) -> Result<bool> {
        upsert::is_upsert(resource)
    }

    async fn load(&mut self, binding: usize, keys: &RecordBatch) -> Result<Vec<String>> {
        self.upsert.load(binding, keys).await
    }

    fn suggested_write_timeout(&self) -> Duration {
        WRITE_TIMEOUT
    }

    fn terminal_task_tracker(&self) -> Option<TaskTracker> {
        Some(self.tasks.clone())
    }

    fn committer(&self) -> Option<Box<dyn EpochCommitter>> {
        Detached::of(self).map(|d| Box::new(IcebergCommitter(d)) as Box<dyn EpochCommitter>)
    }

    fn abort_cleaner(&self) -> Option<Box<dyn AbortCleaner>> {
        Detached::of(self).map(|d| Box::new(IcebergCleaner(d)) as Box<dyn AbortCleaner>)
    }

    async fn resolve_schema(&mut self, bindings: &[SinkBinding]) -> Result<SchemaPlan> {
        let changes = self.plan(bindings).await?;
        let ns = self.config.namespace.clone();
        Ok(SchemaPlan {
            actions: changes.iter().flat_map(|c| c.describe(&ns)).collect(),
            state: serde_json::to_value(&changes)
                .map_err(|e| SinkError::Corrupt(format!("schema plan: {e}")))?,
        })
    }

    async fn prepare_schema(&mut self, plan: &SchemaPlan) -> Result<()> {
        let changes: Vec<TableChange> =
            serde_json::from_value(plan.state.clone()).map_err(|e| {
                SinkError::Corrupt(format!("an Iceberg schema plan cannot be read: {e}"))
            })?;
        if changes.is_empty() {
            return Ok(());
        }
        let catalog = self.catalog().await?;
        let ns = self.namespace()?;
        let ext = |what: &str, e: iceberg::Error| SinkError::External(format!("{what}: {e}"));
        if !catalog
            .namespace_exists(&ns)
            .await
            .map_err(|e| ext("catalog", e))?
        {
            match catalog.create_namespace(&ns, Default::default()).await {
                Ok(_) => {}
                Err(e) if e.kind() == iceberg::ErrorKind::NamespaceAlreadyExists => {}
                Err(e) => return Err(ext("cannot create the namespace", e)),
            }
        }
        for change in changes {
            let ident = TableIdent::new(ns.clone(), change.table().to_string());
            let existing = load_optional(&catalog, &ident).await?;
            let (columns, create) = match change {
                TableChange::Create { columns, .. } => (columns, true),
                TableChange::AddColumns { columns, .. } => (columns, false),
            };
            match existing {
                None if create => {
                    let creation = TableCreation::builder()
                        .name(ident.name().to_string())
                        .schema(schema::create_schema(&columns)?)
                        .build();
                    match catalog.create_table(&ns, creation).await {
                        Ok(_) => {}
                        Err(e) if e.kind() == iceberg::ErrorKind::TableAlreadyExists => {}
                        Err(e) => return Err(ext(&format!("cannot create {ident}"), e)),
                    }
                }
                None => {
                    return Err(SinkError::Schema(format!(
                        "Iceberg table {ident} is gone since the plan was made: resolve it again"
                    )));
                }
                Some(table) => {
                    // Idempotent: only the columns still missing (others may exist now).
                    let current = table.metadata().current_schema();
                    let missing: Vec<&Column> = columns
                        .iter()
                        .filter(|c| current.field_by_name(&c.name).is_none())
                        .collect();
                    if missing.is_empty() {
                        continue;
                    }
                    let mut update = Transaction::new(&table).update_schema();
                    for c in missing {
                        update = update.add_column(iceberg::transaction::AddColumn::optional(
                            &c.name,
                            c.iceberg_type()?,
                        ));
                    }
                    let tx = update
                        .apply(Transaction::new(&table))
                        .map_err(|e| ext("schema update", e))?;
                    tx.commit(&catalog)
                        .await
                        .map_err(|e| ext(&format!("cannot add columns to {ident}"), e))?;
                }
            }
        }
        Ok(())
    }

    async fn open(&mut self, bindings: &[SinkBinding]) -> Result<()> {
        let catalog = self.catalog().await?;
        let ns = self.namespace()?;
        let attempt = self.attempt()?;
        let mut tables = Vec::with_capacity(bindings.len());
        for b in bindings {
            let resource = ResourceConfig::parse(&b.resource)?;
            let ident = TableIdent::new(ns.clone(), resource.table);
            let table = load_optional(&catalog, &ident).await?.ok_or_else(|| {
                SinkError::Schema(format!(
                    "Iceberg table {ident} does not exist: run `sluice apply`"
                ))
            })?;
            let md = table.metadata();
            let wanted = schema::table_columns(&b.schema)?;
            let add = schema::columns_to_add(&ident.to_string(), md.current_schema(), &wanted)?;
            if let Some(c) = add.first() {
                return Err(SinkError::Schema(format!(
                    "Iceberg table {ident} has no column {:?}: run `sluice apply`",
                    c.name
                )));
            }
            let schema = md.current_schema().clone();
            let arrow = iceberg::arrow::schema_to_arrow_schema(&schema)
                .map_err(|e| SinkError::Corrupt(format!("{ident}: {e}")))?;
            let data = format!("{}/data", md.location().trim_end_matches('/'));
            tables.push(Bound {
                arrow: Arc::new(arrow),
                schema_id: md.current_schema_id(),
                spec_id: md.default_partition_spec_id(),
                partition_type: md.default_partition_type().clone(),
                format_version: md.format_version(),
                attempt_prefix: format!("{data}/{STAGING_DIR}/{attempt}"),
                schema,
                ident,
            });
        }
        self.tables = tables;
        self.upsert.open(bindings, self.config.commit_every).await
    }

    async fn recover(&mut self, recovery: &Recovery) -> Result<()> {
        self.recover_tables(recovery).await
    }

    fn checkpoint_artifact_intent(&self, epoch: u64) -> Option<Value> {
        if self.tables.is_empty() {
            return None;
        }
        // Called after `recover` (which knows the generation); before it, no intent.
        let prefixes: Vec<String> = (self.tables.iter())
            .map(|t| self.epoch_prefix(t, epoch))
            .collect::<Result<_>>()
            .ok()?;
        Some(json!({ "epoch": epoch, "prefixes": prefixes }))
    }

    async fn begin_epoch(&mut self, epoch: u64) -> Result<()> {
        if let Epoch::Staging { epoch: open, .. } = &self.epoch {
            return Err(SinkError::Corrupt(format!(
                "epoch {epoch} began while epoch {open} is still staging"
            )));
        }
        self.upsert.begin(epoch, !self.prepared.is_empty())?;
        self.epoch = Epoch::Staging {
            epoch,
            writers: self.tables.iter().map(|_| None).collect(),
        };
        Ok(())
    }

    async fn write_batch(&mut self, binding: usize, batch: &RecordBatch) -> Result<WriteResult> {
        let Epoch::Staging { epoch, writers } = &mut self.epoch else {
            return Err(SinkError::Corrupt("a batch came outside an epoch".into()));
        };
        let epoch = *epoch;
        let bound = self
            .tables
            .get(binding)
            .ok_or_else(|| SinkError::Corrupt(format!("no binding {binding}")))?;
        let out = table_batch(&bound.arrow, &bound.ident.to_string(), batch, epoch)?;
        // An upsert table writes only its `U` rows (its deletes wait for pre_commit).
        let runs = self.upsert.stage(binding, batch).await?;
        let parts: Vec<RecordBatch> = match runs {
            None => vec![out],
            Some(runs) => (runs.into_iter())
                .map(|(offset, len)| out.slice(offset, len))
                .collect(),
        };
        if parts.is_empty() {
            return Ok(WriteResult::default());
        }
        if writers[binding].is_none() {
            let w = Staging::start(self.writer_spec(binding, epoch)?, &self.tasks).await?;
            let Epoch::Staging { writers, .. } = &mut self.epoch else {
                unreachable!()
            };
            writers[binding] = Some(w);
        }
        let Epoch::Staging { writers, .. } = &mut self.epoch else {
            unreachable!()
        };
        let mut written = WriteResult::default();
        for part in parts {
            written.bytes += part.get_array_memory_size() as u64;
            written.records += part.num_rows();
            let writer = writers[binding].as_mut().expect("built above");
            writer.write(part).await?;
        }
        Ok(written)
    }

    async fn pre_commit(&mut self, epoch: u64) -> Result<Option<Value>> {
        let writers = match std::mem::replace(&mut self.epoch, Epoch::Idle) {
            Epoch::Staging { epoch: e, writers } if e == epoch => writers,
            Epoch::Staging { epoch: e, .. } => {
                return Err(SinkError::Corrupt(format!(
                    "pre_commit({epoch}) while staging epoch {e}"
                )));
            }
            Epoch::Idle => self.tables.iter().map(|_| None).collect(),
        };
        let mut staged = self.close_writers(epoch, writers).await?;
        staged.files.extend(self.stage_upsert_deletes(epoch).await?);
        let due = epoch.is_multiple_of(self.config.commit_every);
        let mut epochs: Vec<EpochFiles> = self
            .pending
            .iter()
            .chain(self.prepared.iter())
            .filter(|e| e.epoch < epoch)
            .cloned()
            .collect();
        epochs.sort_by_key(|e| e.epoch);
        epochs.dedup_by_key(|e| e.epoch);
        let nothing_waits = epochs.iter().all(|e| e.files.is_empty());
        if staged.files.is_empty() && (nothing_waits || !due) {
            // The log's last descriptor stays, and still lists what is pending.
            return Ok(None);
        }
        self.prepared.push(staged.clone());
        epochs.push(staged);
        let owner = self.owner()?;
        let descriptor = Descriptor {
            version: DESCRIPTOR_VERSION,
            deployment: owner.deployment,
            materialization: owner.materialization,
            epoch,
            commit: due,
            epochs,
            generation: Some(self.generation()?.clone()),
            tables: self.held.clone(),
        };
        serde_json::to_value(&descriptor)
            .map(Some)
            .map_err(|e| SinkError::Corrupt(format!("descriptor: {e}")))
    }

    async fn commit_epoch(&mut self, epoch: u64, descriptor: &Value) -> Result<()> {
        let d = Descriptor::parse(descriptor, &self.owner()?)?;
        if d.epoch != epoch {
            return Err(SinkError::Corrupt(format!(
                "commit_epoch({epoch}) was handed the descriptor of epoch {}",
                d.epoch
            )));
        }
        self.prepared.retain(|e| e.epoch > epoch);
        self.pending = d.epochs;
        if d.commit {
            self.commit_pending(epoch).await?;
            // Outside the commit, before the index follows the table: never fails it.
            if let Some(catalog) = self.catalog.clone() {
                let idents: Vec<TableIdent> = self.tables.iter().map(|b| b.ident.clone()).collect();
                self.maintenance.after_commit(&catalog, &idents).await;
            }
        }
        self.sync_upsert().await
    }

    async fn rollback_epoch(&mut self, epoch: u64) -> Result<()> {
        if let Epoch::Staging { epoch: e, .. } = &self.epoch
            && *e == epoch
            && let Epoch::Staging { writers, .. } = std::mem::replace(&mut self.epoch, Epoch::Idle)
        {
            // Their open files are abandoned; the folder goes below.
            for writer in writers.into_iter().flatten() {
                writer.abandon().await;
            }
        }
        self.prepared.retain(|e| e.epoch != epoch);
        self.upsert.rollback();
        if let Some(catalog) = &self.catalog {
            for bound in &self.tables {
                let prefix = self.epoch_prefix(bound, epoch)?;
                catalog.storage().delete_prefix(&prefix).await?;
            }
        }
        Ok(())
    }

    async fn close(&mut self) -> Result<()> {
        // What is decided and pending goes in now, under its last epoch, so nothing
        // decided stays outside the table while the pipeline is down.
        if let Some(last) = self.pending.iter().map(|e| e.epoch).max()
            && self.catalog.is_some()
            && self.context.is_some()
            && self.generation.is_some()
        {
            self.commit_pending(last).await?;
        }
        Ok(())
    }
}
