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

use super::decide::{Close, Fault, RoundFacts, Triage, close_batch, triage};
use super::group::Durables;
use super::{BoundSource, Drains, InFlight, TxnOptions, binding_specs, combiner_options};
use crate::config::OnError;
use crate::deadletter::{DeadLetter, DeadLetterThread, DeadLetterWriter, RecordId};
use crate::envelope::{Envelope, Unwrapped};
use crate::metrics::ShardMetrics;
use crate::metrics::status::{SourceCount, SourceState};
use crate::pause::{Held, Pauses};
use crate::recovery::{Checkpoint, Intent};
use crate::types::{Binding, Collection, RunError};
use serde_json::Value;
use sluice_doc::combine::{CombineError, Combiner};
use sluice_doc::keyscan::KeyScan;
use sluice_doc::parse::DocParser;
use sluice_doc::{KeyExtractor, KeyRange, key_hash};
use sluice_source_sdk::{
    FaultTolerance, InputError, Lag, Position, QueueLimits, Record, RecordDoc, Records, Resume,
    SharedDoc, Step, bad_json,
};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tracing::Instrument;

/// Records queued from one source per call: small enough to interleave sources fairly,
/// large enough to amortise the call.
const READ_BATCH: u64 = 8192;

/// A step's records below this many are combined on the reader's thread alone: a
/// thread per part would cost more than it saves.
const PARALLEL_MIN: usize = 512;

impl ReadBatch {
    /// Documents read, of the group's keys, and their bytes: what its bounds count.
    fn read(&self) -> (u64, u64) {
        (self.parts.iter()).fold(self.outside, |(docs, bytes), p| {
            (docs + p.docs, bytes + p.bytes)
        })
    }

    /// Whether it reached a size bound.
    fn full(&self, opts: &TxnOptions) -> bool {
        let (docs, bytes) = self.read();
        opts.full(docs, bytes, self.journaled)
    }

    /// Whether it becomes a transaction: it has documents, rejections (whose source
    /// positions must be checkpointed, so they are not rejected twice), or a step that
    /// moved a source's position without records ([`Step::advances`]: a slot that may
    /// release WAL once that position is durable).
    fn is_transaction(&self) -> bool {
        self.read().0 > 0 || self.rejected > 0 || self.advances
    }

    /// Each shard's batch: its part, and the steps, numbering and end every part shares.
    pub fn split(self) -> Vec<ShardBatch> {
        let transaction = self.is_transaction();
        let tally = self.tally;
        (self.parts.into_iter().enumerate())
            .map(|(i, part)| ShardBatch {
                combiner: part.combiner,
                steps: self.steps.clone(),
                transaction,
                docs: part.docs,
                bytes: part.bytes,
                // Rejections are the reader's, counted once.
                rejected: if i == 0 { self.rejected } else { 0 },
                txn: self.txn,
                last: self.last,
                tally: Tally {
                    sources: part.sources,
                    combined: part.combined,
                    ..tally
                },
            })
            .collect()
    }
}

/// One transaction's input, combined: the steps every shard of the group commits, and
/// each shard's part of the documents.
pub struct ReadBatch {
    /// Per shard of the group, in key order.
    parts: Vec<Part>,
    /// Every step queued per source, in order: the transaction's intent.
    steps: BTreeMap<String, Vec<Resume>>,
    /// Documents read whose keys no shard of the group owns (a pipeline's `shard:`),
    /// and their bytes: counted by the bounds, committed by nobody.
    outside: (u64, u64),
    /// Step data the intent journals (`Resume::Replay` with data).
    journaled: u64,
    /// Documents rejected (`on_error: skip`), already durable in dead-letter files.
    rejected: u64,
    /// A step of it has no records but moves its source's position ([`Step::advances`]).
    advances: bool,
    /// The transaction it becomes, if it becomes one.
    pub txn: Option<u64>,
    /// No more batches will follow (sources exhausted, or shutdown).
    pub last: bool,
    /// When it was read (the metrics); its counts are the parts'.
    tally: Tally,
}

/// One shard's documents of a batch.
struct Part {
    combiner: Combiner,
    /// Documents combined, and their bytes: what the shard commits.
    docs: u64,
    bytes: u64,
    /// Per source, in the run's order.
    sources: Vec<SourceCount>,
    /// Per binding: documents combined into it.
    combined: Vec<u64>,
}

