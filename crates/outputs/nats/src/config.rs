//! What the user writes: `nats: {url, stream, max_buffer_size_bytes, max_in_flight}`
//! (all optional) and per binding `{subject}`. Strict: unknown keys are errors.
//!
//! Server addresses and stream names follow the rules the `nats` source checks too
//! ([`sluice_nats_client`]), so a stream this output creates can be named in a source.

use serde::Deserialize;
use serde_json::Value;
use sluice_output_sdk::OutputError;
use sluice_output_sdk::config::parse;

pub const ENDPOINT_SCHEMA: &str = r#"{
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "url": {"type": "string", "default": "nats://127.0.0.1:4222",
      "description": "The NATS server (plain nats://), JetStream enabled"},
    "stream": {"type": "string",
      "description": "The stream created (or given the subject) when no stream holds a binding's subject; default: one per subject, named after it"},
    "max_buffer_size_bytes": {"type": "integer", "minimum": 1, "default": 1048576,
      "description": "Bytes of encoded changes buffered before they are published"},
    "max_in_flight": {"type": "integer", "minimum": 1, "default": 256,
      "description": "Publishes awaiting the stream's acknowledgement at once (1: none pipelined)"}
  }
}"#;

pub const RESOURCE_SCHEMA: &str = r#"{
  "type": "object",
  "required": ["subject"],
  "additionalProperties": true,
  "properties": {
    "subject": {"type": "string", "description": "The subject the binding's changes are published to (no wildcards)"}
  }
}"#;

const DEFAULT_URL: &str = "nats://127.0.0.1:4222";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default = "default_url")]
    pub url: String,
    #[serde(default)]
    pub stream: Option<String>,
    #[serde(default = "default_buffer")]
    pub max_buffer_size_bytes: usize,
    #[serde(default = "default_in_flight")]
    pub max_in_flight: usize,
}

fn default_url() -> String {
    DEFAULT_URL.to_string()
}

fn default_buffer() -> usize {
    1 << 20
}

fn default_in_flight() -> usize {
    256
}

impl Config {
    /// Parses and checks an endpoint configuration.
    pub fn parse(value: &Value) -> Result<Config, OutputError> {
        let config: Config = parse(value)?;
        sluice_nats_client::check_url(&config.url)
            .map_err(|why| OutputError::Config(format!("url: {why}")))?;
        if let Some(stream) = &config.stream {
            sluice_nats_client::check_stream(stream)
                .map_err(|why| OutputError::Config(format!("stream: {why}")))?;
        }
        for (field, value) in [
            ("max_buffer_size_bytes", config.max_buffer_size_bytes),
            ("max_in_flight", config.max_in_flight),
        ] {
            if value == 0 {
                return Err(OutputError::Config(format!("{field}: must be at least 1")));
            }
        }
        Ok(config)
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resource {
    pub subject: String,
}

impl Resource {
    /// Parses and checks a binding's destination: a subject one can publish to.
    pub fn parse(value: &Value) -> Result<Resource, OutputError> {
        let resource: Resource = parse(value)?;
        let subject = &resource.subject;
        if async_nats::Subject::validated(subject).is_err()
            || subject.split('.').any(|token| token == "*" || token == ">")
        {
            return Err(OutputError::Config(format!(
                "subject: {subject:?} is not a subject to publish to: dot-separated \
                 tokens, none empty, no spaces, no wildcards (e.g. views.orders)"
            )));
        }
        Ok(resource)
    }

    /// The name of the stream made for this subject when the endpoint names none: the
    /// subject with the characters a stream name cannot hold replaced by `_`.
    pub fn default_stream(&self) -> String {
        self.subject.replace(['.', '/', '\\'], "_")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_reach_the_local_server_with_a_pipeline_of_256() {
        let config = Config::parse(&json!({})).unwrap();
        assert_eq!(config.url, DEFAULT_URL);
        assert_eq!(config.stream, None);
        assert_eq!(config.max_buffer_size_bytes, 1 << 20);
        assert_eq!(config.max_in_flight, 256);
    }

    #[test]
    fn errors_name_the_field() {
        for (config, needle) in [
            (json!({"urls": "x"}), "unknown field `urls`"),
            (json!({"url": "http://h:80:9"}), "url: "),
            (json!({"url": "tls://h:4222"}), "only plain nats://"),
            (json!({"stream": "A.B"}), "stream: "),
            (
                json!({"max_in_flight": 0}),
                "max_in_flight: must be at least 1",
            ),
            (
                json!({"max_buffer_size_bytes": -1}),
                "max_buffer_size_bytes: ",
            ),
        ] {
            let error = Config::parse(&config).unwrap_err();
            assert!(matches!(error, OutputError::Config(_)), "{config}: {error}");
            assert!(error.to_string().contains(needle), "{config}: {error}");
        }
        for subject in ["", "a..b", "a b", "views.*", "views.>", ".a"] {
            let error = Resource::parse(&json!({ "subject": subject })).unwrap_err();
            assert!(
                error.to_string().starts_with("subject: "),
                "{subject}: {error}"
            );
        }
        let error = Resource::parse(&json!({"topic": "t"})).unwrap_err();
        assert!(error.to_string().contains("topic"), "{error}");
    }

    #[test]
    fn a_subject_names_its_default_stream() {
        let resource = Resource::parse(&json!({"subject": "views.orders/eu"})).unwrap();
        assert_eq!(resource.default_stream(), "views_orders_eu");
    }
}
