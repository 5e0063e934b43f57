//! The read-ahead of a source that reads from a network: a task that fetches while the
//! transaction loop works, driven by the runtime's commands.
//!
//! ```text
//!  Source::extend ─▶ Prefetch ─(unpaused)─▶ task: loop { Fetch::fetch ─▶ buffer ─▶ wake }
//!  Source::pause  ─▶   paused: the task stops fetching, the connection stays open
//!  Source::queue  ─▶ take(limits) ◀── buffer (FIFO)        Source::ready ◀── wake
//! ```
//!
//! A log source (Kafka, a NATS stream) implements [`Fetch`] (one long-poll of its client
//! returning what arrived) and owns a [`Prefetch`] of it; its `Source` methods forward:
//! `extend`/`pause`/`queued`/`ready` to the prefetch, `queue` takes items and makes the
//! step. Replaying a step reads the recorded range directly (not through the prefetch):
//! the source drops its prefetch, replays, and spawns a new one positioned after the
//! step. Dropping a `Prefetch` (a seek, a disconnect) aborts its task.
//!
//! A source that starts and drops prefetches as it goes (one per position it reads
//! from) holds a [`ReadAhead`]: the one running, if any, and the runtime's last Extend
//! or Pause, which a prefetch started later obeys. Its `extend`, `pause`, `queued` and
//! `memory` answer for the source, so that no source keeps the flag itself.
//!
//! A fetch error is kept behind the items fetched before it: `take` hands out those
//! first, then the error, so nothing read is lost and the failure surfaces in order.
//! The task stops after an error. The buffer is bounded by the runtime, which pauses
//! the source above `max_queued_records` / `max_queued_bytes` ([`Prefetch::queued`]);
//! a fetch in flight when it pauses still lands, so it may run over by one fetch.

use crate::{QueueLimits, Queued, SourceError};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use tokio::sync::{Notify, watch};
use tracing::Instrument;

/// One long-poll of a source's client.
#[async_trait::async_trait]
pub trait Fetch: Send + 'static {
    type Item: Send + 'static;
    /// Waits for the next items, each with its size in bytes; may return none when its
    /// own wait ran out (the task then fetches again). Cancel-safe: the task is aborted
    /// at any await.
    async fn fetch(&mut self) -> Result<Vec<(Self::Item, u64)>, SourceError>;
}

/// A fetch task and its buffer (see the module docs).
pub struct Prefetch<T> {
    shared: Arc<Shared<T>>,
    paused: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

struct Shared<T> {
    buffer: Mutex<Buffer<T>>,
    /// Signalled after every fetch that added items, and on failure.
    wake: Notify,
}

struct Buffer<T> {
    items: VecDeque<(T, u64)>,
    bytes: u64,
    /// The fetch error, handed out after the items before it.
    failed: Option<SourceError>,
}

impl<T: Send + 'static> Prefetch<T> {
    /// Starts fetching with `fetcher`, paused until [`extend`](Prefetch::extend) when
    /// `paused`.
    pub fn spawn<F: Fetch<Item = T>>(mut fetcher: F, paused: bool) -> Prefetch<T> {
        let shared = Arc::new(Shared {
            buffer: Mutex::new(Buffer {
                items: VecDeque::new(),
                bytes: 0,
                failed: None,
            }),
            wake: Notify::new(),
        });
        let (paused_tx, mut paused_rx) = watch::channel(paused);
        // In the caller's span: what the fetch logs names its materialization.
        let task = tokio::spawn({
            let shared = shared.clone();
            async move {
                loop {
                    if paused_rx.wait_for(|paused| !paused).await.is_err() {
                        return; // the Prefetch is gone
                    }
                    let fetched = fetcher.fetch().await;
                    let mut buffer = shared.buffer.lock().expect("the prefetch buffer");
                    match fetched {
                        Ok(items) if items.is_empty() => continue,
                        Ok(items) => {
                            for (item, bytes) in items {
                                buffer.bytes += bytes;
                                buffer.items.push_back((item, bytes));
                            }
                        }
                        Err(e) => buffer.failed = Some(e),
                    }
                    let failed = buffer.failed.is_some();
                    drop(buffer);
                    shared.wake.notify_one();
                    if failed {
                        return;
                    }
                }
            }
            .in_current_span()
        });
        Prefetch {
            shared,
            paused: paused_tx,
            task,
        }
    }

