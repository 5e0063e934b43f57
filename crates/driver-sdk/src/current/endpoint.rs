//! The runtime's [`Endpoint`] for a driver speaking the current protocol, over any
//! [`Transport`], and [`Detecting`], for a driver whose protocol is not configured.
//!
//! ```text
//!  spec/validate/apply ─▶ one stream: request ─▶ driver, close, ◀─ one response, ◀─ end
//!  transactions ─▶ one stream, a relay task:
//!      seed requests ─▶ ClientTranslator ─▶ cm::Request ─▶ driver
//!      seed responses ◀─ ClientTranslator ◀─ cm::Response ◀─ driver   (+ what it holds back)
//! ```
//!
//! - A unary call ends cleanly only if the driver answers once and then ends its stream
//!   (over stdio: exits with success); anything else is an error naming the call.
//! - A dry run of Apply is answered here ([`DRY_RUN`]), never sent: the current protocol
//!   has none, and its Apply would apply.
//! - A Spec answer must carry [`sluice_proto::current::PROTOCOL`]; another number is a
//!   driver of another protocol, and the error names the number it sent.
//! - The relay task of a Transactions stream ends with it: dropping the stream aborts the
//!   task, which drops the transport's stream (and kills a child process).

use super::Protocol;
use super::serve::relay;
use super::translate::{self, ClientTranslator};
use crate::grpc::STREAM_BUFFER;
use crate::{Endpoint, Error, Result, TransactionStream};
use async_trait::async_trait;
use futures::StreamExt;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use sluice_proto::current::{PROTOCOL, materialize as cm};
use sluice_proto::materialize as m;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use tokio::sync::{OnceCell, mpsc};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;

/// One `Materialize` stream: requests go in (closing the sender closes our side),
/// responses (or a transport error) come out.
pub struct Duplex {
    pub requests: mpsc::Sender<cm::Request>,
    pub responses: BoxStream<'static, Result<cm::Response>>,
}

/// What carries the current protocol to a driver: a fresh stream per call.
#[async_trait]
pub trait Transport: Send + Sync {
    /// Opens a stream; `call` names what it is for ("Spec", "Transactions") in errors.
    async fn open(&self, call: &'static str) -> Result<Duplex>;
}

/// What a dry run of a current-protocol driver's Apply describes.
pub const DRY_RUN: &str = "(not described: Flow's current protocol has no dry run, its \
    Apply always applies, so the driver was not asked)";

/// The runtime's view of a driver speaking the current protocol.
pub struct CurrentEndpoint {
    name: String,
    transport: Box<dyn Transport>,
}

impl CurrentEndpoint {
    /// `name` labels logs and errors.
    pub fn new(name: impl Into<String>, transport: impl Transport + 'static) -> Self {
        Self {
            name: name.into(),
            transport: Box::new(transport),
        }
    }

    /// Sends `request` alone, then reads the one response the driver owes, and the end
    /// of its stream.
    async fn unary(&self, call: &'static str, request: cm::Request) -> Result<cm::Response> {
        let Duplex {
            requests,
            mut responses,
        } = self.transport.open(call).await?;
        // Were the driver gone already, its response stream says why: read on.
        let _ = requests.send(request).await;
        drop(requests);
        let response = match responses.next().await {
            Some(response) => response?,
            None => {
                return Err(Error::Transport(format!(
                    "driver {}: ended its {call} stream without a response",
                    self.name
                )));
            }
        };
        if let Some(more) = responses.next().await {
            more?;
            return Err(Error::Malformed(format!(
                "driver {}: answered {call} more than once",
                self.name
            )));
        }
        Ok(response)
    }

    /// The driver's Spec answer, whose protocol must be the current one.
    async fn spec_response(&self, req: m::SpecRequest) -> Result<cm::Response> {
        let response = self.unary("Spec", translate::spec_request(req)).await?;
        is_current(&response)
            .map_err(|what| Error::Malformed(format!("driver {}: {what}", self.name)))?;
        Ok(response)
    }
}

#[async_trait]
impl Endpoint for CurrentEndpoint {
    fn name(&self) -> &str {
        &self.name
    }

    async fn spec(&self, req: m::SpecRequest) -> Result<m::SpecResponse> {
        Ok(translate::spec_from(self.spec_response(req).await?)?)
    }

    async fn validate(&self, req: m::ValidateRequest) -> Result<m::ValidateResponse> {
        let response = self
            .unary("Validate", translate::validate_request(req))
            .await?;
        Ok(translate::validated_from(response)?)
    }

    /// A dry run is answered here: the current protocol's Apply always applies, so
    /// the driver is not asked, and the answer says that nothing could be described.
    async fn apply_upsert(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        if req.dry_run {
            return Ok(m::ApplyResponse {
                action_description: DRY_RUN.to_string(),
                ..Default::default()
            });
        }
        let response = self.unary("Apply", translate::apply_request(req)).await?;
        Ok(translate::applied_from(response)?)
    }

