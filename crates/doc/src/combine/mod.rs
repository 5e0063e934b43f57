//! The memory-bounded combiner: reduces documents by (binding, packed key) and drains each
//! key once, fully combined, in (binding, packed key) order.
//!
//! ```text
//!  combine_right_json ─parse─┐
//!  combine_right ─compact────┼
//!  combine_right_doc ────────┴validate─▶ pack key ─┐
//!  combine_right_keyed ────────────────────────────┼─▶ MemTable ──over budget──▶ sort ─▶ spill run ─┐
//!  reduce_left (loaded doc) ───────────────────────┘     │              (one temp file) │
//!                                                        └──── drain: k-way merge ◀─────┘
//! ```
//!
//! - [`memtable`]: a hash table from the *table key* (binding as 4 big-endian bytes, then
//!   the packed key, so byte order is (binding, key) order) to that key's documents, kept
//!   compact ([`crate::compact::Doc`]), with an estimate of its memory.
//! - [`spill`]: the run format (sorted, length-prefixed records in one temporary file)
//!   and buffered positional readers, one per run.
//! - [`drain`]: the merge of all runs and the in-memory table.
//!
//! Invariants:
//! - A key's *loaded* ("left", "full") document is kept apart from its *new* ("right")
//!   documents until the drain, in memory and in runs alike. The drained document is
//!   `loaded ⊕ r1 ⊕ r2 ⊕ …` with the new documents in arrival order, whenever the loaded
//!   document arrived and however the spills fell: a run spilled before the load holds
//!   earlier right documents that must still go to the loaded document's right.
//! - New documents of one key reduce in arrival order: within the table as they come,
//!   across runs in spill order (an earlier run is further left, the table is last).
//!   Reductions are associative, so reducing per run and then across runs equals
//!   reducing all in order.
//! - At most one loaded document per key per drain; a second one is an error.
//! - In a binding with `deletions` (a standard materialization), a deletion (a document
//!   whose `/_meta/op` is `"d"`, [`Doc::is_deletion`]) starts its key over: the new
//!   documents before it are dropped, the documents after it reduce from nothing, and
//!   the loaded document no longer counts (the drain keeps only that the key was
//!   loaded, `full`, so that a store replaces or deletes its row). Such a run of
//!   documents is a *reset* one: it is marked so in the table, in spilled runs and in
//!   what a partial drain hands to the next combiner ([`Drained::resets`]), so a reset
//!   in any grouping drops what lies left of it. A deletion is not validated against
//!   the schema in any binding: it needs only its key (and `_meta`). In a binding
//!   without `deletions` (delta updates) it is then a document like any other.
//! - A binding whose schema has an `associative: false` location never combines its new
//!   documents with each other (Flow holds them back likewise): they are kept apart, in
//!   order, and either reduce in order onto the key's left-most document in a full drain,
//!   or drain one by one (a partial drain: into the next combiner, or delta updates).
//! - The estimate of memory counts the table's containers by capacity plus an estimate
//!   of each document's heap (see [`Doc::heap_size`]); above
//!   [`CombinerOptions::memory_budget`] the whole table is spilled as one sorted run.
//!   The drain holds the table plus one record and one buffer per run.
//! - A reduction error may leave a key's document half-reduced, and a spill error comes
//!   after the document joined the table and may leave a run half-written, so both
//!   poison the combiner: every later call fails and nothing can be drained (the
//!   transaction that saw it must not commit). Validation and key errors reject the
//!   document before it touches the table and do not poison.

mod drain;
mod memtable;
mod spill;

pub use drain::Drainer;

use crate::compact::Doc;
use crate::hash::KeyRange;
use crate::parse::DocParser;
use crate::reduce::ReduceError;
use crate::schema::{Schema, ValidationError};
use crate::tuple::{self, KeyError, KeyExtractor};
use memtable::MemTable;
use serde_json::Value;
use spill::SpillFile;
use std::path::PathBuf;
use std::sync::Arc;

/// One fully combined document, drained in (binding, packed key) order. The document
/// stays compact: it moves into another combiner as it is, and stores serialize it
/// directly (`serde_json::to_writer`), query it ([`crate::Pointer::query_doc`]) and pack
/// it ([`crate::tuple::pack_doc`]) without building a `Value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Drained {
    pub binding: u32,
    pub key: Vec<u8>,
    pub doc: Doc,
    /// Combined from a loaded full document ("left"), not only from new ones.
    pub full: bool,
    /// The full reduction deleted the document (a deletion was its last document, or
    /// its root reduced to a value a `delete: true` annotation applies to); `doc` is
    /// then `null`.
    pub deleted: bool,
    /// The key's documents start from a deletion: whatever lies left of them (a loaded
    /// document, earlier documents) does not count. Set by partial drains only; a full
    /// drain has applied it.
    pub resets: bool,
}

