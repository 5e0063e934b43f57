//! The Kafka source: a topic's partitions, assigned by the source (no consumer group),
//! read ahead by a [`Prefetch`] task and handed out as steps that replay exactly.
//!
//! ```text
//!  brokers ──long-poll per partition (fetch task)──▶ Prefetch buffer ──queue──▶ one step:
//!                                                     records grouped by partition, in offset order
//!  position = {next: {partition: next offset}, read: {partition: [begin, end)}}
//! ```
//!
//! A step's position holds the offset range it read of each partition (`end` = last
//! offset read + 1) and the next offset of every assigned partition. `seek` restores
//! the next offsets; `replay` re-reads each range directly (not through the prefetch),
//! keeping only offsets inside it and stopping at its end rather than counting, so
//! gaps (compaction, transaction markers) are crossed, and checks the step hash. A
//! range or position below a partition's earliest offset (retention deleted it), or
//! above its high watermark (the topic was recreated), is
//! [`SourceError::Unavailable`], naming the topic, partition and offsets.
//!
//! A step ends the input (for now) when every assigned partition has been read up to
//! the high watermark last seen: `sluice run` stops there, `--follow` reads on.
//!
//! A topic `partitioned_by: key_range` ([`sluice_kafka_client::key_range`]) is read by
//! each instance only in the partitions whose key slices overlap its shards' key hashes
//! (`Opening::shard_keys`), so the bytes fetched do not grow with the shard count:
//!
//! - Every document read is checked against that partitioner: its key hash (as the
//!   runtime routes it) must be in its partition's slice, else the source fails naming
//!   the partition, offset and message key. A document of another partition's slice
//!   would be routed to a shard that does not read its partition, and be lost. The
//!   hash goes on with the record (`Records::set_key_hash`): the runtime routes by it
//!   rather than hash it again.
//! - A position records the partition count it was read over (`partitions`); another
//!   count now (the topic grew, or was recreated) fails: the slices moved.
//! - A position may name partitions this instance does not read (a split's halves
//!   start from their parent's log): it reads on from the offsets of its own only,
//!   which is exact, as the parent had read every partition up to those offsets and
//!   its keys are in them alone. A replayed step reads every range it names, its
//!   hash covering them all, and the runtime keeps the documents of its range.

use crate::broker::{Broker, PROBE_FOR, RETRY_FOR, repartitioned};
use crate::config::{KafkaConfig, Start};
use crate::fetch::{FETCH_BYTES, Fetched, FetchedTotals, NewPartitions, PartitionFetch};
use crate::message::{Acc, Documents};
use rskafka::record::RecordAndOffset;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sluice_kafka_client::key_range;
use sluice_source_sdk::{
    FaultTolerance, Health, Lag, Metric, Prefetch, QueueLimits, Queued, ReadAhead, Records, Resume,
    ShardKeys, SharedDoc, Source, SourceError, Step, check_replay,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// Where a step leaves the source, and what it read.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaPosition {
    /// The next offset of every assigned partition after the step.
    pub next: BTreeMap<i32, i64>,
    /// The offsets the step read of each partition it read: `[begin, end)`.
    pub read: BTreeMap<i32, [i64; 2]>,
    /// `partitioned_by: key_range`: the topic's partition count the partitions' key
    /// slices were read over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<u32>,
}

impl KafkaPosition {
    fn from_value(name: &str, action: &'static str, value: &Value) -> Result<Self, SourceError> {
        serde_json::from_value(value.clone()).map_err(|e| SourceError::BadResume {
            name: name.to_string(),
            action,
            resume: value.clone(),
            reason: e.to_string(),
        })
    }
}

