//! `sluice driver ...`: serve a built-in driver over gRPC or stdio, and run the
//! conformance suite against any driver.
//!
//! ```text
//!   sluice driver serve memory --listen 127.0.0.1:0     → "listening on grpc://127.0.0.1:PORT"
//!   sluice driver stdio memory transactions             (what `--command` endpoints run)
//!   sluice driver test --endpoint grpc://… | --command '…' | --builtin memory --config c.json
//!                      [--lacks deletes --lacks delta-updates …]
//! ```
//!
//! `test` holds the driver to every capability (authoritative, deletes, delta updates,
//! strict exists checks) unless told what it lacks (a built-in driver to what it
//! declares): the scenarios needing those are then skipped with their reason. Every transport carries an error's kind (stdio in
//! the driver's last stderr line), so a fenced commit is `Fenced` whatever carried it.
//!
//! `serve` prints its bound address on stdout only once it accepts connections, so a
//! script (or test) can read that line and connect. `stdio` keeps stdout for frames:
//! logs go to stderr, which the runtime forwards to its own logs.

use crate::drivers;
use anyhow::{Context, anyhow, bail};
use clap::{Args, Subcommand};
use serde_json::Value;
use sluice_conformance::{Capabilities, Capability, Outcome, run_suite};
use sluice_driver_sdk::grpc::{GrpcEndpoint, GrpcListener};
use sluice_driver_sdk::inprocess::InProcess;
use sluice_driver_sdk::stdio::{StdioEndpoint, SubCommand, serve_stdio};
use sluice_driver_sdk::{Driver, Endpoint};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Subcommand)]
pub enum DriverCommand {
    /// Serve a built-in driver over gRPC until SIGINT or SIGTERM.
    Serve(ServeArgs),
    /// Run a built-in driver as a stdio executable: one sub-command (spec, validate,
    /// apply-upsert, apply-delete, transactions), frames on stdin and stdout.
    Stdio {
        /// The built-in driver.
        driver: String,
        /// spec, validate, apply-upsert, apply-delete or transactions.
        sub_command: String,
    },
    /// Run the conformance suite against a driver: one line per scenario, then a total.
    Test(TestArgs),
}

#[derive(Args)]
pub struct ServeArgs {
    /// The built-in driver to serve.
    driver: String,
    /// HOST:PORT (port 0 picks a free one) or unix:/path/to/socket.
    #[arg(long)]
    listen: String,
    /// Endpoint configuration (JSON) used for requests that carry none.
    #[arg(long)]
    config: Option<PathBuf>,
}

#[derive(Args)]
#[command(group = clap::ArgGroup::new("target").required(true).multiple(false))]
pub struct TestArgs {
    /// A driver served over gRPC: grpc://HOST:PORT or unix:/path.
    #[arg(long, group = "target")]
    endpoint: Option<String>,
    /// A stdio driver: the program and its arguments, split on whitespace; the
    /// sub-command is appended to them.
    #[arg(long, group = "target")]
    command: Option<String>,
    /// A driver built into this binary.
    #[arg(long, group = "target")]
    builtin: Option<String>,
    /// The endpoint configuration (JSON file) every scenario sends.
    #[arg(long)]
    config: PathBuf,
    /// A binding's resource configuration (JSON file) with a `table` (or, for a
    /// key-value store such as redis, `prefix`) property, which the suite makes unique
    /// per scenario. Default: {"table": "sluice_conformance"}.
    #[arg(long)]
    resource: Option<PathBuf>,
    /// A capability the driver does not claim, whose scenarios are skipped: authoritative,
    /// deletes, delta-updates or strict-exists. Repeatable. A built-in driver claims what
    /// it declares, less these.
    #[arg(long, value_name = "CAPABILITY")]
    lacks: Vec<Capability>,
}

pub fn main(cmd: DriverCommand) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async {
        match cmd {
            DriverCommand::Serve(args) => serve(args).await,
            DriverCommand::Stdio {
                driver,
                sub_command,
            } => {
                let sub_command: SubCommand = sub_command.parse()?;
                let served = serve_stdio(builtin(&driver)?, sub_command).await;
                if let Err(err) = served {
                    // The runtime quotes the tail of our stderr: one plain line, no
                    // backtrace, is what it needs.
                    eprintln!("Error: driver {driver} ({}): {err}", sub_command.as_str());
                    std::process::exit(1);
                }
                Ok(())
            }
            DriverCommand::Test(args) => test(args).await,
        }
    })
}

fn builtin(name: &str) -> anyhow::Result<Arc<dyn Driver>> {
    drivers::builtin(name).ok_or_else(|| {
        anyhow!(
            "no built-in driver {name:?}; built-in drivers: {}",
            drivers::builtin_names().join(", ")
        )
    })
}

fn read_json(path: &Path) -> anyhow::Result<Value> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut driver = builtin(&args.driver)?;
    if let Some(path) = &args.config {
        let config = read_json(path)?;
        driver = Arc::new(crate::drivers::WithDefaultConfig::new(driver, config));
    }
    let listener = GrpcListener::bind(&args.listen).await?;
    let mut stdout = std::io::stdout();
    writeln!(stdout, "listening on {}", listener.address())?;
    stdout.flush()?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        served = listener.serve(driver) => Ok(served?),
        _ = tokio::signal::ctrl_c() => Ok(()),
        _ = terminate.recv() => Ok(()),
    }
}

async fn test(args: TestArgs) -> anyhow::Result<()> {
    let config = read_json(&args.config)?;
    let resource = match &args.resource {
        Some(path) => read_json(path)?,
        None => serde_json::json!({"table": "sluice_conformance"}),
    };
    // A built-in driver says what it does; another is held to everything it does not
    // disclaim with --lacks.
    let mut claimed = Capabilities::ALL;
    let endpoint: Box<dyn Endpoint> = match (&args.endpoint, &args.command, &args.builtin) {
        (Some(address), _, _) => Box::new(GrpcEndpoint::connect(address).await?),
        (_, Some(command), _) => {
            let mut words = command.split_whitespace().map(str::to_string);
            let program = words.next().context("--command is empty")?;
            Box::new(StdioEndpoint::new(
                format!("command:{program}"),
                program,
                words.collect(),
            ))
        }
        (_, _, Some(name)) => {
            let driver = builtin(name)?;
            claimed = Capabilities::declared(driver.declared());
            Box::new(InProcess::new(name.clone(), driver))
        }
        // clap requires exactly one of the three.
        (None, None, None) => bail!("one of --endpoint, --command or --builtin is required"),
    };
    let claimed = (args.lacks.iter()).fold(claimed, |claimed, lacks| claimed.without(*lacks));
    let results = run_suite(endpoint.as_ref(), claimed, config, resource).await;
    let count = |f: fn(&Outcome) -> bool| results.iter().filter(|r| f(&r.outcome)).count();
    let passed = count(|o| matches!(o, Outcome::Pass));
    let failed = count(|o| matches!(o, Outcome::Fail(_)));
    let skipped = count(|o| matches!(o, Outcome::Skip(_)));
    let mut stdout = std::io::stdout();
    for result in &results {
        writeln!(stdout, "{result}")?;
    }
    let skipped = match skipped {
        0 => String::new(),
        n => format!(", {n} skipped"),
    };
    writeln!(stdout, "{passed} passed, {failed} failed{skipped}")?;
    if failed > 0 {
        bail!(
            "{failed} conformance scenario(s) failed against {}",
            endpoint.name()
        );
    }
    Ok(())
}
