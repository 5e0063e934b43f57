//! One key's change in a transaction: the document before, the document after, and
//! what happened to it.

use serde_json::Value;

/// What a transaction did to a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// The key was absent and now has a document.
    Insert,
    /// The key's document was replaced.
    Update,
    /// The key's document was removed.
    Delete,
    /// The key's document, as a snapshot batch reads it (not a change).
    Read,
}

impl Op {
    /// The operation between `before` and `after` (`None`: absent). A change from
    /// absent to absent is no change at all (a deletion of a key never stored).
    pub fn between(before: Option<&Value>, after: Option<&Value>) -> Option<Op> {
        match (before, after) {
            (None, Some(_)) => Some(Op::Insert),
            (Some(_), Some(_)) => Some(Op::Update),
            (Some(_), None) => Some(Op::Delete),
            (None, None) => None,
        }
    }

    /// Debezium's letter: `c`, `u`, `d`, `r`.
    pub fn debezium(self) -> &'static str {
        match self {
            Op::Insert => "c",
            Op::Update => "u",
            Op::Delete => "d",
            Op::Read => "r",
        }
    }
}

/// A key's change in transaction `txn`.
#[derive(Debug, Clone, Copy)]
pub struct Change<'a> {
    pub txn: u64,
    pub op: Op,
    /// The document before the transaction (`None` for an insert or a snapshot read).
    pub before: Option<&'a Value>,
    /// The document after it (`None` for a delete).
    pub after: Option<&'a Value>,
}

impl Change<'_> {
    /// The document that names the key: after, else before.
    pub fn current(&self) -> &Value {
        self.after
            .or(self.before)
            .expect("a change has a document before or after")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_operation_follows_from_before_and_after() {
        let doc = json!({"k": 1});
        assert_eq!(Op::between(None, Some(&doc)), Some(Op::Insert));
        assert_eq!(Op::between(Some(&doc), Some(&doc)), Some(Op::Update));
        assert_eq!(Op::between(Some(&doc), None), Some(Op::Delete));
        assert_eq!(Op::between(None, None), None);
    }
}
