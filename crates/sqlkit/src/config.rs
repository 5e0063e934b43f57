//! Reading what a request carries: the user's JSON configuration, strictly, and the
//! materialization spec.
//!
//! Every driver's endpoint and resource configurations go through [`parse`], so every
//! driver reports a wrong field the same way: `endpoint config: url: invalid type ...`,
//! naming the path of the field (serde_path_to_error) so a pipeline author can find it
//! in their file. Unknown properties are refused by the config types themselves
//! (`#[serde(deny_unknown_fields)]`).
//!
//! Every SQL store's resource is the same [`TableResource`] (a table, kept by key or
//! appended to), checked against the store's [`NameLimit`] and described by
//! [`table_resource_schema`]; only the limit and the title differ between stores.
//!
//! A SQL store's connection URL carries options its client library does not read (TLS
//! modes and CA files as libpq or MySQL clients spell them, `connect_timeout`):
//! [`ConnectionUrl::read`] takes them out and hands the library the rest (TLS itself:
//! [`crate::tls`]). Every connection has a [`connect_timeout`],
//! [`DEFAULT_CONNECT_TIMEOUT`] unless the URL says otherwise.

use schemars::JsonSchema;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use sluice_config::schema_for;
use sluice_driver_sdk::flow;
use sluice_driver_sdk::{Error, Result};
use std::borrow::Cow;
use std::time::Duration;

/// Deserializes `json` as `what` (e.g. "resource config"); an error is
/// [`Error::Config`] naming `what` and the path of the offending field, if any.
pub fn parse<T: DeserializeOwned>(what: &str, json: &str) -> Result<T> {
    let de = &mut serde_json::Deserializer::from_str(json);
    serde_path_to_error::deserialize(de).map_err(|err| {
        let path = err.path().to_string();
        let inner = err.into_inner();
        if path == "." {
            Error::Config(format!("{what}: {inner}"))
        } else {
            Error::Config(format!("{what}: {path}: {inner}"))
        }
    })
}

/// One binding's resource in a SQL store: a table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TableResource {
    /// Name of the table to materialize into (any name: it is always quoted).
    #[schemars(length(min = 1))]
    pub table: String,
    /// Append every stored document as a new row instead of keeping one row per key.
    #[serde(default)]
    pub delta_updates: bool,
}

impl TableResource {
    /// Parses a resource config; the table name must be a valid identifier under `limit`.
    pub fn parse(json: &str, limit: Option<NameLimit>) -> Result<Self> {
        let config: Self = parse("resource config", json)?;
        check_identifier("resource config: table", &config.table, limit)?;
        Ok(config)
    }
}

/// How long a store lets an identifier be; longer names are refused with the field
/// named rather than failed (or truncated) by the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NameLimit {
    pub max: usize,
    /// Whether `max` counts characters (true) or UTF-8 bytes (false).
    pub in_chars: bool,
    /// The store, as error messages name it (e.g. "PostgreSQL").
    pub store: &'static str,
}

impl NameLimit {
    /// How long `name` is in this limit's unit.
    fn length(&self, name: &str) -> usize {
        if self.in_chars {
            name.chars().count()
        } else {
            name.len()
        }
    }
}

/// Checks that the identifier `name` (the field `what`) is not empty and within `limit`.
pub fn check_identifier(what: &str, name: &str, limit: Option<NameLimit>) -> Result<()> {
    if name.is_empty() {
        return Err(Error::Config(format!(
            "{what}: must not be empty (e.g. \"pageviews\")"
        )));
    }
    if let Some(limit) = limit
        && limit.length(name) > limit.max
    {
        let unit = if limit.in_chars {
            "characters"
        } else {
            "bytes"
        };
        return Err(Error::Config(format!(
            "{what}: {name:?} is longer than the {} {unit} {} allows",
            limit.max, limit.store
        )));
    }
    Ok(())
}

/// JSON schema of a [`TableResource`] whose table name is within `max_length` (if any),
/// titled `title`.
pub fn table_resource_schema(title: &str, max_length: Option<usize>) -> String {
    let mut schema = schema_for::<TableResource>();
    schema["title"] = title.into();
    if let Some(max) = max_length {
        schema["properties"]["table"]["maxLength"] = max.into();
    }
    schema.to_string()
}

/// The materialization spec of an Apply or Open request, which must carry one.
pub fn materialization(
    spec: Option<flow::MaterializationSpec>,
) -> Result<flow::MaterializationSpec> {
    spec.ok_or_else(|| Error::Config("request has no materialization spec".into()))
}

