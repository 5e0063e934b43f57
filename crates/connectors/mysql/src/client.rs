//! Talking to the server: connections, error classification, the catalog, bulk loads,
//! and the fencing protocol over the checkpoints table.
//!
//! ```text
//!   claim_range (at Open, one transaction, serialized per materialization by GET_LOCK):
//!     fence += 1 on every stored range overlapping [b, e]     -- waits for in-flight commits
//!     checkpoint ← narrowest stored range covering [b, e]      -- locking read: latest commit
//!     INSERT own range (fence 1, that checkpoint) unless present
//!     our fence ← own range's fence
//!   commit_checkpoint (inside the commit's transaction, after its writes, before COMMIT):
//!     UPDATE own range SET checkpoint WHERE fence = ours        -- 0 rows found: fenced off
//! ```
//!
//! Why this fences: a commit's UPDATE locks its range's row until COMMIT. A newer Open
//! bumps the fence of that row first, so it either waits for the older commit and then
//! reads its checkpoint (the locking read sees the latest committed row, not a snapshot
//! from before it), or runs first, and the older commit's UPDATE then finds no row with
//! its fence. A zombie therefore never commits after a newer instance has opened, and
//! the newer instance never recovers a checkpoint older than the data it sees.
//! Connections set `CLIENT_FOUND_ROWS`, so the UPDATE counts the row it matched even
//! when the checkpoint it writes equals the stored one.
//! A zombie whose Loads went stale may fail before its commit's UPDATE, storing as
//! absent a key the newer instance wrote: the transactor then reads [`current_fence`]
//! and reports the failure as [`Error::Fenced`] if the fence moved.
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

use crate::config::EndpointConfig;
use crate::sql::{self, CHECKPOINTS_TABLE, Flavor};
use bytes::Bytes;
use futures::StreamExt;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, OptsBuilder};
pub use sluice_driver_sdk::fence::Claim;
use sluice_driver_sdk::{Error, Result};

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

/// Connects to the endpoint's server and sets up the session (see the module docs).
/// Returns the connection and the server's flavor.
pub async fn connect(endpoint: &EndpointConfig) -> Result<(Conn, Flavor)> {
    let server = endpoint.describe();
    let opts = OptsBuilder::from_opts(endpoint.connection()?)
        .client_found_rows(true)
        .max_allowed_packet(Some(1 << 30))
        .init(vec![
            "SET NAMES utf8mb4",
            "SET SESSION sql_mode = 'STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION'",
            "SET SESSION time_zone = '+00:00'",
        ]);
    let mut conn = Conn::new(opts)
        .await
        .map_err(|err| my_error(format!("connecting to {server}"), err))?;
    let version: Option<String> = conn
        .query_first("SELECT VERSION()")
        .await
        .map_err(|err| my_error(format!("reading the version of {server}"), err))?;
    Ok((conn, Flavor::of_version(&version.unwrap_or_default())))
}

/// The columns of `table` in the connection's database, empty if it does not exist.
pub async fn existing_columns(conn: &mut Conn, table: &str) -> Result<Vec<String>> {
    conn.exec(
        "SELECT COLUMN_NAME FROM information_schema.COLUMNS \
         WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
        (table,),
    )
    .await
    .map_err(|err| my_error(format!("reading the columns of table {table:?}"), err))
}

