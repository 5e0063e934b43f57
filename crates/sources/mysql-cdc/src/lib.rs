//! The `mysql_cdc` source: MariaDB's (and, later, MySQL's) binary log read as a
//! replica, after a snapshot consistent with its position; exactly-once (a backfill
//! step journals its rows, a streamed step is a range of binlog positions re-read from
//! the server and checked by its hash).
//!
//! - [`config`]: what the user writes under `mysql_cdc:`.
//! - [`source`]: the [`Source`](sluice_source_sdk::Source): backfill, then stream.
//! - [`position`]: step positions, binlog positions, MariaDB GTIDs and the backfill
//!   segments streamed changes are checked against (pure).
//! - `catalog`: the SQL connection (checks, tables, keys, kinds, snapshot reads).
//! - `binlog`: the replica's stream decoded into transactions of documents.
//! - [`types`]: column values as JSON.
//! - `key`: primary keys as bounds the server compares (chunks, segments).
//! - `doc`: a change as a document.
//! - `ddl`: what a DDL statement of the log does to the captured tables (pure).
//! - `monitor`: the lag, from the sizes of the server's binary logs.
//!
//! The client is `mysql_async` (already in the tree, for the `mysql` driver) with its
//! `binlog` feature: `COM_BINLOG_DUMP` and `mysql_common`'s event parsing. What that
//! parsing lacks for MariaDB is handled in `binlog` (see its header).

mod binlog;
mod catalog;
pub mod config;
mod ddl;
mod doc;
mod key;
mod monitor;
pub mod position;
pub mod source;
pub mod types;

pub use config::MysqlCdcConfig;
pub use source::MysqlCdcSource;

use sluice_source_sdk::{InvalidConfig, Opening, Source, SourceError, SourceKind};
use std::path::Path;

/// The `mysql_cdc` kind, as the binary registers it.
pub struct MysqlCdcKind;

impl SourceKind for MysqlCdcKind {
    const NAME: &'static str = "mysql_cdc";
    type Config = MysqlCdcConfig;
    /// All it resumes from (the binlog position or GTID state, the snapshot's
    /// segments, the journaled snapshot chunks) is in its step positions, so its shard
    /// moves with the recovery log; every member registers with the same server id,
    /// so a new holder's stream ends a former holder's on the server (`binlog`).
    const SINGLETON: Option<&'static str> = Some(
        "it reads the binary log as one replica (one server_id), which two shards cannot share",
    );

    fn prepare(config: &mut MysqlCdcConfig, _base_dir: &Path) -> Result<(), InvalidConfig> {
        config.check()
    }

    fn open(
        opening: &Opening<'_>,
        config: &MysqlCdcConfig,
    ) -> Result<Box<dyn Source>, SourceError> {
        Ok(Box::new(MysqlCdcSource::new(
            opening.name,
            opening.materialization,
            config,
        )?))
    }
}
