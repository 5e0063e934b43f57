//! `sluice bench http`: clients pushing documents to the HTTP source, each request
//! timed until its durable 200, into SQLite.
//!
//! ```text
//!  --clients threads ─POST /ingest (keep-alive, Idempotency-Key)─▶ sluice run (child) ─▶ SQLite
//!   phase 1: --batches bodies of --batch documents    ─▶ batch_docs_per_sec
//!   phase 2: --singles one-document bodies, in turn   ─▶ single_p50_ms, single_p99_ms
//! ```
//!
//! Every request carries an Idempotency-Key, as a client that retries safely does, so
//! each costs its share of a group fsync of the keys file besides the transaction's
//! own. A 429 (the buffer full while a transaction commits) is waited out as its
//! `Retry-After` says, shortened to 10 ms, and counted; its request's time includes the
//! wait. Bodies are generated before the clock starts (datagen's pageviews). The
//! batch figure is all batch documents over the time from the first request to the
//! last 200; the single figures are per request, from its send to its 200. `exact`
//! checks the table's total views against the documents sent.

use super::latency::{SluiceRun, quantile_ms, round};
use super::sql::PAGEVIEWS_COLLECTION;
use anyhow::{Context, bail, ensure};
use serde_json::json;
use sluice_datagen::pageview;
use sluice_http::client::Client;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const SEED: u64 = 11;
const TOKEN: &str = "bench-token";
const SOURCE: &str = "pushed";

#[derive(clap::Args)]
pub struct HttpArgs {
    /// Concurrent clients.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Batch bodies posted in phase 1.
    #[arg(long, default_value_t = 1_000)]
    batches: usize,
    /// Documents per batch body.
    #[arg(long, default_value_t = 1_000)]
    batch: usize,
    /// One-document requests in phase 2 (spread over the clients).
    #[arg(long, default_value_t = 4_000)]
    singles: usize,
    /// Distinct keys among the documents.
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Keep the bench's folder (pipeline, store, recovery log, the run's log).
    #[arg(long)]
    keep: bool,
}

pub fn run(args: HttpArgs) -> anyhow::Result<()> {
    ensure!(
        args.clients > 0 && args.batches > 0 && args.batch > 0 && args.singles > 0,
        "--clients, --batches, --batch and --singles must be at least 1"
    );
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .subsec_nanos();
    let work = std::env::temp_dir().join(format!(
        "sluice_bench_http_{}_{nanos:x}",
        std::process::id()
    ));
    std::fs::create_dir_all(&work)?;
    let result = measure(&args, &work);
    if args.keep {
        eprintln!("kept {}", work.display());
    } else {
        let _ = std::fs::remove_dir_all(&work);
    }
    report(&args, &result?);
    Ok(())
}

struct Figures {
    batch_secs: f64,
    singles: Vec<Duration>,
    busy: u64,
    exact: Result<(), String>,
}

fn progress(args: &HttpArgs, line: String) {
    if !args.json {
        eprintln!("{line}");
    }
}

fn measure(args: &HttpArgs, work: &Path) -> anyhow::Result<Figures> {
    let address: SocketAddr = {
        let probe = std::net::TcpListener::bind("127.0.0.1:0")?;
        probe.local_addr()?
    };
    let db = work.join("http.db");
    let pipeline = work.join("pipeline.yaml");
    std::fs::write(&pipeline, pipeline_yaml(address, &db))?;
    progress(
        args,
        format!(
            "generating {} bodies of {} documents",
            args.batches, args.batch
        ),
    );
    let mut seq = 0;
    let mut bodies = Vec::with_capacity(args.batches);
    for _ in 0..args.batches {
        let mut body = Vec::new();
        for _ in 0..args.batch {
            pageview(SEED, args.keys, seq).write_json(&mut body);
            body.push(b'\n');
            seq += 1;
        }
        bodies.push(body);
    }
    let singles: Vec<Vec<u8>> = (0..args.singles as u64)
        .map(|i| {
            let mut body = Vec::new();
            pageview(SEED, args.keys, seq + i).write_json(&mut body);
            body
        })
        .collect();
    let views: u64 = (0..seq + args.singles as u64)
        .map(|s| pageview(SEED, args.keys, s).views)
        .sum();

    let mut child = SluiceRun::start(&pipeline, &work.join("run.log"))?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        child.check()?;
        if let Ok(r) = Client::new(address, TOKEN).request("GET", "/health", &[], b"")
            && r.status == 200
        {
            break;
        }
        ensure!(Instant::now() < deadline, "the HTTP source did not come up");
        std::thread::sleep(Duration::from_millis(20));
    }
    let busy = Arc::new(AtomicU64::new(0));
    progress(
        args,
        format!(
            "phase 1: {} clients posting {} bodies of {} documents",
            args.clients, args.batches, args.batch
        ),
    );
    let started = Instant::now();
    post_all(address, args.clients, "batch", Arc::new(bodies), &busy)?;
    let batch_secs = started.elapsed().as_secs_f64();
    progress(
        args,
        format!("phase 2: {} one-document requests", args.singles),
    );
    let singles = post_all(address, args.clients, "single", Arc::new(singles), &busy)?;
    child.check()?;
    let exact = check_views(&db, views);
    child.stop()?;
    Ok(Figures {
        batch_secs,
        singles,
        busy: busy.load(Ordering::Relaxed),
        exact,
    })
}

