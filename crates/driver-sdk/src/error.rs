//! Errors of the driver SDK. Each variant says whose fault it is and whether a retry helps.

use std::fmt;

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Which side of the protocol broke it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// The runtime sent a request out of order.
    Runtime,
    /// The driver sent a response out of order.
    Driver,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Peer::Runtime => "runtime",
            Peer::Driver => "driver",
        })
    }
}

/// A message arrived that the protocol does not allow here. Ends the stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("protocol violation by the {peer}: expected {expected}, got {got}")]
pub struct ProtocolError {
    pub peer: Peer,
    /// What the state machine would have accepted, e.g. "Acknowledge, Load or Prepare".
    pub expected: String,
    /// The message that arrived, e.g. "Store".
    pub got: String,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A peer broke the message order. Not retryable: a bug in one of the peers.
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    /// A newer instance of this shard has opened; this one may never commit again.
    #[error("fenced off: {0}")]
    Fenced(String),
    /// The user's configuration (endpoint, resource, field selection) is wrong.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The store failed. `retryable` says whether reopening and retrying may succeed
    /// (e.g. a lost connection) or not (e.g. a constraint violation).
    #[error("{context}: {message}")]
    Store {
        context: String,
        message: String,
        retryable: bool,
    },
    /// The transport failed: connection lost, child process exited, malformed frame.
    #[error("transport: {0}")]
    Transport(String),
}

impl Error {
    /// A store error with the context of the operation that failed.
    pub fn store(context: impl Into<String>, err: impl fmt::Display, retryable: bool) -> Self {
        Error::Store {
            context: context.into(),
            message: err.to_string(),
            retryable,
        }
    }
}
