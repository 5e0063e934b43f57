//! The drain: a k-way merge of the spilled runs and the sorted in-memory table.
//!
//! ```text
//!  run 0 ─┐
//!  run 1 ─┼─▶ BinaryHeap of one head record per source ─▶ group equal keys ─▶ reduce ─▶ Drained
//!  table ─┘   (smallest key first; loaded doc first; then source order)
//! ```
//!
//! Sources are numbered in arrival order (runs in spill order, the table last). Among
//! records of one key the heap yields the loaded one first, then the others by source,
//! so the reduction is `loaded ⊕ run 0 ⊕ run 1 ⊕ … ⊕ table`, the order the combiner
//! promises. Each source holds one decoded record in the heap and one read buffer.
//!
//! A binding with `full` reductions reduces every later record onto the key's first one
//! as onto a whole document, then finishes the result (deletions, set removals). A
//! partial drain of a non-associative binding yields every record of a key apart.
//!
//! A record that resets its key (a deletion, or documents that began with one) replaces
//! what was reduced so far, and a document after a deletion replaces it (it reduces from
//! nothing): `a ⊕ reset(b) = reset(b)`, `reset(deletion) ⊕ c = reset(c)`. A full drain
//! whose result is a deletion drains it deleted.

use super::memtable::{MemTable, SortedTable};
use super::spill::{RunReader, SpillFile};
use super::{BindingSpec, CombineError, Drained, Record, Side, describe_key};
use crate::compact::Doc;
use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;

enum Source {
    Run(RunReader),
    Table(SortedTable),
}

impl Source {
    fn next_record(&mut self) -> Result<Option<Record>, CombineError> {
        match self {
            Source::Run(run) => run.next_record(),
            Source::Table(table) => Ok(table.next_record()),
        }
    }
}

/// The current record of one source.
struct Head {
    record: Record,
    source: usize,
}

impl Head {
    /// "Greater" means "drained first", as `BinaryHeap` pops its greatest element.
    fn priority(&self, other: &Head) -> Ordering {
        other
            .record
            .key
            .cmp(&self.record.key)
            .then((self.record.side == Side::Left).cmp(&(other.record.side == Side::Left)))
            .then(other.source.cmp(&self.source))
    }
}

impl Ord for Head {
    fn cmp(&self, other: &Self) -> Ordering {
        self.priority(other)
    }
}

impl PartialOrd for Head {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Head {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Head {}

/// Yields every (binding, key) once, fully combined, in (binding, packed key) order.
/// After an error it yields nothing more.
pub struct Drainer {
    bindings: Arc<[BindingSpec]>,
    sources: Vec<Source>,
    heap: BinaryHeap<Head>,
    failed: bool,
}

impl Drainer {
    pub(super) fn new(
        bindings: Arc<[BindingSpec]>,
        table: MemTable,
        spill: Option<SpillFile>,
    ) -> Result<Drainer, CombineError> {
        let runs = spill.as_ref().map(SpillFile::readers).unwrap_or_default();
        let mut sources: Vec<Source> = runs.into_iter().map(Source::Run).collect();
        sources.push(Source::Table(table.into_sorted()));
        let mut heap = BinaryHeap::with_capacity(sources.len());
        for (source, reader) in sources.iter_mut().enumerate() {
            if let Some(record) = reader.next_record()? {
                heap.push(Head { record, source });
            }
        }
        Ok(Drainer {
            bindings,
            sources,
            heap,
            failed: false,
        })
    }

    /// Takes the smallest record and replaces it with the next one of its source.
    fn pop(&mut self) -> Result<Option<Record>, CombineError> {
        let Some(head) = self.heap.pop() else {
            return Ok(None);
        };
        if let Some(record) = self.sources[head.source].next_record()? {
            self.heap.push(Head {
                record,
                source: head.source,
            });
        }
        Ok(Some(head.record))
    }

    fn next_drained(&mut self) -> Result<Option<Drained>, CombineError> {
        let Some(Record {
            mut key,
            side,
            mut doc,
        }) = self.pop()?
        else {
            return Ok(None);
        };
        let full = side == Side::Left;
        let mut resets = side == Side::Reset;
        let binding = u32::from_be_bytes([key[0], key[1], key[2], key[3]]);
        let bindings = Arc::clone(&self.bindings);
        let Some(spec) = bindings.get(binding as usize) else {
            return Err(CombineError::CorruptSpill {
                offset: 0,
                reason: format!("record of binding {binding}, which does not exist"),
            });
        };
        // A non-associative binding's documents reduce only in a full reduction, onto the
        // left-most one; a partial drain yields each as it came.
        let groups = spec.full || spec.schema.reducer().associative();
        while groups && self.heap.peek().is_some_and(|head| head.record.key == key) {
            let Some(next) = self.pop()? else { break };
            if next.side == Side::Left {
                return Err(CombineError::DuplicateLoad {
                    collection: spec.name.clone(),
                    key: describe_key(&key[4..]),
                });
            }
            if next.side == Side::Reset || (resets && doc.is_deletion()) {
                // It starts the key over, or follows a deletion: it replaces what is
                // left of it (a loaded document leaves only that it was loaded, `full`).
                doc = next.doc;
                resets = true;
                continue;
            }
            // A loaded document and the new ones, or the new ones of several runs; in a
            // full reduction the first of them is the left-most whole document.
            let left_is_whole = full || spec.full;
            if let Err(source) =
                (spec.schema.reducer()).reduce_docs(&mut doc, next.doc, left_is_whole)
            {
                return Err(CombineError::Reduce {
                    collection: spec.name.clone(),
                    key: describe_key(&key[4..]),
                    source,
                });
            }
        }
        let deleted =
            spec.full && ((resets && doc.is_deletion()) || spec.schema.reducer().finish(&mut doc));
        if deleted {
            doc = Doc::Null;
        }
        key.drain(..4);
        Ok(Some(Drained {
            binding,
            key,
            doc,
            full,
            deleted,
            // A full drain has applied it.
            resets: resets && !spec.full,
        }))
    }
}

impl Iterator for Drainer {
    type Item = Result<Drained, CombineError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let next = self.next_drained();
        self.failed = next.is_err();
        next.transpose()
    }
}