/// How long a connection attempt may take (TCP connect, TLS handshake, login) when the
/// URL sets no `connect_timeout`: long enough for a server across the world, short
/// enough that a dead host surfaces as a retryable error before an operator wonders.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The values a URL option may take, each a name and what it means (`sslmode`'s
/// `verify-full`, `ssl-mode`'s `VERIFY_IDENTITY`).
pub struct OptionValues<T: 'static> {
    /// The option, as errors name it.
    pub option: &'static str,
    pub values: &'static [(&'static str, T)],
    /// Whether `VERIFY_CA` and `verify_ca` are the same value (MySQL clients: yes).
    pub ignore_case: bool,
}

impl<T: Copy + PartialEq> OptionValues<T> {
    /// The value named `written`; another name is a configuration error listing them.
    pub fn parse(&self, written: &str) -> Result<T, sluice_driver_sdk::Error> {
        let same = |name: &str| match self.ignore_case {
            true => name.eq_ignore_ascii_case(written),
            false => name == written,
        };
        (self.values.iter())
            .find_map(|&(name, value)| same(name).then_some(value))
            .ok_or_else(|| {
                sluice_driver_sdk::Error::Config(format!(
                    "endpoint config: url: {}={written}: expected one of {}",
                    self.option,
                    self.names()
                ))
            })
    }

    /// The value of the option among a URL's `options` ([`url_option`]), `default` when
    /// it is not written.
    pub fn read(&self, options: &[(String, String)], default: T) -> Result<T> {
        url_option(options, self.option).map_or(Ok(default), |written| self.parse(written))
    }

    /// The configuration error of `value` written with other options that do not go with
    /// it: `endpoint config: url: sslmode=verify-ca: {why}`.
    pub fn refuse(&self, value: T, why: &str) -> sluice_driver_sdk::Error {
        sluice_driver_sdk::Error::Config(format!(
            "endpoint config: url: {}={}: {why}",
            self.option,
            self.name(value)
        ))
    }

    /// Every value's name, as errors list them: `disable, allow, prefer`.
    pub fn names(&self) -> String {
        let names: Vec<&str> = self.values.iter().map(|(name, _)| *name).collect();
        names.join(", ")
    }

    /// The name of `value`.
    pub fn name(&self, value: T) -> &'static str {
        (self.values.iter())
            .find_map(|&(name, v)| (v == value).then_some(name))
            .unwrap_or_default()
    }
}

/// A SQL store's TLS settings, as read from the options of its connection URL.
pub trait UrlTls: Sized {
    /// The URL options read here, taken out before the client library parses the rest
    /// (it knows them not, or not all their values).
    const URL_OPTIONS: &'static [&'static str];

    /// The settings `options` write; combinations the store's clients refuse are
    /// configuration errors naming the options.
    fn from_url_options(options: &[(String, String)]) -> Result<Self>;
}

/// How to reach a SQL server: the client library's settings (`client`), and what the
/// driver reads from the URL itself.
#[derive(Debug, Clone)]
pub struct Connection<C, T> {
    pub client: C,
    pub tls: T,
    /// The bound of one whole connection attempt.
    pub connect_timeout: Duration,
}

/// A connection URL with the options the driver reads taken out.
#[derive(Debug, Clone)]
pub struct ConnectionUrl<T> {
    /// Every option of the URL's query, as written ([`url_query_options`]).
    pub options: Vec<(String, String)>,
    pub tls: T,
    pub connect_timeout: Duration,
    /// The URL without the TLS options and `connect_timeout`: what the client library
    /// parses.
    pub rest: String,
}

impl<T: UrlTls> ConnectionUrl<T> {
    /// Reads `url`'s TLS options and `connect_timeout`; errors name the option.
    pub fn read(url: &str) -> Result<Self> {
        let options = url_query_options(url);
        let tls = T::from_url_options(&options)?;
        let connect_timeout = connect_timeout(&options)?;
        let rest = url_without_options(url, &[T::URL_OPTIONS, &["connect_timeout"]].concat());
        Ok(ConnectionUrl {
            options,
            tls,
            connect_timeout,
            rest,
        })
    }

    /// Whether the URL writes option `name`.
    pub fn sets(&self, name: &str) -> bool {
        url_option(&self.options, name).is_some()
    }

