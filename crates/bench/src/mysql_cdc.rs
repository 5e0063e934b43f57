//! `sluice bench mysql-cdc`: change data capture from MariaDB's binary log against
//! reading the same rows from a file, in one run of the bench: the measurement of
//! [`crate::cdc`], with a private `mariadbd` (binary log on, `ROW`, `FULL` images) as
//! the source database and a private PostgreSQL as the store.
//!
//! ```text
//!  sluice run --follow (mysql_cdc of src.events ─▶ PostgreSQL table bench.cdc)
//!  loader: N rows, INSERT … SELECT FROM src.seq_<first>_to_<last> in batches (a transaction each)
//!  then:   the same rows as JSON lines (JSON_OBJECT, the source's _meta) ─▶ bench.file
//! ```
//!
//! A replica confirms nothing to the server, so the lag compares the rows the loader
//! committed with the greatest id the store holds (see [`crate::cdc`]).

use super::cdc::{Upstream, connect};
use anyhow::Context;
use mysql_async::prelude::Queryable;
use serde_json::json;
use sluice_testkit::mariadb::BinlogMariadb;
use sluice_testkit::postgres::LogicalPostgres;
use std::path::Path;
use tokio::sync::Mutex;
use tokio_postgres::Client;

pub struct Mariadb {
    server: BinlogMariadb,
    /// The loader's connection (one transaction per batch).
    conn: Mutex<mysql_async::Conn>,
    store: LogicalPostgres,
}

impl Mariadb {
    async fn conn(&self) -> anyhow::Result<mysql_async::Conn> {
        mysql_async::Conn::from_url(self.server.url())
            .await
            .with_context(|| format!("connecting to {}", self.server.url()))
    }
}

#[async_trait::async_trait]
impl Upstream for Mariadb {
    const NAME: &'static str = "mysql-cdc";
    const DESCRIPTION: &'static str = "MariaDB (binlog_format=ROW)";

    async fn start() -> anyhow::Result<Self> {
        let (server, store) =
            tokio::task::block_in_place(|| (BinlogMariadb::start(), LogicalPostgres::start()));
        connect(&store.url())
            .await?
            .batch_execute("CREATE SCHEMA bench")
            .await?;
        let mut conn = mysql_async::Conn::from_url(server.url()).await?;
        conn.query_drop(
            "CREATE DATABASE src; CREATE TABLE src.events (id bigint PRIMARY KEY, user_id \
             varchar(32) NOT NULL, views int NOT NULL, bytes bigint NOT NULL, last_seen \
             datetime(6) NOT NULL)",
        )
        .await
        .with_context(|| format!("creating table src.events at {}", server.url()))?;
        Ok(Mariadb {
            server,
            conn: Mutex::new(conn),
            store,
        })
    }

    fn store_url(&self) -> String {
        self.store.url()
    }

    fn source_yaml(&self) -> String {
        format!(
            "mysql_cdc: {{url: {}, tables: [src.events]}}",
            json!(self.server.url())
        )
    }

    /// A replica streams the binary log (the source's, after its snapshot).
    async fn streaming(&self) -> anyhow::Result<bool> {
        let dumps: Option<u64> = self
            .conn
            .lock()
            .await
            .query_first(
                "SELECT count(*) FROM information_schema.processlist \
                 WHERE command = 'Binlog Dump'",
            )
            .await?;
        Ok(dumps.unwrap_or(0) > 0)
    }

    async fn insert(&self, first: u64, last: u64) -> anyhow::Result<()> {
        // The sequence engine's table of first..=last (in any database).
        self.conn
            .lock()
            .await
            .query_drop(format!(
                "INSERT INTO src.events SELECT seq, concat('user', seq % 200000), 1 + seq % 9, \
                 seq % 5000, now(6) FROM src.seq_{first}_to_{last}"
            ))
            .await?;
        Ok(())
    }

    async fn sample(&self, loaded: u64, store: &Client) -> anyhow::Result<(u64, u64)> {
        let stored: i64 = store
            .query_one("SELECT coalesce(max(id), 0) FROM bench.cdc", &[])
            .await
            .map(|r| r.get(0))
            .unwrap_or(0);
        Ok((loaded, stored as u64))
    }

    async fn write_lines(&self, path: &Path) -> anyhow::Result<()> {
        use std::io::Write;
        let mut conn = self.conn().await?;
        let mut result = conn
            .query_iter(
                "SELECT json_object('_meta', json_object('op', 'c', 'file', 'mysql-bin.000001', \
                 'pos', 0, 'source', json_object('schema', 'src', 'table', 'events')), 'id', id, \
                 'user_id', user_id, 'views', views, 'bytes', bytes, 'last_seen', \
                 date_format(last_seen, '%Y-%m-%dT%H:%i:%s.%f')) FROM src.events ORDER BY id",
            )
            .await?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
        while let Some(row) = result.next().await? {
            let line: Vec<u8> = row.get(0).context("a JSON line")?;
            out.write_all(&line)?;
            out.write_all(b"\n")?;
        }
        out.flush()?;
        Ok(())
    }
}
