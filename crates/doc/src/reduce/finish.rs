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

/// Keeps the elements for which `keep(original index, element)` holds, in order, calling
/// it once per element. No allocation when all are kept (a boxed slice's vector has no
/// spare capacity to shed).
fn retain<T>(items: &mut Box<[T]>, mut keep: impl FnMut(usize, &mut T) -> bool) {
    let mut all = std::mem::take(items).into_vec();
    let mut index = 0;
    all.retain_mut(|item| {
        index += 1;
        keep(index - 1, item)
    });
    *items = all.into_boxed_slice();
}
