//! The runtime side of a Transactions stream.
//!
//! Split into a sender and a receiver so a runtime can keep sending Loads while it
//! reads Loaded responses (no deadlock on full channels); both halves share one
//! protocol state machine behind a mutex, held only for a transition, never across an
//! await.
//!
//! A request is checked and recorded in the machine *before* it goes on the wire, so a
//! response to it can never be judged against a state that has not seen the request.
//! Every response is checked as it is read. After any error the stream is broken: every
//! later call on either half fails, naming the first error.

use crate::machine::{Machine, Request, Response as Checked, violation};
use crate::{Error, Peer, Result, TransactionStream};
use futures::StreamExt;
use futures::stream::BoxStream;
use sluice_proto::flow;
use sluice_proto::materialize::{
    self as m,
    transaction_request::{Load, Open, Prepare, Store},
    transaction_response::{Loaded, Opened},
};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// A response, checked against the protocol state machine.
#[derive(Debug)]
pub enum Response {
    Acknowledged,
    Loaded(Loaded),
    Prepared(flow::DriverCheckpoint),
    DriverCommitted,
}

/// The machine both halves share; `Err` once the stream is broken.
type Shared = Arc<Mutex<std::result::Result<Machine, String>>>;

/// Applies one transition to the shared machine. On a violation the stream is broken.
fn transition(
    shared: &Shared,
    step: impl FnOnce(Machine) -> std::result::Result<Machine, crate::ProtocolError>,
) -> Result<()> {
    let mut slot = shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let machine = match std::mem::replace(&mut *slot, Err(String::new())) {
        Ok(machine) => machine,
        Err(first) => {
            *slot = Err(first.clone());
            return Err(Error::Transport(format!(
                "the stream failed earlier: {first}"
            )));
        }
    };
    match step(machine) {
        Ok(next) => {
            *slot = Ok(next);
            Ok(())
        }
        Err(e) => {
            *slot = Err(e.to_string());
            Err(e.into())
        }
    }
}

/// Marks the stream broken by `err` (unless it already is) and returns `err`.
fn break_with(shared: &Shared, err: Error) -> Error {
    let mut slot = shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if slot.is_ok() {
        *slot = Err(err.to_string());
    }
    err
}

/// The state in words for an error, e.g. "awaiting Prepared of transaction 3".
fn describe(shared: &Shared) -> String {
    match &*shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
    {
        Ok(machine) => machine.describe(),
        Err(first) => format!("after an earlier failure ({first})"),
    }
}

pub struct ClientSender {
    requests: mpsc::Sender<m::TransactionRequest>,
    shared: Shared,
}

pub struct ClientReceiver {
    responses: BoxStream<'static, Result<m::TransactionResponse>>,
    shared: Shared,
}

/// Sends Open and waits for Opened.
pub async fn open(
    stream: TransactionStream,
    open: Open,
) -> Result<(ClientSender, ClientReceiver, Opened)> {
    let shared: Shared = Arc::new(Mutex::new(Ok(Machine::new())));
    let mut sender = ClientSender {
        requests: stream.requests,
        shared: shared.clone(),
    };
    let mut receiver = ClientReceiver {
        responses: stream.responses,
        shared,
    };
    sender.send(Request::Open(open)).await?;
    match receiver.next().await? {
        Checked::Opened(opened) => Ok((sender, receiver, opened)),
        // Not reached: the machine accepts only Opened after Open.
        other => Err(violation(Peer::Driver, "Opened", other.name()).into()),
    }
}

impl ClientSender {
    /// Tells the driver the prior commit (or, first, the recovered checkpoint) is durable.
    pub async fn acknowledge(&mut self) -> Result<()> {
        self.send(Request::Acknowledge).await
    }
    pub async fn load(&mut self, load: Load) -> Result<()> {
        self.send(Request::Load(load)).await
    }
    /// Only after Acknowledged of this transaction has been received.
    pub async fn prepare(&mut self, prepare: Prepare) -> Result<()> {
        self.send(Request::Prepare(prepare)).await
    }
    pub async fn store(&mut self, store: Store) -> Result<()> {
        self.send(Request::Store(store)).await
    }
    pub async fn commit(&mut self) -> Result<()> {
        self.send(Request::Commit).await
    }

    async fn send(&mut self, req: Request) -> Result<()> {
        let name = req.name();
        transition(&self.shared, |machine| machine.on_request(&req))?;
        if self.requests.send(req.into()).await.is_err() {
            let state = describe(&self.shared);
            let err = Error::Transport(format!(
                "the driver closed the Transactions stream before {name} could be sent \
                 ({state}); its error, if any, is the next response"
            ));
            return Err(break_with(&self.shared, err));
        }
        Ok(())
    }
}

impl ClientReceiver {
    /// The next response; an error if the driver broke the protocol or the stream ended.
    pub async fn recv(&mut self) -> Result<Response> {
        match self.next().await? {
            Checked::Acknowledged => Ok(Response::Acknowledged),
            Checked::Loaded(loaded) => Ok(Response::Loaded(loaded)),
            Checked::Prepared(checkpoint) => Ok(Response::Prepared(checkpoint)),
            Checked::DriverCommitted => Ok(Response::DriverCommitted),
            // Not reached: the machine accepts Opened only once, first.
            Checked::Opened(_) => Err(violation(Peer::Driver, "no second Opened", "Opened").into()),
        }
    }

    /// Reads and checks one response. Errors of the driver itself (a fenced commit, a
    /// store failure) pass through unchanged so the runtime can act on them; a closed
    /// stream or transport failure says what the stream was doing.
    async fn next(&mut self) -> Result<Checked> {
        let raw = match self.responses.next().await {
            Some(Ok(raw)) => raw,
            Some(Err(Error::Transport(message))) => {
                let state = describe(&self.shared);
                let err = Error::Transport(format!("{message} ({state})"));
                return Err(break_with(&self.shared, err));
            }
            Some(Err(err)) => return Err(break_with(&self.shared, err)),
            None => {
                let state = describe(&self.shared);
                let err =
                    Error::Transport(format!("the driver closed the Transactions stream {state}"));
                return Err(break_with(&self.shared, err));
            }
        };
        let resp = Checked::try_from(raw).map_err(|e| break_with(&self.shared, e.into()))?;
        transition(&self.shared, |machine| machine.on_response(&resp))?;
        Ok(resp)
    }
}
