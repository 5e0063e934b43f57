//! `sluice shards list | split`: a cluster's shards, as its etcd holds them.

use crate::pipeline_cmd::load;
use anyhow::Context as _;
use clap::Subcommand;
use sluice_app::registry;
use sluice_cluster::{admin, load};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Subcommand)]
pub enum ShardsCommand {
    /// List the shards of a cluster's materializations (ranges, members, last
    /// transaction, rate in documents per second, lag), then its members (CPU use in
    /// cores, shards held, their documents per second).
    List {
        /// The pipeline file (YAML), with a `cluster:` section.
        pipeline: PathBuf,
        /// Print JSON: the shards, or with `--members` the members.
        #[arg(long)]
        json: bool,
        /// With `--json`: the members instead of the shards.
        #[arg(long)]
        members: bool,
    },
    /// Split a shard's key range at its midpoint while the cluster runs: its holder
    /// finishes its transaction and stops, and the two halves recover from its
    /// checkpoint. Waits until the halves exist.
    Split {
        /// The pipeline file (YAML), with a `cluster:` section.
        pipeline: PathBuf,
        materialization: String,
        /// The shard's id as `list` shows it (`00000000-ffffffff`).
        shard: String,
        /// How long to wait for a member to split it, in seconds.
        #[arg(long, default_value_t = 120)]
        wait: u64,
    },
}

pub fn main(cmd: ShardsCommand) -> anyhow::Result<()> {
    let pipeline_path = match &cmd {
        ShardsCommand::List { pipeline, .. } | ShardsCommand::Split { pipeline, .. } => pipeline,
    };
    let pipeline = load(pipeline_path, &registry())?;
    let cluster = pipeline.cluster.as_ref().with_context(|| {
        format!(
            "pipeline file {} has no `cluster:` section: its shards are not shared",
            pipeline_path.display()
        )
    })?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let (etcd, keys) = sluice_cluster::connect(cluster)?;
        match cmd {
            ShardsCommand::List { json, members, .. } => {
                let rows = admin::list(&etcd, &keys).await?;
                let member_rows = load::members(&etcd, &keys).await?;
                if json {
                    let text = match members {
                        true => serde_json::to_string_pretty(&member_rows)?,
                        false => serde_json::to_string_pretty(&rows)?,
                    };
                    println!("{text}");
                    return Ok(());
                }
                println!(
                    "{:<20} {:<18} {:<10} {:<12} {:>8} {:>9}  LAG",
                    "MATERIALIZATION", "SHARD", "STATUS", "MEMBER", "TXN", "DOCS/S"
                );
                for r in rows {
                    let lag: Vec<String> = r.lag.iter().map(|(s, l)| format!("{s}: {l}")).collect();
                    println!(
                        "{:<20} {:<18} {:<10} {:<12} {:>8} {:>9}  {}",
                        r.materialization,
                        r.shard,
                        r.status,
                        r.member.as_deref().unwrap_or("-"),
                        r.txn,
                        r.rate,
                        if lag.is_empty() {
                            "-".to_string()
                        } else {
                            lag.join(", ")
                        }
                    );
                }
                println!();
                println!(
                    "{:<20} {:>6} {:>7} {:>9}",
                    "MEMBER", "CPU", "SHARDS", "DOCS/S"
                );
                for m in member_rows {
                    let cpu = m.cpu.map_or("-".to_string(), |c| format!("{c:.2}"));
                    let cooling = if m.cooling {
                        "  (moved a shard by load lately)"
                    } else {
                        ""
                    };
                    println!(
                        "{:<20} {cpu:>6} {:>7} {:>9}{cooling}",
                        m.member, m.shards, m.rate
                    );
                }
                Ok(())
            }
            ShardsCommand::Split {
                materialization,
                shard,
                wait,
                ..
            } => {
                eprintln!("asking the holder of {materialization}/{shard} to split it…");
                let singleton = sluice_cluster::assign::singleton(&pipeline, &materialization);
                let (lo, hi) = admin::split(
                    &etcd,
                    &keys,
                    &materialization,
                    &shard,
                    Duration::from_secs(wait),
                    singleton,
                )
                .await?;
                println!("{materialization}/{shard} split into {lo} and {hi}");
                Ok(())
            }
        }
    })
}
