//! Talking to the server: connections, error classification, the catalog, bulk loads,
//! and the client calls of fencing.
//!
//! [`My`] is the catalog Apply reads and the client calls the fencing protocol
//! ([`sluice_sqlkit::fence`]) runs. Claims of one materialization run one at a time
//! under a named lock ([`crate::sql::CLAIM_LOCK`]): two overlapping Opens bumping
//! fences row by row in different orders could otherwise deadlock. The checkpoints
//! table is created (if missing) before a claim, outside its transaction: DDL commits
//! implicitly.
//! Connections set `CLIENT_FOUND_ROWS`, so the commit's fenced UPDATE counts the row it
//! matched even when the checkpoint it writes equals the stored one.
//!
//! Session settings (every connection): `utf8mb4`, `sql_mode` strict and without
//! `NO_BACKSLASH_ESCAPES` (literals in [`crate::sql`] rely on it), UTC, and a client
//! packet limit of 1 GiB so documents larger than the server's `max_allowed_packet` can
//! be read back.
//!
//! Errors: a lost connection, a server shutting down, a deadlock or a lock wait timeout
//! are retryable (the runtime reopens with backoff; the server rolled back the
//! transaction in progress); constraint violations and bad data are not. Errors name the
//! server without its password ([`EndpointConfig::describe`]).
//!
//! Connecting ([`sluice_sqlkit::connect`]): a host that cannot be reached, or answers
//! nothing within `connect_timeout`, is retryable; what retrying cannot change is not: a
//! login the server refuses, a certificate that does not verify, a server without TLS
//! under `ssl-mode=REQUIRED` or stronger. The TLS errors name the options
//! ([`Tls::describe`]).

use crate::config::{Connection, EndpointConfig};
use crate::sql::{self, Flavor};
use crate::tls::Tls;
use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, DriverError, IoError, OptsBuilder, Params};
use sluice_driver_sdk::{Error, Result};
use sluice_sqlkit::apply::Catalog;
use sluice_sqlkit::connect::{self, tls_error, tls_refused, unreachable};
use sluice_sqlkit::fence::{FenceClient, Param};

/// Server error codes after which reconnecting and retrying may succeed.
const RETRYABLE_CODES: &[u16] = &[
    1040, // ER_CON_COUNT_ERROR: too many connections
    1053, // ER_SERVER_SHUTDOWN
    1205, // ER_LOCK_WAIT_TIMEOUT
    1213, // ER_LOCK_DEADLOCK
    1317, // ER_QUERY_INTERRUPTED
    1927, // ER_CONNECTION_KILLED (MariaDB)
    2006, // CR_SERVER_GONE_ERROR
    2013, // CR_SERVER_LOST
];

/// Bytes of `LOAD DATA` input per protocol packet: the server reads each packet whole,
/// so one must stay under its `max_allowed_packet` (at least 1 MiB on any server).
const INFILE_CHUNK: usize = 1 << 20;

/// A store error from the server or the client library, retryable when reconnecting
/// may help.
pub fn my_error(context: impl Into<String>, err: mysql_async::Error) -> Error {
    match &err {
        mysql_async::Error::Server(server) => Error::store(
            context,
            format!("{} (error {})", server.message, server.code),
            RETRYABLE_CODES.contains(&server.code),
        ),
        mysql_async::Error::Io(_) | mysql_async::Error::Driver(_) => Error::store(
            context,
            format!("the connection was lost ({err}); retrying may succeed"),
            true,
        ),
        _ => Error::store(context, err, false),
    }
}

