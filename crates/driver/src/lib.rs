//! The driver SDK: everything between a runtime and a store, on either side of the wire.
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
//! - [`endpoint`], [`inprocess`], [`grpc`], [`stdio`]: transports.
//! - [`memory`]: the reference in-memory driver.
//! - [`conformance`]: the scenario matrix every driver must pass.
//! - [`config`], [`validate`], [`sql`]: what table-writing drivers share (strict config
//!   parsing, Validate's constraints, unpacking, checkpoints, bulk-load row text).
//! - `testing` (feature `testing`): fixtures for those drivers' tests.

pub mod arena;
pub mod client;
pub mod config;
pub mod conformance;
pub mod endpoint;
pub mod error;
pub mod grpc;
pub mod inprocess;
pub mod machine;
pub mod memory;
pub mod serve;
pub mod sql;
pub mod stdio;
#[cfg(feature = "testing")]
pub mod testing;
pub mod traits;
pub mod validate;

pub use endpoint::{Endpoint, TransactionStream};
pub use error::{Error, Peer, ProtocolError, Result};
pub use traits::{CommitPattern, Driver, LoadedSink, PriorState, Transactor};
