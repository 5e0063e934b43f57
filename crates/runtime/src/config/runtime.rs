//! `runtime:` and `cluster:`: how the pipeline runs (the recovery log, transaction
//! bounds, the combiners' memory, the timeouts of every external call, metrics) and,
//! under `cluster:`, the etcd cluster it runs in; with the reasoning behind each default.

use serde::Deserialize;
use sluice_source_sdk::config::{de_bytes, de_duration, parse};
use sluice_source_sdk::tls::{ClientTls, ServerTls};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeDef {
    /// Directory of the recovery log; defaults to `.sluice/<file stem>` beside the file.
    #[serde(default)]
    pub recovery_log: Option<PathBuf>,
    #[serde(default)]
    pub transactions: TxnBounds,
    /// What each combiner of a shard may hold before it spills to disk. A shard has up
    /// to three at once (the reader's, and the two of the committer's load phase), plus
    /// the documents the last transaction stored (kept only if they fit one budget), so
    /// its documents take at most about four times this.
    #[serde(default = "default_memory_budget", deserialize_with = "de_bytes")]
    pub memory_budget: u64,
    /// How many key-range shards a materialization runs as in this process, each with
    /// its own transactions and recovery log (`docs/pipeline.md#workers`): a number, or
    /// `auto` for the cores this process may use; 1 by default. The shards of one
    /// materialization share its `memory_budget`.
    #[serde(default)]
    pub workers: Option<Workers>,
    #[serde(default)]
    pub timeouts: Timeouts,
    /// Where to serve Prometheus metrics on `/metrics`, the status page on `/` and its
    /// JSON on `/api/status`: an address (`127.0.0.1:9464`), or `{listen, tls, token}`;
    /// none by default. `sluice run --metrics` overrides the address.
    #[serde(default)]
    pub metrics: Option<MetricsServer>,
}

/// `runtime.metrics`: where the metrics and status server listens, and, optionally, its
/// TLS and the bearer token `/metrics` and `/api` require.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(try_from = "serde_json::Value")]
pub struct MetricsServer {
    pub listen: SocketAddr,
    /// HTTPS with this certificate and key (and `client_ca`: mutual TLS).
    pub tls: Option<ServerTls>,
    /// The bearer token `/metrics` and `/api/*` require (`Authorization: Bearer …`);
    /// the status page itself asks for it.
    pub token: Option<String>,
}

/// The object form of [`MetricsServer`], as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MetricsServerDef {
    listen: SocketAddr,
    #[serde(default)]
    tls: Option<ServerTls>,
    #[serde(default)]
    token: Option<String>,
}

impl MetricsServer {
    /// Only an address.
    pub fn at(listen: SocketAddr) -> MetricsServer {
        MetricsServer {
            listen,
            tls: None,
            token: None,
        }
    }
}

impl TryFrom<serde_json::Value> for MetricsServer {
    type Error = String;

    fn try_from(value: serde_json::Value) -> Result<MetricsServer, String> {
        match value {
            serde_json::Value::String(address) => {
                address.parse().map(MetricsServer::at).map_err(|_| {
                    format!("{address:?} is not an address: write IP:port, e.g. 127.0.0.1:9464")
                })
            }
            value @ serde_json::Value::Object(_) => {
                let def: MetricsServerDef = parse(value).map_err(|e| e.to_string())?;
                if def.token.as_deref() == Some("") {
                    return Err("token: an empty token would let anyone in: set one, \
                                e.g. token: \"${STATUS_TOKEN}\""
                        .into());
                }
                Ok(MetricsServer {
                    listen: def.listen,
                    tls: def.tls,
                    token: def.token,
                })
            }
            other => Err(format!(
                "expected an address (127.0.0.1:9464) or {{listen, tls, token}}, not {other}"
            )),
        }
    }
}

impl Default for RuntimeDef {
    fn default() -> Self {
        RuntimeDef {
            recovery_log: None,
            transactions: TxnBounds::default(),
            memory_budget: default_memory_budget(),
            workers: None,
            timeouts: Timeouts::default(),
            metrics: None,
        }
    }
}

