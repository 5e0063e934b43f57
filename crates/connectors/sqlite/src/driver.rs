//! [`SqliteDriver`]: the unary calls (Spec, Validate, Apply) and the transactor.
//!
//! ```text
//!   open ──▶ claim_range: fence++ on every overlapping range, recover the narrowest
//!            covering checkpoint  ──▶ Opened { flow_checkpoint }
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
//!   reports it as [`Error::Fenced`], which it is.
//! - rusqlite blocks: each call runs on the calling worker thread under
//!   [`tokio::task::block_in_place`] (multi-threaded runtimes), so the connection stays
//!   owned by the transactor and no data is copied to another thread.

use crate::config::{
    DOCUMENTATION_URL, ENDPOINT_SCHEMA, EndpointConfig, ResourceConfig, resource_schema,
};
use crate::sql::{self, Claim, ColumnType, Table};
use async_trait::async_trait;
use rusqlite::Connection;
use rusqlite::types::{ToSqlOutput, ValueRef};
use sluice_driver_sdk::arena;
use sluice_driver_sdk::fence::PreparedCheckpoint;
use sluice_driver_sdk::flow;
use sluice_driver_sdk::materialize::{
    self as m,
    transaction_request::{Load, Open, Prepare, Store},
    transaction_response::Opened,
};
use sluice_driver_sdk::{CommitPattern, Driver, Error, LoadedSink, PriorState, Result, Transactor};
use sluice_sqlkit as kit;
use sluice_sqlkit::config::materialization;
use sluice_sqlkit::unpack;
use sluice_sqlkit::validate;

/// Keys looked up per SELECT. Each key binds `key columns` parameters, so 256 keys of
/// up to 100 columns stay well under SQLite's 32766-parameter limit, while one
/// statement still amortizes its preparation and stepping over many keys.
const LOAD_CHUNK: usize = 256;

/// The SQLite driver. Stateless: the endpoint config arrives with each request.
#[derive(Debug, Default, Clone)]
pub struct SqliteDriver;

impl SqliteDriver {
    pub fn new() -> Self {
        SqliteDriver
    }
}

/// Runs blocking SQLite work without stalling the runtime's other tasks.
fn blocking<R>(work: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(work),
        _ => work(),
    }
}

/// The tables of a materialization's bindings, each named once.
fn spec_tables(spec: &flow::MaterializationSpec) -> Result<Vec<Table>> {
    let tables = kit::spec_tables(spec, None, |a, b| a == b)?;
    Ok(tables.into_iter().map(Table).collect())
}

/// Runs `statements` in one transaction.
fn execute_all(conn: &mut Connection, statements: &[String]) -> Result<()> {
    let tx = conn
        .transaction()
        .map_err(|err| sql::store_error("beginning apply", err))?;
    for statement in statements {
        tx.execute_batch(statement)
            .map_err(|err| sql::store_error(format!("applying `{statement}`"), err))?;
    }
    tx.commit()
        .map_err(|err| sql::store_error("committing apply", err))
}

/// Applies (or, dry, only describes) what `plan` decides from the current database.
fn apply(
    req: m::ApplyRequest,
    plan: fn(Option<&Connection>, &flow::MaterializationSpec) -> Result<Vec<String>>,
) -> Result<m::ApplyResponse> {
    let spec = materialization(req.materialization)?;
    let endpoint = EndpointConfig::parse(&spec.endpoint_spec_json)?;
    blocking(|| {
        let statements = if req.dry_run {
            plan(sql::connect_read_only(&endpoint.path)?.as_ref(), &spec)?
        } else {
            let mut conn = sql::connect(&endpoint.path)?;
            let statements = plan(Some(&conn), &spec)?;
            execute_all(&mut conn, &statements)?;
            statements
        };
        Ok(m::ApplyResponse {
            action_description: statements.iter().map(|s| format!("{s};\n")).collect(),
        })
    })
}

