//! Talking to Redis: the connection, and the few commands the driver sends, each in
//! pipelines of bounded size.
//!
//! One multiplexed connection (redis-rs's `MultiplexedConnection` on tokio) per driver
//! call or transactor: every command is sent from the async task that awaits it, with
//! the endpoint's response timeout, so a hung server becomes a retryable error.
//!
//! TLS (`rediss://`): the driver connects the TCP stream and does the handshake itself,
//! with the rustls configuration of the shared `tls` options (`sluice_tls`: ring, the
//! server's certificate checked against `tls.ca`, or the operating system's roots, and
//! the URL's host, a certificate from another CA named by its issuer), and hands
//! redis-rs the encrypted stream; redis-rs's own TLS features (which need a
//! process-wide rustls provider) stay off. A certificate that does not verify is a
//! configuration error, not retried. A plain `redis://` connection the server closes
//! says to write `rediss://` and set `tls`: a server that requires TLS closes plain text.
//!
//! Tuning constants:
//! - [`CHUNK_KEYS`]: keys per MGET / HGET pipeline and writes per MULTI/EXEC; 1000 keeps
//!   a round trip's request small (tens of KiB of keys) while amortizing its latency
//!   over many keys.
//! - [`CHUNK_BYTES`]: a write pipeline is also cut at 16 MiB of documents, so a
//!   transaction of large documents never builds one huge request; a single larger
//!   document goes alone.

use crate::config::{EndpointConfig, Format};
use crate::key;
use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, ErrorKind, IntoConnectionInfo, RedisError,
};
use sluice_driver_sdk::{Error, Result};
use sluice_tls::{ClientTls, TlsConnector};

/// Keys per load round trip and writes per MULTI/EXEC.
pub const CHUNK_KEYS: usize = 1000;
/// Bytes of documents past which a write pipeline is sent.
pub const CHUNK_BYTES: usize = 16 << 20;

/// Whether retrying may help: the connection failed or timed out (a server error
/// reply, e.g. a wrong type or an out-of-memory refusal, comes back the same).
fn retryable(err: &RedisError) -> bool {
    err.is_io_error()
        || err.is_timeout()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
}

/// A Redis failure while doing `what`, retryable as [`retryable`] says.
pub fn redis_error(what: impl Into<String>, err: RedisError) -> Error {
    let retry = retryable(&err);
    Error::store(format!("Redis: {}", what.into()), err, retry)
}

/// A connection to the endpoint's server, checked with a PING.
pub async fn connect(config: &EndpointConfig) -> Result<MultiplexedConnection> {
    let options = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(config.connect_timeout()))
        .set_response_timeout(Some(config.response_timeout()));
    let what = || format!("connecting to {}", redacted(&config.url));
    let mut conn = match &config.tls {
        None => {
            let client = Client::open(config.url.as_str())
                .map_err(|err| Error::Config(format!("endpoint config: url: {err}")))?;
            (client.get_multiplexed_async_connection_with_config(&options))
                .await
                .map_err(|err| connect_error(config, what(), err))?
        }
        Some(tls) => connect_tls(config, tls, options).await?,
    };
    redis::cmd("PING")
        .query_async::<String>(&mut conn)
        .await
        .map_err(|err| connect_error(config, what(), err))?;
    Ok(conn)
}

