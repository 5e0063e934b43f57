//! Combining: a step's records into its shards' parts, each record into every binding
//! of its source, on up to the group's threads; and what a bad record becomes (a
//! rejection, a rebuild, or the batch's error; see the parent module's docs).

use super::super::BoundSource;
use super::super::decide::{Fault, Triage, triage};
use super::route::{Slice, Stop, past, unwrap_envelope};
use super::{PARALLEL_MIN, Part, ReadBatch, Reader};
use crate::config::OnError;
use crate::deadletter::{DeadLetter, RecordId};
use crate::envelope::Envelope;
use crate::types::{Binding, Collection, RunError};
use serde_json::Value;
use sluice_doc::combine::{CombineError, Combiner};
use sluice_source_sdk::{
    FaultTolerance, InputError, Position, Record, RecordDoc, Records, SharedDoc, Step, bad_json,
};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// What a batch rejected so far (sources with `on_error: skip`).
#[derive(Default)]
pub(super) struct Rejects {
    pub(super) letters: Vec<(RecordId, DeadLetter)>,
    /// Documents whose reduction failed, with the reason: rejected when the batch is
    /// rebuilt. Kept across rebuilds of one batch.
    pub(super) unreducible: HashMap<RecordId, String>,
    /// Records whose text did not parse (bad JSON, a bad envelope), rejected or not:
    /// what a step adds goes to its source's `sluice_source_parse_errors_total`.
    pub(super) parse_errors: u64,
}

/// Whether every record was combined, or a reduction failed and the batch needs a
/// rebuild (see the module docs).
#[must_use]
pub(super) enum Combined {
    All,
    Rebuild,
}

impl Reader {
    /// Feeds one step of source `index` to the batch: its input errors become rejections
    /// (skipping source) or fail it at the first bad record, and its records go to their
    /// shards' parts, each to every binding of its source (see [`combine_record`]): routed
    /// in slices, then the parts combined, each round at once on up to `threads` threads
    /// (see the module docs). Leaves `records` empty.
    pub(super) async fn combine(
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
pub(super) async fn on_pool<J: Send + 'static>(
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

/// One part's records of a step, to combine into it (on whichever thread).
pub(super) struct Job {
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
pub(super) struct Failed {
    at: usize,
    err: Box<RunError>,
}

/// A source as the combining of its records needs it (shared with the threads that
/// combine a step's parts).
pub(super) struct Feed {
    pub(super) index: usize,
    name: Arc<str>,
    /// The bindings its documents feed.
    pub(super) targets: Arc<[u32]>,
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
    pub(super) fn new(index: usize, bound: &BoundSource, bindings: &[Binding]) -> Feed {
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

/// A combining thread's buffers.
#[derive(Default)]
pub(super) struct Scratch {
    key: Vec<u8>,
    unwrapped: Vec<u8>,
}

/// Feeds records to every binding of their source, up to `stop` (a failing source's
/// first input error, which then fails the step); see [`combine_record`].
pub(super) fn combine_records(
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
pub(super) fn combine_record(
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
pub(super) fn combined_all() -> Result<Combined, Failed> {
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

/// Combines a source's `Value` into every target binding (moved into the last).
pub(super) fn combine_value(
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
pub(super) fn check_document(
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
pub(super) fn reject_input_errors(feed: &Feed, step: &Step, rejects: &mut Rejects) {
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
