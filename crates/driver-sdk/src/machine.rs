//! The Transactions protocol as a pure state machine: no I/O, no async.
//!
//! Both ends of a stream run the same machine over the messages they see in wire order:
//! the driver-side serve loop checks every request it reads and every response it is
//! about to send, and the runtime-side client checks every request before sending it
//! and every response it reads. A message the protocol does not allow in the current
//! state is a [`ProtocolError`] naming the peer at fault, what was expected and what
//! arrived; the stream then ends and the transaction in progress is never committed.
//!
//! ```text
//!  AwaitingOpen ─Open─▶ Opening ─Opened─▶ Loading ◀───────────────────────────────┐
//!                                         │  Acknowledge (exactly once) ─▶ Acknowledged
//!                                         │  Load* (any order with the ack), Loaded*
//!                                         ▼  Prepare (only after Acknowledged)       │
//!                                      Preparing: Loaded* ─▶ Prepared               │
//!                                         ▼                                          │
//!                                      Storing: Store* ─▶ Commit                      │
//!                                         ▼                                          │
//!                                      Committing: Load* of T+1 ─DriverCommitted─────┘
//! ```
//!
//! Invariants checked:
//! - Open and Opened happen once, first. A request has exactly one field set.
//! - Each transaction has exactly one Acknowledge (in the first transaction it
//!   acknowledges the recovered checkpoint), answered by exactly one Acknowledged.
//! - Prepare waits for Acknowledged: the prepare phase begins only once the prior
//!   transaction is both committed and acknowledged.
//! - Loaded answers a Load of the same transaction, and every Loaded precedes Prepared.
//! - Loads of T+1 may be sent as soon as Commit of T is, before DriverCommitted of T is
//!   read (Flow's runtime loops to load while T commits), and while T's acknowledgement
//!   is still in flight. Their Loaded come only after DriverCommitted of T: a Load of
//!   T+1 must read T's stores, which the driver has committed once it says so. The
//!   Acknowledge of T (which follows the runtime's own commit) still waits for
//!   DriverCommitted. The driver-side serve loop reads those Loads only after its commit
//!   of T has returned, so they read committed.
//! - Load and Loaded name an existing, standard-updates binding (delta-updates bindings
//!   are never loaded); Store names an existing binding.

use crate::error::{Peer, ProtocolError};
use sluice_proto::flow;
use sluice_proto::materialize::{
    TransactionRequest, TransactionResponse,
    transaction_request::{Acknowledge, Commit, Load, Open, Prepare, Store},
    transaction_response::{Acknowledged, DriverCommitted, Loaded, Opened},
};
use std::sync::Arc;

/// Builds every protocol error, so all of them read the same way.
pub fn violation(peer: Peer, expected: impl Into<String>, got: impl Into<String>) -> ProtocolError {
    ProtocolError {
        peer,
        expected: expected.into(),
        got: got.into(),
    }
}

/// A [`TransactionRequest`] with exactly one field set.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    Open(Open),
    Load(Load),
    Prepare(Prepare),
    Store(Store),
    Commit,
    Acknowledge,
}

/// A [`TransactionResponse`] with exactly one field set.
#[derive(Debug, Clone, PartialEq)]
pub enum Response {
    Opened(Opened),
    Loaded(Loaded),
    Prepared(flow::DriverCheckpoint),
    /// With the driver's transactional state update, if any (Sluice's extension: the
    /// current protocol's StartedCommit state).
    DriverCommitted(Option<flow::DriverCheckpoint>),
    /// With the driver's non-transactional state update, if any (Sluice's extension:
    /// the current protocol's Acknowledged state).
    Acknowledged(Option<flow::DriverCheckpoint>),
}

impl Request {
    pub fn name(&self) -> &'static str {
        match self {
            Request::Open(_) => "Open",
            Request::Load(_) => "Load",
            Request::Prepare(_) => "Prepare",
            Request::Store(_) => "Store",
            Request::Commit => "Commit",
            Request::Acknowledge => "Acknowledge",
        }
    }
}

impl Response {
    pub fn name(&self) -> &'static str {
        match self {
            Response::Opened(_) => "Opened",
            Response::Loaded(_) => "Loaded",
            Response::Prepared(_) => "Prepared",
            Response::DriverCommitted(_) => "DriverCommitted",
            Response::Acknowledged(_) => "Acknowledged",
        }
    }
}

