//! `sluice bench mysql`: Sluice into MariaDB/MySQL against what a user would write by
//! hand, in one process, against one server, each case in a fresh table of a database
//! of the bench's own (dropped at the end). The same cases and figures as
//! `sluice bench postgres`, with MariaDB's bulk path (`LOAD DATA LOCAL INFILE`) where
//! PostgreSQL has COPY:
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
//! All cases read the same deterministic documents (`datagen::document`), generated
//! inside every timed span; DDL is outside. The generated strings hold no tab, newline
//! or backslash, so the hand-written LOAD DATA rows need no escaping. After the run,
//! (a)'s table must equal (b)'s row for row, and (a) and (d) must add up to the
//! generated views: a mismatch fails the command after the figures are printed. The
//! JSON comparison uses MariaDB's `JSON_EQUALS`.

use anyhow::{Context, bail, ensure};
use async_trait::async_trait;
use futures::StreamExt;
use mysql_async::Conn;
use mysql_async::prelude::Queryable;
use serde_json::{Value, json};
use sluice_driver::inprocess::InProcess;
use sluice_mysql::MysqlDriver;
use sluice_mysql::config::EndpointConfig;
use sluice_mysql::sql::quote_ident;
use sluice_proto::flow::EndpointType;
use sluice_runtime::config::{Endpoint, Pipeline};
use sluice_runtime::pipeline::{self, Connect, Connected, RunOptions};
use sluice_runtime::source::datagen::document;
use sluice_runtime::txn::Progress;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The generator's seed, shared by every case.
const SEED: u64 = 7;
/// Statements per committed batch of (c).
const ROW_BATCH: usize = 1_000;
/// Bytes of LOAD DATA input per packet sent to the server.
const INFILE_CHUNK: usize = 1 << 20;

#[derive(clap::Args)]
pub struct MysqlArgs {
    /// Documents to generate.
    #[arg(long, default_value_t = 1_000_000)]
    docs: u64,
    /// Distinct keys among them.
    #[arg(long, default_value_t = 200_000)]
    keys: u64,
    /// Documents of the row-by-row case (c), the first of the N.
    #[arg(long, default_value_t = 100_000)]
    row_docs: u64,
    /// The server (its database must exist; the bench creates one of its own beside it).
    #[arg(long, default_value = "mysql://root@127.0.0.1:3306/test")]
    url: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: MysqlArgs) -> anyhow::Result<()> {
    ensure!(
        args.docs >= 1 && args.keys >= 1,
        "--docs and --keys must be at least 1"
    );
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(bench(args))
}

/// What each case measured.
struct Figures {
    a: Case,
    b: Case,
    c: Case,
    d: Case,
    copy: Case,
}

/// `items` (documents or rows) in `elapsed`.
struct Case {
    items: u64,
    elapsed: Duration,
    note: String,
}

