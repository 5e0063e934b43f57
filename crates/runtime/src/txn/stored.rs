//! The documents the last committed transaction stored, so that the next one can reduce
//! onto them without a Load.
//!
//! ```text
//!  T:   C2 drain ──▶ Store (serialized) ──▶ StoredDocs { (binding, key) → doc }  (sorted)
//!                                              │ kept once T is DriverCommitted
//!  T+1: C1 drain (key order) ──merge-join──────┘
//!         hit  ─▶ the doc goes left into C2, no Load        (null: known deleted)
//!         miss ─▶ Load, as before
//! ```
//!
//! Why it is exact: the shard is the store's only writer (every other instance is fenced
//! off), and a driver's Load returns the document last stored for a key. So once T is
//! committed, the document T stored for a key *is* what a Load of it in T+1 would return.
//! A reduced view whose keys recur in every transaction then costs no Load at all, in
//! the common case of a hot key set.
//!
//! Invariants:
//! - Only documents of a committed transaction are used: the loop keeps what
//!   `send_stores` (`phases.rs`) collected only after DriverCommitted,
//!   and a failed stream drops it with the loop (a restart starts empty).
//! - Entries are in (binding, packed key) order, the order both combiners drain in, so a
//!   lookup is a forward merge-join, never a search.
//! - The documents are kept only when the combiner they were drained from stayed within
//!   its memory budget (it never spilled): they then take the memory that combiner held,
//!   and it is freed as the next transaction's Loads consume them. Otherwise the next
//!   transaction loads every key, as without this module.

use sluice_doc::compact::Doc;

pub(super) struct StoredDocs {
    /// Ascending (binding, packed key).
    docs: std::vec::IntoIter<(u32, Vec<u8>, Doc)>,
    /// The next entry not yet passed by the merge-join.
    head: Option<(u32, Vec<u8>, Doc)>,
}

impl StoredDocs {
    pub(super) fn empty() -> StoredDocs {
        StoredDocs {
            docs: Vec::new().into_iter(),
            head: None,
        }
    }

    /// The stored document of `(binding, key)`, if the last transaction stored it
    /// (`Some(Doc::Null)`: it deleted it). Keys must be asked in ascending order.
    pub(super) fn take(&mut self, binding: u32, key: &[u8]) -> Option<Doc> {
        loop {
            let (b, k, _) = self.head.as_ref()?;
            match (*b, k.as_slice()).cmp(&(binding, key)) {
                std::cmp::Ordering::Less => self.head = self.docs.next(),
                std::cmp::Ordering::Equal => {
                    let (_, _, doc) = self.head.take()?;
                    self.head = self.docs.next();
                    return Some(doc);
                }
                std::cmp::Ordering::Greater => return None,
            }
        }
    }
}

/// Collects the documents of one transaction's stores, in store order (see the module
/// docs for when it keeps none).
pub(super) struct StoredDocsBuilder {
    docs: Vec<(u32, Vec<u8>, Doc)>,
    keep: bool,
}

impl StoredDocsBuilder {
    pub(super) fn new(keep: bool) -> StoredDocsBuilder {
        StoredDocsBuilder {
            docs: Vec::new(),
            keep,
        }
    }

    /// Keeps `doc`, stored for `(binding, key)` after every key kept so far.
    pub(super) fn push(&mut self, binding: u32, key: Vec<u8>, doc: Doc) {
        if self.keep {
            self.docs.push((binding, key, doc));
        }
    }

    pub(super) fn finish(self) -> StoredDocs {
        let mut docs = self.docs.into_iter();
        StoredDocs {
            head: docs.next(),
            docs,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn built(entries: &[(u32, &[u8], u64)], keep: bool) -> StoredDocs {
        let mut builder = StoredDocsBuilder::new(keep);
        for &(binding, key, n) in entries {
            builder.push(binding, key.to_vec(), Doc::PosInt(n));
        }
        builder.finish()
    }

    #[test]
    fn ascending_lookups_find_exactly_the_stored_keys() {
        let mut stored = built(&[(0, b"b", 1), (0, b"d", 2), (1, b"a", 3)], true);
        assert_eq!(stored.take(0, b"a"), None);
        assert_eq!(stored.take(0, b"b"), Some(Doc::PosInt(1)));
        assert_eq!(stored.take(0, b"c"), None);
        // Same key in another binding is another entry.
        assert_eq!(stored.take(1, b"a"), Some(Doc::PosInt(3)));
        assert_eq!(stored.take(1, b"b"), None);
    }

    #[test]
    fn a_builder_told_not_to_keep_yields_nothing_so_every_key_is_loaded() {
        let mut stored = built(&[(0, b"a", 1), (0, b"b", 2)], false);
        assert_eq!(stored.take(0, b"a"), None);
        assert_eq!(stored.take(0, b"b"), None);
    }
}
