//! `sluice bench failover`: how long an `http` source under `cluster:` answers no POST
//! when its holder dies, with the members watching etcd.
//!
//! ```text
//!  3 members (private etcd, lease_ttl) ── one http shard, PostgreSQL store
//!  a client: one keyed body at a time, retried with its key until a 200; a 503 sends
//!            it to the holder it names, a refused connection to the next member
//!  per round: 2 s of 200s ─▶ SIGKILL the member that answered the last one (t0)
//!             ─▶ first 200 after t0 (t1): failover = t1 - t0 ─▶ the member started
//!             again on its port under a new name
//!  figures: failover_ms (each round), failover_p50_ms, failover_max_ms, lease_ttl_ms,
//!           bodies_acknowledged, exact (the table's views = the bodies acknowledged)
//! ```
//!
//! The holder renews its lease every TTL/3, so the lease ends between 2/3 TTL and one
//! TTL after the kill (plus etcd's expiry sweep); the rest of a failover is the watch
//! waking the owner, its claim, the shard's recovery from its etcd log, the store's
//! Open, and the listener serving. A client's wait also includes its retry pause
//! (`RETRY`) and the 503s it follows meanwhile.

use super::latency::{quantile_ms, round};
use anyhow::{Context, bail, ensure};
use serde_json::json;
use sluice_http::client::Client;
use sluice_postgres::sql::quote_ident;
use sluice_testkit::etcd::PrivateEtcd;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_postgres::NoTls;

const TOKEN: &str = "bench-failover-token";
const SOURCE: &str = "pushed";
const MEMBERS: usize = 3;
/// A client's pause before it retries a body: short against the failover it measures.
const RETRY: Duration = Duration::from_millis(5);
/// How long the cluster serves before each kill.
const STEADY: Duration = Duration::from_secs(2);
/// A failover taking longer than this fails the bench.
const PATIENCE: Duration = Duration::from_secs(120);

#[derive(clap::Args)]
pub struct FailoverArgs {
    /// Holders killed, one failover measured each.
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// The members' `cluster.lease_ttl`, in seconds.
    #[arg(long, default_value_t = 3)]
    lease_ttl: u64,
    /// The PostgreSQL server (a schema of a unique name is created, then dropped).
    #[arg(
        long,
        default_value = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
    )]
    url: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

pub fn run(args: FailoverArgs) -> anyhow::Result<()> {
    ensure!(args.rounds >= 1, "--rounds must be at least 1");
    ensure!(
        args.lease_ttl >= 2,
        "--lease-ttl must be at least 2 (seconds)"
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .subsec_nanos();
    let schema = format!("sluice_failover_{}_{nanos:x}", std::process::id());
    let client = runtime.block_on(async {
        let (client, connection) = tokio_postgres::connect(&args.url, NoTls)
            .await
            .context("connecting to the server given by --url")?;
        tokio::spawn(connection);
        client
            .batch_execute(&format!("CREATE SCHEMA {}", quote_ident(&schema)))
            .await?;
        anyhow::Ok(client)
    })?;
    let work = std::env::temp_dir().join(&schema);
    std::fs::create_dir_all(&work)?;
    let measured = measure(&args, &schema, &work);
    let views = runtime.block_on(async {
        let views = match &measured {
            Ok(_) => {
                let sql = format!(
                    "SELECT COALESCE(SUM(views), 0)::BIGINT FROM {}.pageviews",
                    quote_ident(&schema)
                );
                Some(client.query_one(&sql, &[]).await?.get::<_, i64>(0))
            }
            Err(_) => None,
        };
        client
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {} CASCADE",
                quote_ident(&schema)
            ))
            .await?;
        anyhow::Ok(views)
    })?;
    let measured = measured?;
    let _ = std::fs::remove_dir_all(&work);
    let exact = views == Some(measured.acknowledged as i64);
    report(&args, &measured, exact);
    if !exact {
        bail!(
            "the table holds {} views, but {} bodies of one view each were acknowledged",
            views.unwrap_or_default(),
            measured.acknowledged
        );
    }
    Ok(())
}

/// What the rounds measured.
struct Measured {
    failovers: Vec<Duration>,
    acknowledged: u64,
}

/// The members: each a child process on its own listening port.
struct Cluster {
    sluice: std::path::PathBuf,
    pipeline: std::path::PathBuf,
    dir: std::path::PathBuf,
    ports: Vec<u16>,
    children: Vec<Child>,
    started: usize,
}

