//! `sluice bench cdc`: change data capture from PostgreSQL against reading the same rows
//! from a file, in one run of the bench, on a private cluster with `wal_level=logical`
//! (the shared server runs `replica`), which holds both the source table and the
//! store's schema:
//!
//! ```text
//!  sluice run --follow (postgres_cdc of src.events ─▶ table bench.cdc), streaming
//!  loader task: N rows, INSERT … SELECT generate_series in batches (a transaction each)
//!  sampler task: (time, upstream's written position, its confirmed position) every 50 ms
//!  then: the same rows as JSON lines (with the same _meta) ─▶ sluice run ─▶ bench.file
//! ```
//!
//! The machinery is generic over the [`Upstream`] database: `sluice bench mysql-cdc`
//! (`mysql_cdc.rs`) runs the same measurement with a private MariaDB as the
//! source and a private PostgreSQL as the store.
//!
//! Figures:
//! - `cdc_rows_per_sec`: N over the time from the load's start until the store holds
//!   all N rows (the loader is faster than Sluice here, so this is Sluice's rate);
//! - `file_rows_per_sec`: N over the file run, start to exit; `ratio` = cdc / file;
//! - `lag_p99_ms`: for each sample, how long ago the upstream first reached the
//!   position now confirmed: the time from a source commit until the store's commit of
//!   it is durable, p99 over the samples taken while the load runs and until the store
//!   caught up. PostgreSQL's positions are the WAL's and the slot's confirmed flush (the
//!   slot confirms only after the store's commit); where the upstream confirms nothing
//!   (a MariaDB replica), they are the rows the loader committed and the greatest id
//!   the store holds (ids are loaded in order, and a store transaction is a prefix).
//!
//! Both tables are checked: one row per id and every generated view.

use super::loads::sluice_run;
use anyhow::{Context, bail, ensure};
use serde_json::json;
use sluice_testkit::postgres::LogicalPostgres;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio_postgres::{Client, NoTls};

#[derive(clap::Args)]
pub struct CdcArgs {
    /// Rows inserted into the source table.
    #[arg(long, default_value_t = 1_000_000)]
    rows: u64,
    /// Rows per INSERT (one transaction each).
    #[arg(long, default_value_t = 1_000)]
    batch: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

/// How often the lag is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(50);
/// How long the store may take to catch up after the load before the bench fails.
const CATCH_UP: Duration = Duration::from_secs(600);

/// The database the changes come from: it holds table `src.events (id, user_id, views,
/// bytes, last_seen)`, which its source captures into the store (PostgreSQL, schema
/// `bench`).
#[async_trait::async_trait]
pub trait Upstream: Send + Sync + Sized {
    /// The bench's name (its folder's, its text's).
    const NAME: &'static str;
    /// The source database, as the report describes it.
    const DESCRIPTION: &'static str;
    /// Starts the private servers, the source table created, the store's schema
    /// `bench` too.
    async fn start() -> anyhow::Result<Self>;
    /// The PostgreSQL URL of the store.
    fn store_url(&self) -> String;
    /// The pipeline's source (YAML flow style).
    fn source_yaml(&self) -> String;
    /// Whether the source streams changes yet.
    async fn streaming(&self) -> anyhow::Result<bool>;
    /// Inserts rows `first..=last` in one transaction (see [`load`] for the values).
    async fn insert(&self, first: u64, last: u64) -> anyhow::Result<()>;
    /// (written, confirmed): the upstream's position and the one the store has
    /// durably, in one order (see the module docs). `loaded`: the rows the loader
    /// committed; `store`: a connection to the store.
    async fn sample(&self, loaded: u64, store: &Client) -> anyhow::Result<(u64, u64)>;
    /// The source table's rows as the documents the source makes of them (with the
    /// same `_meta`), one JSON line each, in id order.
    async fn write_lines(&self, path: &Path) -> anyhow::Result<()>;
}

/// PostgreSQL with `wal_level=logical`, the source and the store in one cluster.
pub struct Postgres {
    server: LogicalPostgres,
    client: Client,
}

/// The replication slot `postgres_cdc` makes for materialization `bench-cdc`.
const SLOT: &str = "sluice_bench_cdc_events";

#[async_trait::async_trait]
impl Upstream for Postgres {
    const NAME: &'static str = "cdc";
    const DESCRIPTION: &'static str = "PostgreSQL (wal_level=logical)";

