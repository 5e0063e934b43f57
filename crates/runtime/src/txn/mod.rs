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
//!   two cores parse and store at the same time).
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

mod decide;
mod phases;
mod progress;

pub use crate::types::{Binding, Collection, RunError, Shard, Summary};
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

/// Everything one run of the loop takes.
pub struct Context {
    pub shard: Shard,
    pub endpoint: Arc<dyn Endpoint>,
    /// The store keeps the runtime checkpoint in its own transactions (an
    /// authoritative driver): one reporting none while the log has commits lost them.
    pub store_keeps_checkpoint: bool,
    /// The pipeline's deployment id, told to an in-process driver before Open.
    pub deployment_id: String,
    pub sources: Vec<BoundSource>,
    /// Opened by the caller: it holds the shard's lock.
    pub log: RecoveryLog,
    pub opts: TxnOptions,
    /// Bounds on every wait for the driver and every source call.
    pub timeouts: Timeouts,
    pub progress: Arc<Progress>,
    /// The shard's metrics, its sources in the order of `sources`.
    pub metrics: Arc<ShardMetrics>,
    pub shutdown: watch::Receiver<bool>,
}

/// What the committer and its reader share.
#[derive(Clone)]
struct Shared {
    bindings: Arc<Vec<Binding>>,
    key_range: KeyRange,
    progress: Arc<Progress>,
    opts: TxnOptions,
    metrics: Arc<ShardMetrics>,
    shutdown: watch::Receiver<bool>,
    /// Batches handed to the committer and not yet committed (see `read`).
    in_flight: Arc<InFlight>,
    /// The last transaction whose recovery-log commit is durable: the reader tells the
    /// sources ([`Source::committed`]).
    durable: Arc<watch::Sender<u64>>,
}

/// Batches sent by the reader and not yet done by the committer; zero means the
/// committer waits for work. The reader waits on [`InFlight::done`] when a batch of its
/// waits for the committer, so it sends it the moment the committer is free.
#[derive(Default)]
struct InFlight {
    batches: AtomicUsize,
    done: tokio::sync::Notify,
}

