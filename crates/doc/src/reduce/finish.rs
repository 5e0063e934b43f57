//! The finish of a full reduction (see [`super::Reducer::finish`]).
//!
//! ```text
//!  full result ──walk (only nodes that `finishes`)──▶ resolve the node against the value
//!     delete: true           ─▶ removed from its parent object or array (root: deleted)
//!     set                    ─▶ intersect/remove terms dropped
//! ```
//!
//! Deletion is decided on the reduced value: a location is deleted when the node its
//! value resolves to (its conditional subschemas tested against that value) says
//! `delete: true`. A partial reduction keeps such values, as tombstones, so that they
//! still delete when a later full reduction finishes. Subtrees without a deleting or set
//! node below them are not walked.

use super::{Cx, Strategy};
use crate::compact::Doc;

impl Cx<'_> {
    /// Finishes the value at node `n`; returns whether it is deleted.
    pub(crate) fn finish(&self, n: usize, doc: &mut Doc) -> bool {
        if !self.node(n).finishes {
            return false;
        }
        let node = self.node(self.resolve(n, doc));
        if node.delete {
            return true;
        }
        match doc {
            Doc::Object(fields) => {
                let is_set = matches!(node.strategy, Strategy::Set { .. });
                retain(fields, |_, field| {
                    let name = field.name.as_str();
                    if is_set && (name == "intersect" || name == "remove") {
                        return false;
                    }
                    !self.finish(node.property(name), &mut field.value)
                });
            }
            Doc::Array(items) => retain(items, |i, item| !self.finish(node.item(i), item)),
            _ => {}
        }
        false
    }
}

/// Keeps the elements for which `keep(original index, element)` holds, in order; no
/// allocation when all are kept.
fn retain<T>(items: &mut Box<[T]>, mut keep: impl FnMut(usize, &mut T) -> bool) {
    let mut dropped: Option<Vec<usize>> = None;
    for (i, item) in items.iter_mut().enumerate() {
        if !keep(i, item) {
            dropped.get_or_insert_default().push(i);
        }
    }
    let Some(dropped) = dropped else { return };
    let mut all = std::mem::take(items).into_vec();
    let mut index = 0;
    all.retain(|_| {
        index += 1;
        dropped.binary_search(&(index - 1)).is_err()
    });
    *items = all.into_boxed_slice();
}
