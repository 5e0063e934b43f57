//! Every call to a source, bounded by `runtime.timeouts.source`: a source that hangs (a
//! stalled network file system, a broker that stopped answering) ends the run with a
//! retryable [`SourceError::Timeout`] naming the source and the call, and the loop
//! reopens it with backoff, instead of the pipeline waiting forever. [`super::run`]
//! wraps each source once, so neither recovery (seek) nor the reader (queue, replay)
//! calls one unbounded. A source's calls return quickly by contract (`queue` returns
//! what it has), so the bound is on one call, never on a transaction.

use async_trait::async_trait;
use serde_json::Value;
use sluice_source_sdk::{
    FaultTolerance, Lag, QueueLimits, Queued, Records, Resume, Source, SourceError, Step,
};
use std::time::Duration;
use tokio::time::{error::Elapsed, timeout};

/// `source`, each of whose calls fails with a timeout after `after`.
pub(super) fn bounded(source: Box<dyn Source>, after: Duration) -> Box<dyn Source> {
    Box::new(Bounded {
        inner: source,
        after,
    })
}

struct Bounded {
    inner: Box<dyn Source>,
    after: Duration,
}

impl Bounded {
    /// The call's result, or the timeout naming it.
    fn settle<T>(
        &self,
        call: &'static str,
        result: Result<Result<T, SourceError>, Elapsed>,
    ) -> Result<T, SourceError> {
        result.unwrap_or_else(|_| {
            Err(SourceError::Timeout {
                name: self.inner.name().to_string(),
                call,
                after: self.after,
            })
        })
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

    async fn seek(&mut self, position: &Value) -> Result<(), SourceError> {
        let result = timeout(self.after, self.inner.seek(position)).await;
        self.settle("seek", result)
    }

    async fn rewound(&mut self, released: &Value) -> Result<(), SourceError> {
        let result = timeout(self.after, self.inner.rewound(released)).await;
        self.settle("rewound", result)
    }

    async fn replay(&mut self, step: &Resume, out: &mut Records) -> Result<Step, SourceError> {
        let result = timeout(self.after, self.inner.replay(step, out)).await;
        self.settle("replay", result)
    }

    async fn queue(&mut self, limits: QueueLimits, out: &mut Records) -> Result<Step, SourceError> {
        let result = timeout(self.after, self.inner.queue(limits, out)).await;
        self.settle("queue", result)
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

    /// Bounded too; a source that hangs here is simply dropped.
    async fn disconnect(&mut self) {
        let _ = timeout(self.after, self.inner.disconnect()).await;
    }
}
