//! What the user writes: `kafka: {brokers, max_buffer_size_bytes?}` and per binding
//! `{topic, partitions?, partitioner?}`. Strict: unknown keys are errors, and every
//! error names its field.

use crate::partitioner::Partitioner;
use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::{self, Deserializer};
use sluice_config::schema_for;
use sluice_kafka_client::{ClientTls, Connector, Sasl};
use sluice_output_sdk::OutputError;
pub use sluice_output_sdk::config::parse;
use std::num::NonZeroUsize;

/// JSON schema of [`Config`] (what Spec returns and `sluice schema` prints).
pub fn endpoint_schema() -> String {
    schema_for::<Config>().to_string()
}

/// JSON schema of [`Resource`]'s keys; the output SDK adds the encoding keys.
pub fn resource_schema() -> String {
    schema_for::<Resource>().to_string()
}

/// Kafka topics, one per binding, written in transaction order.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Kafka endpoint")]
pub struct Config {
    /// Bootstrap brokers: host:port, a comma-separated string of them, or a list
    #[serde(deserialize_with = "sluice_kafka_client::config::brokers")]
    #[schemars(schema_with = "sluice_kafka_client::config::brokers_schema")]
    pub brokers: Vec<String>,
    /// Bytes of encoded changes buffered before they are produced
    #[serde(default = "default_buffer")]
    pub max_buffer_size_bytes: NonZeroUsize,
    /// Connect over TLS, checking the brokers' certificates against this CA (and their
    /// names against the broker addresses); unset for plain TCP.
    #[serde(default)]
    pub tls: Option<ClientTls>,
    /// Authenticate by SASL as this user; unset for none.
    #[serde(default)]
    pub sasl: Option<Sasl>,
}

impl Config {
    /// The client settings: the brokers, TLS and SASL, their files read now.
    pub fn connector(&self) -> Result<Connector, OutputError> {
        let (tls, sasl) = (self.tls.as_ref(), self.sasl.as_ref());
        Connector::new("sluice-output", &self.brokers, tls, sasl)
            .map_err(|e| OutputError::Config(e.to_string()))
    }
}

fn default_buffer() -> NonZeroUsize {
    NonZeroUsize::new(1 << 20).expect("not zero")
}

/// A binding's topic.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Kafka binding")]
pub struct Resource {
    /// The binding's topic
    // A name Kafka accepts, checked by `topic`.
    #[serde(deserialize_with = "topic")]
    #[schemars(length(min = 1, max = 249), regex(pattern = r"^[a-zA-Z0-9._-]+$"))]
    pub topic: String,
    /// Partitions of the topic when the endpoint creates it (an existing topic keeps its
    /// own)
    #[serde(default = "one_partition", deserialize_with = "partitions")]
    #[schemars(range(min = 1))]
    pub partitions: i32,
    /// How messages are spread over the partitions: `murmur2` of the message key (Kafka's
    /// default), or `key_range`, partition p of n holding the changes whose document key
    /// hash h has h·n >> 32 = p (what a source `partitioned_by: key_range` reads)
    #[serde(default)]
    #[schemars(schema_with = "Partitioner::schema")]
    pub partitioner: Partitioner,
}

fn one_partition() -> i32 {
    1
}

/// A name Kafka accepts: 1 to 249 of `[a-zA-Z0-9._-]`, not `.` or `..`.
fn topic<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let topic = String::deserialize(d)?;
    let legal = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-');
    if topic.is_empty() || topic.len() > 249 || topic == "." || topic == ".." {
        return Err(de::Error::custom(format!(
            "{topic:?} is not a Kafka topic name (1 to 249 characters, not . or ..)"
        )));
    }
    if let Some(c) = topic.chars().find(|&c| !legal(c)) {
        return Err(de::Error::custom(format!(
            "{topic:?} is not a Kafka topic name: {c:?} is not a letter, digit, '.', '_' or '-'"
        )));
    }
    Ok(topic)
}

