//! The reader: a task that queues sources into combiners, one transaction at a time,
//! running ahead of the committer.
//!
//! ```text
//!  sources ──queue/replay──▶ Combiner C1 (validate, key, reduce) ──▶ ReadBatch ──▶ committer
//!                                                     channel of one: the reader works on
//!                                                     T+1 while the committer stores T
//! ```
//!
//! A batch closes at a bound (documents, bytes, `max_duration`), when every source is
//! exhausted (not following), on shutdown, or as soon as the committer is idle and the
//! batch has documents and is at least `min_duration` old (which batches a trickle).
//! After an error the reader sends it and stops: nothing of that batch is committed.

use super::{Binding, BoundSource, RunError, TxnOptions, binding_specs, combiner_options};
use crate::recovery::Intent;
use crate::source::{QueueLimits, Record, Resume, Step};
use sluice_doc::combine::Combiner;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// Records queued from one source per call: small enough to interleave sources fairly,
/// large enough to amortise the call.
const READ_BATCH: u64 = 8192;
/// How often an idle (following) source is polled.
const IDLE_POLL: Duration = Duration::from_millis(50);

/// One transaction's input, combined.
pub struct ReadBatch {
    pub combiner: Combiner,
    /// Every step queued per source, in order: the transaction's intent.
    pub steps: BTreeMap<String, Vec<Resume>>,
    pub docs: u64,
    pub bytes: u64,
    /// No more batches will follow (sources exhausted, or shutdown).
    pub last: bool,
}

/// Starts the reader. `replay` (an interrupted transaction's intent) is read first,
/// exactly; then sources are queued from where they were positioned.
pub fn spawn(
    sources: Vec<BoundSource>,
    bindings: Arc<Vec<Binding>>,
    opts: TxnOptions,
    replay: Option<Intent>,
    shutdown: watch::Receiver<bool>,
    in_flight: Arc<AtomicUsize>,
) -> mpsc::Receiver<Result<ReadBatch, RunError>> {
    let (tx, rx) = mpsc::channel(1);
    let mut reader = Reader {
        exhausted: vec![false; sources.len()],
        sources,
        bindings,
        opts,
        shutdown,
        in_flight,
        records: Vec::new(),
    };
    tokio::spawn(async move {
        let mut replay = replay;
        loop {
            let started = Instant::now();
            let batch = match replay.take() {
                Some(intent) => reader.replay(&intent).await,
                None => reader.read().await,
            };
            if let Ok(b) = &batch {
                tracing::debug!(
                    docs = b.docs,
                    read_ms = started.elapsed().as_millis() as u64,
                    "transaction read"
                );
            }
            let last = batch.as_ref().map_or(true, |b| b.last);
            reader.in_flight.fetch_add(1, Ordering::AcqRel);
            if tx.send(batch).await.is_err() || last {
                return;
            }
        }
    });
    rx
}

struct Reader {
    sources: Vec<BoundSource>,
    exhausted: Vec<bool>,
    bindings: Arc<Vec<Binding>>,
    opts: TxnOptions,
    shutdown: watch::Receiver<bool>,
    /// Batches sent and not yet committed: incremented here, decremented by the
    /// committer when it is done with one. Zero means the committer waits for work.
    in_flight: Arc<AtomicUsize>,
    records: Vec<Record>,
}

impl Reader {
    fn batch(&self) -> ReadBatch {
        ReadBatch {
            combiner: Combiner::new(binding_specs(&self.bindings), combiner_options(&self.opts)),
            steps: BTreeMap::new(),
            docs: 0,
            bytes: 0,
            last: false,
        }
    }

    fn all_exhausted(&self) -> bool {
        !self.opts.follow && self.exhausted.iter().all(|e| *e)
    }

