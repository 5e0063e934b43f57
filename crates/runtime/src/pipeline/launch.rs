//! Launch: the loop of each shard of a planned pipeline ([`Launcher`]), over its key
//! range and its recovery log, reopened with backoff after retryable failures
//! ([`RunError::is_retryable`]); what `run` and a cluster member both start.

use super::error::{PipelineError, invalid};
use super::layout;
use super::plan::Planned;
use super::retries::Retries;
use crate::applied;
use crate::config::{self, Pipeline};
use crate::metrics::{Metrics, ShardMetrics, ended};
use crate::projections;
use crate::recovery::{self, RecoveryLog};
use crate::txn::{self, BoundSource, Progress, TxnOptions};
use crate::types::{Binding, RunError, Shard, Summary};
use async_trait::async_trait;
use sluice_driver_sdk::Endpoint;
use sluice_proto::flow;
use sluice_proto::materialize::transaction_request::Open;
use sluice_source_sdk::{Health, Source, SourceError};
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::watch;
use tracing::Instrument;

/// Options of `sluice run`.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Keep tailing sources after they are exhausted.
    pub follow: bool,
    /// Where the run's metrics go (an exporter serves them); `None`: nowhere.
    pub metrics: Option<Arc<Metrics>>,
}

/// Where a shard's recovery log is kept.
#[derive(Clone)]
pub enum LogPlace {
    /// A local folder (the embedded default): `<recovery_log>/<materialization>`, or a
    /// shard's own in it once split ([`layout`]).
    Local(std::path::PathBuf),
    /// A shared engine, opened anew by each attempt (a cluster's shard log).
    Shared(Arc<dyn OpenLog>),
}

/// Opens a recovery log kept on a shared engine, fencing its earlier holders.
#[async_trait]
pub trait OpenLog: Send + Sync {
    async fn open(&self) -> Result<RecoveryLog, recovery::RecoveryError>;
}

/// What one materialization's shards share: launched once for the configured shard, or
/// by a cluster for each range it is assigned.
struct Template {
    spec: flow::MaterializationSpec,
    bindings: Vec<Binding>,
    feeds: Vec<SourceFeed>,
    endpoint: Arc<dyn Endpoint>,
    store_keeps_checkpoint: bool,
    /// The runtime's timeouts for this materialization: the driver's outlasting the
    /// longest call its endpoint may take.
    timeouts: config::Timeouts,
    shard: config::ShardDef,
    /// Why it runs as one shard here whatever `runtime.workers` says, if it does.
    one_shard: Option<String>,
}

/// Starts shard loops of a planned pipeline: each a [`txn::run`] with its restarts.
pub struct Launcher {
    templates: BTreeMap<String, Template>,
    log_root: std::path::PathBuf,
    deployment_id: String,
    metrics: Arc<Metrics>,
    opts: TxnOptions,
    progress: Arc<Progress>,
    /// How many shards a materialization runs as here (`runtime.workers`).
    workers: u32,
}

impl Launcher {
    /// The launcher of a process's own shards: the deployment id (what epoch sinks
    /// name their staging by) is the one beside the local recovery log.
    pub fn new(
        pipeline: &Pipeline,
        planned: Planned,
        opts: RunOptions,
        progress: Arc<Progress>,
    ) -> Result<Launcher, PipelineError> {
        Launcher::with_deployment(pipeline, planned, opts, progress, None)
    }

