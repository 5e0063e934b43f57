//! The torture scenarios: each injects its faults into runs of the pipeline, checks that
//! every run ended as its fault says it must (else an anomaly), and leaves the input
//! fully committed for the final comparison.

use super::iceberg;
use super::input::SourceKind;
use super::model::Rng;
use super::server::PrivateServer;
use super::{Harness, Outcome, RUN_TIMEOUT, Scenario, TortureArgs, Transport, signal};
use anyhow::{Context, bail};
use sluice_runtime::failpoint::{self, OnReturn};
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Slows every transaction down, so that a run lasts long enough to be interfered with.
const SLOW: &str = "txn::after-prepared=sleep(150)";
/// A run of the random scenario that lasts this long hangs (runs take seconds).
const HANG: Duration = Duration::from_secs(90);
/// Faults injected by the scenarios that kill or restart something mid-run.
const MID_RUN_FAULTS: u64 = 3;

pub(super) fn run(h: &mut Harness, args: &TortureArgs, seed: u64) -> anyhow::Result<()> {
    let needs_failpoints = !matches!(args.scenario, Scenario::Random | Scenario::Cluster);
    if needs_failpoints && !h.failpoints {
        bail!(
            "this scenario needs fail points, and {} was built without them: \
             cargo build --release -p sluice --features failpoints",
            h.exe.display()
        );
    }
    if !h.failpoints {
        println!("built without fail points: SIGKILLs only");
    }
    match args.scenario {
        Scenario::Random if args.source == SourceKind::Http => {
            super::pushed::random_kills(h, args.faults, &mut Rng::new(seed ^ 0x5eed))
        }
        Scenario::Random => random(
            h,
            args.faults,
            args.maintain_every,
            &mut Rng::new(seed ^ 0x5eed),
        ),
        Scenario::Zombie => zombie(h),
        Scenario::DriverDies => driver_dies(h, args.transport),
        Scenario::ServerRestart => server_restart(h),
        Scenario::BrokerRestart => broker_restart(h, args.faults, &mut Rng::new(seed ^ 0xb0b)),
        Scenario::DiskFull => disk_full(h),
        Scenario::Cluster => super::cluster::run(h, args.faults, &mut Rng::new(seed ^ 0xc1a5)),
    }
}

/// One fault of the random scenario.
enum Fault {
    Kill(Duration),
    /// Crash (abort) at the `skip + 1`-th hit of the point.
    Crash {
        point: &'static str,
        skip: u64,
    },
    /// Fail once, at the `skip + 1`-th hit.
    Fail {
        point: &'static str,
        on_return: OnReturn,
        skip: u64,
    },
}

