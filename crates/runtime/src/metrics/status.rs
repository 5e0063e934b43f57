//! The status of a run, for people rather than Prometheus: each shard's state, its last
//! committed transaction (timed by phase, with its source positions), its last error and
//! a bounded history of transactions; per source its state, its own last error, counts,
//! rate and lag; per binding its counts and rate; beside the pipeline's graph, the
//! binary's version, the uptime and the configuration with its secrets hidden. Recorded
//! through the same [`ShardMetrics`](super::ShardMetrics) handles as the metrics, and
//! served as JSON on `/api/status` with a page on `/` by the exporter (`exporter.rs`);
//! `sluice status` reads the same JSON back, and what a loop left when it ended
//! (`ended.rs`) once the process is gone. That JSON is the plain data of
//! `status/view.rs`; this file records it.
//!
//! A source's state is what the reader last saw of it (its steps, the error the loop
//! ended on), unless the source says otherwise while a call of its is pending
//! ([`Health`](sluice_source_sdk::Health): a client backing off inside it). A shard whose
//! loop runs while a source of it backs off is served as `degraded`, never `running`:
//!
//! ```text
//!  source:  connecting ──step──▶ reading | idle | caught_up
//!              │  ▲                  │
//!              │  └── loop reopens ──┤ (a source that was not the failure's)
//!              └──▶ backing_off ◀────┘ its own retry, or the loop's error was its ──▶ failed
//!                     └── a step, or the source connected ──▶ reading | idle | caught_up
//!  shard:   starting ──▶ running ⇄ degraded (a source backing off) ──▶ backing_off ──▶ … ──▶ stopped | failed
//! ```

mod view;

pub use view::*;

use serde_json::Value;
use sluice_source_sdk::redact::redact_json;
use sluice_source_sdk::{Connection, Lag};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Transactions kept per shard: minutes of history at a few transactions a second.
pub const HISTORY: usize = 512;

/// The rates are of what committed in the last minute: several transactions even at
/// the longest default batch (`max_duration`, 5 s), steady enough to read.
pub const RATE_WINDOW: Duration = Duration::from_secs(60);

/// The status of every shard of the process.
#[derive(Debug)]
pub struct Status {
    started_at: u64,
    graph: Mutex<Graph>,
    config: Mutex<Value>,
    shards: Mutex<Vec<Arc<ShardStatus>>>,
}

impl Default for Status {
    fn default() -> Self {
        Status {
            started_at: unix_ms(SystemTime::now()),
            graph: Mutex::default(),
            config: Mutex::default(),
            shards: Mutex::default(),
        }
    }
}

impl Status {
    pub fn set_graph(&self, graph: Graph) {
        *lock(&self.graph) = graph;
    }

    /// The pipeline file's tree (`${ENV}` expanded): served with its secrets hidden.
    pub fn set_config(&self, config: &Value) {
        *lock(&self.config) = redact_json(config);
    }

    /// A new shard, `starting`, reading `sources` (names, in the loop's order) into
    /// `bindings` (resource path and collection, in binding order).
    pub(crate) fn shard(
        &self,
        materialization: String,
        shard: String,
        sources: Vec<String>,
        bindings: Vec<(String, String)>,
    ) -> Arc<ShardStatus> {
        let now = unix_ms(SystemTime::now());
        let source = |name: &String| {
            let view = SourceView {
                state: SourceState::Connecting,
                since: now,
                documents: 0,
                bytes: 0,
                dead_lettered: 0,
                rate: 0.0,
                retries: 0,
                lag: None,
                retained: None,
                last_error: None,
            };
            (name.clone(), view)
        };
        let binding = |(resource, collection)| BindingView {
            resource,
            collection,
            documents: 0,
            loaded: 0,
            stored: 0,
            deleted: 0,
            rate: 0.0,
        };
        let view = ShardView {
            materialization,
            shard,
            state: State::Starting,
            since: now,
            transactions: 0,
            documents: 0,
            rate: 0.0,
            retries: 0,
            last_committed: None,
            sources: sources.iter().map(source).collect(),
            bindings: bindings.into_iter().map(binding).collect(),
            last_error: None,
            history: VecDeque::new(),
        };
        let status = Arc::new(ShardStatus(Mutex::new(Recorded {
            view,
            created: now,
            sources,
            recent: VecDeque::new(),
        })));
        lock(&self.shards).push(status.clone());
        status
    }

