//! The in-process transport: a Rust driver linked into the binary, and the one shape in
//! which a binary registers such drivers ([`BuiltinKind`]), whatever their family: a
//! Flow driver, an epoch sink or an output.
//!
//! Unary calls go straight to the [`Driver`]. A Transactions stream is the serve loop
//! ([`serve_transactions`]) spawned on a task, connected by two bounded channels of
//! unencoded messages: no serialization on the hot path, arenas move by pointer. A third
//! channel carries the calls beside the protocol ([`LogHooks`]): the runtime awaits each
//! answer before it sends anything more, so each is served between the requests it
//! belongs between.
//!
//! ```text
//!  client ──mpsc(requests)──▶ serve_transactions task ──mpsc(responses)──▶ client
//!  client ──mpsc(hook calls)─▶       │ returns Err(e)
//!                                    └──────────▶ last item of the response stream
//! ```
//!
//! When the serve loop fails, its error becomes the last item of the response stream,
//! after every response it sent, so the runtime sees the driver's own error (e.g.
//! [`crate::Error::Fenced`]) rather than a bare "stream closed".

use crate::contract::SinkContract;
use crate::hooks::LogHooks;
use crate::serve::serve_in_process;
use crate::{Driver, Endpoint, Error, Result, TransactionStream};
use async_trait::async_trait;
use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde_json::Value;
use sluice_config::{InvalidConfig, parse};
use sluice_proto::flow::EndpointType;
use sluice_proto::materialize as m;
use std::path::Path;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tracing::Instrument;

/// Messages in flight per direction. With arena messages bounded by
/// [`crate::arena::MAX_MESSAGE_BYTES`] this bounds the memory of a stream to
/// 2 × 8 × 4 MiB, while leaving room for the runtime to send the next Loads while the
/// driver works on the current one.
const CHANNEL_CAPACITY: usize = 8;

/// A driver called in this process.
pub struct InProcess {
    name: String,
    driver: Arc<dyn Driver>,
}

impl InProcess {
    pub fn new(name: impl Into<String>, driver: Arc<dyn Driver>) -> Self {
        InProcess {
            name: name.into(),
            driver,
        }
    }
}

#[async_trait]
impl Endpoint for InProcess {
    fn name(&self) -> &str {
        &self.name
    }
    async fn spec(&self, req: m::SpecRequest) -> Result<m::SpecResponse> {
        self.driver.spec(req).await
    }
    async fn validate(&self, req: m::ValidateRequest) -> Result<m::ValidateResponse> {
        self.driver.validate(req).await
    }
    async fn apply_upsert(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        self.driver.apply_upsert(req).await
    }
    async fn apply_delete(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        self.driver.apply_delete(req).await
    }

    async fn transactions(&self) -> Result<TransactionStream> {
        let (req_tx, req_rx) = mpsc::channel(CHANNEL_CAPACITY);
        let (resp_tx, resp_rx) = mpsc::channel(CHANNEL_CAPACITY);
        let (hook_tx, hook_rx) = mpsc::channel(1);
        let requests = ReceiverStream::new(req_rx).map(Ok).boxed();
        // In the caller's span: the driver's lines name the materialization it serves.
        let serve = serve_in_process(self.driver.clone(), requests, hook_rx, resp_tx);
        let served = tokio::spawn(serve.in_current_span());
        let name = self.name.clone();
        // The response channel closes when the serve task ends; then its outcome follows.
        let outcome = futures::stream::once(async move {
            match served.await {
                Ok(Ok(())) => None,
                Ok(Err(err)) => Some(Err(err)),
                Err(join) => Some(Err(Error::Transport(format!(
                    "driver {name}: the serve task failed: {join}"
                )))),
            }
        })
        .filter_map(futures::future::ready);
        let responses = ReceiverStream::new(resp_rx).map(Ok).chain(outcome).boxed();
        Ok(TransactionStream {
            requests: req_tx,
            responses,
            hooks: Some(LogHooks::new(hook_tx)),
        })
    }
}