/// Posts every body, `clients` at a time (each client takes the next body when its
/// last is answered); returns each request's time to its 200.
fn post_all(
    address: SocketAddr,
    clients: usize,
    tag: &'static str,
    bodies: Arc<Vec<Vec<u8>>>,
    busy: &Arc<AtomicU64>,
) -> anyhow::Result<Vec<Duration>> {
    let next = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let (bodies, next, busy) = (bodies.clone(), next.clone(), busy.clone());
            std::thread::spawn(move || -> anyhow::Result<Vec<Duration>> {
                let mut client = Client::new(address, TOKEN);
                let mut times = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(body) = bodies.get(i) else {
                        return Ok(times);
                    };
                    let key = format!("{tag}-{i}");
                    let sent = Instant::now();
                    loop {
                        let r = client
                            .ingest(SOURCE, Some(&key), body)
                            .with_context(|| format!("posting {key}"))?;
                        match r.status {
                            200 => break,
                            429 => {
                                busy.fetch_add(1, Ordering::Relaxed);
                                std::thread::sleep(Duration::from_millis(10));
                            }
                            status => bail!("{key}: {status} {}", String::from_utf8_lossy(&r.body)),
                        }
                    }
                    times.push(sent.elapsed());
                }
            })
        })
        .collect();
    let mut times = Vec::new();
    for thread in threads {
        times.extend(thread.join().expect("a client thread panicked")?);
    }
    Ok(times)
}

fn check_views(db: &Path, expected: u64) -> Result<(), String> {
    let conn =
        rusqlite::Connection::open_with_flags(db, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
            .map_err(|e| e.to_string())?;
    let found: i64 = conn
        .query_row("SELECT SUM(views) FROM pushed", [], |r| r.get(0))
        .map_err(|e| e.to_string())?;
    if found as u64 == expected {
        Ok(())
    } else {
        Err(format!("{found} views stored, {expected} sent"))
    }
}

fn pipeline_yaml(address: SocketAddr, db: &Path) -> String {
    format!(
        r#"
{PAGEVIEWS_COLLECTION}sources:
  {SOURCE}:
    target: bench/pageviews
    http: {{listen: "{address}", token: {TOKEN}}}
materializations:
  bench-http:
    endpoint:
      sqlite: {{path: {db:?}}}
    bindings:
      - source: bench/pageviews
        resource: {{table: pushed}}
runtime:
  recovery_log: log
"#
    )
}

fn report(args: &HttpArgs, figures: &Figures) {
    let docs = (args.batches * args.batch) as f64;
    let batch_docs_per_sec = docs / figures.batch_secs;
    let mut singles = figures.singles.clone();
    singles.sort();
    let (p50, p99) = (quantile_ms(&singles, 0.50), quantile_ms(&singles, 0.99));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if args.json {
        let out = json!({
            "clients": args.clients,
            "batches": args.batches,
            "batch": args.batch,
            "singles": args.singles,
            "batch_docs_per_sec": batch_docs_per_sec.round(),
            "single_p50_ms": round(p50),
            "single_p99_ms": round(p99),
            "retried_429": figures.busy,
            "exact": figures.exact.is_ok(),
            "cores": cores,
        });
        println!("{out}");
    } else {
        println!(
            "{} clients: batches of {} at {batch_docs_per_sec:.0} docs/s; single documents \
             p50 {p50:.2} ms, p99 {p99:.2} ms; {} requests waited out a 429; {} \
             ({cores} cores)",
            args.clients,
            args.batch,
            figures.busy,
            match &figures.exact {
                Ok(()) => "exact".to_string(),
                Err(e) => format!("NOT EXACT: {e}"),
            }
        );
    }
}
