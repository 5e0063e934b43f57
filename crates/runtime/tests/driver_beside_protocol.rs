//! What an in-process driver tells the runtime beside the protocol.
//!
//! The driver's state across Apply and Open: Apply is told the spec applied last and
//! the driver checkpoint the recovery log holds, and its Applied state
//! (`ApplyResponse.driver_checkpoint`) is recorded in the recovery log with the apply,
//! so the next Open carries it and every commit after it keeps it.
//!
//! Its commits' states (`DriverCommitted`, Flow's StartedCommit state: transactional)
//! are recorded with each commit, and its acknowledgements' states (`Acknowledged`: not
//! transactional) with the next commit.
//!
//! What it reports of itself (`Transactor::report`, asked after each transaction it
//! commits) reaches the run's metrics and status: the memory it holds
//! (`sluice_endpoint_memory_bytes`), its own metrics (`sluice_endpoint_custom…`) and its
//! health, which it says is unhealthy while every call of it succeeds: what it says
//! wins over what the runtime sees, and is shown with its reason.
//!
//! A crash after the driver committed a transaction and before the recovery log did
//! loses that commit's state (it was to be recorded with the log's commit, which never
//! happened), while the transaction itself is adopted from the store: nothing doubled,
//! and the state the next Open carries is the log's, whole.
//!
//! The driver is the memory driver, wrapped by one that records what it is asked,
//! answers each Apply, commit and acknowledgement with a state, and reports.

mod common;

use async_trait::async_trait;
use common::Connector;
use serde_json::{Value, json};
use sluice_driver_sdk::inprocess::InProcess;
use sluice_driver_sdk::materialize as m;
use sluice_driver_sdk::materialize::transaction_request::{Load, Open, Prepare, Store};
use sluice_driver_sdk::materialize::transaction_response::Opened;
use sluice_driver_sdk::{
    Declared, Driver, HealthState, LoadedSink, Metric, PriorState, Report, Result, Transactor, flow,
};
use sluice_file::FileKind;
use sluice_memory::MemoryDriver;
use sluice_runtime::config::Pipeline;
use sluice_runtime::metrics::Metrics;
use sluice_runtime::pipeline::{self, ApplyAction, RunOptions};
use sluice_runtime::registry::Registry;
use sluice_runtime::txn::Progress;
use sluice_source_sdk::kind;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The memory driver, recording every Apply and Open, and answering the `n`th Apply
/// with the state `{"applied": n, "by": "apply"}` as a merge patch; its transactors
/// answer the `n`th commit with `{"commits": {"n": true}}` and the `n`th
/// acknowledgement with `{"acks": n}` (merge patches; `n` counted over the test).
struct Stateful {
    inner: MemoryDriver,
    applies: Mutex<Vec<m::ApplyRequest>>,
    opens: Mutex<Vec<Value>>,
    counts: Arc<Mutex<Counts>>,
}

#[derive(Default)]
struct Counts {
    commits: u64,
    acks: u64,
}

fn merge_patch(patch: Value) -> Option<flow::DriverCheckpoint> {
    Some(flow::DriverCheckpoint {
        driver_checkpoint_json: patch.to_string().into_bytes(),
        rfc7396_merge_patch: true,
    })
}

/// The memory driver's transactor, answering commits and acknowledgements with states.
struct StatefulTransactor {
    inner: Box<dyn Transactor>,
    counts: Arc<Mutex<Counts>>,
}

#[async_trait]
impl Transactor for StatefulTransactor {
    async fn load(
        &mut self,
        load: Load,
        prior: PriorState,
        loaded: &mut dyn LoadedSink,
    ) -> Result<()> {
        self.inner.load(load, prior, loaded).await
    }
    async fn flush_loads(&mut self, loaded: &mut dyn LoadedSink) -> Result<()> {
        self.inner.flush_loads(loaded).await
    }
    async fn prepare(&mut self, prepare: Prepare) -> Result<flow::DriverCheckpoint> {
        self.inner.prepare(prepare).await
    }
    fn commit_checkpoint(&mut self, checkpoint: Vec<u8>) {
        self.inner.commit_checkpoint(checkpoint)
    }
    async fn store(&mut self, store: Store) -> Result<()> {
        self.inner.store(store).await
    }
    async fn commit(&mut self) -> Result<()> {
        self.inner.commit().await
    }
    fn committed_state(&mut self) -> Option<flow::DriverCheckpoint> {
        let mut counts = self.counts.lock().unwrap();
        counts.commits += 1;
        merge_patch(json!({"commits": {counts.commits.to_string(): true}}))
    }
    async fn acknowledge(&mut self) -> Result<()> {
        self.inner.acknowledge().await
    }
    fn acknowledged_state(&mut self) -> Option<flow::DriverCheckpoint> {
        let mut counts = self.counts.lock().unwrap();
        counts.acks += 1;
        merge_patch(json!({"acks": counts.acks}))
    }
    async fn destroy(self: Box<Self>) {
        self.inner.destroy().await
    }
    fn report(&self) -> Report {
        let commits = self.counts.lock().unwrap().commits;
        Report {
            memory: 12_345,
            metrics: vec![
                Metric::counter("commits", "Transactions committed.", commits),
                Metric::gauge("replica_lag_seconds", "How far the replica is behind.", 40)
                    .label("replica", "r1"),
            ],
            health: Some(HealthState::Unhealthy {
                reason: LAGGING.into(),
            }),
        }
    }
}

