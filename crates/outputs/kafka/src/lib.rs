//! The kafka output: each binding produces its changes to a topic, one Kafka message per
//! encoded message (its key and value), stamped with headers:
//!
//! ```text
//!  sluice-txn              the transaction, decimal
//!  sluice-index            the message's index within the transaction's batch, decimal
//!  sluice-batch            delta | snapshot
//!  sluice-materialization  the materialization that wrote it
//!  sluice-generation       its generation (16 hex digits; see sluice_output_sdk::generation)
//! ```
//!
//! A message goes to partition `(murmur2(key) & 0x7fffffff) % partitions`, Kafka's own
//! choice for a keyed message, or with `partitioner: key_range` to the partition of its
//! document's key hash that a source `partitioned_by: key_range` reads ([`partitioner`]),
//! with the partition count read at open.
//!
//! Why a crash mid-batch is exact without Kafka transactions: each partition receives
//! its messages in (transaction, index) order, one produce request at a time, each
//! acknowledged before the next, so a partition holds a prefix of what was sent to it
//! and its last message is where that prefix ends. Open reads every partition's last
//! message into that partition's [`Tail`](sluice_output_sdk::Tail), if that message is
//! of the endpoint's generation: after a reset, the old generation's last message is
//! nothing of the new one's, which produces every transaction again. A replayed
//! transaction produces the same messages in the same order, and the same key picks
//! the same partition (either partitioner is a function of the change: of its message
//! key, or of its packed key's hash), so each partition is sent the same sequence
//! again: the messages up to its tail are discarded, and it resumes right after them. This holds while the
//! topic is written by this output alone (a foreign message at a partition's end fails
//! open as corrupt, and a produce landing elsewhere than where the partition ended fails
//! the push) and while its partition count and partitioner do not change between a crash
//! and the replay.
//!
//! What is not hidden: downstream may see a prefix of a transaction until its last
//! message arrives (and, after a crash, until the replay completes it). A Kafka
//! transactional producer would hide it until the commit; tansu, the broker this is
//! built and tested against, has no transactions, so it is not built.

mod config;
mod connection;
mod endpoint;
pub mod partitioner;
pub mod read;
pub mod stamp;

pub use config::{Config, Resource};
pub use endpoint::{KafkaEndpoint, PRODUCE_BYTES};

use serde_json::Value;
use sluice_output_sdk::{OutputKind, Target};

/// The `kafka` endpoint kind.
pub fn kind() -> OutputKind {
    OutputKind {
        name: "kafka",
        paths: sluice_kafka_client::config::PATHS,
        endpoint_schema: config::endpoint_schema,
        resource_schema: config::resource_schema,
        check: |config| config::parse::<Config>(config)?.connector().map(drop),
        resource_path: |resource| {
            let resource: Resource = config::parse(resource)?;
            Ok(vec![resource.topic])
        },
        endpoint: |config: &Value, target: Target| {
            let config: Config = config::parse(config)?;
            let resource: Resource = config::parse(&target.resource)?;
            Ok(Box::new(KafkaEndpoint::new(&config, &resource, &target)?))
        },
        // No conditional produce: fencing a former producer takes Kafka transactions.
        late_writes: Some(
            "Kafka has no conditional produce: a former holder's late messages still land in \
             the topic after another member took the shard over, and fencing a former \
             producer takes Kafka transactions (a transactional id's epoch), which this \
             output does not use",
        ),
    }
}
