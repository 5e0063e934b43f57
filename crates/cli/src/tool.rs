//! `sluice bench` and `sluice torture`: each tool is a binary of its own, built beside
//! `sluice` (the product binary holds only the product). These commands run it with the
//! rest of the command line, in this process's place.

use anyhow::Context;
use clap::ValueEnum;
use sluice_app::logging::LogFormat;
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::process::Command;

#[derive(clap::Args)]
#[command(disable_help_flag = true)]
pub struct ToolArgs {
    /// The tool's own arguments (`--help` lists them).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<OsString>,
}

/// Replaces this process with `binary` from beside it, given `args` and the log format.
pub fn exec(binary: &str, args: ToolArgs, format: LogFormat) -> anyhow::Result<()> {
    let path = sluice_app::sibling::sibling(binary)?;
    let format = format
        .to_possible_value()
        .map(|value| value.get_name().to_owned())
        .unwrap_or_default();
    let err = Command::new(&path)
        .args(args.args)
        .env("SLUICE_LOG_FORMAT", format)
        .exec();
    Err(err).with_context(|| format!("running {}", path.display()))
}
