//! What the user writes: `postgres_cdc: {url: postgres://…, publication: p}` or
//! `{url: …, tables: [public.orders, items]}`, with `slot`, `chunk_rows`, `truncate`,
//! `heartbeat` and `retained_warning` optional. Strict: unknown keys are errors.

use crate::wire::Target;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sluice_source_sdk::InvalidConfig;
use sluice_source_sdk::config::{bytes_schema, duration_schema, ser_bytes};
use sluice_source_sdk::redact::redact;
use sluice_source_sdk::tls::libpq::{SslOptions, split_url};
use std::time::Duration;

/// A PostgreSQL database's changes by logical replication (pgoutput), after a snapshot
/// of the published tables.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "PostgreSQL change data capture")]
pub struct PostgresCdcConfig {
    /// postgres://user[:password]@host[:port]/database[?sslmode=…&sslrootcert=…]; the
    /// user needs REPLICATION. sslmode as libpq's: disable, allow, prefer (default),
    /// require, verify-ca, verify-full; sslrootcert a PEM file of CAs, or system.
    #[schemars(length(min = 1))]
    pub url: String,
    /// The publication read; must exist unless tables is given (then default
    /// sluice_<slot>, created if missing).
    #[serde(default)]
    #[schemars(with = "String", length(min = 1))]
    pub publication: Option<String>,
    /// The tables (schema.table, or table in public) of the publication Sluice creates
    /// when it is missing.
    #[serde(default)]
    #[schemars(with = "Vec<String>", length(min = 1))]
    pub tables: Option<Vec<String>>,
    /// The replication slot; default sluice_<materialization>_<source>, made a valid
    /// slot name.
    #[serde(default)]
    #[schemars(with = "String", length(min = 1))]
    pub slot: Option<String>,
    /// Rows read per backfill query.
    // The most a query reads; a step takes fewer when its limits are smaller.
    #[serde(default = "default_chunk_rows")]
    #[schemars(range(min = 1))]
    pub chunk_rows: usize,
    /// A TRUNCATE of a published table stops the source naming the table (delete_all
    /// is refused).
    #[serde(default)]
    pub truncate: Truncate,
    /// Off by default. Every this long (e.g. 30s), write a small logical message into
    /// the WAL (pg_logical_emit_message, not sent to the source): for a database with
    /// no traffic at all, the slot's position then still moves.
    #[serde(default, deserialize_with = "de_heartbeat")]
    #[schemars(schema_with = "duration_schema")]
    pub heartbeat: Option<Duration>,
    /// Log a warning (at most once a minute) while the slot holds back more WAL than
    /// this (bytes, or e.g. "512MiB"); the amount is the metric
    /// sluice_source_retained_bytes.
    #[serde(
        default = "default_retained_warning",
        deserialize_with = "sluice_source_sdk::config::de_bytes",
        serialize_with = "ser_bytes"
    )]
    #[schemars(schema_with = "bytes_schema")]
    pub retained_warning: u64,
}

fn default_chunk_rows() -> usize {
    10_000
}

/// 1 GiB: far above what a pipeline that keeps up holds back (a few WAL segments of
/// 16 MiB), far below what fills a disk sized for a busy primary.
fn default_retained_warning() -> u64 {
    1 << 30
}

fn de_heartbeat<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    sluice_source_sdk::config::de_duration(d).map(Some)
}

/// What a TRUNCATE becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Truncate {
    /// The source fails, naming the table: a truncate is not a change of some keys.
    #[default]
    Error,
    /// Refused when the configuration is read: a delete of every key of a table
    /// needs those keys, which a truncate does not carry, and no store takes a
    /// "delete all" change yet. Not in the schema: it is no value to write.
    #[schemars(skip)]
    DeleteAll,
}

/// The longest slot name PostgreSQL takes (NAMEDATALEN - 1).
const MAX_SLOT: usize = 63;

