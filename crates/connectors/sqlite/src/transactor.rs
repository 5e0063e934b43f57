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
//! - rusqlite blocks: the connection lives on its own thread ([`Conn`]), and each
//!   call sends it its work, owned: a Store message whole, a Load's keys
//!   [`LOAD_CHUNK`] at a time (the rows found come back per chunk, so a Load holds at
//!   most one chunk of documents in flight). Statements run one by one with cached
//!   preparations: SQLite is in-process, so a statement per document costs no round
//!   trip.

use crate::client::{Conn, Lite, store_error};
use crate::config::EndpointConfig;
use crate::sql::{self, Table};
use async_trait::async_trait;
use rusqlite::Connection;
use rusqlite::types::{ToSqlOutput, Value as SqlValue, ValueRef};
use sluice_driver_sdk::arena;
use sluice_driver_sdk::fence::{Claim, FencedStore, PreparedCheckpoint};
use sluice_driver_sdk::materialize::transaction_request::{Load, Open, Store};
use sluice_driver_sdk::{Error, LoadedSink, Result};
use sluice_sqlkit::apply::{Catalog, Ddl as _};
use sluice_sqlkit::config::materialization;
use sluice_sqlkit::fence::{self, FenceSql};
use sluice_sqlkit::unpack;
use std::sync::Arc;

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
    conn: Conn,
    claim: Claim,
    /// The statements that check the claim.
    fence: FenceSql,
    /// Shared with the work sent to the connection's thread.
    bindings: Arc<Vec<BindingSql>>,
    /// The runtime checkpoint of the transaction in progress.
    checkpoint: PreparedCheckpoint,
}

