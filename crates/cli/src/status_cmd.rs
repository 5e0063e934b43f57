//! `sluice status`: a pipeline's status in the terminal. Asks the status API of the
//! process running it (`--metrics`, else the file's `runtime.metrics`, with its token and,
//! over TLS, the CA given by `--ca`), the same JSON the status page draws; when nothing
//! answers there, prints what the recovery logs hold
//! (the last committed transaction of each materialization) and how each shard's last
//! run ended ([`ended`]: its state, its sources', and their last errors). Each source
//! and endpoint is shown with its health (healthy, or unhealthy or fatal with the
//! reason), a source also with its parse errors, the memory it holds and its own
//! metrics, and the endpoint with the memory and metrics it reports.

use crate::pipeline_cmd::{load, print_checkpoints};
use clap::Args;
use sluice_app::registry;
use sluice_http::client::{Client, Response};
use sluice_runtime::config::{MetricsServer, Pipeline};
use sluice_runtime::metrics::ended;
use sluice_runtime::metrics::status::{CustomMetric, LastError, ShardView, Snapshot};
use sluice_source_sdk::tls::{ClientTls, server_name};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(Args)]
pub struct StatusArgs {
    /// The pipeline file (YAML).
    pub pipeline: PathBuf,
    /// Where the running process serves its status (`sluice run --metrics ADDR`);
    /// the pipeline file's `runtime.metrics` by default.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
    /// The CA that signed the status server's certificate (PEM), when
    /// `runtime.metrics.tls` serves HTTPS.
    #[arg(long, value_name = "FILE")]
    pub ca: Option<PathBuf>,
}

pub fn main(args: StatusArgs) -> anyhow::Result<()> {
    let pipeline = load(&args.pipeline, &registry())?;
    match pipeline.runtime.metrics_server(args.metrics) {
        Some(server) => match fetch(&server, args.ca.as_deref()) {
            Ok(snapshot) => {
                print!("{}", render(&snapshot));
                return Ok(());
            }
            Err(err) => {
                let address = server.listen;
                println!(
                    "no running process answers on {address} ({err:#}); the recovery logs hold:"
                )
            }
        },
        None => println!(
            "no status address (runtime.metrics or --metrics) to ask a running process; \
             the recovery logs hold:"
        ),
    }
    print_checkpoints(&pipeline)?;
    print!("{}", render_ended(&pipeline)?);
    Ok(())
}

/// The status of the process serving `server` ([`ask`]).
fn fetch(server: &MetricsServer, ca: Option<&Path>) -> anyhow::Result<Snapshot> {
    let response = ask(server, ca, "GET", "/api/status")?;
    anyhow::ensure!(
        response.status == 200,
        "HTTP status {}: {}",
        response.status,
        String::from_utf8_lossy(&response.body)
    );
    Ok(serde_json::from_slice(&response.body)?)
}

/// Asks the status API of the process serving `server` (`method` on `path`), over TLS
/// when it has `tls` (checked against `ca`), with its token when it has one: `sluice
/// status`, `pause` and `resume` address a running pipeline alike.
pub(crate) fn ask(
    server: &MetricsServer,
    ca: Option<&Path>,
    method: &str,
    path: &str,
) -> anyhow::Result<Response> {
    let token = server.token.as_deref().unwrap_or_default();
    let mut client = Client::new(server.listen, token);
    if server.tls.is_some() {
        let Some(ca) = ca else {
            anyhow::bail!(
                "runtime.metrics serves HTTPS: give --ca FILE, the CA that signed its certificate"
            );
        };
        let tls = ClientTls {
            ca: Some(ca.to_path_buf()),
            certificate: None,
            key: None,
        };
        // A server listening on every interface, or on loopback, is asked as localhost.
        let ip = server.listen.ip();
        let host = match ip.is_unspecified() || ip.is_loopback() {
            true => "localhost".to_string(),
            false => ip.to_string(),
        };
        let name = server_name(&host)?;
        client = client.with_tls(tls.client_config("--ca")?, name);
    }
    let auth = format!("Bearer {token}");
    let headers: &[(&str, &str)] = match server.token {
        Some(_) => &[("Authorization", auth.as_str())],
        None => &[],
    };
    Ok(client.request(method, path, headers, b"")?)
}

fn render(snapshot: &Snapshot) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "sluice {}, up {}; pipeline {}",
        snapshot.version,
        duration(snapshot.uptime_ms),
        snapshot.state
    );
    let graph = &snapshot.graph;
    for source in &graph.sources {
        let readers = (graph.materializations.iter())
            .filter(|m| m.collections.contains(&source.collection))
            .map(|m| m.name.as_str())
            .collect::<Vec<_>>();
        let _ = writeln!(
            out,
            "{} → {} → {}",
            source.name,
            source.collection,
            readers.join(", ")
        );
    }
    for shard in &snapshot.shards {
        let _ = writeln!(
            out,
            "\n{} {}: {} (since {})",
            shard.materialization,
            shard.shard,
            words(shard.state),
            ago(snapshot.now, shard.since)
        );
        render_shard(&mut out, shard, snapshot.now, "this process");
    }
    out
}

