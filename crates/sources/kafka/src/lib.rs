//! The `kafka` source: one topic's partitions, assigned by the source itself (no
//! consumer group; offsets live in the recovery log), exactly-once: a step is an offset
//! range per partition, replayed and checked by its hash. A topic `partitioned_by:
//! key_range` is read by each shard only in the partitions holding its key range.
//!
//! - [`config`]: what the user writes under `kafka:` in a pipeline file.
//! - [`source`]: the [`Source`](sluice_source_sdk::Source) that reads it.
//! - [`admin`]: creating, filling and deleting topics (tests, benchmarks, torture).

pub mod admin;
mod broker;
pub mod config;
mod fetch;
mod message;
pub mod source;

pub use config::{KafkaConfig, KafkaFormat, PartitionedBy, Start};
pub use source::KafkaSource;

use sluice_source_sdk::{InvalidConfig, Opening, Source, SourceError, SourceKind};
use std::path::Path;

/// The `kafka` kind, as the binary registers it.
pub struct KafkaKind;

impl SourceKind for KafkaKind {
    const NAME: &'static str = "kafka";
    type Config = KafkaConfig;

    fn prepare(config: &mut KafkaConfig, base_dir: &Path) -> Result<(), InvalidConfig> {
        config.check()?;
        let (tls, sasl) = (config.tls.as_mut(), config.sasl.as_mut());
        sluice_kafka_client::config::prepare(tls, sasl, base_dir)
    }

    fn open(opening: &Opening<'_>, config: &KafkaConfig) -> Result<Box<dyn Source>, SourceError> {
        let source = KafkaSource::reporting(opening.name, config, opening.health.clone())
            .for_shards(opening.shard_keys.cloned());
        Ok(Box::new(source))
    }
}