/// What the combiner needs to know about one binding's collection.
pub struct BindingSpec {
    pub schema: Arc<Schema>,
    pub key: KeyExtractor,
    /// The collection name, for errors.
    pub name: String,
    /// Drain each key as a full reduction: the key's left-most document (loaded, else
    /// its first new one) is a whole document, so set removals are applied and dropped
    /// and deletions apply ([`crate::Reducer::finish`]). Off: a partial reduction, which
    /// keeps tombstones (delta updates, or a combiner whose output is combined again).
    pub full: bool,
    /// A deletion document (`/_meta/op` = `"d"`) starts its key over (a standard
    /// materialization; see the module docs). Off (delta updates): it is a document
    /// like any other.
    pub deletions: bool,
}

/// Tuning of a [`Combiner`].
#[derive(Debug, Clone)]
pub struct CombinerOptions {
    /// Estimated bytes the in-memory table may hold before it spills to disk.
    pub memory_budget: usize,
    /// Where the spill file goes; `None` means `std::env::temp_dir()`.
    pub spill_dir: Option<PathBuf>,
    /// The shard's key range: a loaded document of another key is an error (the caller
    /// routes new documents to their shard's combiner).
    pub key_range: KeyRange,
}

/// 256 MiB: a table of ~430 000 small documents (a 150-byte document kept compact is
/// estimated at about 600 bytes with its entry and key), large enough that typical
/// transactions never spill, small enough for several shards to share a machine.
pub const DEFAULT_MEMORY_BUDGET: usize = 256 << 20;

impl Default for CombinerOptions {
    fn default() -> Self {
        CombinerOptions {
            memory_budget: DEFAULT_MEMORY_BUDGET,
            spill_dir: None,
            key_range: KeyRange::ALL,
        }
    }
}

/// A snapshot of where the combiner's documents are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CombinerStats {
    /// Keys currently in the in-memory table.
    pub entries: usize,
    /// Estimated bytes of the in-memory table (what is compared with the budget).
    pub memory_bytes: usize,
    /// Sorted runs written to the spill file so far.
    pub spilled_runs: usize,
    /// Bytes written to the spill file so far.
    pub spilled_bytes: u64,
}

/// Why a document could not be combined or drained. Every variant about a document names
/// its collection and, where one exists, its key as JSON.
#[derive(Debug, thiserror::Error)]
pub enum CombineError {
    /// A caller bug: the binding index is out of range.
    #[error("binding {binding} does not exist (the combiner has {count} bindings)")]
    UnknownBinding { binding: u32, count: usize },
    /// User input: the document is not JSON text.
    #[error("collection {collection}: document is not valid JSON: {source}")]
    Parse {
        collection: String,
        source: serde_json::Error,
    },
    /// User input: the document does not match its collection's schema.
    #[error("collection {collection}: document with key {key} is invalid: {source}")]
    Invalid {
        collection: String,
        key: String,
        source: ValidationError,
    },
    /// User input: the document's key cannot be extracted.
    #[error("collection {collection}: {source}")]
    Key {
        collection: String,
        source: KeyError,
    },
    /// A driver bug: a loaded document's key is outside the shard's key range.
    #[error(
        "collection {collection}: loaded key {key} hashes outside the shard's key range {range}"
    )]
    OutsideRange {
        collection: String,
        key: String,
        range: KeyRange,
    },
    /// User input: two documents of one key cannot be reduced (e.g. `sum` over a string).
    #[error("collection {collection}: key {key}: {source}")]
    Reduce {
        collection: String,
        key: String,
        source: ReduceError,
    },
    /// A caller bug: a key received a second loaded document within one drain.
    #[error(
        "collection {collection}: key {key} received a second loaded document \
         (at most one per key per drain)"
    )]
    DuplicateLoad { collection: String, key: String },
    /// The disk: the spill file could not be created, written or read. A retry may help
    /// once space is freed.
    #[error("spill file in {dir}: {source}")]
    Spill {
        dir: PathBuf,
        source: std::io::Error,
    },
    /// An internal bug or a disk fault: a spilled record does not decode.
    #[error("spill file is corrupt at offset {offset}: {reason}")]
    CorruptSpill { offset: u64, reason: String },
    /// An earlier reduction failed part-way; this combiner's contents are unusable.
    #[error("the combiner is unusable after an earlier error: {first}")]
    Poisoned { first: String },
}

