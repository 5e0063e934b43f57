//! Building and reading arena messages: one bytes buffer plus slices into it.
//!
//! Batching many keys or documents into one arena per message is what makes the
//! protocol fast (one allocation and one frame for thousands of items). The builders
//! here pack items per binding and cut a new message once the next item would push the
//! current one past [`MAX_MESSAGE_BYTES`]; an item larger than the bound on its own gets
//! a message of its own (it cannot be split), so a message exceeds the bound only when
//! it holds exactly one item.
//!
//! Readers ([`load_keys`], [`store_docs`], [`loaded_docs`]) check every slice against
//! its arena and fail with [`Error::Malformed`] naming the slice, never panic.

use crate::{Error, Result};
use sluice_proto::flow::Slice;
use sluice_proto::materialize::{
    transaction_request::{Load, Store},
    transaction_response::Loaded,
};
use std::collections::BTreeMap;

/// Upper bound on the size of one built message (arena plus slice overhead), unless a
/// single item is larger.
///
/// 4 MiB: large enough that per-message costs (a channel hop, a frame header, a gRPC
/// message, a wake-up of the peer) vanish against the per-byte costs, even for
/// documents of a few KiB; small enough to keep the memory in flight bounded (a channel
/// of 8 such messages holds 32 MiB) and to let the peer start on one message while the
/// next is built. Transports must accept somewhat more than this (a lone oversized
/// document makes a bigger message), so they set their own frame limits well above it.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;

/// Encoded size of one `Slice` inside a message: field tag, length, two varints.
const SLICE_OVERHEAD: usize = 12;

/// The bytes of `slice` within `arena`; an out-of-range slice is an error naming it.
pub fn slice<'a>(arena: &'a [u8], slice: &Slice) -> Result<&'a [u8]> {
    arena
        .get(slice.begin as usize..slice.end as usize)
        .ok_or_else(|| {
            Error::Malformed(format!(
                "slice [{}, {}) is outside an arena of {} bytes",
                slice.begin,
                slice.end,
                arena.len()
            ))
        })
}

/// One document of a Store message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreDoc<'a> {
    pub key: &'a [u8],
    pub values: &'a [u8],
    pub doc: &'a [u8],
    pub exists: bool,
}

impl<'a> StoreDoc<'a> {
    /// The document as JSON text, checked: a document of binding `binding` that is not
    /// UTF-8 JSON is a malformed Store (a bug of the peer that sent it).
    pub fn json(&self, binding: u32) -> Result<&'a str> {
        std::str::from_utf8(self.doc)
            .ok()
            .filter(|t| serde_json::from_str::<serde::de::IgnoredAny>(t).is_ok())
            .ok_or_else(|| {
                Error::Malformed(format!(
                    "Store of binding {binding}: a document is not JSON"
                ))
            })
    }
}

/// The packed keys of a Load.
pub fn load_keys(load: &Load) -> impl Iterator<Item = Result<&[u8]>> {
    load.packed_keys.iter().map(|s| slice(&load.arena, s))
}

/// The documents of a Store. Keys, values, documents and `exists` must be equally many;
/// otherwise the first item yielded is the error.
pub fn store_docs(store: &Store) -> impl Iterator<Item = Result<StoreDoc<'_>>> {
    let n = store.packed_keys.len();
    let lengths = [
        store.packed_values.len(),
        store.docs_json.len(),
        store.exists.len(),
    ];
    let mismatch = lengths.iter().any(|&l| l != n).then(|| {
        Err(Error::Malformed(format!(
            "Store of binding {} has {n} keys, {} values, {} documents and {} exists flags",
            store.binding, lengths[0], lengths[1], lengths[2]
        )))
    });
    let docs = (0..n).map(move |i| {
        Ok(StoreDoc {
            key: slice(&store.arena, &store.packed_keys[i])?,
            values: slice(&store.arena, &store.packed_values[i])?,
            doc: slice(&store.arena, &store.docs_json[i])?,
            exists: store.exists[i],
        })
    });
    // On a mismatch, yield only the error.
    let docs = mismatch.is_none().then_some(docs).into_iter().flatten();
    mismatch.into_iter().chain(docs)
}

/// The documents of a Loaded.
pub fn loaded_docs(loaded: &Loaded) -> impl Iterator<Item = Result<&[u8]>> {
    loaded.docs_json.iter().map(|s| slice(&loaded.arena, s))
}

/// An empty vector with room for a quarter more items than `like` holds (none without
/// one): messages of one binding hold about as many items each.
fn reserved<T>(like: Option<&Vec<T>>) -> Vec<T> {
    Vec::with_capacity(like.map_or(0, |v| v.len() + v.len() / 4))
}

/// An empty arena, with room for a full message when one came before: a message is cut
/// before its arena passes [`MAX_MESSAGE_BYTES`], so it then never grows.
fn reserved_arena(after_full: bool) -> Vec<u8> {
    Vec::with_capacity(if after_full { MAX_MESSAGE_BYTES } else { 0 })
}

/// Appends `bytes` to `arena`, returning its slice.
fn append(arena: &mut Vec<u8>, bytes: &[u8]) -> Slice {
    let begin = arena.len();
    arena.extend_from_slice(bytes);
    Slice {
        begin: begin as u32,
        end: arena.len() as u32,
    }
}