impl Part {
    /// Counts a step of `feed`'s source that added `docs` documents of `bytes` bytes.
    fn count(&mut self, feed: &Feed, docs: u64, bytes: u64) {
        let source = &mut self.sources[feed.index];
        source.docs += docs;
        source.bytes += bytes;
        for &binding in feed.targets.iter() {
            self.combined[binding as usize] += docs;
        }
    }
}

/// One shard's transaction: its part of a [`ReadBatch`].
pub struct ShardBatch {
    pub combiner: Combiner,
    /// The batch's steps: the transaction's intent, the same in every shard.
    pub steps: BTreeMap<String, Vec<Resume>>,
    /// It is a transaction of every shard (see [`ReadBatch::is_transaction`]), whatever
    /// its own part holds.
    pub transaction: bool,
    /// The shard's documents and their bytes: what it commits.
    pub docs: u64,
    pub bytes: u64,
    /// Documents rejected (`on_error: skip`), counted by the group's first shard.
    pub rejected: u64,
    /// The transaction the batch becomes, if it becomes one.
    pub txn: Option<u64>,
    /// No more batches will follow.
    pub last: bool,
    pub tally: Tally,
}

/// What a batch read, per source and per binding, and when: counted by the metrics once
/// its transaction commits.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    /// Per source, in the run's order.
    pub sources: Vec<SourceCount>,
    /// Per binding: documents combined into it.
    pub combined: Vec<u64>,
    /// When its first document was combined.
    pub first_read: Option<Instant>,
    /// How long reading it took, idle time left out; of that, in its sources' `queue`,
    /// routing records to shards, and combining them.
    pub took: Duration,
    pub queue: Duration,
    pub route: Duration,
    pub combine: Duration,
    /// How long the reader waited for input with nothing read (a `--follow` run caught
    /// up): not reading, so left out of `took` and out of the run's rate.
    pub idle: Duration,
}

/// What one group's reader serves: its shards, and what they share.
pub(super) struct ReaderGroup {
    pub bindings: Arc<Vec<Binding>>,
    /// Each shard's key range, in key order, contiguous.
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
    /// Each shard's key range, in key order, contiguous.
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

/// Where each document goes: the shard of the group whose key range holds its key hash.
struct Router {
    /// The shards' ranges, in key order, contiguous.
    ranges: Arc<[KeyRange]>,
    /// Per source (the run's order): how its documents' keys are read.
    keys: Vec<SourceKey>,
    key: Vec<u8>,
    unwrapped: Vec<u8>,
}

/// How a source's documents' keys are read: scanned from the text where `KeyScan` can,
/// else from the parsed document.
struct SourceKey {
    scan: Option<KeyScan>,
    extractor: KeyExtractor,
    parser: DocParser,
}

/// Where a record goes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Route {
    Part(usize),
    /// Its key is of no shard of the group.
    Outside,
}

impl Router {
    fn new(ranges: Arc<[KeyRange]>, sources: &[BoundSource], bindings: &[Binding]) -> Router {
        let keys = sources
            .iter()
            .map(|bound| {
                // Every binding of a source materializes its one target collection.
                let first = bound.bindings[0] as usize;
                let key = &bindings[first].collection.key;
                SourceKey {
                    scan: KeyScan::new(key.pointers()),
                    extractor: key.clone(),
                    parser: DocParser::default(),
                }
            })
            .collect();
        Router {
            ranges,
            keys,
            key: Vec::with_capacity(64),
            unwrapped: Vec::new(),
        }
    }

    /// The part a record of source `source` goes to. A record whose key cannot be read
    /// here (not JSON, no key, not its envelope) goes to the first part, whose combiner
    /// reports what is wrong with it, as a shard's own would.
    fn route(&mut self, source: usize, envelope: Envelope, doc: SharedDoc<'_>) -> Route {
        self.key.clear();
        let keys = &mut self.keys[source];
        let keyed = match (envelope, doc) {
            (Envelope::None, SharedDoc::Json(text)) => keys.pack_text(text, &mut self.key),
            (Envelope::None, SharedDoc::Value(value)) => {
                keys.extractor.pack(value, &mut self.key).is_ok()
            }
            (envelope, doc) => {
                matches!(
                    unwrap_envelope(envelope, doc, &mut self.unwrapped),
                    Ok(true)
                ) && keys.pack_text(&self.unwrapped, &mut self.key)
            }
        };
        if !keyed {
            return Route::Part(0);
        }
        let hash = key_hash(&self.key);
        let at = self.ranges.partition_point(|r| r.end < hash);
        match self.ranges.get(at) {
            Some(range) if range.begin <= hash => Route::Part(at),
            _ => Route::Outside,
        }
    }
}

