//! The reader: a task that queues sources into combiners, one transaction at a time,
//! running ahead of the committer.
//!
//! ```text
//!  sources ──queue/replay──▶ Records ──JSON text: combine_right_json──▶ Combiner C1 ──▶ ReadBatch ──▶ committer
//!                                   └─Value:     combine_right──────┘  (parse, validate,
//!                                                   key, reduce)  channel of one: the reader
//!                                                   works on T+1 while the committer stores T
//! ```
//!
//! One reader serves every shard of a group ([`super::group`]): each record goes to the
//! part of the shard whose key range holds its key hash (its key read from the text by
//! `KeyScan`, or from the parsed document where the scan cannot tell). A step is worked
//! in two rounds on up to the group's `threads` threads, its records shared by all and
//! copied by none: each thread routes a slice of the records (each part's record numbers,
//! in order), then each thread combines whole parts, reading its records in place. Every
//! shard's part of a batch has the batch's steps: one transaction of each shard.
//!
//! Documents reach the combiner as the JSON text their source has, whenever it has text:
//! the combiner parses it straight into its compact `Doc` (no `Value` is built), which
//! is most of the reading's cost saved. A record feeding several
//! bindings is combined once per binding (its text parsed each time).
//!
//! A batch closes at a bound (documents, bytes, `max_duration`), when every source is
//! exhausted (not following), on shutdown, or as soon as the committer is idle, the
//! batch has documents and is at least `min_duration` old (which batches a trickle), and
//! no source is *backlogged*. A source is backlogged when its last step filled the
//! limits it was given, so more input is ready at once: a backlog (a backfill, a reader
//! catching up) then fills transactions to their bounds. Each commit costs about one
//! store write per distinct key, so closing early there would only write the same hot
//! keys again and again, and latency is the bounds' either way; caught up, batches close
//! as soon as the committer can take them. The decision is [`close_batch`]'s, over the
//! facts of a round.
//! After an error the reader sends it and stops: nothing of that batch is committed.
//!
//! Bad input (a step's input errors; a document that is not JSON, is invalid, has no
//! key, or fails to reduce) fails the batch at the first bad record of the step, with
//! its position, unless its source has `on_error: skip` ([`triage`] decides which):
//!
//! - An unreadable record (a step's input error), or a document that does not parse,
//!   fails validation or key extraction, is rejected. The combiner checks a text before
//!   it touches its table, so a rejected text leaves it as it was; a source's `Value`
//!   is checked here before it is handed over (the combiner consumes it). Every binding
//!   of a source has its one collection, so a text the first binding accepts, all
//!   accept.
//! - A reduction error poisons the combiner (a key's document may be half-reduced). The
//!   reader remembers the document's position, and rebuilds the batch: a new combiner,
//!   every step of the batch replayed from its source, that document (and any earlier
//!   one) rejected before it is combined. Each rebuild rejects one more document, so
//!   it ends; it costs a re-read of the batch, only when a reduction fails.
//! - Rejected documents go to the dead-letter files ([`crate::deadletter`]), durably,
//!   before the batch is sent, tagged with the transaction the batch becomes (batches
//!   with documents or rejections become transactions `committed + 1`, `+ 2`, ... in
//!   order). At start, each file drops what an uncommitted attempt wrote. The files
//!   belong to a writer thread that the reader's task feeds and awaits: no file I/O on
//!   an async worker, and [`ReaderTask::stop`] joins the thread with the task.
//! - Reductions the committer meets (against a loaded document, or across spilled
//!   runs) involve no single document and fail the transaction in either mode.

use super::decide::{Close, RoundFacts, close_batch};
use super::group::Durables;
use super::{BoundSource, Drains, InFlight, TxnOptions, binding_specs, combiner_options};
use crate::deadletter::{DeadLetterThread, DeadLetterWriter};
use crate::metrics::ShardMetrics;
use crate::metrics::status::{SourceCount, SourceState};
use crate::pause::{Held, Pauses};
use crate::recovery::{Checkpoint, Intent};
use crate::types::{Binding, RunError};
use serde_json::Value;
use sluice_doc::KeyRange;
use sluice_doc::combine::Combiner;
use sluice_source_sdk::{Lag, QueueLimits, Records, Resume, Step};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tracing::Instrument;

mod batch;
mod combine;
mod route;

