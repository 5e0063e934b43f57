//! The transactor: one connection, one store transaction per Sluice transaction.
//!
//! ```text
//!   open ──▶ claim_range (fence++ on overlapping ranges, recover narrowest covering
//!            checkpoint); per standard binding a temp staging table (ON COMMIT DELETE ROWS)
//!   load ──▶ SELECT doc FROM t JOIN unnest($1::text[]::<type>[], …) ON keys   (1 query/Load)
//!   prepare ─▶ remember the runtime checkpoint; driver checkpoint `{}` (merge patch)
//!   store ──▶ BEGIN (first store); per Store message, at most two COPYs:
//!               exists = false, or delta updates ─▶ COPY straight into the table
//!               exists = true                    ─▶ COPY into the staging table
//!               document `null`                  ─▶ key kept for one DELETE at commit
//!   commit ─▶ UPDATE checkpoint WHERE fence = ours (0 rows: ROLLBACK, Fenced)
//!             ─▶ INSERT … SELECT FROM stage ON CONFLICT DO UPDATE, DELETE … USING unnest
//!             ─▶ COMMIT
//! ```
//!
//! Invariants:
//! - The data of a transaction, its runtime checkpoint and the fence check commit in one
//!   PostgreSQL transaction, so the store holds exactly the effects of the checkpoint it
//!   holds; any failure before COMMIT leaves nothing behind (the stream ends, `destroy`
//!   rolls back, and the server discards the staging rows).
//! - Loads run only between transactions (the SDK calls `load` after the prior `commit`
//!   returned), so they read committed data through the same connection.
//! - Never a round trip per document: a Store message costs one or two COPYs, a Load
//!   message one query, a commit a fixed handful of statements per binding.
//! - A key the runtime says is absent is inserted with plain INSERT semantics (COPY):
//!   if it is in fact present the commit fails with the server's duplicate-key error
//!   rather than silently overwriting a row the runtime never loaded.

use crate::client::{self, Claim, pg_error};
use crate::config::EndpointConfig;
use crate::driver::{materialization, spec_tables};
use crate::sql::{self, CopyRow, Table};
use async_trait::async_trait;
use bytes::Bytes;
use futures::{SinkExt, TryStreamExt};
use serde_json::Value;
use sluice_doc::tuple;
use sluice_driver::arena;
use sluice_driver::{CommitPattern, Error, LoadedSink, PriorState, Result, Transactor};
use sluice_proto::flow;
use sluice_proto::materialize::transaction_request::{Load, Open, Prepare, Store};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Statement};

/// One binding's table, statements and what the transaction in progress staged for it.
struct Binding {
    table: Table,
    /// `COPY "s"."t" (…) FROM STDIN`.
    copy_target: String,
    /// Standard bindings only: the staging table's COPY and merge statements.
    stage: Option<Stage>,
    /// Prepared at open (standard bindings with a document column).
    load: Option<Statement>,
    delete: Option<Statement>,
    /// Rows staged for the merge in this transaction.
    staged: usize,
    /// Keys to delete in this transaction, one `text[]` per key column.
    deletes: Vec<Vec<Option<String>>>,
}

struct Stage {
    copy: String,
    merge: String,
}

pub(crate) struct PostgresTransactor {
    client: Client,
    /// The server, without password, for error contexts.
    server: String,
    claim: Claim,
    commit_checkpoint: Statement,
    bindings: Vec<Binding>,
    /// The runtime checkpoint of the transaction in progress (set by `prepare`).
    checkpoint: Option<Vec<u8>>,
    /// Whether a store transaction is open on the connection.
    in_transaction: bool,
}

/// Unpacks a packed tuple, checking it has `want` elements.
fn unpack(packed: &[u8], want: usize, what: &str) -> Result<Vec<Value>> {
    let values = tuple::unpack(packed)
        .map_err(|err| Error::store(format!("unpacking {what}"), err, false))?;
    if values.len() != want {
        return Err(Error::store(
            format!("unpacking {what}"),
            format!("expected {want} elements, got {}", values.len()),
            false,
        ));
    }
    Ok(values)
}