/// Creates missing tables, adds missing columns, creates the checkpoints table.
fn plan_upsert(conn: Option<&Connection>, spec: &flow::MaterializationSpec) -> Result<Vec<String>> {
    let columns_of = |table: &str| match conn {
        Some(conn) => sql::existing_columns(conn, table),
        None => Ok(Vec::new()),
    };
    let mut statements = Vec::new();
    if columns_of(sql::CHECKPOINTS_TABLE)?.is_empty() {
        statements.push(sql::CREATE_CHECKPOINTS.to_owned());
    }
    for table in spec_tables(spec)? {
        let existing = columns_of(&table.name)?;
        if existing.is_empty() {
            statements.push(table.create_sql());
            continue;
        }
        for column in &table.columns {
            if !existing.contains(&column.field) {
                statements.push(table.add_column_sql(column));
            }
        }
    }
    Ok(statements)
}

/// Drops the tables of existing bindings and forgets the materialization's checkpoints.
fn plan_delete(conn: Option<&Connection>, spec: &flow::MaterializationSpec) -> Result<Vec<String>> {
    let Some(conn) = conn else {
        return Ok(Vec::new());
    };
    let mut statements = Vec::new();
    for table in spec_tables(spec)? {
        if !sql::existing_columns(conn, &table.name)?.is_empty() {
            statements.push(table.drop_sql());
        }
    }
    if !sql::existing_columns(conn, sql::CHECKPOINTS_TABLE)?.is_empty() {
        let delete = format!(
            "DELETE FROM {} WHERE \"materialization\" = {}",
            sql::quote_ident(sql::CHECKPOINTS_TABLE),
            sql::quote_literal(&spec.materialization)
        );
        let rows: i64 = conn
            .query_row(
                "SELECT count(*) FROM \"sluice_checkpoints\" WHERE \"materialization\" = ?1",
                [&spec.materialization],
                |row| row.get(0),
            )
            .map_err(|err| sql::store_error("counting checkpoints", err))?;
        if rows > 0 {
            statements.push(delete);
        }
    }
    Ok(statements)
}

#[async_trait]
impl Driver for SqliteDriver {
    async fn spec(&self, _req: m::SpecRequest) -> Result<m::SpecResponse> {
        Ok(m::SpecResponse {
            endpoint_spec_schema_json: ENDPOINT_SCHEMA.to_owned(),
            resource_spec_schema_json: resource_schema(),
            documentation_url: DOCUMENTATION_URL.to_owned(),
        })
    }

    async fn validate(&self, req: m::ValidateRequest) -> Result<m::ValidateResponse> {
        EndpointConfig::parse(&req.endpoint_spec_json)?;
        validate::validate(&validate::Store::of::<ColumnType>(), &req, |json| {
            let resource = ResourceConfig::parse(json, None)?;
            Ok(validate::Resource {
                path: vec![resource.table],
                delta_updates: resource.delta_updates,
            })
        })
    }

    async fn apply_upsert(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        apply(req, plan_upsert)
    }

    async fn apply_delete(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        apply(req, plan_delete)
    }

    async fn open(&self, open: Open) -> Result<(Box<dyn Transactor>, Opened)> {
        let spec = materialization(open.materialization)?;
        let endpoint = EndpointConfig::parse(&spec.endpoint_spec_json)?;
        let tables = spec_tables(&spec)?;
        blocking(|| {
            let mut conn = sql::connect(&endpoint.path)?;
            let mut bindings = Vec::with_capacity(tables.len());
            for table in tables {
                if sql::existing_columns(&conn, &table.name)?.is_empty() {
                    return Err(Error::Config(format!(
                        "table {:?} does not exist in {}: apply the materialization first",
                        table.name,
                        endpoint.path.display()
                    )));
                }
                bindings.push(BindingSql::new(table));
            }
            let (claim, flow_checkpoint) = sql::claim_range(
                &mut conn,
                &spec.materialization,
                open.key_begin,
                open.key_end,
            )?;
            tracing::debug!(?claim, path = %endpoint.path.display(), "opened SQLite transactor");
            let transactor = SqliteTransactor {
                conn,
                claim,
                bindings,
                checkpoint: PreparedCheckpoint::default(),
            };
            Ok((
                Box::new(transactor) as Box<dyn Transactor>,
                Opened { flow_checkpoint },
            ))
        })
    }
}

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

