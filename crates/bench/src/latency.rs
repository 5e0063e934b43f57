//! `sluice bench latency`: how long one document of a trickle takes from its source to
//! a visible row, end to end through `sluice run --follow`.
//!
//! ```text
//!  sluice run --follow (child) ◀── source: one document every --interval-ms
//!        │                            t0: just before the append / publish
//!        ▼
//!  store table ── polled for the document's key ──▶ t1: first seen; latency = t1 - t0
//! ```
//!
//! The document goes in by the source's own path (appended to a followed file,
//! produced to a Kafka topic, published to a NATS stream), and "visible" is a query of
//! the store by a separate connection, as a user's reader would see it. The store is
//! polled every `--poll-us`, which bounds the figures' resolution. A first document
//! waits for the pipeline to start (applied, sources opened); the samples follow it.
//! Figures: `p50_ms`, `p90_ms`, `p99_ms` and `max_ms` over `--samples` documents.

use anyhow::{Context, bail, ensure};
use serde_json::json;
use sluice_postgres::sql::quote_ident;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct LatencyArgs {
    /// Where the documents come from.
    #[arg(long, value_enum, default_value = "file")]
    source: SourceKind,
    /// Where they become visible.
    #[arg(long, value_enum, default_value = "sqlite")]
    store: StoreKind,
    /// Documents measured.
    #[arg(long, default_value_t = 200)]
    samples: usize,
    /// Pause between two documents: a trickle, each one alone in its transaction.
    #[arg(long, default_value_t = 50)]
    interval_ms: u64,
    /// How often the store is queried for the document (microseconds).
    #[arg(long, default_value_t = 200)]
    poll_us: u64,
    /// The PostgreSQL server of `--store postgres` (a schema of a unique name is
    /// created, then dropped).
    #[arg(
        long,
        default_value = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
    )]
    url: String,
    /// The broker of `--source kafka` (a one-partition topic of a unique name is created,
    /// and left: tansu cannot delete topics reliably).
    #[arg(long, default_value = "127.0.0.1:9092")]
    brokers: String,
    /// The Kafka source's `fetch_wait` (tansu holds each fetch this long).
    #[arg(long, default_value = "10ms")]
    fetch_wait: String,
    /// The NATS server of `--source nats` (a stream of a unique name is created, then
    /// deleted).
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Keep the bench's folder (pipeline, input, recovery log, the run's log).
    #[arg(long)]
    keep: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum SourceKind {
    File,
    Kafka,
    Nats,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum StoreKind {
    Sqlite,
    Postgres,
}

impl SourceKind {
    fn name(self) -> &'static str {
        match self {
            SourceKind::File => "file",
            SourceKind::Kafka => "kafka",
            SourceKind::Nats => "nats",
        }
    }
}

impl StoreKind {
    fn name(self) -> &'static str {
        match self {
            StoreKind::Sqlite => "sqlite",
            StoreKind::Postgres => "postgres",
        }
    }
}

/// Where the bench's documents go in.
enum Input {
    File(std::fs::File),
    Kafka {
        admin: Box<sluice_kafka::admin::Admin>,
        topic: String,
    },
    Nats {
        admin: Box<sluice_nats::admin::Admin>,
        stream: String,
    },
}

