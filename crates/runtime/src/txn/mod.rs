//! The transaction loop of one materialization shard.
//!
//! ```text
//!  T: read ──▶ combine (C1) ──▶ intent ──▶ Ack(T-1) + Loads ──▶ Prepare ──▶ Stores ──▶ Commit
//!      ▲        sources          durable     drain C1 → C2         │ Loaded → C2 (left)   │
//!      │                                                           ▼                      ▼
//!      └──── T+1 reads while T's recovery-log commit is fsync'ed ◀── DriverCommitted ◀────┘
//! ```
//!
//! - Reading ([`read`]): a task queues sources round-robin into combiner C1 (validate,
//!   key, reduce) until a bound, running one transaction ahead of the committer (so the
//!   two cores parse and store at the same time). One reader serves a group of key-range
//!   shards ([`group`]): each document goes to its shard's C1, and every shard, with a
//!   committer task, stream, fence range and log of its own, commits its part of each
//!   batch as the same transaction.
//! - Loads: C1 is drained in key order; each key of a standard binding that the last
//!   committed transaction stored goes left into C2 as it was stored ([`stored`]: no
//!   Load needed), any other becomes a Load (unless it lies above the highest key ever
//!   stored, so is known to be absent), and each document moves to combiner C2 as it is
//!   (compact). Loaded documents go to the *left* of C2 as they arrive (the two halves
//!   of the phase run at once, [`phases`]), so C2's budget bounds them too: both
//!   combiners spill, however many documents the store returns and whenever it does.
//! - Decision: after DriverCommitted the checkpoint is committed to the recovery log on a
//!   blocking task while the next transaction reads; Acknowledge is sent only once that
//!   commit is durable.
//!
//! Where the code is: [`run`] recovers (the log's checkpoint against the store's, see
//! [`crate::recovery::plan_recovery`]), spawns the reader, and hands each batch to the
//! `Committer`, one transaction at a time. The log's lifecycle is the state machine of
//! [`state`] (`Settled` → `IntentDurable` → `DriverCommitted` → `Committing` →
//! `Settled`), whose consuming transitions keep the invariants below; the reader's
//! decisions (when a batch closes, skip or fail on bad input) are the pure functions of
//! [`decide`].
//!
//! Invariants:
//! - The step intent of T is durable before any of T's effects reach the driver, so a
//!   crash can always replay T exactly (and detect a changed source by its hash).
//! - Nothing is acknowledged before the recovery log says it is durable.
//! - Any error ends the stream: the transaction in progress is never committed.
//! - T+1 reads while T's log commit fsyncs; T+1's intent is written only after it.
//! - A run ends only once every task it spawned has (the reader is aborted and awaited,
//!   a log commit in flight is awaited), so a restarted run never overlaps the last.
//!
//! Failures: a [`RunError`] keeps the typed error underneath, and
//! [`RunError::is_retryable`] decides by its kind whether the caller may reopen the loop
//! (`pipeline.rs` does, with backoff). Every wait on the driver is bounded by
//! `Context::timeouts.driver` (the stream's client and [`recover`]'s start), and every
//! source call by `timeouts.source` ([`timed`]); a timeout is retryable.
//!
//! Tested in-process with fail points at every boundary by `tests/loop.rs`.

mod backfill;
mod decide;
mod group;
mod phases;
mod progress;

pub use crate::types::{Binding, Collection, RunError, Shard, Summary};
pub use backfill::shared_source;
pub use progress::{LivePhase, Progress, Remaining};
pub(crate) use timed::bounded;
mod read;
mod state;
mod stored;
mod timed;

use crate::config::Timeouts;
use crate::deadletter::DeadLetterError;
use crate::metrics::status::State;
use crate::metrics::{CombinerRole, Committed, Phase, ShardMetrics};
use crate::recovery::{
    Checkpoint, Intent, RecoveryLog, RecoveryPlan, StoreCheckpoint, plan_recovery,
};
use crate::types::materialization_name;
use serde_json::Value;
use sluice_doc::KeyRange;
use sluice_doc::combine::{BindingSpec, Combiner, CombinerOptions};
use sluice_driver_sdk::client::{self, Response};
use sluice_driver_sdk::error::within;
use sluice_driver_sdk::machine::{apply_driver_checkpoint, violation};
use sluice_driver_sdk::{Endpoint, Error as DriverError, LogContext, LogHooks, Peer, Undecided};
use sluice_proto::flow;
use sluice_source_sdk::{Resume, Source, SourceError};
use state::{LogState, Settled};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tracing::Instrument;

/// Bounds of one transaction, and the combiners' memory.
#[derive(Debug, Clone)]
pub struct TxnOptions {
    pub max_docs: u64,
    pub max_bytes: u64,
    pub max_duration: Duration,
    /// A transaction waits at least this long for documents (batching a trickle).
    pub min_duration: Duration,
    pub memory_budget: usize,
    /// Keep asking (and waiting on) sources that are exhausted for now (follow mode).
    pub follow: bool,
}

/// A source and the bindings its documents feed.
pub struct BoundSource {
    pub source: Box<dyn Source>,
    pub bindings: Vec<u32>,
    /// `on_error: skip`: where rejected documents go. `None`: bad input fails the run.
    pub dead_letter: Option<std::path::PathBuf>,
    /// Above this much read ahead, the reader pauses the source.
    pub read_ahead: crate::config::ReadAhead,
    /// How its records wrap their documents.
    pub envelope: crate::envelope::Envelope,
}

