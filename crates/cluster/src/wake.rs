//! What wakes a member to look at the cluster again: a change etcd reports on a watch
//! of the keys its plan reads, one of its shards' loops ending, or the safety net.
//!
//! ```text
//!  watch task: watch P/members/, P/shards/, P/assign/, P/declined/ ──created──▶ wake
//!              ──a change──▶ wake
//!              the watch ended (etcd restarted, cancelled it): watch again after
//!              RETRY; the new watch's wake-up reads what changed in between
//!  a shard's loop returned ──────────────────────────────────────────────────▶ wake
//!  nothing for SAFETY_NET ───────────────────────────────────────────────────▶ wake
//! ```
//!
//! Wake-ups coalesce (one pending at most), and each is a whole new look at the keys,
//! so the member never acts on an event's content, only on the state it reads: a burst
//! of changes costs one look, and a missed change only delays it. A failover then takes
//! the lease's expiry (the TTL after the dead member's last renewal, found by etcd's
//! expiry sweep every 500 ms) plus one look and a claim: milliseconds, not a tick.
//!
//! The safety net bounds what a watch that stops without an error costs: a connection
//! to an etcd that vanished without closing it (a cut network) shows no error until
//! TCP gives up, and meanwhile the member would see nothing change.

use crate::etcd::Etcd;
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The longest a member goes without looking at the cluster: what a silently stopped
/// watch costs at most, and, with no change, how often a member looks anyway (four
/// range reads). The publishing of lag is paced by its own interval.
pub const SAFETY_NET: Duration = Duration::from_secs(5);

/// The pause before watching again after a watch ended or could not start (etcd
/// restarting): short, as each try costs one failed call.
const RETRY: Duration = Duration::from_millis(250);

/// A member's wake-ups.
pub struct Wake {
    notify: Arc<Notify>,
    watcher: JoinHandle<()>,
    safety_net: Duration,
}

/// Why [`Wake::next`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Woken {
    /// A watched key changed, a new watch began, or a loop returned.
    Changed,
    /// The deadline or the safety net passed.
    Due,
}

impl Wake {
    /// Starts watching `prefixes` (and wakes once at once: the first look); wakes at
    /// least every `safety_net` ([`SAFETY_NET`] for a member).
    pub fn watching(etcd: Etcd, prefixes: Vec<String>, safety_net: Duration) -> Wake {
        let notify = Arc::new(Notify::new());
        notify.notify_one();
        let watcher = tokio::spawn(watch(etcd, prefixes, notify.clone()));
        Wake {
            notify,
            watcher,
            safety_net,
        }
    }

    /// What a shard's loop calls when it returns.
    pub fn notifier(&self) -> Arc<Notify> {
        self.notify.clone()
    }

    /// Waits for the next wake-up, or until `deadline` (a timer of the member's own:
    /// a backoff that ends), or the safety net, whichever comes first.
    pub async fn next(&self, deadline: Option<Instant>) -> Woken {
        let net = Instant::now() + self.safety_net;
        let until = deadline.map_or(net, |d| d.min(net));
        tokio::select! {
            () = self.notify.notified() => Woken::Changed,
            () = tokio::time::sleep_until(until) => Woken::Due,
        }
    }

    /// Stops the watch task and waits for it to end.
    pub async fn stop(mut self) {
        self.watcher.abort();
        let _ = (&mut self.watcher).await;
    }
}

impl Drop for Wake {
    /// A member that ends early (failing to join) stops watching too.
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

/// Watches `prefixes` for as long as the task runs, waking on each change and on
/// each new watch.
async fn watch(etcd: Etcd, prefixes: Vec<String>, notify: Arc<Notify>) {
    loop {
        match etcd.watch(&prefixes).await {
            Ok(changes) => {
                // What changed while no watch was open is read by this look.
                notify.notify_one();
                tracing::debug!("watching the cluster's members, shards and assignments");
                let mut changes = std::pin::pin!(changes);
                while let Some(change) = changes.next().await {
                    match change {
                        Ok(revision) => {
                            tracing::trace!(revision, "the cluster changed");
                            notify.notify_one();
                        }
                        Err(e) => {
                            tracing::info!("{e}; watching again");
                            break;
                        }
                    }
                }
            }
            Err(e) => tracing::debug!("{e}; watching again in {RETRY:?}"),
        }
        tokio::time::sleep(RETRY).await;
    }
}
