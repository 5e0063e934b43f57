//! The transaction loop of one materialization shard.
//!
//! ```text
//!  T: read ──▶ combine (C1) ──▶ intent ──▶ Ack(T-1) + Loads ──▶ Prepare ──▶ Stores ──▶ Commit
//!      ▲        sources          durable     drain C1 → C2         │ Loaded → C2 (left)   │
//!      │                                                           ▼                      ▼
//!      └──── T+1 reads while T's recovery-log commit is fsync'ed ◀── DriverCommitted ◀────┘
//! ```
//!
//! - Reading: sources are queued round-robin into combiner C1 (validate, key, reduce)
//!   until a bound (documents, bytes, duration) is reached or every source is exhausted.
//! - Loads: C1 is drained in key order; each key of a standard binding becomes a Load
//!   (unless it lies above the highest key ever stored, so is known to be absent), and
//!   each document moves to combiner C2. Loaded documents later go to the *left* of C2.
//!   Two combiners keep memory bounded (both spill) even though Loaded responses may be
//!   deferred by the driver until Prepare.
//! - Decision: after DriverCommitted the checkpoint is committed to the recovery log on a
//!   blocking task while the next transaction reads; Acknowledge is sent only once that
//!   commit is durable.
//!
//! Invariants:
//! - The step intent of T is durable before any of T's effects reach the driver, so a
//!   crash can always replay T exactly (and detect a changed source by its hash).
//! - Nothing is acknowledged before the recovery log says it is durable.
//! - Any error ends the stream: the transaction in progress is never committed.

use crate::recovery::{Checkpoint, Intent, RecoveryLog, RecoveryPlan, plan_recovery};
use crate::source::{QueueLimits, Record, Resume, Source, Step};
use serde_json::Value;
use sluice_doc::combine::{BindingSpec, CombineError, Combiner, CombinerOptions, Drained};
use sluice_doc::{KeyExtractor, Pointer, Schema, tuple};
use sluice_driver::arena::{self, LoadBuilder, StoreBuilder, StoreDoc};
use sluice_driver::client::{self, ClientReceiver, ClientSender, Response};
use sluice_driver::{Endpoint, Error as DriverError};
use sluice_proto::flow;
use sluice_proto::materialize::transaction_request::{Open, Prepare};
use sluice_proto::materialize::transaction_response::Loaded;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// Bounds of one transaction, and the combiners' memory.
#[derive(Debug, Clone)]
pub struct TxnOptions {
    pub max_docs: u64,
    pub max_bytes: u64,
    pub max_duration: Duration,
    /// A transaction waits at least this long for documents (batching a trickle).
    pub min_duration: Duration,
    pub memory_budget: usize,
    /// Keep polling sources that are exhausted for now (follow mode).
    pub follow: bool,
}

/// A compiled collection, shared by every binding that reads it.
pub struct Collection {
    pub name: String,
    pub schema: Arc<Schema>,
    pub key: KeyExtractor,
    /// The key's JSON pointers, as written in the pipeline file.
    pub key_ptrs: Vec<String>,
}

/// One binding of the materialization, as the loop needs it.
pub struct Binding {
    pub collection: Arc<Collection>,
    pub delta_updates: bool,
    /// Pointers of the selected value fields, in field-selection order.
    pub values: Vec<Pointer>,
}

/// A source and the bindings its documents feed.
pub struct BoundSource {
    pub source: Box<dyn Source>,
    pub bindings: Vec<u32>,
}

/// Live counters, read by the CLI's progress bar.
#[derive(Debug, Default)]
pub struct Progress {
    pub docs: AtomicU64,
    pub bytes: AtomicU64,
    pub transactions: AtomicU64,
    pub stored: AtomicU64,
}

/// What a finished run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub transactions: u64,
    pub docs: u64,
    pub bytes: u64,
    pub loaded: u64,
    pub stored: u64,
    /// The transaction number of the last commit.
    pub last_txn: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{position}: {reason}")]
    Input { position: String, reason: String },
    #[error("{position}: {source}")]
    Document {
        position: String,
        #[source]
        source: CombineError,
    },
    #[error(transparent)]
    Combine(#[from] CombineError),
    #[error("source {name}: {message}")]
    Source { name: String, message: String },
    #[error("driver {endpoint}: {source}")]
    Driver {
        endpoint: String,
        #[source]
        source: DriverError,
    },
    #[error("recovery log: {0}")]
    Recovery(String),
    #[error("{0}")]
    Internal(String),
}