    /// [`Launcher::new`], with the deployment id `shared` kept elsewhere than beside
    /// the local recovery log (a cluster's, in etcd: every holder of a shard names and
    /// cleans its staging alike). `None`: the local one, read or created when an epoch
    /// sink needs it.
    pub fn with_deployment(
        pipeline: &Pipeline,
        planned: Planned,
        opts: RunOptions,
        progress: Arc<Progress>,
        shared: Option<String>,
    ) -> Result<Launcher, PipelineError> {
        let bounds = &pipeline.runtime.transactions;
        let txn_opts = TxnOptions {
            max_docs: bounds.max_docs,
            max_bytes: bounds.max_bytes,
            max_duration: bounds.max_duration,
            min_duration: bounds.min_duration,
            memory_budget: pipeline.runtime.memory_budget as usize,
            follow: opts.follow,
            max_journaled: TxnOptions::MAX_JOURNALED,
        };
        let needed = (planned.materializations.iter()).any(|m| m.needs_deployment_id);
        let deployment_id = match shared {
            Some(id) => id,
            None if needed => recovery::deployment_id(pipeline.recovery_log())
                .map_err(|e| invalid("runtime.recovery_log", e.to_string()))?,
            None => String::new(),
        };
        // Recorded whether or not anything serves them: a few counters per transaction.
        let metrics = opts.metrics.unwrap_or_default();
        metrics.status.set_config(&pipeline.file);
        let mut templates = BTreeMap::new();
        for m in planned.materializations {
            let mut bindings = Vec::new();
            for (i, binding) in m.spec.bindings.iter().enumerate() {
                let collection = binding
                    .collection
                    .as_ref()
                    .map(|c| c.collection.clone())
                    .unwrap_or_default();
                bindings.push(projections::loop_binding(
                    planned.collections[&collection].clone(),
                    &m.spec,
                    i,
                ));
            }
            let mut feeds = Vec::new();
            for (name, def) in &pipeline.sources {
                let bindings: Vec<u32> = m
                    .spec
                    .bindings
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| {
                        b.collection
                            .as_ref()
                            .is_some_and(|c| c.collection == def.target)
                    })
                    .map(|(i, _)| i as u32)
                    .collect();
                if !bindings.is_empty() {
                    let collection = planned.collections[&def.target].clone();
                    feeds.push(SourceFeed {
                        intake: crate::intake::intake(def, collection.clone()),
                        collection,
                        materialization: m.name.clone(),
                        state_dir: pipeline.source_state_dir(&m.name, name),
                        shard_moves: pipeline.cluster.is_some(),
                        follow: opts.follow,
                        name: name.clone(),
                        def: def.clone(),
                        bindings,
                    });
                }
            }
            let template = Template {
                one_shard: pipeline.one_shard(&m.name),
                spec: m.spec,
                bindings,
                feeds,
                endpoint: m.endpoint,
                store_keeps_checkpoint: m.store_keeps_checkpoint,
                timeouts: pipeline.runtime.timeouts.outlasting(m.longest_call),
                shard: m.shard,
            };
            templates.insert(m.name, template);
        }
        Ok(Launcher {
            templates,
            log_root: pipeline.recovery_log().to_path_buf(),
            deployment_id,
            metrics,
            opts: txn_opts,
            progress,
            workers: pipeline.runtime.workers(),
        })
    }

    /// Each materialization's name.
    pub fn materializations(&self) -> impl Iterator<Item = &str> {
        self.templates.keys().map(String::as_str)
    }

    /// The shards `materialization` runs as in this process, over the range its
    /// pipeline file configures: split into `runtime.workers` shards where its parts
    /// allow ([`layout`]). Their lock is held until the returned value drops.
    ///
    /// Panics when the planned pipeline has no such materialization.
    pub async fn local_shards(
        &self,
        materialization: &str,
    ) -> Result<layout::LocalShards, PipelineError> {
        let t = &self.templates[materialization];
        if let Some(why) = &t.one_shard
            && self.workers > 1
        {
            tracing::info!(
                materialization,
                "runs as one shard, not {} (runtime.workers): {why}",
                self.workers
            );
        }
        let dir = self.log_root.join(materialization);
        let (range, workers, can_split) = (t.shard, self.workers, t.one_shard.is_none());
        let shards =
            crate::blocking::unblock(move || layout::local_shards(&dir, range, workers, can_split));
        let place = format!("materializations.{materialization}");
        shards.await.map_err(|e| invalid(place, e.to_string()))
    }

    /// The loop of materialization `materialization`'s shards over `ranges` (in key
    /// order, disjoint; each with its log), one reader shared by them all, reopened
    /// after retryable failures until its sources end, it fails, or `shutdown` (after
    /// the transaction in progress). Resolves to what it committed.
    ///
    /// Panics when the planned pipeline has no such materialization, or `ranges` is
    /// empty.
    pub fn launch(
        &self,
        materialization: &str,
        ranges: Vec<(config::ShardDef, LogPlace)>,
        shutdown: watch::Receiver<bool>,
    ) -> impl std::future::Future<Output = (Summary, Result<(), RunError>)> + Send + 'static {
        let t = &self.templates[materialization];
        let (first, last) = (ranges[0].0, ranges[ranges.len() - 1].0);
        let count = ranges.len();
        let ids: Vec<String> = ranges.iter().map(|(range, _)| range.id()).collect();
        let contiguous =
            (ranges.windows(2)).all(|w| w[0].0.key_end.checked_add(1) == Some(w[1].0.key_begin));
        let shards = ranges
            .into_iter()
            .map(|(range, log)| {
                let shard = Shard {
                    open: Open {
                        version: applied::version(&t.spec),
                        materialization: Some(t.spec.clone()),
                        key_begin: range.key_begin,
                        key_end: range.key_end,
                        driver_checkpoint_json: Vec::new(),
                    },
                    bindings: t.bindings.clone(),
                };
                let metrics = (self.metrics).shard(&shard, t.feeds.iter().map(|f| f.name.as_str()));
                AttemptShard {
                    shard,
                    metrics: Arc::new(metrics),
                    log,
                }
            })
            .collect();
        let attempt = Attempt {
            shards,
            endpoint: t.endpoint.clone(),
            store_keeps_checkpoint: t.store_keeps_checkpoint,
            deployment_id: self.deployment_id.clone(),
            feeds: t.feeds.clone(),
            log_dir: self.log_root.join(materialization),
            // Local shards share the process's memory; each of a cluster's is its own.
            opts: match count {
                1 => self.opts.clone(),
                n => TxnOptions {
                    memory_budget: self.opts.memory_budget / n,
                    ..self.opts.clone()
                },
            },
            threads: (self.workers as usize).clamp(1, count),
            timeouts: t.timeouts,
            progress: self.progress.clone(),
            shutdown,
        };
        // Every line logged by this group's work, its retries included, carries its
        // materialization and range (the ranges of a cluster member's shards need not
        // touch: each is named).
        let range = if contiguous {
            config::ShardDef {
                key_begin: first.key_begin,
                key_end: last.key_end,
            }
            .id()
        } else {
            ids.join(",")
        };
        let span = tracing::info_span!(
            "materialization",
            materialization = %materialization,
            shard = %range,
            shards = count,
        );
        async move {
            let (summary, result) = attempt.run_with_restarts().await;
            for shard in &attempt.shards {
                shard.metrics.ended(result.is_ok());
            }
            attempt.record_end().await;
            (summary, result)
        }
        .instrument(span)
    }
}

