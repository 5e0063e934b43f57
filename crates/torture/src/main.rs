//! `sluice torture`: proves exactly-once under faults. It writes a pipeline of generated
//! documents (sum, merge and maximize reductions) from an input of its own (a file, or
//! a Kafka topic or NATS stream in a private broker, [`input`]) into a store of its own, runs
//! `sluice run` as a child process while injecting faults, restarts it after each, and
//! finally compares the store with the reduction computed independently
//! ([`model`]).
//!
//! An output is a target beside the stores (`--output`, [`output`]): the
//! materialization publishes each transaction's changes to a destination of the
//! torture's own, which is read back whole at the end and checked batch by batch
//! (transactions without gaps or doubles, indexes exactly 0..n, every delete's document
//! the current one) before its folded changes are compared with the model.
//!
//! ```text
//!  generate M docs ─▶ pipeline.yaml ─▶ loop N faults:  sluice run  (FAILPOINTS=…, or SIGKILL)
//!                                                     └─ exit 0? append a segment of input
//!                  ─▶ clean run ─▶ read the table ─▶ compare with the model ─▶ report
//! ```
//!
//! Scenarios ([`scenarios`]): `random` (random fail points and SIGKILLs), `zombie` (two
//! instances of one shard), `driver-dies` (an external driver killed, stdio or gRPC),
//! `server-restart` (a private PostgreSQL or MariaDB server crashed and started again,
//! [`server`]), `broker-restart` (the private Kafka or NATS broker crashed and started
//! again, repeatedly), `disk-full` (the recovery log's fsync fails). `--source http`
//! runs `random` its own way ([`pushed`]): clients post the input while runs are
//! SIGKILLed, retrying with their Idempotency-Keys until acknowledged. Every scenario runs
//! on every store ([`store`]: SQLite, PostgreSQL, MariaDB/MySQL), `random` on the outputs
//! too (faulted at the output's batch boundaries and the runtime's commits),
//! `server-restart` on the server stores only, `broker-restart` on the broker sources
//! only. A Kafka topic's four partitions interleave in no fixed order, so the model does
//! not know the documents of each transaction: `--mode delta` and `disk-full` (which
//! check them) read a file or a NATS stream. `cluster` ([`cluster`]) runs three members
//! of a cluster on a private etcd member and faults them (kill, stop past the lease,
//! split, etcd restart), in standard mode on a store, from any input: a CDC or http
//! source is a singleton (one shard, never split, its holder killed in the split's
//! turn). Fail points need a binary built with the `failpoints` feature; without
//! it `random` injects SIGKILLs only and the scenarios that need them refuse to run.
//!
//! The Iceberg store ([`iceberg`]) runs `random` and `disk-full` from a file or NATS: a
//! change log in delta mode, an upsert table in standard mode (its input with
//! deletions), its warehouse in the folder or on S3 (`--s3`), optionally maintained
//! between runs (`--maintain-every`).
//!
//! A run whose outcome contradicts its fault (a crash point that fired but the process
//! exited 0, an unexpected error, a run that hangs) is an **anomaly**: reported with
//! its log ([`report`]), and the torture fails, whatever the final comparison says.

mod cluster;
mod iceberg;
mod input;
mod model;
mod output;
mod pushed;
mod report;
mod scenarios;
mod server;
mod store;

