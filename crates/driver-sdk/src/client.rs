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
//!
//! Timeouts: no call waits longer than the stream's `timeout` for the driver.
//! - A send waits at most that long for the driver to take the request (a driver that
//!   stopped reading fills the channel).
//! - A receive waits at most that long, counted from the stream's last message in
//!   either direction, but only while the protocol says the driver owes an answer
//!   (`owed`: Opened, Acknowledged, Loaded or Prepared after Prepare, DriverCommitted).
//!   During the load phase a driver may hold its Loaded responses until Prepare, so a
//!   long drain of the runtime's own combiner never counts against the driver; every
//!   request sent wakes a waiting receiver to re-read what is owed.
//!
//! The timeout bounds the wait for the next message, not a whole transaction: a large
//! but healthy transaction, whose driver keeps answering, never trips it.

use crate::error::within;
use crate::machine::{Ack, Machine, Phase, Request, Response as Checked, violation};
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
use std::time::Duration;
use tokio::sync::{Notify, mpsc};
use tokio::time::Instant;

/// A response, checked against the protocol state machine.
#[derive(Debug)]
pub enum Response {
    /// With the driver's non-transactional state update, if any.
    Acknowledged(Option<flow::DriverCheckpoint>),
    Loaded(Loaded),
    Prepared(flow::DriverCheckpoint),
    /// With the driver's transactional state update, if any.
    DriverCommitted(Option<flow::DriverCheckpoint>),
}

impl Response {
    /// The message's name, as protocol errors spell it.
    pub fn name(&self) -> &'static str {
        match self {
            Response::Acknowledged(_) => "Acknowledged",
            Response::Loaded(_) => "Loaded",
            Response::Prepared(_) => "Prepared",
            Response::DriverCommitted(_) => "DriverCommitted",
        }
    }
}

/// What both halves share.
struct Shared {
    stream: Mutex<StreamState>,
    /// Woken at every request sent: it may make an answer owed (see the module docs).
    sent: Notify,
    timeout: Duration,
}

struct StreamState {
    /// `Err` (the first error) once the stream is broken.
    machine: std::result::Result<Machine, String>,
    /// The last message of the stream, in either direction.
    last_message: Instant,
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, StreamState> {
        self.stream
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Applies one transition to the machine. On a violation the stream is broken.
    fn transition(
        &self,
        step: impl FnOnce(Machine) -> std::result::Result<Machine, crate::ProtocolError>,
    ) -> Result<()> {
        let mut state = self.lock();
        let machine = match std::mem::replace(&mut state.machine, Err(String::new())) {
            Ok(machine) => machine,
            Err(first) => {
                state.machine = Err(first.clone());
                return Err(Error::Transport(format!(
                    "the stream failed earlier: {first}"
                )));
            }
        };
        match step(machine) {
            Ok(next) => {
                state.machine = Ok(next);
                state.last_message = Instant::now();
                Ok(())
            }
            Err(e) => {
                state.machine = Err(e.to_string());
                Err(e.into())
            }
        }
    }

    /// Marks the stream broken by `err` (unless it already is) and returns `err`.
    fn break_with(&self, err: Error) -> Error {
        let mut state = self.lock();
        if state.machine.is_ok() {
            state.machine = Err(err.to_string());
        }
        err
    }

    /// The state in words for an error, e.g. "awaiting Prepared of transaction 3".
    fn describe(&self) -> String {
        match &self.lock().machine {
            Ok(machine) => machine.describe(),
            Err(first) => format!("after an earlier failure ({first})"),
        }
    }

    /// What the driver owes now, and by when it must send its next message.
    fn deadline(&self) -> Option<(&'static str, Instant)> {
        let state = self.lock();
        let owed = owed(state.machine.as_ref().ok()?.phase())?;
        Some((owed, state.last_message + self.timeout))
    }
}

/// The response the driver owes in `phase`, if any. In the load phase a driver may hold
/// its Loaded responses until Prepare, so only the Acknowledged is owed there.
fn owed(phase: Phase) -> Option<&'static str> {
    match phase {
        Phase::Opening => Some("Opened"),
        Phase::Loading { ack: Ack::Sent, .. } => Some("Acknowledged"),
        Phase::Preparing { loads: 0 } => Some("Prepared"),
        Phase::Preparing { .. } => Some("Loaded or Prepared"),
        Phase::Committing { .. } => Some("DriverCommitted"),
        Phase::AwaitingOpen | Phase::Loading { .. } | Phase::Storing => None,
    }
}

