//! What `sluice produce`, tests, benchmarks and the torture helper need of a broker:
//! create a topic with N partitions, produce to a partition, delete a topic. (Starting a
//! local broker for tests is `sluice_testkit::tansu`.)

use crate::broker::{RETRY_FOR, retrying_for};
use rskafka::chrono::{DateTime, Utc};
use rskafka::client::Client;
use rskafka::client::partition::{Compression, UnknownTopicHandling};
use rskafka::record::Record;
use sluice_kafka_client::Connector;

pub use rskafka::client::error::Error;

/// A client for topic administration and producing.
pub struct Admin {
    client: Client,
}

impl Admin {
    /// An admin of `brokers` over plain TCP, unauthenticated.
    pub async fn connect(brokers: &[String]) -> Result<Admin, Error> {
        Admin::over(&Connector::plain("sluice", brokers)).await
    }

    /// An admin reaching the brokers as `connector` says (TLS, SASL).
    pub async fn over(connector: &Connector) -> Result<Admin, Error> {
        let client = connector.builder(retrying_for(RETRY_FOR)).build().await?;
        Ok(Admin { client })
    }

    /// Creates `topic` with `partitions` partitions, replicated as the brokers' default.
    pub async fn create_topic(&self, topic: &str, partitions: i32) -> Result<(), Error> {
        self.client
            .controller_client()?
            .create_topic(topic, partitions, -1, 10_000)
            .await
    }

    pub async fn delete_topic(&self, topic: &str) -> Result<(), Error> {
        self.client
            .controller_client()?
            .delete_topic(topic, 10_000)
            .await
    }

    /// How many partitions `topic` has; `None` when it does not exist.
    pub async fn partitions(&self, topic: &str) -> Result<Option<usize>, Error> {
        let topics = self.client.list_topics().await?;
        Ok(topics
            .into_iter()
            .find(|t| t.name == topic)
            .map(|t| t.partitions.len()))
    }

    /// Produces `(key, value)` messages to `partition` as one batch, timestamped now;
    /// returns their offsets.
    pub async fn produce(
        &self,
        topic: &str,
        partition: i32,
        messages: impl IntoIterator<Item = (Option<Vec<u8>>, Vec<u8>)>,
    ) -> Result<Vec<i64>, Error> {
        let now = now_millis();
        let records = messages
            .into_iter()
            .map(|(key, value)| Record {
                key,
                value: Some(value),
                headers: Default::default(),
                timestamp: now,
            })
            .collect();
        self.produce_records(topic, partition, records).await
    }

    /// Produces whole records (headers, timestamps, tombstones) as one batch.
    pub async fn produce_records(
        &self,
        topic: &str,
        partition: i32,
        records: Vec<Record>,
    ) -> Result<Vec<i64>, Error> {
        self.client
            .partition_client(topic, partition, UnknownTopicHandling::Retry)
            .await?
            .produce(records, Compression::NoCompression)
            .await
    }
}

/// Now, to the millisecond (what a Kafka timestamp holds).
fn now_millis() -> DateTime<Utc> {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    DateTime::from_timestamp_millis(since_epoch.as_millis() as i64).unwrap_or_default()
}
