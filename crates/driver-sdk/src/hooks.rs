//! The calls beside the protocol, in process only (see [`crate::traits`]): the runtime's
//! handle ([`LogHooks`]) and what the serve loop receives ([`HookCall`]), on a channel of
//! their own beside the requests.

use crate::traits::LogContext;
use crate::{Error, Result};
use serde_json::Value;
use sluice_report::Report;
use tokio::sync::{mpsc, oneshot};

/// A call beside the protocol, as the serve loop receives it.
pub(crate) enum HookCall {
    /// Before Open: what the recovery log holds for the stream.
    Opening(LogContext, oneshot::Sender<()>),
    ArtifactIntent(u64, oneshot::Sender<Result<Option<Value>>>),
    Decision(u64, oneshot::Sender<Option<Value>>),
    Report(oneshot::Sender<Report>),
}

/// The runtime's handle on an in-process stream's calls beside the protocol (see
/// [`crate::traits`]). Each call waits for the serve loop to answer it.
pub struct LogHooks {
    calls: mpsc::Sender<HookCall>,
}

impl LogHooks {
    pub(crate) fn new(calls: mpsc::Sender<HookCall>) -> LogHooks {
        LogHooks { calls }
    }

    /// Tells the driver what the log holds for this stream; before Open is sent.
    pub async fn opening(&self, log: LogContext) -> Result<()> {
        self.call(|reply| HookCall::Opening(log, reply)).await
    }

    /// Transaction `txn`'s artifact intent ([`crate::Transactor::artifact_intent`]).
    pub async fn artifact_intent(&self, txn: u64) -> Result<Option<Value>> {
        self.call(|reply| HookCall::ArtifactIntent(txn, reply))
            .await?
    }

    /// The driver checkpoint to record with `txn`'s commit
    /// ([`crate::Transactor::decision`]); after DriverCommitted of `txn`.
    pub async fn decision(&self, txn: u64) -> Result<Option<Value>> {
        self.call(|reply| HookCall::Decision(txn, reply)).await
    }

    /// What the driver reports of itself ([`crate::Transactor::report`]); after
    /// DriverCommitted of a transaction. Before Open there is no transactor to ask: the
    /// empty report.
    pub async fn report(&self) -> Result<Report> {
        self.call(HookCall::Report).await
    }

    async fn call<T>(&self, call: impl FnOnce(oneshot::Sender<T>) -> HookCall) -> Result<T> {
        let ended = || Error::Transport("the driver's Transactions stream has ended".into());
        let (reply, answer) = oneshot::channel();
        self.calls.send(call(reply)).await.map_err(|_| ended())?;
        answer.await.map_err(|_| ended())
    }
}
