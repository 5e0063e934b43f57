//! The files output: each binding writes into its own folder one file per
//! transaction, named by the materialization's generation and the transaction's number:
//!
//! ```text
//!  <directory>/<path>/<generation>-00000000000000000042.jsonl            a transaction's changes
//!  <directory>/<path>/<generation>-00000000000000000001.snapshot.jsonl   a snapshot batch
//!  <directory>/<path>/.<generation>-00000000000000000043.jsonl.<token>.tmp   a batch being written
//! ```
//!
//! A batch is written to a temporary name of its writer's own, fsync'ed, linked to its
//! name only if that name is free, and the folder fsync'ed: a file that has its final
//! name is whole, and never replaced. A restart removes the temporary files of writers
//! that died (a live one holds a lock on its own), and a replayed transaction whose
//! file of the same generation exists is discarded, whichever attempt wrote it: a
//! former holder of the shard still writing when another member took it over publishes
//! nothing over the new holder's files (see the endpoint's header). A reader lists the folder in name order, skipping names that start with
//! a dot: a generation's files come in transaction order, and a later generation's
//! after (see [`sluice_output_sdk::generation`]). Files of another generation are never
//! taken for this one's: after a reset (`sluice apply --delete`) the new generation
//! writes every transaction again, numbered from where its new recovery log starts, and
//! a reader that sees a new generation starts its view over from that generation's
//! first file. Names without a generation (`<txn:020>.<ext>`) are the previous
//! release's; a view it made adopts them as its own.

mod config;
mod endpoint;

pub use config::{Config, Resource};
pub use endpoint::{BatchFile, FilesEndpoint, batch_file_name, parse_batch_file_name};

use serde_json::Value;
use sluice_output_sdk::{OutputKind, Target};

/// The `files` endpoint kind.
pub fn kind() -> OutputKind {
    OutputKind {
        name: "files",
        paths: &["directory"],
        endpoint_schema: config::endpoint_schema,
        resource_schema: config::resource_schema,
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
        late_writes: None,
    }
}
