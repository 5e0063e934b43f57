//! What an output endpoint implements: Feldera's fault-tolerant `OutputEndpoint`, with
//! Sluice's transaction number as the step.
//!
//! ```text
//!  open ─▶ [ batch_start(txn, Delta | Snapshot) ─▶ push* ─▶ batch_end ] per transaction
//!             (any failure) ─▶ abort
//! ```
//!
//! An endpoint is fault tolerant: given a message it already wrote (the same
//! transaction and index, after a crash replayed the transaction), it discards it.
//! [`Tail`] is that decision for a destination that keeps its messages in order.

use crate::Result;
use crate::encode::{Buffer, Format, Message};
use crate::generation::Generation;
use async_trait::async_trait;
use serde_json::Value;

/// Whether a batch holds a transaction's changes or the whole view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchKind {
    Delta,
    Snapshot,
}

impl BatchKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BatchKind::Delta => "delta",
            BatchKind::Snapshot => "snapshot",
        }
    }
}

/// What one binding's endpoint is given.
#[derive(Debug, Clone)]
pub struct Target {
    pub materialization: String,
    /// The binding's resource, less the encoding keys (`{"topic": "views"}`).
    pub resource: Value,
    pub format: Format,
    /// What a file of the format starts with (a CSV header line).
    pub header: Option<Vec<u8>>,
    /// Written on everything the endpoint emits; a destination's tail of another
    /// generation is not this one's ([`Generation::owns`]).
    pub generation: Generation,
    /// A former holder of the shard may still be writing: the view is shared (in
    /// PostgreSQL), so another process, a cluster's member paused past its lease, may
    /// wake with part of a batch in hand. A destination then refuses every message that
    /// does not follow what it holds; with a local view the recovery log's lock rules
    /// out a second writer.
    pub former_writers: bool,
}

/// The last message a destination holds, as its transaction and index. A destination
/// that keeps one producer's messages in order holds every message up to its tail, and
/// none after. Only a message of the endpoint's own generation is its tail: after a
/// reset, the last message of the generation before is nothing of this one's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Tail {
    pub txn: u64,
    pub index: u64,
}

impl Tail {
    /// Whether a destination whose tail is `tail` (`None`: empty) holds `message`.
    pub fn holds(tail: Option<Tail>, message: &Message<'_>) -> bool {
        tail.is_some_and(|t| (message.txn, message.index) <= (t.txn, t.index))
    }
}

/// One binding's destination.
#[async_trait]
pub trait OutputEndpoint: Send {
    /// Connects, creating the destination if it is missing, and reads how far earlier
    /// instances of the same generation wrote (so that what they wrote is discarded
    /// when replayed).
    async fn open(&mut self) -> Result<()>;

    /// Connects and looks at the destination, creating and writing nothing: what Apply
    /// says of it ("topic t exists, 3 partitions"; "stream s is created at the first
    /// run"), so that `sluice check` and `apply` reach every destination. Nothing to
    /// reach: empty (the default).
    async fn probe(&mut self) -> Result<String> {
        Ok(String::new())
    }

    /// Bytes of encoded messages the driver buffers before it pushes them.
    fn max_buffer_size_bytes(&self) -> usize {
        1 << 20
    }

    /// Starts transaction `txn`'s batch. Nothing of it is visible downstream before
    /// [`OutputEndpoint::batch_end`] where the transport can hide it (files,
    /// transactions); elsewhere, downstream may see a prefix.
    async fn batch_start(&mut self, txn: u64, kind: BatchKind) -> Result<()>;

    /// Writes the buffer's messages in order, discarding those the destination holds.
    async fn push(&mut self, buffer: &Buffer) -> Result<()>;

    /// The batch is complete: make it durable and visible.
    async fn batch_end(&mut self) -> Result<()>;

    /// Abandons the batch in progress after a failure (remove what can be removed; a
    /// replay discards the rest).
    async fn abort(&mut self);

    /// Releases connections.
    async fn close(self: Box<Self>) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_holds_what_precedes_it_in_transaction_then_index_order() {
        let m = |txn, index| Message {
            txn,
            index,
            packed_key: b"",
            key: b"",
            value: b"",
        };
        let tail = Some(Tail { txn: 5, index: 3 });
        assert!(Tail::holds(tail, &m(4, 100)));
        assert!(Tail::holds(tail, &m(5, 3)));
        assert!(!Tail::holds(tail, &m(5, 4)));
        assert!(!Tail::holds(tail, &m(6, 0)));
        assert!(!Tail::holds(None, &m(1, 0)));
    }
}
