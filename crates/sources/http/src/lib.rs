//! The `http` source: clients `POST` JSON documents to `/ingest/<source>`, and each
//! request is answered once the transaction holding its body is durable; exactly-once
//! (a step's bodies are journaled in its intent and replayed from there, and an
//! `Idempotency-Key` makes a retry safe).
//!
//! - [`config`]: what the user writes under `http:` in a pipeline file.
//! - [`source`]: the [`Source`](sluice_source_sdk::Source) the runtime drives.
//! - `server`: the axum routes, status codes and limits.
//! - `ingest`: accepted bodies, waiting requests and their answers.
//! - `body`: checking a body's documents; a step's framing as journaled data.
//! - `keys`: the idempotency keys (a keys file, or in a cluster the resume positions)
//!   and their recovery.
//! - [`standby`]: what a cluster member that does not hold the source's shard answers
//!   on its address (503, naming the holder).
//! - [`client`]: a small HTTP/1.1 client, for benchmarks, torture and tests.

mod body;
pub mod client;
pub mod config;
mod ingest;
mod keys;
mod server;
pub mod source;
pub mod standby;

/// The body reader, for the fuzz targets (crates/fuzz, issue 34).
#[doc(hidden)]
pub use body::{Batch, frame, unframe};
pub use config::HttpConfig;
pub use source::HttpSource;

use sluice_source_sdk::kind::Standby;
use sluice_source_sdk::{InvalidConfig, Opening, Source, SourceError, SourceKind};
use std::path::Path;

/// The `http` kind, as the binary registers it.
pub struct HttpKind;

impl SourceKind for HttpKind {
    const NAME: &'static str = "http";
    type Config = HttpConfig;
    const SINGLETON: Option<&'static str> = Some(
        "its requests are answered by one server at a time, which numbers their bodies \
         and knows their idempotency keys; the other members answer 503 naming it",
    );

    fn prepare(config: &mut HttpConfig, base_dir: &Path) -> Result<(), InvalidConfig> {
        config.check(base_dir)
    }

    fn open(opening: &Opening<'_>, config: &HttpConfig) -> Result<Box<dyn Source>, SourceError> {
        let mut source = HttpSource::new(opening.name, config, opening.state_dir.to_path_buf());
        if opening.shard_moves {
            source = source.keeping_keys_in_positions();
        }
        Ok(Box::new(source.with_intake(opening.intake.cloned())))
    }

    fn standby(name: &str, config: &HttpConfig) -> Option<Box<dyn Standby>> {
        Some(Box::new(standby::HttpStandby::start(name, config)))
    }
}
