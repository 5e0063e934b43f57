//! The transactor: one connection, one SQLite transaction per Sluice transaction.
//!
//! ```text
//!   open ──▶ claim_range (BEGIN IMMEDIATE): fence++ on every overlapping range, recover
//!            the narrowest covering checkpoint  ──▶ Opened { flow_checkpoint }
//!   load ──▶ SELECT document … WHERE key IN (chunk of keys)    (autocommit reads)
//!   prepare ─▶ remember the runtime checkpoint; driver checkpoint `{}` (merge patch)
//!   store ──▶ BEGIN IMMEDIATE (first store) ─ INSERT / upsert / DELETE per document
//!   commit ─▶ UPDATE checkpoint WHERE fence = ours (1 row, else Fenced + ROLLBACK) ─ COMMIT
//!   a store or commit fails ─▶ ROLLBACK; fence moved since open? Fenced : the error
//! ```
//!
//! Invariants:
//! - The data of a transaction, its runtime checkpoint and the fence check commit in one
//!   SQLite transaction, so the store holds exactly the effects of the checkpoint it holds.
//! - Loads run only between transactions (the SDK calls `load` after the prior `commit`
//!   returned), so they read committed data through the same connection.
//! - A zombie whose Loads went stale fails its store of a key the newer instance wrote
//!   with a UNIQUE constraint error: the fence check after any failed store or commit
//!   ([`FencedStore::fence_checked`]) reports it as [`Error::Fenced`], which it is.
//! - rusqlite blocks: each call runs on the calling worker thread under
//!   [`blocking`] (multi-threaded runtimes), so the connection stays owned by the
//!   transactor and no data is copied to another thread. Statements run one by one
//!   with cached preparations: SQLite is in-process, so a statement per document costs
//!   no round trip.

use crate::client::{self, Lite, blocking, store_error};
use crate::config::EndpointConfig;
use crate::driver::spec_tables;
use crate::sql::{self, Table};
use async_trait::async_trait;
use rusqlite::Connection;
use rusqlite::types::{ToSqlOutput, ValueRef};
use sluice_driver_sdk::arena;
use sluice_driver_sdk::fence::{Claim, FencedStore, PreparedCheckpoint};
use sluice_driver_sdk::materialize::transaction_request::{Load, Open, Store};
use sluice_driver_sdk::{Error, LoadedSink, Result};
use sluice_sqlkit::apply::{Catalog, Ddl as _};
use sluice_sqlkit::config::materialization;
use sluice_sqlkit::fence::{self, FenceSql};
use sluice_sqlkit::unpack;

/// Keys looked up per SELECT. Each key binds `key columns` parameters, so 256 keys of
/// up to 100 columns stay well under SQLite's 32766-parameter limit, while one
/// statement still amortizes its preparation and stepping over many keys.
const LOAD_CHUNK: usize = 256;

/// A binding's table and the text of its statements (prepared and cached on first use).
struct BindingSql {
    insert: String,
    upsert: String,
    delete: String,
    table: Table,
}

impl BindingSql {
    fn new(table: Table) -> Self {
        BindingSql {
            insert: table.insert_sql(),
            upsert: table.upsert_sql(),
            delete: table.delete_sql(),
            table,
        }
    }
}

pub(crate) struct SqliteTransactor {
    conn: Connection,
    claim: Claim,
    /// The statements that check the claim.
    fence: FenceSql,
    bindings: Vec<BindingSql>,
    /// The runtime checkpoint of the transaction in progress.
    checkpoint: PreparedCheckpoint,
}

impl SqliteTransactor {
    /// Opens the database, checks every table is applied and claims the key range.
    /// Returns the transactor and the recovered runtime checkpoint.
    pub(crate) async fn open(open: Open) -> Result<(Self, Vec<u8>)> {
        let spec = materialization(open.materialization)?;
        let endpoint = EndpointConfig::parse(&spec.endpoint_spec_json)?;
        let tables = spec_tables(&spec)?;
        let mut conn = blocking(|| client::connect(&endpoint.path))?;
        let mut bindings = Vec::with_capacity(tables.len());
        for table in tables {
            if Lite(&mut conn)
                .existing_columns(&table.name)
                .await?
                .is_empty()
            {
                return Err(Error::Config(format!(
                    "table {:?} does not exist in {}: apply the materialization first",
                    table.name,
                    endpoint.path.display()
                )));
            }
            bindings.push(BindingSql::new(table));
        }
        let fence = sql::Ddl.fence_sql();
        let (claim, checkpoint) = fence::claim_range(
            &mut Lite(&mut conn),
            &fence,
            &spec.materialization,
            &open.version,
            open.key_begin,
            open.key_end,
        )
        .await?;
        tracing::debug!(?claim, path = %endpoint.path.display(), "opened SQLite transactor");
        let transactor = SqliteTransactor {
            conn,
            claim,
            fence,
            bindings,
            checkpoint: PreparedCheckpoint::default(),
        };
        Ok((transactor, checkpoint))
    }

    fn binding(&self, binding: u32) -> Result<&BindingSql> {
        sluice_sqlkit::binding(&self.bindings, binding)
    }

    /// Begins the transaction's write transaction, if not yet begun. IMMEDIATE takes the
    /// write lock now, so a concurrent writer waits here rather than failing at COMMIT.
    fn begin(&self) -> Result<()> {
        if self.conn.is_autocommit() {
            self.conn
                .execute_batch("BEGIN IMMEDIATE")
                .map_err(|err| store_error("beginning a store transaction", err))?;
        }
        Ok(())
    }

