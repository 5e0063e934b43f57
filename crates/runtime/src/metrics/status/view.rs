//! The status as served (`/api/status`, and what [`ended`](super::super::ended) keeps):
//! plain data, read back by `sluice status`.

use super::unix_ms;
use crate::config::Pipeline;
use serde::{Deserialize, Serialize};
use serde_json::Value;
pub use sluice_source_sdk::HealthState;
use sluice_source_sdk::{Metric, MetricKind};
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, SystemTime};

/// The pipeline as a graph: sources feed collections, which materializations bind.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Graph {
    pub sources: Vec<SourceNode>,
    pub collections: Vec<String>,
    pub materializations: Vec<MaterializationNode>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceNode {
    pub name: String,
    /// The collection it writes to.
    pub collection: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MaterializationNode {
    pub name: String,
    /// The collections its bindings read, in binding order.
    pub collections: Vec<String>,
}

impl Graph {
    pub fn of(pipeline: &Pipeline) -> Graph {
        Graph {
            sources: (pipeline.sources.iter())
                .map(|(name, def)| SourceNode {
                    name: name.clone(),
                    collection: def.target.clone(),
                })
                .collect(),
            collections: pipeline.collections.keys().cloned().collect(),
            materializations: (pipeline.materializations.iter())
                .map(|(name, def)| MaterializationNode {
                    name: name.clone(),
                    collections: def.bindings.iter().map(|b| b.source.clone()).collect(),
                })
                .collect(),
        }
    }
}

/// A shard's loop, as the restart handling sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Opening its sources and stream, recovering.
    Starting,
    /// Recovered: reading and committing.
    Running,
    /// Running, but a source of it cannot be read and is retrying: its entry in
    /// `sources` says why. Served for a running loop, never recorded.
    Degraded,
    /// Running, with every source of it paused by the operator (`sluice pause`).
    /// Served for a running loop, never recorded.
    Paused,
    /// Failed with a retryable error; reopens after a pause.
    BackingOff,
    /// Failed for good: the run ends.
    Failed,
    /// Ended well (input exhausted, or shut down).
    Stopped,
}

/// A committed transaction, once its commit is durable in the recovery log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Transaction {
    pub txn: u64,
    /// Unix milliseconds when its commit became durable.
    pub committed_at: u64,
    pub documents: u64,
    pub bytes: u64,
    /// Milliseconds in each phase, in order (`read`, `loads`, `prepare`, `store`,
    /// `commit`, `log_commit`).
    pub phases: Vec<PhaseTime>,
    /// Milliseconds from its first document read to its durable commit.
    pub end_to_end_ms: Option<f64>,
    /// Source name → its position as committed (the recovery log's).
    pub sources: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseTime {
    pub phase: String,
    pub ms: f64,
}

/// How far a source is behind ([`Lag`]), as of its last step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceLag {
    /// `bytes` or `messages`.
    pub unit: String,
    pub behind: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LastError {
    /// Unix milliseconds.
    pub at: u64,
    /// As the metrics' `kind` label names it (`driver_timeout`, `source`, ...).
    pub kind: String,
    pub message: String,
    pub retried: bool,
}

/// A source of a shard, as the reader last saw it (or the source said, while a call
/// of its was pending).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SourceState {
    /// Opened by this attempt of the loop, or dialling its system: nothing read yet.
    Connecting,
    /// Its last step had records.
    Reading,
    /// Its last step had none, and more may come at any time.
    Idle,
    /// Its last step said it had read all there is, for now.
    CaughtUp,
    /// Its last attempt failed and is tried again, by the source itself or by the loop
    /// reopening it: `last_error` says why.
    BackingOff,
    /// The loop ended for good on its error.
    Failed,
    /// Paused by the operator (`sluice pause`): not read until resumed. Served, never
    /// recorded.
    Paused,
}

/// One source of a shard, as served.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceView {
    pub state: SourceState,
    /// Unix milliseconds when it entered `state`.
    pub since: u64,
    /// Read in transactions committed by this process (the `sluice_source_*` counters).
    pub documents: u64,
    pub bytes: u64,
    /// Rejected into its dead-letter file (`on_error: skip`), likewise.
    pub dead_lettered: u64,
    /// Documents per second it read, over the transactions of the last [`RATE_WINDOW`](super::RATE_WINDOW).
    pub rate: f64,
    /// Failed attempts to read it that were tried again: the loop reopened on its
    /// error, or it retried by itself.
    pub retries: u64,
    /// How far behind its input it is, for a source that knows.
    pub lag: Option<SourceLag>,
    /// The bytes its input system keeps for it (a replication slot's WAL), for a
    /// source that knows that.
    pub retained: Option<u64>,
    pub last_error: Option<LastError>,
    /// Healthy, unhealthy or fatal, with the reason (`sluice_source_health`): what it
    /// said through its `Health`, or what the loop saw of its calls, the worse.
    #[serde(default)]
    pub health: HealthState,
    /// Records that did not parse or that it refused (`Step::errors`), seen by this
    /// process (`sluice_source_parse_errors_total`); a step read again counts again.
    #[serde(default)]
    pub parse_errors: u64,
    /// Bytes of memory it holds, as it last said (`Source::memory`).
    #[serde(default)]
    pub memory: u64,
    /// Its own metrics, as it last said (`Source::metrics`).
    #[serde(default)]
    pub metrics: Vec<CustomMetric>,
}

