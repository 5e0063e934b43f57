//! `sluice status`: a pipeline's status in the terminal. Asks the status API of the
//! process running it (`--metrics`, else the file's `runtime.metrics`), the same JSON the
//! status page draws; when nothing answers there, prints what the recovery logs hold
//! (the last committed transaction of each materialization).

use crate::pipeline_cmd::{load, print_checkpoints};
use crate::registry::registry;
use clap::Args;
use sluice_http::client::Client;
use sluice_runtime::metrics::status::{ShardView, Snapshot};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;

#[derive(Args)]
pub struct StatusArgs {
    /// The pipeline file (YAML).
    pub pipeline: PathBuf,
    /// Where the running process serves its status (`sluice run --metrics ADDR`);
    /// the pipeline file's `runtime.metrics` by default.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<SocketAddr>,
}

pub fn main(args: StatusArgs) -> anyhow::Result<()> {
    let pipeline = load(&args.pipeline, &registry())?;
    match args.metrics.or(pipeline.runtime.metrics) {
        Some(address) => match fetch(address) {
            Ok(snapshot) => {
                print!("{}", render(&snapshot));
                return Ok(());
            }
            Err(err) => {
                println!("no running process answers on {address} ({err}); the recovery logs hold:")
            }
        },
        None => println!(
            "no status address (runtime.metrics or --metrics) to ask a running process; \
             the recovery logs hold:"
        ),
    }
    print_checkpoints(&pipeline)
}

fn fetch(address: SocketAddr) -> anyhow::Result<Snapshot> {
    let response = Client::new(address, "").request("GET", "/api/status", &[], b"")?;
    anyhow::ensure!(response.status == 200, "HTTP status {}", response.status);
    Ok(serde_json::from_slice(&response.body)?)
}

fn render(snapshot: &Snapshot) -> String {
    let mut out = String::new();
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
        render_shard(&mut out, shard, snapshot.now);
    }
    out
}

fn render_shard(out: &mut String, shard: &ShardView, now: u64) {
    let ago = |at: u64| format!("{:.1} s ago", now.saturating_sub(at) as f64 / 1000.0);
    let state = serde_json::to_value(shard.state).expect("a state serializes");
    let _ = writeln!(
        out,
        "\n{} {}: {} (since {})",
        shard.materialization,
        shard.shard,
        state.as_str().unwrap_or_default().replace('_', " "),
        ago(shard.since)
    );
    let _ = writeln!(
        out,
        "  committed by this process: {} transactions, {} documents",
        shard.transactions, shard.documents
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
                ago(txn.committed_at),
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
    for (source, lag) in &shard.lag {
        let _ = writeln!(out, "  lag of {source}: {} {}", lag.behind, lag.unit);
    }
    match &shard.last_error {
        None => out.push_str("  last error: none\n"),
        Some(err) => {
            let retried = if err.retried { ", retried" } else { "" };
            let _ = writeln!(
                out,
                "  last error ({}{retried}, {}): {}",
                err.kind,
                ago(err.at),
                err.message
            );
        }
    }
}