impl Input {
    /// Opens where documents go in, and the pipeline's source that reads them.
    async fn open(args: &LatencyArgs, work: &Path, name: &str) -> anyhow::Result<(Input, String)> {
        match args.source {
            SourceKind::Kafka => {
                let brokers = vec![args.brokers.clone()];
                let admin = sluice_kafka::admin::Admin::connect(&brokers)
                    .await
                    .with_context(|| format!("connecting to {}", args.brokers))?;
                let topic = name.to_string();
                admin
                    .create_topic(&topic, 1)
                    .await
                    .with_context(|| format!("creating topic {topic}"))?;
                let yaml = format!(
                    "kafka: {{brokers: [{:?}], topic: {topic}, start: earliest, format: json, \
                     fetch_wait: {}}}",
                    args.brokers, args.fetch_wait
                );
                let admin = Box::new(admin);
                Ok((Input::Kafka { admin, topic }, yaml))
            }
            SourceKind::Nats => {
                let admin = sluice_nats::admin::Admin::connect(&args.nats_url)
                    .await
                    .map_err(|e| anyhow::anyhow!("connecting to {}: {e}", args.nats_url))?;
                let stream = name.to_uppercase();
                admin
                    .create_stream(&stream, &[&stream])
                    .await
                    .map_err(|e| anyhow::anyhow!("creating stream {stream}: {e}"))?;
                let yaml = format!(
                    "nats: {{url: {:?}, stream: {stream}, start: first}}",
                    args.nats_url
                );
                let admin = Box::new(admin);
                Ok((Input::Nats { admin, stream }, yaml))
            }
            SourceKind::File => {
                let path = work.join("input.jsonl");
                let file = std::fs::File::create(&path)?;
                let yaml = format!(
                    "file: {{path: {}, format: json, follow: true}}",
                    path.display()
                );
                Ok((Input::File(file), yaml))
            }
        }
    }

    async fn send(&mut self, doc: &[u8]) -> anyhow::Result<()> {
        match self {
            Input::File(file) => {
                let mut line = doc.to_vec();
                line.push(b'\n');
                file.write_all(&line)?;
                Ok(())
            }
            Input::Kafka { admin, topic } => {
                admin
                    .produce(topic, 0, [(None, doc.to_vec())])
                    .await
                    .with_context(|| format!("producing to {topic}"))?;
                Ok(())
            }
            Input::Nats { admin, stream } => {
                admin
                    .publish(stream, &[], doc.to_vec().into())
                    .await
                    .map_err(|e| anyhow::anyhow!("publishing to {stream}: {e}"))?;
                Ok(())
            }
        }
    }

    /// Removes what [`Input::open`] created on a server.
    async fn close(self) -> anyhow::Result<()> {
        match self {
            Input::File(_) | Input::Kafka { .. } => Ok(()),
            Input::Nats { admin, stream } => admin
                .delete_stream(&stream)
                .await
                .map_err(|e| anyhow::anyhow!("deleting stream {stream}: {e}")),
        }
    }
}

/// Where the bench looks for them.
enum Output {
    Sqlite(rusqlite::Connection),
    Postgres(tokio_postgres::Client, String),
}

impl Output {
    /// Whether the row of key `id` is visible; a table not created yet is not.
    async fn has(&self, id: &str) -> anyhow::Result<bool> {
        match self {
            Output::Sqlite(conn) => {
                match conn.query_row("SELECT 1 FROM latency WHERE id = ?1", [id], |_| Ok(())) {
                    Ok(()) => Ok(true),
                    Err(rusqlite::Error::QueryReturnedNoRows) => Ok(false),
                    Err(e) if e.to_string().contains("no such table") => Ok(false),
                    Err(e) => Err(e.into()),
                }
            }
            Output::Postgres(client, table) => {
                let query = format!("SELECT 1 FROM {table} WHERE id = $1");
                match client.query_opt(&query, &[&id]).await {
                    Ok(row) => Ok(row.is_some()),
                    Err(e)
                        if e.code() == Some(&tokio_postgres::error::SqlState::UNDEFINED_TABLE) =>
                    {
                        Ok(false)
                    }
                    Err(e) => Err(e.into()),
                }
            }
        }
    }
}

pub fn run(args: LatencyArgs) -> anyhow::Result<()> {
    ensure!(args.samples > 0, "--samples must be at least 1");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench(&args))
}

