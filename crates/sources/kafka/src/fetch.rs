//! The fetch of a Kafka source's read-ahead task ([`Prefetch`](sluice_source_sdk::Prefetch)):
//! one long-poll in flight per assigned partition, all on the client's connection, and
//! every few seconds a look at the topic's partitions (new ones are read from their
//! beginning, ignored, or an error, as [`NewPartitions`] says; fewer than before is an
//! error). Every message a fetch returns counts in [`FetchedTotals`], those before the
//! offset asked for included: what the broker sent.
//!
//! The fetcher keeps its own next offset per partition (ahead of the source's, by what
//! is buffered). It hands out messages in offset order per partition, dropping any at
//! or below one already handed out, so a broker that returns a batch twice cannot
//! duplicate a message.

use crate::broker::Broker;
use futures::FutureExt;
use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use rskafka::record::RecordAndOffset;
use sluice_source_sdk::{Fetch, SourceError};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// The most bytes one fetch of one partition asks for.
pub(crate) const FETCH_BYTES: i32 = 4 << 20;

/// How often the topic's partitions are looked at.
const METADATA_EVERY: Duration = Duration::from_secs(3);

/// What the fetch hands to the source.
pub(crate) enum Fetched {
    /// The topic grew: read `partition` from `offset` (its beginning).
    Added { partition: i32, offset: i64 },
    /// A message, and the partition's high watermark when it was fetched.
    Message {
        partition: i32,
        high_watermark: i64,
        message: RecordAndOffset,
    },
}

impl Fetched {
    pub(crate) fn partition(&self) -> i32 {
        match self {
            Fetched::Added { partition, .. } | Fetched::Message { partition, .. } => *partition,
        }
    }
}

/// What the messages fetched from the brokers came to, for the source's metrics: what
/// a partitioned read saves.
#[derive(Debug, Default)]
pub(crate) struct FetchedTotals {
    pub messages: AtomicU64,
    /// Their keys, values and headers (rskafka's `approximate_size`).
    pub bytes: AtomicU64,
}

impl FetchedTotals {
    /// Counts `messages`, as a fetch returned them.
    pub(crate) fn count(&self, messages: &[RecordAndOffset]) {
        let bytes: usize = messages.iter().map(|m| m.record.approximate_size()).sum();
        self.messages
            .fetch_add(messages.len() as u64, Ordering::Relaxed);
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

/// What the fetch does about partitions the topic gains while it reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NewPartitions {
    /// Read them from their beginning (no `partitions` list in the configuration).
    Read,
    /// Leave them (the configuration lists the partitions read).
    Ignore,
    /// Fail: a topic `partitioned_by: key_range` that grew maps keys to partitions
    /// anew, so a shard's keys may now be in partitions it does not read.
    Refuse,
}

type Polled = (i32, Result<(Vec<RecordAndOffset>, i64), SourceError>);

pub(crate) struct PartitionFetch {
    broker: Arc<Broker>,
    new_partitions: NewPartitions,
    totals: Arc<FetchedTotals>,
    next: BTreeMap<i32, i64>,
    /// How many partitions the topic had when last looked at.
    count: usize,
    checked: Instant,
    in_flight: FuturesUnordered<BoxFuture<'static, Polled>>,
    polling: BTreeSet<i32>,
    /// How long one fetch waits for messages (`fetch_wait`).
    wait: Duration,
}

impl PartitionFetch {
    pub(crate) fn new(
        broker: Arc<Broker>,
        new_partitions: NewPartitions,
        totals: Arc<FetchedTotals>,
        next: BTreeMap<i32, i64>,
        count: usize,
        wait: Duration,
    ) -> PartitionFetch {
        PartitionFetch {
            broker,
            new_partitions,
            totals,
            next,
            count,
            checked: Instant::now(),
            in_flight: FuturesUnordered::new(),
            polling: BTreeSet::new(),
            wait,
        }
    }

    /// Looks at the topic's partitions: an error if there are fewer, the new ones
    /// handled as [`NewPartitions`] says (read from their earliest offset when read).
    async fn check_partitions(&mut self, out: &mut Vec<(Fetched, u64)>) -> Result<(), SourceError> {
        let partitions = self.broker.partitions().await?;
        if partitions.len() < self.count {
            return Err(self.broker.shrunk(self.count, partitions.len()));
        }
        if partitions.len() > self.count && self.new_partitions == NewPartitions::Refuse {
            return Err(self.broker.repartitioned(self.count, partitions.len()));
        }
        self.count = partitions.len();
        if self.new_partitions == NewPartitions::Read {
            let added: Vec<i32> = partitions
                .into_iter()
                .filter(|p| !self.next.contains_key(p))
                .collect();
            for partition in added {
                let (offset, _) = self.broker.offsets(partition).await?;
                self.next.insert(partition, offset);
                out.push((Fetched::Added { partition, offset }, 0));
            }
        }
        self.checked = Instant::now();
        Ok(())
    }

    fn poll_partition(&mut self, partition: i32, offset: i64) {
        let broker = self.broker.clone();
        let wait = i32::try_from(self.wait.as_millis()).unwrap_or(i32::MAX);
        self.in_flight.push(
            async move {
                let fetched = async {
                    let client = broker.partition(partition).await?;
                    client
                        .fetch_records(offset, 1..FETCH_BYTES, wait)
                        .await
                        .map_err(|e| broker.error(Some(partition), e))
                };
                (partition, fetched.await)
            }
            .boxed(),
        );
    }

    fn take_polled(
        &mut self,
        (partition, polled): Polled,
        out: &mut Vec<(Fetched, u64)>,
    ) -> Result<(), SourceError> {
        self.polling.remove(&partition);
        let (mut messages, high_watermark) = polled?;
        self.totals.count(&messages);
        let Some(next) = self.next.get_mut(&partition) else {
            return Ok(());
        };
        messages.sort_by_key(|m| m.offset);
        for message in messages {
            if message.offset < *next {
                continue;
            }
            *next = message.offset + 1;
            let size = message.record.approximate_size() as u64;
            out.push((
                Fetched::Message {
                    partition,
                    high_watermark,
                    message,
                },
                size,
            ));
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Fetch for PartitionFetch {
    type Item = Fetched;

    async fn fetch(&mut self) -> Result<Vec<(Fetched, u64)>, SourceError> {
        let mut out = Vec::new();
        if self.checked.elapsed() >= METADATA_EVERY {
            self.check_partitions(&mut out).await?;
        }
        let idle: Vec<(i32, i64)> = self
            .next
            .iter()
            .filter(|(p, _)| !self.polling.contains(p))
            .map(|(&p, &offset)| (p, offset))
            .collect();
        for (partition, offset) in idle {
            self.polling.insert(partition);
            self.poll_partition(partition, offset);
        }
        match self.in_flight.next().await {
            Some(polled) => self.take_polled(polled, &mut out)?,
            None => tokio::time::sleep(self.wait).await,
        }
        while let Some(Some(polled)) = self.in_flight.next().now_or_never() {
            self.take_polled(polled, &mut out)?;
        }
        Ok(out)
    }
}