use batch::Part;
pub use batch::{ReadBatch, ShardBatch, Tally};

use combine::{Combined, Feed, Rejects};
use route::Router;

/// Records queued from one source per call: small enough to interleave sources fairly,
/// large enough to amortise the call.
const READ_BATCH: u64 = 8192;

/// A step's records below this many are combined on the reader's thread alone: a
/// thread per part would cost more than it saves.
const PARALLEL_MIN: usize = 512;

/// What one group's reader serves: its shards, and what they share.
pub(super) struct ReaderGroup {
    pub bindings: Arc<Vec<Binding>>,
    /// Each shard's key range, in key order, disjoint.
    pub ranges: Vec<KeyRange>,
    /// Each shard's metrics (a source's steps and lag are shown in every shard's).
    pub metrics: Vec<Arc<ShardMetrics>>,
    pub progress: Arc<super::Progress>,
    pub opts: TxnOptions,
    pub shutdown: watch::Receiver<bool>,
    /// Shards' batches handed to committers and not yet done.
    pub in_flight: Arc<InFlight>,
    /// Each shard's last durable log commit: the reader tells the sources of those
    /// durable in every shard ([`sluice_source_sdk::Source::committed`]).
    pub durables: Durables,
    /// Threads that combine a step's parts at once.
    pub threads: usize,
}

/// Starts the reader. `replay` (an interrupted transaction's intent) is read first,
/// exactly; then sources are queued from where they were positioned. `committed` is the
/// recovered checkpoint's transaction: the next batch becomes transaction `committed + 1`.
/// The caller [stops](ReaderTask::stop) the returned task before it reads the same
/// sources (or writes the same dead-letter files) again.
pub(super) fn spawn(
    sources: Vec<BoundSource>,
    group: ReaderGroup,
    replay: Option<Intent>,
    recovered: &Checkpoint,
) -> (mpsc::Receiver<Result<ReadBatch, RunError>>, ReaderTask) {
    let committed = recovered.txn;
    // The recovered checkpoint is durable: each source positioned there hears so first.
    let mut commits = VecDeque::new();
    let positions = sources
        .iter()
        .enumerate()
        .filter_map(|(index, b)| Some((index, recovered.sources.get(b.source.name())?.clone())))
        .collect();
    commits.push_back((committed, positions));
    let (tx, rx) = mpsc::channel(1);
    // The process's pauses outlive this reader: a reopened loop starts as they stand.
    let pauses = (group.metrics.first()).map_or_else(
        || Pauses::default().subscribe(),
        |metrics| metrics.status.pauses(),
    );
    let paths = sources.iter().map(|b| b.dead_letter.clone()).collect();
    let (mut dead_letters, writer) = DeadLetterWriter::spawn(paths, committed);
    // In the caller's span: the reader's lines name their materialization too.
    let read = async move {
        if let Err((index, e)) = dead_letters.opened().await {
            let name = sources[index].source.name();
            let _ = tx.send(Err(super::source_err(name, e))).await;
            return;
        }
        let ReaderGroup {
            bindings,
            ranges,
            metrics,
            progress,
            opts,
            shutdown,
            in_flight,
            durables,
            threads,
        } = group;
        let ranges: Arc<[KeyRange]> = ranges.into();
        let threads = threads.max(1);
        let mut reader = Reader {
            metrics,
            progress,
            exhausted: vec![false; sources.len()],
            routers: (0..threads)
                .map(|_| Router::new(ranges.clone(), &sources, &bindings))
                .collect(),
            ranges,
            feeds: (sources.iter().enumerate())
                .map(|(index, bound)| Arc::new(Feed::new(index, bound, &bindings)))
                .collect(),
            threads,
            sources: sources.into_iter().map(ReaderSource::extended).collect(),
            bindings,
            opts,
            shutdown,
            in_flight,
            records: Records::default(),
            dead_letters,
            next_txn: committed + 1,
            rejects: Rejects::default(),
            durable: durables,
            commits,
            pauses,
        };
        reader.tell_committed();
        let mut replay = replay;
        loop {
            let started = Instant::now();
            let batch = match replay.take() {
                Some(intent) => reader.replay(&intent).await,
                None => reader.read().await,
            };
            let mut batch = match batch {
                Ok(mut batch) => match reader.number(&batch) {
                    Some(txn) => {
                        batch.txn = Some(txn);
                        reader.write_dead_letters(txn, batch).await
                    }
                    None => Ok(batch),
                },
                Err(e) => Err(e),
            };
            if let Ok(b) = &mut batch {
                b.tally.took = started.elapsed().saturating_sub(b.tally.idle);
                let (tally, ms) = (&b.tally, |d: Duration| d.as_millis() as u64);
                tracing::debug!(
                    docs = b.read().0,
                    read_ms = ms(tally.took),
                    queue_ms = ms(tally.queue),
                    route_ms = ms(tally.route),
                    combine_ms = ms(tally.combine),
                    "transaction read"
                );
            }
            let last = batch.as_ref().map_or(true, |b| b.last);
            reader.in_flight.sent(reader.ranges.len());
            if tx.send(batch).await.is_err() || last {
                break;
            }
        }
        // The last transactions' commits, as they become durable, before the sources
        // go: a source may owe someone word of them (a client its answer). Ends when
        // the committers do.
        while !reader.commits.is_empty() && reader.durable.changed().await {
            reader.tell_committed();
        }
        // Their own metrics once more, whole: what the status and the shard's end
        // record keep of this run (a broker source's bytes fetched).
        if let Some(first) = reader.metrics.first() {
            for (reading, metrics) in reader.sources.iter().zip(&first.sources) {
                let source = &reading.bound.source;
                metrics.sampled(source.memory(), &source.metrics());
            }
        }
        // Disconnect: no command follows. (A stopped reader's sources are dropped
        // instead, which ends their read-ahead tasks too.)
        for reading in &mut reader.sources {
            reading.bound.source.disconnect().await;
        }
    };
    let task = tokio::spawn(read.in_current_span());
    (rx, ReaderTask { task, writer })
}

