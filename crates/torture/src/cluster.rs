//! The cluster scenario: three members of one pipeline (`cluster:`, on a private etcd
//! member) share its shards while the input grows, and faults land between appends, the
//! four kinds in turn:
//!
//! - a member SIGKILLed: a new member joins in its place, and the dead one's shards move
//!   once its lease expires;
//! - a member SIGSTOPped past its lease, then resumed: it must exit naming "fenced";
//! - a running shard split (`sluice shards split`), which must answer with its halves;
//! - etcd stopped and started again: every member must ride it out.
//!
//! A singleton source (`postgres_cdc`, `mysql_cdc`, `http`) makes its materialization
//! one shard that is never split: in the split's turn the split must be refused naming
//! the source, and then the shard's holder is SIGKILLed, so the one shard moves (a
//! random kill finds it one time in three). The CDC inputs' rows are written while the
//! members run. An http input's members listen each on a port of its own (a joining
//! member takes the port of the one it replaces), and the clients ([`pushed`]) post to
//! them in turn, as a load balancer would, following each 503 to the holder it names;
//! the input is all in once every body is acknowledged.
//!
//! The members must then bring the store to the model by themselves, and leave cleanly
//! on SIGTERM. The harness compares the store with the model as for every scenario.

use super::input::Input;
use super::model::Rng;
use super::pushed::{self, Clients};
use super::signal;
use super::{Harness, Running};
use anyhow::Context;
use serde_json::Value;
use sluice_testkit::etcd::PrivateEtcd;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The members' lease: short, so that a torture sees many moves.
const TTL: Duration = Duration::from_secs(3);
/// How long the members may take to bring the store to the model once the input stops
/// (and an http input's clients to have every body acknowledged).
const CONVERGE: Duration = Duration::from_secs(120);
/// How long a singleton's shard may go without a holder: a lease, a start, a recovery.
const HOLDER_WAIT: Duration = Duration::from_secs(60);
/// Members running at once.
const MEMBERS: usize = 3;

/// A member: its id, its process, and the port its http source listens on.
struct Seat {
    name: String,
    running: Running,
    port: Option<u16>,
}

struct Members {
    /// The pipeline file they run.
    pipeline: PathBuf,
    running: Vec<Seat>,
    joined: u32,
    /// An http input's ports not listened on by a running member, for those who join.
    free_ports: Vec<u16>,
}

pub(super) fn run(h: &mut Harness, faults: u64, rng: &mut Rng) -> anyhow::Result<()> {
    let mut etcd = PrivateEtcd::start();
    let (pipeline, ports) = write_pipeline(h, &etcd)?;
    let addresses: Vec<SocketAddr> = (ports.iter())
        .map(|&port| SocketAddr::from(([127, 0, 0, 1], port)))
        .collect();
    let mut members = Members {
        pipeline,
        running: Vec::new(),
        joined: 0,
        free_ports: ports,
    };
    for _ in 0..MEMBERS {
        members.join(h)?;
    }
    let mut clients = (!addresses.is_empty()).then(|| Clients::start(&addresses));
    let result = fault(h, &mut etcd, &mut members, &mut clients, faults, rng)
        .and_then(|()| converge(h))
        .and_then(|()| leave(h, members));
    if let Some(clients) = clients {
        pushed::stop(h, clients);
    }
    result
}

/// The pipeline under `cluster:` on `etcd`, with short transactions; for an http
/// input, a listen address of each member's own (`${HTTP_PORT}`) and the ports.
fn write_pipeline(h: &Harness, etcd: &PrivateEtcd) -> anyhow::Result<(PathBuf, Vec<u16>)> {
    let (pipeline, _) = h.pipeline("cluster", &h.store.endpoint_yaml())?;
    // Shards close their own transactions: short ones, so that faults land mid-flight.
    let mut text = std::fs::read_to_string(&pipeline)?.replace(
        "max_duration: 600s, min_duration: 600s",
        "max_duration: 200ms",
    );
    let mut ports = Vec::new();
    if let Input::Http { address, .. } = &h.input {
        text = text.replace(&address.to_string(), "127.0.0.1:${HTTP_PORT}");
        ports.extend((0..MEMBERS).map(|_| sluice_testkit::ports::free_port()));
    }
    let text = format!(
        "{text}cluster:\n  etcd: [\"{}\"]\n  member: ${{MEMBER}}\n  lease_ttl: {}s\n  shards: 3\n",
        etcd.url(),
        TTL.as_secs()
    );
    std::fs::write(&pipeline, text)?;
    Ok((pipeline, ports))
}

/// The kind of the input's source if it is a singleton (its materialization one shard).
fn singleton(input: &Input) -> Option<&'static str> {
    match input {
        Input::PostgresCdc { .. } | Input::MysqlCdc { .. } | Input::Http { .. } => {
            Some(input.describe())
        }
        Input::File { .. } | Input::Kafka { .. } | Input::Nats { .. } => None,
    }
}