/// The value of the one field set in a wire message, or the violation naming what is set.
fn exactly_one<T>(
    peer: Peer,
    message: &str,
    fields: Vec<(&str, Option<T>)>,
) -> Result<T, ProtocolError> {
    let set: Vec<(&str, T)> = fields
        .into_iter()
        .filter_map(|(n, v)| Some((n, v?)))
        .collect();
    match <[(&str, T); 1]>::try_from(set) {
        Ok([(_, value)]) => Ok(value),
        Err(set) if set.is_empty() => Err(violation(
            peer,
            format!("a {message} with exactly one field set"),
            format!("an empty {message}"),
        )),
        Err(set) => {
            let names: Vec<&str> = set.iter().map(|(n, _)| *n).collect();
            Err(violation(
                peer,
                format!("a {message} with exactly one field set"),
                format!("a {message} with {} set together", names.join(" and ")),
            ))
        }
    }
}

impl TryFrom<TransactionRequest> for Request {
    type Error = ProtocolError;

    fn try_from(r: TransactionRequest) -> Result<Self, ProtocolError> {
        exactly_one(
            Peer::Runtime,
            "TransactionRequest",
            vec![
                ("open", r.open.map(Request::Open)),
                ("load", r.load.map(Request::Load)),
                ("prepare", r.prepare.map(Request::Prepare)),
                ("store", r.store.map(Request::Store)),
                ("commit", r.commit.map(|_| Request::Commit)),
                ("acknowledge", r.acknowledge.map(|_| Request::Acknowledge)),
            ],
        )
    }
}

impl From<Request> for TransactionRequest {
    fn from(r: Request) -> Self {
        let mut m = TransactionRequest::default();
        match r {
            Request::Open(v) => m.open = Some(v),
            Request::Load(v) => m.load = Some(v),
            Request::Prepare(v) => m.prepare = Some(v),
            Request::Store(v) => m.store = Some(v),
            Request::Commit => m.commit = Some(Commit::default()),
            Request::Acknowledge => m.acknowledge = Some(Acknowledge {}),
        }
        m
    }
}

impl TryFrom<TransactionResponse> for Response {
    type Error = ProtocolError;

    fn try_from(r: TransactionResponse) -> Result<Self, ProtocolError> {
        exactly_one(
            Peer::Driver,
            "TransactionResponse",
            vec![
                ("opened", r.opened.map(Response::Opened)),
                ("loaded", r.loaded.map(Response::Loaded)),
                ("prepared", r.prepared.map(Response::Prepared)),
                (
                    "driver_committed",
                    r.driver_committed
                        .map(|c| Response::DriverCommitted(c.driver_checkpoint)),
                ),
                (
                    "acknowledged",
                    r.acknowledged
                        .map(|a| Response::Acknowledged(a.driver_checkpoint)),
                ),
            ],
        )
    }
}

impl From<Response> for TransactionResponse {
    fn from(r: Response) -> Self {
        let mut m = TransactionResponse::default();
        match r {
            Response::Opened(v) => m.opened = Some(v),
            Response::Loaded(v) => m.loaded = Some(v),
            Response::Prepared(v) => m.prepared = Some(v),
            Response::DriverCommitted(driver_checkpoint) => {
                m.driver_committed = Some(DriverCommitted { driver_checkpoint })
            }
            Response::Acknowledged(driver_checkpoint) => {
                m.acknowledged = Some(Acknowledged { driver_checkpoint })
            }
        }
        m
    }
}

/// Where the one Acknowledge of the current transaction is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ack {
    /// Not sent yet.
    Pending,
    /// Sent; Acknowledged not yet received.
    Sent,
    /// Acknowledged received.
    Done,
}

/// The phase of the stream. `loads` counts the Loads sent in the current transaction;
/// in `Committing`, the Loads of the next one sent before DriverCommitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    AwaitingOpen,
    Opening,
    Loading { ack: Ack, loads: u64 },
    Preparing { loads: u64 },
    Storing,
    Committing { loads: u64 },
}

/// The protocol state of one Transactions stream. Transitions consume the machine and
/// return the next one, or the violation that ends the stream.
#[derive(Debug, Clone)]
pub struct Machine {
    phase: Phase,
    /// Number of the current transaction, from 1 (for error messages).
    txn: u64,
    /// Per binding of the opened materialization: is it delta-updates?
    delta: Arc<[bool]>,
}

impl Default for Machine {
    fn default() -> Self {
        Self::new()
    }
}

impl Machine {
    /// A stream that has not been opened yet.
    pub fn new() -> Self {
        Machine {
            phase: Phase::AwaitingOpen,
            txn: 0,
            delta: Arc::from([]),
        }
    }

    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// True between transactions and during the load phase: closing the stream here
    /// loses nothing, since nothing of the current transaction has been stored.
    pub fn may_close(&self) -> bool {
        matches!(self.phase, Phase::Loading { .. })
    }

