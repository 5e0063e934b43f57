//! Every call to a source, bounded by `runtime.timeouts.source`: a source that hangs (a
//! stalled network file system, a broker that stopped answering) ends the run with a
//! retryable [`SourceError::Timeout`] naming the source and the call, and the loop
//! reopens it with backoff, instead of the pipeline waiting forever. [`super::run`]
//! wraps each source once, so neither recovery (seek) nor the reader (queue, replay)
//! calls one unbounded; `run`'s check of its sources before it starts (probe) is
//! bounded alike. A source's calls return quickly by contract (`queue` returns what it
//! has), so the bound is on one call, never on a transaction.
//!
//! A stop request also ends a call already waiting when it comes (a client retrying an
//! unreachable broker inside one call): the call fails with
//! [`SourceError::Interrupted`], and the run stops without committing the transaction
//! in progress, which the next run reads again. A call begun after the request runs to
//! its end, so that the transaction in hand can finish.

use async_trait::async_trait;
use serde_json::Value;
use sluice_source_sdk::{
    FaultTolerance, Lag, Metric, QueueLimits, Queued, Records, Resume, Source, SourceError, Step,
};
use std::future::Future;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::timeout;

/// `source`, each of whose calls fails with a timeout after `after`, or at `shutdown`.
pub(crate) fn bounded(
    source: Box<dyn Source>,
    after: Duration,
    shutdown: watch::Receiver<bool>,
) -> Box<dyn Source> {
    Box::new(Bounded {
        limits: Limits {
            name: source.name().to_string(),
            after,
            shutdown,
        },
        inner: source,
    })
}

struct Bounded {
    inner: Box<dyn Source>,
    limits: Limits,
}

/// What bounds every call of one source.
struct Limits {
    /// The source's name, for errors.
    name: String,
    after: Duration,
    shutdown: watch::Receiver<bool>,
}

impl Limits {
    /// Runs `future`, the source's call `call`, for at most `after`, giving it up at a
    /// stop request that comes while it waits.
    async fn call<T>(
        &self,
        call: &'static str,
        future: impl Future<Output = Result<T, SourceError>>,
    ) -> Result<T, SourceError> {
        let mut shutdown = self.shutdown.clone();
        let stopping = *shutdown.borrow();
        let stop = async {
            // A call begun after the request runs on; without a sender, none can come.
            if stopping || shutdown.wait_for(|down| *down).await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        let name = || self.name.clone();
        tokio::select! {
            result = timeout(self.after, future) => result.unwrap_or_else(|_| {
                Err(SourceError::Timeout { name: name(), call, after: self.after })
            }),
            () = stop => Err(SourceError::Interrupted { name: name(), call }),
        }
    }
}

#[async_trait]
impl Source for Bounded {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn fault_tolerance(&self) -> FaultTolerance {
        self.inner.fault_tolerance()
    }

    async fn probe(&mut self) -> Result<(), SourceError> {
        self.limits.call("probe", self.inner.probe()).await
    }

    async fn seek(&mut self, position: &Value) -> Result<(), SourceError> {
        self.limits.call("seek", self.inner.seek(position)).await
    }

    async fn rewound(&mut self, released: &Value) -> Result<(), SourceError> {
        self.limits
            .call("rewound", self.inner.rewound(released))
            .await
    }

    async fn replay(&mut self, step: &Resume, out: &mut Records) -> Result<Step, SourceError> {
        self.limits
            .call("replay", self.inner.replay(step, out))
            .await
    }

    async fn queue(&mut self, limits: QueueLimits, out: &mut Records) -> Result<Step, SourceError> {
        self.limits
            .call("queue", self.inner.queue(limits, out))
            .await
    }

    /// Unbounded: waiting for input is not a call that hangs.
    async fn ready(&mut self) {
        self.inner.ready().await;
    }

    fn queued(&self) -> Queued {
        self.inner.queued()
    }

    fn extend(&mut self) {
        self.inner.extend();
    }

    fn pause(&mut self) {
        self.inner.pause();
    }

    fn committed(&mut self, txn: u64, position: &Value) {
        self.inner.committed(txn, position);
    }

    fn lag(&self) -> Option<Lag> {
        self.inner.lag()
    }

    fn retained(&self) -> Option<u64> {
        self.inner.retained()
    }

    fn memory(&self) -> u64 {
        self.inner.memory()
    }

    fn metrics(&self) -> Vec<Metric> {
        self.inner.metrics()
    }

    /// Bounded too; a source that hangs here is simply dropped.
    async fn disconnect(&mut self) {
        let _ = timeout(self.limits.after, self.inner.disconnect()).await;
    }
}
