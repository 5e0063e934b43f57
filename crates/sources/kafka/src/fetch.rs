//! The fetch of a Kafka source's read-ahead task ([`Prefetch`](sluice_source_sdk::Prefetch)):
//! one long-poll in flight per assigned partition, all on the client's connection, and
//! every few seconds a look at the topic's partitions (new ones are read from their
//! beginning; fewer than before is an error).
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
use std::time::{Duration, Instant};

/// How long one fetch waits for new messages. tansu answers a fetch only when this
/// has passed, even once messages arrived, so it bounds the latency of a trickle; a
/// Kafka broker answers as soon as messages arrive.
pub(crate) const FETCH_WAIT: Duration = Duration::from_millis(10);

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

type Polled = (i32, Result<(Vec<RecordAndOffset>, i64), SourceError>);

pub(crate) struct PartitionFetch {
    broker: Arc<Broker>,
    /// New partitions are read too (no `partitions` list in the configuration).
    follow_new: bool,
    next: BTreeMap<i32, i64>,
    /// How many partitions the topic had when last looked at.
    count: usize,
    checked: Instant,
    in_flight: FuturesUnordered<BoxFuture<'static, Polled>>,
    polling: BTreeSet<i32>,
}

impl PartitionFetch {
    pub(crate) fn new(
        broker: Arc<Broker>,
        follow_new: bool,
        next: BTreeMap<i32, i64>,
        count: usize,
    ) -> PartitionFetch {
        PartitionFetch {
            broker,
            follow_new,
            next,
            count,
            checked: Instant::now(),
            in_flight: FuturesUnordered::new(),
            polling: BTreeSet::new(),
        }
    }

    /// Looks at the topic's partitions: an error if there are fewer, the new ones
    /// (when followed) read from their earliest offset.
    async fn check_partitions(&mut self, out: &mut Vec<(Fetched, u64)>) -> Result<(), SourceError> {
        let partitions = self.broker.partitions().await?;
        if partitions.len() < self.count {
            return Err(self.broker.shrunk(self.count, partitions.len()));
        }
        self.count = partitions.len();
        if self.follow_new {
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
        self.in_flight.push(
            async move {
                let fetched = async {
                    let client = broker.partition(partition).await?;
                    let wait = FETCH_WAIT.as_millis() as i32;
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
            None => tokio::time::sleep(FETCH_WAIT).await,
        }
        while let Some(Some(polled)) = self.in_flight.next().now_or_never() {
            self.take_polled(polled, &mut out)?;
        }
        Ok(out)
    }
}