    fn load_blocking(&self, load: &Load, loaded: &mut dyn LoadedSink) -> Result<()> {
        let b = self.binding(load.binding)?;
        let table = &b.table;
        let context = || format!("loading from table {:?}", table.name);
        let keys = arena::load_keys(load)
            .map(|key| unpack(key?, table.key_count, "a loaded key"))
            .collect::<Result<Vec<_>>>()?;
        for chunk in keys.chunks(LOAD_CHUNK) {
            // Full chunks share one cached statement; the last, shorter one has its own.
            let text = table.load_sql(chunk.len()).ok_or_else(|| {
                Error::Config(format!(
                    "table {:?} has no document column to load",
                    table.name
                ))
            })?;
            let mut stmt = self
                .conn
                .prepare_cached(&text)
                .map_err(|err| store_error(context(), err))?;
            let params = chunk.iter().flat_map(|key| {
                key.iter()
                    .zip(table.keys())
                    .map(|(v, c)| sql::sql_value(v, c.ty))
            });
            let mut rows = stmt
                .query(rusqlite::params_from_iter(params))
                .map_err(|err| store_error(context(), err))?;
            while let Some(row) = rows.next().map_err(|err| store_error(context(), err))? {
                let doc = row.get_ref(0).map_err(|err| store_error(context(), err))?;
                match doc {
                    ValueRef::Text(doc) | ValueRef::Blob(doc) => loaded.push(load.binding, doc),
                    other => {
                        return Err(Error::store(
                            context(),
                            format!(
                                "document column holds {:?}, not JSON text",
                                other.data_type()
                            ),
                            false,
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    fn store_blocking(&self, store: &Store) -> Result<()> {
        self.begin()?;
        let b = self.binding(store.binding)?;
        let table = &b.table;
        let context = |i: usize| {
            format!(
                "storing document {i} of binding {} into table {:?}",
                store.binding, table.name
            )
        };
        let conn = &self.conn;
        let prepare = |text: &str, i| {
            conn.prepare_cached(text)
                .map_err(|err| store_error(context(i), err))
        };
        let mut insert = prepare(&b.insert, 0)?;
        let (mut upsert, mut delete) = (None, None);
        for (i, doc) in arena::store_docs(store).enumerate() {
            let doc = doc?;
            let keys = unpack(doc.key, table.key_count, "a stored key")?;
            if !table.delta_updates && doc.doc == b"null" {
                let stmt = match &mut delete {
                    Some(stmt) => stmt,
                    None => delete.insert(prepare(&b.delete, i)?),
                };
                let params = keys
                    .iter()
                    .zip(table.keys())
                    .map(|(v, c)| sql::sql_value(v, c.ty));
                stmt.execute(rusqlite::params_from_iter(params))
                    .map_err(|err| store_error(context(i), err))?;
                continue;
            }
            let values = unpack(doc.values, table.values().len(), "stored values")?;
            let stmt = if doc.exists && !table.delta_updates {
                match &mut upsert {
                    Some(stmt) => stmt,
                    None => upsert.insert(prepare(&b.upsert, i)?),
                }
            } else {
                &mut insert
            };
            let params = keys
                .iter()
                .chain(&values)
                .zip(&table.columns)
                .map(|(v, c)| sql::sql_value(v, c.ty))
                .chain(
                    table
                        .has_document
                        .then_some(ToSqlOutput::Borrowed(ValueRef::Text(doc.doc))),
                );
            stmt.execute(rusqlite::params_from_iter(params))
                .map_err(|err| store_error(context(i), err))?;
        }
        Ok(())
    }
}

#[async_trait]
impl FencedStore for SqliteTransactor {
    fn checkpoint(&mut self) -> &mut PreparedCheckpoint {
        &mut self.checkpoint
    }

    async fn load_keys(&mut self, load: Load, loaded: &mut dyn LoadedSink) -> Result<()> {
        blocking(|| self.load_blocking(&load, loaded))
    }

    async fn start_writes(&mut self, store: Store) -> Result<()> {
        blocking(|| self.store_blocking(&store))
    }

    /// Records the checkpoint if the fence holds, commits.
    async fn commit_writes(&mut self) -> Result<()> {
        let checkpoint = self.checkpoint.take()?;
        blocking(|| self.begin())?;
        let mut session = Lite(&mut self.conn);
        fence::commit_checkpoint(&mut session, &self.fence, &self.claim, &checkpoint).await?;
        // Durable when this returns: synchronous=FULL fsyncs the WAL before COMMIT completes.
        blocking(|| self.conn.execute_batch("COMMIT"))
            .map_err(|err| store_error("committing a store transaction", err))
    }

    fn claim(&self) -> &Claim {
        &self.claim
    }

    async fn rollback(&mut self) {
        if !self.conn.is_autocommit()
            && let Err(err) = blocking(|| self.conn.execute_batch("ROLLBACK"))
        {
            tracing::warn!(%err, "rolling back an unfinished SQLite transaction");
        }
    }

    async fn current_fence(&mut self) -> Result<Option<i64>> {
        fence::current_fence(&mut Lite(&mut self.conn), &self.fence, &self.claim).await
    }

    async fn release(mut self: Box<Self>) {
        self.rollback().await;
    }
}
