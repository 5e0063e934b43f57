//! Translation between the seed's protocol (`materialize.Driver`, its `Transactions`
//! stream of arena messages), which the runtime, the serve loop and the state machine
//! speak inside, and Flow's current one (`materialize.Connector/Materialize`, one stream
//! of `Request` and `Response`, one document per message). Pure: no I/O, no async.
//!
//! Each direction of a mapping sits beside its inverse, so a change to one is read
//! against the other: [`spec`] (specs, seed ↔ current), [`unary`] (Spec, Validate,
//! Apply), [`client`] (a Transactions stream, the runtime's side: [`ClientTranslator`]),
//! [`server`] (the driver's side: [`ServerTranslator`]); this module holds what they
//! share (message kinds, checkpoints).
//!
//! ```text
//!  runtime ─seed─▶ ClientTranslator ─current─▶ a current connector
//!  a current runtime ─current─▶ ServerTranslator ─seed─▶ serve loop ─▶ a Sluice Transactor
//! ```
//!
//! | seed (runtime → driver)              | current                                     |
//! |--------------------------------------|---------------------------------------------|
//! | Open                                 | Open (range: r_clock 0..=u32::MAX, state)    |
//! | Opened{flow_checkpoint}              | Opened{runtime_checkpoint} (see below)       |
//! | Acknowledge / Acknowledged           | Acknowledge / Acknowledged (either order)    |
//! | Load (arena of N keys)               | N × Load{key_packed, key_json} (¹)           |
//! | Loaded (arena of N docs)             | N × Loaded{doc_json}                         |
//! | Prepare{flow_checkpoint}             | Flush (the checkpoint is held until Commit)  |
//! | Prepared(DriverCheckpoint)           | Flushed{state}                               |
//! | Store (arena of N docs)              | N × Store (a `null` document: `delete`) (¹)  |
//! | Commit{flow_checkpoint?}             | StartCommit{runtime_checkpoint}              |
//! | DriverCommitted{driver_checkpoint}   | StartedCommit{state}                         |
//!
//! (¹) The driver side packs current Loads and Stores back into arena messages
//! ([`ServerTranslator`]).
//!
//! ## Checkpoints
//!
//! Sluice's runtime checkpoint is opaque bytes; the current protocol's is a Gazette
//! `consumer.Checkpoint`. The client side wraps Sluice's bytes as
//! `Checkpoint{ack_intents: {"sluice": bytes}}` ([`wrap_checkpoint`]) at StartCommit,
//! and unwraps what a connector's Opened returns ([`unwrap_checkpoint`]): none or an
//! empty one is "use the runtime's own", `rebuild_from_zero` is the seed's
//! [`REBUILD_SENTINEL`], and a checkpoint of anyone else (sources, other ack intents)
//! is the connector's protocol error: Sluice cannot resume from a Flow runtime's
//! checkpoint.
//!
//! The server side hands a Sluice driver the encoded `consumer.Checkpoint` it was given
//! at StartCommit, as the seed Commit's `flow_checkpoint` extension (the current
//! protocol has no checkpoint at Flush, so the seed Prepare it makes carries none), and
//! decodes what the driver recovered at Opened as one: the driver stores and returns it
//! unchanged, the rebuild sentinel included (it decodes as `rebuild_from_zero`).
//!
//! ## Order
//!
//! The client side holds a connector's Acknowledged that arrives before the runtime's
//! Acknowledge (Flow allows either order) and hands it back when the runtime's
//! Acknowledge is translated, since the seed machine expects it after. The server side
//! checks the current order strictly, naming current messages, before the serve loop's
//! seed machine sees anything:
//! - Open first and once; no request before Opened.
//! - Each transaction has exactly one Acknowledge, before Flush, and Flush comes only
//!   once Acknowledged was sent (the seed machine: Prepare waits for Acknowledged).
//! - Load only before Flush, or after StartCommit (the next transaction's).
//! - No request between Flush and Flushed; Store only between Flushed and StartCommit.
//! - No request but Load between StartCommit and StartedCommit.

mod client;
mod server;
mod spec;
mod unary;

pub use client::*;
pub use server::*;
pub use spec::*;
pub use unary::*;

use crate::arena;
use crate::error::{Peer, ProtocolError};
use crate::machine::{REBUILD_SENTINEL, violation};
use prost::Message;
use sluice_proto::current::{PROTOCOL, consumer, flow as cf, materialize as cm};
use sluice_proto::flow::{self, Slice};
use sluice_proto::materialize::{
    self as m, TransactionRequest, TransactionResponse, transaction_request as rq,
    transaction_response as rs,
};
use std::collections::BTreeMap;

