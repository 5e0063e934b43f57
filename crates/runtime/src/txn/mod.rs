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
mod committer;
mod decide;
mod group;
mod phases;
mod progress;

pub use crate::types::{Binding, Collection, RunError, Shard, Summary};
pub use backfill::shared_source;
use committer::{Beside, Committer};
pub use group::shared_reads;
pub use progress::{LivePhase, Progress, Remaining};
pub(crate) use timed::bounded;
mod read;
mod state;
mod stored;
mod timed;

use crate::config::Timeouts;
use crate::deadletter::DeadLetterError;
use crate::metrics::ShardMetrics;
use crate::metrics::status::State;
use crate::recovery::{
    Checkpoint, Intent, RecoveryLog, RecoveryPlan, StoreCheckpoint, plan_recovery,
};
use crate::types::materialization_name;
use serde_json::Value;
use sluice_doc::KeyRange;
use sluice_doc::combine::{BindingSpec, CombinerOptions};
use sluice_driver_sdk::client::{self};
use sluice_driver_sdk::error::within;
use sluice_driver_sdk::machine::apply_driver_checkpoint;
use sluice_driver_sdk::{Endpoint, Error as DriverError, LogContext, LogHooks, Undecided};
use sluice_proto::flow;
use sluice_source_sdk::{Source, SourceError};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
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
    /// Step data one transaction's intent may journal (sources that cannot re-read
    /// their input): a batch is full beyond it. [`TxnOptions::MAX_JOURNALED`], or less
    /// where the recovery log's store bounds its records ([`RecoveryLog::journal_limit`]).
    pub max_journaled: u64,
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
    /// The group's shards, in key order, their ranges disjoint (a process's local shards
    /// cover one range; a cluster member's shards of one materialization need not touch).
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
        mut opts,
        timeouts,
        progress,
        shutdown,
        threads,
    } = ctx;
    // An intent must fit each shard's log: its journaled step data bounded by the
    // largest record the smallest of the logs' stores takes.
    for limit in shards.iter().filter_map(|s| s.log.journal_limit()) {
        opts.max_journaled = opts.max_journaled.min(limit);
    }
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