    /// Takes buffered items, oldest first, up to `limits` (at least one item when any is
    /// buffered, however large). With nothing buffered and the fetch failed, its error.
    pub fn take(&self, limits: QueueLimits) -> Result<Vec<T>, SourceError> {
        let mut buffer = self.shared.buffer.lock().expect("the prefetch buffer");
        let (mut taken, mut bytes) = (Vec::new(), 0u64);
        while taken.len() < limits.max_records && (taken.is_empty() || bytes < limits.max_bytes) {
            let Some((item, size)) = buffer.items.pop_front() else {
                break;
            };
            buffer.bytes -= size;
            bytes += size;
            taken.push(item);
        }
        if taken.is_empty()
            && let Some(e) = buffer.failed.take()
        {
            return Err(e);
        }
        Ok(taken)
    }

    /// What is buffered and not yet taken.
    pub fn queued(&self) -> Queued {
        let buffer = self.shared.buffer.lock().expect("the prefetch buffer");
        Queued {
            records: buffer.items.len(),
            bytes: buffer.bytes,
        }
    }

    /// Bytes of memory the buffer holds: the items' sizes as fetched, plus the queue's
    /// own slots (its capacity, which stays at its high-water mark). What a source
    /// reading through a prefetch answers for [`Source::memory`](crate::Source::memory).
    pub fn memory(&self) -> u64 {
        let buffer = self.shared.buffer.lock().expect("the prefetch buffer");
        let slots = buffer.items.capacity() * std::mem::size_of::<(T, u64)>();
        buffer.bytes + slots as u64
    }

    /// Returns once something is buffered or the fetch failed (at once if so already).
    pub async fn ready(&self) {
        loop {
            // Registered before the check, so a wake between the two is not lost.
            let woken = self.shared.wake.notified();
            {
                let buffer = self.shared.buffer.lock().expect("the prefetch buffer");
                if !buffer.items.is_empty() || buffer.failed.is_some() {
                    return;
                }
            }
            woken.await;
        }
    }

    /// Fetch (again).
    pub fn extend(&self) {
        self.paused.send_replace(false);
    }

    /// Stop fetching after the fetch in flight; the fetcher (its connection) is kept.
    pub fn pause(&self) {
        self.paused.send_replace(true);
    }
}

/// The read-ahead of a source that starts a [`Prefetch`] when it needs one and drops it
/// at a seek, a replay or a failed fetch (see the module docs): the prefetch running, if
/// any, and whether the runtime's last word was Pause, which a prefetch started later
/// obeys.
pub struct ReadAhead<T> {
    running: Option<Prefetch<T>>,
    paused: bool,
}

impl<T: Send + 'static> ReadAhead<T> {
    /// None running; the first one started fetches at once unless `paused` (the
    /// runtime extends a source once it is positioned).
    pub fn new(paused: bool) -> ReadAhead<T> {
        ReadAhead {
            running: None,
            paused,
        }
    }

    /// Starts fetching with `fetcher`, paused if the runtime's last word was Pause; a
    /// prefetch running before is dropped (its task aborted).
    pub fn start<F: Fetch<Item = T>>(&mut self, fetcher: F) -> &Prefetch<T> {
        self.running.insert(Prefetch::spawn(fetcher, self.paused))
    }

    /// The prefetch running, if one is.
    pub fn running(&self) -> Option<&Prefetch<T>> {
        self.running.as_ref()
    }

    /// Drops the prefetch running (its task aborted, what it buffered gone); the next
    /// one is started by [`start`](ReadAhead::start).
    pub fn stop(&mut self) {
        self.running = None;
    }

    /// The runtime's Extend: the prefetch running, and any started later, fetch.
    pub fn extend(&mut self) {
        self.paused = false;
        if let Some(prefetch) = &self.running {
            prefetch.extend();
        }
    }

    /// The runtime's Pause: the prefetch running stops after its fetch in flight, and
    /// one started later waits for an Extend.
    pub fn pause(&mut self) {
        self.paused = true;
        if let Some(prefetch) = &self.running {
            prefetch.pause();
        }
    }

    /// What the prefetch running buffered and nobody took yet (none without one).
    pub fn queued(&self) -> Queued {
        self.running
            .as_ref()
            .map(Prefetch::queued)
            .unwrap_or_default()
    }

    /// Bytes of memory the prefetch running holds ([`Prefetch::memory`]; 0 without one).
    pub fn memory(&self) -> u64 {
        self.running.as_ref().map_or(0, Prefetch::memory)
    }
}