/// Connects to the endpoint's server, over TLS as its `ssl-mode` says, and sets up the
/// session (see the module docs), all within its `connect_timeout`. Returns the
/// connection and the server's flavor.
pub async fn connect(endpoint: &EndpointConfig) -> Result<(Conn, Flavor)> {
    let server = endpoint.describe();
    let Connection {
        client: opts,
        tls,
        connect_timeout,
    } = endpoint.connection()?;
    let context = format!("connecting to {server}");
    let prefer_socket = opts.prefer_socket() && !tls.required();
    let opts = OptsBuilder::from_opts(opts)
        .client_found_rows(true)
        .max_allowed_packet(Some(1 << 30))
        .init(vec![
            "SET NAMES utf8mb4",
            "SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION'",
            "SET SESSION time_zone = '+00:00'",
        ]);
    let attempt = async {
        let ssl_opts = tls.ssl_opts().await?;
        let secure = (opts.clone().ssl_opts(ssl_opts)).prefer_socket(prefer_socket);
        let conn = match Conn::new(secure).await {
            Err(mysql_async::Error::Driver(DriverError::NoClientSslFlagFromServer))
                if tls.falls_back_to_plain() =>
            {
                Conn::new(opts).await
            }
            conn => conn,
        };
        let mut conn = conn.map_err(|err| connect_error(&context, &tls, err))?;
        let version: Option<String> = conn
            .query_first("SELECT VERSION()")
            .await
            .map_err(|err| my_error(format!("reading the version of {server}"), err))?;
        Ok((conn, Flavor::of_version(&version.unwrap_or_default())))
    };
    connect::within_connect_timeout(&context, connect_timeout, 1, attempt).await
}

/// The error of a failed connection attempt: the server's own refusals as
/// [`my_error`] classifies them, TLS failures naming the options (not retryable), and
/// every other failure to reach the server retryable.
fn connect_error(context: &str, tls: &Tls, err: mysql_async::Error) -> Error {
    if let mysql_async::Error::Server(_) = err {
        return my_error(context, err);
    }
    if let Some(err) = tls_error(context, &tls.describe(), &err) {
        return err;
    }
    if let mysql_async::Error::Io(IoError::Tls(setup)) = &err {
        return Error::store(
            context,
            format!("{}: setting up TLS: {setup}", tls.describe()),
            false,
        );
    }
    if let mysql_async::Error::Driver(DriverError::NoClientSslFlagFromServer) = err {
        return tls_refused(context, &tls.describe(), "have_ssl is DISABLED?");
    }
    // The client's I/O error wraps the system's twice ("Input/output error: Input/output
    // error: Connection refused"): the system's says it all.
    let cause = match &err {
        mysql_async::Error::Io(IoError::Io(io)) => io.to_string(),
        _ => err.to_string(),
    };
    unreachable(context, cause)
}

/// Runs `statement` (a [`crate::sql::Table::load_data_sql`]) with `rows` as its input
/// and fails if the server reported any warning: `LOAD DATA LOCAL` turns duplicate
/// keys and conversion errors into warnings, and each of them is a lost guarantee.
pub async fn load_data(conn: &mut Conn, statement: &str, rows: Vec<u8>) -> Result<()> {
    let rows = Bytes::from(rows);
    let chunks: Vec<Bytes> = (0..rows.len())
        .step_by(INFILE_CHUNK)
        .map(|at| rows.slice(at..rows.len().min(at + INFILE_CHUNK)))
        .collect();
    conn.set_infile_handler(async move { Ok(futures::stream::iter(chunks).map(Ok).boxed()) });
    conn.query_drop(statement)
        .await
        .map_err(|err| my_error("loading rows", err))?;
    // Read before SHOW WARNINGS, whose own count (0) replaces it.
    let count = conn.get_warnings();
    if count == 0 {
        return Ok(());
    }
    let warnings: Vec<(String, u16, String)> = conn
        .query("SHOW WARNINGS LIMIT 3")
        .await
        .map_err(|err| my_error("reading the warnings of loading rows", err))?;
    let shown: Vec<String> = (warnings.iter())
        .map(|(level, code, message)| format!("{level} {code}: {message}"))
        .collect();
    Err(Error::store(
        "loading rows",
        format!(
            "the server reported {count} warning(s), e.g. {}; the transaction is rolled back",
            shown.join("; ")
        ),
        false,
    ))
}