impl SourceKey {
    /// Appends the packed key of the document `text` holds to `out`; false when it has
    /// none to read.
    fn pack_text(&mut self, text: &[u8], out: &mut Vec<u8>) -> bool {
        if let Some(scan) = &self.scan
            && scan.pack(text, out)
        {
            return true;
        }
        out.clear();
        match self.parser.parse(text) {
            Ok(doc) => self.extractor.pack_doc(&doc, out).is_ok(),
            Err(_) => false,
        }
    }
}

/// What a batch rejected so far (sources with `on_error: skip`).
#[derive(Default)]
struct Rejects {
    letters: Vec<(RecordId, DeadLetter)>,
    /// Documents whose reduction failed, with the reason: rejected when the batch is
    /// rebuilt. Kept across rebuilds of one batch.
    unreducible: HashMap<RecordId, String>,
    /// Records whose text did not parse (bad JSON, a bad envelope), rejected or not:
    /// what a step adds goes to its source's `sluice_source_parse_errors_total`.
    parse_errors: u64,
}

/// Whether every record was combined, or a reduction failed and the batch needs a
/// rebuild (see the module docs).
#[must_use]
enum Combined {
    All,
    Rebuild,
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

impl Reader {
    /// Shows source `index`'s step in every shard's metrics.
    fn stepped(&self, index: usize, step: &Step) {
        for metrics in &self.metrics {
            metrics.sources[index].stepped(shown(step));
        }
    }

