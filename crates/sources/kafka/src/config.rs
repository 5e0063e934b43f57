//! What the user writes: `kafka: {brokers: [host:port], topic, format: json}`, with
//! `partitions`, `start` and `meta` optional. Strict: unknown keys are errors, and the
//! cross-field checks ([`KafkaConfig::check`]) name their place.

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use sluice_kafka_client::config::{brokers, brokers_schema, checked_broker};
use sluice_kafka_client::{ClientTls, Sasl};
use sluice_source_sdk::InvalidConfig;
use sluice_source_sdk::config::{duration_schema, nullable_string, ser_duration};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

/// A Kafka topic, read from its partitions' offsets (no consumer group).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Kafka topic")]
pub struct KafkaConfig {
    /// Bootstrap brokers: host:port, a comma-separated string of them, or a list.
    #[serde(deserialize_with = "brokers")]
    #[schemars(schema_with = "brokers_schema")]
    pub brokers: Vec<String>,
    /// The topic read.
    #[schemars(length(min = 1))]
    pub topic: String,
    /// The partitions read; unset for all of them, and partitions added later too.
    // Partitions added later are read from their beginning.
    #[serde(default)]
    #[schemars(with = "Vec<u32>")]
    pub partitions: Option<Vec<u32>>,
    /// Where a source with no committed position begins: earliest, latest, or offsets
    /// per partition ({"0": 120}; others at earliest).
    #[serde(default)]
    #[schemars(schema_with = "start_schema")]
    pub start: Start,
    /// Each message value is one JSON document.
    pub format: KafkaFormat,
    /// How the topic's producers chose each message's partition, when it lets a shard
    /// read only some partitions: `key_range`, partition p of n holding the documents
    /// whose collection key hash h has h·n >> 32 = p (as `sluice produce` does for this
    /// source). Each document is checked against it; unset: any partitioner, and every
    /// shard reads every partition.
    #[serde(default)]
    #[schemars(schema_with = "partitioned_by_schema")]
    pub partitioned_by: Option<PartitionedBy>,
    /// The top-level property receiving each message's topic, partition, offset,
    /// timestamp, key and headers; null for none.
    #[serde(default = "default_meta")]
    #[schemars(schema_with = "nullable_string")]
    pub meta: Option<String>,
    /// How long one fetch waits for new messages.
    // A Kafka broker answers as soon as messages arrive, so a longer wait costs no
    // latency there and saves requests; tansu holds every fetch for its whole wait,
    // which then bounds the latency of a trickle.
    #[serde(
        default = "default_fetch_wait",
        deserialize_with = "sluice_source_sdk::config::de_duration",
        serialize_with = "ser_duration"
    )]
    #[schemars(schema_with = "duration_schema")]
    pub fetch_wait: Duration,
    /// Connect over TLS, checking the brokers' certificates against this CA (and their
    /// names against the broker addresses); unset for plain TCP.
    #[serde(default)]
    pub tls: Option<ClientTls>,
    /// Authenticate by SASL as this user; unset for none.
    #[serde(default)]
    pub sasl: Option<Sasl>,
}

/// Short, for brokers that hold a fetch for its whole wait (tansu): about 100 fetches a
/// second per partition while idle.
fn default_fetch_wait() -> Duration {
    Duration::from_millis(10)
}

fn default_meta() -> Option<String> {
    Some("_meta".to_string())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum KafkaFormat {
    /// Each message's value is one JSON document.
    Json,
}

/// A partitioner whose partitions map to key ranges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum PartitionedBy {
    /// Partition p of n holds the key hashes h with h·n >> 32 = p
    /// ([`sluice_kafka_client::key_range`]).
    KeyRange,
}

/// The schema of `partitioned_by`: a name, or null.
fn partitioned_by_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"enum": ["key_range", null]})
}

/// Where reading begins without a committed position.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Start {
    /// Each partition's earliest retained offset.
    #[default]
    Earliest,
    /// Each partition's high watermark: only messages produced from now on.
    Latest,
    /// These offsets; partitions not named begin at their earliest.
    Offsets(BTreeMap<u32, u64>),
}

/// As it is written: `earliest`, `latest`, or `{"0": 120}`.
impl Serialize for Start {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Start::Earliest => s.serialize_str("earliest"),
            Start::Latest => s.serialize_str("latest"),
            Start::Offsets(offsets) => offsets.serialize(s),
        }
    }
}

/// The schema of [`Start`] as it is written.
fn start_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({"oneOf": [
        {"type": "string", "enum": ["earliest", "latest"]},
        {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}}
    ]})
}

impl<'de> Deserialize<'de> for Start {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Start, D::Error> {
        struct StartVisitor;