impl PostgresCdcConfig {
    /// What serde cannot check.
    pub fn check(&self) -> Result<(), InvalidConfig> {
        self.target()?;
        if self.publication.is_none() && self.tables.is_none() {
            return Err(InvalidConfig::new(
                "",
                "name a publication (publication: my_pub, created with CREATE PUBLICATION \
                 my_pub FOR TABLE …) or list tables: [schema.table, …] for Sluice to \
                 create one",
            ));
        }
        if let Some(tables) = &self.tables {
            if tables.is_empty() {
                return Err(InvalidConfig::new("tables", "an empty list: name a table"));
            }
            for (i, table) in tables.iter().enumerate() {
                if split_table(table).is_none() {
                    return Err(InvalidConfig::new(
                        format!("tables[{i}]"),
                        format!("{table:?} is not a table name: write table or schema.table"),
                    ));
                }
            }
        }
        if let Some(slot) = &self.slot
            && sanitize_slot(slot) != *slot
        {
            return Err(InvalidConfig::new(
                "slot",
                format!(
                    "{slot:?} is not a replication slot name: lower-case letters, digits \
                     and _, at most {MAX_SLOT} characters (e.g. {:?})",
                    sanitize_slot(slot)
                ),
            ));
        }
        if self.chunk_rows == 0 {
            return Err(InvalidConfig::new("chunk_rows", "must be at least 1"));
        }
        if self
            .heartbeat
            .is_some_and(|every| every < Duration::from_secs(1))
        {
            return Err(InvalidConfig::new(
                "heartbeat",
                "below 1s: each heartbeat writes WAL, and the slot confirms it at most \
                 every few seconds; write e.g. \"30s\"",
            ));
        }
        if self.truncate == Truncate::DeleteAll {
            return Err(InvalidConfig::new(
                "truncate",
                "delete_all is not supported yet: a TRUNCATE does not carry the keys it \
                 removes and no store takes a delete of every key; leave truncate: error \
                 (the source stops, naming the table) and reset the pipeline after a \
                 truncate",
            ));
        }
        Ok(())
    }

    /// Where the URL points, and its TLS options (taken out before tokio-postgres reads
    /// the rest: it knows neither `sslrootcert` nor every `sslmode`).
    pub fn target(&self) -> Result<Target, InvalidConfig> {
        let bad = |why: &str| {
            InvalidConfig::new(
                "url",
                format!(
                    "{:?} is not a PostgreSQL URL ({why}); write e.g. \
                     postgres://user@127.0.0.1:5432/db",
                    redact(&self.url)
                ),
            )
        };
        let (options, url) = split_url(&self.url, SslOptions::URL_OPTIONS);
        let ssl = SslOptions::read(&options)?;
        let config: tokio_postgres::Config = url.parse().map_err(|_| bad("unreadable"))?;
        let host = match config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(host)) => host.clone(),
            Some(_) => return Err(bad("a Unix socket: only TCP hosts are supported")),
            None => return Err(bad("no host")),
        };
        Ok(Target {
            host,
            port: config.get_ports().first().copied().unwrap_or(5432),
            user: config.get_user().unwrap_or("postgres").to_string(),
            password: config.get_password().map(<[u8]>::to_vec),
            database: config
                .get_dbname()
                .or(config.get_user())
                .unwrap_or("postgres")
                .to_string(),
            ssl,
            url,
        })
    }

    /// The slot this source (of `materialization`) reads.
    pub fn slot_name(&self, materialization: &str, source: &str) -> String {
        match &self.slot {
            Some(slot) => slot.clone(),
            None => sanitize_slot(&format!("sluice_{materialization}_{source}")),
        }
    }

    /// The publication read: as given, or `sluice_<slot>` for a table list.
    pub fn publication_name(&self, slot: &str) -> String {
        self.publication
            .clone()
            .unwrap_or_else(|| format!("sluice_{slot}"))
    }
}

/// `schema.table` or `table` (in `public`).
pub fn split_table(name: &str) -> Option<(String, String)> {
    let (schema, table) = name.split_once('.').unwrap_or(("public", name));
    (!schema.is_empty() && !table.is_empty() && !table.contains('.'))
        .then(|| (schema.to_string(), table.to_string()))
}

