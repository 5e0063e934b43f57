//! [`TaskTracker`]: the background work of one sink instance, counted, so the driver can
//! wait for all of it to end before the instance is dropped or replaced.
//!
//! ```text
//!  sink instance g     tracker.spawn(writer) ──▶ task (holds a TaskGuard) ──┐
//!  driver: drop g ──▶  tracker.wait(bound): every guard of g dropped ◀──────┘
//!                      ──▶ build, open, recover instance g+1
//! ```
//!
//! What holds: once [`TaskTracker::wait`] returned `Ok`, no task spawned through the
//! tracker (or holding one of its [`TaskGuard`]s) is running or will run again, so two
//! generations of a sink never touch its staging at the same time. A task ends by
//! returning, or by being aborted: an aborted task's guard drops with its future.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Counts the live background tasks of a sink instance. Cheap to clone: every clone
/// counts the same tasks.
#[derive(Clone, Debug)]
pub struct TaskTracker {
    live: Arc<watch::Sender<usize>>,
}

impl Default for TaskTracker {
    fn default() -> Self {
        TaskTracker::new()
    }
}

/// Held by a tracked task for as long as it runs; dropping it ends the task's count.
#[derive(Debug)]
pub struct TaskGuard {
    live: Arc<watch::Sender<usize>>,
}

impl Drop for TaskGuard {
    fn drop(&mut self) {
        self.live.send_modify(|n| *n -= 1);
    }
}

/// Tracked tasks still ran when [`TaskTracker::wait`]'s bound passed.
#[derive(Debug, thiserror::Error)]
#[error("{live} background task(s) of the sink still ran after {after:?}")]
pub struct Unfinished {
    pub live: usize,
    pub after: Duration,
}

impl TaskTracker {
    pub fn new() -> TaskTracker {
        TaskTracker {
            live: Arc::new(watch::channel(0).0),
        }
    }

    /// A guard counting one task until it drops: for work not started by
    /// [`TaskTracker::spawn`] (a blocking task, a thread), which moves the guard in.
    pub fn guard(&self) -> TaskGuard {
        self.live.send_modify(|n| *n += 1);
        TaskGuard {
            live: self.live.clone(),
        }
    }

    /// Spawns `work` on the tokio runtime, counted until it returns or is aborted.
    pub fn spawn<F>(&self, work: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let guard = self.guard();
        tokio::spawn(async move {
            let _guard = guard;
            work.await
        })
    }

    /// Tasks counted now.
    pub fn live(&self) -> usize {
        *self.live.borrow()
    }

    /// Returns once no tracked task runs, or [`Unfinished`] after `within`.
    pub async fn wait(&self, within: Duration) -> Result<(), Unfinished> {
        let mut live = self.live.subscribe();
        match tokio::time::timeout(within, live.wait_for(|n| *n == 0)).await {
            Ok(_) => Ok(()),
            Err(_) => Err(Unfinished {
                live: self.live(),
                after: within,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn wait_returns_once_every_task_ended_or_was_aborted() {
        let tracker = TaskTracker::new();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let finishing = tracker.spawn(async move { rx.await.is_ok() });
        let hanging = tracker.spawn(std::future::pending::<()>());
        let guard = tracker.guard();
        assert_eq!(tracker.live(), 3);
        assert!(tracker.wait(Duration::from_millis(20)).await.is_err());

        tx.send(()).unwrap();
        assert!(finishing.await.unwrap());
        hanging.abort();
        let _ = hanging.await;
        let err = tracker.wait(Duration::from_millis(20)).await.unwrap_err();
        assert_eq!(err.live, 1, "the guard still counts");
        drop(guard);
        tracker.wait(Duration::from_millis(20)).await.unwrap();
        assert_eq!(tracker.live(), 0);
    }
}
