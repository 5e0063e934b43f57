//! One binding's topic: the tail of every partition, read at open, and pushes that skip
//! what a partition holds.
//!
//! Each partition has a producer task of its own. A push queues each partition's share of
//! its messages and returns; the task sends them in order, one request at a time, each
//! request taking whatever is queued by then (up to [`PRODUCE_BYTES`], so later pushes'
//! messages join it); `batch_end` waits until every partition acknowledged everything.
//! So the broker works on every partition, and on the messages of earlier pushes, while
//! the next push is encoded, and no push waits for the slowest partition. Order within a
//! partition holds (one request in flight each), which is what its tail relies on.

use crate::config::{Config, Resource};
use crate::connection::Connection;
use crate::partitioner::Partitioner;
use crate::stamp::{self, Stamp};
use async_trait::async_trait;
use futures::future::join_all;
use rskafka::client::partition::PartitionClient;
use rskafka::record::Record;
use sluice_kafka_client::Connector;
use sluice_output_sdk::{
    BatchKind, Buffer, Generation, OutputEndpoint, OutputError, Result, Tail, Target,
};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// Bytes of records one produce request carries at most: under the 1 MiB a Kafka
/// broker accepts by default (`message.max.bytes`), headers and framing included.
pub const PRODUCE_BYTES: usize = 512 << 10;

/// Pushes' shares a partition's queue holds before a push waits for its producer: a
/// few requests' worth (a push is `max_buffer_size_bytes` over every partition).
const QUEUED_SHARES: usize = 4;

pub struct KafkaEndpoint {
    connector: Connector,
    topic: String,
    /// Partitions of the topic if this endpoint creates it.
    create_partitions: i32,
    partitioner: Partitioner,
    materialization: String,
    generation: Generation,
    max_buffer_size_bytes: usize,
    /// The kind of the batch being written.
    batch: BatchKind,
    /// `None` before `open`, and after a failed produce or an abort (which of its
    /// messages landed is unknown until the tails are read again).
    topic_state: Option<TopicState>,
}

struct TopicState {
    connection: Arc<Connection>,
    producers: Vec<Producer>,
}

/// What a partition holds, as read at open.
struct PartitionState {
    client: PartitionClient,
    /// The last message the partition holds (`None`: none of this materialization's
    /// generation).
    tail: Option<Tail>,
    /// The offset the partition's next message gets (its high watermark).
    next_offset: i64,
}

/// A partition's producer task (see the module docs), and its tail as of open: what a
/// replayed transaction's messages are compared with (every later message is new).
struct Producer {
    queue: mpsc::Sender<Order>,
    task: JoinHandle<()>,
    tail: Option<Tail>,
}

/// What a push asks of a partition's producer.
enum Order {
    /// Messages to send after those queued before, with their approximate bytes.
    Send(Vec<(Record, Tail)>, usize),
    /// Answer once everything queued before is acknowledged, or with the first failure.
    Flush(oneshot::Sender<Result<()>>),
}

/// What producing to one partition acknowledged, and how it ended.
struct Produced {
    tail: Option<Tail>,
    next_offset: i64,
    result: Result<()>,
}

impl KafkaEndpoint {
    /// The endpoint of `resource`; fails when the TLS or SASL files cannot be read.
    pub fn new(config: &Config, resource: &Resource, target: &Target) -> Result<KafkaEndpoint> {
        Ok(KafkaEndpoint {
            connector: config.connector()?,
            topic: resource.topic.clone(),
            create_partitions: resource.partitions,
            partitioner: resource.partitioner,
            materialization: target.materialization.clone(),
            generation: target.generation,
            max_buffer_size_bytes: config.max_buffer_size_bytes.get(),
            batch: BatchKind::Delta,
            topic_state: None,
        })
    }

    /// Drops the topic's state once its producers have stopped: the next push opens it
    /// again, reading the tails.
    async fn close(&mut self) {
        if let Some(state) = self.topic_state.take() {
            state.close().await;
        }
    }

    /// Connects, creates the topic if it is missing, and reads every partition's tail.
    async fn read_topic_state(&self) -> Result<TopicState> {
        let connection = Connection::connect(&self.connector, &self.topic).await?;
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
            .collect::<Result<Vec<_>>>()?;
        let connection = Arc::new(connection);
        let producers = (partitions.into_iter())
            .map(|partition| {
                let (queue, orders) = mpsc::channel(QUEUED_SHARES);
                Producer {
                    tail: partition.tail,
                    task: tokio::spawn(produce(connection.clone(), partition, orders)),
                    queue,
                }
            })
            .collect();
        Ok(TopicState {
            connection,
            producers,
        })
    }
}

