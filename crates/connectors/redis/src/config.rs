//! What the user writes: the endpoint `{"url": "redis://127.0.0.1:6379/0",
//! "tls"?: {ca, certificate?, key?}, "connect_timeout"?: seconds,
//! "response_timeout"?: seconds}` and each binding's
//! resource `{"prefix": "views:", "format"?: "json" | "hash"}`, with the JSON schemas
//! Spec returns.
//!
//! Parsing is strict: unknown properties are errors, and every error names the field
//! that is wrong (`resource config: format: unknown variant ...`), so a pipeline author
//! can find it in their file. A `redis://` URL is plain text; a `rediss://` URL is TLS
//! and needs `tls` (the CA its certificate chains to; the certificate must name the
//! URL's host), and `tls` is refused with a `redis://` URL rather than ignored.

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sluice_config::schema_for;
use sluice_driver_sdk::{Error, Result};
use sluice_tls::ClientTls;
use std::sync::LazyLock;
use std::time::Duration;

/// Where the documentation of this driver lives (returned by Spec).
pub const DOCUMENTATION_URL: &str =
    "https://github.com/sluice-rs/sluice/tree/main/crates/connectors/redis";

/// How long a connection attempt may take when `connect_timeout` is not set: long
/// enough for a server across the world, short enough that an unreachable one becomes
/// a retryable error quickly (the SQL drivers' default too).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How long one command or pipeline may wait for its answer when `response_timeout`
/// is not set. A pipeline carries up to `client::CHUNK_BYTES` of documents
/// (and a single document may be far larger), so this is generous; only a hung server
/// or a stalled connection reaches it, and then it is a retryable error.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(60);

/// The endpoint keys whose values are paths, made relative to the pipeline file's
/// folder (the driver kind's `paths`).
pub const PATHS: &[&str] = &["tls.ca", "tls.certificate", "tls.key"];

/// JSON schema of [`EndpointConfig`], derived once.
pub static ENDPOINT_SCHEMA: LazyLock<String> =
    LazyLock::new(|| schema_for::<EndpointConfig>().to_string());

/// JSON schema of [`ResourceConfig`], derived once.
pub static RESOURCE_SCHEMA: LazyLock<String> =
    LazyLock::new(|| schema_for::<ResourceConfig>().to_string());

/// One Redis server (and database).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Redis endpoint")]
pub struct EndpointConfig {
    /// redis://[user:password@]host[:port][/db], or rediss://… for TLS (then set
    /// tls).
    #[schemars(regex(pattern = "^rediss?://"))]
    pub url: String,
    /// TLS, for a rediss:// URL: the CA the server's certificate chains to (without
    /// `ca`, the operating system's roots; the certificate must name the URL's host),
    /// and a client certificate for mutual TLS.
    #[serde(default)]
    pub tls: Option<ClientTls>,
    /// Seconds a connection attempt may take.
    // [`DEFAULT_CONNECT_TIMEOUT`] when absent.
    #[serde(default)]
    #[schemars(
        with = "u64",
        range(min = 1),
        extend("default" = DEFAULT_CONNECT_TIMEOUT.as_secs())
    )]
    pub connect_timeout: Option<u64>,
    /// Seconds a command or pipeline may wait for its answer.
    // [`DEFAULT_RESPONSE_TIMEOUT`] when absent.
    #[serde(default)]
    #[schemars(
        with = "u64",
        range(min = 1),
        extend("default" = DEFAULT_RESPONSE_TIMEOUT.as_secs())
    )]
    pub response_timeout: Option<u64>,
}

/// How a binding's documents are stored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// The document's JSON text as a string value (SET, MGET).
    #[default]
    Json,
    /// The selected fields as hash fields plus the document under the document field
    /// (DEL + HSET, HGET of the document field).
    Hash,
}

impl Format {
    pub fn name(self) -> &'static str {
        match self {
            Format::Json => "json",
            Format::Hash => "hash",
        }
    }
}

/// One binding's keys: a key prefix and a storage format.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Redis key prefix")]
pub struct ResourceConfig {
    /// Every key of the binding is this prefix followed by the hex of its packed key.
    #[schemars(length(min = 1))]
    pub prefix: String,
    /// json: the document as a string value; hash: the selected fields as hash fields
    /// plus the document.
    #[serde(default)]
    pub format: Format,
    /// Not supported: a replayed append would be applied twice.
    // Only so that asking for delta updates here is refused with the reason
    // ([`binding_resource`]) rather than as an unknown field.
    #[serde(default)]
    #[schemars(extend("const" = false))]
    pub delta_updates: bool,
}