/// A failure of a source, or of the dead-letter file it writes, as the run's error.
trait SourceFailure {
    fn into_run_error(self, source: &str) -> RunError;
}

impl SourceFailure for SourceError {
    /// The error names its source itself.
    fn into_run_error(self, _: &str) -> RunError {
        RunError::Source(self)
    }
}

impl SourceFailure for DeadLetterError {
    fn into_run_error(self, source: &str) -> RunError {
        RunError::DeadLetter {
            name: source.to_string(),
            source: self,
        }
    }
}

/// Everything one run of the loop takes: one group of a materialization's shards, which
/// share one reader of its sources ([`group`]).
pub struct Context {
    /// The group's shards, in key order, their ranges contiguous.
    pub shards: Vec<ShardContext>,
    pub endpoint: Arc<dyn Endpoint>,
    /// The store keeps the runtime checkpoint in its own transactions (an
    /// authoritative driver): one reporting none while the log has commits lost them.
    pub store_keeps_checkpoint: bool,
    /// The pipeline's deployment id, told to an in-process driver before Open.
    pub deployment_id: String,
    pub sources: Vec<BoundSource>,
    pub opts: TxnOptions,
    /// Bounds on every wait for the driver and every source call.
    pub timeouts: Timeouts,
    pub progress: Arc<Progress>,
    pub shutdown: watch::Receiver<bool>,
    /// Threads that combine a step's shards' parts at once.
    pub threads: usize,
}

/// One shard of a group: its range and bindings, its log, its metrics.
pub struct ShardContext {
    pub shard: Shard,
    /// Opened by the caller: it holds the shard's lock.
    pub log: RecoveryLog,
    /// The shard's metrics, its sources in the order of the group's `sources`.
    pub metrics: Arc<ShardMetrics>,
}

/// What a shard's committer shares with the group.
#[derive(Clone)]
struct Shared {
    bindings: Arc<Vec<Binding>>,
    key_range: KeyRange,
    progress: Arc<Progress>,
    opts: TxnOptions,
    metrics: Arc<ShardMetrics>,
    /// Shards' batches handed to committers and not yet committed (see `read`).
    in_flight: Arc<InFlight>,
    /// The last transaction whose recovery-log commit is durable: the reader tells the
    /// sources once it is in every shard ([`Source::committed`]).
    durable: Arc<watch::Sender<u64>>,
    /// Where this shard's intents meet the others' before a driver Commit.
    barrier: group::IntentBarrier,
    /// The shard's place in its group.
    index: usize,
}

/// Shards' batches sent by the reader and not yet done by their committers; zero means
/// every committer waits for work. The reader waits on [`InFlight::next_done`] when a
/// batch of its waits for the committers, so it sends it the moment they are free.
#[derive(Default)]
struct InFlight {
    batches: AtomicUsize,
    done: tokio::sync::Notify,
}

impl InFlight {
    /// A batch of `parts` shards' parts was sent.
    fn sent(&self, parts: usize) {
        self.batches.fetch_add(parts, Ordering::AcqRel);
    }

    fn done(&self) {
        self.batches.fetch_sub(1, Ordering::AcqRel);
        self.done.notify_one();
    }

    fn committer_idle(&self) -> bool {
        self.batches.load(Ordering::Acquire) == 0
    }

    /// Returns after the next [`InFlight::done`] (at once if one came unawaited).
    async fn next_done(&self) {
        self.done.notified().await;
    }
}

