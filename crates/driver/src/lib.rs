//! The driver SDK: everything between a runtime and a store, on either side of the wire.
//!
//! ```text
//!   runtime ──client──▶ Endpoint (in-process | gRPC | stdio) ──▶ serve loop ──▶ Driver / Transactor
//!            ◀─────────── responses checked by the same protocol state machine ◀──
//! ```
//!
//! - [`traits`]: what a driver author implements ([`Driver`], [`Transactor`]).
//! - [`error`]: errors, including [`ProtocolError`] ("expected X, got Y").
//! - [`endpoint`]: the runtime's view of a driver, whatever the transport.

pub mod endpoint;
pub mod error;
pub mod traits;

pub use endpoint::{Endpoint, TransactionStream};
pub use error::{Error, Peer, ProtocolError, Result};
pub use traits::{CommitPattern, Driver, LoadedSink, PriorState, Transactor};
