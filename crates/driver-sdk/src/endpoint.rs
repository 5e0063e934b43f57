//! The runtime's view of a driver, whatever the transport (in-process, gRPC, stdio).

use crate::Result;
use crate::hooks::LogHooks;
use async_trait::async_trait;
use futures::stream::BoxStream;
use sluice_proto::materialize as m;
use tokio::sync::mpsc;

/// One Transactions stream: requests go in, responses (or a transport error) come out.
pub struct TransactionStream {
    pub requests: mpsc::Sender<m::TransactionRequest>,
    pub responses: BoxStream<'static, Result<m::TransactionResponse>>,
    /// In process only: the calls beside the protocol ([`crate::traits`]'s "What the
    /// protocol cannot carry"); `None` across the wire.
    pub hooks: Option<LogHooks>,
}

#[async_trait]
pub trait Endpoint: Send + Sync {
    /// A name for logs and errors, e.g. `sqlite` or `command:./my-driver`.
    fn name(&self) -> &str;
    async fn spec(&self, req: m::SpecRequest) -> Result<m::SpecResponse>;
    async fn validate(&self, req: m::ValidateRequest) -> Result<m::ValidateResponse>;
    async fn apply_upsert(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse>;
    async fn apply_delete(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse>;
    /// Starts a Transactions stream. Responses are raw: the client checks them against the
    /// protocol state machine.
    async fn transactions(&self) -> Result<TransactionStream>;
}