impl EndpointConfig {
    pub fn parse(json: &str) -> Result<Self> {
        let config: Self = parse("endpoint config", json)?;
        let tls_url = config.url.starts_with("rediss://");
        if !tls_url && !config.url.starts_with("redis://") {
            return Err(Error::Config(format!(
                "endpoint config: url: {:?} is not a redis:// or rediss:// URL (e.g. \
                 \"redis://127.0.0.1:6379/0\", or \"rediss://redis.example.com:6380/0\" for TLS)",
                config.url
            )));
        }
        if tls_url && config.url.contains('#') {
            return Err(Error::Config(
                "endpoint config: url: a rediss:// URL takes no #fragment (#insecure is not \
                 supported: the server's certificate is always checked)"
                    .into(),
            ));
        }
        match (tls_url, &config.tls) {
            (true, None) => {
                return Err(Error::Config(
                    "endpoint config: tls: a rediss:// URL needs tls (ca: the CA file the \
                     server's certificate chains to, or tls: {} for the operating system's \
                     roots)"
                        .into(),
                ));
            }
            (false, Some(_)) => {
                return Err(Error::Config(
                    "endpoint config: url: tls is set but the URL is redis:// (plain text): \
                     write it as rediss://"
                        .into(),
                ));
            }
            _ => {}
        }
        for (field, value) in [
            ("connect_timeout", config.connect_timeout),
            ("response_timeout", config.response_timeout),
        ] {
            if value == Some(0) {
                return Err(Error::Config(format!(
                    "endpoint config: {field}: must be at least 1 (seconds)"
                )));
            }
        }
        Ok(config)
    }

    pub fn connect_timeout(&self) -> Duration {
        (self.connect_timeout).map_or(DEFAULT_CONNECT_TIMEOUT, Duration::from_secs)
    }

    pub fn response_timeout(&self) -> Duration {
        (self.response_timeout).map_or(DEFAULT_RESPONSE_TIMEOUT, Duration::from_secs)
    }
}

impl ResourceConfig {
    pub fn parse(json: &str) -> Result<Self> {
        let config: Self = parse("resource config", json)?;
        if config.prefix.is_empty() {
            return Err(Error::Config(
                "resource config: prefix: must not be empty (e.g. \"views:\"); an empty \
                 prefix would make the binding own every key of the database"
                    .into(),
            ));
        }
        Ok(config)
    }
}

/// Why delta-updates bindings are refused, in every error that refuses one.
pub const DELTA_REFUSED: &str = "delta updates are not supported by the Redis driver: it \
     is not transactional, so a transaction replayed after a crash would append its \
     documents a second time; use a standard binding (full documents, rewritten \
     idempotently by a replay)";

/// The resource of binding `index` (`json`), refused if it asks for delta updates,
/// in its resource or (`delta_in_spec`) in the pipeline file. Errors name the binding.
pub fn binding_resource(index: usize, json: &str, delta_in_spec: bool) -> Result<ResourceConfig> {
    let resource = ResourceConfig::parse(json)
        .map_err(|err| Error::Config(format!("binding {index}: {}", strip_kind(err))))?;
    if resource.delta_updates || delta_in_spec {
        return Err(Error::Config(format!(
            "binding {index} (prefix {:?}): {DELTA_REFUSED}",
            resource.prefix
        )));
    }
    Ok(resource)
}

/// The message of a configuration error, without the `invalid configuration:` its
/// Display adds.
fn strip_kind(err: Error) -> String {
    match err {
        Error::Config(message) => message,
        other => other.to_string(),
    }
}