impl SqliteTransactor {
    /// Opens the database, checks every table is applied and claims the key range.
    /// Returns the transactor and the recovered runtime checkpoint.
    pub(crate) async fn open(open: Open) -> Result<(Self, Vec<u8>)> {
        let spec = materialization(open.materialization)?;
        let endpoint = EndpointConfig::parse(&spec.endpoint_spec_json)?;
        let tables = sql::spec_tables(&spec)?;
        let conn = Conn::open(&endpoint.path).await?;
        let mut bindings = Vec::with_capacity(tables.len());
        for table in tables {
            if Lite(&conn).existing_columns(&table.name).await?.is_empty() {
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
            &mut Lite(&conn),
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
            bindings: Arc::new(bindings),
            checkpoint: PreparedCheckpoint::default(),
        };
        Ok((transactor, checkpoint))
    }

    /// Checks that `binding` is one of the opened materialization's.
    fn check_binding(&self, binding: u32) -> Result<()> {
        sluice_sqlkit::binding(&self.bindings, binding).map(|_| ())
    }
}

/// Begins the Sluice transaction's write transaction, if not yet begun. IMMEDIATE takes
/// the write lock now, so a concurrent writer waits here rather than failing at COMMIT.
fn begin(conn: &Connection) -> Result<()> {
    if conn.is_autocommit() {
        conn.execute_batch("BEGIN IMMEDIATE")
            .map_err(|err| store_error("beginning a store transaction", err))?;
    }
    Ok(())
}

/// The documents stored under `keys` (one chunk of a Load) in `table`. Blocks.
fn load_chunk(conn: &Connection, table: &Table, keys: &[Vec<SqlValue>]) -> Result<Vec<Vec<u8>>> {
    let context = || format!("loading from table {:?}", table.name);
    // Full chunks share one cached statement; the last, shorter one has its own.
    let text = table.load_sql(keys.len()).ok_or_else(|| {
        Error::Config(format!(
            "table {:?} has no document column to load",
            table.name
        ))
    })?;
    let mut stmt = conn
        .prepare_cached(&text)
        .map_err(|err| store_error(context(), err))?;
    let mut rows = stmt
        .query(rusqlite::params_from_iter(keys.iter().flatten()))
        .map_err(|err| store_error(context(), err))?;
    let mut docs = Vec::new();
    while let Some(row) = rows.next().map_err(|err| store_error(context(), err))? {
        match row.get_ref(0).map_err(|err| store_error(context(), err))? {
            ValueRef::Text(doc) | ValueRef::Blob(doc) => docs.push(doc.to_vec()),
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
    Ok(docs)
}

/// Writes the documents of `store` into binding `b`'s table, in the open write
/// transaction (begun if needed). Blocks.
fn store_docs_into(conn: &Connection, b: &BindingSql, store: &Store) -> Result<()> {
    begin(conn)?;
    let table = &b.table;
    let context = |i: usize| {
        format!(
            "storing document {i} of binding {} into table {:?}",
            store.binding, table.name
        )
    };
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

#[async_trait]
impl FencedStore for SqliteTransactor {
    fn checkpoint(&mut self) -> &mut PreparedCheckpoint {
        &mut self.checkpoint
    }

    async fn load_keys(&mut self, load: Load, loaded: &mut dyn LoadedSink) -> Result<()> {
        self.check_binding(load.binding)?;
        let table = &self.bindings[load.binding as usize].table;
        let keys = arena::load_keys(&load)
            .map(|key| {
                let key = unpack(key?, table.key_count, "a loaded key")?;
                let params = key.iter().zip(table.keys());
                Ok(params
                    .map(|(v, c)| owned_value(sql::sql_value(v, c.ty)))
                    .collect())
            })
            .collect::<Result<Vec<Vec<SqlValue>>>>()?;
        let mut keys = keys.into_iter();
        loop {
            let chunk: Vec<_> = keys.by_ref().take(LOAD_CHUNK).collect();
            if chunk.is_empty() {
                return Ok(());
            }
            let (bindings, binding) = (self.bindings.clone(), load.binding as usize);
            let docs = (self.conn)
                .run(move |conn| load_chunk(conn, &bindings[binding].table, &chunk))
                .await?;
            for doc in docs {
                loaded.push(load.binding, &doc);
            }
            // Each chunk's documents go out before the next chunk is looked up.
            loaded.send_full().await?;
        }
    }

    async fn start_writes(&mut self, store: Store) -> Result<()> {
        self.check_binding(store.binding)?;
        let bindings = self.bindings.clone();
        (self.conn)
            .run(move |conn| store_docs_into(conn, &bindings[store.binding as usize], &store))
            .await
    }

    /// Records the checkpoint if the fence holds, commits.
    async fn commit_writes(&mut self) -> Result<()> {
        let checkpoint = self.checkpoint.take()?;
        self.conn.run(|conn| begin(conn)).await?;
        fence::commit(&mut Lite(&self.conn), &self.fence, &self.claim, &checkpoint).await
    }

    fn claim(&self) -> &Claim {
        &self.claim
    }

    async fn rollback(&mut self) {
        let rolled_back = (self.conn)
            .run(|conn| match conn.is_autocommit() {
                true => Ok(()),
                false => {
                    (conn.execute_batch("ROLLBACK")).map_err(|err| store_error("rolling back", err))
                }
            })
            .await;
        if let Err(err) = rolled_back {
            tracing::warn!(%err, "rolling back an unfinished SQLite transaction");
        }
    }

    async fn current_fence(&mut self) -> Result<Option<i64>> {
        fence::current_fence(&mut Lite(&self.conn), &self.fence, &self.claim).await
    }

    async fn release(mut self: Box<Self>) {
        self.rollback().await;
    }
}

/// A bound value, owned, to send to the connection's thread.
fn owned_value(value: ToSqlOutput<'_>) -> SqlValue {
    match value {
        ToSqlOutput::Borrowed(value) => value.into(),
        ToSqlOutput::Owned(value) => value,
        other => unreachable!("sql_value binds borrowed or owned values, not {other:?}"),
    }
}