/// How many key ranges of `materialization` have a checkpoint row.
pub async fn checkpoint_rows(conn: &mut Conn, materialization: &str) -> Result<u64> {
    let sql = format!(
        "SELECT COUNT(*) FROM {} WHERE `materialization` = ?",
        sql::quote_ident(CHECKPOINTS_TABLE)
    );
    let count: Option<u64> = conn
        .exec_first(sql, (materialization,))
        .await
        .map_err(|err| my_error("counting checkpoints", err))?;
    Ok(count.unwrap_or_default())
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

/// The claimed range's fence as committed now (`None` if its row is gone), read
/// outside any transaction to explain a failed store or commit.
pub async fn current_fence(conn: &mut Conn, claim: &Claim) -> Result<Option<i64>> {
    conn.exec_first(
        format!(
            "SELECT `fence` FROM {} WHERE `materialization` = ? \
             AND `key_begin` = ? AND `key_end` = ?",
            sql::quote_ident(CHECKPOINTS_TABLE)
        ),
        (
            &claim.materialization,
            i64::from(claim.key_begin),
            i64::from(claim.key_end),
        ),
    )
    .await
    .map_err(|err| my_error("reading the fence of the claimed range", err))
}

/// Fences every overlapping range of `materialization` and recovers the checkpoint of
/// the narrowest stored range covering `[key_begin, key_end]` (empty if none): a split
/// shard resumes from its parent's checkpoint, and records it as its own.
///
/// Postcondition: after this returns, older instances of every overlapping range hold a
/// stale fence, so their [`commit_checkpoint`] finds no row; this claim holds the
/// current one.
pub async fn claim_range(
    conn: &mut Conn,
    flavor: Flavor,
    materialization: &str,
    key_begin: u32,
    key_end: u32,
) -> Result<(Claim, Vec<u8>)> {
    let context =
        || format!("fencing key range [{key_begin:08x}, {key_end:08x}] of {materialization:?}");
    let table = sql::quote_ident(CHECKPOINTS_TABLE);
    let (m, b, e) = (materialization, i64::from(key_begin), i64::from(key_end));
    conn.query_drop(sql::create_checkpoints_sql(flavor))
        .await
        .map_err(|err| my_error(context(), err))?;
    // Claims of one materialization run one at a time: two overlapping Opens bumping
    // fences row by row in different orders could otherwise deadlock.
    let lock = "SELECT GET_LOCK(CONCAT('sluice_claim_', MD5(?)), 60)";
    let locked: Option<Option<i64>> = conn
        .exec_first(lock, (m,))
        .await
        .map_err(|err| my_error(context(), err))?;
    if locked.flatten() != Some(1) {
        return Err(Error::store(
            context(),
            "another Open of this materialization held its claim lock for 60 s",
            true,
        ));
    }
    let claimed = claim_locked(conn, &table, m, b, e).await;
    if claimed.is_err() {
        // Best effort: the server rolls back when the connection ends anyway.
        let _ = conn.query_drop("ROLLBACK").await;
    }
    let released = conn
        .exec_drop("SELECT RELEASE_LOCK(CONCAT('sluice_claim_', MD5(?)))", (m,))
        .await;
    let (fence, checkpoint) = claimed.map_err(|err| my_error(context(), err))?;
    released.map_err(|err| my_error(context(), err))?;
    let claim = Claim::new(materialization, key_begin, key_end, fence);
    Ok((claim, checkpoint))
}

/// The transaction of [`claim_range`], under its lock.
async fn claim_locked(
    conn: &mut Conn,
    table: &str,
    m: &str,
    b: i64,
    e: i64,
) -> std::result::Result<(i64, Vec<u8>), mysql_async::Error> {
    conn.query_drop("START TRANSACTION").await?;
    conn.exec_drop(
        format!(
            "UPDATE {table} SET `fence` = `fence` + 1 WHERE `materialization` = ? \
             AND `key_begin` <= ? AND `key_end` >= ?"
        ),
        (m, e, b),
    )
    .await?;
    let covering: Option<Vec<u8>> = conn
        .exec_first(
            format!(
                "SELECT `checkpoint` FROM {table} WHERE `materialization` = ? \
                 AND `key_begin` <= ? AND `key_end` >= ? \
                 ORDER BY `key_end` - `key_begin` LIMIT 1 FOR UPDATE"
            ),
            (m, b, e),
        )
        .await?;
    let checkpoint = covering.unwrap_or_default();
    conn.exec_drop(
        format!("INSERT IGNORE INTO {table} VALUES (?, ?, ?, 1, ?)"),
        (m, b, e, &checkpoint),
    )
    .await?;
    let fence: Option<i64> = conn
        .exec_first(
            format!(
                "SELECT `fence` FROM {table} WHERE `materialization` = ? \
                 AND `key_begin` = ? AND `key_end` = ?"
            ),
            (m, b, e),
        )
        .await?;
    // Durable when this returns (InnoDB flushes its redo log at COMMIT with the default
    // innodb_flush_log_at_trx_commit = 1).
    conn.query_drop("COMMIT").await?;
    Ok((fence.unwrap_or_default(), checkpoint))
}

/// Within the caller's open transaction: records `checkpoint` for the claimed range if
/// the claim's fence is still current (and locks the range's row until the transaction
/// ends), else fails with [`Error::Fenced`]; the caller then rolls back.
pub async fn commit_checkpoint(conn: &mut Conn, claim: &Claim, checkpoint: &[u8]) -> Result<()> {
    conn.exec_drop(
        format!(
            "UPDATE {} SET `checkpoint` = ? WHERE `materialization` = ? \
             AND `key_begin` = ? AND `key_end` = ? AND `fence` = ?",
            sql::quote_ident(CHECKPOINTS_TABLE)
        ),
        (
            checkpoint,
            &claim.materialization,
            i64::from(claim.key_begin),
            i64::from(claim.key_end),
            claim.fence,
        ),
    )
    .await
    .map_err(|err| my_error("committing the runtime checkpoint", err))?;
    if conn.affected_rows() != 1 {
        return Err(claim.range_fence().fenced(None));
    }
    Ok(())
}