    /// The connection of the client library's settings `client` (parsed from
    /// [`Self::rest`]).
    pub fn connection<C>(self, client: C) -> Connection<C, T> {
        Connection {
            client,
            tls: self.tls,
            connect_timeout: self.connect_timeout,
        }
    }
}

/// The value of option `name` among `options` ([`url_query_options`]): the last one
/// written wins, as libpq and MySQL clients read a repeated option.
pub fn url_option<'a>(options: &'a [(String, String)], name: &str) -> Option<&'a str> {
    (options.iter().rfind(|(n, _)| n == name)).map(|(_, value)| value.as_str())
}

/// The `name=value` options of the query of `url` (after its first `?`), percent-decoded,
/// in the order written. An option without `=` has an empty value.
pub fn url_query_options(url: &str) -> Vec<(String, String)> {
    let decode = |text: &str| -> String {
        percent_encoding::percent_decode_str(text)
            .decode_utf8()
            .map_or_else(|_| text.to_owned(), Cow::into_owned)
    };
    let Some((_, query)) = url.split_once('?') else {
        return Vec::new();
    };
    (query.split('&'))
        .filter(|option| !option.is_empty())
        .map(|option| {
            let (name, value) = option.split_once('=').unwrap_or((option, ""));
            (decode(name), decode(value))
        })
        .collect()
}

/// `url` without the query options named in `names`: those the driver reads itself and
/// its client library would refuse as unknown. Other options keep their spelling.
pub fn url_without_options(url: &str, names: &[&str]) -> String {
    let Some((base, query)) = url.split_once('?') else {
        return url.to_owned();
    };
    let kept: Vec<&str> = (query.split('&'))
        .filter(|option| {
            let name = option.split_once('=').map_or(*option, |(name, _)| name);
            let name = percent_encoding::percent_decode_str(name).decode_utf8_lossy();
            !option.is_empty() && !names.contains(&&*name)
        })
        .collect();
    if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    }
}

