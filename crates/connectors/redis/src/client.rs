//! Talking to Redis: the connection, and the few commands the driver sends, each in
//! pipelines of bounded size.
//!
//! One multiplexed connection (redis-rs's `MultiplexedConnection` on tokio) per driver
//! call or transactor: every command is sent from the async task that awaits it, with
//! the endpoint's response timeout, so a hung server becomes a retryable error.
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
use redis::{AsyncConnectionConfig, Client, RedisError};
use sluice_driver_sdk::{Error, Result};

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
    let client = Client::open(config.url.as_str())
        .map_err(|err| Error::Config(format!("endpoint config: url: {err}")))?;
    let options = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(config.connect_timeout()))
        .set_response_timeout(Some(config.response_timeout()));
    let what = || format!("connecting to {}", redacted(&config.url));
    let mut conn = (client.get_multiplexed_async_connection_with_config(&options))
        .await
        .map_err(|err| redis_error(what(), err))?;
    redis::cmd("PING")
        .query_async::<String>(&mut conn)
        .await
        .map_err(|err| redis_error(what(), err))?;
    Ok(conn)
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