use anyhow::{Context, bail};
use clap::{Args, Parser, ValueEnum};
use input::{Input, SourceKind};
use model::{Model, Table, Verdict};
use output::{Output, OutputKind};
use report::Report;
use server::{PrivateMariadb, PrivatePostgres, PrivateServer};
use sluice_app::logging::{self, LogArgs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use store::{Dialect, Store, yaml_str};

/// Inject faults (crashes, kills, zombies, restarts) into runs of a generated pipeline
/// and check that the store ends exactly equal to the expected reduction, or that an
/// output (`--output`) published each transaction's changes once. Drives the `sluice`
/// binary beside this one.
#[derive(Parser)]
#[command(name = "sluice torture", bin_name = "sluice torture", version)]
struct Cli {
    #[command(flatten)]
    log: LogArgs,
    #[command(flatten)]
    args: TortureArgs,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    logging::run(cli.log.log_format, || run(cli.args))
}

#[derive(Args)]
struct TortureArgs {
    /// The store to materialize into.
    #[arg(
        long,
        value_enum,
        required_unless_present = "output",
        conflicts_with = "output"
    )]
    store: Option<StoreKind>,
    /// Publish each transaction's changes (json insert/delete) to an output instead of
    /// materializing into a store: files (a folder of the torture's own, one file per
    /// transaction), kafka (a 4-partition topic of a private tansu) or nats (a subject
    /// of a private NATS JetStream server). A change stream, not a table: checked batch
    /// by batch, then folded.
    #[arg(long, value_enum)]
    output: Option<OutputKind>,
    /// Where the input lives: a JSON-lines file, a 4-partition topic of a private
    /// Kafka broker (tansu), a stream of a private NATS JetStream server, a table of a
    /// private PostgreSQL or MariaDB read by change data capture (postgres_cdc,
    /// mysql_cdc), or clients posting
    /// to an HTTP source (and retrying with their Idempotency-Keys).
    #[arg(long, value_enum, default_value = "file")]
    source: SourceKind,
    /// standard (one reduced row per key) or delta (one row per transaction and key).
    #[arg(long, value_enum, default_value = "standard")]
    mode: Mode,
    #[arg(long, value_enum, default_value = "random")]
    scenario: Scenario,
    /// The external driver's transport (driver-dies).
    #[arg(long, value_enum, default_value = "stdio")]
    transport: Transport,
    /// Documents generated at first (more are appended if a run consumes them all).
    #[arg(long, default_value_t = 20_000)]
    docs: usize,
    /// Distinct keys.
    #[arg(long, default_value_t = 2_000)]
    keys: u64,
    /// Documents per transaction.
    #[arg(long, default_value_t = 500)]
    txn_docs: u64,
    /// Faults to inject (random, broker-restart); runs whose fault did not fire do not
    /// count.
    #[arg(long, default_value_t = 20)]
    faults: u64,
    /// Seed of the input and of the faults (default: from the clock, printed).
    #[arg(long)]
    seed: Option<u64>,
    /// The server of a postgres or mysql store, where a schema (PostgreSQL) or a
    /// database (MariaDB/MySQL) of a unique name is created, then dropped [default:
    /// postgres://postgres@127.0.0.1:5432/test, mysql://root@127.0.0.1:3306/test].
    /// server-restart starts a private server instead.
    #[arg(long)]
    url: Option<String>,
    /// The Iceberg store's warehouse on S3 or an S3-compatible store,
    /// `s3://bucket/prefix`, instead of the torture's folder: each torture writes under
    /// `<prefix>/<its folder's name>`, removed at the end unless kept. Credentials and
    /// region come from the environment (AWS_ACCESS_KEY_ID, AWS_REGION...).
    #[arg(long, value_name = "URL")]
    s3: Option<String>,
    /// The S3-compatible server of --s3 (`http://127.0.0.1:9000`): path-style access,
    /// AWS_REGION or us-east-1, the environment's key pair or a test one (moto accepts
    /// any), and the bucket created if missing.
    #[arg(long, value_name = "URL", requires = "s3")]
    s3_endpoint: Option<String>,
    /// Run `sluice maintain <pipeline> --json` between runs every this many faults
    /// (--store iceberg, random scenario): the rows read before and after each must be
    /// equal, and the table must end equal to the model.
    #[arg(long, value_name = "K", value_parser = clap::value_parser!(u64).range(1..))]
    maintain_every: Option<u64>,
    /// Keep the torture's folder (pipeline, input, logs of every run) for inspection.
    #[arg(long)]
    keep: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StoreKind {
    Sqlite,
    Postgres,
    Mysql,
    /// The Iceberg epoch sink, read back by pyiceberg: a change log (delta mode) or an
    /// upsert table (standard mode, with deletions).
    Iceberg,
}

