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
//!
//! A source the operator paused ([`crate::pause`]) is served `paused`, unless it
//! backs off or failed; a running shard all of whose sources are paused is served
//! `paused`; the snapshot's `state` is the pipeline's (`paused` while every source is).
//!
//! Beside its state, each source and the shard's endpoint has a health
//! ([`HealthState`]: healthy, unhealthy or fatal, with the reason), kept by a
//! [`Tracker`] per part from what the part says (a source's `Health`) and what the loop
//! sees: a source's step or the endpoint's recovery and commits succeed, the error the
//! loop ends on is the part's whose call failed (unhealthy when the loop reopens, fatal
//! when the run ends). An endpoint says its health in the report it gives after each
//! commit (`Transactor::report`): unhealthy or fatal while it says so, and a report
//! that says nothing says it is well (the derived health stands); a reopened stream's
//! new instance has said nothing yet. Every change is logged once, naming the part and
//! the reason.

mod view;

pub use view::*;

use crate::pause::{Held, Pauses, pipeline_state};
use serde_json::Value;
use sluice_source_sdk::health::Tracker;
use sluice_source_sdk::redact::redact_json;
use sluice_source_sdk::{Connection, Lag, Metric};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::watch;

/// A shard's materialization and label, and each part's health code: a source's by
/// name, the endpoint's as `None`.
pub(crate) type ShardHealths = (String, String, Vec<(Option<String>, i64)>);

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
    /// The operator's pauses, which the status server changes and every shard's reader
    /// follows ([`crate::pause`]).
    pauses: Arc<Pauses>,
}

impl Default for Status {
    fn default() -> Self {
        Status {
            started_at: unix_ms(SystemTime::now()),
            graph: Mutex::default(),
            config: Mutex::default(),
            shards: Mutex::default(),
            pauses: Arc::default(),
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
                health: HealthState::Healthy,
                parse_errors: 0,
                memory: 0,
                metrics: Vec::new(),
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
            endpoint: EndpointView::default(),
            memory: LoopMemory::default(),
            history: VecDeque::new(),
        };
        let status = Arc::new(ShardStatus(Mutex::new(Recorded {
            view,
            created: now,
            health: (sources.iter())
                .map(|name| (name.clone(), Tracker::default()))
                .collect(),
            endpoint: Tracker::default(),
            sources,
            recent: VecDeque::new(),
            pauses: self.pauses.clone(),
        })));
        lock(&self.shards).push(status.clone());
        status
    }

    /// The process's pause state (`POST /api/pause`, `/api/resume`).
    pub fn pauses(&self) -> &Pauses {
        &self.pauses
    }