/// The shard a loop runs for.
pub struct Shard {
    pub open: Open,
    pub bindings: Vec<Binding>,
}

/// Runs one materialization shard until its sources are exhausted (or `shutdown` fires),
/// committing every transaction exactly once.
pub async fn run(
    shard: Shard,
    endpoint: Arc<dyn Endpoint>,
    mut sources: Vec<BoundSource>,
    log: RecoveryLog,
    opts: TxnOptions,
    progress: Arc<Progress>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<Summary, RunError> {
    let name = endpoint.name().to_string();
    let driver_err = |source: DriverError| RunError::Driver {
        endpoint: name.clone(),
        source,
    };

    // Recover: the store's checkpoint (authoritative drivers) against the log's.
    let mut open = shard.open.clone();
    let log_commit = log.last_commit().cloned();
    if let Some(cp) = &log_commit {
        if let Some(driver_cp) = cp.driver_checkpoints.get(&materialization_name(&open)) {
            open.driver_checkpoint_json = serde_json::to_vec(driver_cp).unwrap_or_default();
        }
    }
    let stream = endpoint.transactions().await.map_err(driver_err)?;
    let (mut tx, mut rx, opened) = client::open(stream, open.clone())
        .await
        .map_err(driver_err)?;
    let store_checkpoint = Checkpoint::from_bytes(&opened.flow_checkpoint)
        .map_err(|e| RunError::Recovery(format!("checkpoint recovered from the store: {e}")))?;
    let plan = plan_recovery(
        log_commit.as_ref(),
        store_checkpoint.as_ref(),
        log.pending_intent(),
    );
    let (mut checkpoint, mut replay) = match plan {
        RecoveryPlan::Fresh => (Checkpoint::default(), None),
        RecoveryPlan::ResumeFrom(cp) => (cp, None),
        RecoveryPlan::ReplayThenResume { from, replay } => (from, Some(replay)),
    };
    for bound in &mut sources {
        if let Some(position) = checkpoint.sources.get(bound.source.name()) {
            bound
                .source
                .seek(position)
                .await
                .map_err(|e| source_err(bound.source.name(), e))?;
        }
    }
    if let Some(intent) = &replay {
        tracing::info!(
            txn = intent.txn,
            "replaying the step intent of an interrupted transaction"
        );
    }

    let bindings = Arc::new(shard.bindings);
    let mut summary = Summary {
        last_txn: checkpoint.txn,
        ..Default::default()
    };
    let mut exhausted = vec![false; sources.len()];
    // The prior transaction's recovery-log commit, running while the next one reads.
    let mut pending_commit: Option<tokio::task::JoinHandle<Result<RecoveryLog, String>>> = None;
    let mut log = Some(log);
    // Whether this transaction's Acknowledge (of the prior commit) was already sent.
    let mut acknowledged = false;

    loop {
        let txn = checkpoint.txn + 1;
        let mut c1 = Combiner::new(binding_specs(&bindings), combiner_options(&opts));

        // Read phase.
        let mut steps: BTreeMap<String, Vec<Resume>> = BTreeMap::new();
        let read = if let Some(intent) = replay.take() {
            replay_intent(&intent, &mut sources, &bindings, &mut c1, &mut steps).await?
        } else {
            read_transaction(
                &mut sources,
                &mut exhausted,
                &bindings,
                &mut c1,
                &mut steps,
                &opts,
                &mut shutdown,
            )
            .await?
        };
        progress.docs.fetch_add(read.docs, Ordering::Relaxed);
        progress.bytes.fetch_add(read.bytes, Ordering::Relaxed);
        summary.docs += read.docs;
        summary.bytes += read.bytes;

        // The prior commit must be durable before we acknowledge it (and before we may
        // write a new intent to the same log).
        let mut recovery = match pending_commit.take() {
            Some(handle) => handle
                .await
                .map_err(|e| RunError::Internal(e.to_string()))?
                .map_err(RunError::Recovery)?,
            None => log.take().expect("recovery log is owned by the loop"),
        };

        let stop =
            read.docs == 0 && (exhausted.iter().all(|e| *e) && !opts.follow || *shutdown.borrow());
        if read.docs == 0 && !stop {
            // Nothing new yet (following): acknowledge the prior commit now so that
            // idempotent-apply drivers apply it without waiting for more input.
            if !acknowledged {
                tx.acknowledge().await.map_err(driver_err)?;
                acknowledged = true;
            }
            log = Some(recovery);
            continue;
        }
        if stop {
            // Acknowledge the last commit so idempotent-apply drivers apply it, then close.
            if !acknowledged {
                tx.acknowledge().await.map_err(driver_err)?;
            }
            expect_acknowledged(&mut rx).await.map_err(driver_err)?;
            drop(tx);
            return Ok(summary);
        }

        // Intent: durable before any effect of this transaction reaches the driver.
        let intent = Intent { txn, steps };
        recovery
            .write_intent(&intent)
            .map_err(|e| RunError::Recovery(e.to_string()))?;
        for (source, resumes) in &intent.steps {
            if let Some(last) = resumes.last() {
                checkpoint
                    .sources
                    .insert(source.clone(), resume_position(last));
            }
        }
        checkpoint.txn = txn;
        let prepare_bytes = checkpoint.to_bytes();

        // Load phase: Acknowledge(T-1), Loads from C1 (drained into C2), Prepare.
        let mut c2 = Combiner::new(binding_specs(&bindings), combiner_options(&opts));
        let (acked_tx, acked_rx) = tokio::sync::oneshot::channel();
        let (sent, received) = tokio::join!(
            send_loads(
                &mut tx,
                c1,
                &mut c2,
                &bindings,
                acknowledged,
                acked_rx,
                prepare_bytes
            ),
            recv_until_prepared(&mut rx, acked_tx),
        );
        let (loaded_msgs, driver_checkpoint) = match (sent, received) {
            (Ok(_), Ok(r)) => r,
            (_, Err(e)) | (Err(e), _) => return Err(driver_err(e)),
        };
        // Loaded documents go to the left of what this transaction combined.
        for loaded in loaded_msgs {
            let binding = &bindings[loaded.binding as usize];
            for doc in arena::loaded_docs(&loaded) {
                let doc = doc.map_err(driver_err)?;
                let doc: Value = serde_json::from_slice(doc).map_err(|e| {
                    driver_err(DriverError::Transport(format!(
                        "Loaded document is not JSON: {e}"
                    )))
                })?;
                let mut key = Vec::new();
                binding.collection.key.pack(&doc, &mut key).map_err(|e| {
                    RunError::Internal(format!(
                        "Loaded document of binding {}: {e}",
                        loaded.binding
                    ))
                })?;
                c2.reduce_left(loaded.binding, &key, doc)?;
                summary.loaded += 1;
            }
        }

        // Store phase.
        let stored = send_stores(&mut tx, c2, &bindings)
            .await
            .map_err(|e| match e {
                StoreFailure::Combine(e) => RunError::Combine(e),
                StoreFailure::Driver(e) => driver_err(e),
            });
        let stored = match stored {
            Ok(n) => n,
            // A failed send usually means the driver ended the stream: prefer its reason.
            Err(err) => return Err(receiver_error(&mut rx).await.map(driver_err).unwrap_or(err)),
        };
        tx.commit().await.map_err(driver_err)?;
        match rx.recv().await.map_err(driver_err)? {
            Response::DriverCommitted => {}
            other => {
                return Err(RunError::Internal(format!(
                    "expected DriverCommitted, got {other:?}"
                )));
            }
        }
        acknowledged = false;
        summary.stored += stored;
        summary.transactions += 1;
        summary.last_txn = txn;
        progress.transactions.fetch_add(1, Ordering::Relaxed);
        progress.stored.fetch_add(stored, Ordering::Relaxed);

        // Decision: record the commit durably, overlapping the next transaction's reads.
        merge_driver_checkpoint(
            &mut checkpoint,
            &materialization_name(&open),
            driver_checkpoint,
        )?;
        let record = checkpoint.clone();
        pending_commit = Some(tokio::task::spawn_blocking(move || {
            // Returns only after the commit record is fsync'ed.
            recovery.commit(&record).map_err(|e| e.to_string())?;
            Ok(recovery)
        }));
    }
}

fn materialization_name(open: &Open) -> String {
    open.materialization
        .as_ref()
        .map(|m| m.materialization.clone())
        .unwrap_or_default()
}

fn binding_specs(bindings: &[Binding]) -> Vec<BindingSpec> {
    bindings
        .iter()
        .map(|b| BindingSpec {
            schema: b.collection.schema.clone(),
            key: b.collection.key.clone(),
            name: b.collection.name.clone(),
        })
        .collect()
}

fn combiner_options(opts: &TxnOptions) -> CombinerOptions {
    CombinerOptions {
        // Two combiners live at once during the load phase: split the budget.
        memory_budget: opts.memory_budget / 2,
        spill_dir: None,
    }
}

fn source_err(name: &str, err: impl std::fmt::Display) -> RunError {
    RunError::Source {
        name: name.to_string(),
        message: err.to_string(),
    }
}

/// The position a checkpoint records for a source after `resume`'s step.
fn resume_position(resume: &Resume) -> Value {
    match resume {
        Resume::Barrier => Value::Null,
        Resume::Seek { position } | Resume::Replay { position, .. } => position.clone(),
    }
}

struct ReadStats {
    docs: u64,
    bytes: u64,
}

/// Feeds one step's records to every binding of its source.
fn combine_records(
    records: &mut Vec<Record>,
    targets: &[u32],
    combiner: &mut Combiner,
) -> Result<(u64, u64), RunError> {
    let (mut docs, mut bytes) = (0, 0);
    for record in records.drain(..) {
        docs += 1;
        bytes += record.bytes as u64;
        let position = record.position.to_string();
        let (last, rest) = targets
            .split_last()
            .expect("a bound source feeds a binding");
        for binding in rest {
            combiner
                .combine_right(*binding, record.doc.clone())
                .map_err(|source| RunError::Document {
                    position: position.clone(),
                    source,
                })?;
        }
        combiner
            .combine_right(*last, record.doc)
            .map_err(|source| RunError::Document { position, source })?;
    }
    Ok((docs, bytes))
}

fn check_step(name: &str, step: &Step) -> Result<(), RunError> {
    match step.errors.first() {
        Some(err) => Err(RunError::Input {
            position: err.position.to_string(),
            reason: format!("{} (source {name})", err.reason),
        }),
        None => Ok(()),
    }
}

/// Reads one transaction's worth of documents.
async fn read_transaction(
    sources: &mut [BoundSource],
    exhausted: &mut [bool],
    bindings: &[Binding],
    combiner: &mut Combiner,
    steps: &mut BTreeMap<String, Vec<Resume>>,
    opts: &TxnOptions,
    shutdown: &mut watch::Receiver<bool>,
) -> Result<ReadStats, RunError> {
    let _ = bindings;
    let started = Instant::now();
    let mut stats = ReadStats { docs: 0, bytes: 0 };
    let mut records = Vec::new();
    loop {
        let mut progressed = false;
        for (index, bound) in sources.iter_mut().enumerate() {
            if exhausted[index] && !opts.follow {
                continue;
            }
            let limits = QueueLimits {
                max_records: (opts.max_docs - stats.docs).min(READ_BATCH) as usize,
                max_bytes: opts.max_bytes.saturating_sub(stats.bytes),
            };
            let step = bound
                .source
                .queue(limits, &mut records)
                .await
                .map_err(|e| source_err(bound.source.name(), e))?;
            check_step(bound.source.name(), &step)?;
            exhausted[index] = step.end_of_input;
            if step.records > 0 || !records.is_empty() {
                progressed = true;
                steps
                    .entry(bound.source.name().to_string())
                    .or_default()
                    .push(step.resume.clone());
            }
            let (docs, bytes) = combine_records(&mut records, &bound.bindings, combiner)?;
            stats.docs += docs;
            stats.bytes += bytes;
            if stats.docs >= opts.max_docs || stats.bytes >= opts.max_bytes {
                return Ok(stats);
            }
        }
        let elapsed = started.elapsed();
        if elapsed >= opts.max_duration && stats.docs > 0 || *shutdown.borrow() {
            return Ok(stats);
        }
        let all_done = exhausted.iter().all(|e| *e);
        if all_done && !opts.follow && elapsed >= opts.min_duration {
            return Ok(stats);
        }
        if !progressed {
            if all_done && !opts.follow {
                // Waiting only to honour min_duration.
                tokio::time::sleep(opts.min_duration.saturating_sub(elapsed)).await;
                return Ok(stats);
            }
            if stats.docs == 0 && elapsed >= opts.max_duration {
                return Ok(stats);
            }
            tokio::select! {
                _ = tokio::time::sleep(IDLE_POLL) => {}
                _ = shutdown.changed() => {}
            }
        } else if elapsed < opts.min_duration && stats.docs >= opts.max_docs {
            return Ok(stats);
        }
    }
}

/// Records queued from one source per call: small enough to interleave sources fairly,
/// large enough to amortise the call.
const READ_BATCH: u64 = 8192;
/// How often an idle (following) source is polled.
const IDLE_POLL: Duration = Duration::from_millis(50);

/// Re-reads exactly the steps of an interrupted transaction; a source whose data changed
/// fails with a hash mismatch rather than diverging silently.
async fn replay_intent(
    intent: &Intent,
    sources: &mut [BoundSource],
    bindings: &[Binding],
    combiner: &mut Combiner,
    steps: &mut BTreeMap<String, Vec<Resume>>,
) -> Result<ReadStats, RunError> {
    let _ = bindings;
    let mut stats = ReadStats { docs: 0, bytes: 0 };
    let mut records = Vec::new();
    for (name, resumes) in &intent.steps {
        let bound = sources
            .iter_mut()
            .find(|b| b.source.name() == name)
            .ok_or_else(|| RunError::Recovery(format!("intent names unknown source {name}")))?;
        for resume in resumes {
            let step = bound
                .source
                .replay(resume, &mut records)
                .await
                .map_err(|e| source_err(name, e))?;
            check_step(name, &step)?;
            let (docs, bytes) = combine_records(&mut records, &bound.bindings, combiner)?;
            stats.docs += docs;
            stats.bytes += bytes;
        }
        steps.insert(name.clone(), resumes.clone());
    }
    Ok(stats)
}

/// Sends Acknowledge (unless already sent while idle), then a Load for every key of a standard binding while moving each
/// drained document into `c2`; then, once Acknowledged has arrived, Prepare.
async fn send_loads(
    tx: &mut ClientSender,
    c1: Combiner,
    c2: &mut Combiner,
    bindings: &[Binding],
    acknowledged: bool,
    acked: tokio::sync::oneshot::Receiver<()>,
    prepare_checkpoint: Vec<u8>,
) -> Result<(), DriverError> {
    if !acknowledged {
        tx.acknowledge().await?;
    }
    let mut builder = LoadBuilder::new();
    let drain = c1
        .drain()
        .map_err(|e| DriverError::Transport(format!("combiner: {e}")))?;
    for drained in drain {
        let Drained {
            binding, key, doc, ..
        } = drained.map_err(|e| DriverError::Transport(format!("combiner: {e}")))?;
        if !bindings[binding as usize].delta_updates {
            builder.push(binding, &key);
            for load in builder.take_ready() {
                tx.load(load).await?;
            }
        }
        c2.combine_right_keyed(binding, &key, doc)
            .map_err(|e| DriverError::Transport(format!("combiner: {e}")))?;
    }
    for load in builder.finish() {
        tx.load(load).await?;
    }
    // The prepare phase begins only once the prior commit is acknowledged. If the
    // receiver stopped without seeing Acknowledged, its own error explains why.
    if acked.await.is_err() {
        return Ok(());
    }
    tx.prepare(Prepare {
        flow_checkpoint: prepare_checkpoint,
    })
    .await
}

/// Collects responses until Prepared: Acknowledged (exactly one, signalled to the
/// sender, which may then Prepare) and Loaded documents.
async fn recv_until_prepared(
    rx: &mut ClientReceiver,
    acked: tokio::sync::oneshot::Sender<()>,
) -> Result<(Vec<Loaded>, flow::DriverCheckpoint), DriverError> {
    let mut loaded = Vec::new();
    let mut acked = Some(acked);
    loop {
        match rx.recv().await? {
            Response::Loaded(l) => loaded.push(l),
            Response::Acknowledged => {
                if let Some(acked) = acked.take() {
                    let _ = acked.send(());
                }
            }
            Response::Prepared(cp) => return Ok((loaded, cp)),
            Response::DriverCommitted => {
                return Err(DriverError::Transport(
                    "DriverCommitted before Prepared".to_string(),
                ));
            }
        }
    }
}

async fn expect_acknowledged(rx: &mut ClientReceiver) -> Result<(), DriverError> {
    loop {
        match rx.recv().await? {
            Response::Acknowledged => return Ok(()),
            other => {
                return Err(DriverError::Transport(format!(
                    "expected Acknowledged, got {other:?}"
                )));
            }
        }
    }
}

/// The driver's own reason for a failed send, if it ended the stream with one.
async fn receiver_error(rx: &mut ClientReceiver) -> Option<DriverError> {
    match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
        Ok(Err(e)) => Some(e),
        _ => None,
    }
}