/// Appends the input's segments and injects `faults`, the kinds in turn, so that a few
/// faults try each; which member or shard, and when, is the seed's. Then, for an http
/// input, waits until every body is acknowledged.
fn fault(
    h: &mut Harness,
    etcd: &mut PrivateEtcd,
    members: &mut Members,
    clients: &mut Option<Clients>,
    faults: u64,
    rng: &mut Rng,
) -> anyhow::Result<()> {
    let singleton = singleton(&h.input);
    let pipeline = members.pipeline.clone();
    let pipeline = pipeline.as_path();
    if let Some(clients) = clients.as_mut() {
        pushed::hand_over(h, clients);
    }
    for round in 0..faults {
        h.append(h.segment)?;
        if let Some(clients) = clients.as_mut() {
            pushed::hand_over(h, clients);
        }
        std::thread::sleep(Duration::from_millis(300 + rng.below(1200)));
        match round % 4 {
            0 => {
                let at = rng.below(members.running.len() as u64) as usize;
                let name = members.replace_killed(h, at)?;
                println!("killed member {name}");
                h.report.armed("cluster: member SIGKILLed", true);
            }
            1 => {
                let at = rng.below(members.running.len() as u64) as usize;
                let seat = members.leave(at);
                signal(seat.running.child.id(), "STOP")?;
                std::thread::sleep(TTL + Duration::from_secs(2));
                signal(seat.running.child.id(), "CONT")?;
                let outcome = seat.running.wait(Duration::from_secs(30))?;
                let fenced = !outcome.success() && outcome.stderr.contains("fenced");
                h.report.armed("cluster: zombie past its lease", fenced);
                if !fenced {
                    h.report.anomaly_of(
                        "zombie not fenced",
                        format!(
                            "member {}, stopped past its lease, must exit naming \"fenced\" \
                             ({}):\n    {}",
                            seat.name,
                            outcome.status,
                            outcome.tail()
                        ),
                    );
                }
                members.join(h)?;
            }
            2 => match singleton {
                None => match split_one(h, pipeline, rng)? {
                    Ok(said) => {
                        println!("{}", said.trim());
                        h.report.armed("cluster: shard split", true);
                    }
                    Err(why) => {
                        h.report.armed("cluster: shard split", false);
                        h.report
                            .anomaly_of("split failed", format!("a split failed: {why}"));
                    }
                },
                Some(kind) => {
                    split_refused(h, pipeline, kind)?;
                    kill_holder(h, members)?;
                }
            },
            _ => {
                etcd.restart(Duration::from_secs(1));
                std::thread::sleep(Duration::from_secs(2));
                let mut died = Vec::new();
                for (at, seat) in members.running.iter_mut().enumerate() {
                    if seat.running.child.try_wait()?.is_some() {
                        died.push(at);
                    }
                }
                h.report.armed("cluster: etcd restarted", died.is_empty());
                // In place of each dead member a new one joins, as after a kill.
                for at in died.into_iter().rev() {
                    let seat = members.leave(at);
                    let outcome = seat.running.wait(Duration::ZERO)?;
                    h.report.anomaly_of(
                        "member died on etcd restart",
                        format!(
                            "member {} exited when etcd restarted ({}):\n    {}",
                            seat.name,
                            outcome.status,
                            outcome.tail()
                        ),
                    );
                    members.join(h)?;
                }
            }
        }
    }
    if let Some(clients) = clients {
        let started = Instant::now();
        while !clients.all_acknowledged() {
            if started.elapsed() > CONVERGE {
                h.report.anomaly_of(
                    "bodies not acknowledged",
                    format!(
                        "the clients' bodies were not all acknowledged within {}s of the last \
                         append",
                        CONVERGE.as_secs()
                    ),
                );
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    Ok(())
}

/// Stops every member by SIGTERM: each must leave cleanly.
fn leave(h: &mut Harness, members: Members) -> anyhow::Result<()> {
    for seat in members.running {
        signal(seat.running.child.id(), "TERM")?;
        let outcome = seat.running.wait(Duration::from_secs(60))?;
        h.report.restarts += outcome.reopenings();
        if !outcome.success() {
            h.report.anomaly_of(
                "unclean leave",
                format!(
                    "member {} did not leave cleanly on SIGTERM ({}):\n    {}",
                    seat.name,
                    outcome.status,
                    outcome.tail()
                ),
            );
        }
    }
    Ok(())
}

impl Members {
    /// Starts a member of a new id (a dead member's id stays taken until its lease ends),
    /// on a free port for an http input.
    fn join(&mut self, h: &mut Harness) -> anyhow::Result<()> {
        self.joined += 1;
        let name = format!("m{}", self.joined);
        let pipeline = self.pipeline.to_string_lossy().into_owned();
        let port = self.free_ports.pop();
        let http_port = port.map(|p| p.to_string());
        let mut env = vec![("MEMBER", name.as_str())];
        env.extend(http_port.as_deref().map(|port| ("HTTP_PORT", port)));
        let running = h.spawn_with(&["run", &pipeline], None, &env)?;
        self.running.push(Seat {
            name,
            running,
            port,
        });
        Ok(())
    }

    /// Takes member `at` out of the running ones; its port is free once it has exited.
    fn leave(&mut self, at: usize) -> Seat {
        let seat = self.running.swap_remove(at);
        self.free_ports.extend(seat.port);
        seat
    }

    /// SIGKILLs member `at` and starts a new one in its place; the dead one's name.
    fn replace_killed(&mut self, h: &mut Harness, at: usize) -> anyhow::Result<String> {
        let mut seat = self.leave(at);
        seat.running.child.kill()?;
        seat.running.child.wait()?;
        self.join(h)?;
        Ok(seat.name)
    }
}

/// `sluice shards <args>` of the pipeline; its stdout, or why it failed.
fn shards(h: &Harness, pipeline: &Path, args: &[&str]) -> anyhow::Result<Result<String, String>> {
    let out = Command::new(&h.exe)
        .arg("shards")
        .arg(args[0])
        .arg(pipeline)
        .args(&args[1..])
        .env("MEMBER", "torture")
        // An http input's listen address: any port will do for `sluice shards`.
        .env("HTTP_PORT", "1")
        .output()
        .context("running sluice shards")?;
    Ok(match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        false => Err(String::from_utf8_lossy(&out.stderr).trim().to_string()),
    })
}

/// The shards as `sluice shards list --json` shows them, or why it failed.
fn list(h: &Harness, pipeline: &Path) -> anyhow::Result<Result<Vec<Value>, String>> {
    Ok(match shards(h, pipeline, &["list", "--json"])? {
        Ok(list) => Ok(serde_json::from_str(&list).context("reading shards list --json")?),
        Err(why) => Err(why),
    })
}

/// Splits a running shard picked at random; what `split` said, or why it failed.
fn split_one(
    h: &Harness,
    pipeline: &Path,
    rng: &mut Rng,
) -> anyhow::Result<Result<String, String>> {
    let rows = match list(h, pipeline)? {
        Ok(rows) => rows,
        Err(why) => return Ok(Err(why)),
    };
    let running: Vec<&Value> = rows.iter().filter(|r| r["status"] == "running").collect();
    if running.is_empty() {
        return Ok(Err(format!("no shard is running: {rows:?}")));
    }
    let row = running[rng.below(running.len() as u64) as usize];
    let (materialization, shard) = (
        row["materialization"].as_str().unwrap_or_default(),
        row["shard"].as_str().unwrap_or_default(),
    );
    shards(
        h,
        pipeline,
        &["split", materialization, shard, "--wait", "60"],
    )
}

/// Asks to split the one shard of a singleton source of `kind`: the split must be
/// refused naming the source.
fn split_refused(h: &mut Harness, pipeline: &Path, kind: &str) -> anyhow::Result<()> {
    let named = format!("(a {kind} source)");
    let split = ["split", "torture", "00000000-ffffffff", "--wait", "60"];
    let refused = match shards(h, pipeline, &split)? {
        Err(why) if why.contains(&named) => true,
        Err(why) => {
            let why = format!("the split of a {kind} source's shard failed otherwise: {why}");
            h.report.anomaly_of("split failed", why);
            false
        }
        Ok(said) => {
            let said = format!("the shard of a {kind} source was split: {}", said.trim());
            h.report.anomaly_of("singleton split", said);
            false
        }
    };
    h.report
        .armed("cluster: split refused (one shard)", refused);
    Ok(())
}

/// SIGKILLs the member holding the one shard of a singleton source, once one does, and
/// starts a new member in its place.
fn kill_holder(h: &mut Harness, members: &mut Members) -> anyhow::Result<()> {
    let started = Instant::now();
    let at = loop {
        let rows = list(h, &members.pipeline)?.unwrap_or_default();
        let holder = (rows.iter())
            .filter(|r| r["status"] == "running")
            .find_map(|r| {
                let member = r["member"].as_str()?;
                members.running.iter().position(|seat| seat.name == member)
            });
        if let Some(at) = holder {
            break Some(at);
        }
        if started.elapsed() > HOLDER_WAIT {
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    h.report.armed("cluster: holder SIGKILLed", at.is_some());
    match at {
        Some(at) => {
            let name = members.replace_killed(h, at)?;
            println!("killed member {name}, the holder");
        }
        None => h.report.anomaly_of(
            "no holder",
            format!(
                "no member ran the singleton's shard within {}s",
                HOLDER_WAIT.as_secs()
            ),
        ),
    }
    Ok(())
}

/// Waits until the store equals the model of all the input.
fn converge(h: &mut Harness) -> anyhow::Result<()> {
    let txn_docs = h.txn_docs as usize;
    let all = h.model.transaction_count(txn_docs);
    let expected = h.model.expected(txn_docs, false, all);
    let started = Instant::now();
    while started.elapsed() < CONVERGE {
        if h.found()? == expected {
            println!(
                "the members reached the model in {:.1}s",
                started.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    h.report.anomaly_of(
        "no convergence",
        format!(
            "the members did not reach the model within {}s of the last append",
            CONVERGE.as_secs()
        ),
    );
    Ok(())
}