/// The cut-at-a-bound logic shared by the three builders: one message in progress per
/// binding, and the finished messages in the order they were cut.
///
/// A message that follows a full one of its binding starts with room for a full one
/// (`new(binding, Some(full))`): a long run of messages then allocates each arena once,
/// instead of growing it by doubling (a copy and fresh pages at every step, measured at
/// a tenth of a large store phase).
struct Batches<M> {
    open: BTreeMap<u32, (M, usize)>,
    ready: Vec<M>,
    new: fn(u32, Option<&M>) -> M,
}

impl<M> Batches<M> {
    fn new(new: fn(u32, Option<&M>) -> M) -> Self {
        Batches {
            open: BTreeMap::new(),
            ready: Vec::new(),
            new,
        }
    }

    /// The message of `binding` to add an item of `size` bytes to, after cutting the
    /// current one if the item would push it past the bound.
    fn message_for(&mut self, binding: u32, size: usize) -> &mut M {
        let full =
            (self.open.get(&binding)).is_some_and(|(_, used)| used + size > MAX_MESSAGE_BYTES);
        if full && let Some((message, _)) = self.open.remove(&binding) {
            let next = (self.new)(binding, Some(&message));
            self.ready.push(message);
            self.open.insert(binding, (next, 0));
        }
        let (msg, used) = self
            .open
            .entry(binding)
            .or_insert_with(|| ((self.new)(binding, None), 0));
        *used += size;
        msg
    }

    /// Messages that are full and will not grow any more.
    fn take_ready(&mut self) -> Vec<M> {
        std::mem::take(&mut self.ready)
    }

    /// Every message, full or not; the builder is empty afterwards.
    fn finish(&mut self) -> Vec<M> {
        let mut all = self.take_ready();
        all.extend(std::mem::take(&mut self.open).into_values().map(|(m, _)| m));
        all
    }
}

macro_rules! builder_common {
    ($name:ident, $msg:ty) => {
        impl Default for $name {
            fn default() -> Self {
                Self::new()
            }
        }

        impl $name {
            /// Messages that are full and will not grow any more.
            pub fn take_ready(&mut self) -> Vec<$msg> {
                self.0.take_ready()
            }

            /// Every message, full or not; the builder is empty afterwards.
            pub fn finish(&mut self) -> Vec<$msg> {
                self.0.finish()
            }
        }
    };
}

/// Packs keys to load into Load messages of bounded size.
pub struct LoadBuilder(Batches<Load>);
builder_common!(LoadBuilder, Load);

impl LoadBuilder {
    pub fn new() -> Self {
        LoadBuilder(Batches::new(|binding, like| Load {
            binding,
            arena: reserved_arena(like.is_some()),
            packed_keys: reserved(like.map(|m| &m.packed_keys)),
        }))
    }

    pub fn push(&mut self, binding: u32, packed_key: &[u8]) {
        let m = self
            .0
            .message_for(binding, packed_key.len() + SLICE_OVERHEAD);
        let s = append(&mut m.arena, packed_key);
        m.packed_keys.push(s);
    }
}

/// Packs documents to store into Store messages of bounded size.
pub struct StoreBuilder(Batches<Store>);
builder_common!(StoreBuilder, Store);

impl StoreBuilder {
    pub fn new() -> Self {
        StoreBuilder(Batches::new(|binding, like| Store {
            binding,
            arena: reserved_arena(like.is_some()),
            packed_keys: reserved(like.map(|m| &m.packed_keys)),
            packed_values: reserved(like.map(|m| &m.packed_values)),
            docs_json: reserved(like.map(|m| &m.docs_json)),
            exists: reserved(like.map(|m| &m.exists)),
        }))
    }

    pub fn push(&mut self, binding: u32, doc: StoreDoc<'_>) {
        let size = doc.key.len() + doc.values.len() + doc.doc.len() + 3 * SLICE_OVERHEAD + 1;
        let m = self.0.message_for(binding, size);
        let key = append(&mut m.arena, doc.key);
        let values = append(&mut m.arena, doc.values);
        let json = append(&mut m.arena, doc.doc);
        m.packed_keys.push(key);
        m.packed_values.push(values);
        m.docs_json.push(json);
        m.exists.push(doc.exists);
    }
}

/// Packs found documents into Loaded messages of bounded size. The serve loop hands it
/// to [`crate::Transactor::load`] as the [`crate::LoadedSink`].
pub struct LoadedBuilder(Batches<Loaded>);
builder_common!(LoadedBuilder, Loaded);

impl LoadedBuilder {
    pub fn new() -> Self {
        LoadedBuilder(Batches::new(|binding, like| Loaded {
            binding,
            arena: reserved_arena(like.is_some()),
            docs_json: reserved(like.map(|m| &m.docs_json)),
        }))
    }
}

/// On its own (tests, a transactor driven by hand), the builder keeps every message
/// for [`LoadedBuilder::take_ready`]: it has nowhere to send them.
#[async_trait::async_trait]
impl crate::LoadedSink for LoadedBuilder {
    fn push(&mut self, binding: u32, doc_json: &[u8]) {
        let m = self.0.message_for(binding, doc_json.len() + SLICE_OVERHEAD);
        let s = append(&mut m.arena, doc_json);
        m.docs_json.push(s);
    }

    async fn send_full(&mut self) -> Result<()> {
        Ok(())
    }
}
