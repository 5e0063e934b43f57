//! The in-memory table of the combiner and its memory estimate.
//!
//! ```text
//!  index: HashTable<Entry { binding, key prefix, key range, docs: compact Doc, heap }>
//!                                      │
//!                     keys: Vec<u8> ◀──┘  (every table key, back to back)
//! ```
//!
//! Documents are kept as [`Doc`]s (about a third of a `Value`'s memory, see
//! [`crate::compact`]): a key's first document is kept as it came, later ones are reduced
//! into it in place with [`Reducer::reduce_docs`]. The drain yields the `Doc`s themselves.
//!
//! Lookups hash the caller's borrowed key bytes, so an existing key costs no allocation;
//! a new key appends to the `keys` arena and to the index. Entries live in the hash table
//! itself, so a lookup reaches its entry in one random access, and a packed key of up to
//! 16 bytes is matched by its binding and prefix without a second one into the arena. The table is
//! never sorted while it fills: [`MemTable::sorted`] moves the entries into a vector and
//! orders them once, at a spill or the drain.
//!
//! The memory estimate is [`MemTable::memory_bytes`]: the index and key arena by capacity
//! (capacity, not length, because a cleared table keeps its allocations for the next
//! fill) plus the sum of every entry's [`Doc::heap_size`] estimate. An entry's estimate is
//! measured when its first document arrives and then kept exact by the change each
//! reduction reports ([`Reducer::reduce_docs`]), so a growing document (e.g. one with
//! `append`) is never walked again.

use super::{CombineError, Record, Side, describe_key};
use crate::compact::Doc;
use crate::reduce::{ReduceError, Reducer};
use hashbrown::{DefaultHashBuilder, HashTable};
use std::hash::BuildHasher;
use std::mem::size_of;

/// One key's documents. The loaded document stays apart from the new ones until the drain
/// (see the module docs of `combine`), so both may be present.
enum Docs {
    Right(Doc),
    Left(Box<Doc>),
    Both {
        left: Box<Doc>,
        right: Doc,
    },
    /// A non-associative binding's documents, none combined with another (see
    /// [`Reducer::associative`]): the loaded one, if any, and the new ones in order.
    Held(Box<Held>),
}

struct Held {
    left: Option<Doc>,
    rights: Vec<Doc>,
}

/// One key of the table: 64 bytes, one cache line, so a lookup touches one line of
/// entries (offsets and the estimate are `u32`; see [`KEY_ARENA_LIMIT`]).
struct Entry {
    /// The [`KeyHead`] of the table key, which lookups and sorts compare before the
    /// arena's bytes; for packed keys of at most 16 bytes it is the whole table key (with
    /// the length).
    prefix: [u64; 2],
    binding: u32,
    key_len: u32,
    key_start: u32,
    /// Estimated heap bytes of `docs` in the low 31 bits, saturating (a single key past
    /// 2 GiB of documents has long broken any budget); the top bit: the new documents
    /// start the key over (the first of them resets, see [`Side::Reset`]). Packed so an
    /// entry stays one cache line.
    heap_and_resets: u32,
    docs: Docs,
}

impl Entry {
    fn key<'k>(&self, keys: &'k [u8]) -> &'k [u8] {
        let start = self.key_start as usize;
        &keys[start..start + self.key_len as usize]
    }

    fn head(&self) -> KeyHead {
        KeyHead {
            binding: self.binding,
            prefix: self.prefix,
        }
    }

    /// Whether this entry's key is `key`, whose head is `head`. Short keys are decided
    /// without touching the key arena (one cache miss fewer per lookup).
    fn is(&self, keys: &[u8], key: &[u8], head: KeyHead) -> bool {
        self.head() == head
            && self.key_len as usize == key.len()
            && (key.len() <= 4 + PREFIX_LEN || self.key(keys) == key)
    }

    fn heap(&self) -> usize {
        (self.heap_and_resets & HEAP_MASK) as usize
    }

    fn set_heap(&mut self, heap: usize) {
        let heap = u32::try_from(heap).unwrap_or(HEAP_MASK).min(HEAP_MASK);
        self.heap_and_resets = (self.heap_and_resets & !HEAP_MASK) | heap;
    }

    /// Whether the first new document starts the key over.
    fn resets(&self) -> bool {
        self.heap_and_resets & !HEAP_MASK != 0
    }

    fn set_resets(&mut self) {
        self.heap_and_resets |= !HEAP_MASK;
    }

    /// The side the `i`-th of the entry's new documents joins.
    fn right_side(&self, i: usize) -> Side {
        if i == 0 && self.resets() {
            Side::Reset
        } else {
            Side::Right
        }
    }
}

