//! Talking to the server: connections, error classification, and [`Pg`], the catalog
//! Apply reads and the client calls the fencing protocol ([`sluice_sqlkit::fence`])
//! runs.
//!
//! Claims of one materialization run one at a time under a transaction-scoped advisory
//! lock ([`crate::sql::CLAIM_LOCK`]): two overlapping Opens bumping fences row by row in
//! different orders could otherwise deadlock. Each statement of a claim is a new
//! snapshot (READ COMMITTED), so the checkpoint read after the fence includes the
//! zombie commit the fence waited for.
//!
//! Errors: a lost connection, a server shutting down, a serialization failure or a
//! deadlock are retryable (the runtime reopens with backoff, and the transaction in
//! progress was rolled back by the server); constraint violations and bad data are
//! not. Errors name the server without its password ([`EndpointConfig::describe`]).
//!
//! Connecting ([`sluice_sqlkit::connect`]): a host that cannot be reached, or answers
//! nothing within `connect_timeout`, is retryable; what retrying cannot change is not: a
//! login the server refuses, a certificate that does not verify, a server without TLS
//! under `sslmode=require` or stronger. The TLS errors name the options
//! ([`Tls::describe`]).

use crate::config::{Connection, EndpointConfig};
use crate::sql;
use crate::tls::Tls;
use async_trait::async_trait;
use sluice_driver_sdk::{Error, Result};
use sluice_sqlkit::apply::Catalog;
use sluice_sqlkit::connect::{self, tls_error, tls_refused, unreachable};
use sluice_sqlkit::fence::{FenceClient, Param};
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;

/// A store error from PostgreSQL, retryable when reconnecting may help.
pub fn pg_error(context: impl Into<String>, err: tokio_postgres::Error) -> Error {
    let io = std::error::Error::source(&err).is_some_and(|s| s.is::<std::io::Error>());
    let transient_code = err.code().is_some_and(|code| {
        code.code().starts_with("08")
            || [
                SqlState::T_R_SERIALIZATION_FAILURE,
                SqlState::T_R_DEADLOCK_DETECTED,
                SqlState::ADMIN_SHUTDOWN,
                SqlState::CRASH_SHUTDOWN,
                SqlState::CANNOT_CONNECT_NOW,
                SqlState::TOO_MANY_CONNECTIONS,
            ]
            .contains(code)
    });
    let retryable = err.is_closed() || io || transient_code;
    let message = match err.as_db_error() {
        Some(db) => {
            let mut message = db.message().to_owned();
            if let Some(detail) = db.detail() {
                message.push_str(&format!(" ({detail})"));
            }
            message
        }
        None if retryable => format!("the connection was lost ({err}); retrying may succeed"),
        None => err.to_string(),
    };
    Error::store(context, message, retryable)
}

/// Connects to the endpoint's server, over TLS as its `sslmode` says, within its
/// `connect_timeout`. The connection runs on a spawned task that ends when the returned
/// client is dropped or the server goes away; in-flight and later calls then fail with
/// a retryable error.
pub async fn connect(endpoint: &EndpointConfig) -> Result<Client> {
    let server = endpoint.describe();
    let Connection {
        client: mut config,
        tls,
        connect_timeout,
    } = endpoint.connection()?;
    let context = format!("connecting to {server}");
    // As libpq, `connect_timeout` bounds each host's attempt.
    let hosts = u32::try_from(config.get_hosts().len().max(1)).unwrap_or(u32::MAX);
    let attempts = async {
        let connector = tls.connector().await?;
        let (first, if_refused) = tls.attempts();
        let connected = config.ssl_mode(first).connect(connector.clone()).await;
        let connected = match (connected, if_refused) {
            // `allow`: the server refused the plain attempt, perhaps for want of TLS.
            (Err(err), Some(retry)) if err.as_db_error().is_some() => {
                tracing::debug!(%server, %err, "retrying with TLS (sslmode=allow)");
                config.ssl_mode(retry).connect(connector).await
            }
            (connected, _) => connected,
        };
        connected.map_err(|err| connect_error(&context, &tls, err))
    };
    let (client, connection) =
        connect::within_connect_timeout(&context, connect_timeout, hosts, attempts).await?;
    tokio::spawn(async move {
        if let Err(err) = connection.await {
            tracing::warn!(%server, %err, "PostgreSQL connection ended");
        }
    });
    Ok(client)
}

/// The error of a failed connection attempt: the server's own refusals as
/// [`pg_error`] classifies them, TLS failures naming the options (not retryable), and
/// every other failure to reach the server retryable.
fn connect_error(context: &str, tls: &Tls, err: tokio_postgres::Error) -> Error {
    if err.as_db_error().is_some() {
        return pg_error(context, err);
    }
    if let Some(err) = tls_error(context, &tls.describe(), &err) {
        return err;
    }
    // tokio-postgres says so in words only, in the error's source.
    let source = std::error::Error::source(&err).map(ToString::to_string);
    if source.as_deref() == Some("server does not support TLS") {
        return tls_refused(context, &tls.describe(), "is ssl off?");
    }
    // The cause (connection refused, a name that does not resolve) is in the sources.
    let mut message = err.to_string();
    let mut cause = std::error::Error::source(&err);
    while let Some(why) = cause {
        message.push_str(&format!(": {why}"));
        cause = why.source();
    }
    unreachable(context, message)
}

