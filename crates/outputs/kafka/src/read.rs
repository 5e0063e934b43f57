//! Reading back what the output wrote, for tests, benchmarks and torture: every message
//! of a topic with its stamp, to check each (transaction, index) arrived once and in
//! order. (Deleting a topic is `sluice_kafka::admin::Admin::delete_topic`; on tansu
//! 0.6.0 only with no fetch in flight anywhere on the broker, or it stops serving.)

use crate::connection::Connection;
use crate::stamp::Stamp;
use sluice_kafka_client::Connector;
use sluice_output_sdk::{OutputError, Result};

/// A message of the topic, as a consumer reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Written {
    pub partition: i32,
    pub offset: i64,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    pub stamp: Stamp,
}

/// Every message of `topic`: partition by partition, in offset order, from each
/// partition's earliest retained offset to its high watermark when it is read. A
/// message without the output's headers is [`OutputError::Corrupt`].
pub async fn read_topic(brokers: &[String], topic: &str) -> Result<Vec<Written>> {
    read_topic_over(&Connector::plain("sluice-read", brokers), topic).await
}

/// [`read_topic`] over `connector`'s TLS and SASL.
pub async fn read_topic_over(connector: &Connector, topic: &str) -> Result<Vec<Written>> {
    let connection = Connection::connect(connector, topic).await?;
    let count = (connection.partition_count().await?)
        .ok_or_else(|| OutputError::Config(format!("topic {topic} does not exist")))?;
    let mut written = Vec::new();
    for partition in 0..count as i32 {
        let client = connection.partition(partition).await?;
        let (mut offset, end) = connection.offsets(&client).await?;
        while offset < end {
            let (records, _) = connection.fetch(&client, offset).await?;
            let from = offset;
            for message in records.into_iter().take_while(|m| m.offset < end) {
                let stamp = Stamp::parse(&message.record.headers).map_err(|why| {
                    OutputError::Corrupt(format!(
                        "{} offset {}: {why}",
                        connection.place(Some(partition)),
                        message.offset
                    ))
                })?;
                offset = message.offset + 1;
                written.push(Written {
                    partition,
                    offset: message.offset,
                    key: message.record.key.unwrap_or_default(),
                    value: message.record.value.unwrap_or_default(),
                    stamp,
                });
            }
            if offset == from {
                return Err(OutputError::Corrupt(format!(
                    "{}: no message can be read at offset {from}, below the high watermark {end}",
                    connection.place(Some(partition))
                )));
            }
        }
    }
    Ok(written)
}
