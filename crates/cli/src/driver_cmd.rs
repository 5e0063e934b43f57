//! `sluice driver ...`: serve a built-in driver over gRPC or stdio, and run the
//! conformance suite against any driver.
//!
//! ```text
//!   sluice driver serve memory --listen 127.0.0.1:0 [--protocol current|transactions]
//!                                                       → "listening on grpc://127.0.0.1:PORT"
//!   sluice driver stdio memory transactions             (what seed `--command` endpoints run)
//!   sluice driver stdio memory [--codec proto|json]     (Flow's current protocol)
//!   sluice driver test --endpoint grpc://… | --command '…' | --builtin memory --config c.json
//!                      [--protocol current|transactions] [--codec proto|json]
//!                      [--lacks deletes --lacks delta-updates …]
//! ```
//!
//! Every way of serving speaks either protocol: the seed's (`materialize.Driver`, a
//! stdio sub-command per call) or Flow's current one (`materialize.Connector`, a stdio
//! process per stream with no sub-command), and `test` drives either (`--protocol`,
//! default `transactions`): the suite speaks the seed's protocol, translated at the edge.
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
use sluice_driver_sdk::current::{self, Codec, Protocol};
use sluice_driver_sdk::grpc::GrpcListener;
use sluice_driver_sdk::inprocess::InProcess;
use sluice_driver_sdk::stdio::{SubCommand, serve_stdio};
use sluice_driver_sdk::{Driver, Endpoint};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Subcommand)]
pub enum DriverCommand {
    /// Serve a built-in driver over gRPC until SIGINT or SIGTERM.
    Serve(ServeArgs),
    /// Run a built-in driver as a stdio executable: with a sub-command (spec, validate,
    /// apply-upsert, apply-delete, transactions), the seed's protocol in frames on stdin
    /// and stdout; without one, Flow's current protocol in `--codec`.
    Stdio {
        /// The built-in driver.
        driver: String,
        /// spec, validate, apply-upsert, apply-delete or transactions; none: the current
        /// protocol, whose first request says what is asked.
        sub_command: Option<String>,
        /// How current-protocol messages are written: proto (length-prefixed protobuf
        /// frames) or json (one JSON object a line). Not with a sub-command.
        #[arg(long, value_parser = parse_codec, default_value = "proto")]
        codec: Codec,
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
    /// The protocol served: transactions (the seed's `materialize.Driver`) or current
    /// (Flow's `materialize.Connector`).
    #[arg(long, value_parser = parse_protocol, default_value = "transactions")]
    protocol: Protocol,
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
    /// deletes, delta-updates, strict-exists or dry-run. Repeatable. A built-in driver
    /// claims what it declares, less these; a driver of --protocol current never claims
    /// dry-run (that protocol has no dry run).
    #[arg(long, value_name = "CAPABILITY")]
    lacks: Vec<Capability>,
    /// The protocol an --endpoint or --command driver speaks: transactions (the
    /// seed's) or current (Flow's `materialize.Connector`; a --command then runs with no
    /// sub-command).
    #[arg(long, value_parser = parse_protocol, default_value = "transactions")]
    protocol: Protocol,
    /// How a current-protocol --command driver writes its messages: proto or json.
    #[arg(long, value_parser = parse_codec)]
    codec: Option<Codec>,
}

fn parse_protocol(text: &str) -> Result<Protocol, String> {
    text.parse()
}

fn parse_codec(text: &str) -> Result<Codec, String> {
    text.parse()
}

pub fn main(cmd: DriverCommand) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(async {
        match cmd {
            DriverCommand::Serve(args) => serve(args).await,
            DriverCommand::Stdio {
                driver,
                sub_command,
                codec,
            } => stdio(driver, sub_command, codec).await,
            DriverCommand::Test(args) => test(args).await,
        }
    })
}

async fn stdio(driver: String, sub_command: Option<String>, codec: Codec) -> anyhow::Result<()> {
    let (served, call) = match sub_command {
        Some(sub_command) => {
            let sub_command: SubCommand = sub_command.parse()?;
            if codec != Codec::Proto {
                bail!(
                    "--codec {codec} is for the current protocol only (no sub-command): the \
                     seed's sub-commands always speak protobuf frames"
                );
            }
            let served = serve_stdio(builtin(&driver)?, sub_command).await;
            (served, sub_command.as_str().to_string())
        }
        None => {
            let served = current::stdio::serve_current_stdio(builtin(&driver)?, codec).await;
            (served, format!("current protocol, {codec}"))
        }
    };
    if let Err(err) = served {
        // The runtime quotes the tail of our stderr: one plain line, no backtrace, is
        // what it needs.
        eprintln!("Error: driver {driver} ({call}): {err}");
        std::process::exit(1);
    }
    Ok(())
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
    let served = async {
        match args.protocol {
            Protocol::Transactions => listener.serve(driver).await,
            Protocol::Current => current::grpc::serve(listener, driver).await,
        }
    };
    tokio::select! {
        served = served => Ok(served?),
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
    if args.codec.is_some_and(|codec| codec != Codec::Proto)
        && (args.protocol != Protocol::Current || args.command.is_none())
    {
        bail!("--codec json is for a --command driver of --protocol current only");
    }
    let protocol = Some(args.protocol);
    let endpoint: Arc<dyn Endpoint> = match (&args.endpoint, &args.command, &args.builtin) {
        (Some(address), _, _) => current::grpc::connect(address, protocol).await?,
        (_, Some(command), _) => {
            let mut words = command.split_whitespace().map(str::to_string);
            let program = words.next().context("--command is empty")?;
            let name = format!("command:{program}");
            let codec = args.codec.unwrap_or_default();
            current::stdio::endpoint(&name, &program, words.collect(), protocol, codec)
        }
        (_, _, Some(name)) => {
            let driver = builtin(name)?;
            claimed = Capabilities::declared(driver.declared());
            Arc::new(InProcess::new(name.clone(), driver))
        }
        // clap requires exactly one of the three.
        (None, None, None) => bail!("one of --endpoint, --command or --builtin is required"),
    };
    if args.protocol == Protocol::Current && args.builtin.is_none() {
        claimed = claimed.without(Capability::DryRun);
    }
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
