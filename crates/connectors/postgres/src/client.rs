//! Talking to the server: [`Pg`], the catalog Apply reads and the client calls the
//! fencing protocol ([`sluice_sqlkit::fence`]) runs. Connecting and the classification
//! of the server's errors ([`pg_error`]: retryable when reconnecting may help) are
//! `sluice-pg-client`'s, shared with the output SDK's view.
//!
//! Claims of one materialization run one at a time under a transaction-scoped advisory
//! lock ([`crate::sql::CLAIM_LOCK`]): two overlapping Opens bumping fences row by row in
//! different orders could otherwise deadlock. Each statement of a claim is a new
//! snapshot (READ COMMITTED), so the checkpoint read after the fence includes the
//! zombie commit the fence waited for.

use crate::sql;
use async_trait::async_trait;
use sluice_driver_sdk::Result;
use sluice_pg_client::pg_error;
use sluice_sqlkit::apply::Catalog;
use sluice_sqlkit::fence::{FenceClient, Param};
use tokio_postgres::Client;
use tokio_postgres::types::ToSql;

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
