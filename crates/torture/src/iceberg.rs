//! The Iceberg store: the sink's table `sluice.torture_events` in a SQLite catalog of the
//! torture's folder, over a warehouse in that folder or on S3, read back independently
//! by pyiceberg (position deletes applied).
//!
//! ```text
//!  --mode delta     mode: changelog   one row per transaction and key (a delta binding)
//!  --mode standard  mode: upsert      one live row per key, the model with deletions:
//!                                     deleted keys absent, the others equal to the model
//! ```
//!
//! Each row's `flow_document` is what the model compares, as for the SQL stores. An
//! upsert table is also read as a user reads it, by its columns: a live row whose
//! columns differ from its document (a stale row a position delete missed would show
//! here as well as in the counts) or whose `_op` is not `U` is a violation, as is a data
//! file no snapshot references.
//!
//! On S3 (`--s3 s3://bucket/prefix [--s3-endpoint URL]`) each torture writes under
//! `<prefix>/<its folder's name>`, so runs never share a table's files, and removes it at
//! the end unless the folder is kept. The bucket is created when missing, by a plain
//! `PUT /bucket` that S3-compatible test servers (moto) accept; on AWS itself it must
//! exist.
//!
//! `--maintain-every K` ([`maintain`]) runs `sluice maintain` between runs: it rewrites
//! files and expires snapshots, and must change no row.

use super::model;
use super::model::Read;
use super::{Harness, RUN_TIMEOUT, TABLE, block_on};
use anyhow::{Context, bail};
use serde_json::{Value, json};
use sluice_iceberg::{EndpointConfig, Warehouse};
use std::net::ToSocketAddrs;
use std::path::{Path, PathBuf};

/// The key pair written into the pipeline for an S3-compatible test server when the
/// environment has none (moto checks no signature).
const TEST_KEY_PAIR: (&str, &str) = ("sluice-torture", "sluice-torture-secret");
/// The columns of an upsert row that must equal its document's.
const SCALAR_COLUMNS: &[&str] = &["key", "views", "bytes", "last_seen"];

/// Where an S3 warehouse is (`--s3`, `--s3-endpoint`).
pub struct S3Target {
    /// `s3://bucket/prefix`.
    pub url: String,
    /// An S3-compatible server's address (`http://127.0.0.1:9000`); AWS when left out.
    pub endpoint: Option<String>,
}

pub struct IcebergStore {
    catalog: PathBuf,
    /// The sink's endpoint configuration (catalog, warehouse, s3 settings).
    endpoint: Value,
    warehouse: Warehouse,
    upsert: bool,
}

impl IcebergStore {
    /// The store of the torture in `dir`: its warehouse in `dir`, or under a prefix of
    /// `dir`'s name in `s3` (the bucket created when missing); an upsert table, or a
    /// change log.
    pub fn create(dir: &Path, s3: Option<&S3Target>, upsert: bool) -> anyhow::Result<Self> {
        let catalog = dir.join("catalog.db");
        let mut endpoint = json!({ "catalog": catalog, "warehouse": dir.join("warehouse") });
        if let Some(s3) = s3 {
            let run = dir.file_name().expect("a folder name").to_string_lossy();
            endpoint["warehouse"] = json!(format!("{}/{run}", s3.url.trim_end_matches('/')));
            endpoint["s3"] = s3_settings(s3.endpoint.as_deref());
        }
        let warehouse = EndpointConfig::parse(&endpoint)
            .and_then(|config| config.warehouse())
            .context("the Iceberg store's warehouse (--s3, --s3-endpoint)")?;
        if let (Warehouse::S3 { url, .. }, Some(s3)) = (&warehouse, s3) {
            ensure_bucket(&warehouse, &url.bucket, s3.endpoint.as_deref())?;
        }
        Ok(IcebergStore {
            catalog,
            endpoint,
            warehouse,
            upsert,
        })
    }

    pub fn endpoint(&self) -> Value {
        self.endpoint.clone()
    }

    pub fn resource(&self) -> Value {
        match self.upsert {
            true => json!({ "table": TABLE, "mode": "upsert" }),
            false => json!({ "table": TABLE }),
        }
    }

    /// The table as pyiceberg reads it: every live row's document; the rows whose
    /// columns disagree with their document, and orphaned data files, as violations.
    pub fn read(&self) -> anyhow::Result<Read> {
        let rows = sluice_iceberg::pyiceberg_read(
            &self.catalog,
            &self.warehouse,
            &format!("sluice.{TABLE}"),
            false,
        )
        .map_err(anyhow::Error::msg)?;
        let mut docs = Vec::with_capacity(rows.len());
        let mut disagreeing = Vec::new();
        for row in &rows {
            let Some(Value::String(text)) = row.get("flow_document") else {
                bail!("a row without its document: {row}");
            };
            let doc: Value = serde_json::from_str(text).context("a stored document is not JSON")?;
            if self.upsert && !columns_agree(row, &doc) {
                disagreeing.push(row);
            }
            docs.push(doc);
        }
        let mut violations = Vec::new();
        if let Some(first) = disagreeing.first() {
            violations.push(format!(
                "{} live rows whose columns are not their document's or whose _op is not U, \
                 e.g. {first}",
                disagreeing.len()
            ));
        }
        let orphans = block_on(async {
            let catalog = sluice_iceberg::open_catalog(&self.catalog, &self.warehouse).await?;
            Ok(sluice_iceberg::orphan_data_files(&catalog).await?)
        })?;
        if !orphans.is_empty() {
            violations.push(format!(
                "files no snapshot references were left: {orphans:?}"
            ));
        }
        Ok(Read {
            rows: docs,
            violations,
        })
    }