async fn bench(args: &LatencyArgs) -> anyhow::Result<()> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .subsec_nanos();
    let name = format!("sluice_latency_{}_{nanos:x}", std::process::id());
    let work = std::env::temp_dir().join(&name);
    std::fs::create_dir_all(&work)?;
    let pg = match args.store {
        StoreKind::Postgres => {
            let (client, connection) = tokio_postgres::connect(&args.url, tokio_postgres::NoTls)
                .await
                .context("connecting to the server given by --url")?;
            tokio::spawn(connection);
            client
                .batch_execute(&format!("CREATE SCHEMA {}", quote_ident(&name)))
                .await?;
            Some(client)
        }
        StoreKind::Sqlite => None,
    };
    let result = measure(args, &work, &name, pg).await;
    if args.store == StoreKind::Postgres {
        let (client, connection) =
            tokio_postgres::connect(&args.url, tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        client
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", quote_ident(&name)))
            .await?;
    }
    if args.keep {
        eprintln!("kept {}", work.display());
    } else {
        let _ = std::fs::remove_dir_all(&work);
    }
    report(args, &result?);
    Ok(())
}

async fn measure(
    args: &LatencyArgs,
    work: &Path,
    schema: &str,
    pg: Option<tokio_postgres::Client>,
) -> anyhow::Result<Samples> {
    let (mut input, source_yaml) = Input::open(args, work, schema).await?;
    let sampled = sample(args, work, schema, pg, &mut input, &source_yaml).await;
    // Also after a failure: the stream or topic is the bench's own.
    let closed = input.close().await;
    let samples = sampled?;
    closed?;
    Ok(samples)
}

/// Runs the pipeline over `input` and measures each document's latency.
async fn sample(
    args: &LatencyArgs,
    work: &Path,
    schema: &str,
    pg: Option<tokio_postgres::Client>,
    input: &mut Input,
    source_yaml: &str,
) -> anyhow::Result<Samples> {
    let db = work.join("latency.db");
    let endpoint = match args.store {
        StoreKind::Sqlite => format!("sqlite: {{path: {}}}", db.display()),
        StoreKind::Postgres => format!("postgres: {{url: {:?}, schema: {schema}}}", args.url),
    };
    let pipeline = work.join("pipeline.yaml");
    std::fs::write(&pipeline, pipeline_yaml(source_yaml, &endpoint))?;
    let mut child = SluiceRun::start(&pipeline, &work.join("run.log"))?;
    let output = match pg {
        Some(client) => Output::Postgres(client, format!("{}.latency", quote_ident(schema))),
        None => {
            // The store's file appears when the pipeline is applied.
            let deadline = Instant::now() + Duration::from_secs(60);
            while !db.exists() {
                child.check()?;
                ensure!(
                    Instant::now() < deadline,
                    "the SQLite store was not created within a minute"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Output::Sqlite(rusqlite::Connection::open_with_flags(
                &db,
                rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY,
            )?)
        }
    };
    progress(args, "waiting for the pipeline to start".into());
    let poll = Duration::from_micros(args.poll_us);
    input.send(&document("warm-up")).await?;
    wait_visible(
        &output,
        "warm-up",
        Duration::from_secs(120),
        poll,
        &mut child,
    )
    .await?;
    progress(
        args,
        format!(
            "{} documents, one every {} ms, {} into {}",
            args.samples,
            args.interval_ms,
            args.source.name(),
            args.store.name()
        ),
    );
    let mut samples = Samples::default();
    for i in 0..args.samples {
        let id = format!("doc-{i}");
        let doc = document(&id);
        let sent = Instant::now();
        input.send(&doc).await?;
        samples.sends.push(sent.elapsed());
        let seen = wait_visible(&output, &id, Duration::from_secs(30), poll, &mut child).await?;
        samples.latencies.push(seen.duration_since(sent));
        tokio::time::sleep(Duration::from_millis(args.interval_ms)).await;
    }
    child.stop()?;
    Ok(samples)
}

/// Per document: from before its send until its row was seen, and its send alone (an
/// acknowledged publish or produce: the broker's part of the latency).
#[derive(Default)]
struct Samples {
    latencies: Vec<Duration>,
    sends: Vec<Duration>,
}

fn document(id: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({"id": id, "n": 1})).expect("a document serializes")
}

fn pipeline_yaml(source: &str, endpoint: &str) -> String {
    format!(
        r#"collections:
  bench/latency:
    key: [/id]
    schema:
      type: object
      required: [id, n]
      reduce: {{strategy: merge}}
      properties:
        id: {{type: string}}
        n: {{type: integer, reduce: {{strategy: sum}}}}
sources:
  trickle:
    target: bench/latency
    {source}
materializations:
  latency:
    endpoint:
      {endpoint}
    bindings:
      - source: bench/latency
        resource: {{table: latency}}
runtime:
  recovery_log: log
"#
    )
}

/// Polls the store until the row of `id` is visible; when it first was.
async fn wait_visible(
    output: &Output,
    id: &str,
    within: Duration,
    poll: Duration,
    child: &mut SluiceRun,
) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + within;
    loop {
        if output.has(id).await? {
            return Ok(Instant::now());
        }
        child.check()?;
        if Instant::now() > deadline {
            bail!("document {id} was not visible in the store within {within:?}");
        }
        tokio::time::sleep(poll).await;
    }
}

