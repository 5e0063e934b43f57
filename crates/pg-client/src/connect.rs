//! Connecting to the server, and which of its errors a retry may mend.
//!
//! Errors: a lost connection, a server shutting down, a serialization failure or a
//! deadlock are retryable (the caller reconnects with backoff, and the transaction in
//! progress was rolled back by the server); constraint violations and bad data are
//! not ([`pg_error`]). Errors name the server without its password
//! ([`EndpointConfig::describe`]).
//!
//! Connecting ([`sluice_sqlkit::connect`]): a host that cannot be reached, or answers
//! nothing within `connect_timeout`, is retryable; what retrying cannot change is not: a
//! login the server refuses, a certificate that does not verify, a server without TLS
//! under `sslmode=require` or stronger. The TLS errors name the options
//! ([`Tls::describe`]).

use crate::config::{Connection, EndpointConfig};
use crate::tls::Tls;
use sluice_driver_sdk::{Error, Result};
use sluice_sqlkit::connect::{self, tls_error, tls_refused, unreachable};
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

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