/// What translating one message gives: `out` goes on to the peer, `back` goes back to
/// whoever sent the message (the client side's held Acknowledged).
#[derive(Debug, Clone, PartialEq)]
pub struct Translated<Out, Back> {
    pub out: Vec<Out>,
    pub back: Vec<Back>,
}

impl<Out, Back> Translated<Out, Back> {
    fn out(out: Vec<Out>) -> Self {
        Translated {
            out,
            back: Vec::new(),
        }
    }

    fn one(out: Out) -> Self {
        Self::out(vec![out])
    }
}

/// The `ack_intents` key under which Sluice's opaque runtime checkpoint travels in a
/// `consumer.Checkpoint`.
pub const CHECKPOINT_KEY: &str = "sluice";

// ---------------------------------------------------------------------------------
// Message kinds, with their names for errors.

/// A current `Request` with exactly one field set (`internal` aside).
enum Req {
    Spec(cm::request::Spec),
    Validate(cm::request::Validate),
    Apply(cm::request::Apply),
    Open(cm::request::Open),
    Load(cm::request::Load),
    Flush,
    Store(cm::request::Store),
    StartCommit(cm::request::StartCommit),
    Acknowledge,
}

impl Req {
    fn name(&self) -> &'static str {
        match self {
            Req::Spec(_) => "Spec",
            Req::Validate(_) => "Validate",
            Req::Apply(_) => "Apply",
            Req::Open(_) => "Open",
            Req::Load(_) => "Load",
            Req::Flush => "Flush",
            Req::Store(_) => "Store",
            Req::StartCommit(_) => "StartCommit",
            Req::Acknowledge => "Acknowledge",
        }
    }

    fn of(r: cm::Request) -> Result<Req, ProtocolError> {
        one_of(
            Peer::Runtime,
            "Request",
            vec![
                ("spec", r.spec.map(Req::Spec)),
                ("validate", r.validate.map(Req::Validate)),
                ("apply", r.apply.map(Req::Apply)),
                ("open", r.open.map(Req::Open)),
                ("load", r.load.map(Req::Load)),
                ("flush", r.flush.map(|_| Req::Flush)),
                ("store", r.store.map(Req::Store)),
                ("start_commit", r.start_commit.map(Req::StartCommit)),
                ("acknowledge", r.acknowledge.map(|_| Req::Acknowledge)),
            ],
        )
    }
}

/// A current `Response` with exactly one field set (`internal` aside). Moved once per
/// message: boxing the rare large Spec would allocate on the hot path.
#[allow(clippy::large_enum_variant)]
enum Resp {
    Spec(cm::response::Spec),
    Validated(cm::response::Validated),
    Applied(cm::response::Applied),
    Opened(cm::response::Opened),
    Loaded(cm::response::Loaded),
    Flushed(cm::response::Flushed),
    StartedCommit(cm::response::StartedCommit),
    Acknowledged(cm::response::Acknowledged),
}

impl Resp {
    fn name(&self) -> &'static str {
        match self {
            Resp::Spec(_) => "Spec",
            Resp::Validated(_) => "Validated",
            Resp::Applied(_) => "Applied",
            Resp::Opened(_) => "Opened",
            Resp::Loaded(_) => "Loaded",
            Resp::Flushed(_) => "Flushed",
            Resp::StartedCommit(_) => "StartedCommit",
            Resp::Acknowledged(_) => "Acknowledged",
        }
    }

    fn of(r: cm::Response) -> Result<Resp, ProtocolError> {
        one_of(
            Peer::Driver,
            "Response",
            vec![
                ("spec", r.spec.map(Resp::Spec)),
                ("validated", r.validated.map(Resp::Validated)),
                ("applied", r.applied.map(Resp::Applied)),
                ("opened", r.opened.map(Resp::Opened)),
                ("loaded", r.loaded.map(Resp::Loaded)),
                ("flushed", r.flushed.map(Resp::Flushed)),
                ("started_commit", r.started_commit.map(Resp::StartedCommit)),
                ("acknowledged", r.acknowledged.map(Resp::Acknowledged)),
            ],
        )
    }
}