    /// Feeds one step of source `index` to the batch: its input errors become rejections
    /// (skipping source) or fail it at the first bad record, and its records go to their
    /// shards' parts, each to every binding of its source (see [`combine_record`]): routed
    /// in slices, then the parts combined, each round at once on up to `threads` threads
    /// (see the module docs). Leaves `records` empty.
    async fn combine(
        &mut self,
        step: &Step,
        index: usize,
        batch: &mut ReadBatch,
    ) -> Result<Combined, RunError> {
        let feed = self.feeds[index].clone();
        let parse_errors = self.rejects.parse_errors;
        let failing_at = match triage(Fault::Unreadable, feed.on_error) {
            Triage::Reject => {
                reject_input_errors(&feed, step, &mut self.rejects);
                None
            }
            Triage::FailInput | Triage::Fail | Triage::Rebuild => step.errors.first(),
        };
        let before: Vec<(u64, u64)> = batch.parts.iter().map(|p| (p.docs, p.bytes)).collect();
        let stop = failing_at.map(|err| (err.position.line, err.position.byte_offset));
        let mut started = Instant::now();
        let combined = if self.ranges.len() == 1 && self.ranges[0].is_all() {
            // One shard of every key takes every document: nothing to route.
            let part = &mut batch.parts[0];
            combine_records(&mut self.records, stop, &feed, part, &mut self.rejects)
                .map_err(|failed| *failed.err)
        } else {
            let records = Arc::new(std::mem::take(&mut self.records));
            let threads = if records.len() >= PARALLEL_MIN {
                self.threads
            } else {
                1
            };
            let slice = records.len().div_ceil(self.routers.len());
            let slices = (std::mem::take(&mut self.routers).into_iter().enumerate())
                .map(|(at, router)| Slice {
                    range: (at * slice).min(records.len())..((at + 1) * slice).min(records.len()),
                    parts: vec![Vec::new(); self.ranges.len()],
                    outside: (0, 0),
                    router,
                })
                .collect();
            let (shared, envelope) = (records.clone(), feed.envelope);
            let mut slices = on_pool(slices, threads, move |slice: &mut Slice| {
                slice.route(&shared, index, envelope, stop)
            })
            .await;
            batch.tally.route += started.elapsed();
            started = Instant::now();
            let mut jobs = Vec::with_capacity(batch.parts.len());
            for (at, part) in std::mem::take(&mut batch.parts).into_iter().enumerate() {
                jobs.push(Job {
                    part,
                    ordinals: (slices.iter_mut())
                        .map(|slice| std::mem::take(&mut slice.parts[at]))
                        .collect(),
                    rejects: Rejects {
                        letters: Vec::new(),
                        unreducible: self.rejects.unreducible.clone(),
                        parse_errors: 0,
                    },
                    combined: Ok(Combined::All),
                });
            }
            for slice in slices {
                batch.outside.0 += slice.outside.0;
                batch.outside.1 += slice.outside.1;
                self.routers.push(slice.router);
            }
            let busy = jobs.iter().filter(|job| job.records() > 0).count();
            let routed: usize = jobs.iter().map(Job::records).sum();
            let threads = if busy > 1 && routed >= PARALLEL_MIN {
                self.threads
            } else {
                1
            };
            let shared = (records.clone(), feed.clone());
            let jobs = on_pool(jobs, threads, move |job: &mut Job| {
                job.run(&shared.0, &shared.1)
            })
            .await;
            // Every thread is done with the records: their buffers are kept for the next step.
            self.records = Arc::try_unwrap(records).unwrap_or_default();
            let combined;
            (batch.parts, combined) = Job::merge(jobs, &mut self.rejects);
            combined
        };
        self.records.clear();
        batch.tally.combine += started.elapsed();
        let mut read = (0, 0);
        for (part, (docs, bytes)) in batch.parts.iter_mut().zip(before) {
            let added = (part.docs - docs, part.bytes - bytes);
            part.count(&feed, added.0, added.1);
            read = (read.0 + added.0, read.1 + added.1);
        }
        if read.0 > 0 {
            batch.tally.first_read.get_or_insert_with(Instant::now);
        }
        self.progress.read(read.0, read.1);
        // Parse errors, as read: those the source refused, then those of its text (in
        // the first shard's metrics, as its rejections).
        if let Some(first) = self.metrics.first() {
            let bad_text = self.rejects.parse_errors - parse_errors;
            first.sources[index].parse_errors(step.errors.len() as u64 + bad_text);
        }
        match combined? {
            Combined::All => failing_at.map_or(Ok(Combined::All), |err| {
                Err(feed.input_error(&err.position, &err.reason))
            }),
            Combined::Rebuild => Ok(Combined::Rebuild),
        }
    }
}

/// Runs `work` on each of `jobs`, the jobs spread over up to `threads` threads: this
/// one takes the first share, tokio's blocking pool the others (its threads live on, so
/// the scheduler spreads them over the cores). Returns the jobs in their order.
async fn on_pool<J: Send + 'static>(
    jobs: Vec<J>,
    threads: usize,
    work: impl Fn(&mut J) + Clone + Send + 'static,
) -> Vec<J> {
    let threads = threads.clamp(1, jobs.len().max(1));
    // Each thread takes every `threads`-th job.
    let mut shares: Vec<Vec<(usize, J)>> = (0..threads).map(|_| Vec::new()).collect();
    for (at, job) in jobs.into_iter().enumerate() {
        shares[at % threads].push((at, job));
    }
    let run = |mut share: Vec<(usize, J)>, work: &dyn Fn(&mut J)| {
        share.iter_mut().for_each(|(_, job)| work(job));
        share
    };
    let mut shares = shares.into_iter();
    let first = shares.next().unwrap_or_default();
    let spawned: Vec<_> = shares
        .map(|share| {
            let work = work.clone();
            tokio::task::spawn_blocking(move || run(share, &work))
        })
        .collect();
    let mut done = run(first, &work);
    for handle in spawned {
        match handle.await {
            Ok(share) => done.extend(share),
            Err(join) => std::panic::resume_unwind(join.into_panic()),
        }
    }
    done.sort_by_key(|(at, _)| *at);
    done.into_iter().map(|(_, job)| job).collect()
}

/// A slice of a step's records, routed on one thread.
struct Slice {
    router: Router,
    /// The records' numbers in the step.
    range: std::ops::Range<usize>,
    /// Per part: the numbers of the slice's records it takes, in order.
    parts: Vec<Vec<usize>>,
    /// Records whose key no shard of the group owns, and their bytes.
    outside: (u64, u64),
}

impl Slice {
    /// Routes the slice's records of source `source`, up to the one at `stop` (the
    /// step's first input error, which then fails it).
    fn route(&mut self, records: &Records, source: usize, envelope: Envelope, stop: Stop) {
        for ordinal in self.range.clone() {
            let record = records.get(ordinal).expect("a record of the step");
            if past(record.position, stop) {
                break;
            }
            match self.router.route(source, envelope, record.doc) {
                Route::Part(part) => self.parts[part].push(ordinal),
                Route::Outside => {
                    self.outside.0 += 1;
                    self.outside.1 += record.bytes as u64;
                }
            }
        }
    }
}