/// Runs one group of a materialization's shards until its sources are exhausted (or
/// `shutdown` fires), committing every transaction exactly once in every shard.
/// `summary` counts what was committed, also when an error ends the run.
pub async fn run(ctx: Context, summary: &mut Summary) -> Result<(), RunError> {
    let Context {
        shards,
        endpoint,
        store_keeps_checkpoint,
        deployment_id,
        sources,
        opts,
        timeouts,
        progress,
        shutdown,
        threads,
    } = ctx;
    let mut sources: Vec<BoundSource> = sources
        .into_iter()
        .map(|bound| BoundSource {
            source: timed::bounded(bound.source, timeouts.source, shutdown.clone()),
            ..bound
        })
        .collect();
    let store = (endpoint.as_ref(), store_keeps_checkpoint);
    let (shards, logs): (Vec<_>, Vec<_>) = shards
        .into_iter()
        .map(|s| ((s.shard, s.metrics), s.log))
        .unzip();
    let opened = shards
        .iter()
        .zip(logs)
        .map(|((shard, _), log)| recover(shard, store, log, deployment_id.clone(), timeouts));
    let mut recovered = futures::future::try_join_all(opened).await?;
    restart_backfills(&shards[0].0, &sources, &mut recovered)?;
    let start = start_group(&shards[0].0, &recovered)?;
    // A rewind: a store's checkpoint older than what its log committed (and released
    // upstream); the furthest such commit, with the checkpoint it went back to.
    let rewound = (recovered.iter())
        .filter_map(|r| {
            let log = r.log_commit.as_ref()?;
            (log.txn > r.checkpoint.txn).then(|| (r.checkpoint.txn, log.clone()))
        })
        .max_by_key(|(_, log)| log.txn);
    position_sources(&mut sources, &start.from, rewound).await?;
    let recovered = futures::future::try_join_all(recovered.into_iter().map(adopt)).await?;
    progress.enter(LivePhase::Starting);

    let bindings = Arc::new(shards[0].0.bindings.clone());
    let ranges: Vec<KeyRange> = (shards.iter())
        .map(|(shard, _)| KeyRange {
            begin: shard.open.key_begin,
            end: shard.open.key_end,
        })
        .collect();
    let reader_metrics: Vec<_> = shards.iter().map(|(_, m)| m.clone()).collect();
    let in_flight = Arc::new(InFlight::default());
    let barrier = group::IntentBarrier::new(recovered.iter().map(|r| r.checkpoint.txn).collect());
    let mut feeds = Vec::new();
    let mut durables = Vec::new();
    let mut committers = Vec::new();
    for (index, ((shard, metrics), r)) in shards.into_iter().zip(recovered).enumerate() {
        metrics.status.enter(State::Running);
        let durable = watch::Sender::new(r.checkpoint.txn);
        durables.push(durable.subscribe());
        let (feed, batches) = tokio::sync::mpsc::channel(1);
        feeds.push(feed);
        let committer = Committer {
            endpoint: endpoint.name().to_string(),
            materialization: materialization_name(&shard.open),
            beside: Beside {
                hooks: r.hooks,
                timeout: timeouts.driver,
            },
            tx: r.tx,
            rx: r.rx,
            previous: stored::StoredDocs::empty(),
            shared: Shared {
                bindings: bindings.clone(),
                key_range: ranges[index],
                progress: progress.clone(),
                opts: opts.clone(),
                metrics,
                in_flight: in_flight.clone(),
                durable: Arc::new(durable),
                barrier: barrier.clone(),
                index,
            },
            summary: Summary {
                last_txn: r.checkpoint.txn,
                ..Summary::default()
            },
            checkpoint: r.checkpoint,
        };
        // A task each: the shards' load and store phases run on every core.
        let log = r.log;
        let barrier = barrier.clone();
        let committed = async move {
            let mut committer = committer;
            let result = committer.commit_all(batches, log).await;
            if result.is_err() {
                barrier.fail();
            }
            (committer.summary, result)
        };
        // In a group of several, each shard's lines name its own range too.
        let span = match ranges.len() {
            1 => tracing::Span::current(),
            _ => tracing::info_span!("shard", range = %ranges[index]),
        };
        committers.push(tokio::spawn(committed.instrument(span)));
    }
    let group = read::ReaderGroup {
        bindings,
        ranges,
        metrics: reader_metrics,
        progress,
        opts,
        shutdown,
        in_flight: in_flight.clone(),
        durables: group::Durables::new(durables),
        threads,
    };
    let (batches, reader) = read::spawn(sources, group, start.replay, &start.from);
    // A reader's failure ends the feeds: each committer finishes the transaction in
    // hand (every shard has its part of it), then stops. A committer's failure fails
    // the barrier, so no shard waits for it.
    let dispatched = dispatch(batches, feeds, start.skips, &barrier, &in_flight).await;
    let mut failed = dispatched.err();
    for committer in committers {
        let (shard_summary, result) = match committer.await {
            Ok(ended) => ended,
            Err(join) => (
                Summary::default(),
                Err(RunError::Internal(format!(
                    "a shard's committer panicked: {join}"
                ))),
            ),
        };
        summary.merge(&shard_summary);
        if let Err(err) = result {
            let stopped = matches!(err, RunError::GroupStopped(_));
            match &failed {
                None => failed = Some(err),
                Some(RunError::GroupStopped(_)) if !stopped => failed = Some(err),
                Some(_) => {}
            }
        }
    }
    // Every task of this run ends before it returns: a restarted loop must not meet the
    // old reader (its sources, its dead-letter files). A run that ended well lets the
    // reader tell its sources of the last commits first.
    match failed {
        None => {
            reader.join().await;
            Ok(())
        }
        Some(err) => {
            reader.stop().await;
            Err(err)
        }
    }
}

/// Applies the spec's backfills to every shard's recovered checkpoint
/// ([`backfill::restart`]): the sources of a rebuilt binding start over.
fn restart_backfills(
    shard: &Shard,
    sources: &[BoundSource],
    recovered: &mut [Recovered],
) -> Result<(), RunError> {
    let Some(spec) = &shard.open.materialization else {
        return Ok(());
    };
    let feeds: Vec<backfill::Feed<'_>> = (sources.iter())
        .map(|s| backfill::Feed {
            name: s.source.name(),
            bindings: &s.bindings,
        })
        .collect();
    let refused = |reason: String| {
        RunError::Recovery(crate::recovery::RecoveryError::Backfill {
            materialization: materialization_name(&shard.open),
            reason,
        })
    };
    for r in recovered {
        let restarted = backfill::restart(&mut r.checkpoint, spec, &feeds).map_err(refused)?;
        if restarted.is_empty() {
            continue;
        }
        // An interrupted transaction read the sources at their old positions: it cannot
        // be replayed into a binding being rebuilt.
        if let Some(replay) = &r.replay {
            return Err(refused(format!(
                "transaction {} was interrupted before the backfill was applied; restore \
                 the bindings' backfill counters, run until it commits, then apply the \
                 backfill again",
                replay.txn
            )));
        }
        tracing::info!(
            range = %r.range,
            sources = %restarted.join(", "),
            "a backfill: these sources are read again from the beginning"
        );
    }
    Ok(())
}

