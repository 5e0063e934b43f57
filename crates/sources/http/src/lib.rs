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
//! - `keys`: the idempotency keys file and its recovery.
//! - [`client`]: a small HTTP/1.1 client, for benchmarks, torture and tests.

mod body;
pub mod client;
pub mod config;
mod ingest;
mod keys;
mod server;
pub mod source;

/// The body reader, for the fuzz targets (crates/fuzz, issue 34).
#[doc(hidden)]
pub use body::{Batch, frame, unframe};
pub use config::HttpConfig;
pub use source::HttpSource;

use sluice_source_sdk::{InvalidConfig, Opening, Source, SourceError, SourceKind};
use std::path::Path;

/// The `http` kind, as the binary registers it.
pub struct HttpKind;

impl SourceKind for HttpKind {
    const NAME: &'static str = "http";
    type Config = HttpConfig;
    const PINNED: Option<&'static str> = Some(
        "it listens on this machine and keeps its idempotency keys beside the local recovery log",
    );

    fn prepare(config: &mut HttpConfig, base_dir: &Path) -> Result<(), InvalidConfig> {
        config.check(base_dir)
    }

    fn open(opening: &Opening<'_>, config: &HttpConfig) -> Result<Box<dyn Source>, SourceError> {
        let source = HttpSource::new(opening.name, config, opening.state_dir.to_path_buf());
        Ok(Box::new(source.with_intake(opening.intake.cloned())))
    }
}