/// One part's records of a step, to combine into it (on whichever thread).
struct Job {
    part: Part,
    /// The numbers of its records in the step, per slice, in order.
    ordinals: Vec<Vec<usize>>,
    rejects: Rejects,
    combined: Result<Combined, Failed>,
}

impl Job {
    fn records(&self) -> usize {
        self.ordinals.iter().map(Vec::len).sum()
    }

    /// Combines the part's records, read in place from the step's (a `Value` is
    /// cloned: the records are shared).
    fn run(&mut self, records: &Records, feed: &Feed) {
        let mut scratch = Scratch::default();
        let mut value = Value::Null;
        self.combined = Ok(Combined::All);
        for &ordinal in self.ordinals.iter().flatten() {
            let record = records.get(ordinal).expect("a record of the step");
            let doc = match record.doc {
                SharedDoc::Json(text) => RecordDoc::Json(text),
                SharedDoc::Value(doc) => {
                    value.clone_from(doc);
                    RecordDoc::Value(&mut value)
                }
            };
            let record = Record {
                doc,
                position: record.position,
                bytes: record.bytes,
            };
            match combine_record(
                ordinal,
                record,
                feed,
                &mut self.part,
                &mut self.rejects,
                &mut scratch,
            ) {
                Ok(Combined::All) => {}
                done => {
                    self.combined = done;
                    return;
                }
            }
        }
        self.combined = combined_all();
    }

    /// The parts, in order, and the step's outcome: the failure of its earliest record,
    /// else a rebuild if a part needs one. Rejections join `rejects`, in record order.
    fn merge(jobs: Vec<Job>, rejects: &mut Rejects) -> (Vec<Part>, Result<Combined, RunError>) {
        let mut result = Ok(Combined::All);
        let mut first_failure = usize::MAX;
        let mut letters = Vec::new();
        let mut parts = Vec::with_capacity(jobs.len());
        for job in jobs {
            rejects.unreducible.extend(job.rejects.unreducible);
            rejects.parse_errors += job.rejects.parse_errors;
            letters.extend(job.rejects.letters);
            match job.combined {
                Ok(Combined::Rebuild) if first_failure == usize::MAX => {
                    result = Ok(Combined::Rebuild);
                }
                Ok(_) => {}
                Err(failed) if failed.at <= first_failure => {
                    first_failure = failed.at;
                    result = Err(*failed.err);
                }
                Err(_) => {}
            }
            parts.push(job.part);
        }
        letters.sort_by_key(|(id, _)| *id);
        rejects.letters.extend(letters);
        (parts, result)
    }
}

/// A record that failed its batch, and its number in the step.
struct Failed {
    at: usize,
    err: Box<RunError>,
}

