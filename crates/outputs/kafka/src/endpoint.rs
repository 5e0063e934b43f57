//! One binding's topic: the tail of every partition, read at open and advanced as the
//! broker acknowledges, and pushes that skip what a partition holds.

use crate::config::{Config, Resource};
use crate::connection::Connection;
use crate::partitioner::partition_of;
use crate::stamp::{self, Stamp};
use async_trait::async_trait;
use futures::future::join_all;
use rskafka::client::partition::PartitionClient;
use rskafka::record::Record;
use sluice_output_sdk::{
    BatchKind, Buffer, Generation, OutputEndpoint, OutputError, Result, Tail, Target,
};

/// Bytes of records one produce request carries at most: under the 1 MiB a Kafka
/// broker accepts by default (`message.max.bytes`), headers and framing included.
pub const PRODUCE_BYTES: usize = 512 << 10;

pub struct KafkaEndpoint {
    brokers: Vec<String>,
    topic: String,
    /// Partitions of the topic if this endpoint creates it.
    create_partitions: i32,
    materialization: String,
    generation: Generation,
    max_buffer_size_bytes: usize,
    /// The kind of the batch being written.
    batch: BatchKind,
    /// `None` before `open`, and after a failed produce (which of its messages landed
    /// is unknown until the tails are read again).
    topic_state: Option<TopicState>,
}

struct TopicState {
    connection: Connection,
    partitions: Vec<PartitionState>,
}

struct PartitionState {
    client: PartitionClient,
    /// The last message the partition holds (`None`: none of this materialization's
    /// generation).
    tail: Option<Tail>,
    /// The offset the partition's next message gets (its high watermark).
    next_offset: i64,
}

/// What producing to one partition acknowledged, and how it ended.
struct Produced {
    tail: Option<Tail>,
    next_offset: i64,
    result: Result<()>,
}

impl KafkaEndpoint {
    pub fn new(config: &Config, resource: &Resource, target: &Target) -> KafkaEndpoint {
        KafkaEndpoint {
            brokers: config.brokers.clone(),
            topic: resource.topic.clone(),
            create_partitions: resource.partitions,
            materialization: target.materialization.clone(),
            generation: target.generation,
            max_buffer_size_bytes: config.max_buffer_size_bytes.get(),
            batch: BatchKind::Delta,
            topic_state: None,
        }
    }

    /// Connects, creates the topic if it is missing, and reads every partition's tail.
    async fn read_topic_state(&self) -> Result<TopicState> {
        let connection = Connection::connect(&self.brokers, &self.topic).await?;
        let count = match connection.partition_count().await? {
            Some(count) => count,
            None => {
                connection.create_topic(self.create_partitions).await?;
                connection.partition_count().await?.ok_or_else(|| {
                    OutputError::External(format!(
                        "topic {} was created but the brokers do not list it yet",
                        self.topic
                    ))
                })?
            }
        };
        let partitions = (0..count as i32)
            .map(|p| read_partition(&connection, p, &self.materialization, self.generation));
        let partitions = join_all(partitions)
            .await
            .into_iter()
            .collect::<Result<_>>()?;
        Ok(TopicState {
            connection,
            partitions,
        })
    }
}

/// A partition's client, tail and high watermark. A last message of another generation
/// of the materialization (written before a reset) is no tail of `generation`'s: the
/// partition holds nothing of it yet.
async fn read_partition(
    connection: &Connection,
    partition: i32,
    materialization: &str,
    generation: Generation,
) -> Result<PartitionState> {
    let client = connection.partition(partition).await?;
    let (earliest, high_watermark) = connection.offsets(&client).await?;
    let tail = if earliest >= high_watermark {
        // Empty, or retention removed every message: nothing recent to skip.
        None
    } else {
        let last = high_watermark - 1;
        let (records, _) = connection.fetch(&client, last).await?;
        let corrupt = |why: String| {
            OutputError::Corrupt(format!(
                "{} ends at offset {last} with a message this output did not write ({why}): \
                 another producer writes to the topic, so where this output's messages end \
                 cannot be known; give the binding a topic of its own",
                connection.place(Some(partition))
            ))
        };
        let record = records
            .into_iter()
            .find(|r| r.offset == last)
            .ok_or_else(|| corrupt("it cannot be read: a transaction marker?".into()))?
            .record;
        let stamp = Stamp::parse(&record.headers).map_err(corrupt)?;
        if stamp.materialization != materialization {
            return Err(corrupt(format!(
                "materialization {} wrote it, not {materialization}",
                stamp.materialization
            )));
        }
        if generation.owns(stamp.generation) {
            Some(stamp.tail())
        } else {
            tracing::info!(
                place = %connection.place(Some(partition)),
                generation = %generation.id,
                ended_with = ?stamp.generation.map(|g| g.to_string()),
                "the partition ends with an earlier generation's message (a reset): \
                 nothing of this generation is written yet"
            );
            None
        }
    };
    Ok(PartitionState {
        client,
        tail,
        next_offset: high_watermark,
    })
}