/// The estimate's bits of [`Entry::heap_and_resets`].
const HEAP_MASK: u32 = u32::MAX >> 1;

/// The key arena's size past which the table reports itself full (so the combiner
/// spills), keeping every offset within an entry's `u32`: far above any budget's keys.
pub(super) const KEY_ARENA_LIMIT: usize = (u32::MAX / 2) as usize;

/// What an entry keeps of its table key inline: ordered like the table keys themselves
/// except where they tie (the prefix words are big-endian, so they order like bytes).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct KeyHead {
    binding: u32,
    prefix: [u64; 2],
}

impl KeyHead {
    /// The head of a table key: its binding (4 bytes, big-endian), then the first 16
    /// bytes of the packed key, big-endian, zero-padded.
    fn of(key: &[u8]) -> KeyHead {
        let (binding, packed) = key.split_at(4);
        let mut prefix = [0u8; PREFIX_LEN];
        let n = packed.len().min(PREFIX_LEN);
        prefix[..n].copy_from_slice(&packed[..n]);
        let (high, low) = prefix.split_at(8);
        KeyHead {
            binding: u32::from_be_bytes(binding.try_into().expect("4 bytes")),
            prefix: [
                u64::from_be_bytes(high.try_into().expect("8 bytes")),
                u64::from_be_bytes(low.try_into().expect("8 bytes")),
            ],
        }
    }
}

/// Why [`MemTable::insert`] refused a document.
pub(super) enum InsertError {
    Reduce(ReduceError),
    DuplicateLoad,
}

impl InsertError {
    pub(super) fn into_combine_error(self, collection: &str, packed_key: &[u8]) -> CombineError {
        let collection = collection.to_string();
        let key = describe_key(packed_key);
        match self {
            InsertError::Reduce(source) => CombineError::Reduce {
                collection,
                key,
                source,
            },
            InsertError::DuplicateLoad => CombineError::DuplicateLoad { collection, key },
        }
    }
}

#[derive(Default)]
pub(super) struct MemTable {
    /// Every entry while the table fills; empty once [`MemTable::sorted`] moved them out.
    index: HashTable<Entry>,
    hasher: DefaultHashBuilder,
    /// The entries in a spill or the drain, which [`MemTable::sorted`] orders.
    entries: Vec<Entry>,
    keys: Vec<u8>,
    /// Sum of `Entry::heap`.
    heap: usize,
}

impl MemTable {
    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// The estimate compared with the memory budget (see the module docs).
    pub(super) fn memory_bytes(&self) -> usize {
        // hashbrown keeps one control byte per bucket and at most 7/8 of buckets full.
        let index = self.index.capacity() * (size_of::<Entry>() + 1) * 8 / 7;
        index + self.keys.capacity() + self.heap
    }

    /// Adds `doc` to the documents of `key` (a table key: binding then packed key).
    /// On error the entry may be half-reduced; the caller must stop using the table.
    pub(super) fn insert(
        &mut self,
        key: &[u8],
        side: Side,
        doc: Doc,
        reducer: &Reducer,
    ) -> Result<(), InsertError> {
        let hash = self.hasher.hash_one(key);
        let head = KeyHead::of(key);
        let keys = &self.keys;
        let Some(entry) = self.index.find_mut(hash, |e| e.is(keys, key, head)) else {
            let heap = doc.heap_size();
            let docs = match side {
                Side::Left => Docs::Left(Box::new(doc)),
                Side::Right | Side::Reset => Docs::Right(doc),
            };
            let mut entry = Entry {
                prefix: head.prefix,
                binding: head.binding,
                key_len: u32::try_from(key.len()).expect("a key within the arena limit"),
                key_start: u32::try_from(self.keys.len()).expect("the arena within its limit"),
                heap_and_resets: 0,
                docs,
            };
            entry.set_heap(heap);
            if side == Side::Reset {
                entry.set_resets();
            }
            self.keys.extend_from_slice(key);
            self.heap += entry.heap();
            let (keys, hasher) = (&self.keys, &self.hasher);
            self.index
                .insert_unique(hash, entry, |e| hasher.hash_one(e.key(keys)));
            return Ok(());
        };
        let before = entry.heap();
        let result = update(entry, side, doc, reducer);
        self.heap = self.heap - before + entry.heap();
        result
    }

