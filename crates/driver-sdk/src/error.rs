//! Errors of the driver SDK. Each variant says whose fault it is and whether a retry
//! helps ([`Error::is_retryable`]): the runtime reopens a stream only after a failure
//! that says so, and fails fast on the others.

use std::fmt;
use std::time::Duration;

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

/// The kinds of error a remote driver can report, each decoded as the same [`Error`]
/// variant on the runtime's side ([`Error::remote`], [`Error::from_remote`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteKind {
    Malformed,
    Timeout,
    Fenced,
    Config,
    /// Retryable: the transport, or a store failure the store calls transient.
    Unavailable,
    /// A store failure that a retry would meet again.
    Store,
}

impl RemoteKind {
    const ALL: [RemoteKind; 6] = [
        RemoteKind::Malformed,
        RemoteKind::Timeout,
        RemoteKind::Fenced,
        RemoteKind::Config,
        RemoteKind::Unavailable,
        RemoteKind::Store,
    ];

    /// The kind's name in a stdio driver's error line.
    pub fn name(self) -> &'static str {
        match self {
            RemoteKind::Malformed => "malformed",
            RemoteKind::Timeout => "timeout",
            RemoteKind::Fenced => "fenced",
            RemoteKind::Config => "config",
            RemoteKind::Unavailable => "unavailable",
            RemoteKind::Store => "store",
        }
    }

    pub fn from_name(name: &str) -> Option<RemoteKind> {
        RemoteKind::ALL.into_iter().find(|kind| kind.name() == name)
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
    /// The transport failed: connection lost, child process exited. Retryable.
    #[error("transport: {0}")]
    Transport(String),
    /// A message arrived that cannot be read (a slice outside its arena, a document that
    /// is not JSON), or the remote peer reported a protocol violation: a bug of the
    /// peer that sent it. Not retryable: the same message would come again.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// Nothing came within `after` while waiting for `waiting_for` (an answer, or the
    /// peer taking a request; see [`within`]). Retryable: a hung store or a stalled
    /// connection may recover, and a reopened stream starts from what was committed.
    #[error("timed out after {after:?} waiting for {waiting_for}")]
    Timeout {
        waiting_for: String,
        after: Duration,
    },
}

impl Error {
    /// Whether reopening the stream and retrying may succeed: a lost connection, a
    /// timeout, or a store failure the store calls transient. A protocol violation, a
    /// malformed message, a configuration error and a fenced-off instance fail the same
    /// way again.
    pub fn is_retryable(&self) -> bool {
        match self {
            Error::Transport(_) | Error::Timeout { .. } => true,
            Error::Store { retryable, .. } => *retryable,
            Error::Protocol(_) | Error::Fenced(_) | Error::Config(_) | Error::Malformed(_) => false,
        }
    }

    /// The error as it crosses a process boundary (a gRPC status, a stdio driver's
    /// error line): its kind and message. [`Error::from_remote`] is its inverse.
    pub fn remote(&self) -> (RemoteKind, String) {
        let kind = match self {
            Error::Protocol(_) | Error::Malformed(_) => RemoteKind::Malformed,
            Error::Timeout { .. } => RemoteKind::Timeout,
            Error::Fenced(_) => RemoteKind::Fenced,
            Error::Config(_) => RemoteKind::Config,
            Error::Store {
                retryable: true, ..
            }
            | Error::Transport(_) => RemoteKind::Unavailable,
            Error::Store { .. } => RemoteKind::Store,
        };
        let message = match self {
            // The inner message only, so the variant's prefix is not doubled on return.
            Error::Fenced(message) | Error::Config(message) => message.clone(),
            other => other.to_string(),
        };
        (kind, message)
    }

    /// The error a remote driver `peer` reported, by its kind: a fenced commit is
    /// [`Error::Fenced`] again, whatever carried it.
    pub fn from_remote(kind: RemoteKind, peer: &str, message: String) -> Error {
        match kind {
            RemoteKind::Fenced => Error::Fenced(message),
            RemoteKind::Config => Error::Config(message),
            RemoteKind::Store => Error::store(peer, message, false),
            // A violation or malformed message the driver found: deterministic, as it is.
            RemoteKind::Malformed => Error::Malformed(format!("{peer}: {message}")),
            RemoteKind::Timeout | RemoteKind::Unavailable => {
                Error::Transport(format!("{peer}: {message}"))
            }
        }
    }

    /// A store error with the context of the operation that failed.
    pub fn store(context: impl Into<String>, err: impl fmt::Display, retryable: bool) -> Self {
        Error::Store {
            context: context.into(),
            message: err.to_string(),
            retryable,
        }
    }
}

/// `call`, or [`Error::Timeout`] if it has not returned within `after`: how every call
/// to a driver is bounded. `waiting_for` names the call for the error ("Spec", "the
/// driver to take Store").
pub async fn within<T>(
    after: Duration,
    waiting_for: impl FnOnce() -> String,
    call: impl Future<Output = Result<T>>,
) -> Result<T> {
    match tokio::time::timeout(after, call).await {
        Ok(result) => result,
        Err(_) => Err(Error::Timeout {
            waiting_for: waiting_for(),
            after,
        }),
    }
}

/// An error and its causes on one line, `: `-separated, skipping a cause whose text
/// the line already holds (tonic's and the database clients' own messages are terse).
pub fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind, and whether a retry may help: decided here, where the error is born.
    #[test]
    fn only_transient_failures_are_retryable() {
        let cases = [
            (Error::Transport("connection reset".into()), true),
            (
                Error::Timeout {
                    waiting_for: "Prepared".into(),
                    after: Duration::from_secs(300),
                },
                true,
            ),
            (Error::store("committing", "connection lost", true), true),
            (Error::store("storing", "unique violation", false), false),
            (
                Error::Protocol(ProtocolError {
                    peer: Peer::Driver,
                    expected: "Prepared".into(),
                    got: "DriverCommitted".into(),
                }),
                false,
            ),
            (Error::Fenced("a newer instance opened".into()), false),
            (Error::Config("no such table".into()), false),
            (Error::Malformed("a document is not JSON".into()), false),
        ];
        for (err, retryable) in cases {
            assert_eq!(err.is_retryable(), retryable, "{err}");
        }
    }
}
