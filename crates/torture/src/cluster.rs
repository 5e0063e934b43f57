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
//! The members must then bring the store to the model by themselves, and leave cleanly
//! on SIGTERM. The harness compares the store with the model as for every scenario.

use super::model::Rng;
use super::signal;
use super::{Harness, Running};
use anyhow::Context;
use serde_json::Value;
use sluice_testkit::etcd::PrivateEtcd;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The members' lease: short, so that a torture sees many moves.
const TTL: Duration = Duration::from_secs(3);
/// How long the members may take to bring the store to the model once the input stops.
const CONVERGE: Duration = Duration::from_secs(120);

struct Members {
    running: Vec<(String, Running)>,
    joined: u32,
}

pub(super) fn run(h: &mut Harness, faults: u64, rng: &mut Rng) -> anyhow::Result<()> {
    let mut etcd = PrivateEtcd::start();
    let (pipeline, _) = h.pipeline("cluster", &h.store.endpoint_yaml())?;
    // Shards close their own transactions: short ones, so that faults land mid-flight.
    let text = std::fs::read_to_string(&pipeline)?.replace(
        "max_duration: 600s, min_duration: 600s",
        "max_duration: 200ms",
    );
    let text = format!(
        "{text}cluster:\n  etcd: [\"{}\"]\n  member: ${{MEMBER}}\n  lease_ttl: {}s\n  shards: 3\n",
        etcd.url(),
        TTL.as_secs()
    );
    std::fs::write(&pipeline, text)?;
    let mut members = Members {
        running: Vec::new(),
        joined: 0,
    };
    for _ in 0..3 {
        members.join(h, &pipeline)?;
    }
    // The kinds take turns, so that a few faults try each; which member or shard, and
    // when, is the seed's.
    for round in 0..faults {
        h.append(h.segment)?;
        std::thread::sleep(Duration::from_millis(300 + rng.below(1200)));
        match round % 4 {
            0 => {
                let (name, mut member) = members.leave(rng);
                member.child.kill()?;
                member.child.wait()?;
                println!("killed member {name}");
                h.report.armed("cluster: member SIGKILLed", true);
                members.join(h, &pipeline)?;
            }
            1 => {
                let (name, member) = members.leave(rng);
                signal(member.child.id(), "STOP")?;
                std::thread::sleep(TTL + Duration::from_secs(2));
                signal(member.child.id(), "CONT")?;
                let outcome = member.wait(Duration::from_secs(30))?;
                let fenced = !outcome.success() && outcome.stderr.contains("fenced");
                h.report.armed("cluster: zombie past its lease", fenced);
                if !fenced {
                    h.report.anomaly_of(
                        "zombie not fenced",
                        format!(
                            "member {name}, stopped past its lease, must exit naming \"fenced\" \
                         ({}):\n    {}",
                            outcome.status,
                            outcome.tail()
                        ),
                    );
                }
                members.join(h, &pipeline)?;
            }
            2 => match split_one(h, &pipeline, rng)? {
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
            _ => {
                etcd.restart(Duration::from_secs(1));
                std::thread::sleep(Duration::from_secs(2));
                let mut died = Vec::new();
                for (at, (_, member)) in members.running.iter_mut().enumerate() {
                    if member.child.try_wait()?.is_some() {
                        died.push(at);
                    }
                }
                h.report.armed("cluster: etcd restarted", died.is_empty());
                // In place of each dead member a new one joins, as after a kill.
                for at in died.into_iter().rev() {
                    let (name, member) = members.running.swap_remove(at);
                    let outcome = member.wait(Duration::ZERO)?;
                    h.report.anomaly_of(
                        "member died on etcd restart",
                        format!(
                            "member {name} exited when etcd restarted ({}):\n    {}",
                            outcome.status,
                            outcome.tail()
                        ),
                    );
                    members.join(h, &pipeline)?;
                }
            }
        }
    }
    converge(h)?;
    for (name, member) in members.running {
        signal(member.child.id(), "TERM")?;
        let outcome = member.wait(Duration::from_secs(60))?;
        h.report.restarts += outcome.reopenings();
        if !outcome.success() {
            h.report.anomaly_of(
                "unclean leave",
                format!(
                    "member {name} did not leave cleanly on SIGTERM ({}):\n    {}",
                    outcome.status,
                    outcome.tail()
                ),
            );
        }
    }
    Ok(())
}

impl Members {
    /// Starts a member of a new id (a dead member's id stays taken until its lease ends).
    fn join(&mut self, h: &mut Harness, pipeline: &Path) -> anyhow::Result<()> {
        self.joined += 1;
        let name = format!("m{}", self.joined);
        let pipeline = pipeline.to_string_lossy().into_owned();
        let running = h.spawn_with(&["run", &pipeline], None, &[("MEMBER", &name)])?;
        self.running.push((name, running));
        Ok(())
    }

    /// Takes one member at random out of the running ones.
    fn leave(&mut self, rng: &mut Rng) -> (String, Running) {
        let at = rng.below(self.running.len() as u64) as usize;
        self.running.swap_remove(at)
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
        .output()
        .context("running sluice shards")?;
    Ok(match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        false => Err(String::from_utf8_lossy(&out.stderr).trim().to_string()),
    })
}

/// Splits a running shard picked at random; what `split` said, or why it failed.
fn split_one(
    h: &Harness,
    pipeline: &Path,
    rng: &mut Rng,
) -> anyhow::Result<Result<String, String>> {
    let list = match shards(h, pipeline, &["list", "--json"])? {
        Ok(list) => list,
        Err(why) => return Ok(Err(why)),
    };
    let rows: Vec<Value> = serde_json::from_str(&list).context("reading shards list --json")?;
    let running: Vec<&Value> = rows.iter().filter(|r| r["status"] == "running").collect();
    if running.is_empty() {
        return Ok(Err(format!("no shard is running: {list}")));
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