/// Returns when the operator's pauses change; never once nobody can change them.
async fn pause_changed(pauses: &mut watch::Receiver<Held>) {
    if pauses.changed().await.is_err() {
        std::future::pending::<()>().await;
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

/// A source as the combining of its records needs it (shared with the threads that
/// combine a step's parts).
struct Feed {
    index: usize,
    name: Arc<str>,
    /// The bindings its documents feed.
    targets: Arc<[u32]>,
    on_error: OnError,
    /// `on_error: skip`: the collection its documents are checked against first.
    skip: Option<Arc<Collection>>,
    /// Its steps can be re-read exactly, so a batch can be rebuilt without a document
    /// that failed to reduce.
    replayable: bool,
    /// How its records wrap their documents.
    envelope: Envelope,
}

impl Feed {
    fn new(index: usize, bound: &BoundSource, bindings: &[Binding]) -> Feed {
        let first = *bound
            .bindings
            .first()
            .expect("a bound source feeds a binding");
        Feed {
            index,
            name: bound.source.name().into(),
            targets: bound.bindings.as_slice().into(),
            on_error: if bound.dead_letter.is_some() {
                OnError::Skip
            } else {
                OnError::Fail
            },
            // Every binding of a source materializes its one target collection.
            skip: bound
                .dead_letter
                .is_some()
                .then(|| bindings[first as usize].collection.clone()),
            replayable: bound.source.fault_tolerance() == FaultTolerance::ExactlyOnce,
            envelope: bound.envelope,
        }
    }

    fn record_id(&self, position: &Position) -> RecordId {
        (self.index, position.line, position.byte_offset)
    }

    /// The dead letter of a rejected document; a `Value` is taken from its record.
    fn dead_letter(&self, position: &Position, reason: String, doc: RecordDoc<'_>) -> DeadLetter {
        let position = position.to_string();
        match doc {
            RecordDoc::Json(text) => DeadLetter::json(&self.name, position, reason, text),
            RecordDoc::Value(doc) => {
                DeadLetter::document(&self.name, position, reason, std::mem::take(doc))
            }
        }
    }

    /// The error that fails a batch at bad input of this source: a record it could not
    /// read, or text that is not JSON.
    fn input_error(&self, position: &Position, reason: &str) -> RunError {
        RunError::Input {
            name: self.name.to_string(),
            position: position.to_string(),
            reason: format!("{reason} (source {})", self.name),
        }
    }
}

/// Where a failing step's first input error stands (`line`, `byte_offset`): the records
/// after it are not combined.
type Stop = Option<(u64, u64)>;

fn past(position: &Position, stop: Stop) -> bool {
    stop.is_some_and(|stop| (position.line, position.byte_offset) > stop)
}

/// A combining thread's buffers.
#[derive(Default)]
struct Scratch {
    key: Vec<u8>,
    unwrapped: Vec<u8>,
}

/// Feeds records to every binding of their source, up to `stop` (a failing source's
/// first input error, which then fails the step); see [`combine_record`].
fn combine_records(
    records: &mut Records,
    stop: Stop,
    feed: &Feed,
    part: &mut Part,
    rejects: &mut Rejects,
) -> Result<Combined, Failed> {
    let mut scratch = Scratch::default();
    for (at, record) in records.iter_mut().enumerate() {
        if past(record.position, stop) {
            break;
        }
        if let Combined::Rebuild = combine_record(at, record, feed, part, rejects, &mut scratch)? {
            return Ok(Combined::Rebuild);
        }
    }
    combined_all()
}

/// Feeds record `at` of a step to every binding of its source. A skipping source's bad
/// document is rejected instead; `Rebuild` when one failed to reduce.
fn combine_record(
    at: usize,
    record: Record<'_>,
    feed: &Feed,
    part: &mut Part,
    rejects: &mut Rejects,
    scratch: &mut Scratch,
) -> Result<Combined, Failed> {
    let failed = |err| Failed {
        at,
        err: Box::new(err),
    };
    let position = record.position;
    let id = feed.record_id(position);
    if feed.skip.is_some()
        && let Some(reason) = rejects.unreducible.get(&id)
    {
        let letter = feed.dead_letter(position, reason.clone(), record.doc);
        rejects.letters.push((id, letter));
        return Ok(Combined::All);
    }
    let doc = match feed.envelope {
        Envelope::None => record.doc,
        envelope => match unwrap_envelope(envelope, record.doc.shared(), &mut scratch.unwrapped) {
            Ok(true) => RecordDoc::Json(&scratch.unwrapped),
            // Nothing to apply (a tombstone after a deletion); its bytes still count.
            Ok(false) => {
                part.bytes += record.bytes as u64;
                return Ok(Combined::All);
            }
            Err(reason) => {
                rejects.parse_errors += 1;
                match triage(Fault::Unreadable, feed.on_error) {
                    Triage::Reject => {
                        let letter = feed.dead_letter(position, reason, record.doc);
                        rejects.letters.push((id, letter));
                        return Ok(Combined::All);
                    }
                    _ => return Err(failed(feed.input_error(position, &reason))),
                }
            }
        },
    };
    let (combined, text) = match doc {
        RecordDoc::Json(text) => {
            let combined = feed
                .targets
                .iter()
                .try_for_each(|&binding| part.combiner.combine_right_json(binding, text));
            (combined, Some(text))
        }
        RecordDoc::Value(doc) => {
            let rejected = (feed.skip.as_deref())
                .and_then(|collection| check_document(collection, doc, &mut scratch.key));
            if let Some(reason) = rejected {
                let letter = feed.dead_letter(position, reason, RecordDoc::Value(doc));
                rejects.letters.push((id, letter));
                return Ok(Combined::All);
            }
            (combine_value(&mut part.combiner, &feed.targets, doc), None)
        }
    };
    let err = match combined {
        Ok(()) => {
            part.docs += 1;
            part.bytes += record.bytes as u64;
            return Ok(Combined::All);
        }
        Err(err) => err,
    };
    // The position is formatted only for an error: this path is hot.
    match (triage(Fault::of(&err), feed.on_error), err, text) {
        (Triage::Rebuild, err, _) if feed.replayable => {
            rejects.unreducible.insert(id, err.to_string());
            Ok(Combined::Rebuild)
        }
        (Triage::Reject, err, Some(text)) => {
            let reason = match err {
                CombineError::Parse { source, .. } => {
                    rejects.parse_errors += 1;
                    bad_json(text, &source)
                }
                err => err.to_string(),
            };
            let letter = feed.dead_letter(position, reason, RecordDoc::Json(text));
            rejects.letters.push((id, letter));
            Ok(Combined::All)
        }
        (Triage::FailInput, CombineError::Parse { source, .. }, Some(text)) => {
            rejects.parse_errors += 1;
            Err(failed(feed.input_error(position, &bad_json(text, &source))))
        }
        // A `Value` was checked before it was combined (and is gone now).
        // A reduction failed, and the batch cannot be re-read without the document.
        (Triage::Reject | Triage::FailInput | Triage::Fail | Triage::Rebuild, err, _) => {
            Err(failed(RunError::Document {
                position: position.to_string(),
                source: Box::new(err),
            }))
        }
    }
}

/// The end of a part's records of a step, all combined.
fn combined_all() -> Result<Combined, Failed> {
    // The reader talks to no driver: its injected error is reported as the driver
    // errors are, so that it is retried like them.
    crate::failpoint::fail_point!(AFTER_QUEUE, |source| Failed {
        at: usize::MAX,
        err: Box::new(RunError::Driver {
            endpoint: "(reader)".to_string(),
            source,
        }),
    });
    Ok(Combined::All)
}

/// Writes the text of the document `doc` carries under `envelope` ([`crate::envelope`])
/// to `buf`; `false` for a record with nothing to apply; `Err` names why the record is
/// not such an envelope (the record is left as it was, for its dead letter).
fn unwrap_envelope(
    envelope: Envelope,
    doc: SharedDoc<'_>,
    buf: &mut Vec<u8>,
) -> Result<bool, String> {
    let record = match doc {
        SharedDoc::Json(text) => serde_json::from_slice(text).map_err(|e| bad_json(text, &e))?,
        SharedDoc::Value(value) => value.clone(),
    };
    let unwrapped = (envelope.unwrap(record))
        .map_err(|reason| format!("envelope {}: {reason}", envelope.name()))?;
    match unwrapped {
        Unwrapped::Nothing => Ok(false),
        Unwrapped::Document(doc) => {
            buf.clear();
            serde_json::to_writer(&mut *buf, &doc).expect("a document serializes");
            Ok(true)
        }
    }
}

/// Combines a source's `Value` into every target binding (moved into the last).
fn combine_value(
    combiner: &mut Combiner,
    targets: &[u32],
    doc: &mut serde_json::Value,
) -> Result<(), CombineError> {
    let (last, rest) = targets
        .split_last()
        .expect("a bound source feeds a binding");
    for &binding in rest {
        combiner.combine_right(binding, doc.clone())?;
    }
    combiner.combine_right(*last, std::mem::take(doc))
}

/// Why a skipping source's `Value` cannot be combined, if it cannot: it is invalid or
/// has no key ([`Collection::check_value`]). Checked before the combiner sees it (which would
/// drop it on error).
fn check_document(
    collection: &Collection,
    doc: &serde_json::Value,
    key: &mut Vec<u8>,
) -> Option<String> {
    collection
        .check_value(doc, key)
        .err()
        .map(|e| e.to_string())
}

/// A skipping source's input errors: its rejections.
fn reject_input_errors(feed: &Feed, step: &Step, rejects: &mut Rejects) {
    for err in &step.errors {
        let letter = DeadLetter::raw(
            &feed.name,
            err.position.to_string(),
            err.reason.clone(),
            &err.raw,
            err.raw.len() >= InputError::RAW_LIMIT,
        );
        rejects
            .letters
            .push((feed.record_id(&err.position), letter));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ReadAhead;
    use sluice_source_sdk::{Queued, SourceError};
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