    pub fn snapshot(&self) -> Snapshot {
        let now = unix_ms(SystemTime::now());
        Snapshot {
            now,
            version: env!("CARGO_PKG_VERSION").to_string(),
            started_at: self.started_at,
            uptime_ms: now.saturating_sub(self.started_at),
            config: lock(&self.config).clone(),
            graph: lock(&self.graph).clone(),
            shards: (lock(&self.shards).iter())
                .map(|shard| shard.view_at(now))
                .collect(),
        }
    }
}

/// One shard's status, written by its loop.
#[derive(Debug)]
pub(crate) struct ShardStatus(Mutex<Recorded>);

/// What a shard's status keeps: its view, and what its rates are computed from.
#[derive(Debug)]
struct Recorded {
    view: ShardView,
    /// Unix milliseconds when the shard was first started.
    created: u64,
    /// Its sources' names, in the loop's order ([`Counted::sources`]).
    sources: Vec<String>,
    /// The transactions committed in the last [`RATE_WINDOW`], oldest first.
    recent: VecDeque<(u64, Counted)>,
}

impl ShardStatus {
    pub fn enter(&self, state: State) {
        lock(&self.0).view.enter(state);
    }

    /// The view served now ([`ShardStatus::view_at`]).
    pub fn view(&self) -> ShardView {
        self.view_at(unix_ms(SystemTime::now()))
    }

    /// The view served at `now`: rates over the [`RATE_WINDOW`] ending then, and
    /// `degraded` for a running loop with a source backing off.
    fn view_at(&self, now: u64) -> ShardView {
        let recorded = lock(&self.0);
        let mut view = recorded.view.clone();
        let age = now.saturating_sub(recorded.created);
        let counted = || (recorded.recent.iter()).filter(|(at, _)| in_window(*at, now));
        let per_s = |n: u64| rate(n, age);
        let source_docs = |i: usize| {
            counted()
                .filter_map(move |(_, c)| c.sources.get(i))
                .map(|s| s.docs)
        };
        view.rate = per_s((0..recorded.sources.len()).flat_map(source_docs).sum());
        for (i, name) in recorded.sources.iter().enumerate() {
            if let Some(source) = view.sources.get_mut(name) {
                source.rate = per_s(source_docs(i).sum());
            }
        }
        for (i, binding) in view.bindings.iter_mut().enumerate() {
            let combined = counted().filter_map(|(_, c)| c.bindings.get(i));
            binding.rate = per_s(combined.map(|b| b.combined).sum());
        }
        let backing_off = (view.sources.values())
            .filter(|s| s.state == SourceState::BackingOff)
            .map(|s| s.since)
            .max();
        if let (State::Running, Some(since)) = (view.state, backing_off) {
            view.state = State::Degraded;
            view.since = view.since.max(since);
        }
        view
    }

    /// A new attempt of the loop opens its sources: each is connecting, but one whose
    /// failure the loop reopens for, which backs off until it reads again.
    pub fn opening(&self) {
        let mut recorded = lock(&self.0);
        let now = unix_ms(SystemTime::now());
        for source in recorded.view.sources.values_mut() {
            if source.state != SourceState::BackingOff {
                source.enter(SourceState::Connecting, now);
            }
        }
    }

    /// Transaction `txn` is durable; `counted` is what it moved.
    pub fn committed(&self, txn: Transaction, counted: Counted) {
        let mut recorded = lock(&self.0);
        let Recorded {
            view,
            sources,
            recent,
            ..
        } = &mut *recorded;
        view.transactions += 1;
        view.documents += txn.documents;
        for (name, count) in sources.iter().zip(&counted.sources) {
            if let Some(source) = view.sources.get_mut(name) {
                source.documents += count.docs;
                source.bytes += count.bytes;
                source.dead_lettered += count.dead_lettered;
            }
        }
        for (binding, count) in view.bindings.iter_mut().zip(&counted.bindings) {
            binding.documents += count.combined;
            binding.loaded += count.loaded;
            binding.stored += count.stored;
            binding.deleted += count.deleted;
        }
        let at = txn.committed_at;
        while recent
            .front()
            .is_some_and(|(then, _)| !in_window(*then, at))
        {
            recent.pop_front();
        }
        recent.push_back((at, counted));
        if view.history.len() == HISTORY {
            view.history.pop_front();
        }
        view.history.push_back(txn.clone());
        view.last_committed = Some(txn);
    }

