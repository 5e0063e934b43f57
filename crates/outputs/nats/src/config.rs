//! What the user writes: `nats: {url, stream, tls, auth, max_buffer_size_bytes,
//! max_in_flight}` (all optional) and per binding `{subject}`. Strict: unknown keys are
//! errors.
//!
//! Server addresses, stream names, `tls` and `auth` follow the rules the `nats` source
//! checks too ([`sluice_nats_client`]), so a stream this output creates can be named in
//! a source reaching the server the same way.
//!
//! `max_in_flight` pipelines publishes only where the subject has its stream to itself
//! (the default: one stream per subject). A `stream` that several bindings share holds
//! other subjects' messages between a subject's: there each publish awaits the one
//! before it, since the fence (the crate docs) then follows a subject's sequence, known
//! only from the previous acknowledgement.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;
use sluice_config::schema_for;
use sluice_nats_client::{Auth, Server};
use sluice_output_sdk::OutputError;
use sluice_output_sdk::config::parse;
use sluice_tls::ClientTls;

/// JSON schema of [`Config`] (what Spec returns and `sluice schema` prints).
pub fn endpoint_schema() -> String {
    schema_for::<Config>().to_string()
}

/// JSON schema of [`Resource`]'s keys; the output SDK adds the encoding keys.
pub fn resource_schema() -> String {
    schema_for::<Resource>().to_string()
}

const DEFAULT_URL: &str = "nats://127.0.0.1:4222";

/// JetStream subjects, one per binding, published in transaction order.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "NATS endpoint")]
pub struct Config {
    /// The NATS server, JetStream enabled: nats://host:port, or tls://host:port to
    /// require TLS
    #[serde(default = "default_url")]
    pub url: String,
    /// TLS: the CA file the server's certificate must chain to (it must also name the
    /// url's host), and a client certificate for mutual TLS. Setting it requires TLS,
    /// whatever the url's scheme
    #[serde(default)]
    #[schemars(with = "ClientTls")]
    pub tls: Option<ClientTls>,
    /// How the connection authenticates: user and password (or password_file), token
    /// (or token_file), nkey_file or creds_file; one of them
    #[serde(default)]
    #[schemars(with = "Auth")]
    pub auth: Option<Auth>,
    /// The stream created (or given the subject) when no stream holds a binding's
    /// subject; default: one per subject, named after it
    #[serde(default)]
    #[schemars(with = "String")]
    pub stream: Option<String>,
    /// Bytes of encoded changes buffered before they are published
    #[serde(default = "default_buffer")]
    #[schemars(range(min = 1))]
    pub max_buffer_size_bytes: usize,
    /// Publishes awaiting the stream's acknowledgement at once (1: none pipelined)
    #[serde(default = "default_in_flight")]
    #[schemars(range(min = 1))]
    pub max_in_flight: usize,
}

fn default_url() -> String {
    DEFAULT_URL.to_string()
}

fn default_buffer() -> usize {
    1 << 20
}

/// 1024: at a millisecond's acknowledgement latency, about a million messages a second
/// of window; 256 held a local JetStream server to half of what a bare publisher
/// reaches (`bench outputs`).
fn default_in_flight() -> usize {
    1024
}

impl Config {
    /// Parses and checks an endpoint configuration (its paths made relative to the
    /// pipeline file's folder already); the TLS and secret files are read, so a missing
    /// or wrong one fails here naming it.
    pub fn parse(value: &Value) -> Result<Config, OutputError> {
        let config: Config = parse(value)?;
        (config.server().check()).map_err(|invalid| OutputError::Config(invalid.to_string()))?;
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

    /// The server and how to reach it.
    pub fn server(&self) -> Server {
        Server {
            url: self.url.clone(),
            tls: self.tls.clone(),
            auth: self.auth.clone(),
        }
    }
}

/// A binding's subject.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "NATS binding")]
pub struct Resource {
    /// The subject the binding's changes are published to (no wildcards)
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
    use sluice_testkit::schema::assert_schema_judges;

    #[test]
    fn the_schemas_take_the_examples_and_refuse_an_unknown_key() {
        let endpoint: Value = serde_json::from_str(&endpoint_schema()).unwrap();
        assert_eq!(endpoint["properties"]["url"]["default"], DEFAULT_URL);
        assert_schema_judges(
            &endpoint,
            &[
                json!({}),
                json!({"url": "nats://h:4222", "stream": "VIEWS", "max_in_flight": 1,
                       "max_buffer_size_bytes": 4096}),
                json!({"url": "tls://h:4222", "tls": {"ca": "ca.crt"},
                       "auth": {"token_file": "nats.token"}}),
            ],
            &[
                json!({"urls": "x"}),
                json!({"max_in_flight": 0}),
                json!({"auth": {"username": "u"}}),
            ],
        );
        let resource = sluice_output_sdk::resource_schema(&crate::kind());
        let resource: Value = serde_json::from_str(&resource).unwrap();
        assert_schema_judges(
            &resource,
            &[
                json!({"subject": "views.orders"}),
                json!({"subject": "v", "format": "debezium", "snapshot": false}),
            ],
            &[json!({"subject": "v", "topic": "t"}), json!({})],
        );
    }

    #[test]
    fn defaults_reach_the_local_server_with_a_pipeline_of_1024() {
        let config = Config::parse(&json!({})).unwrap();
        assert_eq!(config.url, DEFAULT_URL);
        assert_eq!(config.stream, None);
        assert_eq!(config.max_buffer_size_bytes, 1 << 20);
        assert_eq!(config.max_in_flight, 1024);
    }

    #[test]
    fn errors_name_the_field() {
        for (config, needle) in [
            (json!({"urls": "x"}), "unknown field `urls`"),
            (json!({"url": "http://h:80:9"}), "url: "),
            (json!({"url": "ws://h:4222"}), "only nats:// and tls://"),
            (json!({"url": "tls://h:4222"}), "tls: "),
            (
                json!({"url": "tls://h:4222", "tls": {"ca": "/nonexistent/ca.crt"}}),
                "tls.ca: cannot read the certificate file /nonexistent/ca.crt",
            ),
            (
                json!({"auth": {"token": "t", "creds_file": "sluice.creds"}}),
                "auth: token and creds_file are both set",
            ),
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
