//! The driver SDK: everything between a runtime and a store, on either side of the wire.
//! A driver crate depends on this crate alone for the protocol: it re-exports the wire
//! types ([`flow`], [`materialize`]).
//!
//! ```text
//!   runtime ──client──▶ Endpoint (in-process | gRPC | stdio) ──▶ serve loop ──▶ Driver / Transactor
//!            ◀─────────── responses checked by the same protocol state machine ◀──
//! ```
//!
//! - [`traits`]: what a driver author implements ([`Driver`], [`Transactor`]).
//! - [`machine`]: the protocol state machine, pure, shared by both sides.
//! - [`arena`]: building and reading arena + slices messages.
//! - [`serve`]: the driver-side loop that runs a [`Transactor`] under the state machine.
//! - [`client`]: the runtime side of a Transactions stream.
//! - [`endpoint`], [`inprocess`], [`grpc`], [`stdio`]: transports; [`hooks`]: the
//!   in-process calls beside the protocol.
//! - [`fence`]: an authoritative store's claim on its key range and the fenced commit.
//! - [`contract`]: what an epoch sink declares for admission.
//!
//! Elsewhere: the reference driver is `sluice-memory`, what table-writing drivers share
//! is `sluice-sqlkit`, and the scenarios every driver passes are `sluice-conformance`.

pub mod arena;
pub mod client;
pub mod contract;
pub mod current;
pub mod endpoint;
pub mod error;
pub mod fence;
pub mod grpc;
pub mod hooks;
pub mod inprocess;
pub mod machine;
pub mod serve;
pub mod stdio;
pub mod traits;
pub mod validate;

pub use sluice_proto::{flow, materialize};

pub use endpoint::{Endpoint, TransactionStream};
pub use error::{Error, Peer, ProtocolError, RemoteKind, Result};
pub use hooks::LogHooks;
pub use inprocess::{Builtin, BuiltinKind};
pub use sluice_config::InvalidConfig;
pub use sluice_report::{HealthState, Metric, MetricKind, Report};
pub use traits::{
    CommitPattern, Declared, Driver, LoadedSink, LogContext, PriorState, Transactor, Undecided,
};