/// A driver kind built into the binary, as the binary registers it: the one shape of
/// every in-process family (Flow drivers as [`Builtin`], epoch sinks and outputs by their
/// SDKs). The runtime's registry asks nothing else of it.
pub trait BuiltinKind: Send + Sync + 'static {
    /// Its key in an endpoint of the pipeline file (`sqlite`).
    fn name(&self) -> &'static str;

    /// What it reports itself as in requests.
    fn endpoint_type(&self) -> EndpointType;

    /// Keys of its configuration that hold paths (dotted inside an object: `tls.ca`):
    /// made relative to the pipeline file's folder before [`BuiltinKind::check`].
    fn paths(&self) -> &'static [&'static str];

    /// Checks an endpoint configuration strictly, by the very type the driver parses it
    /// with; opens nothing. Errors name their place inside it.
    fn check(&self, config: &Value) -> std::result::Result<(), InvalidConfig>;

    /// What a checked configuration declares for admission beyond the driver's commit
    /// pattern ([`Driver::declared`]): an epoch sink's contract. `None`: nothing more.
    fn contract(&self, _config: &Value) -> std::result::Result<Option<SinkContract>, String> {
        Ok(None)
    }

    /// The longest one call of a driver of this configuration may take before the
    /// driver gives up on it by itself (an epoch sink's suggested write timeout, plus
    /// what retiring the sink may wait): the runtime's waits on such a driver outlast
    /// it, whatever `runtime.timeouts.driver` says. `None`: no call takes longer than
    /// the store it writes.
    fn longest_call(&self, _config: &Value) -> Option<std::time::Duration> {
        None
    }

    /// A driver instance. `state_dir` is a folder beside the recovery log that it may
    /// keep state in; `None` where there is none (`sluice driver serve`), for which a
    /// kind that needs one returns `None`.
    fn driver(&self, state_dir: Option<&Path>) -> Option<Arc<dyn Driver>>;

    /// The JSON schemas of its endpoint configuration and of a binding's resource, for a
    /// kind whose instance cannot say them without a state folder; `None`: its Spec.
    fn schemas(&self) -> Option<(String, String)> {
        None
    }

    /// Why an endpoint of it, configured by `config`, cannot run under a cluster, beyond
    /// what its commit pattern says (state kept beside the local recovery log); `None`:
    /// nothing more.
    fn pinned(&self, _config: &Value) -> Option<&'static str> {
        None
    }

    /// Why an endpoint of it, configured by `config`, takes one writer at a time beyond
    /// what a sink contract says (one ordered stream), so its materialization runs as
    /// one shard; `None`: nothing more.
    fn singleton(&self, _config: &Value) -> Option<&'static str> {
        None
    }
}

/// A Flow driver built into the binary: its name, what it reports itself as, the type
/// its endpoint configuration parses as, and an instance maker.
pub struct Builtin {
    name: &'static str,
    endpoint_type: EndpointType,
    paths: &'static [&'static str],
    check: fn(Value) -> std::result::Result<(), InvalidConfig>,
    driver: fn() -> Arc<dyn Driver>,
}

impl Builtin {
    /// The driver `name`, reporting itself as `endpoint_type`, whose endpoint
    /// configuration the driver parses as `C` (strict, so the pipeline file is checked
    /// against it) and whose keys `paths` hold paths; `driver` makes an instance, which
    /// declares how it commits ([`Driver::declared`]: what admission knows of it).
    pub fn new<C: DeserializeOwned>(
        name: &'static str,
        endpoint_type: EndpointType,
        paths: &'static [&'static str],
        driver: fn() -> Arc<dyn Driver>,
    ) -> Builtin {
        Builtin {
            name,
            endpoint_type,
            paths,
            check: |config| parse::<C>(config).map(drop),
            driver,
        }
    }
}

impl BuiltinKind for Builtin {
    fn name(&self) -> &'static str {
        self.name
    }

    fn endpoint_type(&self) -> EndpointType {
        self.endpoint_type
    }

    fn paths(&self) -> &'static [&'static str] {
        self.paths
    }

    fn check(&self, config: &Value) -> std::result::Result<(), InvalidConfig> {
        (self.check)(config.clone())
    }

    fn driver(&self, _state_dir: Option<&Path>) -> Option<Arc<dyn Driver>> {
        Some((self.driver)())
    }
}