/// Hands each shard its part of every batch the reader sends, until the last one, the
/// reader's failure (returned), or a shard's. A shard that committed the replayed
/// transaction already (`skips`, the first batch's) is not sent it.
async fn dispatch(
    mut batches: tokio::sync::mpsc::Receiver<Result<read::ReadBatch, RunError>>,
    feeds: Vec<tokio::sync::mpsc::Sender<read::ShardBatch>>,
    skips: Option<(u64, Vec<bool>)>,
    barrier: &group::IntentBarrier,
    in_flight: &InFlight,
) -> Result<(), RunError> {
    let mut skips = skips;
    loop {
        let batch = tokio::select! {
            batch = batches.recv() => batch,
            () = barrier.failed() => return Ok(()),
        };
        let batch = match batch {
            Some(batch) => batch?,
            None => {
                return Err(RunError::Internal(
                    "the reader stopped without a reason".into(),
                ));
            }
        };
        let (txn, last) = (batch.txn, batch.last);
        let skipping = skips.take_if(|(replayed, _)| Some(*replayed) == txn);
        for (index, (feed, part)) in feeds.iter().zip(batch.split()).enumerate() {
            if skipping.as_ref().is_some_and(|(_, skips)| skips[index]) {
                in_flight.done();
                continue;
            }
            // A shard that is gone failed: the barrier says so, and its error tells why.
            if feed.send(part).await.is_err() {
                return Ok(());
            }
        }
        if last {
            return Ok(());
        }
    }
}

/// Where the group starts ([`group::plan_group`]).
fn start_group(shard: &Shard, recovered: &[Recovered]) -> Result<GroupStart, RunError> {
    let checkpoints: Vec<_> = (recovered.iter())
        .map(|r| (&r.checkpoint, r.replay.as_ref()))
        .collect();
    let names: Vec<_> = recovered.iter().map(|r| r.range.to_string()).collect();
    let start = group::plan_group(&checkpoints, &names).map_err(|e| RunError::ShardsDiverged {
        materialization: materialization_name(&shard.open),
        reason: e.to_string(),
    })?;
    let skips = start.skips_replay.iter().any(|s| *s).then(|| {
        let replayed = start.replay.as_ref().map_or(0, |r| r.txn);
        (replayed, start.skips_replay)
    });
    Ok(GroupStart {
        from: start.from,
        replay: start.replay,
        skips,
    })
}

/// Where the group's reader starts, and which shards it does not send the replay to.
struct GroupStart {
    from: Checkpoint,
    replay: Option<Intent>,
    skips: Option<(u64, Vec<bool>)>,
}

/// Positions every source at `from`, the group's start. A rewind (`rewound`: a store's
/// checkpoint's transaction, older than the commit its log had released upstream)
/// takes each source back there, or is refused naming the gap.
async fn position_sources(
    sources: &mut [BoundSource],
    from: &Checkpoint,
    rewound: Option<(u64, Checkpoint)>,
) -> Result<(), RunError> {
    let rewound = rewound.as_ref();
    let seek_back = |source| match rewound {
        Some((store_txn, log)) => RunError::SeekBack {
            store_txn: *store_txn,
            log_txn: log.txn,
            source,
        },
        None => RunError::Source(source),
    };
    for bound in sources {
        let name = bound.source.name().to_string();
        if let Some(position) = from.sources.get(&name) {
            bound.source.seek(position).await.map_err(seek_back)?;
        }
        if let Some(released) = rewound.and_then(|(_, log)| log.sources.get(&name)) {
            bound.source.rewound(released).await.map_err(seek_back)?;
        }
    }
    Ok(())
}

/// Records a shard's recovered checkpoint in its log, once every source is there (a
/// failed seek leaves the log as it was); durable before any intent that follows it:
/// the next transaction is numbered from here, also when that goes back (a store
/// restored from a backup).
async fn adopt(mut recovered: Recovered) -> Result<Recovered, RunError> {
    let adopted = recovered.checkpoint.clone();
    let mut log = recovered.log;
    recovered.log = crate::blocking::spawn(move || log.adopt(&adopted).map(|()| log))
        .await
        .map_err(|e| RunError::Internal(format!("adopting the recovered checkpoint: {e}")))??;
    Ok(recovered)
}

/// The stream opened, and where the loop starts.
struct Recovered {
    hooks: Option<LogHooks>,
    tx: client::ClientSender,
    rx: client::ClientReceiver,
    /// The checkpoint processing begins at (the store's, if it reported one), which the
    /// log now holds as its last commit.
    checkpoint: Checkpoint,
    /// The interrupted transaction to replay first, exactly.
    replay: Option<Intent>,
    log: RecoveryLog,
    /// What the log had committed last, before recovery chose `checkpoint`.
    log_commit: Option<Checkpoint>,
    /// The shard's key range.
    range: KeyRange,
}