/// Parses `json` as the `what` of the Redis driver; an error names the field.
fn parse<T: DeserializeOwned>(what: &str, json: &str) -> Result<T> {
    let de = &mut serde_json::Deserializer::from_str(json);
    serde_path_to_error::deserialize(de).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        if path == "." {
            Error::Config(format!("{what} of the Redis driver: {inner}"))
        } else {
            Error::Config(format!("{what} of the Redis driver: {path}: {inner}"))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use sluice_testkit::schema::assert_schema_judges;

    #[test]
    fn the_schemas_take_the_examples_and_refuse_an_unknown_key() {
        let endpoint: Value = serde_json::from_str(&ENDPOINT_SCHEMA).unwrap();
        assert_eq!(endpoint["properties"]["connect_timeout"]["default"], 10);
        assert_eq!(endpoint["properties"]["response_timeout"]["default"], 60);
        assert_schema_judges(
            &endpoint,
            &[
                json!({"url": "redis://127.0.0.1:6379/0"}),
                json!({"url": "redis://h", "connect_timeout": 3, "response_timeout": 120}),
                json!({"url": "rediss://h:6380", "tls": {"ca": "ca.crt"}}),
                json!({"url": "rediss://h", "tls": {"ca": "ca.crt", "certificate": "c.crt", "key": "c.key"}}),
            ],
            &[
                json!({"url": "redis://h", "conect_timeout": 3}),
                json!({"url": "http://h"}),
                json!({"url": "rediss://h", "tls": {"ca": "ca.crt", "cert": "c.crt"}}),
                json!({"url": "redis://h", "connect_timeout": 0}),
            ],
        );
        let resource: Value = serde_json::from_str(&RESOURCE_SCHEMA).unwrap();
        assert_eq!(resource["properties"]["format"]["default"], "json");
        assert_schema_judges(
            &resource,
            &[
                json!({"prefix": "views:"}),
                json!({"prefix": "views:", "format": "hash", "delta_updates": false}),
            ],
            &[
                json!({"prefix": "views:", "formt": "hash"}),
                json!({"prefix": "views:", "format": "list"}),
                json!({"prefix": "views:", "delta_updates": true}),
            ],
        );
    }

    fn config_error<T: std::fmt::Debug>(result: Result<T>) -> String {
        match result {
            Err(Error::Config(message)) => message,
            other => panic!("expected a configuration error, got {other:?}"),
        }
    }

    #[test]
    fn an_endpoint_parses_with_its_defaults() {
        let config = EndpointConfig::parse(r#"{"url":"redis://127.0.0.1:6379/2"}"#).unwrap();
        assert_eq!(config.connect_timeout(), DEFAULT_CONNECT_TIMEOUT);
        assert_eq!(config.response_timeout(), DEFAULT_RESPONSE_TIMEOUT);
        let config = EndpointConfig::parse(r#"{"url":"redis://h","connect_timeout":3}"#).unwrap();
        assert_eq!(config.connect_timeout(), Duration::from_secs(3));
    }

    #[test]
    fn endpoint_errors_name_the_field() {
        let cases = [
            (
                r#"{"url":"redis://h","conect_timeout":3}"#,
                "conect_timeout",
            ),
            (
                r#"{"url":"redis://h","connect_timeout":"3s"}"#,
                "connect_timeout",
            ),
            (
                r#"{"url":"redis://h","connect_timeout":0}"#,
                "connect_timeout",
            ),
            (r#"{"url":"http://h"}"#, "url"),
            (r#"{"url":"rediss://h"}"#, "tls"),
            (r#"{"url":"redis://h","tls":{"ca":"ca.crt"}}"#, "url"),
            (
                r#"{"url":"rediss://h#insecure","tls":{"ca":"ca.crt"}}"#,
                "url",
            ),
            (
                r#"{"url":"rediss://h","tls":{"ca":"ca.crt","cert":"c"}}"#,
                "tls.cert",
            ),
            (r#"{"url":7}"#, "url"),
            (r#"{}"#, "url"),
        ];
        for (json, field) in cases {
            let message = config_error(EndpointConfig::parse(json));
            assert!(message.contains(field), "{json}: {message}");
            assert!(message.starts_with("endpoint config"), "{json}: {message}");
        }
    }

    #[test]
    fn a_resource_defaults_to_json_and_its_errors_name_the_field() {
        let resource = ResourceConfig::parse(r#"{"prefix":"v:"}"#).unwrap();
        assert_eq!(resource.format, Format::Json);
        let resource = ResourceConfig::parse(r#"{"prefix":"v:","format":"hash"}"#).unwrap();
        assert_eq!(resource.format, Format::Hash);
        let cases = [
            (r#"{"prefix":"v:","format":"xml"}"#, "format"),
            (r#"{"prefix":""}"#, "prefix"),
            (r#"{"table":"v"}"#, "table"),
            (r#"{"prefix":"v:","delta_updates":"yes"}"#, "delta_updates"),
        ];
        for (json, field) in cases {
            let message = config_error(ResourceConfig::parse(json));
            assert!(message.contains(field), "{json}: {message}");
        }
    }

    #[test]
    fn delta_updates_are_refused_naming_the_binding_and_why() {
        let asked = [
            (r#"{"prefix":"v:","delta_updates":true}"#, false),
            (r#"{"prefix":"v:"}"#, true),
        ];
        for (json, in_spec) in asked {
            let message = config_error(binding_resource(3, json, in_spec));
            assert!(
                message.starts_with("binding 3 (prefix \"v:\")"),
                "{message}"
            );
            assert!(message.contains("a second time"), "{message}");
        }
        let message = config_error(binding_resource(1, r#"{"prefx":"v:"}"#, false));
        assert!(
            message.starts_with("binding 1: resource config"),
            "{message}"
        );
        assert!(binding_resource(0, r#"{"prefix":"v:","delta_updates":false}"#, false).is_ok());
    }
}
