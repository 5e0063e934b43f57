//! Talking to SQLite: opening the database file, error classification, [`Conn`] (a
//! connection on its own thread), and [`Lite`], the catalog Apply reads and the client
//! calls the fencing protocol ([`sluice_sqlkit::fence`]) runs.
//!
//! Threads: rusqlite blocks, so each connection lives on a dedicated thread
//! (`sluice-sqlite`) that runs the work sent to it ([`Conn::run`]), one request at a
//! time, in order; the async caller awaits the answer. No SQLite call runs on an async
//! worker, on every runtime flavour (a current-thread runtime too). Requests carry what
//! they need, owned, and answers bring back owned rows.
//!
//! ```text
//!  transactor / Apply (async) ──FnOnce(&mut Connection)──▶ sluice-sqlite thread ─┐
//!                             ◀────────────── answer (oneshot) ─────────────────┘
//!  Conn dropped ──▶ the thread runs what was sent, closes the connection, ends
//! ```
//!
//! Claims are serialized by SQLite itself: `BEGIN IMMEDIATE` takes the database's write
//! lock, which a concurrent claim or store waits for (up to the busy timeout, 30 s).

use crate::sql;
use async_trait::async_trait;
use rusqlite::types::{ToSqlOutput, Value as SqlValue, ValueRef};
use rusqlite::{Connection, OpenFlags, OptionalExtension};
use sluice_driver_sdk::{Error, Result};
use sluice_sqlkit::apply::Catalog;
use sluice_sqlkit::fence::{FenceClient, Param};
use std::path::Path;
use std::sync::mpsc;
use std::time::Duration;
use tokio::sync::oneshot;

/// Work for a connection's thread.
type Job = Box<dyn FnOnce(&mut Connection) + Send>;

/// A connection owned by its own thread (see the module docs). Dropping it lets the
/// thread finish the work already sent, close the connection (rolling back a
/// transaction left open) and end.
pub struct Conn {
    jobs: mpsc::Sender<Job>,
}

impl Conn {
    /// Opens the database at `path` for writing (see [`connect`]) on a new thread.
    pub async fn open(path: &Path) -> Result<Conn> {
        let path = path.to_path_buf();
        Conn::spawn(move || connect(&path).map(Some))
            .await
            .map(|conn| conn.expect("connect returns a connection"))
    }

    /// Opens the database at `path` read-only on a new thread, or `None` if it does not
    /// exist (see [`connect_read_only`]).
    pub async fn open_read_only(path: &Path) -> Result<Option<Conn>> {
        let path = path.to_path_buf();
        Conn::spawn(move || connect_read_only(&path)).await
    }