/// A failure to connect: a refused password is the user's to fix (not retried, naming
/// the user); a plain connection the server closed says how to ask for TLS, as a
/// server that takes TLS only closes plain text (retried as [`redis_error`] says: a
/// server restarting closes it too); anything else as [`redis_error`] says.
fn connect_error(config: &EndpointConfig, what: String, err: RedisError) -> Error {
    let refused = err.kind() == ErrorKind::AuthenticationFailed
        || err.to_string().contains("WRONGPASS")
        || err.to_string().contains("NOAUTH");
    if config.tls.is_none() && closed_by_the_server(&err) {
        let retry = retryable(&err);
        let why = format!(
            "the server closed the connection ({err}); a server that requires TLS closes \
             plain text: write the URL as rediss:// and set tls (ca: the CA file its \
             certificate chains to, or tls: {{}} for the operating system's roots)"
        );
        return Error::store(format!("Redis: {what}"), why, retry);
    }
    if !refused {
        return redis_error(what, err);
    }
    let user = (redis_url(&config.url).into_connection_info().ok())
        .and_then(|info| info.redis_settings().username().map(str::to_string))
        .unwrap_or_else(|| "default".to_string());
    Error::Config(format!(
        "endpoint config: url: {what}: the server refused user {user:?} (wrong password, \
         unknown user, or a password needed): check the URL's user:password@ ({err})"
    ))
}

/// Whether the server ended the connection (closed or reset it) rather than refusing it
/// or not answering in time.
fn closed_by_the_server(err: &RedisError) -> bool {
    err.is_connection_dropped() && !err.is_connection_refusal() && !err.is_timeout()
}

/// `url` with `rediss://` written `redis://`, for redis-rs's parser (built without TLS).
fn redis_url(url: &str) -> String {
    match url.strip_prefix("rediss://") {
        Some(rest) => format!("redis://{rest}"),
        None => url.to_string(),
    }
}

/// A TLS connection: TCP, the handshake with `tls`'s configuration checking the URL's
/// host, then redis-rs's connection (AUTH, SELECT) over the encrypted stream; all
/// within the connect timeout.
async fn connect_tls(
    config: &EndpointConfig,
    tls: &ClientTls,
    options: AsyncConnectionConfig,
) -> Result<MultiplexedConnection> {
    let what = || format!("connecting to {}", redacted(&config.url));
    let client_config = tls
        .client_config("tls")
        .map_err(|e| Error::Config(format!("endpoint config: {}: {}", e.place, e.message)))?;
    let info = (redis_url(&config.url).into_connection_info())
        .map_err(|err| Error::Config(format!("endpoint config: url: {err}")))?;
    let ConnectionAddr::Tcp(host, port) = info.addr().clone() else {
        return Err(Error::Config(
            "endpoint config: url: a rediss:// URL names a host (rediss://host:port/db)".into(),
        ));
    };
    let server_name = sluice_tls::server_name(&host)
        .map_err(|e| Error::Config(format!("endpoint config: url: {}", e.message)))?;
    let settings = info.redis_settings().clone();
    let attempt = async {
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|err| Error::store(format!("Redis: {}", what()), err, true))?;
        let _ = tcp.set_nodelay(true);
        let stream = (TlsConnector::from(client_config).connect(server_name, tcp))
            .await
            .map_err(|err| match sluice_tls::handshake_failure(&err) {
                Some(why) => Error::Config(format!(
                    "endpoint config: tls: {}: {why} (check tls.ca, tls.certificate and \
                     tls.key, and that the server's certificate names {host:?})",
                    what()
                )),
                None => Error::store(format!("Redis: {} (TLS handshake)", what()), err, true),
            })?;
        let (conn, driver) = MultiplexedConnection::new_with_config(&settings, stream, options)
            .await
            .map_err(|err| connect_error(config, what(), err))?;
        tokio::spawn(driver);
        Ok(conn)
    };
    match tokio::time::timeout(config.connect_timeout(), attempt).await {
        Ok(connected) => connected,
        Err(_) => Err(Error::store(
            format!("Redis: {}", what()),
            format!(
                "no connection within the connect timeout ({}s)",
                config.connect_timeout().as_secs()
            ),
            true,
        )),
    }
}

/// `url` without its password, for messages.
fn redacted(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}***{}", &url[..scheme + 3], &url[at..])
        }
        _ => url.to_string(),
    }
}