    async fn start() -> anyhow::Result<Self> {
        let server = tokio::task::block_in_place(LogicalPostgres::start);
        let client = connect(&server.url()).await?;
        client
            .batch_execute(
                "CREATE SCHEMA src; CREATE SCHEMA bench;
                 CREATE TABLE src.events (id bigint PRIMARY KEY, user_id text NOT NULL,
                   views int NOT NULL, bytes bigint NOT NULL, last_seen timestamptz NOT NULL);",
            )
            .await?;
        Ok(Postgres { server, client })
    }

    fn store_url(&self) -> String {
        self.server.url()
    }

    fn source_yaml(&self) -> String {
        format!(
            "postgres_cdc: {{url: {}, tables: [src.events]}}",
            json!(self.server.url())
        )
    }

    async fn streaming(&self) -> anyhow::Result<bool> {
        let active = self
            .client
            .query(
                "SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND active",
                &[&SLOT],
            )
            .await?;
        Ok(!active.is_empty())
    }

    async fn insert(&self, first: u64, last: u64) -> anyhow::Result<()> {
        self.client
            .batch_execute(&format!(
                "INSERT INTO src.events SELECT g, 'user' || (g % 200000), 1 + g % 9, g % 5000, \
                 clock_timestamp() FROM generate_series({first}, {last}) g"
            ))
            .await?;
        Ok(())
    }

    async fn sample(&self, _loaded: u64, store: &Client) -> anyhow::Result<(u64, u64)> {
        let row = store
            .query_one(
                "SELECT (pg_current_wal_lsn() - '0/0')::bigint, \
                 (coalesce(confirmed_flush_lsn, '0/0') - '0/0')::bigint \
                 FROM pg_replication_slots WHERE slot_name = $1",
                &[&SLOT],
            )
            .await?;
        let (current, confirmed): (i64, i64) = (row.get(0), row.get(1));
        Ok((current as u64, confirmed as u64))
    }

    async fn write_lines(&self, path: &Path) -> anyhow::Result<()> {
        use futures::StreamExt;
        use std::io::Write;
        let copy = self
            .client
            .copy_out(
                "COPY (SELECT json_build_object('_meta', json_build_object('op', 'c', 'lsn', 0, \
                 'source', json_build_object('schema', 'src', 'table', 'events')), 'id', id, \
                 'user_id', user_id, 'views', views, 'bytes', bytes, 'last_seen', last_seen) \
                 FROM src.events ORDER BY id) TO STDOUT",
            )
            .await?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
        let mut copy = std::pin::pin!(copy);
        while let Some(chunk) = copy.next().await {
            out.write_all(&chunk?)?;
        }
        out.flush()?;
        Ok(())
    }
}

/// Runs the bench of `U` on a runtime of its own.
pub fn run_with<U: Upstream + 'static>(args: CdcArgs) -> anyhow::Result<()> {
    ensure!(
        args.rows > 0 && args.batch > 0,
        "--rows and --batch must be at least 1"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(bench::<U>(&args))
}

pub fn run(args: CdcArgs) -> anyhow::Result<()> {
    run_with::<Postgres>(args)
}

struct Figures {
    cdc_secs: f64,
    file_secs: f64,
    lag_p99_ms: f64,
    samples: usize,
}

pub(crate) async fn connect(url: &str) -> anyhow::Result<Client> {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .with_context(|| format!("connecting to {url}"))?;
    tokio::spawn(connection);
    Ok(client)
}

fn progress(args: &CdcArgs, line: String) {
    if !args.json {
        eprintln!("{line}");
    }
}

async fn bench<U: Upstream + 'static>(args: &CdcArgs) -> anyhow::Result<()> {
    progress(args, format!("starting a private {}", U::DESCRIPTION));
    let upstream = Arc::new(U::start().await?);
    let work =
        std::env::temp_dir().join(format!("sluice-bench-{}-{}", U::NAME, std::process::id()));
    std::fs::create_dir_all(&work)?;
    let figures = measure(args, &upstream, &work).await;
    let _ = std::fs::remove_dir_all(&work);
    report::<U>(args, &figures?);
    Ok(())
}