/// The reader's task and the dead-letter writer thread it feeds.
pub(super) struct ReaderTask {
    task: tokio::task::JoinHandle<()>,
    writer: DeadLetterThread,
}

impl ReaderTask {
    /// Waits for a reader that sent its last batch to tell its sources of the last
    /// commits and disconnect them (see [`spawn`]); the committer has ended, so this
    /// does not wait long.
    pub async fn join(self) {
        let _ = self.task.await;
        self.writer.join().await;
    }

    /// Aborts the reader; returns once its task and its dead-letter writer thread have
    /// ended, so no read or dead-letter write of this run happens after.
    pub async fn stop(self) {
        self.task.abort();
        let _ = self.task.await;
        // The aborted task dropped its writer: the thread ends after the write in hand.
        self.writer.join().await;
    }
}

/// A source as the reader drives it.
struct ReaderSource {
    bound: BoundSource,
    /// Its last step in the batch was a [`Resume::Barrier`].
    at_barrier: bool,
    /// Its last step in the batch ended inside a unit it declared
    /// ([`Step::unit_continues`]): the batch cannot close before the unit ends.
    in_unit: bool,
    /// It had read ahead beyond its limits when last asked (the reader's backpressure).
    full: bool,
    /// Paused by the operator ([`crate::pause`]): not queued, unless the batch cannot
    /// close after its last step ([`ReaderSource::holds_open`]).
    held: bool,
    /// Its last command was Pause (`full`, or `held`), not Extend.
    paused: bool,
    /// How far behind its input it said it was after its last step.
    lag: Option<Lag>,
}

impl ReaderSource {
    /// The source, positioned by recovery, told to read ahead (Extend).
    fn extended(mut bound: BoundSource) -> ReaderSource {
        bound.source.extend();
        ReaderSource {
            bound,
            at_barrier: false,
            in_unit: false,
            full: false,
            held: false,
            paused: false,
            lag: None,
        }
    }

    /// Pauses the source while it buffered beyond either bound of its read-ahead, and
    /// extends it again once below both.
    fn apply_backpressure(&mut self) {
        let queued = self.bound.source.queued();
        let limits = self.bound.read_ahead;
        let over =
            queued.records >= limits.max_queued_records || queued.bytes >= limits.max_queued_bytes;
        if over && !self.full {
            tracing::debug!(
                source = self.bound.source.name(),
                records = queued.records,
                bytes = queued.bytes,
                "read-ahead full: pausing the source"
            );
        }
        self.full = over;
        self.command();
    }