const LAGGING: &str = "the replica is 40 s behind";

#[async_trait]
impl Driver for Stateful {
    fn declared(&self) -> Declared {
        self.inner.declared()
    }
    async fn spec(&self, req: m::SpecRequest) -> Result<m::SpecResponse> {
        self.inner.spec(req).await
    }
    async fn validate(&self, req: m::ValidateRequest) -> Result<m::ValidateResponse> {
        self.inner.validate(req).await
    }
    async fn apply_upsert(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        let n = {
            let mut applies = self.applies.lock().unwrap();
            applies.push(req.clone());
            applies.len()
        };
        let mut response = self.inner.apply_upsert(req).await?;
        response.driver_checkpoint = Some(flow::DriverCheckpoint {
            driver_checkpoint_json: json!({"applied": n, "by": "apply"})
                .to_string()
                .into_bytes(),
            rfc7396_merge_patch: true,
        });
        Ok(response)
    }
    async fn apply_delete(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        self.inner.apply_delete(req).await
    }
    async fn open(&self, open: Open) -> Result<(Box<dyn Transactor>, Opened)> {
        let state = match open.driver_checkpoint_json.as_slice() {
            [] => Value::Null,
            json => serde_json::from_slice(json).unwrap(),
        };
        self.opens.lock().unwrap().push(state);
        let (inner, opened) = self.inner.open(open).await?;
        let counts = self.counts.clone();
        Ok((Box::new(StatefulTransactor { inner, counts }), opened))
    }
}

const YAML: &str = r#"
collections:
  acme/views:
    key: [/id]
    schema:
      type: object
      required: [id]
      properties:
        id: {type: string}
sources:
  input:
    target: acme/views
    file: {path: input.jsonl, format: json}
materializations:
  views:
    endpoint: {memory: {}}
    bindings:
      - source: acme/views
        resource: {table: t}
runtime:
  recovery_log: log
"#;

struct Harness {
    pipeline: Pipeline,
    driver: Arc<Stateful>,
    connector: Connector,
}

impl Harness {
    fn new(dir: &Path) -> Harness {
        let registry = Registry::new()
            .with_source(kind::<FileKind>())
            .with_builtin(common::memory_kind());
        let pipeline = Pipeline::parse(YAML, dir, &registry).unwrap();
        let driver = Arc::new(Stateful {
            inner: MemoryDriver::new(),
            applies: Mutex::default(),
            opens: Mutex::default(),
            counts: Arc::default(),
        });
        let connector = Connector(Arc::new(InProcess::new("memory", driver.clone())));
        Harness {
            pipeline,
            driver,
            connector,
        }
    }

    async fn apply(&self) {
        let planned = pipeline::plan(&self.pipeline, &self.connector)
            .await
            .unwrap();
        pipeline::apply(&self.pipeline, &planned, ApplyAction::Upsert, false)
            .await
            .unwrap();
    }

    async fn run(&self) {
        self.run_with(RunOptions::default()).await
    }

    async fn run_with(&self, options: RunOptions) {
        let planned = pipeline::plan(&self.pipeline, &self.connector)
            .await
            .unwrap();
        let (_stop, stopped) = tokio::sync::watch::channel(false);
        pipeline::apply_first_start(&self.pipeline, &planned, &stopped)
            .await
            .unwrap();
        let progress = Arc::new(Progress::default());
        pipeline::run(&self.pipeline, planned, options, progress, stopped)
            .await
            .unwrap();
    }

    fn last_open(&self) -> Value {
        self.driver.opens.lock().unwrap().last().cloned().unwrap()
    }

    fn applies(&self) -> Vec<m::ApplyRequest> {
        self.driver.applies.lock().unwrap().clone()
    }
}

fn input(dir: &Path, ids: &[&str]) {
    let text: String = ids
        .iter()
        .map(|id| format!("{{\"id\": \"{id}\"}}\n"))
        .collect();
    let path = dir.join("input.jsonl");
    let mut all = std::fs::read_to_string(&path).unwrap_or_default();
    all.push_str(&text);
    std::fs::write(path, all).unwrap();
}