async fn measure<U: Upstream + 'static>(
    args: &CdcArgs,
    upstream: &Arc<U>,
    work: &Path,
) -> anyhow::Result<Figures> {
    let url = upstream.store_url();
    let store = connect(&url).await?;
    let cdc = work.join("cdc.yaml");
    std::fs::write(&cdc, pipeline_yaml(&url, "cdc", &upstream.source_yaml()))?;
    let log = std::fs::File::create(work.join("cdc.log"))?;
    let mut child = Command::new(sluice_app::sibling::sibling("sluice")?)
        .args(["run", "--follow"])
        .arg(&cdc)
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(log.try_clone()?)
        .stderr(log)
        .stdin(Stdio::null())
        .spawn()
        .context("starting sluice run --follow")?;
    let result = follow(args, upstream, &store, &mut child).await;
    let _ = child.kill();
    let _ = child.wait();
    let (cdc_secs, lag_p99_ms, samples) = result.map_err(|e| {
        let log = std::fs::read_to_string(work.join("cdc.log")).unwrap_or_default();
        e.context(format!("the CDC run's log:\n{log}"))
    })?;
    check(&store, "cdc", args.rows).await?;

    progress(args, "writing the same rows as JSON lines".into());
    let input = work.join("events.jsonl");
    upstream.write_lines(&input).await?;
    let file = work.join("file.yaml");
    let source = format!(
        "file: {{path: {}, format: json}}",
        json!(input.to_string_lossy())
    );
    std::fs::write(&file, pipeline_yaml(&url, "file", &source))?;
    progress(args, "file: sluice run into PostgreSQL".into());
    let run = tokio::task::block_in_place(|| sluice_run(&file, &work.join("file.log")))?;
    check(&store, "file", args.rows).await?;
    Ok(Figures {
        cdc_secs,
        file_secs: run.elapsed.as_secs_f64(),
        lag_p99_ms,
        samples,
    })
}

