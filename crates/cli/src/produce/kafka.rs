//! Producing to the topic a `kafka` source reads. Each document goes to one of the
//! partitions the source reads, chosen by the hash of its collection key, so that one
//! key's documents stay in one partition, in file order: the source orders documents
//! within a partition only. The hash is Kafka's own partitioner for keyed messages
//! ([`partition_of`]: murmur2 of the message key), or, for a source `partitioned_by:
//! key_range`, the runtime's key hash of the document's collection key
//! ([`key_range`]: the partition holding that hash's slice), read as the runtime reads
//! it. The message key is the collection key as a JSON object of its fields
//! (`{"user_id":"u0042"}`), as the `kafka` output writes keys.
//!
//! A chunk is split per partition into requests of at most [`PRODUCE_BYTES`] (under
//! the broker's default message size limit); the partitions are produced to at once,
//! each one request after another, so each partition receives its documents in order.

use anyhow::{Context as _, bail};
use futures::future::try_join_all;
use rskafka::record::Record;
use serde_json::{Map, Value};
use sluice_doc::Pointer;
use sluice_kafka::KafkaConfig;
use sluice_kafka::admin::Admin;
use sluice_kafka_client::{Connector, key_range};
use sluice_kafka_output::PRODUCE_BYTES;
use sluice_kafka_output::partitioner::partition_of;
use sluice_source_sdk::ShardKeys;

pub struct Topic {
    admin: Admin,
    topic: String,
    /// The partitions the source reads, which the documents are spread over.
    partitions: Vec<i32>,
    /// The collection key's pointers, and the field each is named by in a message key.
    key: Vec<(Pointer, String)>,
    /// For a source `partitioned_by: key_range`: how a document's key hash is read.
    key_range: Option<ShardKeys>,
}

impl Topic {
    /// Connects to the source's brokers; creates its topic with `create` partitions
    /// when it does not exist (by default 1, or enough for the partitions the source
    /// names). `key_range`: partition by key range, each document's key hash read so.
    pub async fn open(
        config: &KafkaConfig,
        key: &[Pointer],
        key_range: Option<ShardKeys>,
        create: Option<i32>,
    ) -> anyhow::Result<Topic> {
        let (brokers, topic) = (config.brokers.join(","), &config.topic);
        let connector = Connector::new(
            "sluice",
            &config.brokers,
            config.tls.as_ref(),
            config.sasl.as_ref(),
        )?;
        let admin = (Admin::over(&connector).await)
            .with_context(|| format!("connecting to brokers {brokers}"))?;
        let count = match admin.partitions(topic).await {
            Ok(Some(count)) => count,
            Ok(None) => {
                let named = config.partitions.iter().flatten().max();
                let create = create.unwrap_or(named.map_or(1, |&p| p as i32 + 1));
                (admin.create_topic(topic, create).await)
                    .with_context(|| format!("creating topic {topic} on brokers {brokers}"))?;
                println!("created topic {topic} with {create} partitions");
                create as usize
            }
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("reading topic {topic} on brokers {brokers}"));
            }
        };
        let partitions = match &config.partitions {
            None => (0..count as i32).collect(),
            Some(read) => {
                if let Some(p) = read.iter().find(|&&p| p as usize >= count) {
                    bail!(
                        "the source reads partition {p} of topic {topic}, which has {count} \
                         partitions"
                    );
                }
                read.iter().map(|&p| p as i32).collect()
            }
        };
        let key = key
            .iter()
            .map(|ptr| {
                (
                    ptr.clone(),
                    ptr.to_string().trim_start_matches('/').to_string(),
                )
            })
            .collect();
        Ok(Topic {
            admin,
            topic: topic.clone(),
            partitions,
            key,
            key_range,
        })
    }

    /// `topic pageviews`.
    pub fn name(&self) -> String {
        format!("topic {}", self.topic)
    }

    /// Produces `documents`; returns once the brokers acknowledged every one.
    pub async fn send(&self, documents: Vec<Vec<u8>>) -> anyhow::Result<()> {
        let timestamp = rskafka::chrono::Utc::now();
        let mut by_partition: Vec<Vec<Record>> = vec![Vec::new(); self.partitions.len()];
        for document in documents {
            let key = self.key_of(&document)?;
            let p = match &self.key_range {
                None => partition_of(&key, self.partitions.len()),
                Some(keys) => {
                    let Some(hash) = keys.key_hash(&document) else {
                        bail!(
                            "document with key {} has no collection key to partition by \
                             key range: the pipeline would refuse it",
                            String::from_utf8_lossy(&key)
                        );
                    };
                    key_range::partition_of_hash(hash, self.partitions.len() as u32) as usize
                }
            };
            by_partition[p].push(Record {
                key: Some(key),
                value: Some(document),
                headers: Default::default(),
                timestamp,
            });
        }
        let producing = (self.partitions.iter().zip(by_partition))
            .map(|(&partition, records)| self.produce_in_order(partition, records));
        try_join_all(producing).await?;
        Ok(())
    }

    /// The message key of `document`: its key fields as a JSON object (a location the
    /// document lacks is null).
    fn key_of(&self, document: &[u8]) -> anyhow::Result<Vec<u8>> {
        let document: Value = serde_json::from_slice(document)
            .context("a document that was checked no longer parses: did the file change?")?;
        let fields: Map<String, Value> = (self.key.iter())
            .map(|(ptr, field)| {
                let value = ptr.query(&document).cloned().unwrap_or(Value::Null);
                (field.clone(), value)
            })
            .collect();
        Ok(serde_json::to_vec(&fields).expect("a JSON object serializes"))
    }

    /// Produces `records` to `partition` in requests of at most [`PRODUCE_BYTES`], one
    /// after another.
    async fn produce_in_order(&self, partition: i32, records: Vec<Record>) -> anyhow::Result<()> {
        let mut records = records.into_iter().peekable();
        while records.peek().is_some() {
            let (mut request, mut bytes) = (Vec::new(), 0);
            while let Some(record) = records
                .next_if(|r| request.is_empty() || bytes + r.approximate_size() <= PRODUCE_BYTES)
            {
                bytes += record.approximate_size();
                request.push(record);
            }
            (self
                .admin
                .produce_records(&self.topic, partition, request)
                .await)
                .with_context(|| {
                    format!("producing to topic {} partition {partition}", self.topic)
                })?;
        }
        Ok(())
    }
}
