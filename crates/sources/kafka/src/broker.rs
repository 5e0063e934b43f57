//! The connection to the brokers that a source shares between its fetch task and its
//! own calls (seek, replay): one client, a partition client per partition, offsets
//! looked up per partition, and client errors as [`SourceError`]s that name the topic.
//!
//! Connecting is dialled one round at a time (each broker once) until its deadline
//! passes ([`RETRY_FOR`], [`PROBE_FOR`]), each failed round told to the source's
//! [`Health`]: the client would retry inside one call for as long, saying nothing, and
//! the status page would show a source that cannot reach a broker as fine until the
//! call failed. The connection kept is
//! built once a round got through, with the client's own retries for what follows (a
//! broker restarting, a leader moving). The client is built by `sluice_kafka_client`
//! (TLS, SASL); brokers refusing its settings end connecting at once, not retryable.

use crate::config::KafkaConfig;
use rskafka::BackoffConfig;
use rskafka::client::Client;
use rskafka::client::partition::{OffsetAt, PartitionClient, UnknownTopicHandling};
use sluice_kafka_client::{ConnectError, Connector};
use sluice_source_sdk::{Health, InvalidConfig, SourceError};
use std::collections::{BTreeMap, BTreeSet};
use std::io::ErrorKind;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How long the client retries a failing request (a broker restarting, a leader
/// moving) before the call fails; the runtime then reopens the source.
pub(crate) const RETRY_FOR: Duration = Duration::from_secs(30);

/// How long a probe (`sluice check`, a run's check before it starts) waits for the
/// brokers to answer: long enough for a slow network, short enough for a person.
pub(crate) const PROBE_FOR: Duration = Duration::from_secs(5);

/// The pause after a failed round of connecting, doubling up to a second: the client's
/// own backoff.
const FIRST_PAUSE: Duration = Duration::from_millis(50);
const MAX_PAUSE: Duration = Duration::from_secs(1);

pub(crate) struct Broker {
    /// The source's name, for errors.
    name: String,
    topic: String,
    client: Client,
    partitions: Mutex<BTreeMap<i32, Arc<PartitionClient>>>,
}

/// The client settings of `config`: its brokers, TLS and SASL, files read now.
fn connector(config: &KafkaConfig) -> Result<Connector, InvalidConfig> {
    let (brokers, tls, sasl) = (&config.brokers, config.tls.as_ref(), config.sasl.as_ref());
    Connector::new("sluice", brokers, tls, sasl)
}

/// A client retrying a failing request until `deadline` has passed in its pauses; a
/// zero deadline tries once (each broker, for a connection).
pub(crate) fn retrying_for(deadline: Duration) -> BackoffConfig {
    BackoffConfig {
        init_backoff: FIRST_PAUSE,
        max_backoff: MAX_PAUSE,
        base: 2.0,
        deadline: Some(deadline),
    }
}

impl Broker {
    /// A client of `config`'s brokers for its topic (see the module docs), dialling for
    /// up to `deadline` ([`RETRY_FOR`] when reading, [`PROBE_FOR`] for a probe) and
    /// telling `health` how it goes; the client then retries a failing request as long.
    /// Brokers refusing the settings (TLS, SASL) fail at once: a retry cannot help.
    pub(crate) async fn connect(
        name: &str,
        config: &KafkaConfig,
        deadline: Duration,
        health: &Health,
    ) -> Result<Arc<Broker>, SourceError> {
        let connector = connector(config).map_err(|e| SourceError::Config {
            name: name.to_string(),
            reason: e.to_string(),
        })?;
        let failed = |e: ConnectError| {
            let kind = match e.is_retryable() {
                true => ErrorKind::Other,
                false => ErrorKind::PermissionDenied,
            };
            SourceError::Io {
                name: name.to_string(),
                path: format!("brokers {}", connector.brokers()),
                error: std::io::Error::new(kind, e.to_string()),
            }
        };
        health.connecting();
        let started = Instant::now();
        let mut pause = FIRST_PAUSE;
        while let Err(e) = connector.connect(retrying_for(Duration::ZERO)).await {
            let retryable = e.is_retryable();
            let err = failed(e);
            if !retryable || started.elapsed() >= deadline {
                return Err(err);
            }
            health.retrying(&err);
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_PAUSE);
        }
        let client = connector.connect(retrying_for(deadline)).await;
        let client = client.map_err(failed)?;
        health.connected();
        Ok(Arc::new(Broker {
            name: name.to_string(),
            topic: config.topic.clone(),
            client,
            partitions: Mutex::default(),
        }))
    }

    /// A client error on `partition` (or the topic as a whole): retryable, as the
    /// broker may come back.
    pub(crate) fn error(&self, partition: Option<i32>, error: impl ToString) -> SourceError {
        let path = match partition {
            Some(p) => format!("topic {} partition {p}", self.topic),
            None => format!("topic {}", self.topic),
        };
        SourceError::Io {
            name: self.name.clone(),
            path,
            error: std::io::Error::other(error.to_string()),
        }
    }

    /// The topic's partitions now; an error when the topic does not exist.
    pub(crate) async fn partitions(&self) -> Result<BTreeSet<i32>, SourceError> {
        let topics = self
            .client
            .list_topics()
            .await
            .map_err(|e| self.error(None, e))?;
        match topics.into_iter().find(|t| t.name == self.topic) {
            Some(topic) => Ok(topic.partitions),
            None => Err(SourceError::Config {
                name: self.name.clone(),
                reason: format!("topic {} does not exist", self.topic),
            }),
        }
    }

    pub(crate) async fn partition(&self, p: i32) -> Result<Arc<PartitionClient>, SourceError> {
        if let Some(client) = self.partitions.lock().expect("partition clients").get(&p) {
            return Ok(client.clone());
        }
        let client = self
            .client
            .partition_client(self.topic.clone(), p, UnknownTopicHandling::Retry)
            .await
            .map_err(|e| self.error(Some(p), e))?;
        let client = Arc::new(client);
        self.partitions
            .lock()
            .expect("partition clients")
            .insert(p, client.clone());
        Ok(client)
    }

    /// The partition's earliest retained offset and its high watermark.
    pub(crate) async fn offsets(&self, p: i32) -> Result<(i64, i64), SourceError> {
        let client = self.partition(p).await?;
        let earliest = client
            .get_offset(OffsetAt::Earliest)
            .await
            .map_err(|e| self.error(Some(p), e))?;
        let latest = client
            .get_offset(OffsetAt::Latest)
            .await
            .map_err(|e| self.error(Some(p), e))?;
        Ok((earliest, latest))
    }

    /// The error for a topic that now has fewer partitions than it had.
    pub(crate) fn shrunk(&self, had: usize, has: usize) -> SourceError {
        SourceError::Config {
            name: self.name.clone(),
            reason: format!(
                "topic {} has {has} partitions, fewer than the {had} it had: a partition \
                 count cannot shrink (was the topic deleted and created again?), so the \
                 recorded offsets no longer mean anything; reset the pipeline's recovery \
                 log and store to read it anew",
                self.topic
            ),
        }
    }

    /// The error for a topic `partitioned_by: key_range` whose partition count is not
    /// the one it was read over.
    pub(crate) fn repartitioned(&self, had: usize, has: usize) -> SourceError {
        SourceError::Config {
            name: self.name.clone(),
            reason: repartitioned(&self.topic, had, has),
        }
    }
}

/// Why topic `topic`, `partitioned_by: key_range` and read over `had` partitions, cannot
/// be read on with `has`: its keys map to other partitions now.
pub(crate) fn repartitioned(topic: &str, had: usize, has: usize) -> String {
    format!(
        "topic {topic} has {has} partitions, but it was read partitioned_by key_range over \
         {had}: each partition's key range changed with the count, so a shard would miss \
         keys of its range held in partitions it does not read; a topic partitioned by key \
         range keeps its partition count (reset the pipeline's recovery log and store to \
         read it anew, or leave partitioned_by out and every shard reads every partition)"
    )
}