    /// Starts the thread, which opens its connection with `open` and then serves jobs.
    async fn spawn(
        open: impl FnOnce() -> Result<Option<Connection>> + Send + 'static,
    ) -> Result<Option<Conn>> {
        let (jobs, received) = mpsc::channel::<Job>();
        let (opened_tx, opened) = oneshot::channel();
        std::thread::Builder::new()
            .name("sluice-sqlite".into())
            .spawn(move || {
                let mut conn = match open() {
                    Ok(Some(conn)) => {
                        let _ = opened_tx.send(Ok(true));
                        conn
                    }
                    other => {
                        let _ = opened_tx.send(other.map(|_| false));
                        return;
                    }
                };
                while let Ok(job) = received.recv() {
                    job(&mut conn);
                }
            })
            .map_err(|err| Error::store("starting a SQLite connection thread", err, true))?;
        match opened.await.map_err(|_| thread_gone())? {
            Ok(true) => Ok(Some(Conn { jobs })),
            Ok(false) => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// Runs `work` on the connection's thread, after the work sent before it; returns
    /// its result.
    pub async fn run<R: Send + 'static>(
        &self,
        work: impl FnOnce(&mut Connection) -> Result<R> + Send + 'static,
    ) -> Result<R> {
        let (answer, answered) = oneshot::channel();
        let job: Job = Box::new(move |conn| {
            let _ = answer.send(work(conn));
        });
        self.jobs.send(job).map_err(|_| thread_gone())?;
        answered.await.map_err(|_| thread_gone())?
    }
}

/// The connection's thread ended without answering: a panic in SQLite work.
fn thread_gone() -> Error {
    Error::store(
        "SQLite connection thread",
        "ended unexpectedly (a panic)",
        false,
    )
}

/// How long a statement waits for another connection's write lock before failing with
/// SQLITE_BUSY. Long enough to outlast a peer's commit (one fsync) or a zombie's store
/// phase of a normal-sized transaction; short enough that a stuck peer surfaces as an
/// error an operator sees.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Prepared statements kept per connection: a few per binding plus the load chunks.
const STATEMENT_CACHE: usize = 256;

/// A store error from SQLite; busy and locked databases are worth a retry.
pub fn store_error(context: impl Into<String>, err: rusqlite::Error) -> Error {
    let retryable = matches!(
        err.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    );
    Error::store(context, err, retryable)
}

/// Opens (creating if missing, with its parent directories) the database at `path` in
/// WAL mode with `synchronous=FULL`: a COMMIT returns only after the WAL is fsynced,
/// which is what makes a committed checkpoint durable. Blocks: [`Conn::open`] runs it
/// on the connection's thread.
/// SQLite's page cache per connection. Its default (2 MiB) holds little of a table of a
/// few hundred thousand rows, so each upsert's B-tree descent read pages back from the
/// OS (a `read` per page: 58% of `sluice bench http`'s profile was the store thread,
/// mostly in those reads); 64 MiB keeps the hot part of such a table cached. The WAL is
/// checkpointed every 8 000 pages (32 MiB at 4 KiB) rather than SQLite's 1 000: a
/// checkpoint runs inside the COMMIT that crosses the mark, and rarer ones write a page
/// that many transactions rewrote once (with both, the bench's batches went from 49k
/// to 64k–72k docs/s on 2 cores).
const PAGE_CACHE_BYTES: usize = 64 << 20;

fn connect(path: &Path) -> Result<Connection> {
    let at = |what: &str| format!("{what} SQLite database {}", path.display());
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|err| {
            Error::store(
                format!("creating directory {}", parent.display()),
                err,
                false,
            )
        })?;
    }
    let conn = Connection::open(path).map_err(|err| store_error(at("opening"), err))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|err| store_error(at("configuring"), err))?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .map_err(|err| store_error(at("enabling WAL on"), err))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::store(
            at("enabling WAL on"),
            format!("journal mode is {mode}"),
            false,
        ));
    }
    conn.execute_batch(&format!(
        "PRAGMA synchronous = FULL; PRAGMA cache_size = -{}; PRAGMA wal_autocheckpoint = 8000",
        PAGE_CACHE_BYTES / 1024
    ))
    .map_err(|err| store_error(at("configuring"), err))?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(conn)
}

/// Opens the database at `path` read-only, or `None` if it does not exist (dry runs
/// must not create it). Blocks: [`Conn::open_read_only`] runs it on the connection's
/// thread.
fn connect_read_only(path: &Path) -> Result<Option<Connection>> {
    if !path.exists() {
        return Ok(None);
    }
    Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map(Some)
        .map_err(|err| store_error(format!("opening SQLite database {}", path.display()), err))
}

/// One connection to the database file, as the catalog and fencing calls use it.
pub struct Lite<'a>(pub &'a Conn);

/// A statement parameter, owned, for the connection's thread.
enum Owned {
    Text(String),
    Int(i64),
    Bytes(Vec<u8>),
}

fn owned(params: &[Param<'_>]) -> Vec<Owned> {
    params
        .iter()
        .map(|param| match *param {
            Param::Text(text) => Owned::Text(text.to_string()),
            Param::Int(int) => Owned::Int(int),
            Param::Bytes(bytes) => Owned::Bytes(bytes.to_vec()),
        })
        .collect()
}

/// `params` as rusqlite binds them.
fn lite_params(params: &[Owned]) -> impl Iterator<Item = ToSqlOutput<'_>> {
    params.iter().map(|param| match param {
        Owned::Text(text) => ToSqlOutput::Borrowed(ValueRef::Text(text.as_bytes())),
        Owned::Int(int) => ToSqlOutput::Owned(SqlValue::Integer(*int)),
        Owned::Bytes(bytes) => ToSqlOutput::Borrowed(ValueRef::Blob(bytes)),
    })
}

