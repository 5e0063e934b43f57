//! The driver-side loop of one Transactions stream. (stub)

use crate::{Driver, Result};
use futures::stream::BoxStream;
use sluice_proto::materialize as m;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Runs one Transactions stream of `driver`: checks each request against the protocol
/// state machine, calls the transactor, sends responses. Returns Ok when the runtime
/// closes the stream between transactions; any error ends the stream (the transport
/// reports it to the peer) and rolls back the transaction in progress.
pub async fn serve_transactions(
    _driver: Arc<dyn Driver>,
    _requests: BoxStream<'static, Result<m::TransactionRequest>>,
    _responses: mpsc::Sender<m::TransactionResponse>,
) -> Result<()> {
    todo!()
}
