//! The sink's work that needs no writer: applying a decided descriptor
//! ([`IcebergCommitter`]) and removing undecided staging ([`IcebergCleaner`]), from
//! the configuration and the runtime context alone, so recovery runs them before the
//! writer opens (and they could run anywhere the warehouse is). The sink's own commit
//! goes through the same [`commit_epochs`].

use super::{IcebergSink, Result, attempt, namespace, owner};
use crate::catalog::SqlCatalog;
use crate::commit::{self, Descriptor, EpochFiles, Generation, Owner, STAGING_DIR, TableMark};
use crate::config::EndpointConfig;
use crate::storage::WarehouseIo;
use async_trait::async_trait;
use iceberg::{NamespaceIdent, TableIdent};
use serde_json::Value;
use sluice_sink_sdk::{AbortCleaner, EpochCommitter, RuntimeContext, SinkError, Undecided};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Commits `pending`'s files to each table they name as transaction `txn` of
/// `generation`, exactly once per table ([`commit::commit_table`]), each into a table
/// holding at least its mark in `marks`. Returns what those tables hold now.
pub(super) async fn commit_epochs(
    catalog: &SqlCatalog,
    ns: &NamespaceIdent,
    owner: &Owner,
    generation: &Generation,
    txn: u64,
    pending: &[EpochFiles],
    marks: &BTreeMap<String, TableMark>,
) -> Result<BTreeMap<String, TableMark>> {
    let mut tables: Vec<&str> = pending
        .iter()
        .flat_map(|e| e.files.iter().map(|f| f.table.as_str()))
        .collect();
    tables.sort();
    tables.dedup();
    let mut held = BTreeMap::new();
    for table in tables {
        let ident = TableIdent::new(ns.clone(), table.to_string());
        let mark = marks.get(table);
        let committed =
            commit::commit_table(catalog, &ident, owner, generation, txn, pending, mark).await?;
        tracing::debug!(table = %ident, txn, added = committed.added, "Iceberg commit");
        held.insert(table.to_string(), committed.mark);
    }
    Ok(held)
}

/// Removes staging prefix `prefix` an artifact intent named, once it is known ours:
/// `of_bound` (under a bound table's attempt prefix), or under `warehouse` with
/// `attempt`'s staging folder in it. Anything else is refused: the intent is damaged.
pub(super) async fn remove_staging(
    storage: &WarehouseIo,
    attempt: &str,
    of_bound: bool,
    prefix: &str,
) -> Result<()> {
    let warehouse = storage.root();
    let marker = format!("/data/{STAGING_DIR}/{attempt}/");
    let in_warehouse = prefix.starts_with(&format!("{warehouse}/")) && prefix.contains(&marker);
    if !(of_bound || in_warehouse) || prefix.contains("/../") {
        return Err(SinkError::Corrupt(format!(
            "an artifact intent names {prefix}, which is not staging of {attempt} in {warehouse}"
        )));
    }
    storage.delete_prefix(prefix).await
}

/// What the writerless handles share: the configuration, the context, and the catalog,
/// opened on first use.
pub(super) struct Detached {
    config: EndpointConfig,
    context: RuntimeContext,
    catalog: tokio::sync::OnceCell<SqlCatalog>,
}

impl Detached {
    pub(super) fn of(sink: &IcebergSink) -> Option<Arc<Detached>> {
        Some(Arc::new(Detached {
            config: sink.config.clone(),
            context: sink.context.clone()?,
            catalog: tokio::sync::OnceCell::new(),
        }))
    }

    async fn catalog(&self) -> Result<&SqlCatalog> {
        self.catalog
            .get_or_try_init(|| async {
                SqlCatalog::connect(&self.config.catalog_location(), self.config.warehouse()?)
                    .await
                    .map_err(|e| {
                        SinkError::External(format!("cannot open the Iceberg catalog: {e}"))
                    })
            })
            .await
    }
}

/// Applies a decided descriptor without the writer: what [`IcebergSink::commit_epoch`]
/// does to the tables, from the configuration and the runtime context alone.
pub struct IcebergCommitter(pub(super) Arc<Detached>);

#[async_trait]
impl EpochCommitter for IcebergCommitter {
    async fn commit_epoch(&self, epoch: u64, descriptor: &Value) -> Result<()> {
        let owner = owner(&self.0.context);
        let d = Descriptor::parse(descriptor, &owner)?;
        if d.epoch != epoch {
            return Err(SinkError::Corrupt(format!(
                "commit_epoch({epoch}) was handed the descriptor of epoch {}",
                d.epoch
            )));
        }
        if !d.commit {
            // Decided, not due: its epochs stay staged until a due epoch lists them.
            return Ok(());
        }
        // A descriptor before generations: its snapshots are this log's, as `recover`
        // takes them.
        let generation = d
            .generation
            .clone()
            .unwrap_or_else(|| Generation::mint(true));
        let catalog = self.0.catalog().await?;
        let ns = namespace(&self.0.config)?;
        let marks = &d.tables;
        commit_epochs(catalog, &ns, &owner, &generation, epoch, &d.epochs, marks).await?;
        Ok(())
    }
}

/// Removes undecided staging without the writer: the prefixes each intent names, once
/// each is known to be this context's staging in the warehouse.
pub struct IcebergCleaner(pub(super) Arc<Detached>);

#[async_trait]
impl AbortCleaner for IcebergCleaner {
    async fn clean(&self, undecided: &[Undecided]) -> Result<()> {
        if undecided.is_empty() {
            return Ok(());
        }
        let storage = self.0.catalog().await?.storage();
        let attempt = attempt(&self.0.context);
        for u in undecided {
            for prefix in intent_prefixes(u)? {
                remove_staging(storage, &attempt, false, prefix).await?;
            }
        }
        Ok(())
    }
}

/// The prefixes an undecided epoch's artifact intent names.
pub(super) fn intent_prefixes(undecided: &Undecided) -> Result<Vec<&str>> {
    let prefixes = (undecided.intent.get("prefixes"))
        .and_then(Value::as_array)
        .ok_or_else(|| {
            SinkError::Corrupt(format!(
                "the artifact intent of epoch {} has no prefixes: {}",
                undecided.epoch, undecided.intent
            ))
        })?;
    prefixes
        .iter()
        .map(|p| {
            p.as_str().ok_or_else(|| {
                SinkError::Corrupt(format!("artifact intent prefix {p} is not a string"))
            })
        })
        .collect()
}
