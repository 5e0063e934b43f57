//! Talking to the server: connections, error classification, the catalog, and the
//! fencing protocol over the checkpoints table.
//!
//! ```text
//!   claim_range (at Open, one transaction, serialized per materialization):
//!     checkpoint ← narrowest stored range of the materialization covering [b, e]
//!     INSERT own range (fence 0, that checkpoint) unless present
//!     fence += 1 on every stored range overlapping [b, e]
//!     our fence ← own range's fence
//!   commit_checkpoint (inside the commit's transaction, after its writes, before COMMIT):
//!     UPDATE own range SET checkpoint WHERE fence = ours   -- 0 rows: fenced off
//! ```
//!
//! Why this fences: a newer Open of an overlapping range bumps the fence of our range
//! row in a committed transaction. Our commit's UPDATE either runs after that and
//! matches no row, or runs before it, holding the row lock until our commit, so the
//! newer Open waits for us and recovers the checkpoint we committed. A zombie therefore
//! never commits after a newer instance has opened.
//!
//! A zombie whose Loads went stale may fail before its commit's UPDATE, storing as
//! absent a key the newer instance wrote: the transactor then reads [`current_fence`]
//! and reports the failure as [`Error::Fenced`] if the fence moved.
//!
//! Errors: a lost connection, a server shutting down, a serialization failure or a
//! deadlock are retryable (the runtime reopens with backoff, and the transaction in
//! progress was rolled back by the server); constraint violations and bad data are
//! not. Errors name the server without its password ([`EndpointConfig::describe`]).

use crate::config::EndpointConfig;
use crate::sql::{self, CHECKPOINTS_TABLE};
use sluice_driver_sdk::fence;
use sluice_driver_sdk::{Error, Result};
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, NoTls};

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

/// Connects to the endpoint's server. The connection runs on a spawned task that ends
/// when the returned client is dropped or the server goes away; in-flight and later
/// calls then fail with a retryable error.
pub async fn connect(endpoint: &EndpointConfig) -> Result<Client> {
    let server = endpoint.describe();
    let (client, connection) = endpoint
        .connection()?
        .connect(NoTls)
        .await
        .map_err(|err| pg_error(format!("connecting to {server}"), err))?;
    tokio::spawn(async move {
        if let Err(err) = connection.await {
            tracing::warn!(%server, %err, "PostgreSQL connection ended");
        }
    });
    Ok(client)
}

/// The columns of `schema.table`, empty if it does not exist.
pub async fn existing_columns(client: &Client, schema: &str, table: &str) -> Result<Vec<String>> {
    let rows = client
        .query(
            "SELECT column_name::text FROM information_schema.columns \
             WHERE table_schema = $1 AND table_name = $2 ORDER BY ordinal_position",
            &[&schema, &table],
        )
        .await
        .map_err(|err| pg_error(format!("reading the columns of {schema:?}.{table:?}"), err))?;
    Ok(rows.iter().map(|row| row.get(0)).collect())
}

pub async fn schema_exists(client: &Client, schema: &str) -> Result<bool> {
    let row = client
        .query_one(
            "SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)",
            &[&schema],
        )
        .await
        .map_err(|err| pg_error(format!("looking up schema {schema:?}"), err))?;
    Ok(row.get(0))
}

/// How many key ranges of `materialization` have a checkpoint row in `schema`.
pub async fn checkpoint_rows(client: &Client, schema: &str, materialization: &str) -> Result<i64> {
    let sql = format!(
        "SELECT count(*) FROM {} WHERE \"materialization\" = $1",
        sql::qualify(schema, CHECKPOINTS_TABLE)
    );
    let row = client
        .query_one(&sql, &[&materialization])
        .await
        .map_err(|err| pg_error("counting checkpoints", err))?;
    Ok(row.get(0))
}

/// One shard's claim on its key range (see [`fence::Claim`], which it derefs to), in the
/// checkpoints table of `schema`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub schema: String,
    pub range: fence::Claim,
}

impl std::ops::Deref for Claim {
    type Target = fence::Claim;

    fn deref(&self) -> &fence::Claim {
        &self.range
    }
}

/// The claimed range's fence as committed now (`None` if its row is gone), read
/// outside any transaction to explain a failed store or commit.
pub async fn current_fence(client: &Client, claim: &Claim) -> Result<Option<i64>> {
    let row = client
        .query_opt(
            &format!(
                "SELECT \"fence\" FROM {} WHERE \"materialization\" = $1 \
                 AND \"key_begin\" = $2 AND \"key_end\" = $3",
                sql::qualify(&claim.schema, CHECKPOINTS_TABLE)
            ),
            &[
                &claim.materialization,
                &i64::from(claim.key_begin),
                &i64::from(claim.key_end),
            ],
        )
        .await
        .map_err(|err| pg_error("reading the fence of the claimed range", err))?;
    Ok(row.map(|row| row.get(0)))
}

