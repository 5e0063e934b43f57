//! Flow's current materialization protocol (`materialize.Connector/Materialize`), spoken
//! at the edge by translation to and from the seed's protocol, which stays the one
//! state machine inside.
//!
//! ```text
//!  runtime ──seed──▶ CurrentEndpoint ──ClientTranslator──▶ Transport ──cm::Request──▶ driver
//!                    (Endpoint)       ◀─────────────────── (gRPC | command) ◀─cm::Response─
//!
//!  peer ──cm::Request──▶ serve_current ──ServerTranslator──▶ serve_transactions ──▶ Driver
//!       ◀─cm::Response── (CurrentServer over gRPC, serve_current_stdio over stdio)
//! ```
//!
//! - [`translate`], [`json`]: the pure translation of each message, and the JSON codec.
//! - [`endpoint`]: [`endpoint::CurrentEndpoint`], the runtime's [`crate::Endpoint`] for
//!   a current driver over any [`endpoint::Transport`] (one stream per call: Spec,
//!   Validate and Apply are a stream of one request and one response), and
//!   [`endpoint::Detecting`], which asks a driver of unknown protocol for its Spec once,
//!   before the first call, and speaks what it answered.
//! - [`grpc`]: the transport over gRPC, its server ([`grpc::CurrentServer`]) and its
//!   detection (an `Unimplemented` status is a seed driver).
//! - [`stdio`]: the transport to a child process (`PROGRAM ARGS…`, no sub-command: the
//!   first request says what is asked), in either [`Codec`], its driver side
//!   ([`stdio::serve_current_stdio`]) and its detection (a current Spec, else the seed's
//!   `PROGRAM spec`).
//! - [`serve`]: the driver side, whatever the transport: the first request decides
//!   (Spec, Validate, Apply: answered once; Open: a session of the seed's serve loop,
//!   wrapped, not duplicated), and [`serve::relay`], the one pump that carries a
//!   Transactions session through a translator on either side.
//!
//! Invariants:
//! - Messages keep their order: each translator sees requests and responses in wire
//!   order, and what it hands back (`back`) enters the stream it belongs to in that same
//!   order.
//! - A translation error ends the session with that error (a [`crate::ProtocolError`]
//!   naming the message), before anything after it is sent on.

pub mod endpoint;
pub mod grpc;
pub mod json;
pub mod serve;
pub mod stdio;
pub mod translate;

use serde::{Deserialize, Serialize};
use std::fmt;

/// Which protocol a driver speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// Flow's current protocol: `materialize.Connector/Materialize`.
    Current,
    /// The seed's: `materialize.Driver` and its `Transactions` stream (or a stdio
    /// driver's sub-commands).
    Transactions,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Current => "current",
            Protocol::Transactions => "transactions",
        }
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Protocol {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "current" => Ok(Protocol::Current),
            "transactions" => Ok(Protocol::Transactions),
            _ => Err(format!(
                "unknown protocol {s:?}; expected current or transactions"
            )),
        }
    }
}

/// How a current-protocol stdio driver writes its messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Codec {
    /// Each message a little-endian u32 length, then its protobuf encoding (the frames
    /// of [`crate::stdio`]).
    #[default]
    Proto,
    /// One JSON object a line ([`json`]).
    Json,
}

impl Codec {
    pub fn as_str(self) -> &'static str {
        match self {
            Codec::Proto => "proto",
            Codec::Json => "json",
        }
    }
}

impl fmt::Display for Codec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Codec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "proto" => Ok(Codec::Proto),
            "json" => Ok(Codec::Json),
            _ => Err(format!("unknown codec {s:?}; expected proto or json")),
        }
    }
}
