//! `sluice bench postgres`: Sluice into PostgreSQL against what a user would write by
//! hand, in one process, against one server, each case in a fresh table of a schema of
//! the bench's own (dropped at the end). The cases, checks and report are shared with
//! `sluice bench mysql` (see `sql.rs`); this file holds PostgreSQL's side of them:
//!
//! ```text
//!  (a) datagen ─▶ runtime (combine: sum, maximize; load; store) ─▶ driver, standard mode
//!  (b) generator ─▶ COPY N raw rows into a temp table ─▶ INSERT … SELECT DISTINCT ON /
//!      GROUP BY … ON CONFLICT DO UPDATE (the reductions in SQL), one transaction
//!  (c) generator ─▶ one single-row INSERT … ON CONFLICT DO UPDATE per document, 1,000
//!      pipelined per batch and one commit per batch (Kafka Connect's JDBC sink), over
//!      the first `--row-docs` documents
//!  (d) (a) with delta updates ─▶ combined deltas appended;  vs  generator ─▶ COPY of
//!      the N documents as rows of a table shaped like (d)'s (document column included)
//! ```
//!
//! (d) and its COPY baseline both count input rows (one per generated document) per
//! second: the question they answer is how much slower than a bare COPY of the input it
//! is to go through Sluice's delta mode (which writes fewer, combined rows).
//!
//! Note on (c): tokio-postgres sends one Sync per statement where pgjdbc's
//! `executeBatch` sends one per batch; both pipeline the batch in one round trip.

use super::sql::{Case, Labels, Row, SEED, SqlArgs, Store, WriteRow, raw_row};
use anyhow::Context;
use async_trait::async_trait;
use futures::SinkExt;
use serde_json::{Value, json};
use sluice_datagen::pageview;
use sluice_postgres::sql::{qualify, quote_ident};
use std::time::Instant;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Statement};

/// Bytes of COPY data per message sent to the server.
const COPY_CHUNK: usize = 1 << 20;

/// The server, with the bench's schema on it.
pub struct Postgres {
    client: Client,
    schema: String,
    url: String,
}

/// The table of (b) and (c): the shape of (a)'s.
const PLAIN_TABLE: &str = "(user_id text PRIMARY KEY, views bigint, bytes bigint, \
     last_seen timestamptz, tags jsonb)";

#[async_trait]
impl Store for Postgres {
    const LABELS: Labels = Labels {
        server: "PostgreSQL",
        bulk: "COPY",
        rows: "pipelined",
    };
    const URL_HELP: &'static str = "The server (its `test` database must exist)";
    const DEFAULT_URL: &'static str = "postgres://postgres@127.0.0.1:5432/test";
    type Upsert = Statement;

    fn endpoint(&self) -> Value {
        json!({ "postgres": { "url": self.url, "schema": self.schema } })
    }

    fn table(&self, name: &str) -> String {
        qualify(&self.schema, name)
    }

    async fn one(&mut self, sql: &str) -> anyhow::Result<i64> {
        let row = self
            .client
            .query_one(sql, &[])
            .await
            .context(sql.to_owned())?;
        Ok(row.get(0))
    }

    async fn views(&mut self, table: &str) -> anyhow::Result<i64> {
        self.one(&format!(
            "SELECT coalesce(sum(views), 0)::bigint FROM {table}"
        ))
        .await
    }

    async fn compare(&mut self, a: &str, b: &str, _: u64) -> anyhow::Result<Option<String>> {
        let differing = self
            .one(&format!(
                "SELECT count(*) FROM {a} a FULL JOIN {b} b USING (user_id) \
                 WHERE a.views IS DISTINCT FROM b.views OR a.bytes IS DISTINCT FROM b.bytes \
                 OR a.last_seen IS DISTINCT FROM b.last_seen OR a.tags IS DISTINCT FROM b.tags"
            ))
            .await?;
        Ok((differing != 0).then(|| format!("{differing} rows of (a) and (b) differ")))
    }

    async fn open(url: &str, schema: &str) -> anyhow::Result<Self> {
        let (client, connection) = tokio_postgres::connect(url, NoTls)
            .await
            .context("connecting to the server given by --url")?;
        tokio::spawn(connection);
        client
            .batch_execute(&format!("CREATE SCHEMA {}", quote_ident(schema)))
            .await?;
        Ok(Postgres {
            client,
            schema: schema.to_owned(),
            url: url.to_owned(),
        })
    }

    async fn drop_scratch(&mut self) -> anyhow::Result<()> {
        let drop = format!("DROP SCHEMA {} CASCADE", quote_ident(&self.schema));
        Ok(self.client.batch_execute(&drop).await?)
    }