    /// Whether the operator's pause keeps it from being queued now.
    fn on_hold(&self) -> bool {
        self.held && !self.holds_open()
    }

    /// Tells the source Pause when its read-ahead is full or the operator holds it, and
    /// Extend once neither does: each only when that changed (the seed's commands pair
    /// up). A held source that the batch waits on (`holds_open`) reads ahead on.
    fn command(&mut self) {
        let pause = self.full || self.on_hold();
        match (self.paused, pause) {
            (false, true) => self.bound.source.pause(),
            (true, false) => self.bound.source.extend(),
            _ => {}
        }
        self.paused = pause;
    }

    /// Whether the batch cannot close after this source's last step.
    fn holds_open(&self) -> bool {
        self.at_barrier || self.in_unit
    }
}

struct Reader {
    sources: Vec<ReaderSource>,
    /// Each source's lag goes here after its steps, in every shard's metrics.
    metrics: Vec<Arc<ShardMetrics>>,
    /// Documents read, and what the sources have left (the CLI's progress line).
    progress: Arc<super::Progress>,
    exhausted: Vec<bool>,
    bindings: Arc<Vec<Binding>>,
    /// Per source (the run's order): how its records are combined.
    feeds: Vec<Arc<Feed>>,
    /// Each shard's key range, in key order, disjoint.
    ranges: Arc<[KeyRange]>,
    /// Which shard's part each record goes to: a router per thread.
    routers: Vec<Router>,
    /// Threads that route a step's records, then combine its parts, at once.
    threads: usize,
    opts: TxnOptions,
    shutdown: watch::Receiver<bool>,
    /// Batches sent and not yet committed: counted up here, down by the committers
    /// when they are done with their parts.
    in_flight: Arc<InFlight>,
    records: Records,
    dead_letters: DeadLetterWriter,
    /// The transaction the next batch with documents or rejections becomes.
    next_txn: u64,
    /// The current batch's rejections.
    rejects: Rejects,
    /// The last transaction whose log commit is durable in every shard.
    durable: Durables,
    /// Transactions sent and not yet told to their sources: each with the position of
    /// every source's last step in it, in order.
    commits: VecDeque<(u64, Vec<(usize, Value)>)>,
    /// The operator's pauses ([`crate::pause`]), followed at every round.
    pauses: watch::Receiver<Held>,
}

impl Reader {
    /// A new, empty batch (forgetting the rejections of the previous one).
    fn batch(&mut self) -> ReadBatch {
        self.rejects.letters.clear();
        // The reader routes each document to its shard's part: every part's combiner
        // keeps whatever it is given.
        let part = || Part {
            combiner: Combiner::new(
                binding_specs(&self.bindings, Drains::IntoCombiner),
                combiner_options(&self.opts, KeyRange::ALL),
            ),
            docs: 0,
            bytes: 0,
            sources: vec![SourceCount::default(); self.sources.len()],
            combined: vec![0; self.bindings.len()],
        };
        ReadBatch {
            parts: self.ranges.iter().map(|_| part()).collect(),
            steps: BTreeMap::new(),
            outside: (0, 0),
            journaled: 0,
            rejected: 0,
            advances: false,
            txn: None,
            last: false,
            tally: Tally::default(),
        }
    }

    /// Whether the batch becomes a transaction ([`ReadBatch::is_transaction`], before
    /// its rejections are written): it has documents, rejections, or an advancing step.
    fn has_work(&self, batch: &ReadBatch) -> bool {
        batch.read().0 > 0 || !self.rejects.letters.is_empty() || batch.advances
    }

    /// The transaction the batch becomes, if it has work: numbered in order, and noted
    /// (with each source's last position in it) to be told to its sources once durable.
    fn number(&mut self, batch: &ReadBatch) -> Option<u64> {
        if !self.has_work(batch) {
            return None;
        }
        let txn = self.next_txn;
        self.next_txn += 1;
        let positions = batch
            .steps
            .iter()
            .filter_map(|(name, resumes)| {
                let index = self
                    .sources
                    .iter()
                    .position(|s| s.bound.source.name() == name)?;
                Some((index, resumes.last()?.position()?.clone()))
            })
            .collect();
        self.commits.push_back((txn, positions));
        Some(txn)
    }

