//! Connecting to a SQL server, whatever the client library: one bound on the whole
//! attempt, and errors that say whether retrying can help.
//!
//! A host that cannot be reached, or answers nothing within `connect_timeout`, is
//! retryable; what retrying cannot change is not: a certificate that does not verify,
//! a server without TLS under a mode that requires it. TLS errors name the options
//! (`sslmode=verify-full sslrootcert=/ca.pem`), so the user knows which to change.

use crate::tls::handshake_failure;
use sluice_driver_sdk::{Error, Result};
use std::time::Duration;

/// Runs the connection `attempt` within `connect_timeout` per host of `hosts` (as
/// libpq bounds each host's attempt); running out is a retryable error of `context`.
pub async fn within_connect_timeout<T>(
    context: &str,
    connect_timeout: Duration,
    hosts: u32,
    attempt: impl Future<Output = Result<T>>,
) -> Result<T> {
    tokio::time::timeout(connect_timeout * hosts.max(1), attempt)
        .await
        .map_err(|_| {
            Error::store(
                context,
                format!(
                    "no answer within connect_timeout={}s; retrying may succeed",
                    connect_timeout.as_secs()
                ),
                true,
            )
        })?
}

/// The error of a TLS handshake that failed (`err` or one of its sources is a rustls
/// error), naming the options `tls` ([`crate::tls::describe`]); not retryable.
pub fn tls_error(
    context: &str,
    tls: &str,
    err: &(dyn std::error::Error + 'static),
) -> Option<Error> {
    handshake_failure(err).map(|why| Error::store(context, format!("{tls}: {why}"), false))
}

/// The error of a server that does not speak TLS to an endpoint whose options `tls`
/// require it; `hint` says which server setting to look at. Not retryable.
pub fn tls_refused(context: &str, tls: &str, hint: &str) -> Error {
    Error::store(
        context,
        format!("{tls}: the server does not accept TLS connections ({hint})"),
        false,
    )
}

/// The error of a server that could not be reached for `cause`: retryable.
pub fn unreachable(context: &str, cause: impl std::fmt::Display) -> Error {
    Error::store(context, format!("{cause}; retrying may succeed"), true)
}