/// A valid slot name from any text: lower case, every other character `_`; a long
/// name keeps its start and ends with a hash of the whole, so names stay distinct.
pub fn sanitize_slot(name: &str) -> String {
    let clean: String = name
        .chars()
        .map(|c| match c.to_ascii_lowercase() {
            c @ ('a'..='z' | '0'..='9' | '_') => c,
            _ => '_',
        })
        .collect();
    if clean.len() <= MAX_SLOT {
        return clean;
    }
    // FNV-1a: stable across releases.
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{}_{:016x}", &clean[..MAX_SLOT - 17], hash)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use sluice_source_sdk::config::{parse, schema_for};
    use sluice_testkit::schema::assert_schema_judges;

    #[test]
    fn the_schema_takes_the_examples_and_refuses_an_unknown_key() {
        let schema = schema_for::<PostgresCdcConfig>();
        assert_eq!(schema["properties"]["truncate"]["enum"], json!(["error"]));
        assert_eq!(schema["properties"]["retained_warning"]["default"], "1GiB");
        assert_schema_judges(
            &schema,
            &[
                json!({"url": "postgres://u@h/db", "publication": "p"}),
                json!({"url": "postgres://u@h/db", "tables": ["public.orders", "items"],
                       "slot": "s", "chunk_rows": 500, "truncate": "error",
                       "heartbeat": "30s", "retained_warning": "512MiB"}),
            ],
            &[
                json!({"url": "postgres://u@h/db", "publication": "p", "slots": "s"}),
                json!({"url": "postgres://u@h/db", "tables": []}),
                json!({"publication": "p"}),
            ],
        );
    }

    fn parsed(value: serde_json::Value) -> Result<PostgresCdcConfig, InvalidConfig> {
        let config: PostgresCdcConfig = parse(value)?;
        config.check()?;
        Ok(config)
    }

    #[test]
    fn slot_names_derive_from_materialization_and_source() {
        let config = parsed(json!({"url": "postgres://u@h/db", "publication": "p"})).unwrap();
        assert_eq!(
            config.slot_name("Views-DB", "orders.cdc"),
            "sluice_views_db_orders_cdc"
        );
        let long = config.slot_name(&"m".repeat(80), "s");
        assert_eq!(long.len(), MAX_SLOT);
        assert_ne!(long, config.slot_name(&"m".repeat(81), "s"));
        assert_eq!(sanitize_slot(&long), long);
        let target = config.target().unwrap();
        assert_eq!(
            (target.host.as_str(), target.port, target.database.as_str()),
            ("h", 5432, "db")
        );
    }

    #[test]
    fn tls_options_leave_the_url_tokio_postgres_reads() {
        let url =
            "postgres://u@h:6543/db?sslmode=verify-full&sslrootcert=/ca.pem&application_name=x";
        let config = parsed(json!({"url": url, "publication": "p"})).unwrap();
        let target = config.target().unwrap();
        assert_eq!(
            target.ssl.describe(),
            "sslmode=verify-full sslrootcert=/ca.pem"
        );
        assert_eq!(target.url, "postgres://u@h:6543/db?application_name=x");
        let plain = parsed(json!({"url": "postgres://u@h/db", "publication": "p"})).unwrap();
        assert_eq!(plain.target().unwrap().ssl.describe(), "sslmode=prefer");
    }

    #[test]
    fn heartbeat_is_off_and_the_retained_warning_at_1gib_by_default() {
        let config = parsed(json!({"url": "postgres://u@h/db", "publication": "p"})).unwrap();
        assert_eq!((config.heartbeat, config.retained_warning), (None, 1 << 30));
        let config = parsed(json!({"url": "postgres://u@h/db", "publication": "p",
            "heartbeat": "30s", "retained_warning": "256MiB"}))
        .unwrap();
        assert_eq!(
            (config.heartbeat, config.retained_warning),
            (Some(Duration::from_secs(30)), 256 << 20)
        );
    }

    #[test]
    fn errors_name_their_place() {
        for (config, place, needle) in [
            (json!({"url": "postgres://h/db"}), "", "name a publication"),
            (
                json!({"url": "nope://", "publication": "p"}),
                "url",
                "not a PostgreSQL URL",
            ),
            (
                json!({"url": "postgres://h/db?sslmode=verify-full", "publication": "p"}),
                "url",
                "sslmode=verify-full: needs sslrootcert=",
            ),
            (
                json!({"url": "postgres://h/db?sslmode=verify-ca&sslrootcert=system",
                       "publication": "p"}),
                "url",
                "sslrootcert=system needs sslmode=verify-full",
            ),
            (
                json!({"url": "postgres://h/db", "tables": ["a.b.c"]}),
                "tables[0]",
                "not a table name",
            ),
            (
                json!({"url": "postgres://h/db", "tables": []}),
                "tables",
                "empty",
            ),
            (
                json!({"url": "postgres://h/db", "publication": "p", "slot": "Bad-Slot"}),
                "slot",
                "\"bad_slot\"",
            ),
            (
                json!({"url": "postgres://h/db", "publication": "p", "truncate": "delete_all"}),
                "truncate",
                "not supported",
            ),
            (
                json!({"url": "postgres://h/db", "publication": "p", "truncat": "error"}),
                "truncat",
                "unknown field",
            ),
            (
                json!({"url": "postgres://h/db", "publication": "p", "heartbeat": "10ms"}),
                "heartbeat",
                "below 1s",
            ),
            (
                json!({"url": "postgres://h/db", "publication": "p", "heartbeat": "often"}),
                "heartbeat",
                "invalid duration",
            ),
            (
                json!({"url": "postgres://h/db", "publication": "p", "retained_warning": "1 TB"}),
                "retained_warning",
                "invalid size",
            ),
        ] {
            let error = parsed(config.clone()).unwrap_err();
            assert_eq!(error.place, place, "{config}: {error}");
            assert!(error.message.contains(needle), "{config}: {error}");
        }
    }
}