/// The pipeline, running as a child process.
pub(super) struct SluiceRun {
    child: Child,
    log: PathBuf,
}

impl SluiceRun {
    pub(super) fn start(pipeline: &Path, log: &Path) -> anyhow::Result<SluiceRun> {
        let child = Command::new(sluice_app::sibling::sibling("sluice")?)
            .args(["run", "--follow"])
            .arg(pipeline)
            .current_dir(
                pipeline
                    .parent()
                    .expect("the pipeline is in the bench's folder"),
            )
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log)?)
            .spawn()
            .context("starting sluice run")?;
        Ok(SluiceRun {
            child,
            log: log.to_path_buf(),
        })
    }

    /// Fails if the run ended (with its log).
    pub(super) fn check(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            bail!("sluice run ended ({status}) during the bench:\n{log}");
        }
        Ok(())
    }

    pub(super) fn stop(mut self) -> anyhow::Result<()> {
        self.check()?;
        let _ = self.child.kill();
        let _ = self.child.wait();
        Ok(())
    }
}

impl Drop for SluiceRun {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn progress(args: &LatencyArgs, line: String) {
    if !args.json {
        eprintln!("{line}");
    }
}

/// The `q`-quantile (nearest rank) of sorted `values`, in milliseconds.
pub(super) fn quantile_ms(sorted: &[Duration], q: f64) -> f64 {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1].as_secs_f64() * 1e3
}

fn report(args: &LatencyArgs, samples: &Samples) {
    let mut sorted = samples.latencies.clone();
    sorted.sort();
    let mut sends = samples.sends.clone();
    sends.sort();
    let send_p50 = quantile_ms(&sends, 0.50);
    let (p50, p90, p99) = (
        quantile_ms(&sorted, 0.50),
        quantile_ms(&sorted, 0.90),
        quantile_ms(&sorted, 0.99),
    );
    let max = quantile_ms(&sorted, 1.0);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if args.json {
        let out = json!({
            "source": args.source.name(),
            "store": args.store.name(),
            "samples": sorted.len(),
            "interval_ms": args.interval_ms,
            "poll_us": args.poll_us,
            "p50_ms": round(p50),
            "p90_ms": round(p90),
            "p99_ms": round(p99),
            "max_ms": round(max),
            "send_p50_ms": round(send_p50),
            "cores": cores,
        });
        println!("{out}");
    } else {
        println!(
            "{} into {}: {} documents, p50 {p50:.2} ms, p90 {p90:.2} ms, p99 {p99:.2} ms, \
             max {max:.2} ms; the send alone p50 {send_p50:.2} ms ({cores} cores)",
            args.source.name(),
            args.store.name(),
            sorted.len()
        );
    }
}

pub(super) fn round(ms: f64) -> f64 {
    (ms * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_nearest_rank() {
        let values: Vec<_> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(quantile_ms(&values, 0.5), 50.0);
        assert_eq!(quantile_ms(&values, 0.99), 99.0);
        assert_eq!(quantile_ms(&values, 1.0), 100.0);
        assert_eq!(quantile_ms(&values[..1], 0.99), 1.0);
    }
}