struct SqliteTransactor {
    conn: Connection,
    claim: Claim,
    bindings: Vec<BindingSql>,
    /// The runtime checkpoint of the transaction in progress.
    checkpoint: PreparedCheckpoint,
}

impl SqliteTransactor {
    fn binding(&self, binding: u32) -> Result<&BindingSql> {
        sluice_sqlkit::binding(&self.bindings, binding)
    }

    /// Begins the transaction's write transaction, if not yet begun. IMMEDIATE takes the
    /// write lock now, so a concurrent writer waits here rather than failing at COMMIT.
    fn begin(&self) -> Result<()> {
        if self.conn.is_autocommit() {
            self.conn
                .execute_batch("BEGIN IMMEDIATE")
                .map_err(|err| sql::store_error("beginning a store transaction", err))?;
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
                .map_err(|err| sql::store_error(context(), err))?;
            let params = chunk.iter().flat_map(|key| {
                key.iter()
                    .zip(table.keys())
                    .map(|(v, c)| sql::sql_value(v, c.ty))
            });
            let mut rows = stmt
                .query(rusqlite::params_from_iter(params))
                .map_err(|err| sql::store_error(context(), err))?;
            while let Some(row) = rows
                .next()
                .map_err(|err| sql::store_error(context(), err))?
            {
                let doc = row
                    .get_ref(0)
                    .map_err(|err| sql::store_error(context(), err))?;
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
                .map_err(|err| sql::store_error(context(i), err))
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
                    .map_err(|err| sql::store_error(context(i), err))?;
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
                .map_err(|err| sql::store_error(context(i), err))?;
        }
        Ok(())
    }

    /// `result`, unless it failed: then the transaction is rolled back, and the error
    /// is [`Error::Fenced`] if a newer instance has opened this range since.
    fn fence_checked(&self, result: Result<()>) -> Result<()> {
        result.map_err(|err| {
            if !self.conn.is_autocommit()
                && let Err(rollback) = self.conn.execute_batch("ROLLBACK")
            {
                tracing::warn!(%rollback, "rolling back a failed SQLite transaction");
            }
            let current = sql::current_fence(&self.conn, &self.claim);
            self.claim.range_fence().explain(err, current)
        })
    }

    fn commit_blocking(&mut self) -> Result<()> {
        let checkpoint = self.checkpoint.take()?;
        self.begin()?;
        sql::commit_checkpoint(&self.conn, &self.claim, &checkpoint)?;
        // Durable when this returns: synchronous=FULL fsyncs the WAL before COMMIT completes.
        self.conn
            .execute_batch("COMMIT")
            .map_err(|err| sql::store_error("committing a store transaction", err))
    }
}

#[async_trait]
impl Transactor for SqliteTransactor {
    fn pattern(&self) -> CommitPattern {
        CommitPattern::RemoteAuthoritative
    }

    async fn load(
        &mut self,
        load: Load,
        _prior: PriorState,
        loaded: &mut dyn LoadedSink,
    ) -> Result<()> {
        blocking(|| self.load_blocking(&load, loaded))
    }

    async fn prepare(&mut self, prepare: Prepare) -> Result<flow::DriverCheckpoint> {
        Ok(self.checkpoint.prepare(prepare))
    }

    async fn store(&mut self, store: Store) -> Result<()> {
        blocking(|| self.fence_checked(self.store_blocking(&store)))
    }

    async fn commit(&mut self) -> Result<()> {
        blocking(|| {
            let committed = self.commit_blocking();
            self.fence_checked(committed)
        })
    }

    /// Nothing to do: the commit itself was authoritative and durable.
    async fn acknowledge(&mut self) -> Result<()> {
        Ok(())
    }

    async fn destroy(self: Box<Self>) {
        if !self.conn.is_autocommit()
            && let Err(err) = blocking(|| self.conn.execute_batch("ROLLBACK"))
        {
            tracing::warn!(%err, "rolling back an unfinished SQLite transaction");
        }
    }
}
