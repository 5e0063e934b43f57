//! What the user writes: `http: {listen: 127.0.0.1:8080, token: "${INGEST_TOKEN}"}`,
//! with TLS, the limits and the idempotency window optional. Strict: unknown keys are
//! errors. `${ENV}` in the token is expanded by the pipeline loader, so the token need
//! not be written in the file. A token travels in every request, so plain HTTP is
//! taken only on a loopback address unless the pipeline says `insecure: true`.

use schemars::JsonSchema;
use serde::Deserialize;
use sluice_source_sdk::InvalidConfig;
use sluice_source_sdk::config::{
    bytes_schema, de_bytes, de_duration, duration_schema, ser_bytes, ser_duration,
};
use sluice_source_sdk::tls::ServerTls;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// An HTTP server taking JSON documents POSTed to /ingest/<source>, each request
/// answered once the transaction holding its body is durable.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "HTTP ingest")]
pub struct HttpConfig {
    /// The address the server listens on, IP:port (127.0.0.1:8080; 0.0.0.0:8080 for
    /// every interface).
    #[schemars(length(min = 1))]
    pub listen: String,
    /// The bearer token every POST must carry (Authorization: Bearer <token>); write it
    /// as ${ENV_VAR}.
    #[schemars(length(min = 1))]
    pub token: String,
    /// Serve HTTPS with this certificate and key; with `client_ca`, only clients
    /// presenting a certificate signed by it are let in (mutual TLS).
    #[serde(default)]
    pub tls: Option<ServerTls>,
    /// Take the token over plain HTTP on an address other machines reach. Without it,
    /// such a listener needs `tls`, since anyone on the network could read the token.
    #[serde(default)]
    pub insecure: bool,
    /// A larger body is refused with a 413.
    #[serde(
        default = "default_max_body_bytes",
        deserialize_with = "de_bytes",
        serialize_with = "ser_bytes"
    )]
    #[schemars(schema_with = "bytes_schema")]
    pub max_body_bytes: u64,
    /// Accepted bodies not yet in a transaction; above it a POST gets a 429 with
    /// Retry-After.
    // Instead of buffering without bound.
    #[serde(
        default = "default_max_buffered_bytes",
        deserialize_with = "de_bytes",
        serialize_with = "ser_bytes"
    )]
    #[schemars(schema_with = "bytes_schema")]
    pub max_buffered_bytes: u64,
    /// How long an Idempotency-Key is remembered after its request was accepted.
    // A retry within it is answered with the original outcome.
    #[serde(
        default = "default_idempotency_window",
        deserialize_with = "de_duration",
        serialize_with = "ser_duration"
    )]
    #[schemars(schema_with = "duration_schema")]
    pub idempotency_window: Duration,
}

/// 16 MiB: a batch of tens of thousands of documents, small beside a transaction.
fn default_max_body_bytes() -> u64 {
    16 << 20
}

/// 64 MiB: four bodies of the largest size, or seconds of a heavy load, while a
/// transaction commits.
fn default_max_buffered_bytes() -> u64 {
    64 << 20
}

/// Ten minutes: longer than any client's retry loop is expected to run.
fn default_idempotency_window() -> Duration {
    Duration::from_secs(600)
}

impl HttpConfig {
    /// The listening address, checked by [`HttpConfig::check`].
    pub fn address(&self) -> SocketAddr {
        self.listen
            .parse()
            .expect("checked when the pipeline was read")
    }