    /// Writes the batch's rejections, tagged with the transaction `txn` it becomes;
    /// returns once they are durable (fsync'ed by the writer thread).
    async fn write_dead_letters(
        &mut self,
        txn: u64,
        mut batch: ReadBatch,
    ) -> Result<ReadBatch, RunError> {
        let rejects = std::mem::take(&mut self.rejects);
        batch.rejected = rejects.letters.len() as u64;
        for ((source, _, _), _) in &rejects.letters {
            batch.parts[0].sources[*source].dead_lettered += 1;
        }
        self.dead_letters
            .write(txn, rejects.letters)
            .await
            .map_err(|(index, e)| super::source_err(self.sources[index].bound.source.name(), e))?;
        Ok(batch)
    }

    /// Tells each source of every transaction now durable
    /// ([`sluice_source_sdk::Source::committed`]), then samples the lag of those told:
    /// a source that counts its read-ahead as left (datagen) has less left now.
    fn tell_committed(&mut self) {
        let durable = self.durable.borrow_and_update();
        let mut told = vec![false; self.sources.len()];
        while let Some((txn, _)) = self.commits.front()
            && *txn <= durable
        {
            let (txn, positions) = self.commits.pop_front().expect("a front");
            for (index, position) in positions {
                self.sources[index].bound.source.committed(txn, &position);
                told[index] = true;
            }
        }
        for (index, _) in told.into_iter().enumerate().filter(|(_, told)| *told) {
            self.sample_lag(index);
        }
    }

    /// Asks source `index` how far behind it is (and what its input system retains),
    /// for the metrics and the progress line.
    fn sample_lag(&mut self, index: usize) {
        let reading = &mut self.sources[index];
        reading.lag = reading.bound.source.lag();
        let retained = reading.bound.source.retained();
        for metrics in &self.metrics {
            if let Some(lag) = reading.lag {
                metrics.sources[index].lag(lag);
            }
            if let Some(bytes) = retained {
                metrics.sources[index].retained(bytes);
            }
        }
        // Its memory and own metrics, in the first shard's (its `Health`'s), at most
        // once a second.
        if let Some(first) = self.metrics.first()
            && first.sources[index].sample_due()
        {
            let source = &reading.bound.source;
            first.sources[index].sampled(source.memory(), &source.metrics());
        }
        self.progress.behind(self.sources.iter().map(|s| &s.lag));
    }