    /// Removes an S3 warehouse's files (a local one goes with the folder).
    pub fn remove_warehouse(&self) -> anyhow::Result<()> {
        if let Warehouse::S3 { url, .. } = &self.warehouse {
            block_on(async {
                let io = self.warehouse.open()?;
                io.delete_prefix(io.root()).await?;
                Ok(())
            })
            .with_context(|| format!("removing the torture's warehouse {url}"))?;
        }
        Ok(())
    }
}

/// The sink's `s3` settings for `endpoint`: for an S3-compatible server, path-style
/// access, `AWS_REGION` (else us-east-1) and, unless the environment has a key pair,
/// [`TEST_KEY_PAIR`]; for AWS (no endpoint), nothing: the environment says it all.
fn s3_settings(endpoint: Option<&str>) -> Value {
    let Some(endpoint) = endpoint else {
        return json!({});
    };
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let region = env("AWS_REGION").unwrap_or_else(|| "us-east-1".into());
    let mut settings = json!({ "endpoint": endpoint, "region": region, "path_style": true });
    if env("AWS_ACCESS_KEY_ID").is_none() {
        settings["access_key_id"] = json!(TEST_KEY_PAIR.0);
        settings["secret_access_key"] = json!(TEST_KEY_PAIR.1);
    }
    settings
}

/// Lists the warehouse's prefix; if the store answers with an error, creates `bucket`
/// with a plain `PUT /bucket` to an http:// `endpoint`, and lists again.
fn ensure_bucket(
    warehouse: &Warehouse,
    bucket: &str,
    endpoint: Option<&str>,
) -> anyhow::Result<()> {
    let list = || {
        block_on(async {
            let io = warehouse.open()?;
            io.list(io.root()).await?;
            Ok(())
        })
    };
    let Err(missing) = list() else {
        return Ok(());
    };
    let Some(address) = endpoint.and_then(|e| e.strip_prefix("http://")) else {
        bail!("cannot list bucket {bucket} ({missing:#}); create it first");
    };
    let address = address.trim_end_matches('/');
    let socket = (address.to_socket_addrs().ok().and_then(|mut a| a.next()))
        .with_context(|| format!("--s3-endpoint: cannot resolve {address}"))?;
    let created = sluice_http::client::Client::new(socket, "")
        .request("PUT", &format!("/{bucket}"), &[], b"")
        .with_context(|| format!("creating bucket {bucket} at {address}"))?;
    if !(200..300).contains(&created.status) {
        bail!(
            "cannot list bucket {bucket} ({missing:#}), nor create it at {address}: HTTP {} {}",
            created.status,
            String::from_utf8_lossy(&created.body)
        );
    }
    list().with_context(|| format!("bucket {bucket}, created at {address}"))
}

/// Whether an upsert row's columns are its document's, and its `_op` is `U`.
fn columns_agree(row: &Value, doc: &Value) -> bool {
    row.get("_op").and_then(Value::as_str) == Some("U")
        && SCALAR_COLUMNS.iter().all(|c| row.get(*c) == doc.get(*c))
}

/// Fails unless `exe` has the `maintain` command (`--maintain-every` needs it).
pub fn check_maintain(exe: &Path) -> anyhow::Result<()> {
    let out = std::process::Command::new(exe)
        .args(["maintain", "--help"])
        .output()
        .with_context(|| format!("running {} maintain --help", exe.display()))?;
    if !out.status.success() {
        bail!(
            "--maintain-every runs `sluice maintain <pipeline> --json` between runs, and {} \
             has no maintain command: {}",
            exe.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// Runs `sluice maintain <pipeline> --json` between two runs: it must succeed, and the
/// rows read before and after it must be equal (maintenance rewrites files and expires
/// snapshots, never a row). Anything else is an anomaly.
pub fn maintain(h: &mut Harness, pipeline: &Path) -> anyhow::Result<()> {
    let before = h.found()?;
    let pipeline = pipeline.to_string_lossy().into_owned();
    let out = h
        .spawn(&["maintain", &pipeline, "--json"], None)?
        .wait(RUN_TIMEOUT)?;
    if !out.success() {
        h.report.anomaly_of(
            "maintenance failed",
            format!("{} ({}):\n    {}", out.name, out.status, out.tail()),
        );
        return Ok(());
    }
    h.report.maintained += 1;
    let summary =
        std::fs::read_to_string(h.dir.join(format!("{}.out", out.name))).unwrap_or_default();
    println!("{}: sluice maintain: {}", out.name, summary.trim());
    let changed = model::compare(&before, &h.found()?);
    if !changed.exact() {
        h.report.anomaly_of(
            "maintenance changed rows",
            format!(
                "{}: keys before → after: {} lost, {} duplicated, {} mismatched",
                out.name, changed.lost, changed.duplicated, changed.mismatched
            ),
        );
    }
    Ok(())
}
