//! What the user writes: the endpoint (`{"url": "mysql://user@host:3306/database"}`) and
//! each binding's resource (`{"table": "pageviews"}`), with the JSON schemas that Spec
//! returns.
//!
//! Parsing is strict: unknown properties are errors, and every error names the field
//! that is wrong (`endpoint config: url: ...`), so a pipeline author can find it in their
//! file. The URL may hold a password (`${MYSQL_PASSWORD}` expanded by the runtime): it is
//! never printed. Everything that names the server uses [`EndpointConfig::describe`],
//! which drops it.
//!
//! The URL's query takes mysql_async's options and three of MySQL clients': `ssl-mode`
//! and `ssl-ca` (read by [`crate::tls`]) and `connect_timeout` (whole seconds, default
//! 10, for the whole attempt: TCP connect, TLS handshake, login). `tcp_keepalive`
//! (milliseconds, mysql_async's) defaults to [`TCP_KEEPALIVE`].

use crate::tls::Tls;
use schemars::JsonSchema;
use serde::Deserialize;
use sluice_config::schema_for;
use sluice_driver_sdk::{Error, Result};
use sluice_sqlkit::config::{
    self, ConnectionUrl, NameLimit, TableResource, parse, table_resource_schema,
};
use std::sync::LazyLock;
use std::time::Duration;

/// Where the documentation of this driver lives (returned by Spec).
pub const DOCUMENTATION_URL: &str =
    "https://github.com/sluice-rs/sluice/tree/main/crates/connectors/mysql";

/// JSON schema of [`EndpointConfig`], derived once.
pub static ENDPOINT_SCHEMA: LazyLock<String> =
    LazyLock::new(|| schema_for::<EndpointConfig>().to_string());

/// JSON schema of [`ResourceConfig`].
pub fn resource_schema() -> String {
    table_resource_schema("MariaDB / MySQL table", Some(NAME_LIMIT.max))
}

/// One database of a MariaDB or MySQL server.
#[derive(Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "MariaDB / MySQL endpoint")]
pub struct EndpointConfig {
    /// Connection URL naming the database, e.g.
    /// mysql://user:${MYSQL_PASSWORD}@host:3306/db?ssl-mode=VERIFY_IDENTITY&ssl-ca=/etc/ssl/db-ca.pem.
    /// Query options as MySQL clients spell them: ssl-mode (DISABLED, PREFERRED
    /// (default), REQUIRED, VERIFY_CA, VERIFY_IDENTITY), ssl-ca (a PEM file of CA
    /// certificates), connect_timeout (seconds, default 10); and mysql_async's, e.g.
    /// tcp_keepalive (milliseconds, default 30000). The server must allow LOAD DATA
    /// LOCAL INFILE (local_infile=ON, the MariaDB default).
    #[schemars(length(min = 1))]
    pub url: String,
}

/// Never shows the URL: it may hold a password.
impl std::fmt::Debug for EndpointConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointConfig")
            .field("server", &self.describe())
            .finish()
    }
}

/// The TCP keepalive time of a URL that sets no `tcp_keepalive`: after 30 s of silence
/// the kernel probes the peer (at its own interval and count: mysql_async sets no
/// others), so a dead server ends the connection as a retryable error instead of never.
pub const TCP_KEEPALIVE: Duration = Duration::from_secs(30);

/// How to reach the server: mysql_async's settings of the URL, with the
/// [`TCP_KEEPALIVE`] default set, and what the driver adds to them.
pub type Connection = config::Connection<mysql_async::Opts, Tls>;

/// One binding's resource: a table, parsed with [`ResourceConfig::parse`]`(json, Some(NAME_LIMIT))`.
pub type ResourceConfig = TableResource;

/// Longest identifier MariaDB and MySQL accept (in characters); longer names are errors
/// from the server, better caught with the field named.
pub const NAME_LIMIT: NameLimit = NameLimit {
    max: 64,
    in_chars: true,
    store: "MariaDB and MySQL",
};

impl EndpointConfig {
    pub fn parse(json: &str) -> Result<Self> {
        let config: Self = parse("endpoint config", json)?;
        let opts = config.connection()?.client;
        if opts.db_name().is_none_or(str::is_empty) {
            return Err(Error::Config(
                "endpoint config: url: names no database; expected e.g. \
                 mysql://user@host:3306/database"
                    .into(),
            ));
        }
        Ok(config)
    }

