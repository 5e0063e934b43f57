//! The endpoint a user writes to reach one schema of one PostgreSQL database
//! (`{"url": "postgres://...", "schema": "sales"}`), with its JSON schema.
//!
//! Parsing is strict: unknown properties are errors, and every error names the field
//! that is wrong (`endpoint config: url: ...`), so a pipeline author can find it in their
//! file. The URL may hold a password (`${PGPASSWORD}` expanded by the runtime): it is
//! never printed. Everything that names the server uses [`EndpointConfig::describe`],
//! which drops it.
//!
//! The URL's query takes libpq's options: `sslmode` and `sslrootcert` (read by
//! [`crate::tls`]), `connect_timeout` (whole seconds, default 10: the TCP connect to each
//! address and, in all, the TLS handshake and login), and the TCP keepalive options,
//! whose defaults here ([`KEEPALIVES_IDLE`] and the next) end a connection to a dead peer
//! within about a minute instead of the two hours of the kernel's.

use crate::tls::Tls;
use schemars::JsonSchema;
use serde::Deserialize;
use sluice_config::schema_for;
use sluice_driver_sdk::{Error, Result};
use sluice_sqlkit::config::{self, ConnectionUrl, NameLimit, check_identifier, parse};
use std::str::FromStr;
use std::sync::LazyLock;
use std::time::Duration;

/// The schema used when the endpoint names none.
pub const DEFAULT_SCHEMA: &str = "public";

/// JSON schema of [`EndpointConfig`], derived once.
pub static ENDPOINT_SCHEMA: LazyLock<String> =
    LazyLock::new(|| schema_for::<EndpointConfig>().to_string());

/// One schema of one PostgreSQL database.
#[derive(Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "PostgreSQL endpoint")]
pub struct EndpointConfig {
    /// Connection URL, e.g.
    /// postgres://user:${PGPASSWORD}@host:5432/db?sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem.
    /// Query options as libpq reads them: sslmode (disable, allow, prefer (default),
    /// require, verify-ca, verify-full), sslrootcert (a PEM file of CA certificates, or
    /// system for the bundled public roots with verify-full), connect_timeout (seconds,
    /// default 10), keepalives_idle (default 30), keepalives_interval (default 10),
    /// keepalives_retries (default 3), tcp_user_timeout (default 60), application_name.
    #[schemars(length(min = 1))]
    pub url: String,
    /// Schema holding the tables and the checkpoints table; created by apply if
    /// missing.
    #[serde(default)]
    #[schemars(with = "String", length(min = 1), extend("default" = DEFAULT_SCHEMA))]
    pub schema: Option<String>,
}

/// Never shows the URL: it may hold a password.
impl std::fmt::Debug for EndpointConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointConfig")
            .field("server", &self.describe())
            .field("schema", &self.schema())
            .finish()
    }
}

/// TCP keepalive defaults for a URL that sets none: after [`KEEPALIVES_IDLE`] of
/// silence, [`KEEPALIVES_RETRIES`] probes [`KEEPALIVES_INTERVAL`] apart, so a dead peer
/// ends the connection (a retryable error) in about a minute; [`TCP_USER_TIMEOUT`]
/// bounds the same for data sent and never acknowledged.
pub const KEEPALIVES_IDLE: Duration = Duration::from_secs(30);
pub const KEEPALIVES_INTERVAL: Duration = Duration::from_secs(10);
pub const KEEPALIVES_RETRIES: u32 = 3;
pub const TCP_USER_TIMEOUT: Duration = Duration::from_secs(60);

/// How to reach the server: tokio-postgres's settings of the URL, with
/// `connect_timeout` and the keepalive defaults set, and the TLS the URL asks for.
pub type Connection = config::Connection<tokio_postgres::Config, Tls>;

/// Longest identifier PostgreSQL keeps (NAMEDATALEN - 1); longer ones are truncated
/// silently, which would make two long names collide.
pub const NAME_LIMIT: NameLimit = NameLimit {
    max: 63,
    in_chars: false,
    store: "PostgreSQL",
};

impl EndpointConfig {
    pub fn parse(json: &str) -> Result<Self> {
        let config: Self = parse("endpoint config", json)?;
        config.connection()?;
        if let Some(schema) = &config.schema {
            check_identifier("endpoint config: schema", schema, Some(NAME_LIMIT))?;
        }
        Ok(config)
    }

    /// The schema of every table of this endpoint.
    pub fn schema(&self) -> &str {
        self.schema.as_deref().unwrap_or(DEFAULT_SCHEMA)
    }

