//! `sluice driver ...`: serve, exec and test drivers. (stub: owned by the driver-transport work)

use clap::Subcommand;

#[derive(Subcommand)]
pub enum DriverCommand {}

pub fn main(cmd: DriverCommand) -> anyhow::Result<()> {
    match cmd {}
}