    async fn bulk_loader(
        &mut self,
        args: &SqlArgs<Self>,
        table: &str,
    ) -> anyhow::Result<(Case, i64)> {
        let target = self.table(table);
        self.client
            .batch_execute(&format!("CREATE TABLE {target} {PLAIN_TABLE}"))
            .await?;
        let start = Instant::now();
        self.client
            .batch_execute(
                "BEGIN; CREATE TEMPORARY TABLE raw_views (seq bigint, user_id text, \
                 views bigint, bytes bigint, last_seen timestamptz, tags jsonb) ON COMMIT DROP",
            )
            .await?;
        let total_views = self.load_generated(args, "raw_views", raw_row).await?;
        self.client
            .batch_execute(&format!(
                "INSERT INTO {target} (user_id, views, bytes, last_seen, tags) \
                 SELECT g.user_id, g.views, g.bytes, g.last_seen, l.tags \
                 FROM (SELECT user_id, sum(views)::bigint AS views, sum(bytes)::bigint AS bytes, \
                         max(last_seen) AS last_seen FROM raw_views GROUP BY user_id) g \
                 JOIN (SELECT DISTINCT ON (user_id) user_id, tags FROM raw_views \
                       ORDER BY user_id, seq DESC) l USING (user_id) \
                 ON CONFLICT (user_id) DO UPDATE SET views = {target}.views + excluded.views, \
                   bytes = {target}.bytes + excluded.bytes, \
                   last_seen = greatest({target}.last_seen, excluded.last_seen), \
                   tags = excluded.tags; \
                 COMMIT"
            ))
            .await?;
        let case = Case {
            items: args.docs,
            elapsed: start.elapsed(),
            note: "COPY into a temp table, one INSERT … SELECT".into(),
        };
        Ok((case, total_views))
    }

    async fn prepare_upsert(&mut self, target: &str) -> anyhow::Result<Statement> {
        self.client
            .batch_execute(&format!("CREATE TABLE {target} {PLAIN_TABLE}"))
            .await?;
        let upsert = self
            .client
            .prepare(&format!(
                "INSERT INTO {target} (user_id, views, bytes, last_seen, tags) \
                 VALUES ($1, $2, $3, $4::text::timestamptz, $5::text::jsonb) \
                 ON CONFLICT (user_id) DO UPDATE SET views = {target}.views + excluded.views, \
                   bytes = {target}.bytes + excluded.bytes, \
                   last_seen = greatest({target}.last_seen, excluded.last_seen), \
                   tags = excluded.tags"
            ))
            .await?;
        Ok(upsert)
    }

    /// Pipelines the batch's statements in one round trip.
    async fn upsert_batch(&mut self, upsert: &Statement, batch: Vec<Row>) -> anyhow::Result<()> {
        self.client.batch_execute("BEGIN").await?;
        let statements = batch.iter().map(|(user, views, bytes, seen, tags)| {
            let params: [&(dyn ToSql + Sync); 5] = [user, views, bytes, seen, tags];
            self.client.execute_raw(upsert, params)
        });
        futures::future::try_join_all(statements).await?;
        self.client.batch_execute("COMMIT").await?;
        Ok(())
    }

    async fn clone_table(&mut self, like: &str, table: &str) -> anyhow::Result<Vec<String>> {
        let columns = self
            .client
            .query(
                "SELECT column_name::text FROM information_schema.columns \
                 WHERE table_schema = $1 AND table_name = $2 ORDER BY ordinal_position",
                &[&self.schema, &like],
            )
            .await?
            .iter()
            .map(|row| row.get(0))
            .collect();
        let (source, target) = (self.table(like), self.table(table));
        self.client
            .batch_execute(&format!("CREATE TABLE {target} (LIKE {source})"))
            .await?;
        Ok(columns)
    }

    /// Streams one COPY, a message per [`COPY_CHUNK`] of rows.
    async fn load_generated(
        &mut self,
        args: &SqlArgs<Self>,
        table: &str,
        row: impl WriteRow,
    ) -> anyhow::Result<i64> {
        let copy = format!("COPY {table} FROM STDIN");
        let sink = self.client.copy_in::<_, bytes::Bytes>(&copy).await?;
        futures::pin_mut!(sink);
        let mut views = 0i64;
        let mut chunk = Vec::with_capacity(COPY_CHUNK + 4096);
        for seq in 0..args.docs {
            let doc = pageview(SEED, args.keys, seq);
            views += doc.views as i64;
            row(seq, &doc, &mut chunk);
            if chunk.len() >= COPY_CHUNK {
                sink.send(bytes::Bytes::from(std::mem::take(&mut chunk)))
                    .await?;
            }
        }
        sink.send(bytes::Bytes::from(chunk)).await?;
        sink.finish().await?;
        Ok(views)
    }
}