    /// The parsed connection settings.
    pub fn connection(&self) -> Result<Connection> {
        let not_a_url = |why: String| {
            Error::Config(format!(
                "endpoint config: url: not a PostgreSQL connection URL ({why}); \
                 expected e.g. postgres://user@host:5432/database"
            ))
        };
        if !["postgres://", "postgresql://"]
            .iter()
            .any(|scheme| self.url.starts_with(scheme))
        {
            return Err(not_a_url(
                "it starts with neither postgres:// nor postgresql://".into(),
            ));
        }
        let url = ConnectionUrl::<Tls>::read(&self.url)?;
        let mut config = tokio_postgres::Config::from_str(&url.rest)
            .map_err(|err| not_a_url(err.to_string()))?;
        config.connect_timeout(url.connect_timeout);
        if !url.sets("keepalives_idle") {
            config.keepalives_idle(KEEPALIVES_IDLE);
        }
        if !url.sets("keepalives_interval") {
            config.keepalives_interval(KEEPALIVES_INTERVAL);
        }
        if !url.sets("keepalives_retries") {
            config.keepalives_retries(KEEPALIVES_RETRIES);
        }
        if !url.sets("tcp_user_timeout") {
            config.tcp_user_timeout(TCP_USER_TIMEOUT);
        }
        Ok(url.connection(config))
    }

    /// The server as `postgres://user@host:port/database`, without the password: what
    /// errors and logs name.
    pub fn describe(&self) -> String {
        let Ok(Connection { client: config, .. }) = self.connection() else {
            return "postgres://(invalid url)".to_owned();
        };
        let host = match config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
            #[cfg(unix)]
            Some(tokio_postgres::config::Host::Unix(path)) => path.display().to_string(),
            None => "localhost".to_owned(),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        format!(
            "postgres://{}@{host}:{port}/{}",
            config.get_user().unwrap_or(""),
            config.get_dbname().unwrap_or("")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use sluice_testkit::schema::assert_schema_judges;

    #[test]
    fn endpoint_defaults_to_the_public_schema() {
        let config = EndpointConfig::parse(r#"{"url": "postgres://u@h/db"}"#).unwrap();
        assert_eq!(config.schema(), "public");
        let config =
            EndpointConfig::parse(r#"{"url": "postgres://u@h/db", "schema": "Sales"}"#).unwrap();
        assert_eq!(config.schema(), "Sales");
    }

    #[test]
    fn the_password_is_never_described_or_debug_printed() {
        let config =
            EndpointConfig::parse(r#"{"url": "postgres://alice:s3cret@db.example:6543/sales"}"#)
                .unwrap();
        assert_eq!(config.describe(), "postgres://alice@db.example:6543/sales");
        assert!(!format!("{config:?}").contains("s3cret"));
    }

    #[test]
    fn a_bad_or_missing_url_is_a_config_error_naming_the_field() {
        let err = EndpointConfig::parse(r#"{"url": "postgres://u@h:notaport/db"}"#).unwrap_err();
        assert!(err.to_string().contains("endpoint config: url:"), "{err}");
        let err = EndpointConfig::parse(r#"{}"#).unwrap_err();
        assert!(err.to_string().contains("missing field `url`"), "{err}");
    }

    #[test]
    fn the_url_takes_tls_options_and_sets_timeout_and_keepalive_defaults() {
        let url = "postgres://u@h/db?sslmode=verify-full&sslrootcert=/ca.pem&keepalives_idle=5";
        let config = EndpointConfig::parse(&serde_json::json!({ "url": url }).to_string());
        let Connection {
            client: config,
            tls,
            connect_timeout,
        } = config.unwrap().connection().unwrap();
        assert_eq!(tls.describe(), "sslmode=verify-full sslrootcert=/ca.pem");
        assert_eq!(connect_timeout, Duration::from_secs(10));
        assert_eq!(config.get_connect_timeout(), Some(&Duration::from_secs(10)));
        assert_eq!(config.get_keepalives_idle(), Duration::from_secs(5));
        assert_eq!(config.get_keepalives_interval(), Some(KEEPALIVES_INTERVAL));
        assert_eq!(config.get_keepalives_retries(), Some(KEEPALIVES_RETRIES));
        assert_eq!(config.get_tcp_user_timeout(), Some(&TCP_USER_TIMEOUT));
    }

    #[test]
    fn a_key_value_connection_string_is_refused_for_a_url() {
        let err = EndpointConfig::parse(r#"{"url": "host=h dbname=db sslmode=require"}"#)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("neither postgres:// nor postgresql://"),
            "{err}"
        );
    }

    #[test]
    fn a_schema_longer_than_63_bytes_is_refused() {
        let endpoint = |schema: String| {
            EndpointConfig::parse(
                &json!({"url": "postgres://u@h/db", "schema": schema}).to_string(),
            )
        };
        assert!(endpoint("s".repeat(63)).is_ok());
        let err = endpoint("s".repeat(64)).unwrap_err();
        assert!(
            err.to_string().contains("endpoint config: schema:")
                && err.to_string().contains("63 bytes PostgreSQL allows"),
            "{err}"
        );
    }

    #[test]
    fn the_schema_takes_the_examples_and_refuses_an_unknown_key() {
        let endpoint: Value = serde_json::from_str(&ENDPOINT_SCHEMA).unwrap();
        assert_eq!(endpoint["properties"]["schema"]["default"], DEFAULT_SCHEMA);
        assert_schema_judges(
            &endpoint,
            &[
                json!({"url": "postgres://u@h:5432/db"}),
                json!({"url": "postgres://u:${PGPASSWORD}@h/db?sslmode=require", "schema": "sales"}),
            ],
            &[
                json!({"url": "postgres://u@h/db", "database": "d"}),
                json!({"schema": "sales"}),
            ],
        );
    }
}