        impl<'de> Visitor<'de> for StartVisitor {
            type Value = Start;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(r#"earliest, latest, or offsets by partition ({"0": 120, "1": 0})"#)
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<Start, E> {
                match s {
                    "earliest" => Ok(Start::Earliest),
                    "latest" => Ok(Start::Latest),
                    other => Err(E::invalid_value(de::Unexpected::Str(other), &self)),
                }
            }

            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Start, M::Error> {
                let mut offsets = BTreeMap::new();
                while let Some(partition) = map.next_key::<String>()? {
                    let number = partition.parse::<u32>().map_err(|_| {
                        de::Error::custom(format!("start: {partition:?} is not a partition number"))
                    })?;
                    let offset = map.next_value::<u64>()?;
                    offsets.insert(number, offset);
                }
                Ok(Start::Offsets(offsets))
            }
        }

        d.deserialize_any(StartVisitor)
    }
}

impl KafkaConfig {
    /// What serde cannot check: non-empty names, no duplicate partitions, start
    /// offsets only for partitions that are read.
    pub fn check(&self) -> Result<(), InvalidConfig> {
        if self.brokers.is_empty() {
            return Err(InvalidConfig::new(
                "brokers",
                "name at least one broker (host:port)",
            ));
        }
        for (i, broker) in self.brokers.iter().enumerate() {
            checked_broker(broker).map_err(|e| InvalidConfig::new(format!("brokers[{i}]"), e))?;
        }
        if self.topic.is_empty() {
            return Err(InvalidConfig::new("topic", "the topic name is empty"));
        }
        if let Some(partitions) = &self.partitions {
            if self.partitioned_by.is_some() {
                return Err(InvalidConfig::new(
                    "partitions",
                    "a topic partitioned_by key_range is read by key range, each shard \
                     its partitions: leave partitions out",
                ));
            }
            if partitions.is_empty() {
                return Err(InvalidConfig::new(
                    "partitions",
                    "name at least one partition, or leave partitions out to read them all",
                ));
            }
            let mut seen = BTreeSet::new();
            for (i, p) in partitions.iter().enumerate() {
                if i32::try_from(*p).is_err() {
                    return Err(InvalidConfig::new(
                        format!("partitions[{i}]"),
                        format!("partition {p} is above the largest Kafka partition number"),
                    ));
                }
                if !seen.insert(p) {
                    return Err(InvalidConfig::new(
                        format!("partitions[{i}]"),
                        format!("partition {p} is named twice"),
                    ));
                }
            }
            if let Start::Offsets(offsets) = &self.start
                && let Some(p) = offsets.keys().find(|p| !seen.contains(p))
            {
                return Err(InvalidConfig::new(
                    format!("start.{p}"),
                    format!("partition {p} is not among the partitions read ({partitions:?})"),
                ));
            }
        }
        if self.meta.as_deref() == Some("") {
            return Err(InvalidConfig::new(
                "meta",
                "name the property for the metadata (e.g. _meta), or null for none",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use sluice_source_sdk::config::schema_for;
    use sluice_testkit::schema::assert_schema_judges;

    #[test]
    fn the_schema_takes_the_examples_and_refuses_an_unknown_key() {
        let schema = schema_for::<KafkaConfig>();
        assert_eq!(schema["properties"]["start"]["default"], "earliest");
        assert_eq!(schema["properties"]["fetch_wait"]["default"], "10ms");
        assert_schema_judges(
            &schema,
            &[
                json!({"brokers": ["127.0.0.1:9092"], "topic": "views", "format": "json"}),
                json!({"brokers": "a:9092,b:9092", "topic": "views", "format": "json",
                       "partitions": [0, 2], "start": {"0": 120}, "meta": null,
                       "fetch_wait": "250ms"}),
                json!({"brokers": "a:9092", "topic": "t", "format": "json",
                       "start": "latest", "meta": "_kafka", "partitioned_by": "key_range"}),
                json!({"brokers": "localhost:9093", "topic": "t", "format": "json",
                       "tls": {"ca": "ca.crt", "certificate": "c.crt", "key": "c.key"},
                       "sasl": {"mechanism": "SCRAM-SHA-512", "username": "u",
                                "password_file": "password"}}),
            ],
            &[
                json!({"brokers": "a:9092", "topic": "t", "format": "json", "group": "g"}),
                json!({"brokers": [], "topic": "t", "format": "json"}),
                json!({"brokers": "a:9092", "topic": "t", "format": "json", "start": "first"}),
                json!({"brokers": "a:9092", "topic": "t", "format": "json",
                       "partitioned_by": "murmur2"}),
                json!({"brokers": "a:9092", "format": "json"}),
                json!({"brokers": "a:9092", "topic": "t", "format": "json",
                       "tls": {"ca": "ca.crt", "verify": false}}),
                json!({"brokers": "a:9092", "topic": "t", "format": "json",
                       "sasl": {"mechanism": "GSSAPI", "username": "u", "password": "p"}}),
            ],
        );
    }
}
