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
//! new generation publishes every transaction, after it. The tail decides, not the duplicate
//! window, which a restart can outlast (2 minutes by default). `Nats-Msg-Id` is a second
//! line for races within the window: a publish whose ack timed out but that was stored,
//! acknowledged later than the tail was read.
//!
//! **The gap.** Up to `max_in_flight` publishes await their acks (in order), so the
//! prefix holds only if no publish fails while a later one is stored. Two things do
//! that: the connection drops and the client reconnects (what it had written to the
//! dead socket is lost, what it had queued goes out on the new connection), and the
//! stream rejects one message and accepts the next (its `max_msg_size`, `discard: new`
//! at a limit, a storage error). The failed ack fails the push, but later messages of
//! the transaction may be stored beyond the hole: the tail cannot see it, and filling
//! it would break the order. A batch ends only once every ack succeeded, and the first
//! batch after a failure reads the tail again (once every abandoned publish has landed
//! or timed out), so a gap can only lie in the tail's transaction. `open` and that
//! re-read count the subject's messages after the tail's `Sluice-After`: a tail at
//! index `i` needs exactly `i + 1`. Any other count is `Corrupt`, naming the stream,
//! subject and sequences: a gap is never skipped silently, but it stops the binding
//! until someone looks. `max_in_flight: 1` rules the gap out (nothing is ever queued
//! behind an unacknowledged publish).
//!
//! What remains: the count is skipped when retention removed messages after
//! `Sluice-After` (it cannot tell them from a gap), and a stream limit that removes a
//! subject's oldest messages within a transaction (`max_msgs_per_subject`) reads as a
//! gap. And an ack that times out (10 s) while the client is still reconnecting leaves
//! its publish, and those queued behind it, in that client: if it reconnects only after
//! the tail was read again (by this endpoint or the next one), its messages land after
//! the replay's. Within the duplicate window one copy of each is kept, but the order
//! may break (an ack that says "duplicate" is logged as a warning); after the window,
//! they are stored twice.
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
    }
}
