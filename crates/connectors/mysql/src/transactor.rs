//! The transactor: one connection, one store transaction per Sluice transaction.
//!
//! ```text
//!   open ──▶ claim_range (fence++ on overlapping ranges, recover narrowest covering
//!            checkpoint)
//!   load ──▶ SELECT doc FROM t WHERE k IN (…) / (k1, k2) IN ((…), …)   (≤ 1 MiB each)
//!   prepare ─▶ remember the runtime checkpoint; driver checkpoint `{}` (merge patch)
//!   store ──▶ START TRANSACTION (first store); encode the message, then hand its writes
//!             to a task that owns the connection meanwhile:
//!               document `null`                  ─▶ DELETE … WHERE k IN (…)
//!               exists = false, or delta updates ─▶ LOAD DATA LOCAL INTO t
//!               exists = true                    ─▶ LOAD DATA LOCAL REPLACE INTO t
//!   commit ─▶ await the last writes ─▶ UPDATE checkpoint WHERE fence = ours
//!             (0 rows: ROLLBACK, Fenced) ─▶ COMMIT
//!   a store or commit fails ─▶ await the writes, ROLLBACK; fence moved since open?
//!             Fenced (naming the error) : the error
//! ```
//!
//! The writes of Store message i run on the server while the runtime builds message
//! i+1 and this transactor encodes it: the connection moves into the writes task and
//! comes back when it ends, and the next writes (or `commit`, `load`, `destroy`) take it
//! only then, so statements on the connection never interleave. A failed writes task
//! fails the next call, and the transaction is rolled back, never committed.
//!
//! Invariants:
//! - The data of a transaction, its runtime checkpoint and the fence check commit in one
//!   InnoDB transaction, so the store holds exactly the effects of the checkpoint it
//!   holds; any failure before COMMIT leaves nothing behind (the stream ends, `destroy`
//!   rolls back, and a lost connection is rolled back by the server).
//! - Loads run only between transactions (the SDK calls `load` after the prior `commit`
//!   returned), so they read committed data through the same connection.
//! - Never a round trip per document: a Store message costs at most two `LOAD DATA`s
//!   plus one `DELETE` per MiB of deleted keys, a Load message one query per MiB of keys.
//! - A key the runtime says is absent is inserted with plain `LOAD DATA` semantics: if
//!   it is in fact present, the server's duplicate-key warning fails the commit rather
//!   than silently overwriting a row the runtime never loaded. Any other warning of a
//!   load (a truncation, a conversion) fails it too. If that key was written by a newer
//!   instance (this one is a zombie whose Loads went stale), the failure is reported as
//!   [`Error::Fenced`], which it is.

use crate::client::{self, My, my_error};
use crate::config::EndpointConfig;
use crate::sql::{self, Flavor, InfileRows, KeyLists, Table};
use async_trait::async_trait;
use mysql_async::Conn;
use mysql_async::prelude::Queryable;
use sluice_driver_sdk::arena;
use sluice_driver_sdk::fence::{Claim, FencedStore, PreparedCheckpoint};
use sluice_driver_sdk::materialize::transaction_request::{Load, Open, Store};
use sluice_driver_sdk::{Error, LoadedSink, Result};
use sluice_sqlkit::apply::{Ddl as _, check_applied};
use sluice_sqlkit::config::materialization;
use sluice_sqlkit::fence::{self, FenceSql};
use sluice_sqlkit::unpack;
use std::sync::Arc;
use tokio::task::JoinHandle;

/// One binding's table and statements.
struct Binding {
    table: Table,
    /// `LOAD DATA … INTO t`, and its `REPLACE` form (standard bindings).
    insert: String,
    replace: String,
    /// `SELECT doc FROM t WHERE ` (standard bindings with a document column).
    load: Option<String>,
}

/// The writes of one Store message, ready to run.
struct Writes {
    /// What failed writes were doing, e.g. "storing into table `t`".
    context: String,
    deletes: Vec<String>,
    /// (`LOAD DATA` statement, rows), for plain inserts and for replacements.
    loads: Vec<(String, Vec<u8>)>,
}

impl Writes {
    /// Runs the writes, in order: deletions, plain inserts, replacements. Gives the
    /// connection back whatever the outcome.
    async fn run(self, mut conn: Conn) -> (Conn, Result<()>) {
        let result = self.run_on(&mut conn).await;
        (conn, result)
    }