impl Cluster {
    /// Starts member `slot` again (a new member name: the dead one's lease may live on).
    fn start(&mut self, slot: usize) -> anyhow::Result<()> {
        let name = format!("m{}", self.started);
        self.started += 1;
        let log = std::fs::File::create(self.dir.join(format!("{name}.log")))?;
        let child = Command::new(&self.sluice)
            .arg("run")
            .arg(&self.pipeline)
            .env("MEMBER", &name)
            .env("HTTP_PORT", self.ports[slot].to_string())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting a member")?;
        if slot < self.children.len() {
            self.children[slot] = child;
        } else {
            self.children.push(child);
        }
        Ok(())
    }

    fn kill(&mut self, slot: usize) {
        let _ = self.children[slot].kill();
        let _ = self.children[slot].wait();
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// What the client shares with the rounds.
#[derive(Default)]
struct Served {
    /// Each 200's instant, in order.
    acks: Mutex<Vec<Instant>>,
    /// The member slot that answered the last 200.
    last_holder: AtomicUsize,
    /// A body answered anything but 200, 429 or 503 (the bench fails).
    wrong: Mutex<Option<String>>,
    stop: AtomicBool,
}

impl Served {
    fn acks_since(&self, since: Instant) -> Option<Instant> {
        let acks = self.acks.lock().unwrap_or_else(|e| e.into_inner());
        acks.iter()
            .rev()
            .take_while(|&&t| t > since)
            .last()
            .copied()
    }

    fn acknowledged(&self) -> u64 {
        self.acks.lock().unwrap_or_else(|e| e.into_inner()).len() as u64
    }
}

fn measure(args: &FailoverArgs, schema: &str, dir: &Path) -> anyhow::Result<Measured> {
    let mut etcd = PrivateEtcd::start();
    let ports = (0..MEMBERS)
        .map(|_| Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port()))
        .collect::<anyhow::Result<Vec<u16>>>()?;
    let pipeline = dir.join("pipeline.yaml");
    std::fs::write(&pipeline, pipeline_yaml(args, schema, &etcd.url()))?;
    let sluice = sluice_app::sibling::sibling("sluice")?;
    let applied = Command::new(&sluice)
        .arg("apply")
        .arg(&pipeline)
        .env("MEMBER", "apply")
        .env("HTTP_PORT", "1")
        .output()?;
    ensure!(
        applied.status.success(),
        "sluice apply failed: {}",
        String::from_utf8_lossy(&applied.stderr)
    );
    let mut cluster = Cluster {
        sluice,
        pipeline,
        dir: dir.to_path_buf(),
        ports: ports.clone(),
        children: Vec::new(),
        started: 0,
    };
    for slot in 0..MEMBERS {
        cluster.start(slot)?;
    }
    let addresses: Vec<SocketAddr> = (ports.iter())
        .map(|port| SocketAddr::from(([127, 0, 0, 1], *port)))
        .collect();
    let served = Arc::new(Served::default());
    let client = {
        let served = served.clone();
        std::thread::spawn(move || post_until_stopped(&addresses, &served))
    };
    let rounds = rounds(args, &mut cluster, &served);
    served.stop.store(true, Ordering::SeqCst);
    let _ = client.join();
    drop(cluster);
    etcd.stop();
    let failovers = rounds?;
    if let Some(wrong) = served
        .wrong
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .take()
    {
        bail!("a body was answered wrongly: {wrong}");
    }
    Ok(Measured {
        failovers,
        acknowledged: served.acknowledged(),
    })
}

/// Kills the holder `args.rounds` times, each after [`STEADY`] of 200s.
fn rounds(
    args: &FailoverArgs,
    cluster: &mut Cluster,
    served: &Served,
) -> anyhow::Result<Vec<Duration>> {
    let mut failovers = Vec::new();
    for round in 0..args.rounds {
        let steady_from = wait_for_ack(served, Instant::now(), cluster)?;
        std::thread::sleep(STEADY.saturating_sub(steady_from.elapsed()));
        let holder = served.last_holder.load(Ordering::SeqCst);
        let killed = Instant::now();
        cluster.kill(holder);
        let back = wait_for_ack(served, killed, cluster)?;
        let failover = back - killed;
        if !args.json {
            eprintln!(
                "round {}: holder {holder} killed, served again after {:.0} ms",
                round + 1,
                failover.as_secs_f64() * 1e3
            );
        }
        failovers.push(failover);
        cluster.start(holder)?;
    }
    Ok(failovers)
}

/// The first 200 after `since`, waited for up to [`PATIENCE`].
fn wait_for_ack(served: &Served, since: Instant, cluster: &Cluster) -> anyhow::Result<Instant> {
    loop {
        if let Some(at) = served.acks_since(since) {
            return Ok(at);
        }
        if let Some(wrong) = served
            .wrong
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            bail!("a body was answered wrongly: {wrong}");
        }
        if since.elapsed() > PATIENCE {
            bail!(
                "no body was acknowledged for {} s; the members' logs are in {}",
                PATIENCE.as_secs(),
                cluster.dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// The client: one body of one view at a time, each retried with its key until a 200,
/// where a 503 says the holder is, else at the next member.
fn post_until_stopped(addresses: &[SocketAddr], served: &Served) {
    let mut http: Vec<Client> = (addresses.iter())
        .map(|address| Client::new(*address, TOKEN))
        .collect();
    let mut at = 0;
    let mut next = 0u64;
    while !served.stop.load(Ordering::SeqCst) {
        let key = format!("body-{next}");
        let body = format!("{{\"user_id\": \"u{}\", \"views\": 1}}\n", next % 100);
        loop {
            if served.stop.load(Ordering::SeqCst) {
                return;
            }
            match http[at].ingest(SOURCE, Some(&key), body.as_bytes()) {
                Ok(r) if r.status == 200 => {
                    served.last_holder.store(at, Ordering::SeqCst);
                    (served.acks.lock().unwrap_or_else(|e| e.into_inner())).push(Instant::now());
                    break;
                }
                Ok(r) if matches!(r.status, 429 | 503) => {
                    let holder = (r.header("sluice-holder-address"))
                        .and_then(|named| addresses.iter().position(|a| a.to_string() == named));
                    at = holder.unwrap_or((at + 1) % addresses.len());
                    std::thread::sleep(RETRY);
                }
                Err(_) => {
                    at = (at + 1) % addresses.len();
                    std::thread::sleep(RETRY);
                }
                Ok(r) => {
                    let answer = String::from_utf8_lossy(&r.body).into_owned();
                    let wrong = format!("{key}: {} {answer}", r.status);
                    *served.wrong.lock().unwrap_or_else(|e| e.into_inner()) = Some(wrong);
                    return;
                }
            }
        }
        next += 1;
    }
}

fn pipeline_yaml(args: &FailoverArgs, schema: &str, etcd: &str) -> String {
    format!(
        r#"collections:
  bench/views:
    key: [/user_id]
    schema:
      type: object
      required: [user_id, views]
      reduce: {{strategy: merge}}
      properties:
        user_id: {{type: string}}
        views: {{type: integer, reduce: {{strategy: sum}}}}
sources:
  {SOURCE}:
    target: bench/views
    http: {{listen: "127.0.0.1:${{HTTP_PORT}}", token: {TOKEN}}}
materializations:
  views:
    endpoint:
      postgres: {{url: "{url}", schema: {schema}}}
    bindings:
      - source: bench/views
        resource: {{table: pageviews}}
runtime:
  transactions: {{max_duration: 20ms}}
cluster:
  etcd: ["{etcd}"]
  member: ${{MEMBER}}
  lease_ttl: {ttl}s
"#,
        url = args.url,
        ttl = args.lease_ttl,
    )
}

fn report(args: &FailoverArgs, measured: &Measured, exact: bool) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut sorted = measured.failovers.clone();
    sorted.sort();
    let ms: Vec<f64> = (measured.failovers.iter())
        .map(|d| round(d.as_secs_f64() * 1e3))
        .collect();
    let p50 = round(quantile_ms(&sorted, 0.5));
    let max = round(quantile_ms(&sorted, 1.0));
    let ttl_ms = args.lease_ttl * 1000;
    if args.json {
        let figures = json!({
            "source": "http",
            "members": MEMBERS,
            "rounds": args.rounds,
            "lease_ttl_ms": ttl_ms,
            "failover_ms": ms,
            "failover_p50_ms": p50,
            "failover_max_ms": max,
            "bodies_acknowledged": measured.acknowledged,
            "exact": exact,
            "cores": cores,
        });
        println!("{figures}");
    } else {
        println!(
            "http failover over {} kills, lease_ttl {} ms: p50 {p50:.0} ms, max {max:.0} ms \
             ({} bodies acknowledged, exact: {exact}; {cores} cores)",
            args.rounds, ttl_ms, measured.acknowledged
        );
    }
}