    /// Holds the sources the operator paused and releases the others, commanding each
    /// whose state changed (see [`ReaderSource::command`]); logged by [`Pauses`] once,
    /// here only at debug.
    fn follow_pauses(&mut self) {
        // Read every round, not only when changed: a wait may have seen the change.
        let held = self.pauses.borrow_and_update();
        for reading in &mut self.sources {
            let hold = held.contains_key(reading.bound.source.name());
            if hold != reading.held {
                tracing::debug!(
                    source = reading.bound.source.name(),
                    held = hold,
                    "the reader follows the operator's pause"
                );
            }
            reading.held = hold;
        }
        drop(held);
        // Also after a step that left a held source's batch able to close.
        for reading in &mut self.sources {
            reading.command();
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
            self.tell_committed();
            self.follow_pauses();
            let (mut progressed, mut backlogged) = (false, false);
            // Full, but a source's last step was a barrier or inside a unit: read on only
            // from those. At a stop, sources inside a unit read on until it ends.
            let held_only = batch.full(&self.opts) || (self.in_unit() && *self.shutdown.borrow());
            for index in 0..self.sources.len() {
                if (self.exhausted[index] && !self.opts.follow)
                    || (held_only && !self.sources[index].holds_open())
                    || self.sources[index].on_hold()
                {
                    continue;
                }
                let (docs, bytes) = batch.read();
                let limits = QueueLimits {
                    max_records: (self.opts.max_docs.saturating_sub(docs)).clamp(1, READ_BATCH)
                        as usize,
                    max_bytes: self.opts.max_bytes.saturating_sub(bytes).max(1),
                    // What the intent has room for: a step journaling past it could
                    // never be written (an etcd record's bound).
                    max_journaled: self.opts.max_journaled.saturating_sub(batch.journaled),
                };
                let reading = &mut self.sources[index];
                let queued = Instant::now();
                let step = reading
                    .bound
                    .source
                    .queue(limits, &mut self.records)
                    .await
                    .map_err(|e| super::source_err(reading.bound.source.name(), e))?;
                batch.tally.queue += queued.elapsed();
                reading.apply_backpressure();
                self.stepped(index, &step);
                self.sample_lag(index);
                self.exhausted[index] = step.end_of_input;
                backlogged |= !step.end_of_input
                    && (step.records + step.errors.len() >= limits.max_records
                        || step.bytes >= limits.max_bytes);
                // A step without records or errors is dropped, its position not
                // checkpointed, unless it advances (a slot's WAL to release).
                if !self.records.is_empty() || !step.errors.is_empty() || step.advances {
                    progressed = true;
                    batch.advances |= step.advances;
                    let combined = self.combine(&step, index, &mut batch).await?;
                    let reading = &mut self.sources[index];
                    reading.at_barrier = step.resume == Resume::Barrier;
                    reading.in_unit = step.unit_continues;
                    batch.journaled += journaled(&step.resume);
                    batch
                        .steps
                        .entry(reading.bound.source.name().to_string())
                        .or_default()
                        .push(step.resume);
                    if let Combined::Rebuild = combined {
                        batch = self.rebuild(std::mem::take(&mut batch.steps)).await?;
                    }
                }
                if step.unit_continues && step.end_of_input {
                    return Err(RunError::UnitUnfinished {
                        name: self.sources[index].bound.source.name().to_string(),
                    });
                }
                if batch.full(&self.opts) && !self.at_barrier() && !self.in_unit() {
                    return Ok(batch);
                }
                // Parsing and combining never wait on I/O: yield, or tasks queued behind
                // this one on its worker (the committer, an in-process driver) starve.
                tokio::task::yield_now().await;
            }
            let has_work = self.has_work(&batch);
            let (docs, bytes) = batch.read();
            let facts = RoundFacts {
                docs,
                bytes,
                journaled: batch.journaled,
                has_work,
                elapsed: started.elapsed(),
                progressed,
                backlogged,
                at_barrier: self.at_barrier(),
                in_unit: self.in_unit(),
                committer_idle: self.in_flight.committer_idle(),
                ending: *self.shutdown.borrow() || self.all_exhausted(),
            };
            match close_batch(&self.opts, &facts) {
                // An empty batch at a timeout (idle while following) lets the committer
                // acknowledge.
                Close::Full | Close::Early | Close::Timeout => return Ok(batch),
                Close::End { last } => {
                    batch.last = last;
                    return Ok(batch);
                }
                Close::ReadOn => {}
                Close::Wait if facts.has_work => self.wait(&facts, started).await,
                Close::Wait => {
                    let idle = Instant::now();
                    self.wait(&facts, started).await;
                    batch.tally.idle += idle.elapsed();
                }
            }
        }
    }

    /// Whether some source's last step in the batch was a barrier: the batch cannot
    /// close there (no position to checkpoint that source at).
    fn at_barrier(&self) -> bool {
        self.sources.iter().any(|s| s.at_barrier)
    }

    /// Whether some source's last step in the batch ended inside a unit it declared:
    /// the batch cannot close, not even at a stop, before that unit ends.
    fn in_unit(&self) -> bool {
        self.sources.iter().any(|s| s.in_unit)
    }