/// One connection, working in the endpoint's database.
pub struct My<'a> {
    pub conn: &'a mut Conn,
    pub flavor: Flavor,
    /// The server, without password, for error contexts.
    pub server: &'a str,
}

/// `params` as mysql_async binds them.
fn my_params(params: &[Param<'_>]) -> Params {
    Params::Positional(
        (params.iter())
            .map(|param| match *param {
                Param::Text(text) => mysql_async::Value::from(text),
                Param::Int(int) => mysql_async::Value::Int(int),
                Param::Bytes(bytes) => mysql_async::Value::Bytes(bytes.to_vec()),
            })
            .collect(),
    )
}

#[async_trait]
impl Catalog for My<'_> {
    async fn existing_columns(&mut self, table: &str) -> Result<Vec<String>> {
        (self.conn)
            .exec(
                "SELECT COLUMN_NAME FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
                (table,),
            )
            .await
            .map_err(|err| my_error(format!("reading the columns of table {table:?}"), err))
    }

    /// Statement by statement: DDL is not transactional in MariaDB or MySQL (each
    /// statement commits on its own), but every statement is idempotent, so an apply
    /// that failed half-way is finished by running it again.
    async fn execute(&mut self, statements: &[String]) -> Result<()> {
        for statement in statements {
            (self.conn.query_drop(statement).await)
                .map_err(|err| my_error(format!("applying `{statement}`"), err))?;
        }
        Ok(())
    }
}

#[async_trait]
impl FenceClient for My<'_> {
    async fn execute(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64> {
        (self.conn.exec_drop(sql, my_params(params)).await).map_err(|err| my_error(sql, err))?;
        Ok(self.conn.affected_rows())
    }

    async fn query_bytes(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Option<Vec<u8>>> {
        let value: Option<Option<Vec<u8>>> = (self.conn.exec_first(sql, my_params(params)).await)
            .map_err(|err| my_error(sql, err))?;
        Ok(value.flatten())
    }

    async fn query_int(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Option<i64>> {
        let value: Option<Option<i64>> = (self.conn.exec_first(sql, my_params(params)).await)
            .map_err(|err| my_error(sql, err))?;
        Ok(value.flatten())
    }

    /// Creates the checkpoints table if missing (DDL commits implicitly, so before the
    /// transaction), takes the claim lock, and starts the transaction.
    async fn begin_claim(&mut self, materialization: &str) -> Result<()> {
        let err = |err| my_error("beginning a claim", err);
        let create = sql::create_checkpoints_sql(self.flavor);
        self.conn.query_drop(create).await.map_err(err)?;
        let locked: Option<Option<i64>> = (self.conn)
            .exec_first(sql::CLAIM_LOCK, (materialization,))
            .await
            .map_err(err)?;
        if locked.flatten() != Some(1) {
            return Err(Error::store(
                "beginning a claim",
                "another Open of this materialization held its claim lock for 60 s",
                true,
            ));
        }
        if let Err(begin) = self.conn.query_drop("START TRANSACTION").await {
            self.end_claim(materialization, false).await?;
            return Err(err(begin));
        }
        Ok(())
    }

    async fn end_claim(&mut self, materialization: &str, commit: bool) -> Result<()> {
        let ended = if commit {
            // Durable when this returns (InnoDB flushes its redo log at COMMIT with the
            // default innodb_flush_log_at_trx_commit = 1).
            self.conn.query_drop("COMMIT").await
        } else {
            // Best effort: the server rolls back when the connection ends anyway.
            let _ = self.conn.query_drop("ROLLBACK").await;
            Ok(())
        };
        let released = (self.conn)
            .exec_drop(sql::CLAIM_UNLOCK, (materialization,))
            .await;
        ended
            .and(released)
            .map_err(|err| my_error("ending a claim", err))
    }

    /// Durable when this returns: InnoDB flushed the commit to its redo log.
    async fn commit(&mut self) -> Result<()> {
        (self.conn.query_drop("COMMIT").await)
            .map_err(|err| my_error(format!("committing a transaction on {}", self.server), err))
    }
}