impl Fault {
    /// A SIGKILL (three times in ten, at a moment within `window`, how long runs
    /// last) or one of the target's fail `points` (the store's or the output's).
    fn pick(
        rng: &mut Rng,
        failpoints: bool,
        window: Duration,
        points: &[(&'static str, OnReturn)],
    ) -> Fault {
        if !failpoints || rng.below(10) < 3 {
            let window_ms = window.as_millis() as u64;
            return Fault::Kill(Duration::from_millis(10 + rng.below(window_ms.max(1))));
        }
        let (point, on_return) = points[rng.below(points.len() as u64) as usize];
        // Recovery runs once per (re)open: a later hit rarely comes.
        let skip = match point {
            failpoint::RECOVERY_AFTER_OPEN => 0,
            _ => rng.below(3),
        };
        if rng.below(3) < 2 {
            Fault::Crash { point, skip }
        } else {
            Fault::Fail {
                point,
                on_return,
                skip,
            }
        }
    }

    fn kind(&self) -> String {
        match self {
            Fault::Kill(_) => "SIGKILL".to_string(),
            Fault::Crash { point, .. } => format!("{point} crash"),
            Fault::Fail { point, .. } => format!("{point} error"),
        }
    }

    fn failpoints(&self) -> Option<String> {
        match self {
            Fault::Kill(_) => None,
            Fault::Crash { point, skip } => Some(format!("{point}={skip}*off->panic")),
            Fault::Fail { point, skip, .. } => Some(format!("{point}={skip}*off->1*return")),
        }
    }

    /// Whether the fault fired in this run, and what is wrong with its outcome if
    /// anything is.
    fn judge(&self, out: &Outcome) -> (bool, Option<String>) {
        // The runtime's points say "injected by fail point <name>" (its MARKER), an
        // output's `return` says "fail point <name>".
        let fired_point = |point: &str| out.stderr.contains(&format!("fail point {point}"));
        let expect = |ok: bool, what: &str| (!ok).then(|| what.to_string());
        match self {
            Fault::Kill(_) if out.killed => (true, None),
            Fault::Kill(_) => (
                false,
                expect(out.success(), "exited before the kill, failing"),
            ),
            Fault::Crash { point, .. } if fired_point(point) => (
                true,
                expect(!out.success(), "the crash point fired, yet it exited 0"),
            ),
            Fault::Fail {
                point,
                on_return: OnReturn::DiskFull,
                ..
            } if fired_point(point) => (
                true,
                expect(
                    !out.success() && out.stderr.contains("no space left on device"),
                    "a failed recovery-log fsync must stop the run naming the cause",
                ),
            ),
            Fault::Fail { point, .. } if fired_point(point) => (
                true,
                expect(
                    out.success(),
                    "a retryable error must be recovered in-process",
                ),
            ),
            _ => (
                false,
                expect(out.success(), "failed without its fault firing"),
            ),
        }
    }
}

/// Random fail points (crash or error) and SIGKILLs at random moments, until `faults`
/// have fired; a run that consumes all the input gets a new segment appended. With
/// `maintain_every`, `sluice maintain` runs between two runs each time that many more
/// faults have fired ([`iceberg::maintain`]).
fn random(
    h: &mut Harness,
    faults: u64,
    maintain_every: Option<u64>,
    rng: &mut Rng,
) -> anyhow::Result<()> {
    let (pipeline, _) = h.pipeline("run", &h.store.endpoint_yaml())?;
    let mut next_maintenance = maintain_every;
    let mut attempts = 0;
    let mut after_fault = false;
    // How long a run lasts by itself (moving average), so that kills land mid-run.
    let mut window = Duration::from_millis(400);
    while h.report.faults < faults {
        attempts += 1;
        if attempts > faults * 4 + 10 {
            h.report
                .anomaly(format!("only {} of {faults} faults fired", h.report.faults));
            break;
        }
        let fault = Fault::pick(rng, h.failpoints, window, &h.store.fault_points());
        let started = std::time::Instant::now();
        let run = h.run(&pipeline, fault.failpoints().as_deref())?;
        let outcome = match fault {
            Fault::Kill(delay) => run.kill_after(delay)?,
            _ => run.wait(HANG)?,
        };
        if !outcome.killed {
            window = (window * 3 + started.elapsed()) / 4;
        }
        let (fired, mut wrong) = fault.judge(&outcome);
        if outcome.killed && !matches!(fault, Fault::Kill(_)) {
            wrong = Some(format!("hung: killed after {}s", HANG.as_secs()));
        }
        h.report.armed(&fault.kind(), fired);
        h.report.restarts += outcome.reopenings() + u64::from(after_fault);
        if let Some(wrong) = wrong {
            h.report.anomaly(format!(
                "{} ({}): {wrong} ({}):\n    {}",
                outcome.name,
                fault.kind(),
                outcome.status,
                outcome.tail()
            ));
        }
        after_fault = !outcome.success();
        if outcome.success() && h.report.faults < faults {
            h.append(h.segment)?;
        }
        if let (Some(every), Some(at)) = (maintain_every, next_maintenance)
            && h.report.faults >= at
        {
            iceberg::maintain(h, &pipeline)?;
            next_maintenance = Some(h.report.faults + every);
        }
    }
    h.run_clean(&pipeline)
}

/// Two instances of one shard (same store and materialization, separate recovery
/// logs): the older one's next commit is fenced and it exits naming that.
///
/// The older instance is frozen (SIGSTOP) right after its first commit, while it waits
/// before its second transaction's loads (a fail point sleeps there), and thawed once
/// the newer one has finished: its next transaction then loads what the newer wrote,
/// and only the fence can stop its commit.
fn zombie(h: &mut Harness) -> anyhow::Result<()> {
    let endpoint = h.store.endpoint_yaml();
    let (older_pipeline, older_log) = h.pipeline("older", &endpoint)?;
    let (newer_pipeline, _) = h.pipeline("newer", &endpoint)?;
    let pause = format!("{}=1*off->sleep(1000)", failpoint::AFTER_INTENT);
    let mut older = h.run(&older_pipeline, Some(&pause))?;
    Harness::await_commit(&older_log, 1, &mut older)?;
    signal(older.child.id(), "STOP")?;
    let newer = h.run(&newer_pipeline, None)?.wait(RUN_TIMEOUT);
    signal(older.child.id(), "CONT")?;
    let (newer, older) = (newer?, older.wait(RUN_TIMEOUT)?);
    let fenced = !older.success() && older.stderr.to_lowercase().contains("fenced");
    h.report.armed("zombie (older instance)", fenced);
    if fenced {
        println!("older instance: {}", older.tail().trim());
    } else {
        h.report.anomaly(format!(
            "the older instance must exit naming \"fenced\" ({}):\n    {}",
            older.status,
            older.tail()
        ));
    }
    if !newer.success() {
        h.report.anomaly(format!(
            "the newer instance failed ({}):\n    {}",
            newer.status,
            newer.tail()
        ));
    }
    h.run_clean(&newer_pipeline)
}

/// The recovery log's fsync fails (ENOSPC) at an intent, then at a commit record: each
/// run stops with a clear error, the store holds whole transactions only, the log
/// never records a commit the store lacks; a rerun ends exact.
fn disk_full(h: &mut Harness) -> anyhow::Result<()> {
    let (pipeline, log) = h.pipeline("run", &h.store.endpoint_yaml())?;
    // Appends are Intent(1), Commit(1), Intent(2), …: skip 2 fails the second intent;
    // the rerun starts at Intent(2), so skip 3 fails a commit record.
    for skip in [2, 3] {
        let failpoints = format!("{}={skip}*off->return", failpoint::RECOVERY_FSYNC);
        let out = h.run(&pipeline, Some(&failpoints))?.wait(RUN_TIMEOUT)?;
        let clear = !out.success()
            && out.stderr.contains("recovery log")
            && out.stderr.contains("no space left on device");
        h.report.armed("recovery::fsync ENOSPC", clear);
        h.report.restarts += u64::from(skip > 2);
        if !clear {
            h.report.anomaly(format!(
                "{}: a failed fsync must stop the run naming the recovery log and the \
                 cause ({}):\n    {}",
                out.name,
                out.status,
                out.tail()
            ));
            continue;
        }
        println!("{}: {}", out.name, out.tail().trim());
        match h.committed_prefix()? {
            None => h.report.anomaly(format!(
                "{}: the store holds a partial transaction after the failure",
                out.name
            )),
            Some(stored) if Harness::committed(&log) > stored as u64 => h.report.anomaly(format!(
                "{}: the recovery log records a commit the store does not hold",
                out.name
            )),
            Some(_) => {}
        }
    }
    h.run_clean(&pipeline)
}

/// An external driver (stdio child or gRPC server) is SIGKILLed mid-run, three times:
/// the runtime reopens with backoff and carries on.
fn driver_dies(h: &mut Harness, transport: Transport) -> anyhow::Result<()> {
    let (driver, config) = h.store.driver();
    let mut server = match transport {
        Transport::Stdio => None,
        Transport::Grpc => Some(GrpcServer::start(h, driver, &config, "127.0.0.1:0")?),
    };
    let endpoint = match &server {
        None => format!(
            "command: {{program: {}, args: [driver, stdio, {driver}], config: {config}, \
             pattern: authoritative, protocol: transactions}}",
            super::yaml_str(&h.exe)
        ),
        Some(server) => format!(
            "grpc: {{address: \"{}\", config: {config}, pattern: authoritative}}",
            server.address
        ),
    };
    let (pipeline, log) = h.pipeline("run", &endpoint)?;
    let mut run = h.run(&pipeline, Some(SLOW))?;
    let mut committed = 0;
    for _ in 0..MID_RUN_FAULTS {
        committed = Harness::await_commit(&log, committed + 1, &mut run)?;
        let killed = match &mut server {
            None => kill_children(run.child.id(), "transactions")?,
            Some(server) => {
                server.child.kill()?;
                server.child.wait()?;
                let listen = server.address.trim_start_matches("grpc://").to_string();
                *server = GrpcServer::start(h, driver, &config, &listen)?;
                true
            }
        };
        h.report.armed("driver killed", killed);
    }
    let out = run.wait(RUN_TIMEOUT)?;
    h.report.restarts += out.reopenings();
    if !out.success() || out.reopenings() == 0 {
        h.report.anomaly(format!(
            "the runtime must reopen the driver and finish ({}, {} reopenings):\n    {}",
            out.status,
            out.reopenings(),
            out.tail()
        ));
    }
    h.run_clean(&pipeline)
}

/// The private server (PostgreSQL or MariaDB) is crashed and started again mid-run,
/// three times: the pipeline reconnects by itself.
fn server_restart(h: &mut Harness) -> anyhow::Result<()> {
    let (pipeline, log) = h.pipeline("run", &h.store.endpoint_yaml())?;
    let mut run = h.run(&pipeline, Some(SLOW))?;
    let mut committed = 0;
    for _ in 0..MID_RUN_FAULTS {
        committed = Harness::await_commit(&log, committed + 1, &mut run)?;
        let server = (h.server.as_mut()).context("server-restart runs on a private server")?;
        server.restart(Duration::ZERO)?;
        let restarted = format!("{} restarted", server.name());
        h.report.armed(&restarted, true);
    }
    let out = run.wait(RUN_TIMEOUT)?;
    h.report.restarts += out.reopenings();
    if !out.success() || out.reopenings() == 0 {
        h.report.anomaly(format!(
            "the pipeline must reconnect and finish ({}, {} reopenings):\n    {}",
            out.status,
            out.reopenings(),
            out.tail()
        ));
    }
    h.run_clean(&pipeline)
}

/// The private broker (tansu or nats-server) is SIGKILLed at random moments of the
/// runs and started again after a random pause, until `faults` restarts hit a running
/// pipeline. A run either rides a restart out (the runtime reopens its source with
/// backoff) or fails with an error naming the broker unreachable, and is started
/// again; any other failure is an anomaly. A run that reads all the input gets a new
/// segment appended (the broker is up then: a restart returns once it accepts
/// connections).
fn broker_restart(h: &mut Harness, faults: u64, rng: &mut Rng) -> anyhow::Result<()> {
    let (pipeline, _) = h.pipeline("run", &h.store.endpoint_yaml())?;
    let mut attempts = 0;
    while h.report.faults < faults {
        attempts += 1;
        if attempts > faults * 4 + 10 {
            h.report.anomaly(format!(
                "only {} of {faults} restarts hit a run",
                h.report.faults
            ));
            break;
        }
        let mut run = h.run(&pipeline, Some(SLOW))?;
        while h.report.faults < faults
            && !run.exits_within(Duration::from_millis(100 + rng.below(900)))?
        {
            let down = Duration::from_millis(rng.below(1_500));
            let broker = (h.input.broker()).context("broker-restart runs on a private broker")?;
            broker.restart(down)?;
            let restarted = format!("{} restarted", broker.name());
            h.report.armed(&restarted, true);
        }
        let out = run.wait(RUN_TIMEOUT)?;
        h.report.restarts += out.reopenings();
        let broker = (h.input.broker()).context("broker-restart runs on a private broker")?;
        if out.success() {
            if h.report.faults < faults {
                h.append(h.segment)?;
            }
        } else if !out.killed && out.names_unreachable(&broker.address()) {
            h.report.restarts += 1;
        } else {
            h.report.anomaly(format!(
                "{}: a run may fail only naming the broker {} unreachable ({}):\n    {}",
                out.name,
                broker.address(),
                out.status,
                out.tail()
            ));
        }
    }
    h.run_clean(&pipeline)
}

/// `sluice driver serve` as a child, and the address it printed.
struct GrpcServer {
    child: Child,
    address: String,
}

impl GrpcServer {
    fn start(
        h: &Harness,
        driver: &str,
        config: &serde_json::Value,
        listen: &str,
    ) -> anyhow::Result<GrpcServer> {
        let config_path = h.dir.join("driver-config.json");
        std::fs::write(&config_path, config.to_string())?;
        // The port of a killed server may take a moment to be free again.
        for _ in 0..50 {
            let mut child = Command::new(&h.exe)
                .args(["driver", "serve", driver, "--listen", listen, "--config"])
                .arg(&config_path)
                .env("RUST_LOG", "warn")
                .env_remove("FAILPOINTS")
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()?;
            let stdout = child.stdout.take().expect("piped");
            let mut line = String::new();
            std::io::BufReader::new(stdout).read_line(&mut line)?;
            if let Some(address) = line.trim().strip_prefix("listening on ") {
                return Ok(GrpcServer {
                    child,
                    address: address.to_string(),
                });
            }
            child.wait()?;
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("sluice driver serve did not start on {listen}")
    }
}

impl Drop for GrpcServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// SIGKILLs the children of `parent` whose command line contains `needle`; whether
/// there was one.
fn kill_children(parent: u32, needle: &str) -> anyhow::Result<bool> {
    let mut killed = false;
    for entry in std::fs::read_dir("/proc")? {
        let path = entry?.path();
        let Some(pid) = path
            .file_name()
            .and_then(|n| n.to_str()?.parse::<u32>().ok())
        else {
            continue;
        };
        let (Ok(stat), Ok(cmdline)) = (
            std::fs::read_to_string(path.join("stat")),
            std::fs::read(path.join("cmdline")),
        ) else {
            continue;
        };
        // "pid (comm) state ppid …": comm may hold spaces, so split after its ')'.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
        if ppid == Some(parent) && String::from_utf8_lossy(&cmdline).contains(needle) {
            killed |= signal(pid, "KILL").is_ok();
        }
    }
    Ok(killed)
}