impl<T> Drop for Prefetch<T> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::sync::mpsc;

    /// Fetches what the test sends, one message per fetch; a closed channel fails.
    struct Scripted(mpsc::UnboundedReceiver<Vec<u32>>);

    #[async_trait::async_trait]
    impl Fetch for Scripted {
        type Item = u32;
        async fn fetch(&mut self) -> Result<Vec<(u32, u64)>, SourceError> {
            match self.0.recv().await {
                Some(items) => Ok(items.into_iter().map(|i| (i, 10)).collect()),
                None => Err(SourceError::Config {
                    name: "scripted".into(),
                    reason: "closed".into(),
                }),
            }
        }
    }

    const ALL: QueueLimits = QueueLimits {
        max_records: usize::MAX,
        max_bytes: u64::MAX,
        max_journaled: u64::MAX,
    };

    fn scripted(paused: bool) -> (mpsc::UnboundedSender<Vec<u32>>, Prefetch<u32>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (tx, Prefetch::spawn(Scripted(rx), paused))
    }

    #[tokio::test]
    async fn ready_wakes_on_a_fetch_and_take_respects_limits() {
        let (tx, prefetch) = scripted(false);
        assert!(
            tokio::time::timeout(Duration::from_millis(50), prefetch.ready())
                .await
                .is_err(),
            "nothing fetched yet"
        );
        tx.send(vec![1, 2, 3]).unwrap();
        prefetch.ready().await;
        assert_eq!(
            prefetch.queued(),
            Queued {
                records: 3,
                bytes: 30
            }
        );
        let memory = prefetch.memory();
        assert!(
            memory >= 30 + 3 * 16,
            "the items' bytes and their slots: {memory}"
        );
        let two = QueueLimits {
            max_records: 2,
            max_bytes: u64::MAX,
            max_journaled: u64::MAX,
        };
        assert_eq!(prefetch.take(two).unwrap(), vec![1, 2]);
        let tiny = QueueLimits {
            max_records: 10,
            max_bytes: 1,
            max_journaled: u64::MAX,
        };
        assert_eq!(
            prefetch.take(tiny).unwrap(),
            vec![3],
            "one item, however large"
        );
        assert_eq!(prefetch.take(ALL).unwrap(), Vec::<u32>::new());
        assert_eq!(prefetch.queued(), Queued::default());
    }

    #[tokio::test]
    async fn a_paused_prefetch_does_not_fetch_until_extended() {
        let (tx, prefetch) = scripted(true);
        tx.send(vec![1]).unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(
            prefetch.queued(),
            Queued::default(),
            "paused from the start"
        );
        prefetch.extend();
        prefetch.ready().await;
        assert_eq!(prefetch.take(ALL).unwrap(), vec![1]);
        prefetch.pause();
        // The fetch in flight when it paused may land; none after it.
        tx.send(vec![2]).unwrap();
        tx.send(vec![3]).unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        let landed = prefetch.take(ALL).unwrap();
        assert!(landed.len() <= 1, "{landed:?}");
        prefetch.extend();
        let mut all = landed;
        while all.len() < 2 {
            prefetch.ready().await;
            all.extend(prefetch.take(ALL).unwrap());
        }
        assert_eq!(all, vec![2, 3]);
    }

    /// The runtime paused the source while no prefetch ran: the next one started waits
    /// for an Extend, and a stopped one leaves nothing queued.
    #[tokio::test]
    async fn a_read_ahead_keeps_a_pause_for_the_prefetch_it_starts_later() {
        let mut read_ahead = ReadAhead::new(false);
        read_ahead.pause();
        let (tx, rx) = mpsc::unbounded_channel();
        read_ahead.start(Scripted(rx));
        tx.send(vec![1, 2]).unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert_eq!(
            read_ahead.queued(),
            Queued::default(),
            "paused before it ran"
        );
        read_ahead.extend();
        read_ahead.running().expect("started").ready().await;
        assert_eq!(
            read_ahead.queued(),
            Queued {
                records: 2,
                bytes: 20
            }
        );
        assert!(read_ahead.memory() >= 20);
        read_ahead.stop();
        assert!(read_ahead.running().is_none());
        assert_eq!(read_ahead.queued(), Queued::default());
        assert_eq!(read_ahead.memory(), 0);
    }

    #[tokio::test]
    async fn an_error_comes_after_the_items_fetched_before_it() {
        let (tx, prefetch) = scripted(false);
        tx.send(vec![7]).unwrap();
        drop(tx);
        tokio::time::sleep(Duration::from_millis(30)).await;
        prefetch.ready().await;
        assert_eq!(prefetch.take(ALL).unwrap(), vec![7]);
        prefetch.ready().await;
        let err = prefetch.take(ALL).unwrap_err();
        assert!(err.to_string().contains("closed"), "{err}");
    }
}