    /// A run of the loop failed with an error of `kind`; `retried`: it is reopened.
    /// `source`: the source whose call failed, if one did.
    pub fn failed(&self, kind: &str, message: String, retried: bool, source: Option<&str>) {
        let mut recorded = lock(&self.0);
        let view = &mut recorded.view;
        let (state, source_state) = match retried {
            true => (State::BackingOff, SourceState::BackingOff),
            false => (State::Failed, SourceState::Failed),
        };
        view.enter(state);
        view.retries += u64::from(retried);
        let error = LastError::now(kind, message, retried);
        if let Some(source) = source.and_then(|name| view.sources.get_mut(name)) {
            source.enter(source_state, error.at);
            source.retries += u64::from(retried);
            source.last_error = Some(error.clone());
        }
        view.last_error = Some(error);
    }

    /// What source `name` said of its connection ([`sluice_source_sdk::Health`]).
    pub fn connection(&self, name: &str, connection: Connection) {
        let mut recorded = lock(&self.0);
        let view = &mut recorded.view;
        let Some(source) = view.sources.get_mut(name) else {
            return;
        };
        let now = unix_ms(SystemTime::now());
        match connection {
            // Dialling again after failures is still backing off, since the first.
            Connection::Connecting if source.state == SourceState::BackingOff => {}
            Connection::Connecting => source.enter(SourceState::Connecting, now),
            Connection::Retrying { error } => {
                source.enter(SourceState::BackingOff, now);
                source.retries += 1;
                let error = LastError::now("source", error, true);
                source.last_error = Some(error.clone());
                view.last_error = Some(error);
            }
            Connection::Connected => {
                if matches!(
                    source.state,
                    SourceState::Connecting | SourceState::BackingOff
                ) {
                    source.enter(SourceState::Idle, now);
                }
            }
        }
    }

    /// Source `name`'s last step left it in `state`.
    pub fn stepped(&self, name: &str, state: SourceState) {
        if let Some(source) = lock(&self.0).view.sources.get_mut(name) {
            source.enter(state, unix_ms(SystemTime::now()));
        }
    }

    pub fn lag(&self, source: &str, lag: Lag) {
        let (unit, behind) = match lag {
            Lag::Bytes(n) => ("bytes", n),
            Lag::Messages(n) => ("messages", n),
        };
        if let Some(source) = lock(&self.0).view.sources.get_mut(source) {
            source.lag = Some(SourceLag {
                unit: unit.to_string(),
                behind,
            });
        }
    }

    pub fn retained(&self, source: &str, bytes: u64) {
        if let Some(source) = lock(&self.0).view.sources.get_mut(source) {
            source.retained = Some(bytes);
        }
    }
}

impl SourceView {
    fn enter(&mut self, state: SourceState, at: u64) {
        if self.state != state {
            self.state = state;
            self.since = at;
        }
    }
}

impl ShardView {
    fn enter(&mut self, state: State) {
        if self.state != state {
            self.state = state;
            self.since = unix_ms(SystemTime::now());
        }
    }
}

impl LastError {
    fn now(kind: &str, message: String, retried: bool) -> LastError {
        LastError {
            at: unix_ms(SystemTime::now()),
            kind: kind.to_string(),
            message,
            retried,
        }
    }
}

/// Whether a commit at `at` lies in the [`RATE_WINDOW`] ending at `now`.
fn in_window(at: u64, now: u64) -> bool {
    now.saturating_sub(at) < RATE_WINDOW.as_millis() as u64
}

