//! Talking to SQLite: opening the database file, error classification, and [`Lite`],
//! the catalog Apply reads and the client calls the fencing protocol
//! ([`sluice_sqlkit::fence`]) runs.
//!
//! Threads: rusqlite blocks, so every call here runs on the calling worker thread
//! under [`blocking`] ([`tokio::task::block_in_place`] on multi-threaded runtimes): the
//! connection stays owned by its transactor and no data is copied to another thread.
//!
//! Claims are serialized by SQLite itself: `BEGIN IMMEDIATE` takes the database's write
//! lock, which a concurrent claim or store waits for (up to the busy timeout, 30 s).

use crate::sql::{self, CHECKPOINTS_TABLE};
use async_trait::async_trait;
use rusqlite::types::{ToSqlOutput, Value as SqlValue, ValueRef};
use rusqlite::{Connection, OpenFlags, OptionalExtension};
use sluice_driver_sdk::{Error, Result};
use sluice_sqlkit::apply::Catalog;
use sluice_sqlkit::fence::{FenceClient, Param};
use std::path::Path;
use std::time::Duration;

/// Runs blocking SQLite work without stalling the runtime's other tasks.
pub fn blocking<R>(work: impl FnOnce() -> R) -> R {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(work),
        _ => work(),
    }
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
/// which is what makes a committed checkpoint durable.
pub fn connect(path: &Path) -> Result<Connection> {
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
    conn.execute_batch("PRAGMA synchronous = FULL")
        .map_err(|err| store_error(at("configuring"), err))?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(conn)
}

/// Opens the database at `path` read-only, or `None` if it does not exist (dry runs
/// must not create it).
pub fn connect_read_only(path: &Path) -> Result<Option<Connection>> {
    if !path.exists() {
        return Ok(None);
    }
    Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map(Some)
        .map_err(|err| store_error(format!("opening SQLite database {}", path.display()), err))
}

/// One connection to the database file.
pub struct Lite<'a>(pub &'a mut Connection);

/// `params` as rusqlite binds them.
fn lite_params<'a>(params: &'a [Param<'_>]) -> impl Iterator<Item = ToSqlOutput<'a>> {
    params.iter().map(|param| match *param {
        Param::Text(text) => ToSqlOutput::Borrowed(ValueRef::Text(text.as_bytes())),
        Param::Int(int) => ToSqlOutput::Owned(SqlValue::Integer(int)),
        Param::Bytes(bytes) => ToSqlOutput::Borrowed(ValueRef::Blob(bytes)),
    })
}

impl Lite<'_> {
    /// The first column of the first row of `sql`, if any (`None` also for NULL).
    fn query_value<T: rusqlite::types::FromSql>(
        &self,
        sql: &str,
        params: &[Param<'_>],
    ) -> Result<Option<T>> {
        blocking(|| {
            let mut stmt = self.0.prepare_cached(sql)?;
            stmt.query_row(rusqlite::params_from_iter(lite_params(params)), |row| {
                row.get::<_, Option<T>>(0)
            })
            .optional()
        })
        .map(Option::flatten)
        .map_err(|err| store_error(sql, err))
    }
}

#[async_trait]
impl Catalog for Lite<'_> {
    async fn existing_columns(&mut self, table: &str) -> Result<Vec<String>> {
        let context = || format!("reading the columns of table {table:?}");
        blocking(|| {
            let mut stmt = (self.0)
                .prepare_cached("SELECT name FROM pragma_table_info(?1)")
                .map_err(|err| store_error(context(), err))?;
            stmt.query_map([table], |row| row.get(0))
                .and_then(|rows| rows.collect())
                .map_err(|err| store_error(context(), err))
        })
    }

    async fn checkpoint_rows(&mut self, materialization: &str) -> Result<u64> {
        let sql = format!(
            "SELECT count(*) FROM {} WHERE \"materialization\" = ?1",
            sql::quote_ident(CHECKPOINTS_TABLE)
        );
        let rows: Option<i64> = self.query_value(&sql, &[Param::Text(materialization)])?;
        Ok(rows.and_then(|n| u64::try_from(n).ok()).unwrap_or_default())
    }

    /// In one transaction.
    async fn execute(&mut self, statements: &[String]) -> Result<()> {
        blocking(|| {
            let tx = (self.0)
                .transaction()
                .map_err(|err| store_error("beginning apply", err))?;
            for statement in statements {
                tx.execute_batch(statement)
                    .map_err(|err| store_error(format!("applying `{statement}`"), err))?;
            }
            tx.commit()
                .map_err(|err| store_error("committing apply", err))
        })
    }
}

#[async_trait]
impl FenceClient for Lite<'_> {
    async fn execute(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64> {
        let changed = blocking(|| {
            let mut stmt = self.0.prepare_cached(sql)?;
            stmt.execute(rusqlite::params_from_iter(lite_params(params)))
        })
        .map_err(|err| store_error(sql, err))?;
        Ok(changed as u64)
    }

    async fn query_bytes(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Option<Vec<u8>>> {
        self.query_value(sql, params)
    }

    async fn query_int(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Option<i64>> {
        self.query_value(sql, params)
    }

    /// IMMEDIATE takes the write lock now, so claims (and stores) of other connections
    /// wait for this one; the checkpoints table is created if missing, inside it.
    async fn begin_claim(&mut self, _materialization: &str) -> Result<()> {
        blocking(|| {
            (self.0).execute_batch("BEGIN IMMEDIATE")?;
            if let Err(err) = self.0.execute_batch(sql::CREATE_CHECKPOINTS) {
                let _ = self.0.execute_batch("ROLLBACK");
                return Err(err);
            }
            Ok(())
        })
        .map_err(|err| store_error("beginning a claim", err))
    }

    async fn end_claim(&mut self, _materialization: &str, commit: bool) -> Result<()> {
        // Durable when COMMIT returns: synchronous=FULL fsyncs the WAL first.
        let end = if commit { "COMMIT" } else { "ROLLBACK" };
        blocking(|| self.0.execute_batch(end)).map_err(|err| store_error(end, err))
    }
}