pub struct KafkaSource {
    name: String,
    config: KafkaConfig,
    /// Told how connecting goes.
    health: Health,
    broker: Option<Arc<Broker>>,
    documents: Documents,
    /// The next offset of every assigned partition after the last step; `None` until
    /// positioned (a seek, a replay, or the configured start).
    next: Option<BTreeMap<i32, i64>>,
    /// The high watermark last seen of each partition.
    high: BTreeMap<i32, i64>,
    /// Not paused from the start: a prefetch begins once the source is positioned,
    /// which is when the runtime would extend it anyway.
    read_ahead: ReadAhead<Fetched>,
    /// A failure to start reading met in `ready`, reported by the next `queue`.
    failed: Option<SourceError>,
    /// The key hashes of the shards it feeds, when the topic is `partitioned_by:
    /// key_range` and the runtime said them: only the partitions holding them are
    /// read, and every document is checked against its partition's slice.
    shard_keys: Option<ShardKeys>,
    /// `partitioned_by: key_range`: the topic's partition count, as the position
    /// recorded it or the topic had it when reading began.
    partition_count: Option<u32>,
    /// What this instance fetched from the brokers, replays included.
    fetched: Arc<FetchedTotals>,
}

impl KafkaSource {
    pub fn new(name: &str, config: &KafkaConfig) -> KafkaSource {
        KafkaSource::reporting(name, config, Health::none().clone())
    }

    /// A source telling `health` how connecting to its brokers goes.
    pub fn reporting(name: &str, config: &KafkaConfig, health: Health) -> KafkaSource {
        KafkaSource {
            health,
            name: name.to_string(),
            documents: Documents::new(&config.topic, config.meta.as_deref()),
            config: config.clone(),
            broker: None,
            next: None,
            high: BTreeMap::new(),
            read_ahead: ReadAhead::new(false),
            failed: None,
            shard_keys: None,
            partition_count: None,
            fetched: Arc::default(),
        }
    }

    /// The source of the shards of `shard_keys` (`Opening::shard_keys`): with
    /// `partitioned_by: key_range`, it reads only their partitions and checks each
    /// document's key; otherwise it reads every partition as before.
    pub fn for_shards(mut self, shard_keys: Option<ShardKeys>) -> KafkaSource {
        self.shard_keys = shard_keys.filter(|_| self.config.partitioned_by.is_some());
        self
    }

    async fn broker(&mut self) -> Result<Arc<Broker>, SourceError> {
        if let Some(broker) = &self.broker {
            return Ok(broker.clone());
        }
        let broker = Broker::connect(&self.name, &self.config, RETRY_FOR, &self.health);
        let broker = broker.await?;
        self.broker = Some(broker.clone());
        Ok(broker)
    }

    fn unavailable(&self, position: &Value, partition: i32, reason: String) -> SourceError {
        SourceError::Unavailable {
            name: self.name.clone(),
            position: position.clone(),
            reason: format!(
                "topic {} partition {partition}: {reason}",
                self.config.topic
            ),
        }
    }

    fn config_error(&self, reason: String) -> SourceError {
        SourceError::Config {
            name: self.name.clone(),
            reason,
        }
    }

