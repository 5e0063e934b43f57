//! What the user writes: the endpoint (catalog, warehouse, namespace, file size, commit
//! cadence) and each binding's resource (its table), with their JSON schemas.
//!
//! Parsing is strict: unknown properties are errors, and every error names the field
//! that is wrong.

use crate::catalog::CatalogLocation;
use crate::storage::Warehouse;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::Value;
use sluice_config::schema_for;
use sluice_object_store::{S3Settings, S3Url};
use sluice_sink_sdk::SinkError;
use std::path::PathBuf;
use std::time::Duration;

/// 128 MiB: Iceberg's own default target data file size (`write.target-file-size-bytes`
/// is 512 MiB in Java; 128 MiB keeps an epoch's staging bounded on small machines while
/// still far above the row-group size, so scans stay efficient).
pub const DEFAULT_TARGET_FILE_SIZE: u64 = 128 * 1024 * 1024;
/// The smallest file size accepted: below a Parquet row group's footprint, rolling over
/// would make a file per batch.
pub const MIN_TARGET_FILE_SIZE: u64 = 64 * 1024;

/// JSON schema of [`EndpointConfig`] (what Spec returns and `sluice schema` prints).
pub fn endpoint_schema() -> String {
    schema_for::<EndpointConfig>().to_string()
}

/// JSON schema of [`ResourceConfig`].
pub fn resource_schema() -> String {
    schema_for::<ResourceConfig>().to_string()
}

/// Iceberg tables in a SQL catalog, over a warehouse on the local filesystem or on S3.
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Iceberg endpoint")]
pub struct EndpointConfig {
    /// The SQL catalog, in pyiceberg's SqlCatalog layout (catalog name "sluice"): a
    /// SQLite file (created if missing) or a postgres:// URL.
    // `sqlite:` and `sqlite:///` prefixes are allowed before a file.
    #[schemars(length(min = 1))]
    pub catalog: String,
    /// Where tables live: a directory on the local filesystem (created if missing), or
    /// s3://bucket/prefix on an S3 or S3-compatible store (see s3).
    #[schemars(length(min = 1))]
    pub warehouse: String,
    /// How to reach the store of an s3:// warehouse: endpoint, region, credentials,
    /// path-style access; what is left out comes from the environment (AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT_URL).
    #[serde(default)]
    pub s3: Option<S3Settings>,
    /// Namespace of the tables (created if missing); dots separate levels.
    #[serde(default = "default_namespace")]
    #[schemars(regex(pattern = r"^[A-Za-z0-9_]+(\.[A-Za-z0-9_]+)*$"))]
    pub namespace: String,
    /// Bytes after which a Parquet data file is closed and the next begun.
    #[serde(default = "default_target_file_size")]
    #[schemars(range(min = MIN_TARGET_FILE_SIZE))]
    pub target_file_size: u64,
    /// Commit a snapshot every this many transactions (and at close); the ones between
    /// are decided but not yet visible.
    // Epochs divisible by it commit; the ones between are staged and decided, then
    // committed together.
    #[serde(default = "default_commit_every")]
    #[schemars(range(min = 1))]
    pub commit_every: u64,
    /// Automatic table maintenance (compaction, snapshot expiry, orphan removal) after
    /// every `every` table commits, outside the commit; off when left out. `sluice
    /// maintain` runs the same steps on demand.
    #[serde(default)]
    #[schemars(with = "MaintenanceConfig")]
    pub maintenance: Option<MaintenanceConfig>,
}

/// 10 snapshots: enough history for a reader pinned to a recent snapshot, and for an
/// upsert epoch racing a compaction to find the rows it rewrote (`rebase.rs`).
pub const DEFAULT_KEEP_SNAPSHOTS: u32 = 10;
/// One hour, Iceberg's own orphan removal's order of magnitude (Java defaults to 3 days):
/// far above the longest commit, whose files exist unreferenced until its swap.
pub const DEFAULT_ORPHAN_AGE: Duration = Duration::from_secs(3600);
/// One hour: a snapshot younger than this is kept however many are newer.
pub const DEFAULT_SNAPSHOT_AGE: Duration = Duration::from_secs(3600);