    /// The state in words, for errors such as "the stream closed while ...".
    pub fn describe(&self) -> String {
        let t = self.txn;
        match self.phase {
            Phase::AwaitingOpen => "awaiting Open".into(),
            Phase::Opening => "awaiting Opened".into(),
            Phase::Loading { ack: Ack::Sent, .. } => {
                format!("in the load phase of transaction {t}, awaiting Acknowledged")
            }
            Phase::Loading { .. } => format!("in the load phase of transaction {t}"),
            Phase::Preparing { .. } => format!("awaiting Prepared of transaction {t}"),
            Phase::Storing => format!("in the store phase of transaction {t}"),
            Phase::Committing { loads: 0 } => {
                format!("awaiting DriverCommitted of transaction {t}")
            }
            Phase::Committing { .. } => format!(
                "awaiting DriverCommitted of transaction {t}, with Loads of transaction {} sent",
                t + 1
            ),
        }
    }

    fn with(self, phase: Phase) -> Self {
        Machine { phase, ..self }
    }

    /// The runtime sends (or the driver reads) `req`.
    pub fn on_request(self, req: &Request) -> Result<Self, ProtocolError> {
        let got = req.name();
        let err = |expected: &str| Err(violation(Peer::Runtime, expected, got));
        match (self.phase, req) {
            (Phase::AwaitingOpen, Request::Open(open)) => {
                if open.key_begin > open.key_end {
                    return Err(violation(
                        Peer::Runtime,
                        "Open with key_begin <= key_end",
                        format!("Open of [{:08x}, {:08x}]", open.key_begin, open.key_end),
                    ));
                }
                let bindings = open.materialization.as_ref().map(|m| m.bindings.as_slice());
                let delta = bindings
                    .unwrap_or_default()
                    .iter()
                    .map(|b| b.delta_updates)
                    .collect();
                Ok(Machine {
                    phase: Phase::Opening,
                    txn: 0,
                    delta,
                })
            }
            (Phase::AwaitingOpen, _) => err("Open"),
            (Phase::Opening, _) => err("no request before Opened"),

            (
                Phase::Loading {
                    ack: Ack::Pending,
                    loads,
                },
                Request::Acknowledge,
            ) => Ok(self.with(Phase::Loading {
                ack: Ack::Sent,
                loads,
            })),
            (Phase::Loading { ack, loads }, Request::Load(load)) => {
                self.check_loadable(Peer::Runtime, "Load", load.binding)?;
                Ok(self.with(Phase::Loading {
                    ack,
                    loads: loads + 1,
                }))
            }
            (
                Phase::Loading {
                    ack: Ack::Done,
                    loads,
                },
                Request::Prepare(_),
            ) => Ok(self.with(Phase::Preparing { loads })),
            (
                Phase::Loading {
                    ack: Ack::Pending, ..
                },
                _,
            ) => err("Acknowledge or Load"),
            (Phase::Loading { ack: Ack::Sent, .. }, _) => {
                err("Load, or Prepare once Acknowledged has arrived")
            }
            (Phase::Loading { ack: Ack::Done, .. }, _) => err("Load or Prepare"),

            (Phase::Preparing { .. }, _) => err("no request before Prepared"),

            (Phase::Storing, Request::Store(store)) => {
                if store.binding as usize >= self.delta.len() {
                    return Err(self.binding_out_of_range(Peer::Runtime, "Store", store.binding));
                }
                Ok(self)
            }
            (Phase::Storing, Request::Commit) => Ok(self.with(Phase::Committing { loads: 0 })),
            (Phase::Storing, _) => err("Store or Commit"),

            (Phase::Committing { loads }, Request::Load(load)) => {
                self.check_loadable(Peer::Runtime, "Load", load.binding)?;
                Ok(self.with(Phase::Committing { loads: loads + 1 }))
            }
            (Phase::Committing { .. }, _) => err("no request but Load before DriverCommitted"),
        }
    }