    /// Reads one transaction's worth of documents.
    async fn read(&mut self) -> Result<ReadBatch, RunError> {
        let started = Instant::now();
        let mut batch = self.batch();
        loop {
            let mut progressed = false;
            for index in 0..self.sources.len() {
                if self.exhausted[index] && !self.opts.follow {
                    continue;
                }
                let limits = QueueLimits {
                    max_records: (self.opts.max_docs - batch.docs).min(READ_BATCH) as usize,
                    max_bytes: self.opts.max_bytes.saturating_sub(batch.bytes),
                };
                let bound = &mut self.sources[index];
                let step = bound
                    .source
                    .queue(limits, &mut self.records)
                    .await
                    .map_err(|e| super::source_err(bound.source.name(), e))?;
                check_step(bound.source.name(), &step)?;
                self.exhausted[index] = step.end_of_input;
                if !self.records.is_empty() {
                    progressed = true;
                    batch
                        .steps
                        .entry(bound.source.name().to_string())
                        .or_default()
                        .push(step.resume);
                    combine_records(&mut self.records, &bound.bindings, &mut batch)?;
                }
                if batch.docs >= self.opts.max_docs || batch.bytes >= self.opts.max_bytes {
                    return Ok(batch);
                }
            }
            let elapsed = started.elapsed();
            if *self.shutdown.borrow() || self.all_exhausted() {
                batch.last = batch.docs == 0;
                return Ok(batch);
            }
            // Close early when the committer is waiting for work: low latency for a
            // trickle, while large batches build up whenever the committer is busy.
            let committer_idle = self.in_flight.load(Ordering::Acquire) == 0;
            if batch.docs > 0 && committer_idle && elapsed >= self.opts.min_duration {
                return Ok(batch);
            }
            if elapsed >= self.opts.max_duration && (batch.docs > 0 || !progressed) {
                // Empty when idle while following: it lets the committer acknowledge.
                return Ok(batch);
            }
            if !progressed {
                tokio::select! {
                    _ = tokio::time::sleep(IDLE_POLL) => {}
                    _ = self.shutdown.changed() => {}
                }
            }
        }
    }

    /// Re-reads exactly the steps of an interrupted transaction; a source whose data
    /// changed fails with a hash mismatch rather than diverging silently.
    async fn replay(&mut self, intent: &Intent) -> Result<ReadBatch, RunError> {
        tracing::info!(
            txn = intent.txn,
            "replaying the step intent of an interrupted transaction"
        );
        let mut batch = self.batch();
        for (name, resumes) in &intent.steps {
            let bound = self
                .sources
                .iter_mut()
                .find(|b| b.source.name() == name)
                .ok_or_else(|| {
                    RunError::Recovery(format!("the intent names unknown source {name}"))
                })?;
            for resume in resumes {
                let step = bound
                    .source
                    .replay(resume, &mut self.records)
                    .await
                    .map_err(|e| super::source_err(name, e))?;
                check_step(name, &step)?;
                combine_records(&mut self.records, &bound.bindings, &mut batch)?;
            }
            batch.steps.insert(name.clone(), resumes.clone());
        }
        Ok(batch)
    }
}

/// Feeds one step's records to every binding of its source.
fn combine_records(
    records: &mut Vec<Record>,
    targets: &[u32],
    batch: &mut ReadBatch,
) -> Result<(), RunError> {
    let (last, rest) = targets
        .split_last()
        .expect("a bound source feeds a binding");
    for record in records.drain(..) {
        batch.docs += 1;
        batch.bytes += record.bytes as u64;
        // The position is formatted only for an error: this loop is hot.
        let at = |source| RunError::Document {
            position: record.position.to_string(),
            source: Box::new(source),
        };
        for binding in rest {
            batch
                .combiner
                .combine_right(*binding, record.doc.clone())
                .map_err(at)?;
        }
        batch
            .combiner
            .combine_right(*last, record.doc)
            .map_err(at)?;
    }
    crate::failpoint::fail_point!(AFTER_QUEUE, crate::failpoint::in_reader);
    Ok(())
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