/// Table maintenance: what each step keeps (see docs/connectors/iceberg.md#maintenance).
#[derive(Debug, Clone, PartialEq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Iceberg maintenance")]
pub struct MaintenanceConfig {
    /// Run maintenance after every this many table commits of the sink (automatic
    /// maintenance only).
    #[serde(default = "default_every")]
    #[schemars(range(min = 1))]
    pub every: u64,
    /// Data files below this size are compacted (with the position deletes that apply
    /// to them) into files of about this size.
    #[serde(
        default = "default_target_file_size",
        deserialize_with = "sluice_config::de_bytes",
        serialize_with = "sluice_config::ser_bytes"
    )]
    #[schemars(schema_with = "sluice_config::bytes_schema")]
    pub target_file_size: u64,
    /// Snapshots kept however old: the newest this many (at least 2, so the snapshot
    /// before a compaction stays, and an upsert transaction in flight finds the rows it
    /// rewrote).
    #[serde(default = "default_keep_snapshots")]
    #[schemars(range(min = 2))]
    pub keep_snapshots: u32,
    /// Snapshots younger than this are kept too.
    #[serde(
        default = "default_snapshot_age",
        deserialize_with = "sluice_config::de_duration",
        serialize_with = "sluice_config::ser_duration"
    )]
    #[schemars(schema_with = "sluice_config::duration_schema")]
    pub snapshot_age: Duration,
    /// Files under a table's location that no snapshot references are removed once
    /// older than this: it must exceed the longest commit (whose files exist before its
    /// catalog swap references them).
    #[serde(
        default = "default_orphan_age",
        deserialize_with = "sluice_config::de_duration",
        serialize_with = "sluice_config::ser_duration"
    )]
    #[schemars(schema_with = "sluice_config::duration_schema")]
    pub orphan_age: Duration,
}

impl Default for MaintenanceConfig {
    fn default() -> MaintenanceConfig {
        MaintenanceConfig {
            every: default_every(),
            target_file_size: DEFAULT_TARGET_FILE_SIZE,
            keep_snapshots: DEFAULT_KEEP_SNAPSHOTS,
            snapshot_age: DEFAULT_SNAPSHOT_AGE,
            orphan_age: DEFAULT_ORPHAN_AGE,
        }
    }
}

fn default_every() -> u64 {
    100
}

fn default_keep_snapshots() -> u32 {
    DEFAULT_KEEP_SNAPSHOTS
}

fn default_snapshot_age() -> Duration {
    DEFAULT_SNAPSHOT_AGE
}

fn default_orphan_age() -> Duration {
    DEFAULT_ORPHAN_AGE
}

/// A binding's table.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(title = "Iceberg table")]
pub struct ResourceConfig {
    /// Name of the table in the namespace: the binding's columns, then _txn and _op.
    #[schemars(regex(pattern = r"^[A-Za-z0-9_]+$"))]
    pub table: String,
    /// `changelog` (the default): each transaction appends its changes per key, a delta
    /// binding. `upsert`: one row per key, the reduced view, updated and deleted in place
    /// (position deletes), a standard binding.
    #[serde(default)]
    pub mode: Mode,
}

/// How a binding's table holds the collection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// A change log: every transaction's rows appended, `_op` U or D.
    #[default]
    Changelog,
    /// The view: one live row per key, replaced or deleted in place.
    Upsert,
}

fn default_namespace() -> String {
    "sluice".into()
}

fn default_target_file_size() -> u64 {
    DEFAULT_TARGET_FILE_SIZE
}

fn default_commit_every() -> u64 {
    1
}

impl EndpointConfig {
    /// Parses and checks the endpoint configuration.
    pub fn parse(value: &Value) -> Result<EndpointConfig, SinkError> {
        let config: EndpointConfig =
            serde_path_to_error::deserialize(value.clone()).map_err(|e| {
                SinkError::Config(format!("iceberg endpoint: {} ({})", e.inner(), e.path()))
            })?;
        if config.catalog.is_empty() {
            return Err(SinkError::Config(
                "iceberg endpoint: `catalog` is empty".into(),
            ));
        }
        if config.warehouse.is_empty() {
            return Err(SinkError::Config(
                "iceberg endpoint: `warehouse` is empty".into(),
            ));
        }
        // Checked here, so a wrong warehouse fails at `sluice check`, naming the option.
        config.warehouse()?;
        if !valid_name(&config.namespace) {
            return Err(SinkError::Config(format!(
                "iceberg endpoint: namespace {:?} must be letters, digits and `_` (dots separate levels)",
                config.namespace
            )));
        }
        if config.target_file_size < MIN_TARGET_FILE_SIZE {
            return Err(SinkError::Config(format!(
                "iceberg endpoint: target_file_size {} is below the minimum {MIN_TARGET_FILE_SIZE}",
                config.target_file_size
            )));
        }
        if config.commit_every == 0 {
            return Err(SinkError::Config(
                "iceberg endpoint: commit_every must be at least 1".into(),
            ));
        }
        if let Some(m) = &config.maintenance {
            m.check("iceberg endpoint: maintenance")?;
        }
        Ok(config)
    }