/// Waits for the stream, loads the rows while sampling the lag, and waits for the store
/// to hold them all: (seconds from the load's start, lag p99 in ms, samples).
async fn follow<U: Upstream + 'static>(
    args: &CdcArgs,
    upstream: &Arc<U>,
    store: &Client,
    child: &mut std::process::Child,
) -> anyhow::Result<(f64, f64, usize)> {
    let started = Instant::now();
    while !upstream.streaming().await? {
        if let Some(status) = child.try_wait()? {
            bail!("sluice run --follow exited ({status}) before streaming");
        }
        ensure!(
            started.elapsed() < Duration::from_secs(120),
            "the CDC run did not start streaming"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    progress(
        args,
        format!(
            "cdc: inserting {} rows in batches of {}",
            args.rows, args.batch
        ),
    );
    let load_start = Instant::now();
    let loaded = Arc::new(AtomicU64::new(0));
    let mut loader = tokio::spawn(load(
        upstream.clone(),
        args.rows,
        args.batch,
        loaded.clone(),
    ));
    let mut samples: Vec<(Instant, u64, u64)> = Vec::new();
    let mut finished = false;
    let mut complete = None;
    while complete.is_none() {
        let (written, confirmed) = upstream
            .sample(loaded.load(Ordering::Acquire), store)
            .await?;
        samples.push((Instant::now(), written, confirmed));
        if !finished && loader.is_finished() {
            finished = true;
            (&mut loader).await?.context("loading the source table")?;
            progress(
                args,
                format!(
                    "cdc: loaded in {:.2} s; waiting for the store",
                    load_start.elapsed().as_secs_f64()
                ),
            );
        }
        if finished {
            let count: i64 = store
                .query_one("SELECT count(*) FROM bench.cdc", &[])
                .await
                .map(|r| r.get(0))
                .unwrap_or(0);
            if count as u64 >= args.rows {
                complete = Some(load_start.elapsed());
            }
        }
        if let Some(status) = child.try_wait()? {
            bail!("sluice run --follow exited ({status}) while following");
        }
        ensure!(
            load_start.elapsed() < CATCH_UP,
            "the store did not catch up within {CATCH_UP:?}"
        );
        tokio::time::sleep(SAMPLE_EVERY).await;
    }
    let lags = lags(&samples);
    let secs = complete.expect("the loop ends once complete").as_secs_f64();
    progress(
        args,
        format!("cdc: {secs:.2} s, {:.0} rows/s", args.rows as f64 / secs),
    );
    Ok((secs, percentile(lags.clone(), 0.99), lags.len()))
}

/// Per sample: how long before it the upstream first reached the confirmed position
/// (0 when it has confirmed everything written).
fn lags(samples: &[(Instant, u64, u64)]) -> Vec<f64> {
    samples
        .iter()
        .map(|&(at, current, confirmed)| {
            if confirmed >= current {
                return 0.0;
            }
            let reached = samples
                .iter()
                .find(|(_, c, _)| *c >= confirmed)
                .map_or(samples[0].0, |s| s.0);
            at.saturating_duration_since(reached).as_secs_f64() * 1000.0
        })
        .collect()
}

fn percentile(mut values: Vec<f64>, p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.sort_by(f64::total_cmp);
    values[((values.len() as f64 * p).ceil() as usize).clamp(1, values.len()) - 1]
}

/// The load: `rows` rows in INSERTs of `batch`, each its own transaction, row `g`
/// being (g, 'user' || g % 200000, 1 + g % 9, g % 5000, the time); `loaded` counts the
/// rows committed.
async fn load<U: Upstream>(
    upstream: Arc<U>,
    rows: u64,
    batch: u64,
    loaded: Arc<AtomicU64>,
) -> anyhow::Result<()> {
    let mut first = 1;
    while first <= rows {
        let last = (first + batch - 1).min(rows);
        upstream.insert(first, last).await?;
        loaded.store(last, Ordering::Release);
        first = last + 1;
    }
    Ok(())
}

/// The pipeline from `source` into table `bench.<table>`.
fn pipeline_yaml(url: &str, table: &str, source: &str) -> String {
    format!(
        r#"
collections:
  bench/events:
    key: [/id]
    schema:
      type: object
      required: [id, user_id, views, bytes, last_seen]
      properties:
        id: {{type: integer}}
        user_id: {{type: string}}
        views: {{type: integer}}
        bytes: {{type: integer}}
        last_seen: {{type: string}}
sources:
  events:
    target: bench/events
    {source}
materializations:
  bench-{table}:
    endpoint: {{postgres: {{url: {url}, schema: bench}}}}
    bindings:
      - source: bench/events
        resource: {{table: {table}}}
"#,
        url = json!(url),
    )
}

/// Fails unless `bench.<table>` holds one row per id and every view.
async fn check(client: &Client, table: &str, rows: u64) -> anyhow::Result<()> {
    let row = client
        .query_one(
            &format!("SELECT count(*), count(DISTINCT id), coalesce(sum(views), 0)::bigint FROM bench.{table}"),
            &[],
        )
        .await?;
    let (count, distinct, views): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
    let expected: i64 = (1..=rows as i64).map(|g| 1 + g % 9).sum();
    ensure!(
        count as u64 == rows && distinct == count && views == expected,
        "table bench.{table} holds {count} rows ({distinct} ids) and {views} views, wanted {rows} and {expected}"
    );
    Ok(())
}

fn report<U: Upstream>(args: &CdcArgs, f: &Figures) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cdc = args.rows as f64 / f.cdc_secs.max(1e-9);
    let file = args.rows as f64 / f.file_secs.max(1e-9);
    if args.json {
        let figures = json!({
            "rows": args.rows,
            "batch": args.batch,
            "cores": cores,
            "cdc_secs": f.cdc_secs,
            "file_secs": f.file_secs,
            "cdc_rows_per_sec": cdc,
            "file_rows_per_sec": file,
            "ratio": cdc / file,
            "lag_p99_ms": f.lag_p99_ms,
            "lag_samples": f.samples,
        });
        println!("{figures}");
        return;
    }
    println!(
        "{} rows inserted in batches of {} into {}, materialized into PostgreSQL, {cores} cores",
        args.rows,
        args.batch,
        U::DESCRIPTION
    );
    println!(
        "  cdc  {:>7.2} s  {cdc:>9.0} rows/s (from the load's start to the last row stored)",
        f.cdc_secs
    );
    println!("  file {:>7.2} s  {file:>9.0} rows/s", f.file_secs);
    println!(
        "  ratio {:.2} (cdc over file), replication lag p99 {:.0} ms over {} samples",
        cdc / file,
        f.lag_p99_ms,
        f.samples
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_is_how_long_ago_the_wal_reached_the_confirmed_position() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let samples = [
            (at(0), 100, 100),
            (at(50), 200, 100),
            (at(100), 300, 200),
            (at(150), 300, 300),
        ];
        assert_eq!(lags(&samples), [0.0, 50.0, 50.0, 0.0]);
        assert_eq!(percentile(vec![1.0, 2.0, 3.0, 4.0], 0.5), 2.0);
    }
}
