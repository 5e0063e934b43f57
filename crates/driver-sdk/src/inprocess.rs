//! The in-process transport: a Rust driver linked into the binary.
//!
//! Unary calls go straight to the [`Driver`]. A Transactions stream is the serve loop
//! ([`serve_transactions`]) spawned on a task, connected by two bounded channels of
//! unencoded messages: no serialization on the hot path, arenas move by pointer.
//!
//! ```text
//!  client ──mpsc(requests)──▶ serve_transactions task ──mpsc(responses)──▶ client
//!                                      │ returns Err(e)
//!                                      └──────────▶ last item of the response stream
//! ```
//!
//! When the serve loop fails, its error becomes the last item of the response stream,
//! after every response it sent, so the runtime sees the driver's own error (e.g.
//! [`crate::Error::Fenced`]) rather than a bare "stream closed".

use crate::serve::serve_transactions;
use crate::{Driver, Endpoint, Error, Result, TransactionStream};
use async_trait::async_trait;
use futures::StreamExt;
use sluice_proto::materialize as m;
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
        let requests = ReceiverStream::new(req_rx).map(Ok).boxed();
        // In the caller's span: the driver's lines name the materialization it serves.
        let serve = serve_transactions(self.driver.clone(), requests, resp_tx);
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
        })
    }
}
