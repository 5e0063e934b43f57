//! `sluice run | check | apply | inspect`: the pipeline operator's commands.
//!
//! Each loads the pipeline file with this binary's [`registry`] of source and driver
//! kinds, which also connects the endpoints it names (built-in drivers run in-process;
//! `grpc` and `command` endpoints are external), and hands over to
//! `sluice_runtime::pipeline`.

use crate::progress::human_bytes;
use anyhow::Context as _;
use clap::{Args, Subcommand};
use sluice_app::registry;
use sluice_proto::materialize::constraint::Type as ConstraintType;
use sluice_runtime::admission::BindingReplay;
use sluice_runtime::config::{ConfigError, Pipeline};
use sluice_runtime::metrics::status::Graph;
use sluice_runtime::metrics::{Metrics, exporter};
use sluice_runtime::pipeline::{self, ApplyAction, PipelineError, RunOptions};
use sluice_runtime::registry::Registry;
use sluice_runtime::txn::{Progress, Summary};
use sluice_runtime::types::Collection;
use sluice_source_sdk::config::parse_duration;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Args)]
pub struct RunArgs {
    /// The pipeline file (YAML).
    pub pipeline: PathBuf,
    /// Keep tailing sources after they are exhausted (stop with Ctrl-C).
    #[arg(long)]
    pub follow: bool,
    /// Serve Prometheus metrics on http://ADDR/metrics (e.g. 127.0.0.1:9464), the status
    /// page on http://ADDR/ and its JSON on /api/status; overrides the pipeline file's
    /// `runtime.metrics`.
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<std::net::SocketAddr>,
    /// When stderr is not a terminal (a log file, a service manager), log a progress
    /// line this often: the phase, documents committed, the rate over the interval,
    /// what the sources have left and an ETA (e.g. `30s`, `1m`; `0s`: none). On a
    /// terminal a live line is drawn instead.
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = parse_duration)]
    pub progress_interval: Duration,
}

#[derive(Args)]
pub struct CheckArgs {
    /// The pipeline file (YAML).
    pub pipeline: PathBuf,
    /// Check the file only: connect to no store, broker or source (the drivers still
    /// validate the bindings).
    #[arg(long)]
    pub offline: bool,
}

#[derive(Args)]
pub struct ApplyArgs {
    /// The pipeline file (YAML).
    pub pipeline: PathBuf,
    /// Print the actions without applying them.
    #[arg(long)]
    pub dry_run: bool,
    /// Drop the resources instead (e.g. the tables), and forget the materializations'
    /// applied specs and recovery logs: a later run starts over.
    #[arg(long)]
    pub delete: bool,
}