    /// Waits, after a round in which nothing progressed, for whatever may change the
    /// decision: a source told of new input ([`Source::ready`]), the committer taking
    /// no more of our time (when the batch waits for it), a log commit becoming durable
    /// (its sources are told at once: clients may wait on it), the deadline of the batch
    /// (`min_duration` for a batch with work, else `max_duration`), or shutdown. No
    /// timer polls: a trickle is read the moment it arrives.
    async fn wait(&mut self, facts: &RoundFacts, started: Instant) {
        let deadline = if facts.has_work && facts.elapsed < self.opts.min_duration {
            self.opts.min_duration
        } else {
            self.opts.max_duration
        };
        let follow = self.opts.follow;
        let ready = self
            .sources
            .iter_mut()
            .zip(&self.exhausted)
            .filter(|(reading, exhausted)| (follow || !**exhausted) && !reading.on_hold())
            .map(|(reading, _)| reading.bound.source.ready())
            .collect::<Vec<_>>();
        let any_ready = async {
            if ready.is_empty() {
                std::future::pending::<()>().await;
            }
            futures::future::select_all(ready).await;
        };
        let committer_done = async {
            if facts.has_work && !facts.committer_idle {
                self.in_flight.next_done().await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            () = any_ready => {}
            () = committer_done => {}
            () = tokio::time::sleep_until((started + deadline).into()) => {}
            _ = self.shutdown.changed() => {}
            _ = self.durable.changed() => {}
            () = pause_changed(&mut self.pauses) => {}
        }
    }

    /// Re-reads exactly the steps of an interrupted transaction; a source whose data
    /// changed fails with a hash mismatch rather than diverging silently. A source
    /// with a step that cannot be replayed (`Seek`, `Barrier`: at-least-once) is not
    /// replayed: recovery positioned it at its committed position, and it reads on from
    /// there, anew.
    async fn replay(&mut self, intent: &Intent) -> Result<ReadBatch, RunError> {
        tracing::info!(
            txn = intent.txn,
            "replaying the step intent of an interrupted transaction"
        );
        self.next_txn = intent.txn;
        self.rejects = Rejects::default();
        let (replayable, anew): (BTreeMap<_, _>, BTreeMap<_, _>) =
            intent.steps.clone().into_iter().partition(|(_, resumes)| {
                resumes.iter().all(|r| matches!(r, Resume::Replay { .. }))
            });
        for source in anew.keys() {
            tracing::warn!(
                txn = intent.txn,
                source,
                "the source cannot replay its steps of the interrupted transaction \
                 exactly (at-least-once): reading on from its committed position"
            );
        }
        self.rebuild(replayable).await
    }

    /// Reads `steps` again into a new batch, until no reduction fails (each failure
    /// rejects one more document of a skipping source; see the module docs).
    async fn rebuild(
        &mut self,
        steps: BTreeMap<String, Vec<Resume>>,
    ) -> Result<ReadBatch, RunError> {
        'rebuild: loop {
            let mut batch = self.batch();
            for (name, resumes) in &steps {
                let index = self
                    .sources
                    .iter()
                    .position(|s| s.bound.source.name() == name)
                    .ok_or_else(|| RunError::IntentSource { name: name.clone() })?;
                for resume in resumes {
                    let step = self.sources[index]
                        .bound
                        .source
                        .replay(resume, &mut self.records)
                        .await
                        .map_err(|e| super::source_err(name, e))?;
                    self.stepped(index, &step);
                    batch.advances |= step.advances;
                    if let Combined::Rebuild = self.combine(&step, index, &mut batch).await? {
                        continue 'rebuild;
                    }
                }
            }
            batch.journaled = steps.values().flatten().map(journaled).sum();
            batch.steps = steps;
            return Ok(batch);
        }
    }
}