/// The driver checkpoint the recovery log's last commit holds for `views`.
fn logged(dir: &Path) -> Option<Value> {
    let (commit, _) = sluice_runtime::recovery::read_latest(&dir.join("log/views")).unwrap();
    commit.and_then(|c| c.driver_checkpoints.get("views").cloned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_is_told_the_last_spec_and_its_state_reaches_open_once() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    input(dir, &["a", "b"]);
    let h = Harness::new(dir);

    // A first apply: nothing applied before, no state.
    h.apply().await;
    let first = &h.applies()[0];
    assert_eq!(first.last_materialization, None);
    assert_eq!(first.last_version, "");
    assert_eq!(first.driver_checkpoint_json, b"{}");
    assert_eq!(
        logged(dir),
        Some(json!({"applied": 1, "by": "apply"})),
        "recorded with the apply, before any transaction"
    );

    // The run's Open carries it, and its commits keep it.
    h.run().await;
    assert_eq!(h.last_open()["applied"], json!(1));
    assert_eq!(logged(dir).unwrap()["applied"], json!(1));

    // Applied again: told the spec applied last and the state the log holds.
    h.apply().await;
    let second = &h.applies()[1];
    let spec = first.materialization.clone();
    assert_eq!(second.last_materialization, spec);
    assert_eq!(second.last_version, first.version);
    let told: Value = serde_json::from_slice(&second.driver_checkpoint_json).unwrap();
    assert_eq!(told["applied"], json!(1));

    input(dir, &["c"]);
    h.run().await;
    assert_eq!(
        h.last_open()["applied"],
        json!(2),
        "merged once, replacing 1"
    );
    assert_eq!(logged(dir).unwrap()["applied"], json!(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_states_are_recorded_with_their_commits_and_acknowledged_ones_with_the_next() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    input(dir, &["a", "b"]);
    let h = Harness::new(dir);
    h.apply().await;
    h.run().await;
    let commits = h.driver.counts.lock().unwrap().commits;
    assert!(commits >= 1, "the run committed");
    // Every commit's state is in the log, each once: the keys 1..=commits.
    let state = logged(dir).unwrap();
    let recorded: Vec<String> = state["commits"]
        .as_object()
        .unwrap()
        .keys()
        .cloned()
        .collect();
    let mut want: Vec<String> = (1..=commits).map(|n| n.to_string()).collect();
    want.sort();
    assert_eq!(recorded, want, "{state}");
    // The acknowledgement of the recovered checkpoint came before the first commit, so
    // at least its state rode on a commit; the last acknowledgement may not have.
    let acks = state["acks"]
        .as_u64()
        .expect("an acknowledgement's state recorded");
    assert!(
        acks >= 1 && acks <= h.driver.counts.lock().unwrap().acks,
        "{state}"
    );

    // The next run opens with all of it, and keeps adding.
    input(dir, &["c"]);
    h.run().await;
    let opened = h.last_open();
    assert_eq!(
        opened["commits"], state["commits"],
        "Open carries the log's state"
    );
    assert_eq!(opened["applied"], json!(1));
    let commits = h.driver.counts.lock().unwrap().commits;
    let state = logged(dir).unwrap();
    assert_eq!(
        state["commits"].as_object().unwrap().len() as u64,
        commits,
        "{state}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoints_memory_metrics_and_health_are_served_as_it_reports_them() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    input(dir, &["a", "b"]);
    let h = Harness::new(dir);
    let metrics = Arc::new(Metrics::new());
    h.run_with(RunOptions {
        follow: false,
        metrics: Some(metrics.clone()),
    })
    .await;

    let shard = &metrics.status.snapshot().shards[0];
    assert!(shard.transactions >= 1);
    let endpoint = &shard.endpoint;
    assert_eq!(endpoint.memory, 12_345);
    assert_eq!(
        endpoint.health,
        HealthState::Unhealthy {
            reason: LAGGING.into()
        },
        "what it says wins over its calls succeeding"
    );
    let commits = (endpoint.metrics.iter())
        .find(|m| m.name == "commits")
        .expect("its counter is served");
    assert_eq!(commits.value, shard.transactions);
    let lag = (endpoint.metrics.iter())
        .find(|m| m.name == "replica_lag_seconds")
        .expect("its gauge is served");
    assert_eq!((lag.value, lag.labels["replica"].as_str()), (40, "r1"));
    let json = serde_json::to_value(metrics.status.snapshot()).unwrap();
    assert_eq!(
        json["shards"][0]["endpoint"]["health"]["reason"], LAGGING,
        "/api/status names the reason"
    );

    let text = metrics.render();
    const OF: &str = r#"materialization="views",shard="00000000-ffffffff""#;
    for line in [
        format!("sluice_endpoint_memory_bytes{{{OF}}} 12345"),
        format!("sluice_endpoint_health{{{OF}}} 1"),
        format!(
            r#"sluice_endpoint_custom_counter_total{{{OF},name="commits"}} {}"#,
            shard.transactions
        ),
        format!(r#"sluice_endpoint_custom{{{OF},name="replica_lag_seconds",replica="r1"}} 40"#),
    ] {
        assert!(text.contains(&line), "{line} in {text}");
    }
}

/// The Applied state is merged into the log's last commit atomically, keeping an
/// interrupted transaction's intent (replayed at the next start), and a log with no
/// commit gets one of transaction 0.
#[test]
fn amending_the_last_commit_keeps_the_pending_intent() {
    use sluice_runtime::recovery::{self, Checkpoint, Intent, RecoveryLog};
    let dir = tempfile::tempdir().unwrap();
    let log_dir = dir.path().join("views");
    {
        let mut log = RecoveryLog::open(&log_dir).unwrap();
        let commit = Checkpoint {
            txn: 3,
            driver_checkpoints: [("views".to_string(), json!({"kept": true}))].into(),
            ..Checkpoint::default()
        };
        log.commit(&commit).unwrap();
        log.write_intent(&Intent {
            txn: 4,
            ..Intent::default()
        })
        .unwrap();
    }
    let held = recovery::lock_dir(&log_dir).unwrap();
    let amended = recovery::amend_last_commit(&log_dir, &held, |commit| {
        let patch = commit.driver_checkpoints.get_mut("views").unwrap();
        patch["applied"] = json!(1);
        Ok(())
    })
    .unwrap();
    drop(held);
    assert_eq!(amended.txn, 3);
    let log = RecoveryLog::open(&log_dir).unwrap();
    let commit = log.last_commit().unwrap();
    assert_eq!(
        commit.driver_checkpoints["views"],
        json!({"kept": true, "applied": 1})
    );
    assert_eq!(
        log.pending_intent().map(|i| i.txn),
        Some(4),
        "still replayed"
    );
    drop(log);

    // No log yet: a commit of transaction 0 holding only the state.
    let fresh = dir.path().join("fresh");
    let held = recovery::lock_dir(&fresh).unwrap();
    recovery::amend_last_commit(&fresh, &held, |commit| {
        commit
            .driver_checkpoints
            .insert("views".to_string(), json!({"applied": 1}));
        Ok(())
    })
    .unwrap();
    drop(held);
    let log = RecoveryLog::open(&fresh).unwrap();
    assert_eq!(log.last_commit().map(|c| c.txn), Some(0));
    assert_eq!(log.pending_intent(), None);
}

/// Flow's StartedCommit state is transactional with the runtime's commit: a crash
/// between the driver's commit and the log's loses it, never half of it, and the
/// transaction (which the store holds) is neither replayed into it nor lost. The run
/// retries the failure itself (it is retryable): its second Open is the recovery.
#[cfg(feature = "failpoints")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_between_the_driver_commit_and_the_log_commit_loses_only_that_commits_state() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    input(dir, &["a", "b"]);
    let h = Harness::new(dir);
    h.apply().await;
    h.run().await;
    let before = logged(dir).unwrap();
    let committed = h.driver.counts.lock().unwrap().commits;
    let opens = h.driver.opens.lock().unwrap().len();

    input(dir, &["c"]);
    let scenario = fail::FailScenario::setup();
    fail::cfg(
        sluice_runtime::failpoint::AFTER_DRIVER_COMMITTED,
        "1*return",
    )
    .unwrap();
    h.run().await;
    fail::remove(sluice_runtime::failpoint::AFTER_DRIVER_COMMITTED);
    scenario.teardown();
    let reopened = h.driver.opens.lock().unwrap()[opens..].to_vec();
    assert_eq!(
        reopened.len(),
        2,
        "the fail point fired, and the run recovered"
    );
    assert_eq!(
        reopened[1]["commits"], before["commits"],
        "the recovering Open carries the log's state, whole"
    );
    let lost = committed + 1;

    input(dir, &["d"]);
    h.run().await;
    let ids: Vec<Value> = (h.driver.inner.rows("views", "t").into_iter())
        .map(|(_, doc)| doc["id"].clone())
        .collect();
    assert_eq!(
        ids,
        [json!("a"), json!("b"), json!("c"), json!("d")],
        "each once"
    );
    let state = logged(dir).unwrap();
    let commits = state["commits"].as_object().unwrap();
    assert!(!commits.contains_key(&lost.to_string()), "{state}");
    let last = h.driver.counts.lock().unwrap().commits;
    assert!(last > lost, "the runs after it committed");
    for n in (1..=committed).chain(lost + 1..=last) {
        assert!(commits.contains_key(&n.to_string()), "commit {n}: {state}");
    }
}
