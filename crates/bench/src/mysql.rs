//! `sluice bench mysql`: Sluice into MariaDB/MySQL against what a user would write by
//! hand, in one process, against one server, each case in a fresh table of a database
//! of the bench's own (dropped at the end). The same cases, checks and report as
//! `sluice bench postgres` (shared in `sql.rs`), with MariaDB's bulk path
//! (`LOAD DATA LOCAL INFILE`) where PostgreSQL has COPY:
//!
//! ```text
//!  (a) datagen ─▶ runtime (combine: sum, maximize; load; store) ─▶ driver, standard mode
//!  (b) generator ─▶ LOAD DATA of N raw rows into a temp table ─▶ INSERT … SELECT … GROUP BY
//!      … ON DUPLICATE KEY UPDATE (the reductions in SQL), one transaction
//!  (c) generator ─▶ one single-row INSERT … ON DUPLICATE KEY UPDATE per document, each
//!      its own round trip, one commit per 1,000 (Kafka Connect's JDBC sink over
//!      Connector/J, whose executeBatch sends the statements one by one unless
//!      rewriteBatchedStatements is set), over the first `--row-docs` documents
//!  (d) (a) with delta updates ─▶ combined deltas appended;  vs  generator ─▶ LOAD DATA
//!      of the N documents as rows of a table shaped like (d)'s (document column included)
//! ```
//!
//! Tables are named unqualified: the connection `USE`s the bench's database. The JSON
//! comparison of the (a)/(b) cross-check uses MariaDB's `JSON_EQUALS`.

use super::sql::{Case, Labels, Row, SEED, SqlArgs, Store, WriteRow, raw_row};
use anyhow::{Context, ensure};
use async_trait::async_trait;
use futures::StreamExt;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Statement};
use serde_json::{Value, json};
use sluice_datagen::pageview;
use sluice_mysql::config::EndpointConfig;
use sluice_mysql::sql::quote_ident;
use sluice_testkit::mysql::database_url;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Instant;

/// Bytes of LOAD DATA input per packet sent to the server.
const INFILE_CHUNK: usize = 1 << 20;

/// The server, connected to the bench's database.
pub struct Mysql {
    conn: Conn,
    /// The bench's own database on the server, and its URL.
    database: String,
    url: String,
}

/// The table of (b) and (c): the shape of (a)'s, keys compared byte for byte.
const PLAIN_TABLE: &str = "(user_id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin \
     PRIMARY KEY, views BIGINT, bytes BIGINT, last_seen LONGTEXT, tags JSON)";

#[async_trait]
impl Store for Mysql {
    const LABELS: Labels = Labels {
        server: "MariaDB/MySQL",
        bulk: "LOAD DATA",
        rows: "one by one",
    };
    const URL_HELP: &'static str =
        "The server (its database must exist; the bench creates one of its own beside it)";
    const DEFAULT_URL: &'static str = "mysql://root@127.0.0.1:3306/test";
    type Upsert = Statement;

    fn endpoint(&self) -> Value {
        json!({ "mysql": { "url": self.url } })
    }

    fn table(&self, name: &str) -> String {
        name.to_owned()
    }

    async fn one(&mut self, sql: &str) -> anyhow::Result<i64> {
        let value: Option<i64> = self.conn.query_first(sql).await.context(sql.to_owned())?;
        value.with_context(|| format!("{sql} returned no row"))
    }

    async fn views(&mut self, table: &str) -> anyhow::Result<i64> {
        self.one(&format!(
            "SELECT CAST(COALESCE(SUM(views), 0) AS SIGNED) FROM {table}"
        ))
        .await
    }

    async fn compare(&mut self, a: &str, b: &str, a_rows: u64) -> anyhow::Result<Option<String>> {
        let differing = self
            .one(&format!(
                "SELECT COUNT(*) FROM {a} a LEFT JOIN {b} b USING (user_id) \
                 WHERE b.user_id IS NULL OR NOT (a.views <=> b.views AND a.bytes <=> b.bytes \
                 AND a.last_seen <=> b.last_seen AND JSON_EQUALS(a.tags, b.tags) <=> 1)"
            ))
            .await?;
        let b_rows = self.one(&format!("SELECT COUNT(*) FROM {b}")).await?;
        Ok((differing != 0 || b_rows != a_rows as i64).then(|| {
            format!("{differing} rows of (a) differ from (b); (a) has {a_rows} rows, (b) {b_rows}")
        }))
    }

    async fn open(url: &str, database: &str) -> anyhow::Result<Self> {
        let server = EndpointConfig {
            url: url.to_owned(),
        };
        let (mut conn, _) = sluice_mysql::client::connect(&server)
            .await
            .context("connecting to the server given by --url")?;
        conn.query_drop(format!("CREATE DATABASE {}", quote_ident(database)))
            .await?;
        conn.query_drop(format!("USE {}", quote_ident(database)))
            .await?;
        Ok(Mysql {
            conn,
            url: database_url(url, database),
            database: database.to_owned(),
        })
    }

    async fn drop_scratch(&mut self) -> anyhow::Result<()> {
        let drop = format!("DROP DATABASE {}", quote_ident(&self.database));
        Ok(self.conn.query_drop(drop).await?)
    }