fn partitions<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    let partitions = i64::deserialize(d)?;
    i32::try_from(partitions)
        .ok()
        .filter(|&p| p >= 1)
        .ok_or_else(|| {
            de::Error::custom(format!(
                "{partitions} is not a partition count (1 to {})",
                i32::MAX
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use sluice_testkit::schema::assert_schema_judges;

    #[test]
    fn the_schemas_take_the_examples_and_refuse_an_unknown_key() {
        let endpoint: Value = serde_json::from_str(&endpoint_schema()).unwrap();
        assert_schema_judges(
            &endpoint,
            &[
                json!({"brokers": "127.0.0.1:9092"}),
                json!({"brokers": ["a:1", "b:2"], "max_buffer_size_bytes": 10}),
                json!({"brokers": "localhost:9093", "tls": {"ca": "ca.crt"},
                       "sasl": {"mechanism": "PLAIN", "username": "u", "password": "p"}}),
                // No CA file: the operating system's roots.
                json!({"brokers": "a:1", "tls": {}}),
            ],
            &[
                json!({"brokers": "a:1", "topic": "t"}),
                json!({"brokers": "a:1", "tls": {"cafile": "ca.crt"}}),
                json!({"brokers": "a:1", "sasl": {"mechanism": "scram", "username": "u"}}),
                json!({"brokers": []}),
                json!({"brokers": "a:1", "max_buffer_size_bytes": 0}),
            ],
        );
        let resource = sluice_output_sdk::resource_schema(&crate::kind());
        let resource: Value = serde_json::from_str(&resource).unwrap();
        assert_schema_judges(
            &resource,
            &[
                json!({"topic": "views.v1_a-b"}),
                json!({"topic": "t", "partitions": 3, "format": "avro", "schema_id": 7}),
                json!({"topic": "t", "partitioner": "key_range"}),
                json!({"topic": "t", "partitioner": "murmur2"}),
            ],
            &[
                json!({"topic": "t", "subject": "s"}),
                json!({"topic": "a/b"}),
                json!({"topic": "t", "partitions": 0}),
                json!({"topic": "t", "partitioner": "random"}),
            ],
        );
    }

    fn config_error(value: Value) -> String {
        parse::<Config>(&value).unwrap_err().to_string()
    }

    fn resource_error(value: Value) -> String {
        parse::<Resource>(&value).unwrap_err().to_string()
    }

    #[test]
    fn brokers_are_one_string_a_comma_separated_string_or_a_list() {
        let one: Config = parse(&json!({"brokers": "127.0.0.1:9092"})).unwrap();
        assert_eq!(one.brokers, ["127.0.0.1:9092"]);
        assert_eq!(one.max_buffer_size_bytes.get(), 1 << 20);
        let two: Config = parse(&json!({"brokers": "a:1, b:2"})).unwrap();
        assert_eq!(two.brokers, ["a:1", "b:2"]);
        let list: Config =
            parse(&json!({"brokers": ["a:1", "b:2"], "max_buffer_size_bytes": 10})).unwrap();
        assert_eq!(list.brokers, ["a:1", "b:2"]);
        assert_eq!(list.max_buffer_size_bytes.get(), 10);
    }

    #[test]
    fn bad_endpoint_configs_name_their_field() {
        let err = config_error(json!({"brokers": ["a:1", "b"]}));
        assert!(
            err.starts_with("brokers[1]: \"b\" is not host:port"),
            "{err}"
        );
        let err = config_error(json!({"brokers": ":9092"}));
        assert!(
            err.starts_with("brokers: \":9092\" is not host:port"),
            "{err}"
        );
        let err = config_error(json!({"brokers": []}));
        assert!(
            err.starts_with("brokers: name at least one broker"),
            "{err}"
        );
        let err = config_error(json!({"brokers": "a:1", "max_buffer_size_bytes": 0}));
        assert!(err.starts_with("max_buffer_size_bytes:"), "{err}");
        let err = config_error(json!({"brokers": "a:1", "topic": "t"}));
        assert!(err.contains("unknown field `topic`"), "{err}");
        let err = config_error(json!({}));
        assert!(err.contains("missing field `brokers`"), "{err}");
    }

    #[test]
    fn a_resource_is_a_topic_and_the_partitions_of_a_topic_created() {
        let r: Resource = parse(&json!({"topic": "views.v1_a-b"})).unwrap();
        assert_eq!((r.topic.as_str(), r.partitions), ("views.v1_a-b", 1));
        assert_eq!(r.partitioner, Partitioner::Murmur2);
        let r: Resource = parse(&json!({"topic": "t", "partitions": 3})).unwrap();
        assert_eq!(r.partitions, 3);
        let r: Resource = parse(&json!({"topic": "t", "partitioner": "key_range"})).unwrap();
        assert_eq!(r.partitioner, Partitioner::KeyRange);
        let err = resource_error(json!({"topic": "t", "partitioner": "random"}));
        assert!(
            err.starts_with("partitioner: unknown variant `random`"),
            "{err}"
        );
        let err = resource_error(json!({"topic": "a/b"}));
        assert!(
            err.starts_with("topic: \"a/b\" is not a Kafka topic name"),
            "{err}"
        );
        let err = resource_error(json!({"topic": ".."}));
        assert!(err.starts_with("topic:"), "{err}");
        let err = resource_error(json!({"topic": "t", "partitions": 0}));
        assert!(
            err.starts_with("partitions: 0 is not a partition count"),
            "{err}"
        );
        let err = resource_error(json!({"topic": "t", "partitions": 1u64 << 40}));
        assert!(err.starts_with("partitions:"), "{err}");
        let err = resource_error(json!({"topic": "t", "subject": "s"}));
        assert!(err.contains("unknown field `subject`"), "{err}");
    }
}