impl Case {
    fn per_sec(&self) -> f64 {
        self.items as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

async fn bench(args: MysqlArgs) -> anyhow::Result<()> {
    let server = EndpointConfig {
        url: args.url.clone(),
    };
    let (mut conn, _) = sluice_mysql::client::connect(&server)
        .await
        .context("connecting to the server given by --url")?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .subsec_nanos();
    let database = format!("sluice_bench_{}_{nanos:x}", std::process::id());
    let base = (args
        .url
        .split_once('?')
        .map_or(args.url.as_str(), |(u, _)| u))
    .rsplit_once('/')
    .map_or(args.url.as_str(), |(base, _)| base);
    let url = format!("{base}/{database}");
    let work = std::env::temp_dir().join(&database);
    conn.query_drop(format!("CREATE DATABASE {}", quote_ident(&database)))
        .await?;
    conn.query_drop(format!("USE {}", quote_ident(&database)))
        .await?;
    let mut bench = Bench {
        conn,
        url,
        work,
        args,
    };
    let result = bench.cases().await;
    let drop = format!("DROP DATABASE {}", quote_ident(&database));
    bench.conn.query_drop(drop).await?;
    let _ = std::fs::remove_dir_all(&bench.work);
    let (figures, checks) = result?;
    report(&bench.args, &figures);
    if !checks.is_empty() {
        bail!("the cases disagree: {}", checks.join("; "));
    }
    Ok(())
}

struct Bench {
    conn: Conn,
    /// The bench's own database on the server.
    url: String,
    /// Recovery logs of the pipelines.
    work: PathBuf,
    args: MysqlArgs,
}

/// The table of (b) and (c): the shape of (a)'s, keys compared byte for byte.
const PLAIN_TABLE: &str = "(user_id VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin \
     PRIMARY KEY, views BIGINT, bytes BIGINT, last_seen LONGTEXT, tags JSON)";

impl Bench {
    /// Runs the cases; returns the figures and the failed cross-checks.
    async fn cases(&mut self) -> anyhow::Result<(Figures, Vec<String>)> {
        let (a, a_rows) = self.sluice("a_sluice", false).await?;
        let (b, total_views) = self.bulk_loader("b_bulk").await?;
        let c = self.row_upserts("c_rows").await?;
        let (d, d_rows) = self.sluice("d_delta", true).await?;
        let copy = self.plain_load("d_delta", "d_copy").await?;
        let mut checks = Vec::new();
        let differing = self
            .one(
                "SELECT COUNT(*) FROM a_sluice a LEFT JOIN b_bulk b USING (user_id) \
                 WHERE b.user_id IS NULL OR NOT (a.views <=> b.views AND a.bytes <=> b.bytes \
                 AND a.last_seen <=> b.last_seen AND JSON_EQUALS(a.tags, b.tags) <=> 1)",
            )
            .await?;
        let b_rows = self.one("SELECT COUNT(*) FROM b_bulk").await?;
        if differing != 0 || b_rows != a_rows as i64 {
            checks.push(format!(
                "{differing} rows of (a) differ from (b); (a) has {a_rows} rows, (b) {b_rows}"
            ));
        }
        for (case, table) in [("a", "a_sluice"), ("d", "d_delta")] {
            let views = self
                .one(&format!(
                    "SELECT CAST(COALESCE(SUM(views), 0) AS SIGNED) FROM {table}"
                ))
                .await?;
            if views != total_views {
                checks.push(format!(
                    "({case}) holds {views} views, {total_views} were generated"
                ));
            }
        }
        let a = Case {
            note: format!("{a_rows} rows in the table, {}", a.note),
            ..a
        };
        let d = Case {
            note: format!("{d_rows} delta rows appended, {}", d.note),
            ..d
        };
        Ok((Figures { a, b, c, d, copy }, checks))
    }

    async fn one(&mut self, sql: &str) -> anyhow::Result<i64> {
        let value: Option<i64> = self.conn.query_first(sql).await.context(sql.to_owned())?;
        value.with_context(|| format!("{sql} returned no row"))
    }

    /// (a) and (d): the runtime, end to end, into `table`. Returns the case (documents
    /// read) and the rows the table holds.
    async fn sluice(&mut self, table: &str, delta: bool) -> anyhow::Result<(Case, u64)> {
        let yaml = pipeline_yaml(&self.args, &self.url, table, delta);
        let base = self.work.join(table);
        let pipeline = Pipeline::parse(&yaml, &base)?;
        let planned = pipeline::plan(&pipeline, &BenchConnect).await?;
        pipeline::apply(&planned, false).await?;
        let progress = Arc::new(Progress::default());
        let (_keep_running, shutdown) = tokio::sync::watch::channel(false);
        let start = Instant::now();
        let summaries = pipeline::run(
            &pipeline,
            planned,
            RunOptions::default(),
            progress,
            shutdown,
        )
        .await?;
        let elapsed = start.elapsed();
        let (docs, transactions) = summaries
            .iter()
            .fold((0, 0), |(d, t), (_, s)| (d + s.docs, t + s.transactions));
        ensure!(
            docs == self.args.docs,
            "({table}) read {docs} of {} documents",
            self.args.docs
        );
        let rows = self.one(&format!("SELECT COUNT(*) FROM {table}")).await?;
        let case = Case {
            items: docs,
            elapsed,
            note: format!("{transactions} transactions"),
        };
        Ok((case, rows as u64))
    }

    /// (b): LOAD DATA of every raw row, reduce in SQL. Returns the case and the
    /// generated views.
    async fn bulk_loader(&mut self, table: &str) -> anyhow::Result<(Case, i64)> {
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
        let total_views = self
            .load_generated("raw_views", |seq, doc, row| {
                writeln!(
                    row,
                    "{seq}\t{}\t{}\t{}\t{}\t{}",
                    doc["user_id"].as_str().unwrap_or_default(),
                    doc["views"],
                    doc["bytes"],
                    doc["last_seen"].as_str().unwrap_or_default(),
                    doc["tags"]
                )
            })
            .await?;
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
            items: self.args.docs,
            elapsed: start.elapsed(),
            note: "LOAD DATA into a temp table, one INSERT … SELECT".into(),
        };
        Ok((case, total_views))
    }

    /// (c): one single-row upsert per document, each its own round trip, a commit per
    /// 1,000.
    async fn row_upserts(&mut self, table: &str) -> anyhow::Result<Case> {
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
        let docs = self.args.row_docs.min(self.args.docs);
        let start = Instant::now();
        let mut seq = 0;
        while seq < docs {
            let batch: Vec<(String, i64, i64, String, String)> = (seq..docs
                .min(seq + ROW_BATCH as u64))
                .map(|seq| row_of(&document(SEED, self.args.keys, seq)))
                .collect();
            seq += batch.len() as u64;
            self.conn.query_drop("START TRANSACTION").await?;
            self.conn.exec_batch(&upsert, batch).await?;
            self.conn.query_drop("COMMIT").await?;
        }
        Ok(Case {
            items: docs,
            elapsed: start.elapsed(),
            note: format!("{docs} docs, batches of {ROW_BATCH}"),
        })
    }

    /// Streams one `LOAD DATA LOCAL` of every generated document into `table`, each
    /// written as a row by `row` (given the sequence number and the document), in
    /// chunks generated as the server reads them. Returns the generated views.
    async fn load_generated(
        &mut self,
        table: &str,
        row: impl Fn(u64, &Value, &mut String) -> std::fmt::Result + Send + Sync + 'static,
    ) -> anyhow::Result<i64> {
        let (docs, keys) = (self.args.docs, self.args.keys);
        let views = Arc::new(std::sync::atomic::AtomicI64::new(0));
        let counted = views.clone();
        let chunks = futures::stream::unfold(0u64, move |mut seq| {
            let mut chunk = String::with_capacity(INFILE_CHUNK + 4096);
            while seq < docs && chunk.len() < INFILE_CHUNK {
                let doc = document(SEED, keys, seq);
                let added = doc["views"].as_i64().unwrap_or_default();
                counted.fetch_add(added, std::sync::atomic::Ordering::Relaxed);
                let written = row(seq, &doc, &mut chunk).map_err(std::io::Error::other);
                if let Err(err) = written {
                    return futures::future::ready(Some((Err(err), docs)));
                }
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
        Ok(views.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The baseline of (d): the N generated documents loaded as rows of a table shaped
    /// like (d)'s (same columns, the document's JSON text included), generation timed.
    async fn plain_load(&mut self, like: &str, table: &str) -> anyhow::Result<Case> {
        let columns: Vec<String> = self
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
        let start = Instant::now();
        self.load_generated(table, move |_, doc, row| {
            for (i, column) in columns.iter().enumerate() {
                let value = match (column.as_str(), doc.get(column)) {
                    ("flow_document", _) => doc.to_string(),
                    (_, Some(Value::String(s))) => s.clone(),
                    (_, Some(v)) => v.to_string(),
                    (_, None) => "\\N".to_owned(),
                };
                let separator = if i + 1 == columns.len() { '\n' } else { '\t' };
                write!(row, "{value}{separator}")?;
            }
            Ok(())
        })
        .await?;
        Ok(Case {
            items: self.args.docs,
            elapsed: start.elapsed(),
            note: format!("{} generated documents as rows", self.args.docs),
        })
    }
}

/// The columns of one generated document for the row-by-row upsert.
fn row_of(doc: &Value) -> (String, i64, i64, String, String) {
    (
        doc["user_id"].as_str().unwrap_or_default().to_owned(),
        doc["views"].as_i64().unwrap_or_default(),
        doc["bytes"].as_i64().unwrap_or_default(),
        doc["last_seen"].as_str().unwrap_or_default().to_owned(),
        doc["tags"].to_string(),
    )
}

/// The pipeline of (a) (or, with `delta`, (d)): datagen into `table` of the database
/// at `url`.
fn pipeline_yaml(args: &MysqlArgs, url: &str, table: &str, delta: bool) -> String {
    let endpoint = json!({ "url": url });
    format!(
        r#"
collections:
  bench/pageviews:
    key: [/user_id]
    schema:
      type: object
      required: [user_id, views, bytes, last_seen]
      reduce: {{strategy: merge}}
      properties:
        user_id: {{type: string}}
        views: {{type: integer, reduce: {{strategy: sum}}}}
        bytes: {{type: integer, reduce: {{strategy: sum}}}}
        last_seen: {{type: string, format: date-time, reduce: {{strategy: maximize}}}}
        tags: {{type: object, additionalProperties: {{type: string}}}}
sources:
  gen:
    target: bench/pageviews
    datagen: {{seed: {SEED}, documents: {docs}, keys: {keys}, shape: pageviews}}
materializations:
  bench-{table}:
    endpoint:
      mysql: {endpoint}
    bindings:
      - source: bench/pageviews
        resource: {{table: {table}}}
        delta_updates: {delta}
"#,
        docs = args.docs,
        keys = args.keys,
    )
}

/// Connects the bench's pipelines: MariaDB/MySQL only, in process.
struct BenchConnect;

#[async_trait]
impl Connect for BenchConnect {
    async fn connect(
        &self,
        materialization: &str,
        endpoint: &Endpoint,
    ) -> Result<Connected, String> {
        let Endpoint::Mysql { url } = endpoint else {
            return Err("the bench connects only mysql endpoints".into());
        };
        Ok(Connected {
            endpoint: Arc::new(InProcess::new(
                materialization,
                Arc::new(MysqlDriver::new()),
            )),
            endpoint_type: EndpointType::SluiceMysql,
            config: json!({ "url": url }),
        })
    }
}

fn report(args: &MysqlArgs, f: &Figures) {
    let ratio = |x: &Case, y: &Case| x.per_sec() / y.per_sec();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    if args.json {
        let out = json!({
            "docs": args.docs,
            "keys": args.keys,
            "row_docs": f.c.items,
            "cores": cores,
            "a_docs_per_sec": f.a.per_sec(),
            "b_docs_per_sec": f.b.per_sec(),
            "c_docs_per_sec": f.c.per_sec(),
            "d_rows_per_sec": f.d.per_sec(),
            "copy_rows_per_sec": f.copy.per_sec(),
            "ratio_a_b": ratio(&f.a, &f.b),
            "ratio_a_c": ratio(&f.a, &f.c),
            "ratio_d_copy": ratio(&f.d, &f.copy),
        });
        println!("{out}");
        return;
    }
    println!(
        "MariaDB/MySQL bench: {} documents, {} keys, {cores} cores",
        args.docs, args.keys
    );
    let line = |name: &str, c: &Case, unit: &str| {
        println!(
            "{name:<34} {:>12.0} {unit}/s  {:>8.2} s  ({})",
            c.per_sec(),
            c.elapsed.as_secs_f64(),
            c.note
        )
    };
    line("(a) Sluice, standard", &f.a, "docs");
    line("(b) LOAD DATA + INSERT … SELECT", &f.b, "docs");
    line("(c) row upserts, one by one", &f.c, "docs");
    line("(d) Sluice, delta updates", &f.d, "rows");
    line("    LOAD DATA of the same input rows", &f.copy, "rows");
    println!(
        "a/b = {:.2} (target ≥ 1.0)   a/c = {:.2} (target ≥ 3)   d/LOAD DATA = {:.2} (target ≥ 0.8)",
        ratio(&f.a, &f.b),
        ratio(&f.a, &f.c),
        ratio(&f.d, &f.copy)
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn the_bench_pipeline_parses() {
        let args = MysqlArgs {
            docs: 10,
            keys: 3,
            row_docs: 5,
            url: "mysql://root@127.0.0.1:3306/test".into(),
            json: false,
        };
        for delta in [false, true] {
            let yaml = pipeline_yaml(&args, &args.url, "t", delta);
            let pipeline = Pipeline::parse(&yaml, Path::new("/tmp")).unwrap();
            assert_eq!(
                pipeline.materializations["bench-t"].bindings[0].delta_updates,
                delta
            );
        }
    }
}