/// A source of the pipeline file and the bindings of one materialization it feeds.
#[derive(Clone)]
struct SourceFeed {
    name: String,
    materialization: String,
    state_dir: std::path::PathBuf,
    /// A cluster's shard: it may move to another machine (`Opening::shard_moves`).
    shard_moves: bool,
    /// The run follows its sources (`--follow`).
    follow: bool,
    def: config::SourceDef,
    bindings: Vec<u32>,
    /// The check of its documents against its target collection, that it is opened
    /// with ([`crate::intake`]).
    intake: sluice_source_sdk::Intake,
    /// Its target collection, whose key routes its records.
    collection: Arc<crate::types::Collection>,
}

impl SourceFeed {
    /// Opens the source for the shards of key hashes `ranges` (in key order),
    /// reporting its connection to `health`.
    fn open(
        &self,
        ranges: &[config::ShardDef],
        health: &Health,
    ) -> Result<Box<dyn Source>, SourceError> {
        let shard_keys = crate::intake::shard_keys(
            self.def.envelope,
            self.collection.clone(),
            ranges.iter().map(|r| (r.key_begin, r.key_end)),
        );
        self.def.config.open(&sluice_source_sdk::Opening {
            shard_keys: Some(&shard_keys),
            name: &self.name,
            materialization: &self.materialization,
            state_dir: &self.state_dir,
            shard_moves: self.shard_moves,
            follow: self.follow,
            intake: Some(&self.intake),
            health,
        })
    }
}

/// Everything one materialization's group of shards needs to (re)start its loop.
struct Attempt {
    /// In key order.
    shards: Vec<AttemptShard>,
    endpoint: Arc<dyn Endpoint>,
    store_keeps_checkpoint: bool,
    deployment_id: String,
    feeds: Vec<SourceFeed>,
    /// `<recovery_log>/<materialization>`: what stays local in any case (default
    /// dead-letter files, how each shard's loop ended).
    log_dir: std::path::PathBuf,
    opts: TxnOptions,
    /// Threads that combine a step's shards' parts at once.
    threads: usize,
    timeouts: config::Timeouts,
    progress: Arc<Progress>,
    shutdown: watch::Receiver<bool>,
}

