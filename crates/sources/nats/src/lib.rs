//! The `nats` source: a NATS JetStream stream (limits retention), read in stream
//! order by an ordered consumer; exactly-once (a step is a range of stream sequences,
//! replayed and checked by its hash).
//!
//! - [`config`]: what the user writes under `nats:` in a pipeline file.
//! - [`source`]: the [`Source`](sluice_source_sdk::Source) that reads it.
//! - `client`: talking to the server (what nats-server 2.9 supports).
//! - [`admin`]: making, filling and deleting streams, for benchmarks and tests.

pub mod admin;
mod client;
pub mod config;
pub mod source;

pub use config::{NatsConfig, Start};
pub use source::NatsSource;

use sluice_source_sdk::{InvalidConfig, Opening, Source, SourceError, SourceKind};
use std::path::Path;

/// The `nats` kind, as the binary registers it.
pub struct NatsKind;

impl SourceKind for NatsKind {
    const NAME: &'static str = "nats";
    type Config = NatsConfig;

    fn prepare(config: &mut NatsConfig, base_dir: &Path) -> Result<(), InvalidConfig> {
        config.check(base_dir)
    }

    fn open(opening: &Opening<'_>, config: &NatsConfig) -> Result<Box<dyn Source>, SourceError> {
        Ok(Box::new(NatsSource::new(opening.name, config)))
    }
}