/// Opens a shard's stream and plans its recovery from the log's checkpoint and the
/// store's (authoritative drivers); the group then positions the sources
/// ([`position_sources`]) and each log [`adopt`]s its shard's checkpoint.
async fn recover(
    shard: &Shard,
    (endpoint, keeps_checkpoint): (&dyn Endpoint, bool),
    log: RecoveryLog,
    deployment_id: String,
    timeouts: Timeouts,
) -> Result<Recovered, RunError> {
    let driver_err = |e| driver_err(endpoint.name(), e);
    let mut open = shard.open.clone();
    let log_commit = log.last_commit().cloned();
    // The log's driver checkpoint; `{}` when the log holds this materialization's
    // history but no driver checkpoint (an intent before the first commit); empty only
    // when the log holds nothing of it, which a driver keeping no checkpoint of its own
    // (Redis) takes as "nothing written yet".
    let driver_cp = (log_commit.as_ref())
        .and_then(|cp| cp.driver_checkpoints.get(&materialization_name(&open)));
    if let Some(driver_cp) = driver_cp {
        open.driver_checkpoint_json = driver_cp.to_string().into_bytes();
    } else if log_commit.is_some() || log.pending_intent().is_some() {
        open.driver_checkpoint_json = b"{}".to_vec();
    }
    let mut stream = within(
        timeouts.driver,
        || "the Transactions stream to start".into(),
        endpoint.transactions(),
    )
    .await
    .map_err(driver_err)?;
    // In process: what the log holds beyond the protocol, before Open.
    let hooks = stream.hooks.take();
    if let Some(hooks) = &hooks {
        let context = LogContext {
            deployment_id,
            undecided: undecided(&log, &materialization_name(&open)),
        };
        within(
            timeouts.driver,
            || "the driver to take the log's context".into(),
            hooks.opening(context),
        )
        .await
        .map_err(driver_err)?;
    }
    let committed = log_commit.as_ref().map_or(0, |c| c.txn);
    let materialization = materialization_name(&open);
    let (tx, rx, opened) = client::open(stream, open, timeouts.driver)
        .await
        .map_err(|source| match source {
            DriverError::Config(_) if committed > 0 => RunError::OpenAfterCommits {
                endpoint: endpoint.name().to_string(),
                materialization: materialization.clone(),
                log_txn: committed,
                source,
            },
            source => driver_err(source),
        })?;
    let store = StoreCheckpoint::from_opened(&opened.flow_checkpoint, keeps_checkpoint).map_err(
        |source| RunError::StoreCheckpoint {
            endpoint: endpoint.name().to_string(),
            source,
        },
    )?;
    let plan = plan_recovery(log_commit.as_ref(), &store, log.pending_intent());
    crate::failpoint::fail_point!(RECOVERY_AFTER_OPEN, driver_err);
    let (checkpoint, replay) = match plan {
        // Nothing was ever stored through this shard: track the highest stored key of
        // every standard binding from the first transaction on, to skip loads of keys
        // that cannot exist.
        RecoveryPlan::Fresh => (
            Checkpoint {
                max_keys: shard
                    .bindings
                    .iter()
                    .filter(|b| !b.delta_updates)
                    .map(|b| (b.resource.clone(), String::new()))
                    .collect(),
                ..Checkpoint::default()
            },
            None,
        ),
        // The store may still hold documents of an earlier history: track no key, so
        // every key is loaded.
        RecoveryPlan::Rebuild => (Checkpoint::default(), None),
        RecoveryPlan::ResumeFrom(cp) => (cp, None),
        RecoveryPlan::ReplayThenResume { from, replay } => (from, Some(replay)),
        RecoveryPlan::StoreLost { log_txn } => {
            return Err(RunError::StoreLost {
                endpoint: endpoint.name().to_string(),
                materialization,
                log_txn,
            });
        }
    };
    // An apply before the first transaction left the driver's Applied state in the
    // log's commit of transaction 0 (`pipeline/apply.rs`): a start from nothing carries
    // it on, so the first commit records it.
    let mut checkpoint = checkpoint;
    let applied_state = (log_commit.as_ref())
        .filter(|c| c.txn == 0)
        .and_then(|c| c.driver_checkpoints.get(&materialization));
    if checkpoint.txn == 0
        && let Some(state) = applied_state
    {
        (checkpoint.driver_checkpoints)
            .entry(materialization.clone())
            .or_insert_with(|| state.clone());
    }
    Ok(Recovered {
        hooks,
        tx,
        rx,
        checkpoint,
        replay,
        log,
        log_commit,
        range: KeyRange {
            begin: shard.open.key_begin,
            end: shard.open.key_end,
        },
    })
}

/// An in-process driver's calls beside the protocol, each bounded by the driver timeout.
struct Beside {
    /// `None` for a driver across the wire: it has no such calls.
    hooks: Option<LogHooks>,
    timeout: std::time::Duration,
}

impl Beside {
    /// Asks `call` of the driver (`what` names it if the timeout runs out); `None` when
    /// it has no such calls.
    async fn ask<'h, T, F>(
        &'h self,
        endpoint: &str,
        what: impl FnOnce() -> String,
        call: impl FnOnce(&'h LogHooks) -> F,
    ) -> Result<Option<T>, RunError>
    where
        F: std::future::Future<Output = Result<T, DriverError>> + 'h,
    {
        let Some(hooks) = &self.hooks else {
            return Ok(None);
        };
        let answer = within(self.timeout, what, call(hooks)).await;
        answer.map(Some).map_err(|e| driver_err(endpoint, e))
    }
}