/// One connection working in the endpoint's schema.
pub struct Pg<'a> {
    pub client: &'a Client,
    pub schema: &'a str,
    /// The server, without password, for error contexts.
    pub server: &'a str,
}

/// `params` as tokio-postgres binds them.
fn pg_params<'a>(params: &'a [Param<'_>]) -> Vec<&'a (dyn ToSql + Sync)> {
    (params.iter())
        .map(|param| match param {
            Param::Text(text) => text as &(dyn ToSql + Sync),
            Param::Int(int) => int,
            Param::Bytes(bytes) => bytes,
        })
        .collect()
}

#[async_trait]
impl Catalog for Pg<'_> {
    async fn existing_columns(&mut self, table: &str) -> Result<Vec<String>> {
        let schema = self.schema;
        let rows = (self.client)
            .query(
                "SELECT column_name::text FROM information_schema.columns \
                 WHERE table_schema = $1 AND table_name = $2 ORDER BY ordinal_position",
                &[&schema, &table],
            )
            .await
            .map_err(|err| pg_error(format!("reading the columns of {schema:?}.{table:?}"), err))?;
        Ok(rows.iter().map(|row| row.get(0)).collect())
    }

    async fn schema_exists(&mut self) -> Result<bool> {
        let schema = self.schema;
        let row = (self.client)
            .query_one(
                "SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)",
                &[&schema],
            )
            .await
            .map_err(|err| pg_error(format!("looking up schema {schema:?}"), err))?;
        Ok(row.get(0))
    }

    async fn schema_holds_others(&mut self, ours: &[&str]) -> Result<bool> {
        let schema = self.schema;
        let ours: Vec<&str> = ours.to_vec();
        let row = (self.client)
            .query_one(
                "SELECT EXISTS (SELECT FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
                   WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f', 'c') \
                   AND NOT c.relname = ANY ($2)) \
                 OR EXISTS (SELECT FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace \
                   WHERE n.nspname = $1) \
                 OR EXISTS (SELECT FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace \
                   WHERE n.nspname = $1 AND t.typtype IN ('b', 'd', 'e', 'r', 'm') AND t.typcategory <> 'A')",
                &[&schema, &ours],
            )
            .await
            .map_err(|err| pg_error(format!("looking into schema {schema:?}"), err))?;
        Ok(row.get(0))
    }

    /// In one transaction: PostgreSQL's DDL is transactional, so a failed apply leaves
    /// nothing half-done.
    async fn execute(&mut self, statements: &[String]) -> Result<()> {
        let server = self.server;
        (self.client)
            .batch_execute("BEGIN")
            .await
            .map_err(|err| pg_error(format!("beginning apply on {server}"), err))?;
        for statement in statements {
            if let Err(err) = self.client.batch_execute(statement).await {
                if let Err(rollback) = self.client.batch_execute("ROLLBACK").await {
                    tracing::debug!(%rollback, "rolling back a failed apply");
                }
                return Err(pg_error(format!("applying `{statement}`"), err));
            }
        }
        (self.client)
            .batch_execute("COMMIT")
            .await
            .map_err(|err| pg_error(format!("committing apply on {server}"), err))
    }
}

#[async_trait]
impl FenceClient for Pg<'_> {
    async fn execute(&mut self, sql: &str, params: &[Param<'_>]) -> Result<u64> {
        (self.client.execute(sql, &pg_params(params)).await).map_err(|err| pg_error(sql, err))
    }

    async fn query_bytes(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Option<Vec<u8>>> {
        let row = (self.client.query_opt(sql, &pg_params(params)).await)
            .map_err(|err| pg_error(sql, err))?;
        Ok(row.map(|row| row.get(0)))
    }

    async fn query_int(&mut self, sql: &str, params: &[Param<'_>]) -> Result<Option<i64>> {
        let row = (self.client.query_opt(sql, &pg_params(params)).await)
            .map_err(|err| pg_error(sql, err))?;
        Ok(row.map(|row| row.get(0)))
    }

    async fn begin_claim(&mut self, materialization: &str) -> Result<()> {
        let err = |err| pg_error("beginning a claim", err);
        self.client.batch_execute("BEGIN").await.map_err(err)?;
        (self
            .client
            .execute(sql::CLAIM_LOCK, &[&materialization])
            .await)
            .map_err(err)?;
        Ok(())
    }

    async fn end_claim(&mut self, _materialization: &str, commit: bool) -> Result<()> {
        // Durable when COMMIT returns: the server has flushed the commit to its WAL.
        // The advisory lock ends with the transaction.
        let end = if commit { "COMMIT" } else { "ROLLBACK" };
        (self.client.batch_execute(end).await).map_err(|err| pg_error(end, err))
    }

    /// Durable when this returns: the server flushed the commit record to its WAL.
    async fn commit(&mut self) -> Result<()> {
        (self.client.batch_execute("COMMIT").await)
            .map_err(|err| pg_error(format!("committing a transaction on {}", self.server), err))
    }
}