/// Produces a partition's `records` (each with its transaction and index) in order,
/// one request at a time, each acknowledged before the next is sent.
async fn produce_in_order(
    connection: &Connection,
    partition: &PartitionState,
    records: Vec<(Record, Tail)>,
) -> Produced {
    let mut produced = Produced {
        tail: partition.tail,
        next_offset: partition.next_offset,
        result: Ok(()),
    };
    let mut records = records.into_iter().peekable();
    while records.peek().is_some() {
        let (mut request, mut bytes, mut last) = (Vec::new(), 0, None);
        while let Some((record, _)) = records.peek() {
            let size = record.approximate_size();
            if !request.is_empty() && bytes + size > PRODUCE_BYTES {
                break;
            }
            let (record, tail) = records.next().expect("peeked");
            bytes += size;
            last = Some(tail);
            request.push(record);
        }
        let count = request.len() as i64;
        let offsets = match connection.produce(&partition.client, request).await {
            Ok(offsets) => offsets,
            Err(err) => {
                produced.result = Err(err);
                return produced;
            }
        };
        if offsets.first() != Some(&produced.next_offset) {
            produced.result = Err(OutputError::Corrupt(format!(
                "{}: the broker put {count} messages of this output at offset {:?}, not at \
                 {} where the partition ended: another producer writes to the topic",
                connection.place(Some(partition.client.partition())),
                offsets.first(),
                produced.next_offset
            )));
            return produced;
        }
        produced.tail = last;
        produced.next_offset += count;
    }
    produced
}

#[async_trait]
impl OutputEndpoint for KafkaEndpoint {
    async fn open(&mut self) -> Result<()> {
        self.topic_state = Some(self.read_topic_state().await?);
        Ok(())
    }

    async fn probe(&mut self) -> Result<String> {
        let connection = Connection::connect(&self.brokers, &self.topic).await?;
        Ok(match connection.partition_count().await? {
            Some(count) => format!("topic {} exists, {count} partitions", self.topic),
            None => format!(
                "topic {} is created at the first run, {} partitions",
                self.topic, self.create_partitions
            ),
        })
    }

    fn max_buffer_size_bytes(&self) -> usize {
        self.max_buffer_size_bytes
    }

    async fn batch_start(&mut self, _txn: u64, kind: BatchKind) -> Result<()> {
        self.batch = kind;
        Ok(())
    }

    async fn push(&mut self, buffer: &Buffer) -> Result<()> {
        if self.topic_state.is_none() {
            self.open().await?;
        }
        let state = self.topic_state.as_mut().expect("opened above");
        let timestamp = rskafka::chrono::Utc::now();
        let mut pending: Vec<Vec<(Record, Tail)>> =
            state.partitions.iter().map(|_| Vec::new()).collect();
        let mut discarded = 0;
        for message in buffer.messages() {
            let p = partition_of(message.key, pending.len());
            if Tail::holds(state.partitions[p].tail, &message) {
                // Written before a crash; the transaction is being replayed.
                discarded += 1;
                continue;
            }
            let record = stamp::record(
                &message,
                self.batch,
                &self.materialization,
                self.generation.id,
                timestamp,
            );
            let tail = Tail {
                txn: message.txn,
                index: message.index,
            };
            pending[p].push((record, tail));
        }
        if discarded > 0 {
            tracing::info!(
                topic = %self.topic,
                txn = buffer.txn(),
                discarded,
                "a replayed transaction: discarded the messages the topic holds"
            );
        }
        let connection = &state.connection;
        let producing = (state.partitions.iter().zip(pending))
            .map(|(partition, records)| produce_in_order(connection, partition, records));
        let produced = join_all(producing).await;
        let mut failure = None;
        for (partition, produced) in state.partitions.iter_mut().zip(produced) {
            partition.tail = produced.tail;
            partition.next_offset = produced.next_offset;
            failure = failure.or(produced.result.err());
        }
        match failure {
            None => Ok(()),
            Some(err) => {
                self.topic_state = None;
                Err(err)
            }
        }
    }

    /// Every push waited for the broker's acknowledgement of its messages.
    async fn batch_end(&mut self) -> Result<()> {
        Ok(())
    }

    /// What was produced stays: the replay discards it.
    async fn abort(&mut self) {}
}