impl PostgresTransactor {
    /// Connects, checks every table is applied, claims the key range and prepares the
    /// session. Returns the transactor and the recovered runtime checkpoint.
    pub(crate) async fn open(open: Open) -> Result<(Self, Vec<u8>)> {
        let spec = materialization(open.materialization)?;
        let endpoint = EndpointConfig::parse(&spec.endpoint_spec_json)?;
        let server = endpoint.describe();
        let tables = spec_tables(&endpoint, &spec)?;
        let mut client = client::connect(&endpoint).await?;
        for table in &tables {
            let existing = client::existing_columns(&client, &table.schema, &table.name).await?;
            if let Some(missing) = (table.columns.iter()).find(|c| !existing.contains(&c.field)) {
                return Err(Error::Config(format!(
                    "table {} has no column {:?} on {server}: apply the materialization first",
                    table.qualified(),
                    missing.field
                )));
            }
        }
        let (claim, checkpoint) = client::claim_range(
            &mut client,
            endpoint.schema(),
            &spec.materialization,
            open.key_begin,
            open.key_end,
        )
        .await?;
        let prepare = |sql: String| {
            let client = &client;
            async move {
                client
                    .prepare(&sql)
                    .await
                    .map_err(|err| pg_error(format!("preparing `{sql}`"), err))
            }
        };
        let commit_checkpoint = prepare(client::commit_checkpoint_sql(endpoint.schema())).await?;
        let mut bindings = Vec::with_capacity(tables.len());
        for (i, table) in tables.into_iter().enumerate() {
            let stage = if table.delta_updates {
                None
            } else {
                let name = format!("sluice_stage_{i}");
                let create = table.create_stage_sql(&name);
                client
                    .batch_execute(&create)
                    .await
                    .map_err(|err| pg_error(format!("creating `{create}`"), err))?;
                Some(Stage {
                    copy: table.copy_sql(&sql::quote_ident(&name)),
                    merge: table.merge_sql(&name),
                })
            };
            let (load, delete) = match (&stage, table.load_sql()) {
                (Some(_), Some(load)) => (
                    Some(prepare(load).await?),
                    Some(prepare(table.delete_sql()).await?),
                ),
                _ => (None, None),
            };
            bindings.push(Binding {
                copy_target: table.copy_sql(&table.qualified()),
                deletes: vec![Vec::new(); table.key_count],
                table,
                stage,
                load,
                delete,
                staged: 0,
            });
        }
        tracing::debug!(?claim, %server, "opened PostgreSQL transactor");
        let transactor = PostgresTransactor {
            client,
            server,
            claim,
            commit_checkpoint,
            bindings,
            checkpoint: None,
            in_transaction: false,
        };
        Ok((transactor, checkpoint))
    }

    fn binding(&self, binding: u32) -> Result<&Binding> {
        self.bindings.get(binding as usize).ok_or_else(|| {
            Error::store(
                "routing a request",
                format!(
                    "binding {binding} does not exist (the materialization has {})",
                    self.bindings.len()
                ),
                false,
            )
        })
    }

    /// Begins the transaction's store transaction, if not yet begun.
    async fn begin(&mut self) -> Result<()> {
        if !self.in_transaction {
            self.client.batch_execute("BEGIN").await.map_err(|err| {
                pg_error(format!("beginning a transaction on {}", self.server), err)
            })?;
            self.in_transaction = true;
        }
        Ok(())
    }

    /// Streams `rows` through `copy` (one COPY statement).
    async fn copy(&self, copy: &str, rows: Vec<u8>, context: &str) -> Result<()> {
        let err = |err| pg_error(context, err);
        let sink = self.client.copy_in::<_, Bytes>(copy).await.map_err(err)?;
        futures::pin_mut!(sink);
        sink.send(Bytes::from(rows)).await.map_err(err)?;
        sink.finish().await.map_err(err)?;
        Ok(())
    }

    async fn rollback(&mut self) {
        if std::mem::take(&mut self.in_transaction)
            && let Err(err) = self.client.batch_execute("ROLLBACK").await
        {
            tracing::warn!(server = %self.server, %err, "rolling back an unfinished transaction");
        }
    }

    /// Merges the staged rows and deletes the deleted keys of every binding, pipelined
    /// on the connection.
    async fn apply_staged(&mut self) -> Result<()> {
        let client = &self.client;
        let mut work = Vec::new();
        for b in &mut self.bindings {
            let context = format!("committing into table {}", b.table.qualified());
            if let Some(stage) = b.stage.as_ref().filter(|_| b.staged > 0) {
                let context = context.clone();
                work.push(futures::future::Either::Left(async move {
                    client
                        .batch_execute(&stage.merge)
                        .await
                        .map_err(|err| pg_error(context, err))
                }));
            }
            b.staged = 0;
            let deletes = std::mem::replace(&mut b.deletes, vec![Vec::new(); b.table.key_count]);
            if let Some(delete) = b.delete.as_ref().filter(|_| !deletes[0].is_empty()) {
                work.push(futures::future::Either::Right(async move {
                    let params: Vec<&(dyn ToSql + Sync)> =
                        deletes.iter().map(|a| a as &(dyn ToSql + Sync)).collect();
                    client
                        .execute(delete, &params)
                        .await
                        .map(drop)
                        .map_err(|err| pg_error(context, err))
                }));
            }
        }
        futures::future::try_join_all(work).await?;
        Ok(())
    }
}

