//! A batch: one transaction's input as the reader hands it on, its documents
//! combined per shard of the group, and what it read (the metrics' tally).

use super::TxnOptions;
use super::combine::Feed;
use crate::metrics::status::SourceCount;
use sluice_doc::combine::Combiner;
use sluice_source_sdk::Resume;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

impl ReadBatch {
    /// Documents read, of the group's keys, and their bytes: what its bounds count.
    pub(super) fn read(&self) -> (u64, u64) {
        (self.parts.iter()).fold(self.outside, |(docs, bytes), p| {
            (docs + p.docs, bytes + p.bytes)
        })
    }

    /// Whether it reached a size bound.
    pub(super) fn full(&self, opts: &TxnOptions) -> bool {
        let (docs, bytes) = self.read();
        opts.full(docs, bytes, self.journaled)
    }

    /// Whether it becomes a transaction: it has documents, rejections (whose source
    /// positions must be checkpointed, so they are not rejected twice), or a step that
    /// moved a source's position without records ([`Step::advances`]: a slot that may
    /// release WAL once that position is durable).
    pub(super) fn is_transaction(&self) -> bool {
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
    pub(super) parts: Vec<Part>,
    /// Every step queued per source, in order: the transaction's intent.
    pub(super) steps: BTreeMap<String, Vec<Resume>>,
    /// Documents read whose keys no shard of the group owns (a pipeline's `shard:`),
    /// and their bytes: counted by the bounds, committed by nobody.
    pub(super) outside: (u64, u64),
    /// Step data the intent journals (`Resume::Replay` with data).
    pub(super) journaled: u64,
    /// Documents rejected (`on_error: skip`), already durable in dead-letter files.
    pub(super) rejected: u64,
    /// A step of it has no records but moves its source's position ([`Step::advances`]).
    pub(super) advances: bool,
    /// The transaction it becomes, if it becomes one.
    pub txn: Option<u64>,
    /// No more batches will follow (sources exhausted, or shutdown).
    pub last: bool,
    /// When it was read (the metrics); its counts are the parts'.
    pub(super) tally: Tally,
}

/// One shard's documents of a batch.
pub(super) struct Part {
    pub(super) combiner: Combiner,
    /// Documents combined, and their bytes: what the shard commits.
    pub(super) docs: u64,
    pub(super) bytes: u64,
    /// Per source, in the run's order.
    pub(super) sources: Vec<SourceCount>,
    /// Per binding: documents combined into it.
    pub(super) combined: Vec<u64>,
}

impl Part {
    /// Counts a step of `feed`'s source that added `docs` documents of `bytes` bytes.
    pub(super) fn count(&mut self, feed: &Feed, docs: u64, bytes: u64) {
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