fn one_of<T>(
    peer: Peer,
    message: &str,
    fields: Vec<(&str, Option<T>)>,
) -> Result<T, ProtocolError> {
    let mut set: Vec<(&str, T)> = fields
        .into_iter()
        .filter_map(|(n, v)| Some((n, v?)))
        .collect();
    match set.len() {
        1 => Ok(set.pop().expect("one").1),
        0 => Err(violation(
            peer,
            format!("a {message} with exactly one field set"),
            format!("an empty {message}"),
        )),
        _ => {
            let names: Vec<&str> = set.iter().map(|(n, _)| *n).collect();
            Err(violation(
                peer,
                format!("a {message} with exactly one field set"),
                format!("a {message} with {} set together", names.join(" and ")),
            ))
        }
    }
}

fn request_of(set: impl FnOnce(&mut cm::Request)) -> cm::Request {
    let mut r = cm::Request::default();
    set(&mut r);
    r
}

fn response_of(set: impl FnOnce(&mut cm::Response)) -> cm::Response {
    let mut r = cm::Response::default();
    set(&mut r);
    r
}

fn seed_request(r: crate::machine::Request) -> TransactionRequest {
    r.into()
}

// ---------------------------------------------------------------------------------
// Checkpoints.

/// Sluice's opaque runtime checkpoint as a `consumer.Checkpoint`.
pub fn wrap_checkpoint(bytes: Vec<u8>) -> consumer::Checkpoint {
    consumer::Checkpoint {
        ack_intents: [(CHECKPOINT_KEY.to_string(), bytes)].into(),
        ..Default::default()
    }
}

/// The seed `Opened.flow_checkpoint` for a current connector's Opened checkpoint: see
/// the module docs. Anything but none, an empty one, the rebuild sentinel or one
/// [`wrap_checkpoint`] made is the connector's violation.
pub fn unwrap_checkpoint(
    checkpoint: Option<consumer::Checkpoint>,
) -> Result<Vec<u8>, ProtocolError> {
    let Some(mut cp) = checkpoint else {
        return Ok(Vec::new());
    };
    if cp == consumer::Checkpoint::default() {
        return Ok(Vec::new());
    }
    if cp.rebuild_from_zero && cp.sources.is_empty() && cp.ack_intents.is_empty() {
        return Ok(REBUILD_SENTINEL.to_vec());
    }
    if !cp.rebuild_from_zero
        && cp.sources.is_empty()
        && cp.ack_intents.len() == 1
        && let Some(bytes) = cp.ack_intents.remove(CHECKPOINT_KEY)
    {
        return Ok(bytes);
    }
    let mut carried: Vec<String> = cp.sources.keys().map(|s| format!("source {s:?}")).collect();
    carried.extend(cp.ack_intents.keys().map(|k| format!("ack intent {k:?}")));
    if cp.rebuild_from_zero {
        carried.push("rebuild_from_zero".into());
    }
    Err(violation(
        Peer::Driver,
        format!(
            "Opened with no checkpoint, the rebuild sentinel, or the one Sluice wrote \
             (ack intent {CHECKPOINT_KEY:?} alone)"
        ),
        format!("Opened carrying a checkpoint of {}", carried.join(", ")),
    ))
}

/// A driver checkpoint as a connector's state: no checkpoint yet is the empty state
/// `{}` (Flow always sends a JSON state, and a connector may parse it unconditionally).
fn state_or_empty(checkpoint: Vec<u8>) -> Vec<u8> {
    if checkpoint.is_empty() {
        b"{}".to_vec()
    } else {
        checkpoint
    }
}

/// Whether a driver checkpoint update changes nothing: `{}` (or nothing) as a merge
/// patch.
fn is_no_change(update: &flow::DriverCheckpoint) -> bool {
    let text = update.driver_checkpoint_json.trim_ascii();
    update.rfc7396_merge_patch && (text.is_empty() || text == b"{}")
}

/// A seed driver checkpoint update as a current state update (`None`: no change).
pub fn state_of(update: flow::DriverCheckpoint) -> Option<cf::ConnectorState> {
    if is_no_change(&update) {
        return None;
    }
    Some(cf::ConnectorState {
        updated_json: update.driver_checkpoint_json,
        merge_patch: update.rfc7396_merge_patch,
    })
}

/// A current state update as a seed driver checkpoint update (`None`: `{}` as a merge
/// patch, no change).
pub fn driver_checkpoint_of(state: Option<cf::ConnectorState>) -> flow::DriverCheckpoint {
    match state {
        Some(s) => flow::DriverCheckpoint {
            driver_checkpoint_json: s.updated_json,
            rfc7396_merge_patch: s.merge_patch,
        },
        None => flow::DriverCheckpoint {
            driver_checkpoint_json: b"{}".to_vec(),
            rfc7396_merge_patch: true,
        },
    }
}