/// Returns when the operator's pauses change; never once nobody can change them.
async fn pause_changed(pauses: &mut watch::Receiver<Held>) {
    if pauses.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

impl Reader {
    /// Shows source `index`'s step in every shard's metrics.
    fn stepped(&self, index: usize, step: &Step) {
        for metrics in &self.metrics {
            metrics.sources[index].stepped(shown(step));
        }
    }
}

/// The state a step leaves its source in, as the status shows it.
fn shown(step: &Step) -> SourceState {
    if step.records > 0 || !step.errors.is_empty() {
        SourceState::Reading
    } else if step.end_of_input {
        SourceState::CaughtUp
    } else {
        SourceState::Idle
    }
}

/// The step data a step's resume journals in the intent.
fn journaled(resume: &Resume) -> u64 {
    match resume {
        Resume::Replay {
            data: Some(data), ..
        } => data.len() as u64,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ReadAhead;
    use crate::envelope::Envelope;
    use sluice_source_sdk::{FaultTolerance, Queued, SourceError};
    use std::sync::Mutex;

    /// A source whose buffer the test sets, recording the commands it is given.
    /// The commands a test source was given, in order.
    type Commands = Arc<Mutex<Vec<&'static str>>>;

    struct Buffering {
        queued: Arc<Mutex<Queued>>,
        commands: Commands,
    }

    #[async_trait::async_trait]
    impl sluice_source_sdk::Source for Buffering {
        fn name(&self) -> &str {
            "buffering"
        }
        fn fault_tolerance(&self) -> FaultTolerance {
            FaultTolerance::ExactlyOnce
        }
        async fn seek(&mut self, _: &serde_json::Value) -> Result<(), SourceError> {
            Ok(())
        }
        async fn replay(&mut self, _: &Resume, _: &mut Records) -> Result<Step, SourceError> {
            unreachable!("not replayed")
        }
        async fn queue(&mut self, _: QueueLimits, _: &mut Records) -> Result<Step, SourceError> {
            unreachable!("not queued")
        }
        fn queued(&self) -> Queued {
            *self.queued.lock().unwrap()
        }
        fn extend(&mut self) {
            self.commands.lock().unwrap().push("extend");
        }
        fn pause(&mut self) {
            self.commands.lock().unwrap().push("pause");
        }
    }

    /// A `Buffering` source of read-ahead bounds 100 records and 1 000 bytes, extended;
    /// what it says it has queued, and the commands it was given.
    fn buffering() -> (ReaderSource, Arc<Mutex<Queued>>, Commands) {
        let queued = Arc::new(Mutex::new(Queued::default()));
        let commands = Arc::new(Mutex::new(Vec::new()));
        let reading = ReaderSource::extended(BoundSource {
            source: Box::new(Buffering {
                queued: queued.clone(),
                commands: commands.clone(),
            }),
            bindings: vec![0],
            dead_letter: None,
            read_ahead: ReadAhead {
                max_queued_records: 100,
                max_queued_bytes: 1000,
            },
            envelope: Envelope::None,
        });
        (reading, queued, commands)
    }

    /// The operator's pause and the read-ahead's compose: Pause once either holds,
    /// Extend only once neither does; a held source that the batch waits on (its last
    /// step a barrier) is neither skipped nor paused until it can be checkpointed.
    #[test]
    fn an_operators_pause_and_a_full_read_ahead_compose_into_one_pause_and_one_extend() {
        let (mut reading, queued, commands) = buffering();
        let full = Queued {
            records: 100,
            bytes: 0,
        };
        reading.held = true;
        reading.command();
        assert!(reading.on_hold() && reading.paused);
        *queued.lock().unwrap() = full;
        reading.apply_backpressure();
        reading.held = false;
        reading.command();
        assert!(
            !reading.on_hold() && reading.paused,
            "the read-ahead still holds it"
        );
        *queued.lock().unwrap() = Queued::default();
        reading.apply_backpressure();
        assert!(!reading.paused);
        reading.held = true;
        reading.at_barrier = true;
        reading.command();
        assert!(
            !reading.on_hold() && !reading.paused,
            "the batch waits on it"
        );
        reading.at_barrier = false;
        reading.command();
        assert!(reading.on_hold() && reading.paused);
        reading.in_unit = true;
        reading.command();
        assert!(
            !reading.on_hold() && !reading.paused,
            "inside a unit, the batch waits on it too"
        );
        reading.in_unit = false;
        reading.command();
        assert!(reading.on_hold() && reading.paused);
        assert_eq!(
            *commands.lock().unwrap(),
            ["extend", "pause", "extend", "pause", "extend", "pause"]
        );
    }

    /// Extend once positioned; Pause above either bound, once; Extend again below both.
    #[test]
    fn a_source_is_paused_above_its_read_ahead_and_extended_below_it() {
        let (mut reading, queued, commands) = buffering();
        let steps = [
            (
                Queued {
                    records: 99,
                    bytes: 999,
                },
                false,
            ),
            (
                Queued {
                    records: 100,
                    bytes: 10,
                },
                true,
            ),
            (
                Queued {
                    records: 150,
                    bytes: 10,
                },
                true,
            ),
            (
                Queued {
                    records: 10,
                    bytes: 10,
                },
                false,
            ),
            (
                Queued {
                    records: 10,
                    bytes: 1000,
                },
                true,
            ),
            (
                Queued {
                    records: 0,
                    bytes: 0,
                },
                false,
            ),
        ];
        for (buffered, paused) in steps {
            *queued.lock().unwrap() = buffered;
            reading.apply_backpressure();
            assert_eq!(reading.paused, paused, "{buffered:?}");
        }
        assert_eq!(
            *commands.lock().unwrap(),
            ["extend", "pause", "extend", "pause", "extend"]
        );
    }
}
