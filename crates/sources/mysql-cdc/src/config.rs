//! What the user writes: `mysql_cdc: {url: mysql://…, tables: [shop.orders]}`, with
//! `server_id` and `chunk_rows` optional. Strict: unknown keys are errors.

use schemars::JsonSchema;
use serde::Deserialize;
use sluice_source_sdk::InvalidConfig;
use sluice_source_sdk::redact::redact;

/// A MariaDB (or MySQL) database's changes from its binary log, read as a replica,
/// after a consistent snapshot of the tables.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "MariaDB / MySQL change data capture")]
pub struct MysqlCdcConfig {
    /// mysql://user[:password]@host[:port][/database]; the user needs SELECT on the
    /// tables, REPLICATION SLAVE and REPLICATION CLIENT (MariaDB 10.5+: BINLOG
    /// MONITOR). The server needs log_bin on, binlog_format=ROW and
    /// binlog_row_image=FULL.
    #[schemars(length(min = 1))]
    pub url: String,
    /// The tables captured, each database.table; each needs a primary key.
    #[schemars(length(min = 1))]
    pub tables: Vec<String>,
    /// The server id this source registers as a replica with; unique among the
    /// server's replicas. Default: derived from the materialization and source names.
    #[serde(default)]
    #[schemars(with = "u32", range(min = 1))]
    pub server_id: Option<u32>,
    /// Rows read per snapshot query.
    #[serde(default = "default_chunk_rows")]
    #[schemars(range(min = 1))]
    pub chunk_rows: usize,
}

fn default_chunk_rows() -> usize {
    10_000
}

impl MysqlCdcConfig {
    /// What serde cannot check.
    pub fn check(&self) -> Result<(), InvalidConfig> {
        self.opts()?;
        if self.tables.is_empty() {
            return Err(InvalidConfig::new(
                "tables",
                "an empty list: name a table as database.table",
            ));
        }
        for (i, table) in self.tables.iter().enumerate() {
            if split_table(table).is_none() {
                return Err(InvalidConfig::new(
                    format!("tables[{i}]"),
                    format!("{table:?} is not a table name: write database.table"),
                ));
            }
        }
        if self.server_id == Some(0) {
            return Err(InvalidConfig::new(
                "server_id",
                "0 is no replica's id: write a number from 1 to 4294967295 that no other \
                 replica of the server uses, or leave it out",
            ));
        }
        if self.chunk_rows == 0 {
            return Err(InvalidConfig::new("chunk_rows", "must be at least 1"));
        }
        Ok(())
    }

    /// The client's options from the URL.
    pub fn opts(&self) -> Result<mysql_async::Opts, InvalidConfig> {
        mysql_async::Opts::from_url(&self.url).map_err(|e| {
            InvalidConfig::new(
                "url",
                format!(
                    "{:?} is not a MySQL URL ({e}); write e.g. mysql://user@127.0.0.1:3306",
                    redact(&self.url)
                ),
            )
        })
    }

    /// The replica id: as given, or a stable hash of the materialization and source
    /// names (never 0), so that two sources of one server do not share one.
    pub fn server_id(&self, materialization: &str, source: &str) -> u32 {
        self.server_id.unwrap_or_else(|| {
            // FNV-1a: stable across releases.
            let hash = format!("{materialization}/{source}")
                .bytes()
                .fold(0x811c_9dc5_u32, |h, b| {
                    (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
                });
            hash.max(1) | 0x4000_0000
        })
    }
}

/// `database.table`.
pub fn split_table(name: &str) -> Option<(String, String)> {
    let (schema, table) = name.split_once('.')?;
    (!schema.is_empty() && !table.is_empty() && !table.contains('.'))
        .then(|| (schema.to_string(), table.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use sluice_source_sdk::config::{parse, schema_for};

    fn parsed(value: serde_json::Value) -> Result<MysqlCdcConfig, InvalidConfig> {
        let config: MysqlCdcConfig = parse(value)?;
        config.check()?;
        Ok(config)
    }

    #[test]
    fn the_schema_names_every_key() {
        let schema = schema_for::<MysqlCdcConfig>();
        let keys: Vec<_> = schema["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect();
        assert_eq!(keys, ["chunk_rows", "server_id", "tables", "url"]);
    }

    #[test]
    fn server_ids_derive_from_the_names_and_are_never_zero() {
        let config = parsed(json!({"url": "mysql://u@h/db", "tables": ["db.t"]})).unwrap();
        let id = config.server_id("m", "s");
        assert_ne!(id, 0);
        assert_eq!(id, config.server_id("m", "s"));
        assert_ne!(id, config.server_id("m", "t"));
        let fixed =
            parsed(json!({"url": "mysql://u@h/db", "tables": ["db.t"], "server_id": 7})).unwrap();
        assert_eq!(fixed.server_id("m", "s"), 7);
    }

    #[test]
    fn errors_name_their_place() {
        for (config, place, needle) in [
            (
                json!({"url": "nope://", "tables": ["d.t"]}),
                "url",
                "not a MySQL URL",
            ),
            (json!({"url": "mysql://h", "tables": []}), "tables", "empty"),
            (
                json!({"url": "mysql://h", "tables": ["t"]}),
                "tables[0]",
                "database.table",
            ),
            (
                json!({"url": "mysql://h", "tables": ["d.t"], "server_id": 0}),
                "server_id",
                "no replica",
            ),
            (
                json!({"url": "mysql://h", "tables": ["d.t"], "chunk_rows": 0}),
                "chunk_rows",
                "at least 1",
            ),
            (
                json!({"url": "mysql://h", "tables": ["d.t"], "slot": "x"}),
                "slot",
                "unknown field",
            ),
        ] {
            let error = parsed(config.clone()).unwrap_err();
            assert_eq!(error.place, place, "{config}: {error}");
            assert!(error.message.contains(needle), "{config}: {error}");
        }
    }
}
