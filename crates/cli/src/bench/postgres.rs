//! `sluice bench postgres`: Sluice into PostgreSQL against what a user would write by
//! hand, in one process, against one server, each case in a fresh table of a schema of
//! the bench's own (dropped at the end).
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
//! All cases read the same deterministic documents (`datagen::document`, the source of
//! (a) and (d)): `{user_id, views: sum, bytes: sum, last_seen: maximize (date-time),
//! tags: last write wins}`. Generating them is inside every timed span, as reading the
//! input would be; DDL is outside. The generated strings hold no tab, newline or
//! backslash, so the hand-written COPY rows need no escaping. After the run, (a)'s
//! table must equal (b)'s row for row, and (a) and (d) must add up to the generated
//! views: a mismatch fails the command after the figures are printed.
//!
//! Note on (c): tokio-postgres sends one Sync per statement where pgjdbc's
//! `executeBatch` sends one per batch; both pipeline the batch in one round trip.

use anyhow::{Context, bail, ensure};
use async_trait::async_trait;
use futures::SinkExt;
use serde_json::{Value, json};
use sluice_driver::inprocess::InProcess;
use sluice_postgres::PostgresDriver;
use sluice_postgres::sql::{qualify, quote_ident};
use sluice_proto::flow::EndpointType;
use sluice_runtime::config::{Endpoint, Pipeline};
use sluice_runtime::pipeline::{self, Connect, Connected, RunOptions};
use sluice_runtime::source::datagen::document;
use sluice_runtime::txn::Progress;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls};

/// The generator's seed, shared by every case.
const SEED: u64 = 7;
/// Statements per pipelined batch of (c).
const ROW_BATCH: usize = 1_000;
/// Bytes of COPY data per message sent to the server.
const COPY_CHUNK: usize = 1 << 20;

