//! The transactor: one connection, one store transaction per Sluice transaction.
//!
//! ```text
//!   open ──▶ claim_range (fence++ on overlapping ranges, recover narrowest covering
//!            checkpoint); per standard binding a temp staging table (ON COMMIT DELETE ROWS)
//!   load ──▶ SELECT doc FROM t JOIN unnest($1::text[]::<type>[], …) ON keys   (1 query per
//!            5 000 keys of a Load; the next one runs while the last one's rows go out)
//!   prepare ─▶ remember the runtime checkpoint; driver checkpoint `{}` (merge patch)
//!   store ──▶ BEGIN (first store); encode the message, then hand its writes to a task:
//!               exists = false, or delta updates ─▶ COPY straight into the table
//!               exists = true                    ─▶ COPY into the staging table, then
//!                                                   INSERT … SELECT … ON CONFLICT DO UPDATE,
//!                                                   TRUNCATE the staging table
//!               document `null`                  ─▶ DELETE … USING unnest(keys)
//!   commit ─▶ await the last writes ─▶ UPDATE checkpoint WHERE fence = ours
//!             (0 rows: ROLLBACK, Fenced) ─▶ COMMIT
//!   a store or commit fails ─▶ await the writes, ROLLBACK; fence moved since open?
//!             Fenced (naming the error) : the error
//! ```
//!
//! The writes of Store message i run on the server while the runtime builds message
//! i+1 and this transactor encodes it: at most one writes task is in flight, and the
//! next one (or `commit`, `load`, `destroy`) starts only after it has finished, so
//! statements on the connection never interleave. A failed writes task fails the next
//! call, and the transaction is rolled back, never committed.
//!
//! Invariants:
//! - The data of a transaction, its runtime checkpoint and the fence check commit in one
//!   PostgreSQL transaction, so the store holds exactly the effects of the checkpoint it
//!   holds; any failure before COMMIT leaves nothing behind (the stream ends, `destroy`
//!   rolls back, and the server discards the staging rows).
//! - Loads run only between transactions (the SDK calls `load` after the prior `commit`
//!   returned), so they read committed data through the same connection.
//! - Never a round trip per document: a Store message costs at most two COPYs and three
//!   statements, a Load message one query per 5 000 keys, a commit two statements.
//! - A key the runtime says is absent is inserted with plain INSERT semantics (COPY):
//!   if it is in fact present the commit fails with the server's duplicate-key error
//!   rather than silently overwriting a row the runtime never loaded. If that key was
//!   written by a newer instance (this one is a zombie whose Loads went stale), the
//!   failure is reported as [`Error::Fenced`], which it is.

use crate::client::Pg;
use crate::sql::{self, CopyRow, Table};
use async_trait::async_trait;
use bytes::Bytes;
use futures::{SinkExt, TryStreamExt};
use sluice_driver_sdk::arena;
use sluice_driver_sdk::fence::{Claim, FencedStore, PreparedCheckpoint};
use sluice_driver_sdk::materialize::transaction_request::{Load, Open, Store};
use sluice_driver_sdk::{Error, LoadedSink, Result};
use sluice_pg_client::{EndpointConfig, pg_error};
use sluice_sqlkit::apply::{Ddl as _, check_applied};
use sluice_sqlkit::config::materialization;
use sluice_sqlkit::fence::{self, FenceSql};
use sluice_sqlkit::unpack;
use std::sync::Arc;
use tokio::task::JoinHandle;
use tokio_postgres::{Client, Statement};

/// One binding's table and statements.
struct Binding {
    table: Table,
    /// `COPY "s"."t" (…) FROM STDIN`.
    copy_target: String,
    /// Standard bindings only: the staging table's statements.
    stage: Option<Arc<Stage>>,
    /// Prepared at open (standard bindings with a document column).
    load: Option<Statement>,
    delete: Option<Statement>,
}

struct Stage {
    copy: String,
    merge: String,
    truncate: String,
}

/// The writes of one Store message, ready to run.
struct Writes {
    /// What failed writes were doing, e.g. "storing into table "s"."t"".
    context: String,
    /// Keys to delete, one `text[]` per key column.
    deletes: Option<(Statement, Vec<Vec<Option<String>>>)>,
    /// Rows to COPY straight into the table: (COPY statement, rows).
    direct: Option<(String, Vec<u8>)>,
    /// Rows to stage and merge.
    staged: Option<(Arc<Stage>, Vec<u8>)>,
}