    async fn run_on(self, conn: &mut Conn) -> Result<()> {
        let context = |err: Error| match err {
            Error::Store {
                context,
                message,
                retryable,
            } => Error::Store {
                context: format!("{}: {context}", self.context),
                message,
                retryable,
            },
            other => other,
        };
        for delete in &self.deletes {
            conn.query_drop(delete)
                .await
                .map_err(|err| my_error(&self.context, err))?;
        }
        for (statement, rows) in self.loads {
            client::load_data(conn, &statement, rows)
                .await
                .map_err(context)?;
        }
        Ok(())
    }
}

/// The connection, or the task holding it while it runs a Store message's writes.
enum Connection {
    Idle(Conn),
    Writing(JoinHandle<(Conn, Result<()>)>),
    /// A writes task panicked and took the connection with it.
    Lost,
}

pub(crate) struct MysqlTransactor {
    conn: Connection,
    /// The server, without password, for error contexts.
    server: String,
    flavor: Flavor,
    claim: Arc<Claim>,
    /// The statements that check the claim.
    fence: Arc<FenceSql>,
    bindings: Vec<Binding>,
    /// The runtime checkpoint of the transaction in progress.
    checkpoint: PreparedCheckpoint,
    /// Whether a store transaction is open on the connection.
    in_transaction: bool,
}

impl MysqlTransactor {
    /// Connects, checks every table is applied and claims the key range. Returns the
    /// transactor and the recovered runtime checkpoint.
    pub(crate) async fn open(open: Open) -> Result<(Self, Vec<u8>)> {
        let spec = materialization(open.materialization)?;
        let endpoint = EndpointConfig::parse(&spec.endpoint_spec_json)?;
        let server = endpoint.describe();
        let tables = sql::spec_tables(&spec)?;
        let (mut conn, flavor) = client::connect(&endpoint).await?;
        let mut session = My {
            conn: &mut conn,
            flavor,
            server: &server,
        };
        for table in &tables {
            let shown = format!("{:?}", table.name);
            check_applied(&mut session, table, &shown, &server).await?;
        }
        let fence = sql::Ddl { flavor }.fence_sql();
        let (claim, checkpoint) = fence::claim_range(
            &mut session,
            &fence,
            &spec.materialization,
            &open.version,
            open.key_begin,
            open.key_end,
        )
        .await?;
        let bindings = tables
            .into_iter()
            .map(|table| Binding {
                insert: table.load_data_sql(false),
                replace: table.load_data_sql(true),
                load: table.load_prefix().filter(|_| !table.delta_updates),
                table,
            })
            .collect();
        tracing::debug!(?claim, %server, "opened MySQL transactor");
        let transactor = MysqlTransactor {
            conn: Connection::Idle(conn),
            server,
            flavor,
            claim: Arc::new(claim),
            fence: Arc::new(fence),
            bindings,
            checkpoint: PreparedCheckpoint::default(),
            in_transaction: false,
        };
        Ok((transactor, checkpoint))
    }

    fn binding(&self, binding: u32) -> Result<&Binding> {
        sluice_sqlkit::binding(&self.bindings, binding)
    }

    /// The connection, after the writes in flight (if any) have ended; their failure
    /// is this call's.
    async fn settle(&mut self) -> Result<&mut Conn> {
        if let Connection::Writing(task) = &mut self.conn {
            let (conn, result) = task.await.map_err(|join| {
                self.conn = Connection::Lost;
                Error::store("storing", format!("the writes task failed: {join}"), false)
            })?;
            self.conn = Connection::Idle(conn);
            result?;
        }
        match &mut self.conn {
            Connection::Idle(conn) => Ok(conn),
            _ => Err(Error::store(
                "storing",
                "the connection was lost with a failed writes task",
                false,
            )),
        }
    }

    /// The settled connection, inside the transaction's store transaction.
    async fn begin(&mut self) -> Result<&mut Conn> {
        let begun = std::mem::replace(&mut self.in_transaction, true);
        let server = self.server.clone();
        let conn = self.settle().await?;
        if !begun {
            conn.query_drop("START TRANSACTION")
                .await
                .map_err(|err| my_error(format!("beginning a transaction on {server}"), err))?;
        }
        Ok(conn)
    }
}

#[async_trait]
impl FencedStore for MysqlTransactor {
    fn claim(&self) -> &Claim {
        &self.claim
    }