/// The committer's side of one run: the stream, and what the last commit left.
struct Committer {
    endpoint: String,
    materialization: String,
    /// In process: the driver's calls beside the protocol (artifact intents, decisions).
    beside: Beside,
    tx: client::ClientSender,
    rx: client::ClientReceiver,
    /// The last committed checkpoint; during a transaction, the one it will commit.
    checkpoint: Checkpoint,
    /// What the last committed transaction stored: the next one's loads of those keys.
    previous: stored::StoredDocs,
    shared: Shared,
    /// What it committed.
    summary: Summary,
}

/// What one transaction moved, counted once it is committed.
struct Counts {
    docs: u64,
    bytes: u64,
    rejected: u64,
    loaded: u64,
    stored: u64,
}

impl Committer {
    /// Commits each batch the group sends as one transaction, until the last.
    async fn commit_all(
        &mut self,
        mut batches: tokio::sync::mpsc::Receiver<read::ShardBatch>,
        log: RecoveryLog,
    ) -> Result<(), RunError> {
        let mut state = LogState::Settled(Settled::recovered(log));
        loop {
            self.shared.progress.enter(LivePhase::Reading);
            let batch = match batches.recv().await {
                Some(batch) => {
                    self.summary.idle += batch.tally.idle;
                    batch
                }
                None => {
                    // Join the log commit in flight: a restart must find the log's lock
                    // free and its last record written.
                    let _ = state.settle().await;
                    return Err(RunError::GroupStopped(
                        "the reader or another shard of this materialization failed".into(),
                    ));
                }
            };
            // The prior commit must be durable before it is acknowledged (and before a
            // new intent goes to the same log).
            let settled = state.settle().await?;
            crate::failpoint::fail_point!(AFTER_LOG_COMMIT, |e| driver_err(&self.endpoint, e));
            state = if !batch.transaction {
                // Acknowledge the prior commit now, so that idempotent-apply drivers apply
                // it without waiting for more input.
                let sent = matches!(settled, Settled::AckOwed(_)).then(Instant::now);
                let settled = settled
                    .acknowledge(&mut self.tx)
                    .await
                    .map_err(|e| driver_err(&self.endpoint, e))?;
                if batch.last {
                    return self.finish(sent).await;
                }
                LogState::Settled(settled)
            } else {
                // Every line of the transaction's work carries its number.
                let span = tracing::info_span!("txn", txn = self.checkpoint.txn + 1);
                self.transaction(batch, settled).instrument(span).await?
            };
            self.shared.in_flight.done();
        }
    }