/// The key of a packed tuple as JSON text, for errors (hex if it does not unpack).
pub(crate) fn describe_key(packed: &[u8]) -> String {
    match tuple::unpack(packed) {
        Ok(values) => Value::Array(values).to_string(),
        Err(_) => crate::hex::encode(packed),
    }
}

/// Reduces documents by (binding, packed key) under a memory budget. See the module docs.
pub struct Combiner {
    bindings: Arc<[BindingSpec]>,
    opts: CombinerOptions,
    table: MemTable,
    spill: Option<SpillFile>,
    /// Reused for every table key: binding (4 bytes, big-endian) then the packed key.
    scratch: Vec<u8>,
    /// Parse [`Combiner::combine_right_json`]'s text, keeping their buffers: one per
    /// binding, so each learns the shapes of its own collection's documents.
    parsers: Vec<DocParser>,
    poisoned: Option<String>,
}

impl Combiner {
    pub fn new(bindings: Vec<BindingSpec>, opts: CombinerOptions) -> Self {
        Combiner {
            parsers: bindings.iter().map(|_| DocParser::default()).collect(),
            bindings: bindings.into(),
            opts,
            table: MemTable::default(),
            spill: None,
            scratch: Vec::with_capacity(64),
            poisoned: None,
        }
    }

    /// A new document: validates it against the binding's schema, extracts its packed key
    /// and reduces it into that key's documents (arrival order). The `Value` is made
    /// compact first (its strings move), then takes [`Combiner::combine_right_doc`]'s path.
    pub fn combine_right(&mut self, binding: u32, doc: Value) -> Result<(), CombineError> {
        self.combine_right_doc(binding, Doc::from(doc))
    }

    /// [`Combiner::combine_right`] of a document given as JSON text (e.g. one line of a
    /// source), parsed straight into its compact form ([`DocParser`]): no `Value` is
    /// built, and a document of a new key is kept as parsed.
    pub fn combine_right_json(&mut self, binding: u32, json: &[u8]) -> Result<(), CombineError> {
        self.check_poisoned()?;
        let spec = spec(&self.bindings, binding)?;
        // `spec` found the binding, so it has a parser.
        let doc = self.parsers[binding as usize]
            .parse(json)
            .map_err(|source| CombineError::Parse {
                collection: spec.name.clone(),
                source,
            })?;
        self.combine_right_doc(binding, doc)
    }

    /// [`Combiner::combine_right`] of a compact document: the one path every new
    /// document takes.
    pub fn combine_right_doc(&mut self, binding: u32, doc: Doc) -> Result<(), CombineError> {
        self.check_poisoned()?;
        let deletion = doc.is_deletion();
        self.key_and_validate(binding, &doc, deletion)?;
        let side = if deletion && self.bindings[binding as usize].deletions {
            Side::Reset
        } else {
            Side::Right
        };
        self.insert(binding, side, doc)
    }

    /// Packs `doc`'s table key into `scratch` and validates it against its binding's
    /// schema (a deletion needs only its key, in every binding, so a text one binding of
    /// a collection accepts all accept).
    fn key_and_validate(
        &mut self,
        binding: u32,
        doc: &Doc,
        deletion: bool,
    ) -> Result<(), CombineError> {
        let spec = spec(&self.bindings, binding)?;
        self.scratch.clear();
        self.scratch.extend_from_slice(&binding.to_be_bytes());
        let keyed = spec.key.pack_doc(doc, &mut self.scratch);
        if !deletion && let Err(source) = spec.schema.validate_doc(doc) {
            return Err(CombineError::Invalid {
                collection: spec.name.clone(),
                key: match keyed {
                    Ok(()) => describe_key(&self.scratch[4..]),
                    Err(_) => "(none)".to_string(),
                },
                source,
            });
        }
        keyed.map_err(|source| CombineError::Key {
            collection: spec.name.clone(),
            source,
        })
    }

    /// Like [`Combiner::combine_right`] for a document that was already validated and
    /// whose packed key the caller has: a drained document moving on to the next
    /// combiner as it is, with its [`Drained::resets`].
    pub fn combine_right_keyed(
        &mut self,
        binding: u32,
        key: &[u8],
        doc: Doc,
        resets: bool,
    ) -> Result<(), CombineError> {
        self.check_poisoned()?;
        self.set_scratch(binding, key)?;
        let side = if resets && self.bindings[binding as usize].deletions {
            Side::Reset
        } else {
            Side::Right
        };
        self.insert(binding, side, doc)
    }

