//! `sluice maintain`: Iceberg table maintenance on demand (compaction, snapshot expiry,
//! orphan removal; `sluice_iceberg::maintain`) for every table a pipeline's Iceberg
//! endpoints write, each step one commit. Safe while `sluice run` runs the same
//! pipeline: the catalog's compare-and-swap arbitrates, and a step that loses it
//! plans again.
//!
//! What each step keeps comes from the endpoint's `maintenance:` block when it has one,
//! else the defaults; the flags override both.

use crate::pipeline_cmd::load;
use anyhow::Context;
use clap::Args;
use sluice_app::registry;
use sluice_iceberg::maintain::{self, Options, Step, TableReport};
use sluice_iceberg::{EndpointConfig, ResourceConfig, SqlCatalog};
use sluice_source_sdk::config::{parse_bytes, parse_duration};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Args)]
pub struct MaintainArgs {
    /// The pipeline file (YAML).
    pub pipeline: PathBuf,
    /// Print one JSON object: each table's files and snapshots before and after.
    #[arg(long)]
    pub json: bool,
    /// Maintain only this table (`namespace.table`).
    #[arg(long, value_name = "NS.T")]
    pub table: Option<String>,
    /// Say what each step would do; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Compact data files below this size into files of about this size (`128MiB`).
    #[arg(long, value_name = "SIZE", value_parser = parse_bytes)]
    pub target_file_size: Option<u64>,
    /// Keep at least the newest this many snapshots (2 at least: the one before a
    /// compaction stays for an upsert transaction in flight).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(2..))]
    pub keep_snapshots: Option<u32>,
    /// Keep snapshots younger than this too (`1h`, `0s`).
    #[arg(long, value_name = "AGE", value_parser = parse_duration)]
    pub snapshot_age: Option<Duration>,
    /// Remove unreferenced files only once older than this (`1h`; `0s` only when no
    /// commit is in flight).
    #[arg(long, value_name = "AGE", value_parser = parse_duration)]
    pub orphan_age: Option<Duration>,
}

impl MaintainArgs {
    /// The endpoint's `maintenance:` (or the defaults), with the flags over it.
    fn options(&self, endpoint: &EndpointConfig) -> Options {
        let base = endpoint
            .maintenance
            .as_ref()
            .map(Options::from)
            .unwrap_or_default();
        Options {
            target_file_size: self.target_file_size.unwrap_or(base.target_file_size),
            keep_snapshots: self.keep_snapshots.unwrap_or(base.keep_snapshots),
            snapshot_age: self.snapshot_age.unwrap_or(base.snapshot_age),
            orphan_age: self.orphan_age.unwrap_or(base.orphan_age),
            dry_run: self.dry_run,
        }
    }
}

pub fn main(args: MaintainArgs) -> anyhow::Result<()> {
    let pipeline = load(&args.pipeline, &registry())?;
    let iceberg: Vec<_> = (pipeline.materializations.iter())
        .filter(|(_, m)| m.endpoint.kind == "iceberg")
        .collect();
    if iceberg.is_empty() {
        let kinds: Vec<String> = (pipeline.materializations.iter())
            .map(|(name, m)| format!("{name} ({})", m.endpoint.kind))
            .collect();
        anyhow::bail!(
            "pipeline {} has no Iceberg endpoint to maintain (its materializations: {}); \
             `sluice maintain` maintains the tables of `iceberg:` endpoints",
            args.pipeline.display(),
            if kinds.is_empty() {
                "none".into()
            } else {
                kinds.join(", ")
            }
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let mut reports: Vec<TableReport> = Vec::new();
    let mut matched = Vec::new();
    for (name, m) in iceberg {
        let endpoint = EndpointConfig::parse(&m.endpoint.config)
            .with_context(|| format!("materializations.{name}.endpoint"))?;
        let options = args.options(&endpoint);
        let mut tables = Vec::new();
        for (i, b) in m.bindings.iter().enumerate() {
            let resource = ResourceConfig::parse(&b.resource)
                .with_context(|| format!("materializations.{name}.bindings[{i}].resource"))?;
            let ident = maintain::table_ident(&endpoint.namespace, &resource.table)?;
            matched.push(ident.to_string());
            if args.table.as_ref().is_none_or(|t| *t == ident.to_string()) {
                tables.push(ident);
            }
        }
        if tables.is_empty() {
            continue;
        }
        runtime.block_on(async {
            let catalog = SqlCatalog::connect(&endpoint.catalog_location(), endpoint.warehouse()?)
                .await
                .with_context(|| format!("cannot open the Iceberg catalog of {name}"))?;
            for ident in tables {
                let json = args.json;
                let mut progress = |step: &Step| {
                    let line = format!("{ident}: {step}");
                    // With --json, stdout is the report alone.
                    if json {
                        eprintln!("{line}")
                    } else {
                        println!("{line}")
                    }
                };
                let report = maintain::maintain_table(&catalog, &ident, &options, &mut progress)
                    .await
                    .with_context(|| format!("maintaining {ident} of {name}"))?;
                reports.push(report);
            }
            anyhow::Ok(())
        })?;
    }
    if let Some(t) = &args.table
        && reports.is_empty()
    {
        anyhow::bail!(
            "no Iceberg table {t} in pipeline {} (its tables: {})",
            args.pipeline.display(),
            matched.join(", ")
        );
    }
    if args.json {
        println!("{}", serde_json::json!({ "tables": reports }));
    } else {
        for r in &reports {
            println!(
                "{}{}: data files {} -> {}, delete files {} -> {}, {} snapshots expired, {} orphans removed",
                if args.dry_run { "(dry run) " } else { "" },
                r.table,
                r.data_files_before,
                r.data_files_after,
                r.delete_files_before,
                r.delete_files_after,
                r.snapshots_expired,
                r.orphans_removed
            );
        }
    }
    Ok(())
}