/// The `connect_timeout` of a connection URL's `options`: whole seconds, as libpq and
/// MySQL clients read it, [`DEFAULT_CONNECT_TIMEOUT`] when absent. Zero (libpq's "wait
/// forever") is refused: every connection attempt ends.
pub fn connect_timeout(options: &[(String, String)]) -> Result<Duration> {
    let Some(value) = url_option(options, "connect_timeout") else {
        return Ok(DEFAULT_CONNECT_TIMEOUT);
    };
    match value.parse::<u64>() {
        Ok(seconds) if seconds > 0 => Ok(Duration::from_secs(seconds)),
        _ => Err(Error::Config(format!(
            "endpoint config: url: connect_timeout={value}: expected a whole number of \
             seconds greater than 0 (default {})",
            DEFAULT_CONNECT_TIMEOUT.as_secs()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::{Value, json};
    use sluice_testkit::schema::assert_schema_judges;

    #[test]
    fn the_table_schema_takes_a_table_within_the_limit_and_refuses_an_unknown_key() {
        let schema: Value =
            serde_json::from_str(&table_resource_schema("Some table", Some(8))).unwrap();
        assert_eq!(schema["title"], "Some table");
        assert_eq!(schema["properties"]["delta_updates"]["default"], false);
        assert_schema_judges(
            &schema,
            &[
                json!({"table": "views"}),
                json!({"table": "views", "delta_updates": true}),
            ],
            &[
                json!({"table": "views", "schema": "s"}),
                json!({"table": "much_too_long"}),
                json!({"table": ""}),
                json!({}),
            ],
        );
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)] // Read only by serde.
    struct Resource {
        table: String,
        nested: Option<Nested>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Nested {
        depth: u32,
    }

    fn error(json: &str) -> String {
        parse::<Resource>("resource config", json)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn a_wrong_field_is_named_by_its_path() {
        assert_eq!(
            error(r#"{"table": 5}"#),
            "invalid configuration: resource config: table: \
             invalid type: integer `5`, expected a string at line 1 column 11"
        );
        assert!(
            error(r#"{"table": "t", "nested": {"depth": "deep"}}"#)
                .contains("resource config: nested.depth: invalid type"),
        );
    }

    #[test]
    fn a_missing_or_unknown_field_names_the_config() {
        assert!(error("{}").contains("resource config: missing field `table`"));
        assert!(error(r#"{"table": "t", "tabel": "u"}"#).contains("unknown field `tabel`"));
    }

    const LIMIT: NameLimit = NameLimit {
        max: 3,
        in_chars: true,
        store: "TinyDB",
    };

    #[test]
    fn a_table_resource_names_its_wrong_missing_and_unknown_fields() {
        let err = TableResource::parse(r#"{"table": 5}"#, None).unwrap_err();
        assert!(
            err.to_string()
                .contains("resource config: table: invalid type"),
            "{err}"
        );
        let err = TableResource::parse(r#"{}"#, None).unwrap_err();
        assert!(err.to_string().contains("missing field `table`"), "{err}");
        let err = TableResource::parse(r#"{"table": "t", "tabel": "u"}"#, None).unwrap_err();
        assert!(err.to_string().contains("unknown field `tabel`"), "{err}");
    }

    #[test]
    fn a_table_resource_defaults_to_keeping_one_row_per_key() {
        let resource = TableResource::parse(r#"{"table": "t"}"#, None).unwrap();
        assert_eq!(resource.table, "t");
        assert!(!resource.delta_updates);
    }

    #[test]
    fn empty_and_overlong_table_names_are_refused() {
        let err = TableResource::parse(r#"{"table": ""}"#, Some(LIMIT)).unwrap_err();
        assert!(
            err.to_string().contains("table: must not be empty"),
            "{err}"
        );
        let err = TableResource::parse(r#"{"table": "abcd"}"#, Some(LIMIT)).unwrap_err();
        assert!(
            err.to_string()
                .contains("\"abcd\" is longer than the 3 characters TinyDB allows"),
            "{err}"
        );
        assert!(TableResource::parse(r#"{"table": "äöü"}"#, Some(LIMIT)).is_ok());
        let bytes = NameLimit {
            in_chars: false,
            ..LIMIT
        };
        let err = TableResource::parse(r#"{"table": "äöü"}"#, Some(bytes)).unwrap_err();
        assert!(
            err.to_string()
                .contains("is longer than the 3 bytes TinyDB allows"),
            "{err}"
        );
    }

    #[test]
    fn the_table_resource_schema_is_json_with_the_length_limit() {
        for max in [None, Some(63)] {
            let schema: serde_json::Value =
                serde_json::from_str(&table_resource_schema("T", max)).unwrap();
            assert_eq!(schema["title"], "T");
            assert_eq!(
                schema["properties"]["table"]
                    .get("maxLength")
                    .and_then(|m| m.as_u64()),
                max.map(|m| m as u64)
            );
        }
    }

    #[test]
    fn a_request_without_a_spec_is_a_config_error() {
        let err = materialization(None).unwrap_err();
        assert!(matches!(err, Error::Config(_)), "{err}");
        assert!(materialization(Some(Default::default())).is_ok());
    }

    #[test]
    fn url_options_are_read_decoded_and_taken_out_keeping_the_rest() {
        let url = "postgres://u:p%3Fw@h/db?sslmode=verify-full&application_name=a%20b\
                   &sslrootcert=%2Ftmp%2Fca.pem&flag";
        assert_eq!(
            url_query_options(url),
            [
                ("sslmode", "verify-full"),
                ("application_name", "a b"),
                ("sslrootcert", "/tmp/ca.pem"),
                ("flag", ""),
            ]
            .map(|(name, value)| (name.to_owned(), value.to_owned()))
        );
        assert_eq!(
            url_without_options(url, &["sslmode", "sslrootcert"]),
            "postgres://u:p%3Fw@h/db?application_name=a%20b&flag"
        );
        assert_eq!(
            url_without_options("mysql://h/db?ssl-mode=REQUIRED", &["ssl-mode"]),
            "mysql://h/db"
        );
        assert_eq!(url_without_options("mysql://h/db", &["x"]), "mysql://h/db");
        assert!(url_query_options("mysql://h/db").is_empty());
    }

    #[test]
    fn the_connect_timeout_defaults_to_ten_seconds_and_refuses_zero_or_junk() {
        let options = |value: &str| vec![("connect_timeout".to_owned(), value.to_owned())];
        assert_eq!(connect_timeout(&[]).unwrap(), Duration::from_secs(10));
        assert_eq!(
            connect_timeout(&options("3")).unwrap(),
            Duration::from_secs(3)
        );
        for bad in ["0", "-1", "2.5", "soon"] {
            let err = connect_timeout(&options(bad)).unwrap_err().to_string();
            assert!(
                err.contains(&format!(
                    "url: connect_timeout={bad}: expected a whole number"
                )),
                "{err}"
            );
        }
    }
}
