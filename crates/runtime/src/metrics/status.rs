//! The status of a run, for people rather than Prometheus: each shard's state, its last
//! committed transaction (timed by phase, with its source positions), its lag, its last
//! error and a bounded history of transactions, beside the pipeline's graph. Recorded
//! through the same [`ShardMetrics`](super::ShardMetrics) handles as the metrics, and
//! served as JSON on `/api/status` with a page on `/` by the [`exporter`](super::exporter);
//! `sluice status` reads the same JSON back.

use crate::config::Pipeline;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sluice_source_sdk::Lag;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Transactions kept per shard: minutes of history at a few transactions a second.
pub const HISTORY: usize = 512;

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
    pub last_committed: Option<Transaction>,
    /// Source name → its lag, for the sources that know theirs.
    pub lag: BTreeMap<String, SourceLag>,
    /// Source name → the bytes its input system keeps for it (a replication slot's
    /// WAL), for the sources that know that.
    #[serde(default)]
    pub retained: BTreeMap<String, u64>,
    pub last_error: Option<LastError>,
    /// The last [`HISTORY`] transactions, oldest first.
    pub history: VecDeque<Transaction>,
}

/// The whole `/api/status` document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    /// Unix milliseconds when it was taken.
    pub now: u64,
    pub graph: Graph,
    pub shards: Vec<ShardView>,
}

/// The status of every shard of the process.
#[derive(Debug, Default)]
pub struct Status {
    graph: Mutex<Graph>,
    shards: Mutex<Vec<Arc<ShardStatus>>>,
}

impl Status {
    pub fn set_graph(&self, graph: Graph) {
        *lock(&self.graph) = graph;
    }

    /// A new shard, `starting`.
    pub(crate) fn shard(&self, materialization: String, shard: String) -> Arc<ShardStatus> {
        let status = Arc::new(ShardStatus(Mutex::new(ShardView {
            materialization,
            shard,
            state: State::Starting,
            since: unix_ms(SystemTime::now()),
            transactions: 0,
            documents: 0,
            last_committed: None,
            lag: BTreeMap::new(),
            retained: BTreeMap::new(),
            last_error: None,
            history: VecDeque::new(),
        })));
        lock(&self.shards).push(status.clone());
        status
    }

    pub fn snapshot(&self) -> Snapshot {
        Snapshot {
            now: unix_ms(SystemTime::now()),
            graph: lock(&self.graph).clone(),
            shards: (lock(&self.shards).iter())
                .map(|shard| lock(&shard.0).clone())
                .collect(),
        }
    }
}

/// One shard's status, written by its loop.
#[derive(Debug)]
pub(crate) struct ShardStatus(Mutex<ShardView>);

impl ShardStatus {
    pub fn enter(&self, state: State) {
        let mut view = lock(&self.0);
        if view.state != state {
            view.state = state;
            view.since = unix_ms(SystemTime::now());
        }
    }

    pub fn committed(&self, txn: Transaction) {
        let mut view = lock(&self.0);
        view.transactions += 1;
        view.documents += txn.documents;
        if view.history.len() == HISTORY {
            view.history.pop_front();
        }
        view.history.push_back(txn.clone());
        view.last_committed = Some(txn);
    }

    pub fn failed(&self, kind: &str, message: String, retried: bool) {
        self.enter(match retried {
            true => State::BackingOff,
            false => State::Failed,
        });
        lock(&self.0).last_error = Some(LastError {
            at: unix_ms(SystemTime::now()),
            kind: kind.to_string(),
            message,
            retried,
        });
    }

    pub fn lag(&self, source: &str, lag: Lag) {
        let (unit, behind) = match lag {
            Lag::Bytes(n) => ("bytes", n),
            Lag::Messages(n) => ("messages", n),
        };
        let lag = SourceLag {
            unit: unit.to_string(),
            behind,
        };
        lock(&self.0).lag.insert(source.to_string(), lag);
    }

    pub fn retained(&self, source: &str, bytes: u64) {
        lock(&self.0).retained.insert(source.to_string(), bytes);
    }
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

fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as u64)
}

/// A status is plain data: one a panicking writer left is still worth reading.
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txn(n: u64) -> Transaction {
        Transaction::durable(
            n,
            (1, 2),
            [("read", Duration::from_millis(3))],
            None,
            BTreeMap::new(),
        )
    }

    #[test]
    fn the_history_is_a_bounded_ring() {
        let status = Status::default();
        let shard = status.shard("m".into(), "00000000-ffffffff".into());
        for n in 1..=HISTORY as u64 + 10 {
            shard.committed(txn(n));
        }
        let view = &status.snapshot().shards[0];
        assert_eq!(view.history.len(), HISTORY);
        assert_eq!(view.history.front().unwrap().txn, 11);
        assert_eq!(
            view.last_committed.as_ref().unwrap().txn,
            HISTORY as u64 + 10
        );
        assert_eq!(view.transactions, HISTORY as u64 + 10);
    }

    #[test]
    fn a_failure_sets_the_state_and_the_last_error() {
        let status = Status::default();
        let shard = status.shard("m".into(), "s".into());
        assert_eq!(status.snapshot().shards[0].state, State::Starting);
        shard.failed("driver", "connection reset".into(), true);
        let view = &status.snapshot().shards[0];
        assert_eq!(view.state, State::BackingOff);
        assert_eq!(
            view.last_error.as_ref().unwrap().message,
            "connection reset"
        );
        shard.failed("driver", "gone".into(), false);
        assert_eq!(status.snapshot().shards[0].state, State::Failed);
    }

    #[test]
    fn the_snapshot_reads_back_from_its_json() {
        let status = Status::default();
        let shard = status.shard("m".into(), "s".into());
        shard.committed(txn(1));
        shard.lag("views", Lag::Messages(4));
        shard.retained("orders-cdc", 1 << 20);
        let snapshot = status.snapshot();
        let json = serde_json::to_string(&snapshot).unwrap();
        assert_eq!(serde_json::from_str::<Snapshot>(&json).unwrap(), snapshot);
        assert!(json.contains(r#""state":"starting""#), "{json}");
        assert!(
            json.contains(r#""views":{"unit":"messages","behind":4}"#),
            "{json}"
        );
        assert!(
            json.contains(r#""retained":{"orders-cdc":1048576}"#),
            "{json}"
        );
    }
}