/// The documents stored under `keys` (Redis keys of one binding, at most
/// [`CHUNK_KEYS`]), in order, `None` where absent: one MGET (json) or one pipeline of
/// HGETs of the document field (hash).
pub async fn load_chunk(
    conn: &mut MultiplexedConnection,
    format: Format,
    document_field: &str,
    keys: &[String],
) -> Result<Vec<Option<Vec<u8>>>> {
    let found = match format {
        Format::Json => redis::cmd("MGET").arg(keys).query_async(conn).await,
        Format::Hash => {
            let mut pipe = redis::pipe();
            for key in keys {
                pipe.cmd("HGET").arg(key).arg(document_field);
            }
            pipe.query_async(conn).await
        }
    };
    found.map_err(|err| redis_error(format!("loading {} keys", keys.len()), err))
}

/// One write of a transaction, as Redis commands.
pub enum Write {
    /// `SET key doc`.
    Set { key: String, doc: Vec<u8> },
    /// `DEL key`, then `HSET key field value ...` (the hash replaced whole).
    Hash {
        key: String,
        fields: Vec<(String, Vec<u8>)>,
    },
    /// `DEL key`.
    Delete { key: String },
}

/// Applies `writes` in one MULTI/EXEC: all of them or, if the server refuses the
/// transaction, none. A connection lost during EXEC leaves it unknown which; either way
/// the caller fails the transaction, and its replay rewrites the same keys.
pub async fn write_chunk(conn: &mut MultiplexedConnection, writes: &[Write]) -> Result<()> {
    let mut pipe = redis::pipe();
    pipe.atomic();
    for write in writes {
        match write {
            Write::Set { key, doc } => {
                pipe.cmd("SET").arg(key).arg(doc.as_slice()).ignore();
            }
            Write::Hash { key, fields } => {
                pipe.cmd("DEL").arg(key).ignore();
                let hset = pipe.cmd("HSET").arg(key);
                for (field, value) in fields {
                    hset.arg(field).arg(value.as_slice());
                }
                hset.ignore();
            }
            Write::Delete { key } => {
                pipe.cmd("DEL").arg(key).ignore();
            }
        }
    }
    pipe.exec_async(conn)
        .await
        .map_err(|err| redis_error(format!("writing {} keys", writes.len()), err))
}

/// A key starting with `prefix`, if there is one (SCAN until the first match).
pub async fn any_key(conn: &mut MultiplexedConnection, prefix: &str) -> Result<Option<String>> {
    let pattern = key::scan_pattern(prefix);
    let mut cursor = 0u64;
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .cursor_arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(CHUNK_KEYS)
            .query_async(conn)
            .await
            .map_err(|err| redis_error(format!("looking for keys under {prefix:?}"), err))?;
        if let Some(key) = keys.into_iter().next() {
            return Ok(Some(key));
        }
        if next == 0 {
            return Ok(None);
        }
        cursor = next;
    }
}

/// Deletes every key starting with `prefix`: SCAN with the escaped prefix as its MATCH
/// pattern, UNLINK of each batch found. Returns how many keys were removed. Keys written
/// meanwhile may survive (SCAN's guarantee covers keys present throughout).
pub async fn delete_prefix(conn: &mut MultiplexedConnection, prefix: &str) -> Result<u64> {
    let pattern = key::scan_pattern(prefix);
    let what = || format!("deleting keys under prefix {prefix:?}");
    let (mut cursor, mut removed) = (0u64, 0u64);
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .cursor_arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(CHUNK_KEYS)
            .query_async(conn)
            .await
            .map_err(|err| redis_error(what(), err))?;
        if !keys.is_empty() {
            let unlinked: u64 = redis::cmd("UNLINK")
                .arg(&keys)
                .query_async(conn)
                .await
                .map_err(|err| redis_error(what(), err))?;
            removed += unlinked;
        }
        if next == 0 {
            return Ok(removed);
        }
        cursor = next;
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn passwords_are_left_out_of_messages() {
        assert_eq!(
            super::redacted("redis://u:secret@h:6379/1"),
            "redis://***@h:6379/1"
        );
        assert_eq!(super::redacted("redis://h:6379"), "redis://h:6379");
    }
}
