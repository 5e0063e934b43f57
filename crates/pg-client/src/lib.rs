//! The PostgreSQL connection that the PostgreSQL driver (`sluice-postgres`) and the
//! output SDK's shared view (each key's last document, the checkpoint and the fence,
//! kept in PostgreSQL so an output can move between cluster members) share, in one
//! home both depend on: an SDK must not depend on a connector.
//!
//! ```text
//!  {url, schema} ── EndpointConfig::parse ── connection() ──────── connect ──▶ Client
//!                   strict; describe()       libpq's URL options:   TLS attempts, each
//!                   drops the password       sslmode, sslrootcert,  host within
//!                                            connect_timeout,       connect_timeout
//!                                            keepalive defaults
//!  a failed call ── pg_error ──▶ Error::Store { retryable: whether reconnecting may help }
//! ```
//!
//! - [`config`]: the endpoint a user writes, `{"url": ..., "schema": ...}`, and its
//!   schema; [`EndpointConfig::describe`] is how every message names the server.
//! - [`tls`]: `sslmode` and `sslrootcert` as libpq reads them, over rustls.
//! - [`connect()`] and [`pg_error`] (`connect.rs`): the connection, and which failures
//!   are retryable.
//!
//! What only one user needs stays with it: the driver's tables, statements and fencing
//! calls live in the driver. `tokio_postgres` is re-exported, so a user calls the
//! returned client without naming a version of its own.

pub mod config;
mod connect;
pub mod tls;

pub use config::{DEFAULT_SCHEMA, ENDPOINT_SCHEMA, EndpointConfig, NAME_LIMIT};
pub use connect::{connect, pg_error};
pub use tokio_postgres;

/// `"name"`, with embedded quotes doubled: an identifier every user of the connection
/// writes into statements (schemas, tables).
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}