    async fn bulk_loader(
        &mut self,
        args: &SqlArgs<Self>,
        table: &str,
    ) -> anyhow::Result<(Case, i64)> {
        self.conn
            .query_drop(format!("CREATE TABLE {table} {PLAIN_TABLE}"))
            .await?;
        let start = Instant::now();
        self.conn
            .query_drop(
                "CREATE TEMPORARY TABLE raw_views (seq BIGINT PRIMARY KEY, \
                 user_id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin, \
                 views BIGINT, bytes BIGINT, last_seen LONGTEXT, tags JSON)",
            )
            .await?;
        self.conn.query_drop("START TRANSACTION").await?;
        let total_views = self.load_generated(args, "raw_views", raw_row).await?;
        self.conn
            .query_drop(format!(
                "INSERT INTO {table} (user_id, views, bytes, last_seen, tags) \
                 SELECT g.user_id, g.views, g.bytes, g.last_seen, l.tags \
                 FROM (SELECT user_id, SUM(views) AS views, SUM(bytes) AS bytes, \
                         MAX(last_seen) AS last_seen, MAX(seq) AS last \
                       FROM raw_views GROUP BY user_id) g \
                 JOIN raw_views l ON l.seq = g.last \
                 ON DUPLICATE KEY UPDATE views = {table}.views + VALUES(views), \
                   bytes = {table}.bytes + VALUES(bytes), \
                   last_seen = GREATEST({table}.last_seen, VALUES(last_seen)), \
                   tags = VALUES(tags)"
            ))
            .await?;
        self.conn.query_drop("COMMIT").await?;
        self.conn
            .query_drop("DROP TEMPORARY TABLE raw_views")
            .await?;
        let case = Case {
            items: args.docs,
            elapsed: start.elapsed(),
            note: "LOAD DATA into a temp table, one INSERT … SELECT".into(),
        };
        Ok((case, total_views))
    }

    async fn prepare_upsert(&mut self, table: &str) -> anyhow::Result<Statement> {
        self.conn
            .query_drop(format!("CREATE TABLE {table} {PLAIN_TABLE}"))
            .await?;
        let upsert = self
            .conn
            .prep(format!(
                "INSERT INTO {table} (user_id, views, bytes, last_seen, tags) \
                 VALUES (?, ?, ?, ?, ?) \
                 ON DUPLICATE KEY UPDATE views = views + VALUES(views), \
                   bytes = bytes + VALUES(bytes), \
                   last_seen = GREATEST(last_seen, VALUES(last_seen)), tags = VALUES(tags)"
            ))
            .await?;
        Ok(upsert)
    }

    /// Sends the batch's statements one by one, each its own round trip. (Not
    /// `exec_batch`: on MariaDB it sends the whole batch as one `COM_STMT_BULK_EXECUTE`,
    /// which MySQL's Connector/J never does.)
    async fn upsert_batch(&mut self, upsert: &Statement, batch: Vec<Row>) -> anyhow::Result<()> {
        self.conn.query_drop("START TRANSACTION").await?;
        for row in batch {
            self.conn.exec_drop(upsert, row).await?;
        }
        self.conn.query_drop("COMMIT").await?;
        Ok(())
    }

    async fn clone_table(&mut self, like: &str, table: &str) -> anyhow::Result<Vec<String>> {
        let columns = self
            .conn
            .exec(
                "SELECT COLUMN_NAME FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
                (like,),
            )
            .await?;
        self.conn
            .query_drop(format!("CREATE TABLE {table} LIKE {like}"))
            .await?;
        Ok(columns)
    }

    /// Streams one `LOAD DATA LOCAL`, in chunks of [`INFILE_CHUNK`] generated as the
    /// server reads them.
    async fn load_generated(
        &mut self,
        args: &SqlArgs<Self>,
        table: &str,
        row: impl WriteRow,
    ) -> anyhow::Result<i64> {
        let (docs, keys) = (args.docs, args.keys);
        let views = Arc::new(AtomicI64::new(0));
        let counted = views.clone();
        let chunks = futures::stream::unfold(0u64, move |mut seq| {
            let mut chunk = Vec::with_capacity(INFILE_CHUNK + 4096);
            while seq < docs && chunk.len() < INFILE_CHUNK {
                let doc = pageview(SEED, keys, seq);
                counted.fetch_add(doc.views as i64, Ordering::Relaxed);
                row(seq, &doc, &mut chunk);
                seq += 1;
            }
            let next = (!chunk.is_empty()).then(|| (Ok(bytes::Bytes::from(chunk)), seq));
            futures::future::ready(next)
        });
        self.conn
            .set_infile_handler(async move { Ok(chunks.boxed()) });
        self.conn
            .query_drop(format!(
                "LOAD DATA LOCAL INFILE 'generated' INTO TABLE {table} CHARACTER SET utf8mb4"
            ))
            .await?;
        ensure!(
            self.conn.get_warnings() == 0,
            "loading {table}: {} warnings",
            self.conn.get_warnings()
        );
        Ok(views.load(Ordering::Relaxed))
    }
}
