//! The files output: each binding writes into its own folder one file per
//! transaction, named by the transaction's number:
//!
//! ```text
//!  <directory>/<path>/00000000000000000042.jsonl            a transaction's changes
//!  <directory>/<path>/00000000000000000001.snapshot.jsonl   a snapshot batch
//!  <directory>/<path>/.00000000000000000043.jsonl.tmp       a batch being written
//! ```
//!
//! A batch is written to its temporary name, fsync'ed, renamed, and the folder
//! fsync'ed: a file that has its final name is whole. A restart removes temporary
//! files, and a replayed transaction whose file exists is discarded. A reader lists the
//! folder in name order, skipping names that start with a dot.

mod config;
mod endpoint;

pub use config::{Config, Resource};
pub use endpoint::{FilesEndpoint, batch_file_name, parse_batch_file_name};

use serde_json::Value;
use sluice_output_sdk::{OutputKind, Target};

/// The `files` endpoint kind.
pub fn kind() -> OutputKind {
    OutputKind {
        name: "files",
        paths: &["directory"],
        endpoint_schema: config::ENDPOINT_SCHEMA,
        resource_schema: config::RESOURCE_SCHEMA,
        check: |config| config::parse::<Config>(config).map(drop),
        resource_path: |resource| {
            let resource: Resource = config::parse(resource)?;
            Ok(vec![resource.path])
        },
        endpoint: |config: &Value, target: Target| {
            let config: Config = config::parse(config)?;
            let resource: Resource = config::parse(&target.resource)?;
            Ok(Box::new(FilesEndpoint::new(&config, &resource, &target)?))
        },
    }
}
