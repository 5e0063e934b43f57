//! The `datagen` source: a deterministic stream of generated documents, for the
//! quickstart, tests and benchmarks; exactly-once (a step is a range of sequence
//! numbers, regenerated and checked by its hash).
//!
//! - [`config`]: what the user writes under `datagen:` in a pipeline file.
//! - [`pageview`]: the generator, a pure function of the sequence number, whose text is
//!   fixed byte for byte (recovery logs' step hashes cover it).
//! - [`source`]: the [`Source`](sluice_source_sdk::Source) that releases it.

pub mod config;
pub mod pageview;
pub mod source;

pub use config::{DatagenConfig, DatagenShape};
pub use pageview::{Pageview, key_of, pageview, write_decimal};
pub use source::DatagenSource;

use sluice_source_sdk::{InvalidConfig, Opening, Source, SourceError, SourceKind};
use std::path::Path;

/// The `datagen` kind, as the binary registers it.
pub struct DatagenKind;

impl SourceKind for DatagenKind {
    const NAME: &'static str = "datagen";
    type Config = DatagenConfig;

    fn prepare(config: &mut DatagenConfig, _base_dir: &Path) -> Result<(), InvalidConfig> {
        config.check()
    }

    fn open(opening: &Opening<'_>, config: &DatagenConfig) -> Result<Box<dyn Source>, SourceError> {
        Ok(Box::new(DatagenSource::new(opening.name, config)?))
    }
}
