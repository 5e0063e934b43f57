//! The `postgres_cdc` source: PostgreSQL logical replication (pgoutput) with an initial
//! snapshot consistent with its slot; exactly-once (a backfill step journals its rows,
//! a streamed step is a range of commit LSNs replayed from the slot and checked by its
//! hash; the slot confirms only what the recovery log holds).
//!
//! - [`config`]: what the user writes under `postgres_cdc:`.
//! - [`source`]: the [`Source`](sluice_source_sdk::Source): backfill, then stream.
//! - [`position`]: step positions and the backfill segments streamed changes are
//!   checked against (pure).
//! - `catalog`: the SQL connection (checks, tables, keys, types, snapshot reads).
//! - `wire`: the replication connection (our own: tokio-postgres has no CopyBoth).
//! - `pgoutput`: the logical decoding messages.
//! - `stream`: whole transactions of documents from the slot (a large one in parts,
//!   the steps of one unit), keepalives between them, and status updates.
//! - `monitor`: the WAL the slot holds back, its warning, and the optional heartbeat.
//! - [`types`]: column values as JSON, from their text form.
//! - `doc`: a change as a document.
//! - `testing` (feature `testing`): a private PostgreSQL with `wal_level=logical`.
//!
//! The replication client is a small one of our own over `postgres-protocol`
//! (the message codec and SCRAM of tokio-postgres, already a dependency): the crates
//! that offer replication either bring TLS and C or do not let the caller decide
//! when a position is confirmed, and pgoutput v1 is a dozen messages.

mod catalog;
pub mod config;
mod doc;
mod monitor;
mod pgoutput;
pub mod position;
pub mod source;
mod stream;
pub mod types;
mod wire;

pub use config::{PostgresCdcConfig, Truncate};
/// The pgoutput decoder, for the fuzz target (crates/fuzz, issue 34).
#[doc(hidden)]
pub use pgoutput::decode as decode_pgoutput;
pub use source::PostgresCdcSource;

use sluice_source_sdk::{InvalidConfig, Opening, Source, SourceError, SourceKind};
use std::path::Path;

/// The `postgres_cdc` kind, as the binary registers it.
pub struct PostgresCdcKind;

impl SourceKind for PostgresCdcKind {
    const NAME: &'static str = "postgres_cdc";
    type Config = PostgresCdcConfig;
    const SINGLETON: Option<&'static str> =
        Some("it reads one replication slot, which two shards cannot share");

    fn prepare(config: &mut PostgresCdcConfig, _base_dir: &Path) -> Result<(), InvalidConfig> {
        config.check()
    }

    fn open(
        opening: &Opening<'_>,
        config: &PostgresCdcConfig,
    ) -> Result<Box<dyn Source>, SourceError> {
        Ok(Box::new(PostgresCdcSource::new(
            opening.name,
            opening.materialization,
            config,
        )?))
    }
}