    /// Fails unless the topic still has every partition in `read`.
    fn check_partitions<'a>(
        &self,
        partitions: &BTreeSet<i32>,
        mut read: impl Iterator<Item = &'a i32>,
    ) -> Result<(), SourceError> {
        match read.find(|p| !partitions.contains(p)) {
            None => Ok(()),
            Some(gone) => Err(self.config_error(format!(
                "topic {} has {} partitions, but partition {gone} was read: a partition \
                 count cannot shrink (was the topic deleted and created again?); reset the \
                 pipeline's recovery log and store to read it anew",
                self.config.topic,
                partitions.len()
            ))),
        }
    }

    /// The partitions to read, of those the topic has: under `partitioned_by:
    /// key_range`, those holding the shards' key hashes, once the topic's count is the
    /// one its position was read over.
    fn assigned(&mut self, partitions: &BTreeSet<i32>) -> Result<BTreeSet<i32>, SourceError> {
        if self.config.partitioned_by.is_some() {
            let count = partitions.len() as u32;
            match self.partition_count {
                Some(had) if had != count => {
                    let reason = repartitioned(&self.config.topic, had as usize, count as usize);
                    return Err(self.config_error(reason));
                }
                _ => self.partition_count = Some(count),
            }
            return Ok(match &self.shard_keys {
                None => partitions.clone(),
                Some(keys) => (keys.ranges().iter())
                    .flat_map(|&(begin, end)| key_range::overlapping(begin, end, count))
                    .map(|p| p as i32)
                    .filter(|p| partitions.contains(p))
                    .collect(),
            });
        }
        let Some(wanted) = &self.config.partitions else {
            return Ok(partitions.clone());
        };
        let wanted: BTreeSet<i32> = wanted.iter().map(|&p| p as i32).collect();
        match wanted.iter().find(|p| !partitions.contains(p)) {
            Some(p) => Err(self.config_error(format!(
                "topic {} has no partition {p} (it has {} partitions)",
                self.config.topic,
                partitions.len()
            ))),
            None => Ok(wanted),
        }
    }

    /// The configured start of each assigned partition, of the topic's `partitions`.
    async fn start(
        &self,
        broker: &Broker,
        partitions: &BTreeSet<i32>,
        assigned: &BTreeSet<i32>,
    ) -> Result<BTreeMap<i32, i64>, SourceError> {
        let mut next = BTreeMap::new();
        for &p in assigned {
            let (earliest, latest) = broker.offsets(p).await?;
            let offset = match &self.config.start {
                Start::Earliest => earliest,
                Start::Latest => latest,
                Start::Offsets(offsets) => match offsets.get(&(p as u32)) {
                    None => earliest,
                    Some(&offset) if (earliest as u64..=latest as u64).contains(&offset) => {
                        offset as i64
                    }
                    Some(offset) => {
                        return Err(self.config_error(format!(
                            "start offset {offset} of topic {} partition {p} is outside its \
                             offsets {earliest}..{latest}",
                            self.config.topic
                        )));
                    }
                },
            };
            next.insert(p, offset);
        }
        if let Start::Offsets(offsets) = &self.config.start
            && let Some(p) = offsets.keys().find(|&&p| !partitions.contains(&(p as i32)))
        {
            return Err(self.config_error(format!(
                "start names partition {p}, which topic {} does not have",
                self.config.topic
            )));
        }
        Ok(next)
    }

    /// The prefetch, started when missing: positioned at `next` (or the configured
    /// start), with partitions added since read from their beginning, and those of
    /// other shards' key ranges left.
    async fn reading(&mut self) -> Result<&Prefetch<Fetched>, SourceError> {
        if self.read_ahead.running().is_none() {
            let broker = self.broker().await?;
            let partitions = broker.partitions().await?;
            let assigned = self.assigned(&partitions)?;
            let mut next = match &self.next {
                Some(next) => next.clone(),
                None => self.start(&broker, &partitions, &assigned).await?,
            };
            self.check_partitions(&partitions, next.keys())?;
            next.retain(|p, _| assigned.contains(p));
            let mut high = BTreeMap::new();
            for &p in &assigned {
                let (earliest, latest) = broker.offsets(p).await?;
                next.entry(p).or_insert(earliest);
                high.insert(p, latest);
            }
            let new_partitions = if self.config.partitioned_by.is_some() {
                NewPartitions::Refuse
            } else if self.config.partitions.is_none() {
                NewPartitions::Read
            } else {
                NewPartitions::Ignore
            };
            let fetch = PartitionFetch::new(
                broker,
                new_partitions,
                self.fetched.clone(),
                next.clone(),
                partitions.len(),
                self.config.fetch_wait,
            );
            self.next = Some(next);
            self.high = high;
            self.read_ahead.start(fetch);
        }
        Ok(self.read_ahead.running().expect("started above"))
    }

    /// Appends the document of `message` (or its input error), checking under
    /// `partitioned_by: key_range` that its key hash is one `partition` holds: else
    /// the shard of its key, which may not read this partition, would never see it.
    fn emit(
        &mut self,
        partition: i32,
        message: &RecordAndOffset,
        out: &mut Records,
        acc: &mut Acc,
    ) -> Result<(), SourceError> {
        let before = out.len();
        self.documents.emit(partition, message, out, acc);
        let (Some(keys), Some(count)) = (&self.shard_keys, self.partition_count) else {
            return Ok(());
        };
        let hash = match out.get(before).map(|r| r.doc) {
            // A document without a key to read: the reader reports it.
            Some(SharedDoc::Json(text)) => keys.key_hash(text),
            _ => None,
        };
        let Some(hash) = hash else {
            return Ok(());
        };
        let holder = key_range::partition_of_hash(hash, count);
        if holder == partition as u32 {
            // Routed by it: the runtime does not read the key again.
            out.set_key_hash(before, hash);
            return Ok(());
        }
        let slice = key_range::slice(holder, count);
        let key = match &message.record.key {
            Some(key) => format!("key {}", String::from_utf8_lossy(key)),
            None => "no key".to_string(),
        };
        Err(self.config_error(format!(
            "topic {} partition {partition} offset {}: the message ({key}) has key hash \
             {hash:08x}, which partitioned_by: key_range puts in partition {holder} of \
             {count} (hashes {:08x}-{:08x}): the topic's producer does not partition by \
             key range, so a shard reading only its partitions would miss such documents \
             (produce with the key_range partitioner, or leave partitioned_by out)",
            self.config.topic,
            message.offset,
            slice.start(),
            slice.end(),
        )))
    }

    /// Re-reads `[begin, end)` of `partition`, skipping offsets missing from it.
    async fn replay_range(
        &mut self,
        broker: &Broker,
        position: &Value,
        partition: i32,
        [begin, end]: [i64; 2],
        out: &mut Records,
        acc: &mut Acc,
    ) -> Result<(), SourceError> {
        let (earliest, latest) = broker.offsets(partition).await?;
        if begin < earliest {
            return Err(self.unavailable(
                position,
                partition,
                format!(
                    "the step read offsets {begin}..{end}, but the partition now begins at \
                     offset {earliest}: retention deleted offsets {begin}..{}",
                    earliest.min(end)
                ),
            ));
        }
        if latest < end {
            return Err(self.unavailable(
                position,
                partition,
                format!(
                    "the step read offsets {begin}..{end}, but the partition now ends at \
                     offset {latest} (was the topic deleted and created again?)"
                ),
            ));
        }
        let client = broker.partition(partition).await?;
        let mut at = begin;
        while at < end {
            let (mut messages, _) = client
                .fetch_records(at, 1..FETCH_BYTES, 0)
                .await
                .map_err(|e| broker.error(Some(partition), e))?;
            self.fetched.count(&messages);
            messages.sort_by_key(|m| m.offset);
            let before = at;
            let (within, next) = within_range(&messages, at, end);
            for message in within {
                self.emit(partition, message, out, acc)?;
            }
            at = next;
            if at == before {
                // Nothing readable up to the range's end: the hash check tells whether
                // that is what the step read.
                break;
            }
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl Source for KafkaSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn fault_tolerance(&self) -> FaultTolerance {
        FaultTolerance::ExactlyOnce
    }

    async fn probe(&mut self) -> Result<(), SourceError> {
        let broker = Broker::connect(&self.name, &self.config, PROBE_FOR, &self.health);
        let broker = broker.await?;
        broker.partitions().await.map(drop)
    }

    async fn seek(&mut self, position: &Value) -> Result<(), SourceError> {
        let target = KafkaPosition::from_value(&self.name, "seek to", position)?;
        let broker = self.broker().await?;
        self.check_partitions(&broker.partitions().await?, target.next.keys())?;
        for (&p, &next) in &target.next {
            let (earliest, latest) = broker.offsets(p).await?;
            if next < earliest {
                return Err(self.unavailable(
                    position,
                    p,
                    format!(
                        "the committed position is offset {next}, but the partition now \
                         begins at offset {earliest}: retention deleted offsets \
                         {next}..{earliest} before they were read"
                    ),
                ));
            }
            if next > latest {
                return Err(self.unavailable(
                    position,
                    p,
                    format!(
                        "the committed position is offset {next}, but the partition now \
                         ends at offset {latest} (was the topic deleted and created again?)"
                    ),
                ));
            }
        }
        self.read_ahead.stop();
        self.next = Some(target.next);
        self.partition_count = target.partitions.or(self.partition_count);
        Ok(())
    }

    async fn replay(&mut self, step: &Resume, out: &mut Records) -> Result<Step, SourceError> {
        let (position, target) = match step {
            Resume::Replay {
                position,
                data: None,
                ..
            } => (
                position,
                KafkaPosition::from_value(&self.name, "replay", position)?,
            ),
            other => {
                return Err(SourceError::BadResume {
                    name: self.name.clone(),
                    action: "replay",
                    resume: serde_json::to_value(other).expect("a resume serializes"),
                    reason: "this source only replays by position".to_string(),
                });
            }
        };
        let broker = self.broker().await?;
        let partitions = broker.partitions().await?;
        self.check_partitions(&partitions, target.next.keys())?;
        self.partition_count = target.partitions.or(self.partition_count);
        self.assigned(&partitions)?;
        self.read_ahead.stop();
        let first = out.len();
        let mut acc = Acc::default();
        for (&partition, &range) in &target.read {
            let replayed = self
                .replay_range(&broker, position, partition, range, out, &mut acc)
                .await;
            if let Err(e) = replayed {
                out.truncate(first);
                return Err(e);
            }
        }
        if let Err(e) = check_replay(&self.name, step, acc.hasher.clone().finish()) {
            out.truncate(first);
            return Err(e);
        }
        self.next = Some(target.next);
        Ok(acc.into_step(false, step.clone()))
    }

    async fn queue(&mut self, limits: QueueLimits, out: &mut Records) -> Result<Step, SourceError> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        let prefetch = self.reading().await?;
        let taken = prefetch.take(limits);
        let more = prefetch.queued().records > 0;
        let mut taken = taken.inspect_err(|_| {
            // Its task ended with the error: the next call starts a new one, after what
            // was queued.
            self.read_ahead.stop();
        })?;
        // Grouped by partition, each in offset order (a stable sort of a FIFO): the
        // order a replay reads the ranges in.
        taken.sort_by_key(Fetched::partition);
        let mut next = self.next.clone().expect("positioned by reading");
        let mut read = BTreeMap::<i32, [i64; 2]>::new();
        let mut acc = Acc::default();
        let first = out.len();
        for fetched in taken {
            match fetched {
                Fetched::Added { partition, offset } => {
                    next.entry(partition).or_insert(offset);
                }
                Fetched::Message {
                    partition,
                    high_watermark,
                    message,
                } => {
                    let offset = message.offset;
                    next.insert(partition, offset + 1);
                    let high = self.high.entry(partition).or_default();
                    *high = (*high).max(high_watermark);
                    read.entry(partition)
                        .and_modify(|range| range[1] = offset + 1)
                        .or_insert([offset, offset + 1]);
                    if let Err(e) = self.emit(partition, &message, out, &mut acc) {
                        out.truncate(first);
                        return Err(e);
                    }
                }
            }
        }
        let caught_up = next
            .iter()
            .all(|(p, &n)| n >= self.high.get(p).copied().unwrap_or_default());
        let position = KafkaPosition {
            next: next.clone(),
            read,
            partitions: self.partition_count,
        };
        self.next = Some(next);
        let hash = acc.hasher.clone().finish();
        let resume = Resume::Replay {
            position: serde_json::to_value(&position).expect("a position serializes"),
            data: None,
            hash,
        };
        Ok(acc.into_step(!more && caught_up, resume))
    }

    async fn ready(&mut self) {
        if self.failed.is_some() {
            return;
        }
        match self.reading().await {
            Ok(prefetch) => prefetch.ready().await,
            Err(e) => self.failed = Some(e),
        }
    }

    fn queued(&self) -> Queued {
        self.read_ahead.queued()
    }

    fn extend(&mut self) {
        self.read_ahead.extend();
    }

    fn pause(&mut self) {
        self.read_ahead.pause();
    }

    /// Offsets behind each partition's high watermark last seen, summed.
    fn lag(&self) -> Option<Lag> {
        let next = self.next.as_ref()?;
        Some(Lag::Messages(offsets_behind(next, &self.high)))
    }

    /// Its prefetch buffer: the fetched records not yet queued, and their slots.
    fn memory(&self) -> u64 {
        self.read_ahead.memory()
    }

    /// Each partition's offsets behind its high watermark last seen, and the records
    /// fetched ahead and not yet queued.
    fn metrics(&self) -> Vec<Metric> {
        let mut metrics = Vec::new();
        if let Some(next) = &self.next {
            metrics.extend(next.iter().filter_map(|(partition, &next)| {
                let behind = self.high.get(partition)?.saturating_sub(next).max(0);
                Some(
                    Metric::gauge(
                        "kafka_partition_lag_messages",
                        "Offsets the partition is behind its high watermark last seen.",
                        behind as u64,
                    )
                    .label("partition", partition),
                )
            }));
        }
        metrics.push(Metric::gauge(
            "kafka_prefetched_messages",
            "Records fetched ahead of the transaction and not yet read into it.",
            self.queued().records as u64,
        ));
        metrics.push(Metric::counter(
            "kafka_fetched_messages",
            "Messages fetched from the brokers, replays included.",
            self.fetched.messages.load(Ordering::Relaxed),
        ));
        metrics.push(Metric::counter(
            "kafka_fetched_bytes",
            "Bytes of messages (keys, values, headers) fetched from the brokers, replays \
             included: what a read partitioned by key range saves.",
            self.fetched.bytes.load(Ordering::Relaxed),
        ));
        metrics
    }

    async fn disconnect(&mut self) {
        self.read_ahead.stop();
        self.broker = None;
    }
}