impl Writes {
    /// Runs the writes, in order: deletions, plain inserts, staged upserts.
    async fn run(self, client: Arc<Client>) -> Result<()> {
        let context = &self.context;
        let err = |err| pg_error(context.as_str(), err);
        if let Some((delete, keys)) = &self.deletes {
            client.execute_raw(delete, keys.iter()).await.map_err(err)?;
        }
        if let Some((copy, rows)) = self.direct {
            copy_in(&client, &copy, rows).await.map_err(err)?;
        }
        if let Some((stage, rows)) = self.staged {
            copy_in(&client, &stage.copy, rows).await.map_err(err)?;
            client.batch_execute(&stage.merge).await.map_err(err)?;
            client.batch_execute(&stage.truncate).await.map_err(err)?;
        }
        Ok(())
    }
}

/// Streams `rows` through one `COPY ... FROM STDIN`.
async fn copy_in(client: &Client, copy: &str, rows: Vec<u8>) -> Result<(), tokio_postgres::Error> {
    let sink = client.copy_in::<_, Bytes>(copy).await?;
    futures::pin_mut!(sink);
    sink.send(Bytes::from(rows)).await?;
    sink.finish().await?;
    Ok(())
}

pub(crate) struct PostgresTransactor {
    client: Arc<Client>,
    /// The server, without password, for error contexts.
    server: String,
    schema: String,
    claim: Claim,
    /// The statements that check the claim.
    fence: FenceSql,
    bindings: Vec<Binding>,
    /// The runtime checkpoint of the transaction in progress.
    checkpoint: PreparedCheckpoint,
    /// Whether a store transaction is open on the connection.
    in_transaction: bool,
    /// The writes of the last Store message, if they may still be running.
    in_flight: Option<JoinHandle<Result<()>>>,
}

/// One lookup query of a Load, running on the connection (queries pipeline in order).
type Lookup = JoinHandle<Result<Vec<tokio_postgres::Row>>>;

/// Sends a lookup's documents out as Loaded messages.
async fn push_rows(lookup: Lookup, binding: u32, loaded: &mut dyn LoadedSink) -> Result<()> {
    let rows = lookup.await.map_err(|join| {
        Error::store("loading", format!("the lookup task failed: {join}"), false)
    })??;
    for row in rows {
        let doc: &str = row
            .try_get(0)
            .map_err(|err| pg_error("reading a loaded document", err))?;
        loaded.push(binding, doc.as_bytes());
    }
    loaded.send_full().await
}

/// Keys per lookup query. A Load of many keys (a whole 4 MiB message may hold 200 000)
/// is looked up in queries of this many, so that the server probes the primary key for
/// each (a nested loop: keys arrive sorted, so the probes walk the index in order)
/// rather than scanning the whole table once per Load (the plan it picks for a large
/// array), and so that the rows held (those of two lookups: the next one runs while the
/// last one's rows are sent out) stay few.
const KEYS_PER_LOOKUP: usize = 5_000;

impl PostgresTransactor {
    /// Connects, checks every table is applied, claims the key range and prepares the
    /// session. Returns the transactor and the recovered runtime checkpoint.
    pub(crate) async fn open(open: Open) -> Result<(Self, Vec<u8>)> {
        let spec = materialization(open.materialization)?;
        let endpoint = EndpointConfig::parse(&spec.endpoint_spec_json)?;
        let server = endpoint.describe();
        let tables = sql::spec_tables(&endpoint, &spec)?;
        let client = sluice_pg_client::connect(&endpoint).await?;
        let schema = endpoint.schema();
        let mut session = Pg {
            client: &client,
            schema,
            server: &server,
        };
        for table in &tables {
            check_applied(&mut session, table, &table.qualified(), &server).await?;
        }
        let fence = sql::Ddl { schema }.fence_sql();
        let (claim, checkpoint) = fence::claim_range(
            &mut session,
            &fence,
            &spec.materialization,
            &open.version,
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
        // The session's statements are many and short (a lookup of a few thousand keys,
        // a merge of one Store message): compiling each with JIT costs more than it
        // saves (about 0.9 s per lookup measured here).
        client
            .batch_execute("SET jit = off")
            .await
            .map_err(|err| pg_error(format!("configuring the session on {server}"), err))?;
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
                Some(Arc::new(Stage {
                    copy: table.copy_sql(&sql::quote_ident(&name)),
                    merge: table.merge_sql(&name),
                    truncate: format!("TRUNCATE {}", sql::quote_ident(&name)),
                }))
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
                table,
                stage,
                load,
                delete,
            });
        }
        tracing::debug!(?claim, %server, "opened PostgreSQL transactor");
        let transactor = PostgresTransactor {
            client: Arc::new(client),
            server,
            schema: schema.to_owned(),
            claim,
            fence,
            bindings,
            checkpoint: PreparedCheckpoint::default(),
            in_transaction: false,
            in_flight: None,
        };
        Ok((transactor, checkpoint))
    }

    fn binding(&self, binding: u32) -> Result<&Binding> {
        sluice_sqlkit::binding(&self.bindings, binding)
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

    /// Waits for the writes in flight, if any; their failure is this call's.
    async fn settle(&mut self) -> Result<()> {
        match self.in_flight.take() {
            None => Ok(()),
            Some(task) => task.await.map_err(|join| {
                Error::store("storing", format!("the writes task failed: {join}"), false)
            })?,
        }
    }

    /// The connection as a fencing client.
    fn session(&self) -> Pg<'_> {
        Pg {
            client: &self.client,
            schema: &self.schema,
            server: &self.server,
        }
    }
}

