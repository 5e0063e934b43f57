//! The output SDK: Feldera's fault-tolerant output endpoints on Sluice's one loop.
//!
//! A materialization whose endpoint is an output kind (Kafka, NATS JetStream, files)
//! publishes, for every transaction, the changes of each binding's view: for every
//! changed key, the document before, the document after and the operation. The
//! [`driver::OutputDriver`] is an in-process Flow driver that keeps each binding's view
//! (the loaded "before" documents come from there) in a local SQLite file beside the
//! recovery log, or in PostgreSQL when the endpoint says `view: {url, schema}` (which
//! lets a cluster move the output between members), encodes changes with the binding's
//! [`encode::Format`], and hands them to the binding's [`OutputEndpoint`] as one
//! numbered batch per transaction:
//!
//! ```text
//!  Load*                 view lookups → Loaded
//!  Prepare(txn N)        remember N and the runtime checkpoint
//!  Store*                before = view[key]; view[key] = after; encode → buffer;
//!                        batch_start(N) at a binding's first change, push when the
//!                        buffer passes the endpoint's max_buffer_size_bytes (the
//!                        view read and written in batches: transactor.rs)
//!  Commit                push the rest, batch_end (durable, visible); then the view,
//!                        the checkpoint and the fence commit in one transaction of
//!                        the view (its range's fence checked, and locked, in it)
//! ```
//!
//! What holds (exactly once, in order):
//! - A transaction's batch is written before the view commits, and every message
//!   carries its transaction number and its index within the batch. A crash before the
//!   view commits replays the transaction from the recovery log, which produces the
//!   same messages in the same order (the loop replays its steps verbatim; drains are
//!   in key order), and the endpoint discards those its destination already holds
//!   ([`Tail`]). A crash after the view commits has nothing to redo.
//! - A slow endpoint slows the loop: pushes are awaited, the buffer is bounded.
//! - Everything written carries the view's [`Generation`]: a reset removes the view
//!   whole, and the next run's new generation never takes what an earlier one wrote
//!   for its own (an old tail is not "already written"), so it publishes every change
//!   again from an empty view.

pub mod change;
pub mod config;
pub mod driver;
pub mod encode;
pub mod endpoint;
pub mod generation;
pub mod kind;
mod transactor;
mod view;

pub use change::{Change, Op};
pub use driver::OutputDriver;
pub use encode::{Buffer, Format, Message};
pub use endpoint::{BatchKind, OutputEndpoint, Tail, Target};
pub use generation::{Generation, GenerationId};
pub use kind::{OutputKind, endpoint_schema, resource_schema};

/// What an output failed at, and whether trying again may help.
#[derive(Debug, thiserror::Error)]
pub enum OutputError {
    /// The configuration cannot work: fix it.
    #[error("{0}")]
    Config(String),
    /// A document cannot be encoded in the binding's format.
    #[error("{0}")]
    Encode(String),
    /// The destination failed (I/O, a broker error, a timeout): a retry may help.
    #[error("{0}")]
    External(String),
    /// The destination holds what this output did not write (a foreign message, a
    /// gap): never guessed past.
    #[error("{0}")]
    Corrupt(String),
}

impl OutputError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, OutputError::External(_))
    }
}

/// An output error as a driver error, retryable as the output says.
pub fn output_error(err: OutputError) -> sluice_driver_sdk::Error {
    match err {
        OutputError::Config(message) => sluice_driver_sdk::Error::Config(message),
        other => sluice_driver_sdk::Error::Store {
            context: "output".into(),
            retryable: other.is_retryable(),
            message: other.to_string(),
        },
    }
}

/// Fail points of every output (feature `failpoints`), for `sluice torture`: after a
/// batch started, after each push, before `batch_end`, and after `batch_end` before the
/// view commits. `return` fails the operation (retryable), `panic` aborts the process.
pub const AFTER_BATCH_START: &str = "output::after-batch-start";
pub const AFTER_PUSH: &str = "output::after-push";
pub const BEFORE_BATCH_END: &str = "output::before-batch-end";
pub const BEFORE_VIEW_COMMIT: &str = "output::before-view-commit";
pub const FAIL_POINTS: &[&str] = &[
    AFTER_BATCH_START,
    AFTER_PUSH,
    BEFORE_BATCH_END,
    BEFORE_VIEW_COMMIT,
];

/// A fail point's `return`: a retryable failure naming it.
macro_rules! fail_point {
    ($name:expr) => {
        fail::fail_point!($name, |_| Err(crate::output_error(
            crate::OutputError::External(format!("fail point {}", $name))
        )))
    };
}
pub(crate) use fail_point;

pub type Result<T, E = OutputError> = std::result::Result<T, E>;

/// `text` as JSON, or a configuration error naming `what` it is.
pub(crate) fn parse_json(text: &str, what: &str) -> sluice_driver_sdk::Result<serde_json::Value> {
    serde_json::from_str(text)
        .map_err(|e| sluice_driver_sdk::Error::Config(format!("{what} is not JSON: {e}")))
}