    /// The driver sends (or the runtime reads) `resp`.
    pub fn on_response(self, resp: &Response) -> Result<Self, ProtocolError> {
        let got = resp.name();
        let err = |expected: &str| Err(violation(Peer::Driver, expected, got));
        match (self.phase, resp) {
            (Phase::Opening, Response::Opened(_)) => Ok(Machine {
                phase: Phase::Loading {
                    ack: Ack::Pending,
                    loads: 0,
                },
                txn: 1,
                ..self
            }),
            (Phase::Opening, _) => err("Opened"),
            (Phase::AwaitingOpen, _) => err("no response before Open"),

            (
                Phase::Loading {
                    ack: Ack::Sent,
                    loads,
                },
                Response::Acknowledged(_),
            ) => Ok(self.with(Phase::Loading {
                ack: Ack::Done,
                loads,
            })),
            (Phase::Loading { loads, .. } | Phase::Preparing { loads }, Response::Loaded(l))
                if loads > 0 =>
            {
                self.check_loadable(Peer::Driver, "Loaded", l.binding)?;
                Ok(self)
            }
            (Phase::Loading { ack, loads }, _) => err(match (ack, loads > 0) {
                (Ack::Sent, true) => "Acknowledged or Loaded",
                (Ack::Sent, false) => "Acknowledged",
                (_, true) => "Loaded",
                (_, false) => "no response before Acknowledge or Load",
            }),

            (Phase::Preparing { .. }, Response::Prepared(_)) => Ok(self.with(Phase::Storing)),
            (Phase::Preparing { loads }, _) => err(if loads > 0 {
                "Loaded or Prepared"
            } else {
                "Prepared"
            }),

            (Phase::Storing, _) => err("no response before Commit"),

            (Phase::Committing { loads }, Response::DriverCommitted(_)) => Ok(Machine {
                phase: Phase::Loading {
                    ack: Ack::Pending,
                    loads,
                },
                txn: self.txn + 1,
                ..self
            }),
            // Loaded of the next transaction too: it must follow T's commit.
            (Phase::Committing { .. }, _) => err("DriverCommitted"),
        }
    }

    fn check_loadable(&self, peer: Peer, what: &str, binding: u32) -> Result<(), ProtocolError> {
        match self.delta.get(binding as usize) {
            None => Err(self.binding_out_of_range(peer, what, binding)),
            Some(true) => Err(violation(
                peer,
                format!("{what} of a standard-updates binding"),
                format!("{what} of delta-updates binding {binding}"),
            )),
            Some(false) => Ok(()),
        }
    }

    fn binding_out_of_range(&self, peer: Peer, what: &str, binding: u32) -> ProtocolError {
        violation(
            peer,
            format!("{what} of a binding in 0..{}", self.delta.len()),
            format!("{what} of binding {binding}"),
        )
    }
}

/// The bytes a driver returns as `Opened.flow_checkpoint` to ask for a rebuild from an
/// empty checkpoint: the range starts again from the beginning of its sources
/// (`shared/protocol.md`; protobuf tag 2^29-1, varint true).
pub const REBUILD_SENTINEL: [u8; 6] = [0xf8, 0xff, 0xff, 0xff, 0x0f, 0x01];

/// The driver checkpoint after `update` (from Prepared) over `previous` (JSON text;
/// empty means `{}`): an RFC 7396 merge patch when `rfc7396_merge_patch` is set, a full
/// replacement otherwise. Text that is not JSON is the driver's violation.
pub fn apply_driver_checkpoint(
    previous: &[u8],
    update: &flow::DriverCheckpoint,
) -> Result<Vec<u8>, ProtocolError> {
    let parse = |what: &str, bytes: &[u8]| -> Result<serde_json::Value, ProtocolError> {
        let bytes: &[u8] = if bytes.is_empty() { b"{}" } else { bytes };
        serde_json::from_slice(bytes).map_err(|e| {
            violation(
                Peer::Driver,
                format!("a JSON {what} driver checkpoint"),
                format!("invalid JSON ({e})"),
            )
        })
    };
    let patch = parse("updated", &update.driver_checkpoint_json)?;
    let next = if update.rfc7396_merge_patch {
        let mut target = parse("previous", previous)?;
        merge_patch(&mut target, patch);
        target
    } else {
        patch
    };
    Ok(next.to_string().into_bytes())
}

/// RFC 7396: objects merge key by key, `null` removes a key, anything else replaces.
fn merge_patch(target: &mut serde_json::Value, patch: serde_json::Value) {
    let serde_json::Value::Object(patch) = patch else {
        *target = patch;
        return;
    };
    if !target.is_object() {
        *target = serde_json::Value::Object(Default::default());
    }
    if let serde_json::Value::Object(target) = target {
        for (key, value) in patch {
            if value.is_null() {
                target.remove(&key);
            } else {
                merge_patch(target.entry(key).or_insert(serde_json::Value::Null), value);
            }
        }
    }
}