    /// The pipeline's sources, by name: the graph's, else every shard's.
    pub fn source_names(&self) -> Vec<String> {
        let graph = lock(&self.graph);
        if !graph.sources.is_empty() {
            return graph.sources.iter().map(|s| s.name.clone()).collect();
        }
        let mut names: Vec<String> = (lock(&self.shards).iter())
            .flat_map(|shard| lock(&shard.0).sources.clone())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// Every shard's parts' health ([`ShardStatus::healths`]).
    pub(crate) fn healths(&self) -> Vec<ShardHealths> {
        lock(&self.shards)
            .iter()
            .map(|shard| shard.healths())
            .collect()
    }

    pub fn snapshot(&self) -> Snapshot {
        let now = unix_ms(SystemTime::now());
        let held = self.pauses.held();
        let state = pipeline_state(&self.source_names(), &held);
        Snapshot {
            state,
            now,
            version: env!("CARGO_PKG_VERSION").to_string(),
            started_at: self.started_at,
            uptime_ms: now.saturating_sub(self.started_at),
            config: lock(&self.config).clone(),
            graph: lock(&self.graph).clone(),
            shards: (lock(&self.shards).iter())
                .map(|shard| show_held(shard.view_at(now), &held))
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
    /// Each source's health, by name; the view shows its state.
    health: BTreeMap<String, Tracker>,
    /// The endpoint's.
    endpoint: Tracker,
    /// The process's pauses, which its reader follows.
    pauses: Arc<Pauses>,
}

/// A view as the operator's pauses leave it: a held source `paused` (unless it backs off
/// or failed: that says more), since it was paused; a running shard all of whose sources
/// are held `paused`. Served, never recorded.
fn show_held(mut view: ShardView, held: &Held) -> ShardView {
    let mut all = !view.sources.is_empty();
    for (name, source) in view.sources.iter_mut() {
        match held.get(name) {
            Some(&since)
                if !matches!(source.state, SourceState::BackingOff | SourceState::Failed) =>
            {
                source.state = SourceState::Paused;
                source.since = since;
            }
            Some(_) => {}
            None => all = false,
        }
    }
    if all && view.state == State::Running {
        view.state = State::Paused;
        view.since = (view.sources.values())
            .map(|s| s.since)
            .max()
            .unwrap_or(view.since);
    }
    view
}

/// The part of a shard whose call failed, if one's did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part<'a> {
    Source(&'a str),
    Endpoint,
    /// Neither: the loop's own (its recovery log, a document that does not reduce).
    Loop,
}

impl Recorded {
    /// Applies `event` to source `name`'s health, showing and logging a change.
    fn source_health(
        &mut self,
        name: &str,
        event: impl FnOnce(&mut Tracker) -> Option<HealthState>,
    ) {
        let (Some(tracker), Some(source)) =
            (self.health.get_mut(name), self.view.sources.get_mut(name))
        else {
            return;
        };
        if let Some(now) = event(tracker) {
            log_health(
                &self.view.materialization,
                &self.view.shard,
                &format!("source {name}"),
                &now,
            );
            source.health = now;
        }
    }

    /// Applies `event` to the endpoint's health, likewise.
    fn endpoint_health(&mut self, event: impl FnOnce(&mut Tracker) -> Option<HealthState>) {
        if let Some(now) = event(&mut self.endpoint) {
            let view = &mut self.view;
            log_health(&view.materialization, &view.shard, "endpoint", &now);
            view.endpoint.health = now;
        }
    }
}

/// A part's health changed to `now`: said once, as a change of state (`info`). The
/// error behind an unhealthy or fatal part is logged where it happens, as a warning
/// (the loop reopens) or as the run's last line (it ends): not a second time here.
fn log_health(materialization: &str, shard: &str, part: &str, now: &HealthState) {
    match now {
        HealthState::Healthy => {
            tracing::info!(materialization, shard, "{part} is healthy");
        }
        HealthState::Unhealthy { reason } => {
            tracing::info!(materialization, shard, "{part} is unhealthy: {reason}");
        }
        HealthState::Fatal { reason } => {
            tracing::info!(materialization, shard, "{part} is fatal: {reason}");
        }
    }
}

impl ShardStatus {
    /// Follows the process's pauses (a reader of this shard).
    pub(crate) fn pauses(&self) -> watch::Receiver<Held> {
        lock(&self.0).pauses.subscribe()
    }

    /// The loop entered `state`; `running` follows its recovery, which the endpoint
    /// answered.
    pub fn enter(&self, state: State) {
        let mut recorded = lock(&self.0);
        recorded.view.enter(state);
        if state == State::Running {
            recorded.endpoint_health(Tracker::succeeded);
        }
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
        for name in recorded.sources.clone() {
            recorded.source_health(&name, Tracker::reopened);
        }
        recorded.endpoint_health(Tracker::reopened);
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
        recorded.endpoint_health(Tracker::succeeded);
    }

    /// A run of the loop failed with an error of `kind`; `retried`: it is reopened.
    /// `part`: the one whose call failed: unhealthy with the error if retried, else fatal.
    pub fn failed(&self, kind: &str, message: String, retried: bool, part: Part<'_>) {
        let mut recorded = lock(&self.0);
        match part {
            Part::Source(name) => {
                recorded.source_health(name, |t| t.failed(message.clone(), retried));
            }
            Part::Endpoint => recorded.endpoint_health(|t| t.failed(message.clone(), retried)),
            Part::Loop => {}
        }
        let source = match part {
            Part::Source(name) => Some(name),
            Part::Endpoint | Part::Loop => None,
        };
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
        recorded.source_health(name, |t| t.connection(connection.clone()));
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

    /// What source `name` said of its health outright ([`sluice_source_sdk::Health`]).
    pub fn said(&self, name: &str, state: HealthState) {
        lock(&self.0).source_health(name, |t| t.said(state));
    }

    /// Source `name`'s last step left it in `state`: its call succeeded.
    pub fn stepped(&self, name: &str, state: SourceState) {
        let mut recorded = lock(&self.0);
        if let Some(source) = recorded.view.sources.get_mut(name) {
            source.enter(state, unix_ms(SystemTime::now()));
        }
        recorded.source_health(name, Tracker::succeeded);
    }

    /// Source `name` had `n` more records that did not parse or that it refused.
    pub fn parse_errors(&self, name: &str, n: u64) {
        if let Some(source) = lock(&self.0).view.sources.get_mut(name) {
            source.parse_errors += n;
        }
    }

    /// What source `name` said it holds in memory, and its own metrics.
    pub fn sampled(&self, name: &str, memory: u64, metrics: &[Metric]) {
        if let Some(source) = lock(&self.0).view.sources.get_mut(name) {
            source.memory = memory;
            source.metrics = metrics.iter().map(CustomMetric::from).collect();
        }
    }

    /// What the endpoint reported of itself after a commit: its memory and own metrics
    /// as it says them now; its health, if it said one, else that it is well (the
    /// health derived from its calls stands).
    pub fn reported(&self, report: &sluice_driver_sdk::Report) {
        let mut recorded = lock(&self.0);
        let said = report.health.clone().unwrap_or_default();
        recorded.endpoint_health(|t| t.said(said));
        let endpoint = &mut recorded.view.endpoint;
        endpoint.memory = report.memory;
        endpoint.metrics = report.metrics.iter().map(CustomMetric::from).collect();
    }

    /// The combiner of `role` held `bytes` when it was done with.
    pub fn combiner_memory(&self, role: super::CombinerRole, bytes: u64) {
        let memory = &mut lock(&self.0).view.memory;
        match role {
            super::CombinerRole::Read => memory.read_combiner = bytes,
            super::CombinerRole::Load => memory.load_combiner = bytes,
        }
    }

    /// Each part's health, for the metrics: `(Some(source), code)` per source and
    /// `(None, code)` for the endpoint, beside the shard's labels.
    pub(crate) fn healths(&self) -> ShardHealths {
        let recorded = lock(&self.0);
        let view = &recorded.view;
        let mut parts: Vec<_> = (view.sources.iter())
            .map(|(name, source)| (Some(name.clone()), source.health.code()))
            .collect();
        parts.push((None, view.endpoint.health.code()));
        (view.materialization.clone(), view.shard.clone(), parts)
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
        shard.failed("driver", "connection reset".into(), true, Part::Endpoint);
        let view = &status.snapshot().shards[0];
        assert_eq!(view.state, State::BackingOff);
        assert_eq!(view.retries, 1);
        assert_eq!(
            view.last_error.as_ref().unwrap().message,
            "connection reset"
        );
        shard.failed("driver", "gone".into(), false, Part::Endpoint);
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
        shard.failed("source", "source a: gone".into(), true, Part::Source("a"));
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

        shard.failed(
            "source",
            "source b: corrupt".into(),
            false,
            Part::Source("b"),
        );
        let view = &status.snapshot().shards[0];
        assert_eq!(view.state, State::Failed);
        assert_eq!(view.sources["b"].state, SourceState::Failed);
        assert_eq!(view.sources["b"].retries, 0);
    }

    #[test]
    fn each_part_is_unhealthy_from_its_failure_to_its_next_success_and_fatal_at_the_end() {
        let status = Status::default();
        let shard = shard(&status);
        let health = |status: &Status| {
            let view = status.snapshot().shards[0].clone();
            let sources = view
                .sources
                .iter()
                .map(|(n, s)| (n.clone(), s.health.clone()));
            (sources.collect::<BTreeMap<_, _>>(), view.endpoint.health)
        };
        let unhealthy = |reason: &str| HealthState::Unhealthy {
            reason: reason.into(),
        };
        shard.enter(State::Running);
        assert_eq!(health(&status).1, HealthState::Healthy);

        // The endpoint: a driver failure the loop reopens for, until it recovers.
        shard.failed("driver", "connection reset".into(), true, Part::Endpoint);
        assert_eq!(health(&status).1, unhealthy("connection reset"));
        assert_eq!(
            health(&status).0["a"],
            HealthState::Healthy,
            "not its sources'"
        );
        shard.opening();
        shard.enter(State::Running);
        assert_eq!(health(&status).1, HealthState::Healthy);

        // A source: what it says, then what the loop sees, the worse.
        shard.connection(
            "a",
            Connection::Retrying {
                error: "refused".into(),
            },
        );
        assert_eq!(health(&status).0["a"], unhealthy("refused"));
        shard.stepped("a", SourceState::Reading);
        assert_eq!(health(&status).0["a"], unhealthy("refused"), "it said so");
        shard.connection("a", Connection::Connected);
        assert_eq!(health(&status).0["a"], HealthState::Healthy);
        shard.said("b", unhealthy("1 of 3 brokers down"));
        shard.failed("source", "b: reset".into(), true, Part::Source("b"));
        assert_eq!(health(&status).0["b"], unhealthy("b: reset"));
        shard.opening();
        assert_eq!(
            health(&status).0["b"],
            unhealthy("b: reset"),
            "until it reads"
        );
        shard.stepped("b", SourceState::Idle);
        assert_eq!(
            health(&status).0["b"],
            HealthState::Healthy,
            "the new instance said nothing"
        );

        // The end: fatal, and it stays.
        shard.failed(
            "input",
            "views.jsonl:3: not JSON".into(),
            false,
            Part::Source("a"),
        );
        let fatal = HealthState::Fatal {
            reason: "views.jsonl:3: not JSON".into(),
        };
        assert_eq!(health(&status).0["a"], fatal);
        shard.stepped("a", SourceState::Reading);
        assert_eq!(health(&status).0["a"], fatal);
        let json = serde_json::to_value(status.snapshot()).unwrap();
        assert_eq!(
            json["shards"][0]["sources"]["a"]["health"],
            json!({"state": "fatal", "reason": "views.jsonl:3: not JSON"})
        );
        assert_eq!(
            json["shards"][0]["endpoint"]["health"],
            json!({"state": "healthy"})
        );
    }

    #[test]
    fn an_endpoint_that_says_it_is_unhealthy_is_so_while_it_says_so() {
        use sluice_driver_sdk::Report;
        let status = Status::default();
        let shard = shard(&status);
        let endpoint = |status: &Status| status.snapshot().shards[0].endpoint.clone();
        let unhealthy = |reason: &str| HealthState::Unhealthy {
            reason: reason.into(),
        };
        let says = |health: Option<HealthState>| Report {
            memory: 4096,
            metrics: vec![Metric::counter("epochs_committed", "epochs", 2)],
            health,
        };
        shard.enter(State::Running);
        shard.reported(&says(Some(unhealthy("staging 90% full"))));
        let view = endpoint(&status);
        assert_eq!(view.health, unhealthy("staging 90% full"));
        assert_eq!(view.memory, 4096);
        assert_eq!(view.metrics[0].name, "epochs_committed");
        shard.committed(txn(1), counted(1, 0));
        assert_eq!(
            endpoint(&status).health,
            unhealthy("staging 90% full"),
            "its commits succeed, yet it says so"
        );
        // A failed call is unhealthy with its error; the worse, or else what the runtime saw.
        shard.failed("driver", "reset".into(), true, Part::Endpoint);
        assert_eq!(endpoint(&status).health, unhealthy("reset"));
        // The stream reopens: the new instance has said nothing yet.
        shard.opening();
        shard.enter(State::Running);
        assert_eq!(endpoint(&status).health, HealthState::Healthy);
        shard.reported(&says(Some(HealthState::Fatal {
            reason: "table dropped".into(),
        })));
        assert_eq!(endpoint(&status).health.code(), 2);
        // A report that says nothing ends what it said: the derived health stands.
        shard.reported(&says(None));
        assert_eq!(endpoint(&status).health, HealthState::Healthy);
        let json = serde_json::to_value(status.snapshot()).unwrap();
        assert_eq!(json["shards"][0]["endpoint"]["memory"], 4096);
        assert_eq!(
            json["shards"][0]["endpoint"]["metrics"][0]["kind"],
            "counter"
        );
    }

    #[test]
    fn parse_errors_memory_and_own_metrics_are_served_per_source() {
        let status = Status::default();
        let shard = shard(&status);
        shard.parse_errors("a", 2);
        shard.parse_errors("a", 1);
        let metric = Metric::gauge("nats_consumer_pending_messages", "pending", 9);
        shard.sampled("b", 1 << 10, &[metric.label("partition", 0)]);
        shard.combiner_memory(super::super::CombinerRole::Read, 5 << 20);
        let json = serde_json::to_value(status.snapshot()).unwrap();
        let view = &json["shards"][0];
        assert_eq!(view["sources"]["a"]["parse_errors"], 3);
        assert_eq!(view["sources"]["b"]["memory"], 1024);
        assert_eq!(
            view["sources"]["b"]["metrics"],
            json!([{"name": "nats_consumer_pending_messages", "help": "pending", "kind": "gauge",
                    "labels": {"partition": "0"}, "value": 9}])
        );
        assert_eq!(
            view["memory"],
            json!({"read_combiner": 5 << 20, "load_combiner": 0})
        );
    }

    #[test]
    fn an_end_recorded_before_health_existed_still_reads() {
        let status = Status::default();
        let shard = shard(&status);
        let mut json = serde_json::to_value(shard.view()).unwrap();
        let view = json.as_object_mut().unwrap();
        view.remove("endpoint");
        view.remove("memory");
        let a = view["sources"]["a"].as_object_mut().unwrap();
        for field in ["health", "parse_errors", "memory", "metrics"] {
            a.remove(field);
        }
        let read: ShardView = serde_json::from_value(json).unwrap();
        assert_eq!(read.sources["a"].health, HealthState::Healthy);
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