/// How long the runtime waits on an external system before it gives up on the attempt:
/// a timeout is a retryable error (the loop reopens with backoff, and recovery makes
/// the restart exact), so a hung store or source never stops the pipeline forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timeouts {
    /// Every wait on a driver: Spec, Validate and Apply; starting a Transactions
    /// stream; the driver taking a request; and its next message while it owes an
    /// answer (Opened, Acknowledged, Loaded or Prepared after Prepare, DriverCommitted).
    #[serde(default = "default_driver_timeout", deserialize_with = "de_duration")]
    pub driver: Duration,
    /// Every call to a source: seek, replay, queue.
    #[serde(default = "default_source_timeout", deserialize_with = "de_duration")]
    pub source: Duration,
}

impl Timeouts {
    /// These timeouts, with the driver's raised to outlast `longest_call`: the longest
    /// one call of the endpoint may take before its driver gives up on it by itself (an
    /// epoch sink's suggested write timeout). The runtime never gives up first.
    pub fn outlasting(self, longest_call: Option<Duration>) -> Timeouts {
        Timeouts {
            driver: self.driver.max(longest_call.unwrap_or_default()),
            ..self
        }
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            driver: default_driver_timeout(),
            source: default_source_timeout(),
        }
    }
}

/// 5 minutes. The longest healthy silence of a driver is one statement of the store:
/// the lookup of a Prepare's deferred loads before its first Loaded, the commit of a
/// transaction of `max_bytes` (256 MiB by default) before DriverCommitted. Each takes
/// seconds to a minute on a loaded server; the wait restarts at every message, so a
/// large transaction of many messages never adds up against it.
fn default_driver_timeout() -> Duration {
    Duration::from_secs(5 * 60)
}

/// 1 minute. A source call returns what it has at once (`queue` returns an empty step
/// when nothing is new), and one call reads at most a few thousand records, so only a
/// hung system takes this long.
fn default_source_timeout() -> Duration {
    Duration::from_secs(60)
}

/// `runtime.workers`: a count, or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "serde_json::Value")]
pub enum Workers {
    Count(u32),
    /// The cores the process may use.
    Auto,
}

impl TryFrom<serde_json::Value> for Workers {
    type Error = String;

    fn try_from(value: serde_json::Value) -> Result<Workers, String> {
        match &value {
            serde_json::Value::String(s) if s == "auto" => Ok(Workers::Auto),
            serde_json::Value::Number(n) => (n.as_u64())
                .and_then(|n| u32::try_from(n).ok())
                .map(Workers::Count)
                .ok_or_else(|| format!("{n} is not a number of workers")),
            _ => Err(format!(
                "expected a number of workers or `auto`, not {value}"
            )),
        }
    }
}

impl RuntimeDef {
    /// The metrics server to run: `runtime.metrics`, its address replaced by `listen`
    /// when given (`--metrics ADDR`), or only that address.
    pub fn metrics_server(&self, listen: Option<SocketAddr>) -> Option<MetricsServer> {
        match (listen, self.metrics.clone()) {
            (Some(listen), Some(server)) => Some(MetricsServer { listen, ..server }),
            (Some(listen), None) => Some(MetricsServer::at(listen)),
            (None, server) => server,
        }
    }

    /// How many shards each materialization runs as here: `workers`, where `auto` is the
    /// cores this process may use (its CPU affinity and quota: `taskset -c 0` gives one).
    pub fn workers(&self) -> u32 {
        match self.workers {
            None => 1,
            Some(Workers::Count(n)) => n,
            Some(Workers::Auto) => {
                std::thread::available_parallelism().map_or(1, |n| n.get().min(256) as u32)
            }
        }
    }
}

/// 256 MiB: room for about 430 000 keys of small (150-byte) documents per combiner.
fn default_memory_budget() -> u64 {
    256 << 20
}