/// The offsets from each partition's `next` offset to its high watermark in `high`
/// (none for a partition without one yet), summed.
fn offsets_behind(next: &BTreeMap<i32, i64>, high: &BTreeMap<i32, i64>) -> u64 {
    next.iter()
        .filter_map(|(partition, &next)| Some(high.get(partition)?.saturating_sub(next).max(0)))
        .map(|behind| behind as u64)
        .sum()
}

/// Of fetched `messages` (in offset order), those in `[at, end)`, one per offset, and
/// where reading goes on: `end` once a message at or past it shows that the range is
/// complete, else after the last one (offsets missing in between, left by compaction
/// or transaction markers, are simply not there).
fn within_range(messages: &[RecordAndOffset], at: i64, end: i64) -> (Vec<&RecordAndOffset>, i64) {
    let mut within: Vec<&RecordAndOffset> = Vec::new();
    for message in messages.iter().filter(|m| m.offset >= at) {
        if message.offset >= end {
            return (within, end);
        }
        if within
            .last()
            .is_none_or(|last| last.offset < message.offset)
        {
            within.push(message);
        }
    }
    let next = within.last().map_or(at, |last| last.offset + 1);
    (within, next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rskafka::record::Record;

    fn at(offsets: &[i64]) -> Vec<RecordAndOffset> {
        offsets
            .iter()
            .map(|&offset| RecordAndOffset {
                record: Record {
                    key: None,
                    value: Some(offset.to_string().into_bytes()),
                    headers: Default::default(),
                    timestamp: Default::default(),
                },
                offset,
            })
            .collect()
    }

    fn offsets(messages: &[RecordAndOffset], begin: i64, end: i64) -> (Vec<i64>, i64) {
        let (within, next) = within_range(messages, begin, end);
        (within.iter().map(|m| m.offset).collect(), next)
    }

    #[test]
    fn a_range_is_read_across_gaps_and_ends_at_its_end() {
        // A fetch from the middle of a batch returns the batch from its start.
        let gappy = at(&[2, 3, 5, 9, 12]);
        assert_eq!(offsets(&gappy, 3, 10), (vec![3, 5, 9], 10));
        // The range's end not reached yet: go on after the last message.
        assert_eq!(offsets(&gappy, 3, 20), (vec![3, 5, 9, 12], 13));
        // Nothing readable: stay (the caller stops, and the hash decides).
        assert_eq!(offsets(&gappy, 13, 20), (vec![], 13));
        // A batch returned twice does not duplicate a message.
        assert_eq!(offsets(&at(&[4, 4, 5, 5, 6]), 4, 6), (vec![4, 5], 6));
    }

    #[test]
    fn the_lag_sums_each_partitions_offsets_below_its_high_watermark() {
        let next = BTreeMap::from([(0, 10), (1, 7), (2, 3), (3, 0)]);
        // Partition 1 caught up, 2 ahead of a stale watermark, 3 without one yet.
        let high = BTreeMap::from([(0, 25), (1, 7), (2, 1)]);
        assert_eq!(offsets_behind(&next, &high), 15);
        assert_eq!(offsets_behind(&next, &BTreeMap::new()), 0);
    }
}