    /// Makes room for `keys` more keys, so that a table whose size is known ahead (the
    /// next combiner of a drain) does not grow, and rehash, step by step.
    pub(super) fn reserve(&mut self, keys: usize) {
        let (arena, hasher) = (&self.keys, &self.hasher);
        self.index.reserve(keys, |e| hasher.hash_one(e.key(arena)));
    }

    /// Whether the key arena reached [`KEY_ARENA_LIMIT`]: the table must be spilled.
    pub(super) fn keys_full(&self) -> bool {
        self.keys.len() >= KEY_ARENA_LIMIT
    }

    /// Moves the entries out of the index and returns their indices in table-key order.
    /// Sorting compares each key's head (binding and first 16 bytes) kept next to its
    /// index (no pointer chasing into a cold arena), and only ties look at the whole keys.
    fn sorted(&mut self) -> Vec<usize> {
        self.entries.extend(self.index.drain());
        let mut order: Vec<(KeyHead, usize)> = (self.entries.iter().enumerate())
            .map(|(i, entry)| (entry.head(), i))
            .collect();
        order.sort_unstable_by(|(pa, a), (pb, b)| {
            pa.cmp(pb).then_with(|| {
                let (a, b) = (&self.entries[*a], &self.entries[*b]);
                a.key(&self.keys).cmp(b.key(&self.keys))
            })
        });
        order.into_iter().map(|(_, i)| i).collect()
    }

    /// Every document as `(table key, side, doc)` in table-key order, a key's loaded
    /// document before its new ones: the order of a spilled run.
    pub(super) fn sorted_docs(&mut self) -> impl Iterator<Item = (&[u8], Side, &Doc)> {
        let order = self.sorted();
        let this = &*self;
        order.into_iter().flat_map(move |i| {
            let entry = &this.entries[i];
            let key = entry.key(&this.keys);
            let (left, rights) = match &entry.docs {
                Docs::Right(right) => (None, std::slice::from_ref(right)),
                Docs::Left(left) => (Some(&**left), &[][..]),
                Docs::Both { left, right } => (Some(&**left), std::slice::from_ref(right)),
                Docs::Held(held) => (held.left.as_ref(), held.rights.as_slice()),
            };
            let left = left.map(|doc| (key, Side::Left, doc));
            let rights =
                (rights.iter().enumerate()).map(move |(i, doc)| (key, entry.right_side(i), doc));
            left.into_iter().chain(rights)
        })
    }

    /// Empties the table, keeping the index and key arena allocations for the next fill
    /// (the sorted entries are freed: spills are rare, and the estimate does not count them).
    pub(super) fn clear(&mut self) {
        self.index.clear();
        self.entries = Vec::new();
        self.keys.clear();
        self.heap = 0;
    }

    /// Consumes the table into a source of records in the order of [`Self::sorted_docs`].
    pub(super) fn into_sorted(mut self) -> SortedTable {
        SortedTable {
            order: self.sorted().into_iter(),
            table: self,
            pending: Vec::new(),
        }
    }
}

/// Adds `doc` to an existing entry's documents, updating its estimate.
fn update(entry: &mut Entry, side: Side, doc: Doc, reducer: &Reducer) -> Result<(), InsertError> {
    if !reducer.associative() {
        return hold(entry, side, doc);
    }
    let resets = entry.resets();
    let grown = match (&mut entry.docs, side) {
        // After a deletion, the next document starts from nothing: it replaces it.
        (Docs::Right(right) | Docs::Both { right, .. }, Side::Right)
            if resets && right.is_deletion() =>
        {
            replace(right, doc)
        }
        // In place: most documents go here, and moving the entry's out and back costs a drop.
        (Docs::Right(right) | Docs::Both { right, .. }, Side::Right) => reducer
            .reduce_docs(right, doc, false)
            .map_err(InsertError::Reduce)?,
        (Docs::Right(right) | Docs::Both { right, .. }, Side::Reset) => {
            entry.heap_and_resets |= !HEAP_MASK;
            replace(right, doc)
        }
        (Docs::Left(_) | Docs::Both { .. }, Side::Left) => {
            return Err(InsertError::DuplicateLoad);
        }
        (Docs::Held(_), _) => unreachable!("only a non-associative binding holds documents"),
        (docs @ (Docs::Right(_) | Docs::Left(_)), _) => {
            if side == Side::Reset {
                entry.heap_and_resets |= !HEAP_MASK;
            }
            let grown = doc.heap_size() as isize;
            *docs = match std::mem::replace(docs, Docs::Right(Doc::Null)) {
                Docs::Right(right) => Docs::Both {
                    left: Box::new(doc),
                    right,
                },
                Docs::Left(left) => Docs::Both { left, right: doc },
                Docs::Both { .. } | Docs::Held(_) => unreachable!("matched above"),
            };
            grown
        }
    };
    entry.set_heap(entry.heap().saturating_add_signed(grown));
    Ok(())
}