    /// A full document loaded from the store: it goes to the left of everything combined
    /// for that key, whenever it arrives. At most one per key per drain. Parse it straight
    /// into a [`Doc`] with a [`DocParser`].
    pub fn reduce_left(&mut self, binding: u32, key: &[u8], doc: Doc) -> Result<(), CombineError> {
        self.check_poisoned()?;
        if !self.opts.key_range.owns(key) {
            return Err(CombineError::OutsideRange {
                collection: spec(&self.bindings, binding)?.name.clone(),
                key: describe_key(key),
                range: self.opts.key_range,
            });
        }
        self.set_scratch(binding, key)?;
        self.insert(binding, Side::Left, doc)
    }

    /// Makes room in memory for `keys` more keys: a combiner about to take a drain of
    /// known size (its keys' count in [`CombinerStats::entries`]) then fills without
    /// growing step by step. Room counts towards the memory budget.
    pub fn reserve(&mut self, keys: usize) {
        self.table.reserve(keys);
    }

    pub fn is_empty(&self) -> bool {
        self.table.is_empty() && self.spill.as_ref().is_none_or(|s| s.runs().is_empty())
    }

    pub fn stats(&self) -> CombinerStats {
        CombinerStats {
            entries: self.table.len(),
            memory_bytes: self.table.memory_bytes(),
            spilled_runs: self.spill.as_ref().map_or(0, |s| s.runs().len()),
            spilled_bytes: self.spill.as_ref().map_or(0, SpillFile::len),
        }
    }

    /// Drains every (binding, key) once, in (binding, packed key) order, fully combined.
    /// Reduction errors surface from the iterator, which then ends.
    pub fn drain(self) -> Result<Drainer, CombineError> {
        self.check_poisoned()?;
        Drainer::new(self.bindings, self.table, self.spill)
    }

    fn check_poisoned(&self) -> Result<(), CombineError> {
        match &self.poisoned {
            Some(first) => Err(CombineError::Poisoned {
                first: first.clone(),
            }),
            None => Ok(()),
        }
    }

    fn set_scratch(&mut self, binding: u32, key: &[u8]) -> Result<(), CombineError> {
        spec(&self.bindings, binding)?;
        self.scratch.clear();
        self.scratch.extend_from_slice(&binding.to_be_bytes());
        self.scratch.extend_from_slice(key);
        Ok(())
    }

    /// Reduces `doc` into the table under the key in `scratch`, then spills if over budget.
    fn insert(&mut self, binding: u32, side: Side, doc: Doc) -> Result<(), CombineError> {
        let spec = &self.bindings[binding as usize];
        let reducer = spec.schema.reducer();
        if let Err(err) = self.table.insert(&self.scratch, side, doc, reducer) {
            let err = err.into_combine_error(&spec.name, &self.scratch[4..]);
            if matches!(err, CombineError::Reduce { .. }) {
                self.poisoned = Some(err.to_string());
            }
            return Err(err);
        }
        if (self.table.memory_bytes() > self.opts.memory_budget || self.table.keys_full())
            && let Err(err) = self.spill_table()
        {
            // The document is already in the table and a run may be half-written.
            self.poisoned = Some(err.to_string());
            return Err(err);
        }
        Ok(())
    }

    fn spill_table(&mut self) -> Result<(), CombineError> {
        let spill = match &mut self.spill {
            Some(spill) => spill,
            None => {
                let dir = self
                    .opts
                    .spill_dir
                    .clone()
                    .unwrap_or_else(std::env::temp_dir);
                self.spill.insert(SpillFile::create(dir)?)
            }
        };
        spill.write_run(self.table.sorted_docs())?;
        self.table.clear();
        Ok(())
    }
}

fn spec(bindings: &[BindingSpec], binding: u32) -> Result<&BindingSpec, CombineError> {
    bindings
        .get(binding as usize)
        .ok_or(CombineError::UnknownBinding {
            binding,
            count: bindings.len(),
        })
}

/// One document of a key as the drain sees it: from a spilled run or from the table.
struct Record {
    /// The table key: binding (4 bytes, big-endian) then the packed key.
    key: Vec<u8>,
    side: Side,
    doc: Doc,
}

/// Which side of a key's reduction a document joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    /// Loaded from the store ("full"): left of everything else.
    Left,
    /// New: right of everything before it.
    Right,
    /// New, and starting the key over (a deletion, or documents that began with one):
    /// the new documents before it are dropped, and the loaded one no longer counts.
    Reset,
}

impl Side {
    /// The side byte of a spilled record.
    fn to_byte(self) -> u8 {
        match self {
            Side::Right => 0,
            Side::Left => 1,
            Side::Reset => 2,
        }
    }

    fn from_byte(byte: u8) -> Option<Side> {
        match byte {
            0 => Some(Side::Right),
            1 => Some(Side::Left),
            2 => Some(Side::Reset),
            _ => None,
        }
    }
}