/// `n` over the [`RATE_WINDOW`] as a rate per second, for a shard started `age`
/// milliseconds ago: a shard younger than the window divides by its age (at least a
/// second), so its first minute does not read low.
fn rate(n: u64, age: u64) -> f64 {
    let window = age.clamp(1000, RATE_WINDOW.as_millis() as u64);
    n as f64 * 1000.0 / window as f64
}

pub(super) fn unix_ms(at: SystemTime) -> u64 {
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
    use serde_json::json;
    use std::collections::BTreeMap;

    fn txn(n: u64) -> Transaction {
        Transaction::durable(
            n,
            (1, 2),
            [("read", Duration::from_millis(3))],
            None,
            BTreeMap::new(),
        )
    }

    /// A shard reading sources `a` and `b` into one binding.
    fn shard(status: &Status) -> Arc<ShardStatus> {
        let sources = vec!["a".to_string(), "b".to_string()];
        let bindings = vec![("views".to_string(), "acme/views".to_string())];
        status.shard("m".into(), "s".into(), sources, bindings)
    }

    fn counted(a: u64, b: u64) -> Counted {
        let source = |docs| SourceCount {
            docs,
            bytes: docs * 10,
            dead_lettered: 0,
        };
        Counted {
            sources: vec![source(a), source(b)],
            bindings: vec![BindingCount {
                combined: a + b,
                loaded: 1,
                stored: a + b,
                deleted: 0,
            }],
        }
    }

    #[test]
    fn the_history_is_a_bounded_ring() {
        let status = Status::default();
        let shard = shard(&status);
        for n in 1..=HISTORY as u64 + 10 {
            shard.committed(txn(n), counted(1, 0));
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
        let shard = shard(&status);
        assert_eq!(status.snapshot().shards[0].state, State::Starting);
        shard.failed("driver", "connection reset".into(), true, None);
        let view = &status.snapshot().shards[0];
        assert_eq!(view.state, State::BackingOff);
        assert_eq!(view.retries, 1);
        assert_eq!(
            view.last_error.as_ref().unwrap().message,
            "connection reset"
        );
        shard.failed("driver", "gone".into(), false, None);
        assert_eq!(status.snapshot().shards[0].state, State::Failed);
        assert_eq!(status.snapshot().shards[0].retries, 1);
    }

    #[test]
    fn a_source_backing_off_by_itself_degrades_its_running_shard() {
        let status = Status::default();
        let shard = shard(&status);
        shard.enter(State::Running);
        shard.stepped("b", SourceState::Reading);
        shard.connection("a", Connection::Connecting);
        assert_eq!(status.snapshot().shards[0].state, State::Running);

        let refused = "cannot read brokers 127.0.0.1:1: connection refused";
        shard.connection(
            "a",
            Connection::Retrying {
                error: refused.into(),
            },
        );
        let since = status.snapshot().shards[0].sources["a"].since;
        shard.connection("a", Connection::Connecting);
        let view = &status.snapshot().shards[0];
        assert_eq!(
            view.sources["a"].since, since,
            "dialling again is backing off"
        );
        assert_eq!(view.state, State::Degraded);
        let a = &view.sources["a"];
        assert_eq!(a.state, SourceState::BackingOff);
        assert_eq!(a.retries, 1);
        assert_eq!(a.last_error.as_ref().unwrap().message, refused);
        assert_eq!(view.last_error, a.last_error, "the shard names it too");
        assert_eq!(view.sources["b"].state, SourceState::Reading);

        shard.connection("a", Connection::Connected);
        let view = &status.snapshot().shards[0];
        assert_eq!(view.state, State::Running);
        assert_eq!(view.sources["a"].state, SourceState::Idle);
        assert_eq!(
            view.sources["a"].last_error.as_ref().unwrap().message,
            refused,
            "the last error stays, with its time"
        );
    }

    #[test]
    fn a_loop_error_is_its_sources_until_that_source_reads_again() {
        let status = Status::default();
        let shard = shard(&status);
        shard.enter(State::Running);
        shard.stepped("a", SourceState::Reading);
        shard.stepped("b", SourceState::CaughtUp);
        shard.failed("source", "source a: gone".into(), true, Some("a"));
        let view = &status.snapshot().shards[0];
        assert_eq!(view.state, State::BackingOff);
        assert_eq!(view.sources["a"].state, SourceState::BackingOff);
        assert_eq!(view.sources["a"].retries, 1);
        assert_eq!(view.sources["b"].state, SourceState::CaughtUp);
        assert_eq!(view.sources["b"].last_error, None);

        // The loop reopens: the failed source backs off until it reads.
        shard.opening();
        shard.enter(State::Running);
        let view = &status.snapshot().shards[0];
        assert_eq!(view.state, State::Degraded);
        assert_eq!(view.sources["a"].state, SourceState::BackingOff);
        assert_eq!(view.sources["b"].state, SourceState::Connecting);
        shard.stepped("a", SourceState::Reading);
        assert_eq!(status.snapshot().shards[0].state, State::Running);

        shard.failed("source", "source b: corrupt".into(), false, Some("b"));
        let view = &status.snapshot().shards[0];
        assert_eq!(view.state, State::Failed);
        assert_eq!(view.sources["b"].state, SourceState::Failed);
        assert_eq!(view.sources["b"].retries, 0);
    }

    #[test]
    fn rates_count_what_committed_in_the_last_window() {
        let status = Status::default();
        let shard = shard(&status);
        let created = lock(&shard.0).created;
        for (at, docs) in [(1_000, 30), (4_000, 20)] {
            let mut txn = txn(1);
            txn.committed_at = created + at;
            shard.committed(txn, counted(docs, 5));
        }
        // Five seconds old: the first minute divides by the age.
        let view = shard.view_at(created + 5_000);
        assert_eq!(view.sources["a"].rate, 10.0);
        assert_eq!(view.sources["b"].rate, 2.0);
        assert_eq!(view.bindings[0].rate, 12.0);
        assert_eq!(view.rate, 12.0);
        assert_eq!(
            (view.sources["a"].documents, view.sources["a"].bytes),
            (50, 500)
        );
        assert_eq!(view.bindings[0].documents, 60);
        assert_eq!(view.bindings[0].loaded, 2);
        // Past the window: only the second commit counts, over the whole window.
        let window = RATE_WINDOW.as_millis() as u64;
        let view = shard.view_at(created + 2_000 + window);
        assert_eq!(view.sources["a"].rate, 20.0 * 1000.0 / window as f64);
        assert_eq!(shard.view_at(created + 10 * window).rate, 0.0);
        assert_eq!(rate(7, 0), 7.0, "never divided by less than a second");
    }

    #[test]
    fn the_snapshot_has_the_version_the_uptime_and_the_config_redacted() {
        let status = Status::default();
        status.set_config(&json!({
            "materializations": {"db": {"endpoint": {"postgres": {
                "url": "postgres://app:s3cret@db/sales", "password": "s3cret"}}}},
        }));
        let snapshot = status.snapshot();
        assert_eq!(snapshot.version, env!("CARGO_PKG_VERSION"));
        assert_eq!(snapshot.uptime_ms, snapshot.now - snapshot.started_at);
        let config = snapshot.config.to_string();
        assert!(!config.contains("s3cret"), "{config}");
        assert!(config.contains("postgres://app:***@db/sales"), "{config}");
    }

    #[test]
    fn the_snapshot_reads_back_from_its_json() {
        let status = Status::default();
        let shard = shard(&status);
        shard.committed(txn(1), counted(1, 0));
        shard.lag("a", Lag::Messages(4));
        shard.retained("b", 1 << 20);
        let snapshot = status.snapshot();
        let json = serde_json::to_value(&snapshot).unwrap();
        assert_eq!(
            serde_json::from_value::<Snapshot>(json.clone()).unwrap(),
            snapshot
        );
        let view = &json["shards"][0];
        assert_eq!(view["state"], "starting");
        assert_eq!(view["sources"]["a"]["state"], "connecting");
        assert_eq!(
            view["sources"]["a"]["lag"],
            json!({"unit": "messages", "behind": 4})
        );
        assert_eq!(view["sources"]["b"]["retained"], 1 << 20);
        assert_eq!(view["bindings"][0]["resource"], "views");
        assert_eq!(view["bindings"][0]["collection"], "acme/views");
    }
}