#[derive(clap::Args)]
pub struct PostgresArgs {
    /// Documents to generate.
    #[arg(long, default_value_t = 1_000_000)]
    docs: u64,
    /// Distinct keys among them.
    #[arg(long, default_value_t = 200_000)]
    keys: u64,
    /// Documents of the row-by-row case (c), the first of the N.
    #[arg(long, default_value_t = 100_000)]
    row_docs: u64,
    /// The server (its `test` database must exist).
    #[arg(long, default_value = "postgres://postgres@127.0.0.1:5432/test")]
    url: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: PostgresArgs) -> anyhow::Result<()> {
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

async fn bench(args: PostgresArgs) -> anyhow::Result<()> {
    let (client, connection) = tokio_postgres::connect(&args.url, NoTls)
        .await
        .context("connecting to the server given by --url")?;
    tokio::spawn(connection);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .subsec_nanos();
    let schema = format!("sluice_bench_{}_{nanos:x}", std::process::id());
    let work = std::env::temp_dir().join(&schema);
    client
        .batch_execute(&format!("CREATE SCHEMA {}", quote_ident(&schema)))
        .await?;
    let bench = Bench {
        client,
        schema,
        work,
        args,
    };
    let result = bench.cases().await;
    let drop = format!("DROP SCHEMA {} CASCADE", quote_ident(&bench.schema));
    bench.client.batch_execute(&drop).await?;
    let _ = std::fs::remove_dir_all(&bench.work);
    let (figures, checks) = result?;
    report(&bench.args, &figures);
    if !checks.is_empty() {
        bail!("the cases disagree: {}", checks.join("; "));
    }
    Ok(())
}

struct Bench {
    client: Client,
    schema: String,
    /// Recovery logs of the pipelines.
    work: PathBuf,
    args: PostgresArgs,
}

impl Bench {
    fn table(&self, name: &str) -> String {
        qualify(&self.schema, name)
    }

    /// Runs the cases; returns the figures and the failed cross-checks.
    async fn cases(&self) -> anyhow::Result<(Figures, Vec<String>)> {
        let (a, a_rows) = self.sluice("a_sluice", false).await?;
        let (b, total_views) = self.bulk_loader("b_bulk").await?;
        let c = self.row_upserts("c_rows").await?;
        let (d, d_rows) = self.sluice("d_delta", true).await?;
        let copy = self.plain_copy("d_delta", "d_copy").await?;
        let mut checks = Vec::new();
        let differing: i64 = self
            .one(&format!(
                "SELECT count(*) FROM {} a FULL JOIN {} b USING (user_id) \
                 WHERE a.views IS DISTINCT FROM b.views OR a.bytes IS DISTINCT FROM b.bytes \
                 OR a.last_seen IS DISTINCT FROM b.last_seen OR a.tags IS DISTINCT FROM b.tags",
                self.table("a_sluice"),
                self.table("b_bulk")
            ))
            .await?;
        if differing != 0 {
            checks.push(format!("{differing} rows of (a) and (b) differ"));
        }
        for (case, table) in [("a", "a_sluice"), ("d", "d_delta")] {
            let views: i64 = self
                .one(&format!(
                    "SELECT coalesce(sum(views), 0)::bigint FROM {}",
                    self.table(table)
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

    async fn one(&self, sql: &str) -> anyhow::Result<i64> {
        let row = self
            .client
            .query_one(sql, &[])
            .await
            .context(sql.to_owned())?;
        Ok(row.get(0))
    }

    /// (a) and (d): the runtime, end to end, into `table`. Returns the case (documents
    /// read) and the rows the table holds.
    async fn sluice(&self, table: &str, delta: bool) -> anyhow::Result<(Case, u64)> {
        let yaml = pipeline_yaml(&self.args, &self.schema, table, delta);
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
        let rows = self
            .one(&format!("SELECT count(*) FROM {}", self.table(table)))
            .await?;
        let case = Case {
            items: docs,
            elapsed,
            note: format!("{transactions} transactions"),
        };
        Ok((case, rows as u64))
    }

    /// (b): COPY every raw row, reduce in SQL. Returns the case and the generated views.
    async fn bulk_loader(&self, table: &str) -> anyhow::Result<(Case, i64)> {
        let target = self.table(table);
        self.client
            .batch_execute(&format!(
                "CREATE TABLE {target} (user_id text PRIMARY KEY, views bigint, bytes bigint, \
                 last_seen timestamptz, tags jsonb)"
            ))
            .await?;
        let start = Instant::now();
        self.client
            .batch_execute(
                "BEGIN; CREATE TEMPORARY TABLE raw_views (seq bigint, user_id text, \
                 views bigint, bytes bigint, last_seen timestamptz, tags jsonb) ON COMMIT DROP",
            )
            .await?;
        let mut total_views = 0i64;
        self.copy_generated("COPY raw_views FROM STDIN", |seq, doc, row| {
            total_views += doc["views"].as_i64().unwrap_or_default();
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
            items: self.args.docs,
            elapsed: start.elapsed(),
            note: "COPY into a temp table, one INSERT … SELECT".into(),
        };
        Ok((case, total_views))
    }

    /// (c): one single-row upsert per document, pipelined 1,000 to a batch.
    async fn row_upserts(&self, table: &str) -> anyhow::Result<Case> {
        let target = self.table(table);
        self.client
            .batch_execute(&format!(
                "CREATE TABLE {target} (user_id text PRIMARY KEY, views bigint, bytes bigint, \
                 last_seen timestamptz, tags jsonb)"
            ))
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
        let docs = self.args.row_docs.min(self.args.docs);
        let start = Instant::now();
        let mut seq = 0;
        while seq < docs {
            let batch: Vec<(String, i64, i64, String, String)> = (seq..docs
                .min(seq + ROW_BATCH as u64))
                .map(|seq| row_of(&document(SEED, self.args.keys, seq)))
                .collect();
            seq += batch.len() as u64;
            self.client.batch_execute("BEGIN").await?;
            let statements = batch.iter().map(|(user, views, bytes, seen, tags)| {
                let params: [&(dyn ToSql + Sync); 5] = [user, views, bytes, seen, tags];
                self.client.execute_raw(&upsert, params)
            });
            futures::future::try_join_all(statements).await?;
            self.client.batch_execute("COMMIT").await?;
        }
        Ok(Case {
            items: docs,
            elapsed: start.elapsed(),
            note: format!("{docs} docs, batches of {ROW_BATCH}"),
        })
    }

    /// Streams one COPY of every generated document, each written as a text-format
    /// row by `row` (given the sequence number and the document).
    async fn copy_generated(
        &self,
        copy: &str,
        mut row: impl FnMut(u64, &Value, &mut String) -> std::fmt::Result,
    ) -> anyhow::Result<()> {
        let sink = self.client.copy_in::<_, bytes::Bytes>(copy).await?;
        futures::pin_mut!(sink);
        let mut chunk = String::with_capacity(COPY_CHUNK + 4096);
        for seq in 0..self.args.docs {
            row(seq, &document(SEED, self.args.keys, seq), &mut chunk)?;
            if chunk.len() >= COPY_CHUNK {
                sink.send(bytes::Bytes::from(std::mem::take(&mut chunk)))
                    .await?;
            }
        }
        sink.send(bytes::Bytes::from(chunk)).await?;
        sink.finish().await?;
        Ok(())
    }

    /// The baseline of (d): the N generated documents COPYed as rows of a table shaped
    /// like (d)'s (same columns, the document's JSON text included), generation timed.
    async fn plain_copy(&self, like: &str, table: &str) -> anyhow::Result<Case> {
        let (source, target) = (self.table(like), self.table(table));
        let columns: Vec<String> = self
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
        self.client
            .batch_execute(&format!("CREATE TABLE {target} (LIKE {source})"))
            .await?;
        let start = Instant::now();
        self.copy_generated(&format!("COPY {target} FROM STDIN"), |_, doc, row| {
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

/// The pipeline of (a) (or, with `delta`, (d)): datagen into `schema.table`.
fn pipeline_yaml(args: &PostgresArgs, schema: &str, table: &str, delta: bool) -> String {
    let endpoint = json!({ "url": args.url, "schema": schema });
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
      postgres: {endpoint}
    bindings:
      - source: bench/pageviews
        resource: {{table: {table}}}
        delta_updates: {delta}
"#,
        docs = args.docs,
        keys = args.keys,
    )
}

/// Connects the bench's pipelines: PostgreSQL only, in process.
struct BenchConnect;

#[async_trait]
impl Connect for BenchConnect {
    async fn connect(
        &self,
        materialization: &str,
        endpoint: &Endpoint,
    ) -> Result<Connected, String> {
        let Endpoint::Postgres { url, schema } = endpoint else {
            return Err("the bench connects only postgres endpoints".into());
        };
        Ok(Connected {
            endpoint: Arc::new(InProcess::new(
                materialization,
                Arc::new(PostgresDriver::new()),
            )),
            endpoint_type: EndpointType::SluicePostgres,
            config: json!({ "url": url, "schema": schema }),
        })
    }
}

fn report(args: &PostgresArgs, f: &Figures) {
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
        "PostgreSQL bench: {} documents, {} keys, {cores} cores",
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
    line("(b) COPY + INSERT … SELECT", &f.b, "docs");
    line("(c) row upserts, pipelined", &f.c, "docs");
    line("(d) Sluice, delta updates", &f.d, "rows");
    line("    COPY of the same input rows", &f.copy, "rows");
    println!(
        "a/b = {:.2} (target ≥ 1.0)   a/c = {:.2} (target ≥ 3)   d/COPY = {:.2} (target ≥ 0.8)",
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
        let args = PostgresArgs {
            docs: 10,
            keys: 3,
            row_docs: 5,
            url: "postgres://postgres@127.0.0.1:5432/test".into(),
            json: false,
        };
        for delta in [false, true] {
            let yaml = pipeline_yaml(&args, "s", "t", delta);
            let pipeline = Pipeline::parse(&yaml, Path::new("/tmp")).unwrap();
            assert_eq!(
                pipeline.materializations["bench-t"].bindings[0].delta_updates,
                delta
            );
        }
    }
}
