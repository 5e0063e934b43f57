//! The `sluice` command. Each sub-command lives in its own module; this file only parses
//! arguments, sets up logging and dispatches.

mod discover_cmd;
mod driver_cmd;
mod drivers;
mod maintain_cmd;
mod pause_cmd;
mod pipeline_cmd;
mod produce;
mod progress;
mod schema_cmd;
mod shards_cmd;
mod status_cmd;
mod tool;

use clap::{Parser, Subcommand};
use sluice_app::logging;

/// Documents are many small allocations (serde_json values); mimalloc cuts the time the
/// system allocator spends there (about a quarter of a run, profiled) substantially.
/// Its v2 line (the `v2` feature): v3's `mi_malloc_aligned`, which the crate calls for
/// every allocation, falls back to over-allocating from the next size class whenever the
/// free list of a size class that is not a power of two runs dry (one allocation in nine
/// in the combine bench, ~80 instructions and up to a third more memory each).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The version `--version` prints; a build with fail points says so, which is how
/// `sluice torture` knows it can inject them.
const VERSION: &str = if cfg!(feature = "failpoints") {
    concat!(env!("CARGO_PKG_VERSION"), " (failpoints)")
} else {
    env!("CARGO_PKG_VERSION")
};

#[derive(Parser)]
#[command(
    name = "sluice",
    version = VERSION,
    about = "Exactly-once streaming of keyed JSON documents into stores"
)]
struct Cli {
    #[command(flatten)]
    log: logging::LogArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a pipeline until its finite sources are exhausted and everything is committed.
    Run(pipeline_cmd::RunArgs),
    /// Validate a pipeline file and ask each driver to validate its bindings.
    Check(pipeline_cmd::CheckArgs),
    /// Create or update the resources (e.g. tables) a pipeline writes to (`--delete`:
    /// drop them); `run` runs only what was applied.
    Apply(pipeline_cmd::ApplyArgs),
    /// Send a JSON-lines file (`-`: stdin) to what a source reads: its Kafka topic or
    /// its NATS stream, one document a message (a missing topic or stream is created).
    Produce(produce::ProduceArgs),
    /// Show what Sluice has recorded for a pipeline.
    #[command(subcommand)]
    Inspect(pipeline_cmd::InspectCommand),
    /// Print a pipeline's status: from the running process's status API, else from its
    /// recovery logs.
    Status(status_cmd::StatusArgs),
    /// Pause a running pipeline, or one source of it: its sources are read no more and
    /// nothing new of them commits, until `sluice resume` (through the status API).
    Pause(pause_cmd::PauseArgs),
    /// Resume a paused pipeline, or one source of it (through the status API).
    Resume(pause_cmd::PauseArgs),
    /// Run an Airbyte connector's or a Singer tap's discover and print a pipeline file
    /// reading its streams (collections with its schemas and keys, sources, a binding
    /// each into SQLite or PostgreSQL) that runs as printed.
    Discover(discover_cmd::DiscoverArgs),
    /// Maintain the Iceberg tables a pipeline writes: compact small files (and their
    /// deletes), expire old snapshots, remove orphaned files; each step one commit, safe
    /// while the pipeline runs.
    Maintain(maintain_cmd::MaintainArgs),
    /// Print the JSON schema of a connector's configuration (`--markdown`: as the
    /// reference tables of the docs); without a connector, list them.
    Schema(schema_cmd::SchemaArgs),
    /// A cluster's shards (a pipeline file with `cluster:`): list them, split one.
    #[command(subcommand)]
    Shards(shards_cmd::ShardsCommand),
    /// Serve, run or test drivers.
    #[command(subcommand)]
    Driver(driver_cmd::DriverCommand),
    /// Benchmarks that print throughput figures (the binary sluice-bench, built beside
    /// this one; `sluice bench --help` lists them).
    Bench(tool::ToolArgs),
    /// Inject faults (crashes, kills, zombies, restarts) into runs of a generated
    /// pipeline and check that the store ends exactly equal to the expected reduction,
    /// or that an output published each transaction's changes once (the binary
    /// sluice-torture, built beside this one with the `failpoints` feature).
    Torture(tool::ToolArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let format = cli.log.log_format;
    logging::run(format, || run(cli))
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let format = cli.log.log_format;
    // Fail points named in FAILPOINTS (tests and `sluice torture` only).
    #[cfg(feature = "failpoints")]
    let _failpoints = sluice_runtime::failpoint::setup();
    match cli.command {
        Command::Run(args) => pipeline_cmd::run(args),
        Command::Check(args) => pipeline_cmd::check(args),
        Command::Apply(args) => pipeline_cmd::apply(args),
        Command::Produce(args) => produce::main(args),
        Command::Inspect(cmd) => pipeline_cmd::inspect(cmd),
        Command::Status(args) => status_cmd::main(args),
        Command::Pause(args) => pause_cmd::main("pause", args),
        Command::Resume(args) => pause_cmd::main("resume", args),
        Command::Discover(args) => discover_cmd::main(args),
        Command::Maintain(args) => maintain_cmd::main(args),
        Command::Schema(args) => schema_cmd::main(args),
        Command::Shards(cmd) => shards_cmd::main(cmd),
        Command::Driver(cmd) => driver_cmd::main(cmd),
        Command::Bench(args) => tool::exec("sluice-bench", args, format),
        Command::Torture(args) => tool::exec("sluice-torture", args, format),
    }
}
