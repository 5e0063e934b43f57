//! The nats output: each binding publishes its changes to a JetStream subject, one
//! message per encoded change, in transaction order:
//!
//! ```text
//!  payload       the encoded value
//!  Nats-Msg-Id   <materialization>/<subject>/<generation>/<txn>/<index>   (a stream
//!                deduplicates across its subjects, and bindings may share a stream; a
//!                reset's new generation numbers transactions anew)
//!  Sluice-Generation  the materialization's generation (see sluice_output_sdk::generation)
//!  Sluice-Txn, Sluice-Index, Sluice-Batch (delta | snapshot)
//!  Sluice-After  the subject's last stream sequence before the transaction (0: none)
//!  Sluice-Key    the key, when it is text a header carries verbatim (JSON keys are)
//!  Nats-Expected-Last-Subject-Sequence or Nats-Expected-Last-Msg-Id
//!                what the stream must end with before it (the fence)
//! ```
//!
//! The subject's stream is the one whose subjects hold it; if none does, the endpoint's
//! `stream` (else one named after the subject) is created on disk, limits retention,
//! or given the subject if it exists.
//!
//! **Exactly once.** A stream stores one connection's publishes in the order they were
//! sent, so when the process dies mid-batch (its connection with it) the subject holds
//! a prefix of what was published. `open` reads the subject's last message: its
//! transaction and index are the [`Tail`](sluice_output_sdk::Tail) if it is of the
//! endpoint's generation, and the replayed transaction's messages up to it are
//! discarded. Another generation's last message (a reset came between) is no tail: the
//! new generation publishes every transaction, after it. The tail decides, not the
//! duplicate window, which a restart can outlast (2 minutes by default). `Nats-Msg-Id`
//! is a second line for races within the window (the server checks it first: a
//! duplicate stores nothing and is acknowledged with the sequence of the copy held).
//!
//! **The fence.** Every publish says what the stream must end with, or the server
//! refuses it ("wrong last sequence", "wrong last msg ID"): the first publish since the
//! tail was read, `Nats-Expected-Last-Subject-Sequence`, the stream sequence of the
//! subject's last message as read (0 when the subject holds none: nats-server 2.9
//! checks 0 too, as "no message of the subject"); each later one,
//! `Nats-Expected-Last-Msg-Id`, the `Nats-Msg-Id` of the message published just before
//! it, which names its generation, transaction and index. So a message is stored only
//! right after the message that precedes it, whoever stored that one: nothing is ever
//! appended after a message this endpoint did not know of. What that fences is a former
//! writer: a cluster member paused past its lease (SIGSTOP, a partition) while another
//! took its shard over, replayed the interrupted transaction and went on, wakes and
//! publishes the rest of its batch, following what it last knew: refused. The runtime's
//! intent is durable before any effect, so a former writer only ever publishes messages
//! of the transaction the new holder replays, with the same generation, transaction,
//! index and bytes: whichever copy of a message lands first is the one the subject
//! keeps, in its place, and the other writer's is refused (or dropped as a duplicate
//! within the window, storing nothing). A refused publish fails the push, retryably,
//! with an error saying another writer appended to the subject (named); the endpoint
//! reads the tail again before its next batch. Nothing is skipped or reordered; the
//! former writer's view commit fails fenced besides.
//!
//! **Pacing.** A stream's last message id is the stream's, not the subject's, so
//! publishes are pipelined (up to `max_in_flight` awaiting their acks) only where the
//! stream holds the subject alone: no other subject, no sourced stream (the stream
//! this output creates per subject when `stream` is not set). Where other subjects
//! share the stream (several bindings under one `stream`) and a former holder may still
//! publish (the view is shared, as in a cluster), each publish awaits the previous
//! one's ack and follows its sequence by `Nats-Expected-Last-Subject-Sequence`: a round
//! trip per message (leave `stream` unset to keep the pipeline). With a local view this
//! endpoint is the subject's one writer, so on a shared stream only the first publish
//! after each read of the tail is fenced, the rest pipelined as before. The stream's
//! subjects are read at the first publish after each read of the tail, once every
//! binding has added its own; a subject added later (another materialization naming the
//! stream) has the next pipelined publish refused, and the retry publishes one at a
//! time. (Both checks were tried against one nats-server 2.9 node, not against a
//! replicated stream.)
//!
//! **No gap.** A publish that fails (the connection drops and the client reconnects,
//! losing what it had written to the dead socket; the stream rejects one message at a
//! limit) is not stored, so every publish behind it is refused too (the next one expects
//! it at the stream's end): the subject never holds a later message of a batch without
//! the earlier ones. A
//! batch ends only once every ack succeeded, and the first batch after a failure reads
//! the tail again (once every abandoned publish has landed or timed out). An abandoned
//! publish that lands later still (its ack timed out, 10 s, while the client was
//! reconnecting) expects what preceded it when it was sent: refused unless the stream
//! still ends there, and then it lands in its place. `open` and each re-read still count the
//! subject's messages after the tail's `Sluice-After` (a tail at index `i` needs exactly
//! `i + 1`), for what the fence cannot see: messages deleted, or written by a tool that
//! sets no expectation. Any other count is `Corrupt`, naming the stream, subject and
//! sequences: it stops the binding until someone looks. The count is skipped when
//! retention removed messages after `Sluice-After` (it cannot tell them from a gap),
//! and a stream limit that removes a subject's oldest messages within a transaction
//! (`max_msgs_per_subject`) reads as a gap.
//!
//! **Visibility.** NATS has no transactions: a consumer sees a transaction's messages
//! as they are stored, and after a crash a prefix of one until the replay completes it.
//! Nothing marks a transaction's end; a consumer that needs whole transactions waits
//! for the next `Sluice-Txn`.

mod config;
mod endpoint;
pub mod read;
mod server;
mod stamp;

pub use config::{Config, Resource};
pub use endpoint::NatsEndpoint;
pub use stamp::{Stamp, key_header, msg_id};

use serde_json::Value;
use sluice_output_sdk::{OutputKind, Target};

/// The `nats` endpoint kind.
pub fn kind() -> OutputKind {
    OutputKind {
        name: "nats",
        paths: sluice_nats_client::PATHS,
        endpoint_schema: config::endpoint_schema,
        resource_schema: config::resource_schema,
        check: |config| Config::parse(config).map(drop),
        resource_path: |resource| Ok(vec![Resource::parse(resource)?.subject]),
        endpoint: |config: &Value, target: Target| {
            let config = Config::parse(config)?;
            let resource = Resource::parse(&target.resource)?;
            Ok(Box::new(NatsEndpoint::new(&config, &resource, &target)))
        },
        late_writes: None,
    }
}
