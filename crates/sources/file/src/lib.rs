//! The `file` source: a file of JSON lines, or CSV with a header row, read once or
//! followed as it grows; exactly-once (a step is a byte range, replayed and checked by
//! its hash).
//!
//! - [`config`]: what the user writes under `file:` in a pipeline file.
//! - [`source`]: the [`Source`](sluice_source_sdk::Source) that reads it.
//! - [`watch`]: the change notifications that wake the reader of a followed file.

pub mod config;
pub mod source;
pub mod watch;

pub use config::{FileConfig, FileFormat};
pub use source::FileSource;

use sluice_source_sdk::config::resolve_path;
use sluice_source_sdk::{InvalidConfig, Opening, Source, SourceError, SourceKind};
use std::path::Path;

/// The `file` kind, as the binary registers it.
pub struct FileKind;

impl SourceKind for FileKind {
    const NAME: &'static str = "file";
    type Config = FileConfig;

    fn prepare(config: &mut FileConfig, base_dir: &Path) -> Result<(), InvalidConfig> {
        resolve_path(&mut config.path, base_dir);
        Ok(())
    }

    fn open(opening: &Opening<'_>, config: &FileConfig) -> Result<Box<dyn Source>, SourceError> {
        // `sluice run --follow` tails every file, as `follow: true` does.
        let config = FileConfig {
            follow: config.follow || opening.follow,
            ..config.clone()
        };
        Ok(Box::new(FileSource::new(opening.name, &config)))
    }
}