enum StoreFailure {
    Combine(CombineError),
    Driver(DriverError),
}

/// Drains `c2` into Store messages (exists = the key was loaded). Returns documents stored.
async fn send_stores(
    tx: &mut ClientSender,
    c2: Combiner,
    bindings: &[Binding],
) -> Result<u64, StoreFailure> {
    let mut stored = 0;
    let mut builder = StoreBuilder::new();
    let mut values = Vec::new();
    let mut doc_json = Vec::new();
    for drained in c2.drain().map_err(StoreFailure::Combine)? {
        let Drained {
            binding,
            key,
            doc,
            full,
        } = drained.map_err(StoreFailure::Combine)?;
        values.clear();
        for ptr in &bindings[binding as usize].values {
            tuple::pack_value(ptr.query(&doc).unwrap_or(&Value::Null), &mut values);
        }
        doc_json.clear();
        serde_json::to_writer(&mut doc_json, &doc).expect("a Value serializes");
        builder.push(
            binding,
            StoreDoc {
                key: &key,
                values: &values,
                doc: &doc_json,
                exists: full,
            },
        );
        for store in builder.take_ready() {
            tx.store(store).await.map_err(StoreFailure::Driver)?;
        }
        stored += 1;
    }
    for store in builder.finish() {
        tx.store(store).await.map_err(StoreFailure::Driver)?;
    }
    Ok(stored)
}