/// When a transaction closes: at `max_docs`, `max_bytes` or `max_duration`, whichever
/// comes first, but not before `min_duration` (which batches a trickle of input).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TxnBounds {
    #[serde(default = "default_max_docs")]
    pub max_docs: u64,
    #[serde(default = "default_max_bytes", deserialize_with = "de_bytes")]
    pub max_bytes: u64,
    #[serde(default = "default_max_duration", deserialize_with = "de_duration")]
    pub max_duration: Duration,
    #[serde(default, deserialize_with = "de_duration")]
    pub min_duration: Duration,
}

impl Default for TxnBounds {
    fn default() -> Self {
        TxnBounds {
            max_docs: default_max_docs(),
            max_bytes: default_max_bytes(),
            max_duration: default_max_duration(),
            min_duration: Duration::ZERO,
        }
    }
}

/// 1M documents / 256 MiB / 5 s. A transaction closes early whenever the committer is
/// idle and the sources have caught up, so these bounds only matter while it is busy or
/// a backlog is read: then the reader keeps combining, and repeated keys collapse before
/// they cost a load and a store (a reduced view's whole point). A replay after a crash re-reads at most one such transaction (a few
/// seconds); the combiners spill beyond their memory budget.
fn default_max_docs() -> u64 {
    1_000_000
}
fn default_max_bytes() -> u64 {
    256 << 20
}
fn default_max_duration() -> Duration {
    Duration::from_secs(5)
}

/// `cluster:`: the etcd cluster the members coordinate through, and who this one is
/// (`docs/scale-out.md`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterDef {
    /// etcd client endpoints (`http://127.0.0.1:2379`).
    pub etcd: Vec<String>,
    /// This member's id, unique among the live members (`${HOSTNAME}` is typical).
    pub member: String,
    /// The key prefix the cluster's state lives under; defaults to
    /// `/sluice/<file stem>`.
    #[serde(default)]
    pub prefix: Option<String>,
    /// A member silent this long loses its lease, and with it its shards.
    #[serde(default = "default_lease_ttl", deserialize_with = "de_duration")]
    pub lease_ttl: Duration,
    /// How many shards (equal key ranges) a materialization starts with when the
    /// cluster first sees it; `sluice shards split` makes more later.
    #[serde(default = "default_initial_shards")]
    pub shards: u32,
    /// TLS to etcd (`https://` endpoints): the CA its certificate must chain to, and a
    /// client certificate and key when etcd runs with `--client-cert-auth`.
    #[serde(default)]
    pub tls: Option<ClientTls>,
    /// How shards are weighed when assigned: `load` (the default) moves a shard off the
    /// busiest member when it carries far more documents per second than the least
    /// busy; `count` spreads shards by rendezvous hashing alone.
    #[serde(default)]
    pub balance: Balance,
    /// Under `balance: load`, the least time between two moves that involve one member
    /// (a moved shard costs a handover, and its rate takes a while to show anew).
    #[serde(default = "default_balance_interval", deserialize_with = "de_duration")]
    pub balance_interval: Duration,
    /// Split a shard whose lag stays high on its own; none by default.
    #[serde(default)]
    pub autosplit: Option<AutoSplit>,
}

/// `cluster.balance`: what a shard weighs when the members share them out.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Balance {
    /// Every shard weighs the same: rendezvous hashing alone.
    Count,
    /// A shard weighs the documents per second its holder commits.
    #[default]
    Load,
}

/// `cluster.autosplit`: the holder of a shard whose lag stays above `lag_above` (in its
/// source's unit: bytes of a file, messages of a topic) for `for` splits it at its
/// midpoint, while the materialization has fewer than `max_shards` shards.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AutoSplit {
    pub lag_above: u64,
    #[serde(rename = "for", deserialize_with = "de_duration")]
    pub sustained: Duration,
    pub max_shards: u32,
}

fn default_lease_ttl() -> Duration {
    Duration::from_secs(10)
}

/// Long enough for a moved shard's new rate to be published (every 5 s) and settle.
fn default_balance_interval() -> Duration {
    Duration::from_secs(30)
}

fn default_initial_shards() -> u32 {
    1
}