#[async_trait]
impl Transactor for PostgresTransactor {
    fn pattern(&self) -> CommitPattern {
        CommitPattern::RemoteAuthoritative
    }

    async fn load(
        &mut self,
        load: Load,
        _prior: PriorState,
        loaded: &mut dyn LoadedSink,
    ) -> Result<()> {
        let b = self.binding(load.binding)?;
        let table = &b.table;
        let statement = b.load.as_ref().ok_or_else(|| {
            Error::Config(format!(
                "table {} has no document column to load from",
                table.qualified()
            ))
        })?;
        let mut keys: Vec<Vec<Option<String>>> =
            vec![Vec::with_capacity(load.packed_keys.len()); table.key_count];
        for key in arena::load_keys(&load) {
            let key = unpack(key?, table.key_count, "a loaded key")?;
            for ((column, value), array) in table.keys().iter().zip(&key).zip(&mut keys) {
                array.push(sql::key_text(column, value)?);
            }
        }
        let context = || format!("loading from table {}", table.qualified());
        let rows = self
            .client
            .query_raw(statement, keys.iter())
            .await
            .map_err(|err| pg_error(context(), err))?;
        futures::pin_mut!(rows);
        while let Some(row) = rows
            .try_next()
            .await
            .map_err(|err| pg_error(context(), err))?
        {
            let doc: &str = row.try_get(0).map_err(|err| pg_error(context(), err))?;
            loaded.push(load.binding, doc.as_bytes());
        }
        Ok(())
    }

    async fn prepare(&mut self, prepare: Prepare) -> Result<flow::DriverCheckpoint> {
        self.checkpoint = Some(prepare.flow_checkpoint);
        Ok(flow::DriverCheckpoint {
            driver_checkpoint_json: b"{}".to_vec(),
            rfc7396_merge_patch: true,
        })
    }

    async fn store(&mut self, store: Store) -> Result<()> {
        self.binding(store.binding)?;
        self.begin().await?;
        let b = &mut self.bindings[store.binding as usize];
        let table = &b.table;
        let (mut direct, mut staged) = (CopyRow::default(), CopyRow::default());
        for doc in arena::store_docs(&store) {
            let doc = doc?;
            let key = unpack(doc.key, table.key_count, "a stored key")?;
            if !table.delta_updates && doc.doc.trim_ascii() == b"null" {
                for ((column, value), array) in table.keys().iter().zip(&key).zip(&mut b.deletes) {
                    array.push(sql::key_text(column, value)?);
                }
                continue;
            }
            let values = unpack(doc.values, table.values().len(), "stored values")?;
            let rows = if doc.exists && !table.delta_updates {
                &mut staged
            } else {
                &mut direct
            };
            rows.push(table, key.iter().chain(&values), Some(doc.doc))?;
        }
        b.staged += staged.rows();
        let b = &self.bindings[store.binding as usize];
        let context = format!("storing into table {}", b.table.qualified());
        if !direct.is_empty() {
            self.copy(&b.copy_target, direct.take(), &context).await?;
        }
        if let Some(stage) = b.stage.as_ref().filter(|_| !staged.is_empty()) {
            self.copy(&stage.copy, staged.take(), &context).await?;
        }
        Ok(())
    }

    async fn commit(&mut self) -> Result<()> {
        let checkpoint = self.checkpoint.take().ok_or_else(|| {
            Error::store(
                "committing",
                "Commit arrived without a prepared checkpoint",
                false,
            )
        })?;
        self.begin().await?;
        // The fence first: a fenced instance merges nothing, and from here on the range's
        // row is locked, so no newer Open can slip in before our COMMIT.
        if let Err(err) = client::commit_checkpoint(
            &self.client,
            &self.commit_checkpoint,
            &self.claim,
            &checkpoint,
        )
        .await
        {
            self.rollback().await;
            return Err(err);
        }
        self.apply_staged().await?;
        // Durable when this returns: the server flushed the commit record to its WAL.
        self.client
            .batch_execute("COMMIT")
            .await
            .map_err(|err| pg_error(format!("committing a transaction on {}", self.server), err))?;
        self.in_transaction = false;
        Ok(())
    }

    /// Nothing to do: the commit itself was authoritative and durable.
    async fn acknowledge(&mut self) -> Result<()> {
        Ok(())
    }

    async fn destroy(mut self: Box<Self>) {
        self.rollback().await;
    }
}