/// Applies the driver's checkpoint update (replacement or RFC 7396 merge patch).
fn merge_driver_checkpoint(
    checkpoint: &mut Checkpoint,
    materialization: &str,
    update: flow::DriverCheckpoint,
) -> Result<(), RunError> {
    if update.driver_checkpoint_json.is_empty() {
        return Ok(());
    }
    let patch: Value = serde_json::from_slice(&update.driver_checkpoint_json).map_err(|e| {
        RunError::Internal(format!(
            "driver checkpoint of {materialization} is not JSON: {e}"
        ))
    })?;
    let entry = checkpoint
        .driver_checkpoints
        .entry(materialization.to_string())
        .or_insert(Value::Object(Default::default()));
    if update.rfc7396_merge_patch {
        merge_patch(entry, patch);
    } else {
        *entry = patch;
    }
    Ok(())
}

/// RFC 7396 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: Value) {
    let Value::Object(patch) = patch else {
        *target = patch;
        return;
    };
    if !target.is_object() {
        *target = Value::Object(Default::default());
    }
    let target = target.as_object_mut().expect("made an object");
    for (name, value) in patch {
        if value.is_null() {
            target.remove(&name);
        } else {
            merge_patch(target.entry(name).or_insert(Value::Null), value);
        }
    }
}