impl InFlight {
    fn sent(&self) {
        self.batches.fetch_add(1, Ordering::AcqRel);
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

/// Runs one materialization shard until its sources are exhausted (or `shutdown` fires),
/// committing every transaction exactly once. `summary` counts what was committed, also
/// when an error ends the run.
pub async fn run(ctx: Context, summary: &mut Summary) -> Result<(), RunError> {
    let Context {
        shard,
        endpoint,
        store_keeps_checkpoint,
        deployment_id,
        sources,
        log,
        opts,
        timeouts,
        progress,
        metrics,
        shutdown,
    } = ctx;
    let mut sources: Vec<BoundSource> = sources
        .into_iter()
        .map(|bound| BoundSource {
            source: timed::bounded(bound.source, timeouts.source, shutdown.clone()),
            ..bound
        })
        .collect();
    let store = (endpoint.as_ref(), store_keeps_checkpoint);
    let recovered = recover(&shard, store, log, deployment_id, &mut sources, timeouts).await?;
    metrics.status.enter(State::Running);
    progress.enter(LivePhase::Starting);
    let shared = Shared {
        key_range: KeyRange {
            begin: shard.open.key_begin,
            end: shard.open.key_end,
        },
        bindings: Arc::new(shard.bindings),
        progress,
        opts,
        metrics,
        shutdown,
        in_flight: Arc::new(InFlight::default()),
        durable: Arc::new(watch::Sender::new(recovered.checkpoint.txn)),
    };
    let (batches, reader) = read::spawn(
        sources,
        shared.clone(),
        recovered.replay,
        &recovered.checkpoint,
    );
    summary.last_txn = recovered.checkpoint.txn;
    let committer = Committer {
        endpoint: endpoint.name().to_string(),
        materialization: materialization_name(&shard.open),
        beside: Beside {
            hooks: recovered.hooks,
            timeout: timeouts.driver,
        },
        tx: recovered.tx,
        rx: recovered.rx,
        checkpoint: recovered.checkpoint,
        previous: stored::StoredDocs::empty(),
        shared,
        summary,
    };
    let result = committer.commit_all(batches, recovered.log).await;
    // Every task of this run ends before it returns: a restarted loop must not meet the
    // old reader (its sources, its dead-letter files). A run that ended well lets the
    // reader tell its sources of the last commits first.
    match result {
        Ok(()) => reader.join().await,
        Err(_) => reader.stop().await,
    }
    result
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
}

/// Opens the stream and plans recovery from the log's checkpoint and the store's
/// (authoritative drivers), positions every source at the chosen checkpoint, then
/// records it in the log.
async fn recover(
    shard: &Shard,
    (endpoint, keeps_checkpoint): (&dyn Endpoint, bool),
    mut log: RecoveryLog,
    deployment_id: String,
    sources: &mut [BoundSource],
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
    // A rewind: the store's checkpoint is older than what the log committed (and
    // released upstream). Each source goes back to it, or refuses naming the gap.
    let rewound = log_commit.as_ref().filter(|log| log.txn > checkpoint.txn);
    let seek_back = |source| match rewound {
        Some(log) => RunError::SeekBack {
            store_txn: checkpoint.txn,
            log_txn: log.txn,
            source,
        },
        None => RunError::Source(source),
    };
    for bound in sources {
        let name = bound.source.name().to_string();
        if let Some(position) = checkpoint.sources.get(&name) {
            bound.source.seek(position).await.map_err(seek_back)?;
        }
        if let Some(released) = rewound.and_then(|log| log.sources.get(&name)) {
            bound.source.rewound(released).await.map_err(seek_back)?;
        }
    }
    // Only once every source is there (a failed seek leaves the log as it was); durable
    // before any intent that follows it: the next transaction is numbered from
    // here, also when that goes back (a store restored from a backup).
    let adopted = checkpoint.clone();
    let log = crate::blocking::spawn(move || log.adopt(&adopted).map(|()| log))
        .await
        .map_err(|e| RunError::Internal(format!("adopting the recovered checkpoint: {e}")))??;
    Ok(Recovered {
        hooks,
        tx,
        rx,
        checkpoint,
        replay,
        log,
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
    /// it has no such calls or answers nothing.
    async fn ask<'h, F>(
        &'h self,
        endpoint: &str,
        what: impl FnOnce() -> String,
        call: impl FnOnce(&'h LogHooks) -> F,
    ) -> Result<Option<Value>, RunError>
    where
        F: std::future::Future<Output = Result<Option<Value>, DriverError>> + 'h,
    {
        let Some(hooks) = &self.hooks else {
            return Ok(None);
        };
        (within(self.timeout, what, call(hooks)).await).map_err(|e| driver_err(endpoint, e))
    }
}

/// The committer's side of one run: the stream, and what the last commit left.
struct Committer<'s> {
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
    summary: &'s mut Summary,
}

/// What one transaction moved, counted once it is committed.
struct Counts {
    docs: u64,
    bytes: u64,
    rejected: u64,
    loaded: u64,
    stored: u64,
}

impl Committer<'_> {
    /// Commits each batch the reader sends as one transaction, until the last.
    async fn commit_all(
        mut self,
        mut batches: tokio::sync::mpsc::Receiver<Result<read::ReadBatch, RunError>>,
        log: RecoveryLog,
    ) -> Result<(), RunError> {
        let mut state = LogState::Settled(Settled::recovered(log));
        loop {
            self.shared.progress.enter(LivePhase::Reading);
            let batch = match batches.recv().await {
                Some(Ok(batch)) => {
                    self.summary.idle += batch.tally.idle;
                    batch
                }
                failed => {
                    // Join the log commit in flight: a restart must find the log's lock
                    // free and its last record written.
                    let _ = state.settle().await;
                    return Err(match failed {
                        Some(Err(err)) => err,
                        _ => RunError::Internal("the reader stopped without a reason".into()),
                    });
                }
            };
            // The prior commit must be durable before it is acknowledged (and before a
            // new intent goes to the same log).
            let settled = state.settle().await?;
            crate::failpoint::fail_point!(AFTER_LOG_COMMIT, |e| driver_err(&self.endpoint, e));
            state = if !batch.is_transaction() {
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
        batch: read::ReadBatch,
        log: Settled,
    ) -> Result<LogState, RunError> {
        let read::ReadBatch {
            combiner: c1,
            steps,
            docs: _,
            bytes: _,
            owned: docs,
            owned_bytes: bytes,
            rejected,
            journaled: _,
            advances: _,
            last: _,
            tally,
        } = batch;
        // Intent: durable before any effect of this transaction reaches the driver.
        let txn = self.checkpoint.txn + 1;
        let mut intent = Intent {
            txn,
            steps,
            artifacts: Default::default(),
        };
        let what = || format!("the artifact intent of transaction {txn}");
        let asked = self
            .beside
            .ask(&self.endpoint, what, |h| h.artifact_intent(txn));
        if let Some(artifact) = asked.await? {
            intent
                .artifacts
                .insert(self.materialization.clone(), artifact);
        }
        let log = log.write_intent(&intent).await?;
        crate::failpoint::fail_point!(AFTER_INTENT, |e| driver_err(&self.endpoint, e));
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
        match self
            .rx
            .recv()
            .await
            .map_err(|e| driver_err(&self.endpoint, e))?
        {
            Response::DriverCommitted => {}
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
        merge_driver_checkpoint(
            &mut self.checkpoint,
            &self.materialization,
            &prepared.driver_checkpoint,
        )
        .map_err(|e| driver_err(&self.endpoint, e))?;
        // A decision known only once the transaction was staged (an epoch sink's
        // descriptor): the commit record holds it.
        let what = || format!("the decision of transaction {txn}");
        let asked = self.beside.ask(&self.endpoint, what, |h| h.decision(txn));
        if let Some(decision) = asked.await? {
            self.checkpoint
                .driver_checkpoints
                .insert(self.materialization.clone(), decision);
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
        let summary = &mut *self.summary;
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
    async fn finish(mut self, sent: Option<Instant>) -> Result<(), RunError> {
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

/// The combiners of a shard whose key range is `key_range`: every document read is
/// routed by its key's hash and the shard keeps only its own (every shard reads the
/// whole input, as in Flow).
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
fn merge_driver_checkpoint(
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