pub struct ClientSender {
    requests: mpsc::Sender<m::TransactionRequest>,
    shared: Arc<Shared>,
}

pub struct ClientReceiver {
    responses: BoxStream<'static, Result<m::TransactionResponse>>,
    shared: Arc<Shared>,
}

/// Sends Open and waits for Opened. No call on the stream waits longer than `timeout`
/// for the driver (see the module docs).
pub async fn open(
    stream: TransactionStream,
    open: Open,
    timeout: Duration,
) -> Result<(ClientSender, ClientReceiver, Opened)> {
    let shared = Arc::new(Shared {
        stream: Mutex::new(StreamState {
            machine: Ok(Machine::new()),
            last_message: Instant::now(),
        }),
        sent: Notify::new(),
        timeout,
    });
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
        self.shared.transition(|machine| machine.on_request(&req))?;
        let (shared, requests) = (&self.shared, &self.requests);
        within(
            shared.timeout,
            || format!("the driver to take {name} ({})", shared.describe()),
            async {
                requests.send(req.into()).await.map_err(|_| {
                    Error::Transport(format!(
                        "the driver closed the Transactions stream before {name} could be \
                         sent ({}); its error, if any, is the next response",
                        shared.describe()
                    ))
                })
            },
        )
        .await
        .map_err(|err| shared.break_with(err))?;
        shared.lock().last_message = Instant::now();
        shared.sent.notify_waiters();
        Ok(())
    }
}

impl ClientReceiver {
    /// The next response; an error if the driver broke the protocol or the stream ended.
    pub async fn recv(&mut self) -> Result<Response> {
        match self.next().await? {
            Checked::Acknowledged(state) => Ok(Response::Acknowledged(state)),
            Checked::Loaded(loaded) => Ok(Response::Loaded(loaded)),
            Checked::Prepared(checkpoint) => Ok(Response::Prepared(checkpoint)),
            Checked::DriverCommitted(state) => Ok(Response::DriverCommitted(state)),
            // Not reached: the machine accepts Opened only once, first.
            Checked::Opened(_) => Err(violation(Peer::Driver, "no second Opened", "Opened").into()),
        }
    }

    /// Reads and checks one response. Errors of the driver itself (a fenced commit, a
    /// store failure) pass through unchanged so the runtime can act on them; a closed
    /// stream or transport failure says what the stream was doing.
    async fn next(&mut self) -> Result<Checked> {
        let shared = &self.shared;
        let next = loop {
            // Created before the deadline is read, so a request sent in between wakes it.
            let sent = shared.sent.notified();
            let deadline = shared.deadline();
            let expired = async {
                match deadline {
                    Some((_, at)) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                // A response that has arrived always wins over an expired deadline (the
                // runtime may read late, e.g. an Acknowledged after an idle spell).
                biased;
                // `next` is cancel-safe: a response is never lost to another branch.
                next = self.responses.next() => break next,
                () = sent => {}
                () = expired => {
                    let (owed, _) = deadline.expect("expires only with a deadline");
                    let err = Error::Timeout {
                        waiting_for: format!("{owed} ({})", shared.describe()),
                        after: shared.timeout,
                    };
                    return Err(shared.break_with(err));
                }
            }
        };
        let raw = match next {
            Some(Ok(raw)) => raw,
            Some(Err(Error::Transport(message))) => {
                let err = Error::Transport(format!("{message} ({})", shared.describe()));
                return Err(shared.break_with(err));
            }
            Some(Err(err)) => return Err(shared.break_with(err)),
            None => {
                let err = Error::Transport(format!(
                    "the driver closed the Transactions stream {}",
                    shared.describe()
                ));
                return Err(shared.break_with(err));
            }
        };
        let resp = Checked::try_from(raw).map_err(|e| shared.break_with(e.into()))?;
        shared.transition(|machine| machine.on_response(&resp))?;
        Ok(resp)
    }
}