    /// Where tables live: `s3://…` with its `s3` settings (the environment's when there
    /// are none), else a local directory. The error names the option that is wrong.
    pub fn warehouse(&self) -> Result<Warehouse, SinkError> {
        let place = "iceberg endpoint";
        if !S3Url::is_s3(&self.warehouse) {
            if self.s3.is_some() {
                return Err(SinkError::Config(format!(
                    "{place}: `s3` is set, but `warehouse` {:?} is not an s3://bucket/prefix location",
                    self.warehouse
                )));
            }
            return Ok(Warehouse::Local(PathBuf::from(&self.warehouse)));
        }
        let url = S3Url::parse(&self.warehouse)
            .map_err(|e| SinkError::Config(format!("{place}: `warehouse`: {e}")))?;
        let settings = self.s3.clone().unwrap_or_default();
        settings
            .check(place)
            .map_err(|e| SinkError::Config(e.to_string()))?;
        Ok(Warehouse::S3 { url, settings })
    }

    /// Where the catalog is.
    pub fn catalog_location(&self) -> CatalogLocation {
        if self.catalog.starts_with("postgres://") || self.catalog.starts_with("postgresql://") {
            CatalogLocation::Postgres(self.catalog.clone())
        } else {
            CatalogLocation::Sqlite(self.catalog_path())
        }
    }

    /// The catalog file's path (a `sqlite:` or `sqlite:///` prefix is allowed).
    pub fn catalog_path(&self) -> PathBuf {
        let c = self.catalog.as_str();
        let c = c
            .strip_prefix("sqlite:///")
            .map(|rest| format!("/{rest}"))
            .or_else(|| c.strip_prefix("sqlite:").map(str::to_string))
            .unwrap_or_else(|| c.to_string());
        PathBuf::from(c)
    }
}

impl MaintenanceConfig {
    /// Checks the values serde cannot; errors start with `place`.
    pub fn check(&self, place: &str) -> Result<(), SinkError> {
        let bad = |m: String| Err(SinkError::Config(format!("{place}: {m}")));
        if self.every == 0 {
            return bad("`every` must be at least 1".into());
        }
        if self.keep_snapshots < 2 {
            return bad(format!(
                "`keep_snapshots` {} is below 2: the snapshot before a compaction must stay \
                 for an upsert transaction in flight to find the rows it rewrote",
                self.keep_snapshots
            ));
        }
        if self.target_file_size < MIN_TARGET_FILE_SIZE {
            return bad(format!(
                "`target_file_size` {} is below the minimum {MIN_TARGET_FILE_SIZE}",
                self.target_file_size
            ));
        }
        Ok(())
    }
}