/// Puts `doc` in the place of `right`; returns the change of the estimate.
fn replace(right: &mut Doc, doc: Doc) -> isize {
    let grown = doc.heap_size() as isize - right.heap_size() as isize;
    *right = doc;
    grown
}

/// Adds `doc` to a non-associative binding's documents without reducing it.
fn hold(entry: &mut Entry, side: Side, doc: Doc) -> Result<(), InsertError> {
    let mut grown = (doc.heap_size() + size_of::<Doc>()) as isize;
    let held = match std::mem::replace(&mut entry.docs, Docs::Right(Doc::Null)) {
        Docs::Right(right) => Held {
            left: None,
            rights: vec![right],
        },
        Docs::Left(left) => Held {
            left: Some(*left),
            rights: Vec::new(),
        },
        Docs::Both { left, right } => Held {
            left: Some(*left),
            rights: vec![right],
        },
        Docs::Held(held) => *held,
    };
    let mut held = Box::new(held);
    let result = match side {
        Side::Left if held.left.is_some() => Err(InsertError::DuplicateLoad),
        Side::Left => {
            held.left = Some(doc);
            Ok(())
        }
        Side::Right => {
            held.rights.push(doc);
            Ok(())
        }
        Side::Reset => {
            for dropped in held.rights.drain(..) {
                grown -= (dropped.heap_size() + size_of::<Doc>()) as isize;
            }
            held.rights.push(doc);
            Ok(())
        }
    };
    if side == Side::Reset {
        entry.set_resets();
    }
    entry.docs = Docs::Held(held);
    entry.set_heap(entry.heap().saturating_add_signed(grown));
    result
}

const _: () = assert!(size_of::<Entry>() == 64, "an entry is one cache line");

/// Bytes of the packed key an entry keeps inline ([`Entry::prefix`]).
const PREFIX_LEN: usize = size_of::<[u64; 2]>();

/// The drained table: records in table-key order, taken out of the entries one by one.
pub(super) struct SortedTable {
    table: MemTable,
    order: std::vec::IntoIter<usize>,
    /// The rest of the entry whose first record was just returned, last first.
    pending: Vec<Record>,
}

impl SortedTable {
    pub(super) fn next_record(&mut self) -> Option<Record> {
        if let Some(record) = self.pending.pop() {
            return Some(record);
        }
        let entry = &mut self.table.entries[self.order.next()?];
        let key = entry.key(&self.table.keys).to_vec();
        let docs = std::mem::replace(&mut entry.docs, Docs::Right(Doc::Null));
        let right = entry.right_side(0);
        Some(match docs {
            Docs::Right(doc) => Record {
                key,
                side: right,
                doc,
            },
            Docs::Left(left) => Record {
                key,
                side: Side::Left,
                doc: *left,
            },
            Docs::Both { left, right: doc } => {
                self.pending.push(Record {
                    key: key.clone(),
                    side: right,
                    doc,
                });
                Record {
                    key,
                    side: Side::Left,
                    doc: *left,
                }
            }
            Docs::Held(held) => {
                let Held { left, rights } = *held;
                let record = |side, doc| Record {
                    key: key.clone(),
                    side,
                    doc,
                };
                let mut all: Vec<Record> = (left.map(|doc| record(Side::Left, doc)).into_iter())
                    .chain(
                        (rights.into_iter().enumerate())
                            .map(|(i, doc)| record(if i == 0 { right } else { Side::Right }, doc)),
                    )
                    .collect();
                all.reverse();
                self.pending = all;
                self.pending.pop()?
            }
        })
    }
}