/// One of a source's or an endpoint's own metrics, as served.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CustomMetric {
    pub name: String,
    pub help: String,
    pub kind: MetricKind,
    /// Beside the part's (`partition`).
    pub labels: BTreeMap<String, String>,
    pub value: u64,
}

impl From<&Metric> for CustomMetric {
    fn from(metric: &Metric) -> Self {
        CustomMetric {
            name: metric.name.to_string(),
            help: metric.help.to_string(),
            kind: metric.kind,
            labels: (metric.labels.iter())
                .map(|(key, value)| (key.to_string(), value.clone()))
                .collect(),
            value: metric.value,
        }
    }
}

/// A shard's endpoint (its materialization's driver or output), as served.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EndpointView {
    /// Healthy, unhealthy or fatal, with the reason (`sluice_endpoint_health`): what the
    /// loop saw of its driver's calls, or what the driver reported of itself, the worse.
    pub health: HealthState,
    /// Bytes of memory it holds, as it last reported (`Transactor::report`; in-process
    /// drivers only).
    #[serde(default)]
    pub memory: u64,
    /// Its own metrics, as it last reported.
    #[serde(default)]
    pub metrics: Vec<CustomMetric>,
}

/// What a shard's loop itself knows it holds in memory, in bytes, as of its last
/// transaction (`sluice_combiner_memory_bytes`); its sources' is in theirs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoopMemory {
    /// The reader's combiner when its batch closed.
    pub read_combiner: u64,
    /// The load phase's combiner when its loads ended.
    pub load_combiner: u64,
}

/// One binding of a shard, as served: what its transactions moved, committed by this
/// process (the `sluice_binding_*` counters).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BindingView {
    /// Its resource path (the table), as the metrics' `binding` label.
    pub resource: String,
    pub collection: String,
    /// Combined into it from its sources.
    pub documents: u64,
    pub loaded: u64,
    /// Stored, deletions included.
    pub stored: u64,
    pub deleted: u64,
    /// Documents per second combined into it, over the last [`RATE_WINDOW`](super::RATE_WINDOW).
    pub rate: f64,
}

/// One shard's status, as served.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShardView {
    pub materialization: String,
    /// The key range, as the metrics' `shard` label.
    pub shard: String,
    pub state: State,
    /// Unix milliseconds when it entered `state`.
    pub since: u64,
    /// Committed by this process.
    pub transactions: u64,
    pub documents: u64,
    /// Documents per second committed, over the last [`RATE_WINDOW`](super::RATE_WINDOW).
    pub rate: f64,
    /// Reopenings of the loop after a retryable error (`sluice_retries_total`).
    pub retries: u64,
    pub last_committed: Option<Transaction>,
    /// By name.
    pub sources: BTreeMap<String, SourceView>,
    /// In binding order.
    pub bindings: Vec<BindingView>,
    /// The last error of the shard: its loop's, or one a source retries by itself.
    pub last_error: Option<LastError>,
    #[serde(default)]
    pub endpoint: EndpointView,
    #[serde(default)]
    pub memory: LoopMemory,
    /// The last [`HISTORY`](super::HISTORY) transactions, oldest first.
    pub history: VecDeque<Transaction>,
}

/// The whole `/api/status` document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Unix milliseconds when it was taken.
    pub now: u64,
    /// The version of the binary serving it.
    pub version: String,
    /// Unix milliseconds when the process began recording, and how long ago.
    pub started_at: u64,
    pub uptime_ms: u64,
    /// `paused` while the operator paused every source (`sluice pause`), else `running`.
    #[serde(default)]
    pub state: crate::pause::RunState,
    /// The pipeline file as the run read it (`${ENV}` expanded), secrets hidden
    /// ([`redact_json`]); `null` until the run has it.
    pub config: Value,
    pub graph: Graph,
    pub shards: Vec<ShardView>,
}

/// What a committed transaction moved, per source and per binding of its shard, in
/// the loop's order: the counters and the status add it up.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counted {
    pub sources: Vec<SourceCount>,
    pub bindings: Vec<BindingCount>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SourceCount {
    pub docs: u64,
    pub bytes: u64,
    pub dead_lettered: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct BindingCount {
    pub combined: u64,
    pub loaded: u64,
    pub stored: u64,
    pub deleted: u64,
}

impl Transaction {
    /// Transaction `txn`, committed and durable just now, its phases timed.
    pub fn durable(
        txn: u64,
        (documents, bytes): (u64, u64),
        phases: impl IntoIterator<Item = (&'static str, Duration)>,
        end_to_end: Option<Duration>,
        sources: BTreeMap<String, Value>,
    ) -> Transaction {
        Transaction {
            txn,
            committed_at: unix_ms(SystemTime::now()),
            documents,
            bytes,
            phases: (phases.into_iter())
                .map(|(phase, took)| PhaseTime {
                    phase: phase.to_string(),
                    ms: millis(took),
                })
                .collect(),
            end_to_end_ms: end_to_end.map(millis),
            sources,
        }
    }
}

fn millis(took: Duration) -> f64 {
    took.as_secs_f64() * 1000.0
}