    /// Commits one batch as transaction `checkpoint.txn + 1`, through every state of
    /// [`state`]: returns once the driver committed it, with its log commit in flight.
    async fn transaction(
        &mut self,
        batch: read::ShardBatch,
        log: Settled,
    ) -> Result<LogState, RunError> {
        let read::ShardBatch {
            combiner: c1,
            steps,
            transaction: _,
            docs,
            bytes,
            rejected,
            txn: numbered,
            last: _,
            tally,
        } = batch;
        // Intent: durable before any effect of this transaction reaches the driver.
        let txn = self.checkpoint.txn + 1;
        if numbered.is_some_and(|numbered| numbered != txn) {
            return Err(RunError::Internal(format!(
                "the reader numbered transaction {numbered:?}, but this shard's next is {txn}"
            )));
        }
        let mut intent = Intent {
            txn,
            steps,
            artifacts: Default::default(),
        };
        let what = || format!("the artifact intent of transaction {txn}");
        let asked = self
            .beside
            .ask(&self.endpoint, what, |h| h.artifact_intent(txn));
        if let Some(artifact) = asked.await?.flatten() {
            intent
                .artifacts
                .insert(self.materialization.clone(), artifact);
        }
        let log = log.write_intent(&intent).await?;
        self.shared.barrier.intent_durable(self.shared.index, txn);
        crate::failpoint::fail_point!(AFTER_INTENT, |e| driver_err(&self.endpoint, e));
        // Every shard's intent of this transaction is durable before any of them may
        // commit it, so the shards recover at most one transaction apart ([`group`]).
        // Waited for here, before this shard touches its store: a shard waiting while
        // it held the store's write lock (SQLite's is one per file) could wait on a
        // shard that waits for that lock to finish the transaction before.
        self.shared.barrier.all_durable(txn).await?;
        for (source, resumes) in &intent.steps {
            if let Some(position) = resumes.last().and_then(Resume::position) {
                self.checkpoint
                    .sources
                    .insert(source.clone(), position.clone());
            }
        }
        self.checkpoint.txn = txn;

        // Load phase: Acknowledge(T-1), Loads from C1 (drained into C2), Prepare.
        self.shared.progress.enter(LivePhase::Loading);
        let started = Instant::now();
        let metrics = self.shared.metrics.clone();
        metrics.combiner(CombinerRole::Read, &c1.stats());
        let ack_owed = log.ack() == state::Ack::Owed;
        let c2 = std::sync::Mutex::new(Combiner::new(
            binding_specs(&self.shared.bindings, Drains::IntoStores),
            combiner_options(&self.shared.opts, self.shared.key_range),
        ));
        let (acked_tx, acked_rx) = tokio::sync::oneshot::channel();
        let loads = phases::LoadPhase {
            c1,
            c2: &c2,
            previous: std::mem::replace(&mut self.previous, stored::StoredDocs::empty()),
            bindings: &self.shared.bindings,
            ack: log.ack(),
            checkpoint: &mut self.checkpoint,
        };
        // Either side failing ends the phase at once: waiting for the other could hang
        // (a receiver waits for a Prepared that a failed sender will never ask for).
        let both = tokio::try_join!(
            phases::send_loads(&mut self.tx, loads, acked_rx),
            phases::recv_loaded(&mut self.rx, acked_tx, &c2, &self.shared.bindings),
        );
        let (sent, prepared) = match both {
            Ok(sent_and_received) => sent_and_received,
            Err(err) => return Err(self.phase_error(err).await),
        };
        let prepared_at = Instant::now();
        crate::failpoint::fail_point!(AFTER_PREPARED, |e| driver_err(&self.endpoint, e));
        let to_store = match sent.delta_only {
            Some(c1) => c1,
            None => {
                let c2 = c2
                    .into_inner()
                    .expect("no reduction panicked in the load phase");
                metrics.combiner(CombinerRole::Load, &c2.stats());
                c2
            }
        };

        // Store phase.
        self.shared.progress.enter(LivePhase::Storing);
        let mut kept = stored::StoredDocsBuilder::new(to_store.stats().spilled_runs == 0);
        let stores =
            match phases::send_stores(&mut self.tx, to_store, &self.shared.bindings, &mut kept)
                .await
            {
                Ok(stores) => stores,
                Err(err) => return Err(self.phase_error(err).await),
            };
        let stored_at = Instant::now();
        self.shared.progress.enter(LivePhase::Committing);
        if let Err(err) = self.tx.commit().await {
            return Err(self.phase_error(phases::PhaseError::Driver(err)).await);
        }
        let committed = (self.rx.recv().await).map_err(|e| driver_err(&self.endpoint, e))?;
        // The driver's StartedCommit state: transactional, recorded with this commit.
        let committed_state = phases::state_update(&committed);
        match committed {
            Response::DriverCommitted(_) => {}
            // Not reached: the client's machine accepts only DriverCommitted here.
            other => {
                let violation = violation(Peer::Driver, "DriverCommitted", format!("{other:?}"));
                return Err(driver_err(&self.endpoint, violation.into()));
            }
        }
        let committed_at = Instant::now();
        let log = log.driver_committed();
        crate::failpoint::fail_point!(AFTER_DRIVER_COMMITTED, |e| driver_err(&self.endpoint, e));
        self.previous = kept.finish();
        let (loaded, stored) = (
            prepared.loaded.iter().sum::<u64>(),
            stores.docs.iter().sum::<u64>(),
        );
        tracing::debug!(
            docs,
            loaded,
            reused = sent.reused,
            stored,
            load_ms = (prepared_at - started).as_millis() as u64,
            store_ms = (stored_at - prepared_at).as_millis() as u64,
            commit_ms = (committed_at - stored_at).as_millis() as u64,
            "transaction committed"
        );
        self.count(Counts {
            docs,
            bytes,
            rejected,
            loaded,
            stored,
        });
        let durable = metrics.committed(Committed {
            txn,
            docs,
            bytes,
            sources: tally.sources,
            combined: tally.combined,
            loaded: prepared.loaded,
            stored: stores.docs,
            deleted: stores.deletions,
            phases: [
                (Phase::Read, tally.took),
                (Phase::Loads, sent.at - started),
                (Phase::Prepare, prepared_at - sent.at),
                (Phase::Store, stored_at - prepared_at),
                (Phase::Commit, committed_at - stored_at),
            ],
            // Sent first thing in the phase, when owed (else while the loop was idle).
            acknowledged: (prepared.acknowledged)
                .filter(|_| ack_owed)
                .map(|acknowledged| acknowledged - started),
            first_read: tally.first_read,
            positions: self.checkpoint.sources.clone(),
        });

        // Decision: record the commit durably, overlapping the next transaction's reads.
        // The driver's state updates in the order it sent them: the prior commit's
        // Acknowledged state, this transaction's Prepared, then its StartedCommit state.
        let updates = (prepared.acknowledged_state.iter())
            .chain([&prepared.driver_checkpoint])
            .chain(committed_state.iter());
        for update in updates {
            merge_driver_checkpoint(&mut self.checkpoint, &self.materialization, update)
                .map_err(|e| driver_err(&self.endpoint, e))?;
        }
        // A decision known only once the transaction was staged (an epoch sink's
        // descriptor): the commit record holds it.
        let what = || format!("the decision of transaction {txn}");
        let asked = self.beside.ask(&self.endpoint, what, |h| h.decision(txn));
        if let Some(decision) = asked.await?.flatten() {
            self.checkpoint
                .driver_checkpoints
                .insert(self.materialization.clone(), decision);
        }
        // What the driver reports of itself now that it committed (its memory, its own
        // metrics, its health): into the metrics and the status.
        let what = || format!("the report after transaction {txn}");
        let asked = self.beside.ask(&self.endpoint, what, LogHooks::report);
        if let Some(report) = asked.await? {
            metrics.reported(&report);
        }
        Ok(log.commit(
            self.checkpoint.clone(),
            self.shared.durable.clone(),
            durable,
        ))
    }