impl TopicState {
    /// Waits until every partition acknowledged what was pushed; the first failure.
    async fn flush(&self) -> Result<()> {
        let asked = self.producers.iter().map(|producer| async {
            let (answer, answered) = oneshot::channel();
            if producer.queue.send(Order::Flush(answer)).await.is_err() {
                return Err(self.stopped());
            }
            answered.await.unwrap_or_else(|_| Err(self.stopped()))
        });
        join_all(asked).await.into_iter().collect()
    }

    fn stopped(&self) -> OutputError {
        OutputError::External(format!(
            "{}: a partition's producer stopped",
            self.connection.place(None)
        ))
    }

    /// Stops the producers once their requests in flight are answered, so that nothing
    /// of this state lands after the tails are read again.
    async fn close(self) {
        let tasks: Vec<_> = (self.producers.into_iter())
            .map(|producer| producer.task)
            .collect();
        for task in tasks {
            let _ = task.await;
        }
    }
}

/// A partition's producer task: sends the queued messages in order, one request at a
/// time, each of what is queued by then. After a failure it sends nothing more: the next
/// flush hears the failure (and the state is closed, the tails read again).
async fn produce(
    connection: Arc<Connection>,
    mut partition: PartitionState,
    mut orders: mpsc::Receiver<Order>,
) {
    let mut failure: Option<OutputError> = None;
    let mut stopped = false;
    let mut records = Vec::new();
    while let Some(order) = orders.recv().await {
        // Take what is queued, up to a flush or a request's worth.
        let (mut next, mut bytes, mut flush) = (Some(order), 0, None);
        while let Some(order) = next.take() {
            match order {
                Order::Flush(answer) => flush = Some(answer),
                Order::Send(mut share, share_bytes) => {
                    records.append(&mut share);
                    bytes += share_bytes;
                    if bytes < PRODUCE_BYTES {
                        next = orders.try_recv().ok();
                    }
                }
            }
        }
        if !stopped && !records.is_empty() {
            let produced = produce_in_order(&connection, &partition, &mut records).await;
            partition.tail = produced.tail;
            partition.next_offset = produced.next_offset;
            if let Err(err) = produced.result {
                (failure, stopped) = (Some(err), true);
            }
        }
        records.clear();
        if let Some(answer) = flush {
            let answered = match (failure.take(), stopped) {
                (Some(err), _) => Err(err),
                (None, true) => Err(OutputError::External(format!(
                    "{}: stopped after an earlier failure",
                    connection.place(Some(partition.client.partition()))
                ))),
                (None, false) => Ok(()),
            };
            let _ = answer.send(answered);
        }
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
    records: &mut Vec<(Record, Tail)>,
) -> Produced {
    let mut produced = Produced {
        tail: partition.tail,
        next_offset: partition.next_offset,
        result: Ok(()),
    };
    let mut records = records.drain(..).peekable();
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
        let connection = Connection::connect(&self.connector, &self.topic).await?;
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

    /// Queues each partition's share of the messages with its producer (see the module
    /// docs); waits only while a producer's queue is full.
    async fn push(&mut self, buffer: &Buffer) -> Result<()> {
        if self.topic_state.is_none() {
            self.open().await?;
        }
        let state = self.topic_state.as_ref().expect("opened above");
        let timestamp = rskafka::chrono::Utc::now();
        let mut shares: Vec<(Vec<(Record, Tail)>, usize)> =
            state.producers.iter().map(|_| (Vec::new(), 0)).collect();
        let mut discarded = 0;
        for message in buffer.messages() {
            let p = self.partitioner.partition(&message, shares.len());
            if Tail::holds(state.producers[p].tail, &message) {
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
            shares[p].1 += record.approximate_size();
            shares[p].0.push((record, tail));
        }
        if discarded > 0 {
            tracing::info!(
                topic = %self.topic,
                txn = buffer.txn(),
                discarded,
                "a replayed transaction: discarded the messages the topic holds"
            );
        }
        let mut stopped = None;
        for (producer, (records, bytes)) in state.producers.iter().zip(shares) {
            if !records.is_empty()
                && producer
                    .queue
                    .send(Order::Send(records, bytes))
                    .await
                    .is_err()
            {
                stopped = Some(state.stopped());
                break;
            }
        }
        match stopped {
            None => Ok(()),
            Some(err) => {
                self.close().await;
                Err(err)
            }
        }
    }

    /// Waits until the broker acknowledged every message pushed.
    async fn batch_end(&mut self) -> Result<()> {
        let Some(state) = &self.topic_state else {
            return Ok(());
        };
        let flushed = state.flush().await;
        if flushed.is_err() {
            self.close().await;
        }
        flushed
    }

    /// Stops producing: what was produced stays, and the replay discards it.
    async fn abort(&mut self) {
        self.close().await;
    }
}
