//! `sluice run | check | apply | inspect`: the pipeline operator's commands. (stub)

use clap::{Args, Subcommand};
use std::path::PathBuf;

#[derive(Args)]
pub struct RunArgs {
    /// The pipeline file (YAML).
    pub pipeline: PathBuf,
}

#[derive(Args)]
pub struct CheckArgs {
    pub pipeline: PathBuf,
}

#[derive(Args)]
pub struct ApplyArgs {
    pub pipeline: PathBuf,
    /// Print the actions without applying them.
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Subcommand)]
pub enum InspectCommand {
    /// Print the checkpoint held by a pipeline's recovery log.
    Checkpoint { pipeline: PathBuf },
}

pub fn run(_args: RunArgs) -> anyhow::Result<()> {
    anyhow::bail!("`sluice run` is not built yet")
}
pub fn check(_args: CheckArgs) -> anyhow::Result<()> {
    anyhow::bail!("`sluice check` is not built yet")
}
pub fn apply(_args: ApplyArgs) -> anyhow::Result<()> {
    anyhow::bail!("`sluice apply` is not built yet")
}
pub fn inspect(_cmd: InspectCommand) -> anyhow::Result<()> {
    anyhow::bail!("`sluice inspect` is not built yet")
}