    /// Awaits the writes in flight (their failure is already someone else's), then
    /// rolls back.
    async fn rollback(&mut self) {
        if !std::mem::take(&mut self.in_transaction) {
            return;
        }
        let server = self.server.clone();
        match self.settle().await {
            Ok(conn) => {
                if let Err(err) = conn.query_drop("ROLLBACK").await {
                    tracing::warn!(%server, %err, "rolling back an unfinished transaction");
                }
            }
            Err(err) => tracing::debug!(%err, "writes in flight failed before the rollback"),
        }
    }

    async fn current_fence(&mut self) -> Result<Option<i64>> {
        let (claim, fencing, flavor) = (self.claim.clone(), self.fence.clone(), self.flavor);
        let server = self.server.clone();
        let conn = self.settle().await?;
        let session = &mut My {
            conn,
            flavor,
            server: &server,
        };
        fence::current_fence(session, &fencing, &claim).await
    }

    /// Encodes a Store message and hands its writes to a task once the prior ones ended.
    async fn start_writes(&mut self, store: Store) -> Result<()> {
        let b = self.binding(store.binding)?;
        let table = &b.table;
        let (mut inserts, mut replaces) = (InfileRows::default(), InfileRows::default());
        let mut deletes = KeyLists::new(table, table.delete_prefix());
        for doc in arena::store_docs(&store) {
            let doc = doc?;
            let key = unpack(doc.key, table.key_count, "a stored key")?;
            if !table.delta_updates && doc.doc.trim_ascii() == b"null" {
                deletes.push(&key)?;
                continue;
            }
            let values = unpack(doc.values, table.values().len(), "stored values")?;
            let rows = if doc.exists && !table.delta_updates {
                &mut replaces
            } else {
                &mut inserts
            };
            rows.push(table, key.iter().chain(&values), Some(doc.doc))?;
        }
        let mut loads = Vec::new();
        for (statement, rows) in [(&b.insert, &mut inserts), (&b.replace, &mut replaces)] {
            if !rows.is_empty() {
                loads.push((statement.clone(), rows.take()));
            }
        }
        let writes = Writes {
            context: format!("storing into table {:?}", table.name),
            deletes: deletes.finish(),
            loads,
        };
        self.begin().await?;
        let Connection::Idle(conn) = std::mem::replace(&mut self.conn, Connection::Lost) else {
            unreachable!("begin returns only with an idle connection");
        };
        self.conn = Connection::Writing(tokio::spawn(writes.run(conn)));
        Ok(())
    }

    /// Awaits the last writes, records the checkpoint if the fence holds, commits.
    async fn commit_writes(&mut self) -> Result<()> {
        let checkpoint = self.checkpoint.take()?;
        let (claim, fencing, flavor) = (self.claim.clone(), self.fence.clone(), self.flavor);
        let server = self.server.clone();
        let conn = self.begin().await?;
        let session = &mut My {
            conn,
            flavor,
            server: &server,
        };
        fence::commit(session, &fencing, &claim, &checkpoint).await?;
        self.in_transaction = false;
        Ok(())
    }

    fn checkpoint(&mut self) -> &mut PreparedCheckpoint {
        &mut self.checkpoint
    }

    async fn load_keys(&mut self, load: Load, loaded: &mut dyn LoadedSink) -> Result<()> {
        let b = self.binding(load.binding)?;
        let table = &b.table;
        let prefix = b.load.clone().ok_or_else(|| {
            Error::Config(format!(
                "table {:?} has no document column to load from",
                table.name
            ))
        })?;
        let mut lists = KeyLists::new(table, prefix);
        for key in arena::load_keys(&load) {
            lists.push(&unpack(key?, table.key_count, "a loaded key")?)?;
        }
        let statements = lists.finish();
        let context = format!("loading from table {:?}", table.name);
        let conn = self.settle().await?;
        for statement in statements {
            let rows: Vec<mysql_async::Row> = conn
                .query(statement)
                .await
                .map_err(|err| my_error(&context, err))?;
            for row in rows {
                match row.as_ref(0) {
                    Some(mysql_async::Value::Bytes(doc)) => loaded.push(load.binding, doc),
                    other => {
                        return Err(Error::store(
                            &context,
                            format!("the document column holds {other:?}, not JSON text"),
                            false,
                        ));
                    }
                }
            }
            // Each statement's rows go out before the next one's arrive.
            loaded.send_full().await?;
        }
        Ok(())
    }

    async fn release(mut self: Box<Self>) {
        self.rollback().await;
        if let Connection::Idle(conn) = self.conn
            && let Err(err) = conn.disconnect().await
        {
            tracing::debug!(%err, "disconnecting at the end of the stream");
        }
    }
}
