//! Building and reading arena messages (one bytes buffer + slices into it). (stub)

use sluice_proto::flow::Slice;
use sluice_proto::materialize::{
    transaction_request::{Load, Store},
    transaction_response::Loaded,
};

/// The bytes of `slice` within `arena`; an out-of-range slice is an error naming it.
pub fn slice<'a>(_arena: &'a [u8], _slice: &Slice) -> crate::Result<&'a [u8]> {
    todo!()
}

/// One document of a Store message.
pub struct StoreDoc<'a> {
    pub key: &'a [u8],
    pub values: &'a [u8],
    pub doc: &'a [u8],
    pub exists: bool,
}

pub fn load_keys(_load: &Load) -> impl Iterator<Item = crate::Result<&[u8]>> {
    std::iter::empty()
}
pub fn store_docs(_store: &Store) -> impl Iterator<Item = crate::Result<StoreDoc<'_>>> {
    std::iter::empty()
}
pub fn loaded_docs(_loaded: &Loaded) -> impl Iterator<Item = crate::Result<&[u8]>> {
    std::iter::empty()
}