    /// The parsed connection settings.
    pub fn connection(&self) -> Result<Connection> {
        let url = ConnectionUrl::<Tls>::read(&self.url)?;
        let opts = mysql_async::Opts::from_url(&url.rest).map_err(|err| {
            Error::Config(format!(
                "endpoint config: url: not a MySQL connection URL ({err}); \
                 expected e.g. mysql://user@host:3306/database"
            ))
        })?;
        let keepalive = opts.tcp_keepalive().unwrap_or(TCP_KEEPALIVE);
        let opts = mysql_async::OptsBuilder::from_opts(opts).tcp_keepalive(Some(keepalive));
        Ok(url.connection(opts.into()))
    }

    /// The database the tables live in.
    pub fn database(&self) -> String {
        self.connection()
            .ok()
            .and_then(|connection| connection.client.db_name().map(str::to_owned))
            .unwrap_or_default()
    }

    /// The server as `mysql://user@host:port/database`, without the password: what
    /// errors and logs name.
    pub fn describe(&self) -> String {
        let Ok(Connection { client: opts, .. }) = self.connection() else {
            return "mysql://(invalid url)".to_owned();
        };
        format!(
            "mysql://{}@{}:{}/{}",
            opts.user().unwrap_or(""),
            opts.ip_or_hostname(),
            opts.tcp_port(),
            opts.db_name().unwrap_or("")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};
    use sluice_testkit::schema::assert_schema_judges;

    #[test]
    fn the_endpoint_names_its_database() {
        let config =
            EndpointConfig::parse(r#"{"url": "mysql://root@127.0.0.1:3306/test"}"#).unwrap();
        assert_eq!(config.database(), "test");
    }

    #[test]
    fn the_password_is_never_described_or_debug_printed() {
        let config =
            EndpointConfig::parse(r#"{"url": "mysql://alice:s3cret@db.example:3307/sales"}"#)
                .unwrap();
        assert_eq!(config.describe(), "mysql://alice@db.example:3307/sales");
        assert!(!format!("{config:?}").contains("s3cret"));
    }

    #[test]
    fn a_bad_missing_or_databaseless_url_is_a_config_error_naming_the_field() {
        for url in ["postgres://u@h/db", "mysql://u@h:3306"] {
            let err = EndpointConfig::parse(&format!(r#"{{"url": "{url}"}}"#)).unwrap_err();
            assert!(err.to_string().contains("endpoint config: url:"), "{err}");
        }
        let err = EndpointConfig::parse(r#"{}"#).unwrap_err();
        assert!(err.to_string().contains("missing field `url`"), "{err}");
    }

    #[test]
    fn the_url_takes_tls_and_timeout_options_and_sets_the_keepalive_default() {
        let url = "mysql://u@h:3306/db?ssl-mode=VERIFY_CA&ssl-ca=/ca.pem&connect_timeout=3";
        let config = EndpointConfig::parse(&serde_json::json!({ "url": url }).to_string());
        let Connection {
            client: opts,
            tls,
            connect_timeout,
        } = config.unwrap().connection().unwrap();
        assert_eq!(tls.describe(), "ssl-mode=VERIFY_CA ssl-ca=/ca.pem");
        assert_eq!(connect_timeout, Duration::from_secs(3));
        assert_eq!(opts.tcp_keepalive(), Some(TCP_KEEPALIVE));
        let url = "mysql://u@h:3306/db?tcp_keepalive=5000";
        let config = EndpointConfig::parse(&serde_json::json!({ "url": url }).to_string());
        let opts = config.unwrap().connection().unwrap().client;
        assert_eq!(opts.tcp_keepalive(), Some(Duration::from_secs(5)));
    }

    #[test]
    fn table_names_may_have_64_characters_of_any_width() {
        let table = |name: String| {
            ResourceConfig::parse(&format!(r#"{{"table": "{name}"}}"#), Some(NAME_LIMIT))
        };
        assert!(table("é".repeat(64)).is_ok());
        let err = table("x".repeat(65)).unwrap_err();
        assert!(
            err.to_string()
                .contains("is longer than the 64 characters MariaDB and MySQL allow"),
            "{err}"
        );
    }

    #[test]
    fn the_schemas_take_the_examples_and_refuse_an_unknown_key() {
        let endpoint: Value = serde_json::from_str(&ENDPOINT_SCHEMA).unwrap();
        assert_schema_judges(
            &endpoint,
            &[json!({"url": "mysql://u:${MYSQL_PASSWORD}@h:3306/db?ssl-mode=REQUIRED"})],
            &[json!({"url": "mysql://u@h/db", "schema": "s"}), json!({})],
        );
        let resource: Value = serde_json::from_str(&resource_schema()).unwrap();
        assert_schema_judges(
            &resource,
            &[json!({"table": "é".repeat(64)})],
            &[
                json!({"table": "x".repeat(65)}),
                json!({"table": "t", "tabel": "t"}),
            ],
        );
    }
}
