//! `sluice bench ...`: benchmarks that print figures. (stub: owned by the combiner work)

use clap::Subcommand;

#[derive(Subcommand)]
pub enum BenchCommand {}

pub fn main(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {}
}