    async fn apply_delete(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        let response = self
            .unary("Apply", translate::apply_delete_request(req))
            .await?;
        Ok(translate::applied_from(response)?)
    }

    async fn transactions(&self) -> Result<TransactionStream> {
        let driver = self.transport.open("Transactions").await?;
        let (requests, requests_rx) = mpsc::channel(STREAM_BUFFER);
        let (back, back_rx) = mpsc::channel(STREAM_BUFFER);
        let relayed = Relay(Some(tokio::spawn(relay(
            ClientTranslator::new(),
            ReceiverStream::new(requests_rx).map(Ok).boxed(),
            driver.requests,
            driver.responses,
            back,
        ))));
        // The relay owns the only sender of `back`, so its responses drain before its
        // outcome is read: responses first, then the error that ended it, if any.
        let closing = futures::stream::once(async move {
            match relayed.await {
                Ok(Ok(())) => None,
                Ok(Err(err)) => Some(Err(err)),
                Err(err) => Some(Err(Error::Transport(format!(
                    "the current protocol's relay task failed: {err}"
                )))),
            }
        })
        .filter_map(futures::future::ready);
        let responses = ReceiverStream::new(back_rx).map(Ok).chain(closing).boxed();
        Ok(TransactionStream {
            requests,
            responses,
            hooks: None,
        })
    }
}

/// The relay task of a Transactions stream, aborted if the stream is dropped first.
struct Relay(Option<JoinHandle<Result<()>>>);

impl Future for Relay {
    type Output = std::result::Result<Result<()>, tokio::task::JoinError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let task = self
            .0
            .as_mut()
            .expect("a Relay is not polled after it resolves");
        let outcome = std::task::ready!(Pin::new(task).poll(cx));
        self.0 = None;
        Poll::Ready(outcome)
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

/// Finds out which protocol a driver speaks.
pub type Detect = Box<dyn Fn() -> BoxFuture<'static, Result<Protocol>> + Send + Sync>;

/// A driver whose protocol is not configured: before its first call, `detect` asks it
/// (once; a failed attempt is tried again by the next call), and every call then goes
/// to the endpoint of the protocol it speaks. The choice is logged at info.
pub struct Detecting {
    name: String,
    current: Arc<dyn Endpoint>,
    transactions: Arc<dyn Endpoint>,
    detect: Detect,
    chosen: OnceCell<Protocol>,
}

impl Detecting {
    pub fn new(
        name: impl Into<String>,
        current: Arc<dyn Endpoint>,
        transactions: Arc<dyn Endpoint>,
        detect: Detect,
    ) -> Self {
        Self {
            name: name.into(),
            current,
            transactions,
            detect,
            chosen: OnceCell::new(),
        }
    }

    /// The protocol the driver speaks, asked of it the first time.
    pub async fn protocol(&self) -> Result<Protocol> {
        let chosen = self
            .chosen
            .get_or_try_init(|| async {
                let protocol = (self.detect)().await?;
                tracing::info!(driver = %self.name, %protocol, "the driver speaks the {protocol} protocol");
                Ok::<_, Error>(protocol)
            })
            .await?;
        Ok(*chosen)
    }

    async fn endpoint(&self) -> Result<&dyn Endpoint> {
        Ok(match self.protocol().await? {
            Protocol::Current => self.current.as_ref(),
            Protocol::Transactions => self.transactions.as_ref(),
        })
    }
}

#[async_trait]
impl Endpoint for Detecting {
    fn name(&self) -> &str {
        &self.name
    }

    async fn spec(&self, req: m::SpecRequest) -> Result<m::SpecResponse> {
        self.endpoint().await?.spec(req).await
    }

    async fn validate(&self, req: m::ValidateRequest) -> Result<m::ValidateResponse> {
        self.endpoint().await?.validate(req).await
    }

    async fn apply_upsert(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        self.endpoint().await?.apply_upsert(req).await
    }

    async fn apply_delete(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        self.endpoint().await?.apply_delete(req).await
    }

    async fn transactions(&self) -> Result<TransactionStream> {
        self.endpoint().await?.transactions().await
    }
}

/// Whether a Spec answer is of the current protocol, for detection: `Err` names what it
/// is instead.
pub(crate) fn is_current(response: &cm::Response) -> std::result::Result<(), String> {
    match response.spec.as_ref().map(|spec| spec.protocol) {
        Some(PROTOCOL) => Ok(()),
        Some(number) => Err(format!(
            "answered Spec with protocol {number}, not Flow's current protocol {PROTOCOL}"
        )),
        None => Err("answered a Spec request with something other than Spec".into()),
    }
}

impl CurrentEndpoint {
    /// For detection: the driver's raw answer to a Spec request, whatever its protocol.
    pub(crate) async fn probe(&self) -> Result<cm::Response> {
        self.unary("Spec", translate::spec_request(m::SpecRequest::default()))
            .await
    }
}