impl ResourceConfig {
    pub fn parse(value: &Value) -> Result<ResourceConfig, SinkError> {
        let config: ResourceConfig =
            serde_path_to_error::deserialize(value.clone()).map_err(|e| {
                SinkError::Config(format!("iceberg binding: {} ({})", e.inner(), e.path()))
            })?;
        if !valid_name(&config.table) || config.table.contains('.') {
            return Err(SinkError::Config(format!(
                "iceberg binding: table {:?} must be letters, digits and `_`",
                config.table
            )));
        }
        Ok(config)
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.split('.').all(|part| {
            !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use sluice_testkit::schema::assert_schema_judges;

    #[test]
    fn defaults_fill_what_is_left_out() {
        let c = EndpointConfig::parse(&json!({"catalog": "/c.db", "warehouse": "/wh"})).unwrap();
        assert_eq!(c.namespace, "sluice");
        assert_eq!(c.target_file_size, DEFAULT_TARGET_FILE_SIZE);
        assert_eq!(c.commit_every, 1);
    }

    #[test]
    fn unknown_fields_and_bad_values_are_config_errors() {
        for bad in [
            json!({"catalog": "/c.db", "warehouse": "/wh", "extra": 1}),
            json!({"catalog": "/c.db", "warehouse": "/wh", "commit_every": 0}),
            json!({"catalog": "/c.db", "warehouse": "/wh", "target_file_size": 10}),
            json!({"catalog": "/c.db", "warehouse": "/wh", "namespace": "a-b"}),
            json!({"warehouse": "/wh"}),
        ] {
            assert!(
                matches!(EndpointConfig::parse(&bad), Err(SinkError::Config(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            ResourceConfig::parse(&json!({"table": "t", "x": 1})),
            Err(SinkError::Config(_))
        ));
        assert!(matches!(
            ResourceConfig::parse(&json!({"table": "a.b"})),
            Err(SinkError::Config(_))
        ));
    }

    #[test]
    fn the_schemas_take_the_examples_and_refuse_an_unknown_key() {
        let e: Value = serde_json::from_str(&endpoint_schema()).unwrap();
        assert_eq!(
            e["properties"]["target_file_size"]["default"],
            DEFAULT_TARGET_FILE_SIZE
        );
        assert_eq!(
            e["properties"]["target_file_size"]["minimum"],
            MIN_TARGET_FILE_SIZE
        );
        assert_schema_judges(
            &e,
            &[
                json!({"catalog": "/c.db", "warehouse": "/wh"}),
                json!({"catalog": "postgres://u@h/db", "warehouse": "wh", "namespace": "a.b_c",
                       "target_file_size": 1048576, "commit_every": 10}),
                json!({"catalog": "/c.db", "warehouse": "s3://bkt/x",
                       "s3": {"endpoint": "http://127.0.0.1:9000", "path_style": true}}),
            ],
            &[
                json!({"catalog": "/c.db", "warehouse": "/wh", "extra": 1}),
                json!({"catalog": "/c.db", "warehouse": "/wh", "commit_every": 0}),
                json!({"catalog": "/c.db", "warehouse": "/wh", "target_file_size": 10}),
                json!({"catalog": "/c.db", "warehouse": "/wh", "namespace": "a-b"}),
                json!({"warehouse": "/wh"}),
                json!({"catalog": "/c.db", "warehouse": "s3://bkt", "s3": {"bucket": "x"}}),
            ],
        );
        let r: Value = serde_json::from_str(&resource_schema()).unwrap();
        assert_schema_judges(
            &r,
            &[json!({"table": "views"})],
            &[json!({"table": "t", "x": 1}), json!({"table": "a.b"})],
        );
    }

    #[test]
    fn an_s3_warehouse_takes_its_settings_and_errors_name_the_option() {
        let c = EndpointConfig::parse(&json!({
            "catalog": "/c.db", "warehouse": "s3://bkt/tables",
            "s3": {"endpoint": "http://127.0.0.1:9000", "region": "eu-west-1", "path_style": true,
                   "access_key_id": "id", "secret_access_key": "secret"}
        }))
        .unwrap();
        let Warehouse::S3 { url, settings } = c.warehouse().unwrap() else {
            panic!("not S3")
        };
        assert_eq!(
            (url.bucket.as_str(), url.prefix.as_str()),
            ("bkt", "tables")
        );
        assert!(settings.path_style);
        assert_eq!(settings.region.as_deref(), Some("eu-west-1"));
        // The environment's credentials when the block is left out.
        let bare =
            EndpointConfig::parse(&json!({"catalog": "/c.db", "warehouse": "s3://bkt"})).unwrap();
        assert!(matches!(bare.warehouse(), Ok(Warehouse::S3 { .. })));
        for (bad, names) in [
            (
                json!({"catalog": "/c.db", "warehouse": "s3://B"}),
                "`warehouse`",
            ),
            (
                json!({"catalog": "/c.db", "warehouse": "/wh", "s3": {}}),
                "`s3`",
            ),
            (
                json!({"catalog": "/c.db", "warehouse": "s3://bkt", "s3": {"access_key_id": "a"}}),
                "s3.secret_access_key",
            ),
            (
                json!({"catalog": "/c.db", "warehouse": "s3://bkt", "s3": {"endpoint": "h:9000"}}),
                "s3.endpoint",
            ),
            (
                json!({"catalog": "/c.db", "warehouse": "s3://bkt", "s3": {"bucket": "x"}}),
                "s3.bucket",
            ),
        ] {
            match EndpointConfig::parse(&bad) {
                Err(SinkError::Config(e)) => assert!(e.contains(names), "{bad}: {e}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }

    #[test]
    fn sqlite_url_prefixes_become_paths() {
        let mut c =
            EndpointConfig::parse(&json!({"catalog": "sqlite:///tmp/c.db", "warehouse": "/wh"}))
                .unwrap();
        assert_eq!(c.catalog_path(), PathBuf::from("/tmp/c.db"));
        c.catalog = "rel/c.db".into();
        assert_eq!(c.catalog_path(), PathBuf::from("rel/c.db"));
        c.catalog = "postgres://u@h/db".into();
        assert_eq!(
            c.catalog_location(),
            CatalogLocation::Postgres("postgres://u@h/db".into())
        );
    }
}