/// One shard of an [`Attempt`].
struct AttemptShard {
    shard: Shard,
    /// Its sources in the order of the attempt's `feeds`.
    metrics: Arc<ShardMetrics>,
    log: LogPlace,
}

impl Attempt {
    /// Runs the loop, reopening it with backoff after a retryable failure (a lost
    /// connection, a timeout, a source's I/O error: [`RunError::is_retryable`]), each
    /// retry logged with its cause. Recovery makes every restart exact: sources resume
    /// from the committed checkpoint and an interrupted step replays. Returns what was
    /// committed, also when an error ends the run.
    async fn run_with_restarts(&self) -> (Summary, Result<(), RunError>) {
        let mut summary = Summary::default();
        let mut retries = Retries::new();
        loop {
            let committed_before = summary.transactions;
            let err = match self.run_once(&mut summary).await {
                Ok(()) => return (summary, Ok(())),
                Err(RunError::Source(stopped @ SourceError::Interrupted { .. })) => {
                    tracing::info!(
                        "stopped: {stopped}; the transaction in progress was not committed, \
                         and the next run reads it again"
                    );
                    return (summary, Ok(()));
                }
                Err(err) => err,
            };
            if summary.transactions > committed_before {
                retries.progressed();
            }
            let retry = retries.failed(err.is_retryable(), &self.shutdown);
            for shard in &self.shards {
                shard.metrics.failed(&err, retry);
            }
            if !retry {
                return (summary, Err(err));
            }
            summary.restarts += 1;
            if !retries.wait(&err, "reopening", &self.shutdown).await {
                return (summary, Err(err));
            }
        }
    }

    /// Records the state the loop ended in beside its log ([`ended`]), for `sluice
    /// status` once the process is gone.
    async fn record_end(&self) {
        for shard in &self.shards {
            if let Err(err) = ended::record(&self.log_dir, shard.metrics.status.view()).await {
                tracing::warn!("cannot record how the loop ended: {err}");
            }
        }
    }

    async fn run_once(&self, summary: &mut Summary) -> Result<(), RunError> {
        for shard in &self.shards {
            shard.metrics.opening();
        }
        // One reader for every shard: its sources report their connection in the
        // first shard's metrics.
        let first = &self.shards[0].metrics;
        // The reader's key hashes: its shards' ranges.
        let ranges: Vec<config::ShardDef> = (self.shards.iter())
            .map(|s| config::ShardDef {
                key_begin: s.shard.open.key_begin,
                key_end: s.shard.open.key_end,
            })
            .collect();
        let mut sources = Vec::with_capacity(self.feeds.len());
        for (feed, metrics) in self.feeds.iter().zip(&first.sources) {
            let source = feed
                .open(&ranges, &metrics.health)
                .map_err(RunError::Source)?;
            sources.push(BoundSource {
                source,
                bindings: feed.bindings.clone(),
                dead_letter: feed.def.dead_letter_path(&self.log_dir),
                read_ahead: feed.def.read_ahead,
                envelope: feed.def.envelope,
            });
        }
        let mut shards = Vec::with_capacity(self.shards.len());
        for shard in &self.shards {
            let log = match &shard.log {
                LogPlace::Local(dir) => RecoveryLog::open_async(dir).await?,
                LogPlace::Shared(log) => log.open().await?,
            };
            shards.push(txn::ShardContext {
                shard: shard.shard.clone(),
                log,
                metrics: shard.metrics.clone(),
            });
        }
        let ctx = txn::Context {
            shards,
            endpoint: self.endpoint.clone(),
            store_keeps_checkpoint: self.store_keeps_checkpoint,
            deployment_id: self.deployment_id.clone(),
            sources,
            opts: self.opts.clone(),
            timeouts: self.timeouts,
            progress: self.progress.clone(),
            shutdown: self.shutdown.clone(),
            threads: self.threads,
        };
        txn::run(ctx, summary).await
    }
}
