//! One topic's connection to the brokers: an rskafka client (built by
//! `sluice_kafka_client`, with its TLS and SASL) whose every request is tried once and
//! bounded by [`REQUEST_TIMEOUT`], its failures as [`OutputError::External`] naming the
//! brokers, the topic and the partition.
//!
//! Tried once because rskafka retries a produce whose connection broke after the
//! request went out, and the broker may have written it already: a silent retry could
//! write it twice. A failure instead reaches the runtime, which reopens the stream; the
//! endpoint's `open` then reads every partition's tail anew, and the replay discards
//! whatever had landed.

use rskafka::BackoffConfig;
use rskafka::client::Client;
use rskafka::client::error::{Error as KafkaError, ProtocolError};
use rskafka::client::partition::{Compression, OffsetAt, PartitionClient, UnknownTopicHandling};
use rskafka::record::{Record, RecordAndOffset};
use sluice_kafka_client::{ConnectError, Connector};
use sluice_output_sdk::{OutputError, Result};
use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

/// How long one request to the brokers may take before it is a failure.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The most bytes one fetch asks for.
const FETCH_BYTES: i32 = 4 << 20;

/// rskafka's backoff with a zero deadline: the first failure ends the request.
fn tried_once() -> BackoffConfig {
    BackoffConfig {
        deadline: Some(Duration::ZERO),
        ..BackoffConfig::default()
    }
}

pub struct Connection {
    client: Client,
    topic: String,
    /// `a:9092,b:9092`, for errors.
    brokers: String,
}

impl Connection {
    /// A client of `connector`'s brokers for `topic`, connecting tried once within
    /// [`REQUEST_TIMEOUT`]; brokers refusing its TLS or SASL settings are a
    /// [`OutputError::Config`] (not retried: the same settings are refused again).
    pub async fn connect(connector: &Connector, topic: &str) -> Result<Connection> {
        let brokers = connector.brokers();
        let failed =
            |why: String| format!("connecting to brokers {brokers} for topic {topic}: {why}");
        let client = match tokio::time::timeout(REQUEST_TIMEOUT, connector.connect(tried_once()))
            .await
        {
            Ok(Ok(client)) => client,
            Ok(Err(ConnectError::Refused(why))) => return Err(OutputError::Config(failed(why))),
            Ok(Err(ConnectError::Failed(why))) => return Err(OutputError::External(failed(why))),
            Err(_) => {
                let why = format!("no answer within {} s", REQUEST_TIMEOUT.as_secs());
                return Err(OutputError::External(failed(why)));
            }
        };
        Ok(Connection {
            client,
            topic: topic.to_string(),
            brokers,
        })
    }

    /// `topic t partition p`, or `topic t` for the topic as a whole.
    pub fn place(&self, partition: Option<i32>) -> String {
        match partition {
            Some(p) => format!("topic {} partition {p}", self.topic),
            None => format!("topic {}", self.topic),
        }
    }

    fn external(&self, partition: Option<i32>, doing: &str, err: impl Display) -> OutputError {
        OutputError::External(format!(
            "{doing} {} on brokers {}: {err}",
            self.place(partition),
            self.brokers
        ))
    }

    /// Awaits one request, its failure or timeout as an error naming what it did where.
    async fn request<T>(
        &self,
        partition: Option<i32>,
        doing: &str,
        request: impl Future<Output = Result<T, KafkaError>>,
    ) -> Result<T> {
        match tokio::time::timeout(REQUEST_TIMEOUT, request).await {
            Ok(result) => result.map_err(|e| self.external(partition, doing, e)),
            Err(_) => Err(self.external(
                partition,
                doing,
                format!("no answer within {} s", REQUEST_TIMEOUT.as_secs()),
            )),
        }
    }

    /// How many partitions the topic has; `None` when it does not exist.
    pub async fn partition_count(&self) -> Result<Option<usize>> {
        let topics = self
            .request(None, "listing the partitions of", self.client.list_topics())
            .await?;
        Ok(topics
            .into_iter()
            .find(|t| t.name == self.topic)
            .map(|t| t.partitions.len()))
    }

    /// Creates the topic with `partitions` partitions, replicated as the brokers'
    /// default; one created meanwhile by someone else is as good.
    pub async fn create_topic(&self, partitions: i32) -> Result<()> {
        let controller = self
            .client
            .controller_client()
            .map_err(|e| self.external(None, "creating", e))?;
        let create = async {
            match controller
                .create_topic(&self.topic, partitions, -1, 10_000)
                .await
            {
                Err(KafkaError::ServerError {
                    protocol_error: ProtocolError::TopicAlreadyExists,
                    ..
                }) => Ok(()),
                created => created,
            }
        };
        self.request(None, "creating", create).await
    }

    pub async fn partition(&self, partition: i32) -> Result<PartitionClient> {
        let client = self.client.partition_client(
            self.topic.clone(),
            partition,
            UnknownTopicHandling::Error,
        );
        self.request(Some(partition), "connecting to", client).await
    }

    /// The partition's earliest retained offset and its high watermark.
    pub async fn offsets(&self, client: &PartitionClient) -> Result<(i64, i64)> {
        let p = Some(client.partition());
        let earliest = self
            .request(
                p,
                "reading the offsets of",
                client.get_offset(OffsetAt::Earliest),
            )
            .await?;
        let latest = self
            .request(
                p,
                "reading the offsets of",
                client.get_offset(OffsetAt::Latest),
            )
            .await?;
        Ok((earliest, latest))
    }

    /// The messages from `offset` on that one fetch returns, and the high watermark.
    pub async fn fetch(
        &self,
        client: &PartitionClient,
        offset: i64,
    ) -> Result<(Vec<RecordAndOffset>, i64)> {
        let fetch = client.fetch_records(offset, 1..FETCH_BYTES, 0);
        self.request(Some(client.partition()), "reading", fetch)
            .await
    }

    /// Produces `records` as one request; their offsets once the broker acknowledged.
    pub async fn produce(
        &self,
        client: &PartitionClient,
        records: Vec<Record>,
    ) -> Result<Vec<i64>> {
        let produce = client.produce(records, Compression::NoCompression);
        self.request(Some(client.partition()), "producing to", produce)
            .await
    }
}