#[derive(Subcommand)]
pub enum InspectCommand {
    /// Print the checkpoints held by a pipeline's recovery logs.
    Checkpoint {
        /// The pipeline file (YAML).
        pipeline: PathBuf,
    },
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

pub(crate) fn load(path: &Path, registry: &Registry) -> anyhow::Result<Pipeline> {
    match Pipeline::load(path, registry) {
        Ok(pipeline) => Ok(pipeline),
        // Already names the file.
        Err(err @ ConfigError::Read { .. }) => Err(err.into()),
        Err(err) => {
            Err(anyhow::Error::new(err).context(format!("pipeline file {}", path.display())))
        }
    }
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    let registry = registry();
    let pipeline = load(&args.pipeline, &registry)?;
    runtime()?.block_on(async {
        let metrics = match pipeline.runtime.metrics_server(args.metrics) {
            Some(server) => {
                let metrics = Arc::new(Metrics::new());
                metrics.status.set_graph(Graph::of(&pipeline));
                let bound = exporter::serve(&server, metrics.clone())
                    .await
                    .with_context(|| format!("serving metrics on {}", server.listen))?;
                let scheme = if server.tls.is_some() {
                    "https"
                } else {
                    "http"
                };
                tracing::info!(
                    "metrics on {scheme}://{bound}/metrics, status page on {scheme}://{bound}/"
                );
                Some(metrics)
            }
            None => None,
        };
        let planned = pipeline::plan(&pipeline, &registry).await?;
        if pipeline.cluster.is_some() {
            return run_member(&pipeline, planned, metrics).await;
        }
        let shutdown_rx =
            stop_on_signal("signal received: finishing the current transaction, then stopping");
        // Nothing is created (tables, the recovery log) before every source can be read.
        pipeline::check_sources(&pipeline, &shutdown_rx).await?;
        // Applies only a first start: a changed pipeline file is refused until applied.
        for (name, actions) in
            pipeline::apply_first_start(&pipeline, &planned, &shutdown_rx).await?
        {
            tracing::debug!(materialization = %name, "applied: {actions}");
        }
        let progress = Arc::new(Progress::default());
        let started = Instant::now();
        let shown = crate::progress::show(
            progress.clone(),
            started,
            args.follow,
            args.progress_interval,
        );
        let result = pipeline::run(
            &pipeline,
            planned,
            RunOptions {
                follow: args.follow,
                metrics,
            },
            progress.clone(),
            shutdown_rx,
        )
        .await;
        shown.finish().await;
        let elapsed = started.elapsed();
        let summaries = match result {
            Ok(summaries) => summaries,
            Err(err) => {
                // What was committed stays committed: say so before the error.
                if let PipelineError::Run {
                    materialization,
                    summaries,
                    ..
                } = &err
                {
                    for (name, s) in summaries {
                        let ended = if name == materialization {
                            "failed"
                        } else {
                            "stopped"
                        };
                        println!(
                            "{name} ({ended}): {}; last committed transaction {}",
                            committed(&pipeline, name, s),
                            s.last_txn
                        );
                    }
                }
                return Err(err.into());
            }
        };
        for (name, s) in summaries {
            // Waiting for input (a `--follow` run caught up) is not moving documents.
            let busy = elapsed.saturating_sub(s.idle);
            let rate = s.docs as f64 / busy.as_secs_f64().max(1e-9);
            let idle = match s.idle.as_secs_f64() {
                idle if idle >= 0.1 => format!(" ({idle:.1}s of it idle)"),
                _ => String::new(),
            };
            println!(
                "{name}: {}, {:.1}s{idle}, {rate:.0} docs/s",
                committed(&pipeline, &name, &s),
                elapsed.as_secs_f64(),
            );
        }
        Ok(())
    })
}

/// `sluice run` of a cluster member: serves the shards the cluster gives it until a
/// signal (or a failure, or its lease is lost), then says what each one committed here.
async fn run_member(
    pipeline: &Pipeline,
    planned: pipeline::Planned,
    metrics: Option<Arc<Metrics>>,
) -> anyhow::Result<()> {
    let shutdown_rx =
        stop_on_signal("signal received: finishing the shards' transactions, then leaving");
    let started = Instant::now();
    let opts = RunOptions {
        follow: true,
        metrics,
    };
    let progress = Arc::new(Progress::default());
    let summaries = sluice_cluster::run(pipeline, planned, opts, progress, shutdown_rx).await?;
    for (shard, s) in summaries {
        println!(
            "{shard}: {} documents ({}) in {} transactions here, {:.1}s",
            s.docs,
            human_bytes(s.bytes),
            s.transactions,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// What a materialization's run committed, e.g. "95 documents (12.0 KiB) in 10
/// transactions, 13 loaded, 95 stored, 1 restarts".
fn committed(pipeline: &Pipeline, name: &str, s: &Summary) -> String {
    let restarts = match s.restarts {
        0 => String::new(),
        n => format!(", {n} restarts"),
    };
    let rejected = match s.rejected {
        0 => String::new(),
        n => {
            let paths: Vec<_> = pipeline
                .dead_letter_paths(name)
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            format!(", {n} rejected, see {}", paths.join(", "))
        }
    };
    format!(
        "{} documents ({}) in {} transactions, {} loaded, {} stored{restarts}{rejected}",
        s.docs,
        human_bytes(s.bytes),
        s.transactions,
        s.loaded,
        s.stored,
    )
}

/// A flag raised at SIGINT or SIGTERM, which is then logged as `what`.
/// The first SIGINT/SIGTERM asks for a clean stop (`what` says what that does); a
/// second stops the process at once, as a kill would: nothing committed is lost, and
/// recovery makes the next run exact (a source's call in flight, such as a Kafka
/// client retrying an unreachable broker, is not waited for).
fn stop_on_signal(what: &'static str) -> tokio::sync::watch::Receiver<bool> {
    let (shutdown_tx, shutdown_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("{what} (a second signal stops at once)");
        let _ = shutdown_tx.send(true);
        wait_for_signal().await;
        eprintln!("error: stopped by a second signal; the next run recovers exactly");
        std::process::exit(130);
    });
    shutdown_rx
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// `sluice check`: plans every materialization as `run` would and, unless offline,
/// connects to every store (Apply as a dry run) and probes every source; prints what it
/// found and fails with every problem at once, each naming its place.
pub fn check(args: CheckArgs) -> anyhow::Result<()> {
    let registry = registry();
    let pipeline = load(&args.pipeline, &registry)?;
    runtime()?.block_on(async {
        let (planned, mut problems) = pipeline::plan_all(&pipeline, &registry).await;
        let probed = match args.offline {
            true => None,
            false => Some(pipeline::probe(&pipeline, &planned).await),
        };
        for m in &planned.materializations {
            print_materialization(&pipeline, &planned.collections, m);
            let mut stores = probed.iter().flat_map(|p| &p.stores);
            if let Some((_, actions)) = stores.find(|(name, _)| *name == m.name) {
                match actions.trim() {
                    "" => println!("  store: connected, up to date"),
                    actions => {
                        println!("  store: connected; `sluice apply` would:");
                        for line in actions.lines() {
                            println!("    {line}");
                        }
                    }
                }
            }
        }
        if let Some(probed) = probed {
            for name in &probed.sources {
                let kind = pipeline.sources[name].config.kind();
                println!("source {name} ({kind}): can be read");
            }
            problems.extend(probed.problems);
        }
        if let Some(err) = PipelineError::gathered(problems) {
            let place = format!("pipeline file {}", args.pipeline.display());
            return Err(anyhow::Error::new(err).context(place));
        }
        match args.offline {
            true => println!(
                "pipeline {} is valid (offline: nothing was connected to)",
                args.pipeline.display()
            ),
            false => println!("pipeline {} is valid", args.pipeline.display()),
        }
        Ok(())
    })
}

/// A planned materialization as `check` shows it: each binding's resource, fields, the
/// driver's constraints, and whether its reductions survive a replay (what
/// effectively-once admission reads, naming the reduction that stops it).
fn print_materialization(
    pipeline: &Pipeline,
    collections: &BTreeMap<String, Arc<Collection>>,
    m: &pipeline::PlannedMaterialization,
) {
    println!("materialization {} ({})", m.name, m.endpoint.name());
    let written = &pipeline.materializations[&m.name].bindings;
    for (i, ((binding, validated), def)) in m
        .spec
        .bindings
        .iter()
        .zip(&m.validated.bindings)
        .zip(written)
        .enumerate()
    {
        let collection = binding
            .collection
            .as_ref()
            .map(|c| c.collection.as_str())
            .unwrap_or("");
        let selection = binding.field_selection.clone().unwrap_or_default();
        println!(
            "  {collection} → {}{}",
            binding.resource_path.join("."),
            match (binding.delta_updates, def.delta_updates) {
                (true, true) => " (delta updates)",
                // A driver may take only changes (an epoch sink): say so, as the
                // pipeline file asked for a standard binding.
                (true, false) => " (delta updates: the endpoint takes only changes)",
                (false, _) => "",
            }
        );
        println!("    keys:     {}", selection.keys.join(", "));
        println!("    values:   {}", selection.values.join(", "));
        println!(
            "    document: {}",
            if selection.document.is_empty() {
                "-"
            } else {
                &selection.document
            }
        );
        let mut constraints: Vec<_> = validated.constraints.iter().collect();
        constraints.sort_by(|a, b| a.0.cmp(b.0));
        for (field, c) in constraints {
            let kind = ConstraintType::try_from(c.r#type)
                .map(|t| t.as_str_name().to_string())
                .unwrap_or_else(|_| format!("type {}", c.r#type));
            println!("    {field:<20} {kind:<22} {}", c.reason);
        }
        if let Some(compiled) = collections.get(&def.source) {
            let place = format!("materializations.{}.bindings[{i}]", m.name);
            let replay = BindingReplay::of(place, def.delta_updates, compiled.schema.reducer());
            println!("    replay:   {}", replay.replay);
        }
    }
}

pub fn apply(args: ApplyArgs) -> anyhow::Result<()> {
    let registry = registry();
    let pipeline = load(&args.pipeline, &registry)?;
    runtime()?.block_on(async {
        let planned = pipeline::plan(&pipeline, &registry).await?;
        let action = match args.delete {
            true => ApplyAction::Delete,
            false => ApplyAction::Upsert,
        };
        // Under `cluster:` the applied spec and the shards' logs are in the cluster's
        // etcd, not in this machine's folder.
        let applied = match pipeline.cluster {
            Some(_) => {
                sluice_cluster::apply::apply(&pipeline, &planned, action, args.dry_run).await?
            }
            None => pipeline::apply(&pipeline, &planned, action, args.dry_run).await?,
        };
        for (name, actions) in applied {
            let verb = match (action, args.dry_run) {
                (ApplyAction::Upsert, true) => "would apply",
                (ApplyAction::Upsert, false) => "applied",
                (ApplyAction::Delete, true) => "would delete",
                (ApplyAction::Delete, false) => "deleted",
            };
            println!("-- {name}: {verb}");
            println!(
                "{}",
                if actions.trim().is_empty() {
                    "(nothing to do)"
                } else {
                    actions.trim()
                }
            );
        }
        Ok(())
    })
}

pub fn inspect(cmd: InspectCommand) -> anyhow::Result<()> {
    match cmd {
        InspectCommand::Checkpoint { pipeline: path } => {
            print_checkpoints(&load(&path, &registry())?)
        }
    }
}

/// What each materialization's recovery log holds (`sluice inspect checkpoint`, and
/// `sluice status` when no process runs the pipeline).
pub(crate) fn print_checkpoints(pipeline: &Pipeline) -> anyhow::Result<()> {
    for name in pipeline.materializations.keys() {
        let root = pipeline.recovery_log().join(name);
        for (shard, dir) in sluice_runtime::pipeline::layout::local_logs(&root)? {
            match shard {
                None => println!("materialization {name} (recovery log {})", dir.display()),
                Some(shard) => println!(
                    "materialization {name} shard {shard} (recovery log {})",
                    dir.display()
                ),
            }
            if !dir.join("log").exists() {
                println!("  (empty: never run)");
                continue;
            }
            let text = sluice_runtime::recovery::inspect(&dir)?;
            for line in text.lines() {
                println!("  {line}");
            }
        }
    }
    Ok(())
}