    /// What serde cannot check, with relative paths made relative to `base_dir`; the
    /// TLS files are read, so a missing or wrong one fails here, naming it.
    pub fn check(&mut self, base_dir: &Path) -> Result<(), InvalidConfig> {
        let Ok(address) = self.listen.parse::<SocketAddr>() else {
            return Err(InvalidConfig::new(
                "listen",
                format!(
                    "{:?} is not an address to listen on: write an IP address and a port, \
                     e.g. 127.0.0.1:8080 (or 0.0.0.0:8080 for every interface)",
                    self.listen
                ),
            ));
        };
        match &mut self.tls {
            Some(tls) => {
                tls.resolve(base_dir);
                tls.acceptor("tls")?;
            }
            None if !address.ip().is_loopback() && !self.insecure => {
                return Err(InvalidConfig::new(
                    "listen",
                    format!(
                        "{address} reaches beyond this machine, and without tls anyone on the \
                         network could read the bearer token: set tls (certificate and key), \
                         listen on 127.0.0.1, or write insecure: true"
                    ),
                ));
            }
            None => {}
        }
        if self.token.is_empty() {
            return Err(InvalidConfig::new(
                "token",
                "an empty token would let anyone write: set one, e.g. token: \
                 \"${INGEST_TOKEN}\" with INGEST_TOKEN in the environment",
            ));
        }
        if self.max_body_bytes == 0 {
            return Err(InvalidConfig::new(
                "max_body_bytes",
                "0 refuses every body: write e.g. \"16MiB\"",
            ));
        }
        if self.max_buffered_bytes < self.max_body_bytes {
            return Err(InvalidConfig::new(
                "max_buffered_bytes",
                format!(
                    "{} is below max_body_bytes ({}): a body of the largest size could \
                     never be buffered; raise it, or lower max_body_bytes",
                    self.max_buffered_bytes, self.max_body_bytes
                ),
            ));
        }
        if self.idempotency_window.is_zero() {
            return Err(InvalidConfig::new(
                "idempotency_window",
                "0 forgets every key at once, so a retry would apply twice: write e.g. \"10m\"",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use sluice_source_sdk::config::{parse, schema_for};
    use sluice_testkit::schema::assert_schema_judges;

    #[test]
    fn the_schema_takes_the_examples_and_refuses_an_unknown_key() {
        let schema = schema_for::<HttpConfig>();
        let defaults: Vec<_> = ["max_body_bytes", "max_buffered_bytes", "idempotency_window"]
            .map(|key| schema["properties"][key]["default"].clone())
            .into();
        assert_eq!(defaults, ["16MiB", "64MiB", "10m"]);
        assert_schema_judges(
            &schema,
            &[
                json!({"listen": "127.0.0.1:8080", "token": "${INGEST_TOKEN}"}),
                json!({"listen": "0.0.0.0:8080", "token": "t", "max_body_bytes": 1024,
                       "max_buffered_bytes": "1GiB", "idempotency_window": "1h",
                       "insecure": true}),
                json!({"listen": "0.0.0.0:8443", "token": "t",
                       "tls": {"certificate": "server.crt", "key": "server.key",
                               "client_ca": "clients.crt"}}),
            ],
            &[
                json!({"listen": "127.0.0.1:8080", "token": "t", "port": 80}),
                json!({"listen": "127.0.0.1:8080"}),
                json!({"listen": "127.0.0.1:8080", "token": ""}),
            ],
        );
    }

    fn parsed(value: serde_json::Value) -> Result<HttpConfig, InvalidConfig> {
        let mut config: HttpConfig = parse(value)?;
        config.check(Path::new("/pipelines"))?;
        Ok(config)
    }

    #[test]
    fn defaults_fill_the_limits_and_the_window() {
        let config = parsed(json!({"listen": "127.0.0.1:8080", "token": "t"})).unwrap();
        assert_eq!(config.max_body_bytes, 16 << 20);
        assert_eq!(config.max_buffered_bytes, 64 << 20);
        assert_eq!(config.idempotency_window, Duration::from_secs(600));
        assert_eq!(config.address(), "127.0.0.1:8080".parse().unwrap());
        let config = parsed(json!({
            "listen": "[::1]:9000", "token": "t", "max_body_bytes": "1MiB",
            "max_buffered_bytes": 4194304, "idempotency_window": "1h"
        }))
        .unwrap();
        assert_eq!(config.max_body_bytes, 1 << 20);
        assert_eq!(config.max_buffered_bytes, 4 << 20);
        assert_eq!(config.idempotency_window, Duration::from_secs(3600));
    }

    #[test]
    fn plain_http_beyond_loopback_only_when_insecure() {
        for listen in ["127.0.0.1:8080", "[::1]:8080"] {
            parsed(json!({"listen": listen, "token": "t"})).unwrap();
        }
        let config = parsed(json!({"listen": "0.0.0.0:8080", "token": "t", "insecure": true}));
        assert!(config.unwrap().insecure);
    }

    #[test]
    fn errors_name_their_place() {
        for (config, place, needle) in [
            (
                json!({"listen": "127.0.0.1:8080"}),
                "",
                "missing field `token`",
            ),
            (
                json!({"listen": "localhost", "token": "t"}),
                "listen",
                "not an address to listen on",
            ),
            (
                json!({"listen": "127.0.0.1:8080", "token": ""}),
                "token",
                "INGEST_TOKEN",
            ),
            (
                json!({"listen": "127.0.0.1:8080", "token": "t", "max_body_bytes": 0}),
                "max_body_bytes",
                "refuses every body",
            ),
            (
                json!({"listen": "127.0.0.1:8080", "token": "t", "max_buffered_bytes": "1MiB"}),
                "max_buffered_bytes",
                "below max_body_bytes",
            ),
            (
                json!({"listen": "127.0.0.1:8080", "token": "t", "idempotency_window": "0s"}),
                "idempotency_window",
                "apply twice",
            ),
            (
                json!({"listen": "127.0.0.1:8080", "token": "t", "port": 1}),
                "port",
                "unknown field `port`",
            ),
            (
                json!({"listen": "0.0.0.0:8080", "token": "t"}),
                "listen",
                "set tls (certificate and key), listen on 127.0.0.1, or write insecure: true",
            ),
            (
                json!({"listen": "0.0.0.0:8080", "token": "t",
                       "tls": {"certificate": "certs/server.crt", "key": "certs/server.key"}}),
                "tls.certificate",
                "cannot read the certificate file /pipelines/certs/server.crt",
            ),
            (
                json!({"listen": "0.0.0.0:8080", "token": "t",
                       "tls": {"certificate": "a.crt", "key": "a.key", "ca": "c.crt"}}),
                "tls.ca",
                "unknown field `ca`",
            ),
        ] {
            let error = parsed(config.clone()).unwrap_err();
            assert_eq!(error.place, place, "{config}: {error}");
            assert!(error.message.contains(needle), "{config}: {error}");
        }
    }
}
