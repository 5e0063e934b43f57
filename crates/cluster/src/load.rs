//! A member's load: its process's CPU use, sampled from `/proc/self/stat` each time the
//! member publishes (`P/load/<member>`, with its lease), for the planner's check that a
//! move goes to a member no busier in CPU ([`crate::balance`]) and for `sluice shards
//! list`, which shows each member's CPU, shards and documents per second.

use crate::assign::read_view;
use crate::balance::read_load;
use crate::etcd::{Etcd, EtcdError};
use crate::keys::Keys;
use serde::Serialize;
use std::time::Instant;

/// The clock ticks per second of `/proc`'s CPU times (`USER_HZ`: 100 on every Linux
/// architecture Sluice builds for).
const TICKS_PER_SECOND: f64 = 100.0;

/// The CPU this process used between two samples.
pub struct CpuMeter {
    last: Option<(Instant, f64)>,
}

impl Default for CpuMeter {
    fn default() -> Self {
        CpuMeter {
            last: cpu_seconds_of(None).map(|cpu| (Instant::now(), cpu)),
        }
    }
}

impl CpuMeter {
    /// CPU seconds per second (cores) since the last sample; `None` without `/proc`, or
    /// when less than a second has passed.
    pub fn cores(&mut self) -> Option<f64> {
        let now = (Instant::now(), cpu_seconds_of(None)?);
        let (at, cpu) = self.last.replace(now)?;
        let elapsed = now.0.duration_since(at).as_secs_f64();
        (elapsed >= 1.0).then(|| ((now.1 - cpu) / elapsed * 100.0).round() / 100.0)
    }
}

/// The user plus system CPU seconds of process `pid` (`None`: this one), from `/proc`.
pub fn cpu_seconds_of(pid: Option<u32>) -> Option<f64> {
    let path = pid.map_or("/proc/self/stat".into(), |pid| format!("/proc/{pid}/stat"));
    cpu_seconds(&std::fs::read_to_string(path).ok()?)
}

/// The user plus system CPU seconds of a `/proc/<pid>/stat` line (fields 14 and 15,
/// counted after the command name, which may hold spaces and parentheses).
fn cpu_seconds(stat: &str) -> Option<f64> {
    let (_, after) = stat.rsplit_once(')')?;
    let mut fields = after.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some((user + system) as f64 / TICKS_PER_SECOND)
}

/// One live member as `sluice shards list` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct MemberRow {
    pub member: String,
    /// Its CPU use in cores, as it last published it.
    pub cpu: Option<f64>,
    /// The shards it holds.
    pub shards: usize,
    /// Its load: the documents per second its shards committed, as published.
    pub rate: u64,
    /// It took part in a move by load less than `cluster.balance_interval` ago.
    pub cooling: bool,
}

/// Every live member, with its CPU, shards and load.
pub async fn members(etcd: &Etcd, keys: &Keys) -> Result<Vec<MemberRow>, EtcdError> {
    let (members, _) = etcd.get_prefix(&keys.members()).await?;
    let (shards, _) = etcd.get_prefix(&keys.shards()).await?;
    let (assignments, _) = etcd.get_prefix(&keys.assignments()).await?;
    let (statuses, _) = etcd.get_prefix(&keys.statuses()).await?;
    let (loads, _) = etcd.get_prefix(&keys.loads()).await?;
    let (cooldowns, _) = etcd.get_prefix(&keys.cooldowns()).await?;
    let mut view = read_view(keys, &members, &shards, &assignments);
    read_load(keys, &mut view, &statuses, &[], &loads, &cooldowns);
    let rows = (view.members.iter())
        .map(|member| {
            let held: Vec<u64> = (view.shards.values())
                .filter(|s| s.holder.as_ref().is_some_and(|(m, _)| m == member))
                .map(|s| s.rate)
                .collect();
            MemberRow {
                member: member.clone(),
                cpu: view.cpu.get(member).copied(),
                shards: held.len(),
                rate: held.iter().sum(),
                cooling: view.cooling.contains(member),
            }
        })
        .collect();
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_seconds_are_read_after_a_command_name_with_spaces() {
        let stat = "4242 (sluice run (x)) S 1 4242 4242 0 -1 4194304 100 0 0 0 250 50 0 0";
        assert_eq!(cpu_seconds(stat), Some(3.0));
        assert_eq!(cpu_seconds("garbage"), None);
        assert!(cpu_seconds_of(None).is_some(), "this test runs on Linux");
    }
}