    /// Counts a committed transaction: counted once committed, so a restarted run never
    /// counts a document twice.
    fn count(&mut self, n: Counts) {
        let summary = &mut self.summary;
        summary.docs += n.docs;
        summary.rejected += n.rejected;
        summary.bytes += n.bytes;
        summary.loaded += n.loaded;
        summary.stored += n.stored;
        summary.transactions += 1;
        summary.last_txn = self.checkpoint.txn;
        let progress = &self.shared.progress;
        progress.docs.fetch_add(n.docs, Ordering::Relaxed);
        progress.bytes.fetch_add(n.bytes, Ordering::Relaxed);
        progress.transactions.fetch_add(1, Ordering::Relaxed);
        progress.stored.fetch_add(n.stored, Ordering::Relaxed);
    }

    /// Ends a run whose input is exhausted: the last Acknowledge was sent (just now, at
    /// `sent`, or while the loop idled); waits for the driver to confirm it, then closes
    /// the stream.
    async fn finish(&mut self, sent: Option<Instant>) -> Result<(), RunError> {
        phases::expect_acknowledged(&mut self.rx)
            .await
            .map_err(|e| driver_err(&self.endpoint, e))?;
        if let Some(sent) = sent {
            self.shared
                .metrics
                .observe(Phase::Acknowledge, sent.elapsed());
        }
        Ok(())
    }

    /// The error that ends a failed phase. A failed send usually means the driver ended
    /// the stream: its own reason, if it gives one promptly, says more.
    async fn phase_error(&mut self, err: phases::PhaseError) -> RunError {
        match err {
            phases::PhaseError::Combine(e) => e.into(),
            phases::PhaseError::Loaded { binding, reason } => RunError::Loaded {
                endpoint: self.endpoint.clone(),
                binding,
                resource: (self.shared.bindings.get(binding as usize))
                    .map_or_else(|| "no such binding".into(), |b| b.resource.clone()),
                reason,
            },
            phases::PhaseError::Driver(e) => driver_err(
                &self.endpoint,
                phases::receiver_error(&mut self.rx).await.unwrap_or(e),
            ),
        }
    }
}

fn driver_err(endpoint: &str, source: DriverError) -> RunError {
    RunError::Driver {
        endpoint: endpoint.to_string(),
        source,
    }
}

/// The artifact intents of `materialization` the log holds undecided: its pending
/// intent's, if any.
fn undecided(log: &RecoveryLog, materialization: &str) -> Vec<Undecided> {
    log.pending_intent()
        .and_then(|intent| {
            let artifact = intent.artifacts.get(materialization)?;
            Some(Undecided {
                epoch: intent.txn,
                intent: artifact.clone(),
            })
        })
        .into_iter()
        .collect()
}

/// Where a combiner's drained documents go, which decides its reductions.
#[derive(Clone, Copy, PartialEq)]
enum Drains {
    /// Into the next combiner (the reader's C1): partial reductions, as more documents
    /// (loaded ones, to their left) are still to come.
    IntoCombiner,
    /// Into Store messages (C2): a standard binding's result per key is a full reduction;
    /// a delta-updates binding's stays partial, keeping its tombstones.
    IntoStores,
}

fn binding_specs(bindings: &[Binding], drains: Drains) -> Vec<BindingSpec> {
    bindings
        .iter()
        .map(|b| BindingSpec {
            schema: b.collection.schema.clone(),
            key: b.collection.key.clone(),
            name: b.collection.name.clone(),
            full: drains == Drains::IntoStores && !b.delta_updates,
            deletions: !b.delta_updates,
        })
        .collect()
}

/// The combiners of a shard whose key range is `key_range`: the reader's (C1) take
/// `KeyRange::ALL`, as the reader routed every document to its shard; the committer's
/// (C2) check that each loaded document is of the shard's range.
fn combiner_options(opts: &TxnOptions, key_range: KeyRange) -> CombinerOptions {
    CombinerOptions {
        memory_budget: opts.memory_budget,
        spill_dir: None,
        key_range,
    }
}

fn source_err(name: &str, err: impl SourceFailure) -> RunError {
    err.into_run_error(name)
}

/// Applies the driver's checkpoint update (replacement or RFC 7396 merge patch).
pub(crate) fn merge_driver_checkpoint(
    checkpoint: &mut Checkpoint,
    materialization: &str,
    update: &flow::DriverCheckpoint,
) -> Result<(), DriverError> {
    let previous = checkpoint
        .driver_checkpoints
        .get(materialization)
        .map(|v| v.to_string().into_bytes())
        .unwrap_or_default();
    let next = apply_driver_checkpoint(&previous, update)?;
    let next: Value = serde_json::from_slice(&next).expect("apply_driver_checkpoint returns JSON");
    checkpoint
        .driver_checkpoints
        .insert(materialization.to_string(), next);
    Ok(())
}