/// Fences every overlapping range of `materialization` and recovers the checkpoint of
/// the narrowest stored range covering `[key_begin, key_end]` (empty if none): a split
/// shard resumes from its parent's checkpoint, and records it as its own.
///
/// Postcondition: after this returns, older instances of every overlapping range hold a
/// stale fence, so their [`commit_checkpoint`] matches no row; this claim holds the
/// current one.
pub async fn claim_range(
    client: &mut Client,
    schema: &str,
    materialization: &str,
    key_begin: u32,
    key_end: u32,
) -> Result<(Claim, Vec<u8>)> {
    let context =
        || format!("fencing key range [{key_begin:08x}, {key_end:08x}] of {materialization:?}");
    let err = |err| pg_error(context(), err);
    let table = sql::qualify(schema, CHECKPOINTS_TABLE);
    let (m, b, e) = (materialization, i64::from(key_begin), i64::from(key_end));
    let tx = client.transaction().await.map_err(err)?;
    // Claims of one materialization run one at a time: two overlapping Opens bumping
    // fences row by row in different orders could otherwise deadlock.
    tx.execute("SELECT pg_advisory_xact_lock(hashtext($1))", &[&m])
        .await
        .map_err(err)?;
    // Fence first: the UPDATE waits for any zombie commit that holds these rows, so the
    // checkpoint read after it (a new statement, a new snapshot) includes that commit.
    // Reading it before the fence could resume from a checkpoint older than the data.
    tx.execute(
        &format!(
            "UPDATE {table} SET \"fence\" = \"fence\" + 1 WHERE \"materialization\" = $1 \
             AND \"key_begin\" <= $3 AND \"key_end\" >= $2"
        ),
        &[&m, &b, &e],
    )
    .await
    .map_err(err)?;
    let covering = tx
        .query_opt(
            &format!(
                "SELECT \"checkpoint\" FROM {table} WHERE \"materialization\" = $1 \
                 AND \"key_begin\" <= $2 AND \"key_end\" >= $3 \
                 ORDER BY \"key_end\" - \"key_begin\" LIMIT 1"
            ),
            &[&m, &b, &e],
        )
        .await
        .map_err(err)?;
    let checkpoint: Vec<u8> = covering.map(|row| row.get(0)).unwrap_or_default();
    // A range claimed for the first time starts at fence 1.
    tx.execute(
        &format!("INSERT INTO {table} VALUES ($1, $2, $3, 1, $4) ON CONFLICT DO NOTHING"),
        &[&m, &b, &e, &checkpoint],
    )
    .await
    .map_err(err)?;
    let fence: i64 = tx
        .query_one(
            &format!(
                "SELECT \"fence\" FROM {table} WHERE \"materialization\" = $1 \
                 AND \"key_begin\" = $2 AND \"key_end\" = $3"
            ),
            &[&m, &b, &e],
        )
        .await
        .map_err(err)?
        .get(0);
    // Durable when this returns: the server has flushed the commit to its WAL.
    tx.commit().await.map_err(err)?;
    let claim = Claim {
        schema: schema.to_owned(),
        range: fence::Claim::new(materialization, key_begin, key_end, fence),
    };
    Ok((claim, checkpoint))
}

/// The statement of [`commit_checkpoint`], prepared once per transactor.
pub fn commit_checkpoint_sql(schema: &str) -> String {
    format!(
        "UPDATE {} SET \"checkpoint\" = $1 WHERE \"materialization\" = $2 \
         AND \"key_begin\" = $3 AND \"key_end\" = $4 AND \"fence\" = $5",
        sql::qualify(schema, CHECKPOINTS_TABLE)
    )
}

/// Within the caller's open transaction: records `checkpoint` for the claimed range if
/// the claim's fence is still current (and locks the range's row until the transaction
/// ends), else fails with [`Error::Fenced`]; the caller then rolls back.
pub async fn commit_checkpoint(
    client: &Client,
    statement: &tokio_postgres::Statement,
    claim: &Claim,
    checkpoint: &[u8],
) -> Result<()> {
    let changed = client
        .execute(
            statement,
            &[
                &checkpoint,
                &claim.materialization,
                &i64::from(claim.key_begin),
                &i64::from(claim.key_end),
                &claim.fence,
            ],
        )
        .await
        .map_err(|err| pg_error("committing the runtime checkpoint", err))?;
    if changed != 1 {
        return Err(claim.range_fence().fenced(None));
    }
    Ok(())
}