impl StoreKind {
    /// The server of a server store (None: SQLite, Iceberg).
    fn dialect(self) -> Option<Dialect> {
        match self {
            StoreKind::Sqlite | StoreKind::Iceberg => None,
            StoreKind::Postgres => Some(Dialect::Postgres),
            StoreKind::Mysql => Some(Dialect::Mysql),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Standard,
    Delta,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Scenario {
    Random,
    Zombie,
    DriverDies,
    ServerRestart,
    BrokerRestart,
    DiskFull,
    /// Three members of a cluster (a private etcd member) share the shards while
    /// members are killed, stopped past their lease, shards split and etcd restarted.
    Cluster,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Transport {
    Stdio,
    Grpc,
}

/// How an error says that a broker cannot be reached (lower case).
const UNREACHABLE: &[&str] = &[
    "connection refused",
    "connection reset",
    "broken pipe",
    "unexpected eof",
    "timed out",
    "disconnected",
    "unreachable",
];

/// A run that takes longer than this hangs.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);

fn run(args: TortureArgs) -> anyhow::Result<()> {
    let clock = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let seed = args.seed.unwrap_or(clock.as_nanos() as u64 % 1_000_000);
    let tag = format!("{}_{}", std::process::id(), clock.subsec_nanos());
    let dir = std::env::temp_dir().join(format!("sluice-torture-{tag}"));
    let dialect = args.store.and_then(StoreKind::dialect);
    if args.output.is_some() && (args.mode == Mode::Delta || args.scenario != Scenario::Random) {
        bail!(
            "--output runs --scenario random in --mode standard: an output publishes each \
             change with the document before it, so it refuses delta updates, and the other \
             scenarios fault what only a store has (its server, its driver process, a table \
             two instances share) or are not built for outputs"
        );
    }
    if args.scenario == Scenario::ServerRestart && dialect.is_none() {
        bail!("server-restart restarts a database server: --store postgres or mysql");
    }
    if args.scenario == Scenario::Cluster && args.mode == Mode::Delta {
        bail!(
            "the cluster scenario runs in standard mode: each shard closes transactions of \
             its own, so the model cannot know which documents a transaction held"
        );
    }
    if args.scenario == Scenario::BrokerRestart && args.source == SourceKind::File {
        bail!("broker-restart restarts a log broker: --source kafka or nats");
    }
    let random_or_cluster = matches!(args.scenario, Scenario::Random | Scenario::Cluster);
    if args.source.is_cdc() && (args.mode == Mode::Delta || !random_or_cluster) {
        let source = args.source.to_possible_value().expect("no skipped values");
        bail!(
            "--source {} runs the random scenario in standard mode, or the cluster one: a \
             CDC step is a whole transaction of the database or a backfill chunk, not the \
             model's fixed transactions, which --mode delta and the other scenarios check",
            source.get_name()
        );
    }
    if args.source == SourceKind::Kafka
        && (args.mode == Mode::Delta || args.scenario == Scenario::DiskFull)
    {
        bail!(
            "--source kafka interleaves four partitions in no fixed order, so the model cannot \
             tell which documents each transaction held, which --mode delta and disk-full \
             check: use --source file or nats for them"
        );
    }
    if args.source == SourceKind::Http && (args.mode == Mode::Delta || !random_or_cluster) {
        bail!(
            "--source http pushes its documents from clients that retry while runs are \
             killed under them, in no fixed transactions: it runs --scenario random or \
             cluster in --mode standard"
        );
    }
    let into_iceberg = args.store == Some(StoreKind::Iceberg);
    if into_iceberg && !matches!(args.scenario, Scenario::Random | Scenario::DiskFull) {
        bail!("--store iceberg runs the random or disk-full scenario");
    }
    if into_iceberg && !matches!(args.source, SourceKind::File | SourceKind::Nats) {
        bail!(
            "--store iceberg reads a file or a NATS stream: its standard mode's input has \
             deletions, which the model applies in the input's order"
        );
    }
    if !into_iceberg && (args.s3.is_some() || args.maintain_every.is_some()) {
        bail!("--s3 and --maintain-every are options of --store iceberg");
    }
    if args.maintain_every.is_some() && args.scenario != Scenario::Random {
        bail!("--maintain-every maintains between the runs of the random scenario");
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let input = Input::create(args.source, &dir)?;
    let server = match (args.scenario, dialect) {
        (Scenario::ServerRestart, Some(dialect)) => Some(private_server(dialect, &dir)?),
        _ => None,
    };
    let store = match (args.output, &server, dialect) {
        (Some(output), ..) => Store::Output(Output::create(output, &dir, &tag)?),
        (None, _, None) if into_iceberg => {
            let s3 = args.s3.as_ref().map(|url| iceberg::S3Target {
                url: url.clone(),
                endpoint: args.s3_endpoint.clone(),
            });
            Store::Iceberg(iceberg::IcebergStore::create(
                &dir,
                s3.as_ref(),
                args.mode == Mode::Standard,
            )?)
        }
        (None, _, None) => Store::Sqlite {
            path: dir.join("torture.db"),
        },
        (None, Some(server), Some(dialect)) => Store::server(dialect, &server.url(), &tag)?,
        (None, None, Some(dialect)) => {
            let url = args.url.as_deref().unwrap_or(dialect.default_url());
            Store::server(dialect, url, &tag)?
        }
    };
    let exe = sluice_app::sibling::sibling("sluice")?;
    if args.maintain_every.is_some() {
        iceberg::check_maintain(&exe)?;
    }
    // An upsert table is the view: its input deletes keys too.
    let model = match into_iceberg && args.mode == Mode::Standard {
        true => Model::new(seed, args.keys).with_deletions(),
        false => Model::new(seed, args.keys),
    };
    let mut harness = Harness {
        failpoints: has_failpoints(&exe)?,
        exe,
        dir: dir.clone(),
        store,
        server,
        input,
        delta: args.mode == Mode::Delta,
        txn_docs: args.txn_docs.max(1),
        segment: (args.docs / 4).max(args.txn_docs as usize * 8),
        model,
        runs: 0,
        report: Report::default(),
    };
    let mode = if harness.delta { "delta" } else { "standard" };
    let scenario = args
        .scenario
        .to_possible_value()
        .expect("no skipped values");
    let source = match args.source {
        SourceKind::File => String::new(),
        _ => format!("{}/", harness.input.describe()),
    };
    harness.report.scenario = format!(
        "{source}{}/{mode}/{}",
        harness.store.describe(),
        scenario.get_name()
    );
    println!(
        "torture {}: {} documents over {} keys, {} per transaction, seed {seed}, in {}",
        harness.report.scenario,
        args.docs,
        args.keys,
        harness.txn_docs,
        dir.display()
    );
    let result = harness
        .append(args.docs)
        .and_then(|()| scenarios::run(&mut harness, &args, seed));
    let verdict = result.and_then(|()| harness.verify());
    let failed = !matches!(&verdict, Ok(v) if v.exact()) || !harness.report.anomalies.is_empty();
    let cleanup = harness.store.drop_namespace(args.keep || failed);
    drop(harness.server.take());
    drop(harness.input);
    let report = harness.report;
    if args.keep || failed {
        println!(
            "kept {} (pipeline, input, the log of every run)",
            dir.display()
        );
    } else {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    cleanup?;
    let verdict = verdict?;
    report.print(&verdict);
    if failed {
        bail!(
            "torture {} failed: {} lost, {} duplicated, {} mismatched, {}",
            report.scenario,
            verdict.lost,
            verdict.duplicated,
            verdict.mismatched,
            report.anomaly_counts()
        );
    }
    Ok(())
}

/// A private server of `dialect`'s kind in `dir` (server-restart).
fn private_server(dialect: Dialect, dir: &Path) -> anyhow::Result<Box<dyn PrivateServer>> {
    Ok(match dialect {
        Dialect::Postgres => Box::new(PrivatePostgres::start(&dir.join("pg"))?),
        Dialect::Mysql => Box::new(PrivateMariadb::start(&dir.join("mariadb"))?),
    })
}

/// The table every torture pipeline materializes into.
pub const TABLE: &str = "torture_events";

/// Runs `f` to its end on a runtime of its own (the torture itself is synchronous).
pub fn block_on<T>(f: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)
}

/// Sends signal `name` (KILL, STOP, CONT) to process `pid`.
fn signal(pid: u32, name: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(pid.to_string())
        .status()
        .context("running kill")?;
    if !status.success() {
        bail!("kill -{name} {pid}: {status}");
    }
    Ok(())
}

/// Whether `exe` was built with fail points: its version says so.
fn has_failpoints(exe: &Path) -> anyhow::Result<bool> {
    let out = Command::new(exe)
        .arg("--version")
        .output()
        .with_context(|| format!("running {} --version", exe.display()))?;
    Ok(String::from_utf8_lossy(&out.stdout).contains("(failpoints)"))
}

/// Everything a scenario needs: the binary, the folder, the store, the model.
struct Harness {
    /// The `sluice` binary beside this one, and whether it was built with fail points.
    exe: PathBuf,
    failpoints: bool,
    dir: PathBuf,
    store: Store,
    /// The store's server when the scenario restarts it.
    server: Option<Box<dyn PrivateServer>>,
    /// Where the generated segments go (and the broker that holds them).
    input: Input,
    delta: bool,
    txn_docs: u64,
    /// Documents appended whenever a run has consumed all the input.
    segment: usize,
    model: Model,
    runs: u64,
    report: Report,
}

/// A child process whose output goes to files in the torture's folder (`<name>.out`,
/// `<name>.err`).
struct Running {
    child: Child,
    name: String,
    stderr: PathBuf,
}

/// How a child ended.
struct Outcome {
    name: String,
    status: ExitStatus,
    /// We killed it (SIGKILL) while it was running.
    killed: bool,
    stderr: String,
}

impl Outcome {
    fn success(&self) -> bool {
        self.status.success()
    }

    /// The last lines of stderr, to quote in an anomaly.
    fn tail(&self) -> String {
        let lines: Vec<&str> = self.stderr.lines().collect();
        lines[lines.len().saturating_sub(6)..].join("\n    ")
    }

    /// Whether the run's error (its last `error:` line) names the broker at `address`
    /// as unreachable: what a run may end with while its broker is down, e.g. "cannot
    /// read brokers 127.0.0.1:9092: … Connection refused".
    fn names_unreachable(&self, address: &str) -> bool {
        let Some(error) = self.stderr.lines().rfind(|l| l.starts_with("error: ")) else {
            return false;
        };
        let error = error.to_lowercase();
        error.contains(address) && UNREACHABLE.iter().any(|cause| error.contains(cause))
    }

    /// Times the runtime reopened a stream after a retryable failure.
    fn reopenings(&self) -> u64 {
        self.stderr.matches("; reopening in ").count() as u64
    }
}

impl Running {
    /// Whether the child exits within `delay` (it is left running otherwise).
    fn exits_within(&mut self, delay: Duration) -> anyhow::Result<bool> {
        let started = Instant::now();
        while started.elapsed() < delay {
            if self.child.try_wait()?.is_some() {
                return Ok(true);
            }
            std::thread::sleep(Duration::from_millis(5).min(delay));
        }
        Ok(false)
    }

    fn wait(mut self, timeout: Duration) -> anyhow::Result<Outcome> {
        let started = Instant::now();
        let mut killed = false;
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                break status;
            }
            if started.elapsed() > timeout {
                self.child.kill()?;
                killed = true;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.outcome(status, killed)
    }

    /// SIGKILL after `delay`, if still running then.
    fn kill_after(mut self, delay: Duration) -> anyhow::Result<Outcome> {
        let started = Instant::now();
        while started.elapsed() < delay {
            if let Some(status) = self.child.try_wait()? {
                return self.outcome(status, false);
            }
            std::thread::sleep(Duration::from_millis(5).min(delay));
        }
        let killed = self.child.try_wait()?.is_none();
        if killed {
            self.child.kill()?;
        }
        let status = self.child.wait()?;
        self.outcome(status, killed)
    }

    fn outcome(self, status: ExitStatus, killed: bool) -> anyhow::Result<Outcome> {
        Ok(Outcome {
            name: self.name,
            status,
            killed,
            stderr: std::fs::read_to_string(&self.stderr).unwrap_or_default(),
        })
    }
}

impl Harness {
    /// Appends a new segment of `n` documents to the input.
    fn append(&mut self, n: usize) -> anyhow::Result<()> {
        let segment = self.model.generate(n);
        self.input.append(segment)
    }

    /// Writes pipeline `name` into `endpoint` with a recovery log of its own; returns
    /// (pipeline file, the materialization's recovery-log folder).
    fn pipeline(&self, name: &str, endpoint: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
        let log = self.dir.join("recovery").join(name);
        let yaml = format!(
            r#"
collections:
  torture/events:
    key: [/key]
    schema:
      type: object
      required: [key, views, bytes, last_seen]
      reduce: {{strategy: merge}}
      properties:
        key: {{type: string}}
        views: {{type: integer, reduce: {{strategy: sum}}}}
        bytes: {{type: integer, reduce: {{strategy: sum}}}}
        last_seen: {{type: string, reduce: {{strategy: maximize}}}}
        attrs:
          type: object
          reduce: {{strategy: merge}}
          additionalProperties: {{type: integer, reduce: {{strategy: maximize}}}}
sources:
  events:
    target: torture/events
    {source}
materializations:
  torture:
    endpoint:
      {endpoint}
    bindings:
      - source: torture/events
        resource: {resource}
        delta_updates: {delta}
runtime:
  recovery_log: {log}
  transactions: {{max_docs: {txn_docs}, {durations}}}
"#,
            source = self.input.source_yaml(),
            resource = self.store.resource_yaml(),
            delta = self.delta,
            log = yaml_str(&log),
            txn_docs = self.txn_docs,
            // Transactions of exactly `txn_docs` documents, except for pushed input:
            // its clients wait for their answers, so a transaction closes when they
            // have all been heard.
            durations = match self.input {
                Input::Http { .. } => "max_duration: 200ms",
                _ => "max_duration: 600s, min_duration: 600s",
            },
        );
        let path = self.dir.join(format!("{name}.yaml"));
        std::fs::write(&path, yaml).with_context(|| format!("writing {}", path.display()))?;
        Ok((path, log.join("torture")))
    }

    /// Starts `sluice <args>` with `failpoints` armed (none: FAILPOINTS unset).
    fn spawn(&mut self, args: &[&str], failpoints: Option<&str>) -> anyhow::Result<Running> {
        self.spawn_with(args, failpoints, &[])
    }

    /// [`spawn`](Self::spawn) with environment variables `env` set.
    fn spawn_with(
        &mut self,
        args: &[&str],
        failpoints: Option<&str>,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Running> {
        self.runs += 1;
        let name = format!("run-{:04}", self.runs);
        let stdout = self.dir.join(format!("{name}.out"));
        let stderr = self.dir.join(format!("{name}.err"));
        let mut cmd = Command::new(&self.exe);
        cmd.args(args)
            .env("RUST_LOG", "warn")
            .env_remove("FAILPOINTS")
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout)?)
            .stderr(std::fs::File::create(&stderr)?);
        if let Some(failpoints) = failpoints {
            cmd.env("FAILPOINTS", failpoints);
        }
        cmd.envs(env.iter().copied());
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", self.exe.display()))?;
        Ok(Running {
            child,
            name,
            stderr,
        })
    }

    fn run(&mut self, pipeline: &Path, failpoints: Option<&str>) -> anyhow::Result<Running> {
        let pipeline = pipeline.to_string_lossy().into_owned();
        self.spawn(&["run", &pipeline], failpoints)
    }

    /// Runs `pipeline` without faults to the end: it must succeed.
    fn run_clean(&mut self, pipeline: &Path) -> anyhow::Result<()> {
        let outcome = self.run(pipeline, None)?.wait(RUN_TIMEOUT)?;
        self.report.restarts += outcome.reopenings();
        if !outcome.success() {
            bail!(
                "the final run without faults failed ({}): {}",
                outcome.status,
                outcome.tail()
            );
        }
        Ok(())
    }

    /// The transaction last committed to a recovery log (0: none, or no log yet).
    fn committed(log: &Path) -> u64 {
        let Ok(text) = sluice_runtime::recovery::inspect(log) else {
            return 0;
        };
        text.lines()
            .find_map(|l| l.strip_prefix("last commit: transaction "))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Waits until the log holds a commit of transaction `txn` or later; fails if `run`
    /// exits first.
    fn await_commit(log: &Path, txn: u64, run: &mut Running) -> anyhow::Result<u64> {
        let started = Instant::now();
        loop {
            let committed = Harness::committed(log);
            if committed >= txn {
                return Ok(committed);
            }
            if let Some(status) = run.child.try_wait()? {
                bail!(
                    "{} exited ({status}) before committing transaction {txn}",
                    run.name
                );
            }
            if started.elapsed() > RUN_TIMEOUT {
                bail!("{} did not commit transaction {txn} in time", run.name);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn found(&self) -> anyhow::Result<Table> {
        Table::from_rows(&self.store.read()?.rows).map_err(anyhow::Error::msg)
    }

    /// Compares the store with the model of all the input.
    fn verify(&mut self) -> anyhow::Result<Verdict> {
        let read = self.store.read()?;
        for violation in read.violations {
            self.report.anomaly_of("output rule broken", violation);
        }
        let txn_docs = self.txn_docs as usize;
        let all = self.model.transaction_count(txn_docs);
        let expected = self.model.expected(txn_docs, self.delta, all);
        let found = Table::from_rows(&read.rows).map_err(anyhow::Error::msg)?;
        Ok(model::compare(&expected, &found))
    }

    /// How many whole transactions the store holds, if it holds exactly the first few.
    fn committed_prefix(&self) -> anyhow::Result<Option<usize>> {
        let txn_docs = self.txn_docs as usize;
        let found = self.found()?;
        Ok((0..=self.model.transaction_count(txn_docs))
            .find(|&n| self.model.expected(txn_docs, self.delta, n) == found))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    fn failed_with(stderr: &str) -> Outcome {
        Outcome {
            name: "run-0001".into(),
            status: ExitStatus::from_raw(256),
            killed: false,
            stderr: stderr.into(),
        }
    }

    #[test]
    fn only_an_error_naming_the_broker_unreachable_is_the_broker_down() {
        let kafka = "WARN source e: …; reopening in 1s\nerror: materialization m: source e: \
                     cannot read brokers 127.0.0.1:4711: Connection error: all retries \
                     failed. Source: IO Error: Connection refused (os error 111)\n";
        assert!(failed_with(kafka).names_unreachable("127.0.0.1:4711"));
        assert!(!failed_with(kafka).names_unreachable("127.0.0.1:4712"));
        let nats = "error: materialization m: source e: cannot read nats://127.0.0.1:4711 \
                    stream X: IO error: Connection refused (os error 111)\n";
        assert!(failed_with(nats).names_unreachable("127.0.0.1:4711"));
        let other = "WARN cannot read 127.0.0.1:4711: connection refused; reopening\n\
                     error: materialization m: the table holds a newer checkpoint\n";
        assert!(!failed_with(other).names_unreachable("127.0.0.1:4711"));
    }
}
