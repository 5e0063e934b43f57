//! The runtime side of a Transactions stream. (stub)
//!
//! Split into a sender and a receiver so a runtime can keep sending Loads while it
//! reads Loaded responses (no deadlock on full channels); both halves share one
//! protocol state machine.

use crate::{Result, TransactionStream};
use sluice_proto::flow;
use sluice_proto::materialize::{
    transaction_request::{Load, Open, Prepare, Store},
    transaction_response::{Loaded, Opened},
};

/// A response, checked against the protocol state machine.
#[derive(Debug)]
pub enum Response {
    Acknowledged,
    Loaded(Loaded),
    Prepared(flow::DriverCheckpoint),
    DriverCommitted,
}

pub struct ClientSender {}
pub struct ClientReceiver {}

/// Sends Open and waits for Opened.
pub async fn open(
    _stream: TransactionStream,
    _open: Open,
) -> Result<(ClientSender, ClientReceiver, Opened)> {
    todo!()
}

impl ClientSender {
    pub async fn acknowledge(&mut self) -> Result<()> {
        todo!()
    }
    pub async fn load(&mut self, _load: Load) -> Result<()> {
        todo!()
    }
    pub async fn prepare(&mut self, _prepare: Prepare) -> Result<()> {
        todo!()
    }
    pub async fn store(&mut self, _store: Store) -> Result<()> {
        todo!()
    }
    pub async fn commit(&mut self) -> Result<()> {
        todo!()
    }
}

impl ClientReceiver {
    /// The next response; an error if the driver broke the protocol or the stream ended.
    pub async fn recv(&mut self) -> Result<Response> {
        todo!()
    }
}
