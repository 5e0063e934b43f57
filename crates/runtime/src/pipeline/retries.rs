//! The one retry policy of a run ([`Retries`]): the loop's reopenings, a first start's
//! source probes and its Apply all back off and give up alike.

use std::time::Duration;
use tokio::sync::watch;

/// First pause before reopening after a retryable failure; it doubles up to the cap.
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Consecutive failed attempts (none committing a transaction) before giving up:
/// with the backoff above, about two minutes of an unreachable store.
const MAX_FAILED_ATTEMPTS: u32 = 10;

/// The one retry policy of `run`, for the loop and for the first start's Apply alike:
/// a retryable failure is tried again after a backoff (250 ms doubling to 30 s), each
/// retry logged once with its cause, until [`MAX_FAILED_ATTEMPTS`] in a row made no
/// progress; a stop request ends a wait at once.
pub(super) struct Retries {
    backoff: Duration,
    failed: u32,
}

impl Retries {
    pub(super) fn new() -> Retries {
        Retries {
            backoff: FIRST_BACKOFF,
            failed: 0,
        }
    }

    /// An attempt made progress (committed a transaction): the count starts again.
    pub(super) fn progressed(&mut self) {
        *self = Retries::new();
    }

    /// Counts a failed attempt, and says whether to try again.
    pub(super) fn failed(&mut self, retryable: bool, shutdown: &watch::Receiver<bool>) -> bool {
        self.failed += 1;
        retryable && self.failed < MAX_FAILED_ATTEMPTS && !*shutdown.borrow()
    }

    /// Logs `err` and what follows (`then`: "reopening", "applying again"), then waits
    /// out the backoff; `false` when a stop request came first.
    pub(super) async fn wait(
        &mut self,
        err: &(dyn std::fmt::Display + Sync),
        then: &str,
        shutdown: &watch::Receiver<bool>,
    ) -> bool {
        tracing::warn!(
            "{err}; {then} in {:.1}s (attempt {} of {MAX_FAILED_ATTEMPTS})",
            self.backoff.as_secs_f64(),
            self.failed
        );
        let mut shutdown = shutdown.clone();
        let waited = tokio::select! {
            () = tokio::time::sleep(self.backoff) => true,
            _ = shutdown.wait_for(|down| *down) => false,
        };
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        waited
    }
}