/// How each shard of the pipeline's materializations last ended, as recorded beside
/// its recovery log.
fn render_ended(pipeline: &Pipeline) -> anyhow::Result<String> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64);
    let mut out = String::new();
    for name in pipeline.materializations.keys() {
        for end in ended::read(&pipeline.recovery_log().join(name))? {
            let shard = &end.shard;
            let _ = writeln!(
                out,
                "\n{} {}: its last run (sluice {}) ended {}: {}",
                shard.materialization,
                shard.shard,
                end.version,
                ago(now, end.ended_at),
                words(shard.state)
            );
            render_shard(&mut out, shard, now, "that run");
        }
    }
    Ok(out)
}

/// A shard's counts, sources, bindings and last errors; `by`: who committed the counts.
fn render_shard(out: &mut String, shard: &ShardView, now: u64, by: &str) {
    let _ = writeln!(
        out,
        "  committed by {by}: {} transactions, {} documents ({:.1}/s); {} retries",
        shard.transactions, shard.documents, shard.rate, shard.retries
    );
    match &shard.last_committed {
        None => out.push_str("  last committed: none yet\n"),
        Some(txn) => {
            let end_to_end = txn
                .end_to_end_ms
                .map_or(String::new(), |ms| format!(", end to end {ms:.1} ms"));
            let _ = writeln!(
                out,
                "  last committed: transaction {}, {}, {} documents{end_to_end}",
                txn.txn,
                ago(now, txn.committed_at),
                txn.documents
            );
            let phases = (txn.phases.iter())
                .map(|p| format!("{} {:.1} ms", p.phase, p.ms))
                .collect::<Vec<_>>();
            let _ = writeln!(out, "    {}", phases.join(", "));
            for (source, position) in &txn.sources {
                let _ = writeln!(out, "    source {source}: {position}");
            }
        }
    }
    for (name, source) in &shard.sources {
        let lag = (source.lag.as_ref()).map_or(String::new(), |lag| {
            format!(", lag {} {}", lag.behind, lag.unit)
        });
        let retained = (source.retained).map_or(String::new(), |bytes| {
            format!(", WAL retained {bytes} bytes")
        });
        let _ = writeln!(
            out,
            "  source {name}: {} (since {}), {} documents ({:.1}/s), {} dead-lettered, \
             {} parse errors, {} retries{lag}{retained}, holds {} bytes",
            words(source.state),
            ago(now, source.since),
            source.documents,
            source.rate,
            source.dead_lettered,
            source.parse_errors,
            source.retries,
            source.memory
        );
        let _ = writeln!(out, "    health: {}", source.health);
        write_metrics(out, &source.metrics);
        if let Some(err) = &source.last_error {
            let _ = writeln!(out, "    {}", last_error(err, now));
        }
    }
    for binding in &shard.bindings {
        let _ = writeln!(
            out,
            "  binding {} ({}): {} documents ({:.1}/s), {} loaded, {} stored, {} deleted",
            binding.resource,
            binding.collection,
            binding.documents,
            binding.rate,
            binding.loaded,
            binding.stored,
            binding.deleted
        );
    }
    let _ = writeln!(
        out,
        "  endpoint: {}, holds {} bytes",
        shard.endpoint.health, shard.endpoint.memory
    );
    write_metrics(out, &shard.endpoint.metrics);
    let _ = writeln!(
        out,
        "  loop memory: read combiner {} bytes, load combiner {} bytes",
        shard.memory.read_combiner, shard.memory.load_combiner
    );
    match &shard.last_error {
        None => out.push_str("  last error: none\n"),
        Some(err) => {
            let _ = writeln!(out, "  {}", last_error(err, now));
        }
    }
}

/// A part's own metrics, one line each: `name{label=value,…}: value`.
fn write_metrics(out: &mut String, metrics: &[CustomMetric]) {
    for metric in metrics {
        let labels = (metric.labels.iter())
            .map(|(key, value)| format!("{key}={value}"))
            .collect::<Vec<_>>();
        let labels = match labels.is_empty() {
            true => String::new(),
            false => format!("{{{}}}", labels.join(",")),
        };
        let _ = writeln!(out, "    {}{labels}: {}", metric.name, metric.value);
    }
}

fn last_error(err: &LastError, now: u64) -> String {
    let retried = if err.retried { ", retried" } else { "" };
    format!(
        "last error ({}{retried}, {}): {}",
        err.kind,
        ago(now, err.at),
        err.message
    )
}

/// A state as its JSON spells it, in words (`backing off`).
fn words(state: impl serde::Serialize) -> String {
    let state = serde_json::to_value(state).expect("a state serializes");
    state.as_str().unwrap_or_default().replace('_', " ")
}

fn ago(now: u64, at: u64) -> String {
    format!("{} ago", duration(now.saturating_sub(at)))
}

/// Milliseconds as people read them: seconds (tenths below two minutes), minutes, hours.
fn duration(ms: u64) -> String {
    match ms / 1000 {
        s if s < 120 => format!("{:.1} s", ms as f64 / 1000.0),
        s if s < 2 * 3600 => format!("{} min", s / 60),
        s if s < 2 * 86400 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        s => format!("{} days", s / 86400),
    }
}
