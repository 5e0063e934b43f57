//! The `airbyte` and `singer` sources: hundreds of existing connectors (Airbyte source
//! connectors, Singer taps; most install with `pip`) run as processes over their own
//! protocols, on the input model like any built-in source. At-least-once: a step ends
//! at each state message and resumes from it (see [`source`]).
//!
//! ```text
//!  pipeline file  sources.users: {target, airbyte: {connector: faker, config, streams}}
//!  open ──▶ ConnectorSource<Airbyte | Singer> ──first queue──▶ discover (once) ─▶ read
//!             process.rs   the process: own group, parent-death signal, stderr logged,
//!                          timeout, exit status, killed with its group when dropped
//!             airbyte.rs / singer.rs   the messages, states and catalogs (pure)
//! ```
//!
//! - [`config`]: what the user writes under `airbyte:` or `singer:`.
//! - [`source`]: the [`Source`] over a connector's `read`.
//! - [`launch`]: the connector's sub-commands and the files they are handed.
//! - [`process`]: one connector process.
//! - [`protocol`], [`airbyte`], [`singer`]: the two protocols.
//! - [`discover`]: what `sluice discover` prints from.

pub mod airbyte;
pub mod config;
pub mod launch;
pub mod process;
pub mod protocol;
pub mod singer;
pub mod source;

pub use airbyte::Airbyte;
pub use config::ConnectorConfig;
pub use protocol::{Protocol, Stream};
pub use singer::Singer;
pub use source::ConnectorSource;

use launch::Launch;
use sluice_source_sdk::{InvalidConfig, Opening, Source, SourceError, SourceKind};
use std::marker::PhantomData;
use std::path::Path;

/// The `airbyte` kind: an Airbyte source connector.
pub type AirbyteKind = ConnectorKind<Airbyte>;
/// The `singer` kind: a Singer tap.
pub type SingerKind = ConnectorKind<Singer>;

/// The source kind of protocol `P`, as the binary registers it.
pub struct ConnectorKind<P>(PhantomData<P>);

impl<P: Protocol> SourceKind for ConnectorKind<P> {
    const NAME: &'static str = P::NAME;
    type Config = ConnectorConfig;

    fn prepare(config: &mut ConnectorConfig, base_dir: &Path) -> Result<(), InvalidConfig> {
        config.prepare(base_dir, P::NAME, true)
    }

    fn open(
        opening: &Opening<'_>,
        config: &ConnectorConfig,
    ) -> Result<Box<dyn Source>, SourceError> {
        Ok(Box::new(ConnectorSource::new(Launch::<P>::new(
            opening.name,
            config,
        ))))
    }
}

/// What `sluice discover` reads: the configuration with its spec's defaults filled in
/// ([`Launch::with_defaults`]), and the connector's streams, after its check.
pub async fn discover<P: Protocol>(
    name: &str,
    config: &ConnectorConfig,
) -> Result<(ConnectorConfig, Vec<Stream>), SourceError> {
    let config = Launch::<P>::new(name, config).with_defaults().await?;
    let launch = Launch::<P>::new(name, &config);
    launch.check().await?;
    let streams = launch.offered().await?.to_vec();
    Ok((config, streams))
}