#[async_trait]
impl FencedStore for PostgresTransactor {
    fn claim(&self) -> &Claim {
        &self.claim
    }

    /// Awaits the writes in flight (their failure is already someone else's), then
    /// rolls back.
    async fn rollback(&mut self) {
        if let Err(writes) = self.settle().await {
            tracing::debug!(%writes, "writes in flight failed before the rollback");
        }
        if std::mem::take(&mut self.in_transaction)
            && let Err(err) = self.client.batch_execute("ROLLBACK").await
        {
            tracing::warn!(server = %self.server, %err, "rolling back an unfinished transaction");
        }
    }

    async fn current_fence(&mut self) -> Result<Option<i64>> {
        fence::current_fence(&mut self.session(), &self.fence, &self.claim).await
    }

    /// Encodes a Store message and starts its writes once the prior ones have ended.
    async fn start_writes(&mut self, store: Store) -> Result<()> {
        let b = self.binding(store.binding)?;
        let table = &b.table;
        let (mut direct, mut staged) = (CopyRow::default(), CopyRow::default());
        let mut deletes = vec![Vec::new(); table.key_count];
        for doc in arena::store_docs(&store) {
            let doc = doc?;
            let key = unpack(doc.key, table.key_count, "a stored key")?;
            if !table.delta_updates && doc.doc.trim_ascii() == b"null" {
                for ((column, value), array) in table.keys().iter().zip(&key).zip(&mut deletes) {
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
        let writes = Writes {
            context: format!("storing into table {}", table.qualified()),
            deletes: (b.delete.clone())
                .filter(|_| deletes.first().is_some_and(|keys| !keys.is_empty()))
                .map(|delete| (delete, deletes)),
            direct: (!direct.is_empty()).then(|| (b.copy_target.clone(), direct.take())),
            staged: (b.stage.clone())
                .filter(|_| !staged.is_empty())
                .map(|stage| (stage, staged.take())),
        };
        self.settle().await?;
        self.begin().await?;
        self.in_flight = Some(tokio::spawn(writes.run(self.client.clone())));
        Ok(())
    }

    /// Awaits the last writes, records the checkpoint if the fence holds, commits.
    async fn commit_writes(&mut self) -> Result<()> {
        let checkpoint = self.checkpoint.take()?;
        self.settle().await?;
        self.begin().await?;
        fence::commit(&mut self.session(), &self.fence, &self.claim, &checkpoint).await?;
        self.in_transaction = false;
        Ok(())
    }

    fn checkpoint(&mut self) -> &mut PreparedCheckpoint {
        &mut self.checkpoint
    }

    async fn load_keys(&mut self, load: Load, loaded: &mut dyn LoadedSink) -> Result<()> {
        let b = self.binding(load.binding)?;
        let table = &b.table;
        let statement = b.load.clone().ok_or_else(|| {
            Error::Config(format!(
                "table {} has no document column to load from",
                table.qualified()
            ))
        })?;
        let mut packed = arena::load_keys(&load).peekable();
        // One lookup runs on the server while the rows of the one before are sent out.
        let mut next = None;
        loop {
            if packed.peek().is_some() {
                let mut keys = vec![Vec::with_capacity(KEYS_PER_LOOKUP); table.key_count];
                for key in packed.by_ref().take(KEYS_PER_LOOKUP) {
                    let key = unpack(key?, table.key_count, "a loaded key")?;
                    for ((column, value), array) in table.keys().iter().zip(&key).zip(&mut keys) {
                        array.push(sql::key_text(column, value)?);
                    }
                }
                let (client, statement) = (self.client.clone(), statement.clone());
                let context = format!("loading from table {}", table.qualified());
                let lookup = tokio::spawn(async move {
                    let rows = client.query_raw(&statement, keys.iter()).await;
                    let rows = rows.map_err(|err| pg_error(&context, err))?;
                    rows.try_collect::<Vec<_>>()
                        .await
                        .map_err(|err| pg_error(&context, err))
                });
                if let Some(previous) = next.replace(lookup) {
                    push_rows(previous, load.binding, loaded).await?;
                }
            } else if let Some(last) = next.take() {
                push_rows(last, load.binding, loaded).await?;
            } else {
                return Ok(());
            }
        }
    }

    async fn release(mut self: Box<Self>) {
        self.rollback().await;
    }
}