impl Lite<'_> {
    /// The first column of the first row of `sql`, if any (`None` also for NULL).
    async fn query_value<T: rusqlite::types::FromSql + Send + 'static>(
        &self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Option<T>> {
        let (sql, params) = (sql.to_string(), owned(params));
        self.0
            .run(move |conn| {
                let mut stmt = conn
                    .prepare_cached(&sql)
                    .map_err(|err| store_error(&sql, err))?;
                stmt.query_row(rusqlite::params_from_iter(lite_params(&params)), |row| {
                    row.get::<_, Option<T>>(0)
                })
                .optional()
                .map(Option::flatten)
                .map_err(|err| store_error(&sql, err))
            })
            .await
    }
}

#[async_trait]
impl Catalog for Lite<'_> {
    async fn existing_columns(&mut self, table: &str) -> Result<Vec<String>> {
        let table = table.to_string();
        self.0
            .run(move |conn| {
                let context = || format!("reading the columns of table {table:?}");
                let mut stmt = conn
                    .prepare_cached("SELECT name FROM pragma_table_info(?1)")
                    .map_err(|err| store_error(context(), err))?;
                stmt.query_map([&table], |row| row.get(0))
                    .and_then(|rows| rows.collect())
                    .map_err(|err| store_error(context(), err))
            })
            .await
    }

    /// In one transaction.
    async fn execute(&mut self, statements: &[String]) -> Result<()> {
        let statements = statements.to_vec();
        self.0
            .run(move |conn| {
                let tx = conn
                    .transaction()
                    .map_err(|err| store_error("beginning apply", err))?;
                for statement in &statements {
                    tx.execute_batch(statement)
                        .map_err(|err| store_error(format!("applying `{statement}`"), err))?;
                }
                tx.commit()
                    .map_err(|err| store_error("committing apply", err))
            })
            .await
    }
}

#[async_trait]
impl FenceClient for Lite<'_> {
    async fn execute(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64> {
        let (sql, params) = (sql.to_string(), owned(params));
        self.0
            .run(move |conn| {
                let mut stmt = conn
                    .prepare_cached(&sql)
                    .map_err(|err| store_error(&sql, err))?;
                let changed = stmt
                    .execute(rusqlite::params_from_iter(lite_params(&params)))
                    .map_err(|err| store_error(&sql, err))?;
                Ok(changed as u64)
            })
            .await
    }

    async fn query_bytes(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Option<Vec<u8>>> {
        self.query_value(sql, params).await
    }

    async fn query_int(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Option<i64>> {
        self.query_value(sql, params).await
    }

    /// IMMEDIATE takes the write lock now, so claims (and stores) of other connections
    /// wait for this one; the checkpoints table is created if missing, inside it.
    async fn begin_claim(&mut self, _materialization: &str) -> Result<()> {
        self.0
            .run(|conn| {
                let begun = conn.execute_batch("BEGIN IMMEDIATE").and_then(|()| {
                    conn.execute_batch(sql::CREATE_CHECKPOINTS)
                        .inspect_err(|_| {
                            let _ = conn.execute_batch("ROLLBACK");
                        })
                });
                begun.map_err(|err| store_error("beginning a claim", err))
            })
            .await
    }

    async fn end_claim(&mut self, _materialization: &str, commit: bool) -> Result<()> {
        // Durable when COMMIT returns: synchronous=FULL fsyncs the WAL first.
        let end = if commit { "COMMIT" } else { "ROLLBACK" };
        self.0
            .run(move |conn| conn.execute_batch(end).map_err(|err| store_error(end, err)))
            .await
    }

    /// Durable when this returns: synchronous=FULL fsyncs the WAL before COMMIT completes.
    async fn commit(&mut self) -> Result<()> {
        self.0
            .run(|conn| {
                conn.execute_batch("COMMIT")
                    .map_err(|err| store_error("committing a store transaction", err))
            })
            .await
    }
}
