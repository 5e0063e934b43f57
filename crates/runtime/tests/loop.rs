//! The transaction loop in-process, against the memory driver, with fail points at every
//! commit boundary: no subprocess.
//!
//! Each test runs `txn::run` over a JSON-lines file of 95 documents (13 keys) into one
//! memory table, restarting the loop over the same recovery log and the same driver
//! state after every injected failure (a restart uses smaller transaction bounds than
//! the first run, so only an exact replay of the journaled steps rebuilds an
//! interrupted transaction as it was). The driver is wrapped to observe, per stream,
//! every Acknowledge, Prepare, Store and Commit, and to check at each one what the
//! recovery log holds on disk. Every test then asserts:
//! - the store equals the reduction of the input computed here, independently;
//! - per stream, Acknowledge and Commit alternate, starting with Acknowledge: exactly one
//!   Acknowledge per committed transaction (and the one of the recovered checkpoint);
//! - an Acknowledge that follows a Commit in its stream finds that commit in the log;
//! - at Prepare of T, the log holds T's intent (written before any store);
//! - every attempt of a transaction stored a prefix of what its committed attempt
//!   stored (an attempt that reached Commit: all of it).
//!
//! Retries by kind, through `pipeline::run`: a malformed Loaded document fails at once
//! (one Open), a transient source I/O error reopens the loop and the run ends exact.
//!
//! Built only with the `failpoints` feature. Fail points are global to the process: each
//! test holds a `fail::FailScenario` (which serializes them under `cargo test`; nextest
//! runs each in its own process anyway).

mod common;

use common::Connector;

use async_trait::async_trait;
use serde_json::{Value, json};
use sluice_driver_sdk::arena::load_keys;
use sluice_driver_sdk::inprocess::InProcess;
use sluice_driver_sdk::materialize::{
    self as m,
    transaction_request::{Load, Open, Prepare, Store},
    transaction_response::Opened,
};
use sluice_driver_sdk::{Declared, Driver, LoadedSink, PriorState, Result, Transactor, flow};
use sluice_file::{FileConfig, FileKind};
use sluice_memory::MemoryDriver;
use sluice_runtime::config::{Pipeline, Timeouts};
use sluice_runtime::failpoint::{self, MARKER};
use sluice_runtime::metrics::Metrics;
use sluice_runtime::pipeline::{self, PipelineError};
use sluice_runtime::projections::loop_binding;
use sluice_runtime::recovery::{REBUILD_SENTINEL, RecoveryLog, StoreCheckpoint, inspect};
use sluice_runtime::registry::Registry;
use sluice_runtime::txn::{
    self, BoundSource, Context, Progress, RunError, Shard, ShardContext, Summary, TxnOptions,
};
use sluice_source_sdk::testing::{Script, Scripted};
use sluice_source_sdk::{
    FaultTolerance, InvalidConfig, Opening, QueueLimits, Records, Resume, Source, SourceError,
    SourceKind, Step, kind,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const DOCS: u64 = 95;
const KEYS: u64 = 13;
/// Transaction bounds of the first run, and of every restart.
const FIRST_MAX_DOCS: u64 = 10;
const RESTART_MAX_DOCS: u64 = 7;
const MATERIALIZATION: &str = "views";
const TABLE: &str = "t";

fn doc(i: u64) -> Value {
    json!({"id": format!("k{:02}", i * 7 % KEYS), "n": i, "last": format!("t{i:03}")})
}

/// The reduction of the input, per key: `n` summed, `last` maximized.
fn expected() -> BTreeMap<String, (i64, String)> {
    let mut out: BTreeMap<String, (i64, String)> = BTreeMap::new();
    for i in 0..DOCS {
        let d = doc(i);
        let row = out
            .entry(d["id"].as_str().unwrap().to_string())
            .or_default();
        row.0 += d["n"].as_i64().unwrap();
        row.1 = row.1.clone().max(d["last"].as_str().unwrap().to_string());
    }
    out
}

/// The pipeline over `input`, read by the source kind `kind` (`file`, or the test's
/// `flaky_file`); the scripted kinds seek, so their pipelines ask for at-least-once
/// delivery (admission refuses them exactly-once).
fn pipeline_yaml(kind: &str, input: &Path, log: &Path) -> String {
    let delivery = if matches!(kind, "seek_file" | "barrier_file") {
        "at_least_once"
    } else {
        "exactly_once"
    };
    format!(
        r#"
delivery: {delivery}
collections:
  acme/views:
    key: [/id]
    schema:
      type: object
      required: [id, n, last]
      reduce: {{strategy: merge}}
      properties:
        id: {{type: string}}
        n: {{type: integer, reduce: {{strategy: sum}}}}
        last: {{type: string, reduce: {{strategy: maximize}}}}
sources:
  input:
    target: acme/views
    {kind}: {{path: {input}, format: json}}
materializations:
  {MATERIALIZATION}:
    endpoint: {{memory: {{}}}}
    bindings:
      - source: acme/views
        resource: {{table: {TABLE}}}
runtime:
  recovery_log: {log}
  # For pipeline::run (txn::run is given its bounds): close only at max_docs or the end.
  transactions: {{max_docs: {FIRST_MAX_DOCS}, max_duration: 10m, min_duration: 10m}}
"#,
        input = input.display(),
        log = log.display(),
    )
}

/// One event of a Transactions stream, as the driver saw it.
#[derive(Debug, Clone, PartialEq)]
enum Event {
    /// Acknowledge of the commit of `txn` (the stream's last, or the recovered one).
    Ack {
        txn: u64,
    },
    Commit {
        txn: u64,
    },
}

/// What the driver observed, over every stream of a test.
#[derive(Default)]
struct Observed {
    streams: Vec<Vec<Event>>,
    /// Per transaction, the Stores of each attempt, in order.
    attempts: BTreeMap<u64, Vec<Vec<Store>>>,
    violations: Vec<String>,
}

/// How the observed driver answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answers {
    /// As the memory driver does.
    AsStored,
    /// The Open of a range that never committed with the rebuild sentinel instead of an
    /// empty checkpoint, as the protocol lets a driver do.
    Rebuild,
    /// As `Rebuild` (so every key is loaded), and every Load with a document that is
    /// not JSON: a driver's bug.
    GarbageLoads,
}

/// The memory driver, observed.
struct Observing {
    inner: MemoryDriver,
    log_dir: PathBuf,
    observed: Arc<Mutex<Observed>>,
    answers: Answers,
}

#[async_trait]
impl Driver for Observing {
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
        self.inner.apply_upsert(req).await
    }
    async fn apply_delete(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        self.inner.apply_delete(req).await
    }
    async fn open(&self, open: Open) -> Result<(Box<dyn Transactor>, Opened)> {
        let (inner, mut opened) = self.inner.open(open).await?;
        if self.answers != Answers::AsStored && opened.flow_checkpoint.is_empty() {
            opened.flow_checkpoint = REBUILD_SENTINEL.to_vec();
        }
        let committed = checkpoint_txn(&opened.flow_checkpoint);
        let stream = {
            let mut observed = self.observed.lock().unwrap();
            observed.streams.push(Vec::new());
            observed.streams.len() - 1
        };
        let transactor = ObservingTransactor {
            inner,
            log_dir: self.log_dir.clone(),
            observed: self.observed.clone(),
            stream,
            committed,
            txn: 0,
            garbage_loads: self.answers == Answers::GarbageLoads,
        };
        Ok((Box::new(transactor), opened))
    }
}

fn checkpoint_txn(bytes: &[u8]) -> u64 {
    match StoreCheckpoint::from_opened(bytes, true).expect("a runtime checkpoint") {
        StoreCheckpoint::At(c) => c.txn,
        StoreCheckpoint::RuntimeOwn | StoreCheckpoint::Absent | StoreCheckpoint::Rebuild => 0,
    }
}

/// `inspect`'s line `<prefix> <n>…`, as n (0 when absent).
fn log_says(log_dir: &Path, prefix: &str) -> u64 {
    let text = inspect(log_dir).unwrap_or_default();
    text.lines()
        .find_map(|line| line.strip_prefix(prefix))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

struct ObservingTransactor {
    inner: Box<dyn Transactor>,
    log_dir: PathBuf,
    observed: Arc<Mutex<Observed>>,
    stream: usize,
    /// The last transaction committed, as this stream knows it.
    committed: u64,
    /// The transaction prepared in this stream.
    txn: u64,
    garbage_loads: bool,
}

impl ObservingTransactor {
    fn observe(&self, f: impl FnOnce(&mut Observed)) {
        f(&mut self.observed.lock().unwrap());
    }
}

#[async_trait]
impl Transactor for ObservingTransactor {
    async fn load(
        &mut self,
        load: Load,
        prior: PriorState,
        loaded: &mut dyn LoadedSink,
    ) -> Result<()> {
        if self.garbage_loads {
            for _ in load_keys(&load) {
                loaded.push(load.binding, b"{not json");
            }
            return Ok(());
        }
        self.inner.load(load, prior, loaded).await
    }

    async fn flush_loads(&mut self, loaded: &mut dyn LoadedSink) -> Result<()> {
        self.inner.flush_loads(loaded).await
    }

    async fn prepare(&mut self, prepare: Prepare) -> Result<flow::DriverCheckpoint> {
        let txn = checkpoint_txn(&prepare.flow_checkpoint);
        self.txn = txn;
        let intent = log_says(&self.log_dir, "pending intent: transaction");
        self.observe(|o| {
            if intent != txn {
                o.violations.push(format!(
                    "Prepare of transaction {txn} with the log's pending intent at {intent}"
                ));
            }
            o.attempts.entry(txn).or_default().push(Vec::new());
        });
        self.inner.prepare(prepare).await
    }

    async fn store(&mut self, store: Store) -> Result<()> {
        let txn = self.txn;
        self.observe(|o| {
            let attempt = o.attempts.get_mut(&txn).and_then(|a| a.last_mut());
            attempt.expect("Store after Prepare").push(store.clone());
        });
        self.inner.store(store).await
    }

    async fn commit(&mut self) -> Result<()> {
        self.inner.commit().await?;
        self.committed = self.txn;
        let (stream, txn) = (self.stream, self.txn);
        self.observe(|o| o.streams[stream].push(Event::Commit { txn }));
        Ok(())
    }

    async fn acknowledge(&mut self) -> Result<()> {
        let (stream, txn) = (self.stream, self.committed);
        let logged = log_says(&self.log_dir, "last commit: transaction");
        self.observe(|o| {
            let after_commit = o.streams[stream].last() == Some(&Event::Commit { txn });
            if after_commit && logged < txn {
                o.violations.push(format!(
                    "Acknowledge of transaction {txn} while the log's last commit is {logged}"
                ));
            }
            o.streams[stream].push(Event::Ack { txn });
        });
        self.inner.acknowledge().await
    }
}

/// One test's pipeline, store and recovery log.
struct Harness {
    _dir: tempfile::TempDir,
    pipeline: Pipeline,
    shard: Shard,
    endpoint: Arc<InProcess>,
    store: MemoryDriver,
    log_dir: PathBuf,
    observed: Arc<Mutex<Observed>>,
}

/// A new, empty memory store behind an observing endpoint.
fn observed_store(
    log_dir: &Path,
    answers: Answers,
) -> (MemoryDriver, Arc<Mutex<Observed>>, Arc<InProcess>) {
    let store = MemoryDriver::new();
    let observed = Arc::new(Mutex::new(Observed::default()));
    let endpoint = Arc::new(InProcess::new(
        "memory",
        Arc::new(Observing {
            inner: store.clone(),
            log_dir: log_dir.to_path_buf(),
            observed: observed.clone(),
            answers,
        }),
    ));
    (store, observed, endpoint)
}

impl Harness {
    /// Replaces the store by a new, empty one answering as `answers` says; the recovery
    /// log stays.
    fn replace_store(&mut self, answers: Answers) {
        (self.store, self.observed, self.endpoint) = observed_store(&self.log_dir, answers);
    }

    async fn new() -> Harness {
        Harness::reading("file").await
    }

    /// A harness whose source is of kind `source_kind`.
    async fn reading(source_kind: &str) -> Harness {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("input.jsonl");
        let mut text = String::new();
        for i in 0..DOCS {
            text.push_str(&doc(i).to_string());
            text.push('\n');
        }
        std::fs::write(&input, text).unwrap();
        let pipeline = Pipeline::parse(
            &pipeline_yaml(source_kind, &input, &dir.path().join("log")),
            dir.path(),
            &Registry::new()
                .with_source(kind::<FileKind>())
                .with_source(kind::<FlakyFileKind>())
                .with_source(kind::<ScriptedFileKind<SeekOnly>>())
                .with_source(kind::<ScriptedFileKind<Barriers>>())
                .with_source(kind::<UnitFileKind<false>>())
                .with_source(kind::<UnitFileKind<true>>())
                .with_builtin(common::memory_kind()),
        )
        .unwrap();
        let log_dir = pipeline.recovery_log().join(MATERIALIZATION);
        let (store, observed, endpoint) = observed_store(&log_dir, Answers::AsStored);
        let planned = pipeline::plan(&pipeline, &Connector(endpoint.clone()))
            .await
            .unwrap();
        let m = &planned.materializations[0];
        let collection = planned.collections["acme/views"].clone();
        let shard = Shard {
            open: Open {
                version: "test".into(),
                materialization: Some(m.spec.clone()),
                key_begin: m.shard.key_begin,
                key_end: m.shard.key_end,
                driver_checkpoint_json: Vec::new(),
            },
            bindings: vec![loop_binding(collection, &m.spec, 0)],
        };
        Harness {
            _dir: dir,
            pipeline,
            shard,
            endpoint,
            store,
            log_dir,
            observed,
        }
    }

    /// One run of the loop over the log and the store as they are.
    async fn run_once(&self, max_docs: u64, summary: &mut Summary) -> Result<(), String> {
        let sources = self
            .pipeline
            .sources
            .iter()
            .map(|(name, def)| BoundSource {
                source: def
                    .config
                    .open(&Opening::standalone(name, &self.log_dir.join(name)))
                    .unwrap(),
                bindings: vec![0],
                dead_letter: None,
                read_ahead: def.read_ahead,
                envelope: def.envelope,
            })
            .collect();
        let ctx = Context {
            shards: vec![ShardContext {
                shard: self.shard.clone(),
                log: RecoveryLog::open(&self.log_dir).map_err(|e| e.to_string())?,
                metrics: Arc::new(Metrics::new().shard(
                    &self.shard,
                    self.pipeline.sources.keys().map(String::as_str),
                )),
            }],
            endpoint: self.endpoint.clone(),
            store_keeps_checkpoint: true,
            deployment_id: String::new(),
            sources,
            opts: TxnOptions {
                max_docs,
                max_bytes: u64::MAX,
                // Transactions close only at max_docs or at the end of the input.
                max_duration: Duration::from_secs(600),
                min_duration: Duration::from_secs(600),
                memory_budget: 64 << 20,
                follow: false,
                max_journaled: TxnOptions::MAX_JOURNALED,
            },
            timeouts: Timeouts::default(),
            progress: Arc::new(Progress::default()),
            shutdown: tokio::sync::watch::channel(false).1,
            threads: 1,
        };
        txn::run(ctx, summary).await.map_err(|e| e.to_string())
    }

    /// The whole pipeline, as `sluice run` runs it: reopened after retryable failures.
    async fn run_pipeline(&self) -> std::result::Result<Summary, PipelineError> {
        let (_keep, shutdown) = tokio::sync::watch::channel(false);
        self.run_pipeline_until(shutdown).await
    }

    /// [`Harness::run_pipeline`], stopped when `shutdown` says so.
    async fn run_pipeline_until(
        &self,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) -> std::result::Result<Summary, PipelineError> {
        let planned = pipeline::plan(&self.pipeline, &Connector(self.endpoint.clone()))
            .await
            .unwrap();
        let progress = Arc::new(Progress::default());
        let options = pipeline::RunOptions::default();
        let mut summaries =
            pipeline::run(&self.pipeline, planned, options, progress, shutdown).await?;
        Ok(summaries.remove(0).1)
    }

    /// Runs the loop until it ends cleanly, restarting it after each injected failure.
    /// Returns the injected failures.
    async fn run_to_end(&self) -> Vec<String> {
        let mut failures = Vec::new();
        let mut summary = Summary::default();
        let mut max_docs = FIRST_MAX_DOCS;
        while let Err(err) = self.run_once(max_docs, &mut summary).await {
            assert!(err.contains(MARKER), "a failure nobody injected: {err}");
            failures.push(err);
            assert!(failures.len() < 5, "no progress: {failures:?}");
            max_docs = RESTART_MAX_DOCS;
        }
        failures
    }

    /// Every property the module docs list, after the run.
    /// The store's rows, per key: (n, last).
    fn rows(&self) -> BTreeMap<String, (i64, String)> {
        self.store
            .rows(MATERIALIZATION, TABLE)
            .into_iter()
            .map(|(_, d)| {
                let id = d["id"].as_str().unwrap().to_string();
                (
                    id,
                    (d["n"].as_i64().unwrap(), d["last"].as_str().unwrap().into()),
                )
            })
            .collect()
    }

    fn assert_exact(&self) {
        assert_eq!(
            self.rows(),
            expected(),
            "the store is the reduction of the input"
        );

        let observed = self.observed.lock().unwrap();
        assert_eq!(observed.violations, Vec::<String>::new());
        let final_stream = observed.streams.last().expect("a stream");
        for (i, events) in observed.streams.iter().enumerate() {
            for (j, event) in events.iter().enumerate() {
                let is_ack = matches!(event, Event::Ack { .. });
                assert_eq!(is_ack, j % 2 == 0, "stream {i}: {events:?}");
            }
        }
        assert!(
            matches!(final_stream.last(), Some(Event::Ack { .. })),
            "the last stream ends acknowledged: {final_stream:?}"
        );
        let committed: Vec<u64> = observed
            .streams
            .iter()
            .flatten()
            .filter_map(|e| match e {
                Event::Commit { txn } => Some(*txn),
                Event::Ack { .. } => None,
            })
            .collect();
        let last = *committed.last().expect("a commit");
        assert_eq!(
            committed,
            (1..=last).collect::<Vec<_>>(),
            "every transaction commits once, in order"
        );
        for (txn, attempts) in &observed.attempts {
            let done = attempts.last().unwrap();
            for attempt in attempts {
                assert!(
                    done.starts_with(attempt),
                    "transaction {txn}: an attempt stored what its replay did not"
                );
            }
        }
    }

    fn streams(&self) -> Vec<Vec<Event>> {
        self.observed.lock().unwrap().streams.clone()
    }
}

/// Runs the input to the end with `actions` at `point`; asserts the failure fired,
/// then every property.
async fn crash_and_recover(point: &str, actions: &str) -> Harness {
    crash_and_recover_reading("file", point, actions).await
}

/// [`crash_and_recover`], the input read by the source kind `source_kind`.
async fn crash_and_recover_reading(source_kind: &str, point: &str, actions: &str) -> Harness {
    let scenario = fail::FailScenario::setup();
    fail::cfg(point, actions).unwrap();
    let h = Harness::reading(source_kind).await;
    let failures = h.run_to_end().await;
    fail::remove(point);
    scenario.teardown();
    assert!(
        failures.iter().any(|f| f.contains(point)),
        "{point} never fired: {failures:?}"
    );
    h.assert_exact();
    h
}

/// The third time the boundary is reached: transactions were committed before.
const THIRD: &str = "2*off->1*return";

macro_rules! boundary_tests {
    ($($name:ident: $point:ident at $actions:expr,)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            crash_and_recover(failpoint::$point, $actions).await;
        }
    )*};
}

boundary_tests! {
    a_failure_after_queueing_recovers: AFTER_QUEUE at THIRD,
    a_failure_after_the_intent_recovers: AFTER_INTENT at THIRD,
    a_failure_after_loads_recovers: AFTER_LOADS at THIRD,
    a_failure_after_prepared_recovers: AFTER_PREPARED at THIRD,
    a_failure_mid_store_recovers: MID_STORE at THIRD,
    a_failure_after_driver_committed_recovers: AFTER_DRIVER_COMMITTED at THIRD,
    a_failure_after_the_log_commit_recovers: AFTER_LOG_COMMIT at THIRD,
    // Reached once per run: the first open fails.
    a_failure_after_open_recovers: RECOVERY_AFTER_OPEN at "1*return",
    a_failed_log_fsync_recovers: RECOVERY_FSYNC at THIRD,
    a_failed_driver_store_recovers: DRIVER_STORE at THIRD,
    a_failure_before_the_driver_commits_recovers: DRIVER_BEFORE_COMMIT at THIRD,
    a_failure_after_the_driver_commits_recovers: DRIVER_AFTER_COMMIT at THIRD,
    a_failed_driver_acknowledge_recovers: DRIVER_ACKNOWLEDGE at THIRD,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_committed_transaction_is_acknowledged_exactly_once() {
    let scenario = fail::FailScenario::setup();
    let h = Harness::new().await;
    assert_eq!(h.run_to_end().await, Vec::<String>::new());
    scenario.teardown();
    h.assert_exact();
    let txns = DOCS.div_ceil(FIRST_MAX_DOCS);
    let mut expected = vec![Event::Ack { txn: 0 }];
    for txn in 1..=txns {
        expected.extend([Event::Commit { txn }, Event::Ack { txn }]);
    }
    assert_eq!(h.streams(), vec![expected]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_transaction_stores_what_the_original_stored() {
    // Transaction 3 fails after all its stores, just before the driver commits it; the
    // restart (with smaller bounds) replays it from its intent.
    let h = crash_and_recover(failpoint::DRIVER_BEFORE_COMMIT, THIRD).await;
    let observed = h.observed.lock().unwrap();
    let attempts = &observed.attempts[&3];
    assert_eq!(attempts.len(), 2, "transaction 3 was tried twice");
    assert!(!attempts[0].is_empty());
    assert_eq!(attempts[0], attempts[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_commit_that_fails_is_never_acknowledged() {
    // Appends: intent 1, commit 1, intent 2, commit 2: the fourth (commit 2) fails.
    let h = crash_and_recover(failpoint::RECOVERY_FSYNC, "3*off->1*return").await;
    let first = h.streams().remove(0);
    assert_eq!(
        first.last(),
        Some(&Event::Commit { txn: 2 }),
        "the stream whose log commit failed ends at the driver's commit: {first:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rebuild_sentinel_starts_the_range_again_from_the_beginning() {
    let scenario = fail::FailScenario::setup();
    let mut h = Harness::new().await;
    assert_eq!(h.run_to_end().await, Vec::<String>::new());
    h.assert_exact();
    let committed = log_says(&h.log_dir, "last commit: transaction");

    // A new store that keeps checkpoints but reports none lost what the log committed:
    // refused, naming the log's last transaction, and nothing is written.
    h.replace_store(Answers::AsStored);
    let err = h
        .run_once(FIRST_MAX_DOCS, &mut Summary::default())
        .await
        .expect_err("a store that lost the log's commits is refused");
    assert!(
        err.contains(&format!("committed through transaction {committed}")),
        "{err}"
    );
    assert_eq!(h.rows(), BTreeMap::new(), "nothing was written");

    // One that answers with the sentinel is rebuilt from the beginning of the input.
    h.replace_store(Answers::Rebuild);
    assert_eq!(h.run_to_end().await, Vec::<String>::new());
    scenario.teardown();
    h.assert_exact();
    assert_eq!(
        log_says(&h.log_dir, "last commit: transaction"),
        committed,
        "transactions were numbered again from 1"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loaded_document_that_is_not_json_fails_at_once_naming_its_binding() {
    let mut h = Harness::new().await;
    h.replace_store(Answers::GarbageLoads);
    let err = h
        .run_pipeline()
        .await
        .expect_err("a driver's bad document ends the run");
    let PipelineError::Run {
        source, summaries, ..
    } = &err
    else {
        panic!("not the loop's error: {err}");
    };
    assert!(
        matches!(**source, RunError::Loaded { binding: 0, .. }),
        "{source:?}"
    );
    assert!(!source.is_retryable(), "{source}");
    let message = source.to_string();
    assert!(
        message.starts_with("driver memory: a Loaded document of binding 0 (t) is not JSON"),
        "{message}"
    );
    let streams = h.streams();
    assert_eq!(
        streams.len(),
        1,
        "one attempt: the same document would load again"
    );
    // What was committed before the failure is reported with it.
    let commits = streams[0]
        .iter()
        .filter(|e| matches!(e, Event::Commit { .. }))
        .count() as u64;
    assert_eq!(summaries.len(), 1);
    assert_eq!(summaries[0].1.transactions, commits, "{summaries:?}");
    assert_eq!(summaries[0].1.last_txn, commits, "{summaries:?}");
}

/// A file whose steps can only be resumed after (`seek_file`: every step a `Seek`), or
/// have barriers (`barrier_file`: two steps of three a `Barrier`): an interrupted
/// transaction cannot be replayed, its source reads on anew from the committed position,
/// and no transaction may end at a barrier (there is no position to resume it from).
/// With either, a committed document read twice would show as a sum too large.
struct ScriptedFileKind<S>(std::marker::PhantomData<S>);

trait ScriptOf: 'static {
    const NAME: &'static str;
    const SCRIPT: Script;
}

struct SeekOnly;
impl ScriptOf for SeekOnly {
    const NAME: &'static str = "seek_file";
    const SCRIPT: Script = Script::Seek;
}

struct Barriers;
impl ScriptOf for Barriers {
    const NAME: &'static str = "barrier_file";
    const SCRIPT: Script = Script::BarrierEvery(3);
}

impl<S: ScriptOf> SourceKind for ScriptedFileKind<S> {
    const NAME: &'static str = S::NAME;
    type Config = FileConfig;

    fn prepare(config: &mut FileConfig, base_dir: &Path) -> std::result::Result<(), InvalidConfig> {
        FileKind::prepare(config, base_dir)
    }

    fn open(
        opening: &Opening<'_>,
        config: &FileConfig,
    ) -> std::result::Result<Box<dyn Source>, SourceError> {
        Ok(Box::new(Scripted::new(
            FileKind::open(opening, config)?,
            S::SCRIPT,
        )))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_transaction_of_a_seek_only_source_is_read_anew() {
    crash_and_recover_reading("seek_file", failpoint::AFTER_INTENT, THIRD).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_transaction_with_barriers_is_read_anew() {
    crash_and_recover_reading("barrier_file", failpoint::AFTER_INTENT, THIRD).await;
}

/// The first transaction's first two steps are barriers. Had it ended at one, its
/// checkpoint would hold no position for the source, and the restart after the second
/// commit would read the committed documents again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_transaction_ends_at_a_barrier() {
    crash_and_recover_reading(
        "barrier_file",
        failpoint::AFTER_LOG_COMMIT,
        "1*off->1*return",
    )
    .await;
}

/// The ends of the units every `unit_file` source of the process handed over: (the
/// position of the unit's last step, the unit's records).
static UNIT_ENDS: Mutex<Vec<(Value, usize)>> = Mutex::new(Vec::new());
/// The positions every `unit_file` source of the process was told are committed.
static UNITS_TOLD_COMMITTED: Mutex<Vec<Value>> = Mutex::new(Vec::new());

/// The `file` source kind, its steps grouped in units of four (`Script::UnitsOf`): 13
/// documents at `max_docs` 10, as a transaction full after the first step reads on one
/// document at a time from the source inside a unit. Notes the units it hands over and
/// the positions it is told are committed. `unfinished_unit_file`: every step says its
/// unit continues, the last one too (a source that ends its input inside a unit).
struct UnitFileKind<const UNFINISHED: bool>;

impl<const UNFINISHED: bool> SourceKind for UnitFileKind<UNFINISHED> {
    const NAME: &'static str = if UNFINISHED {
        "unfinished_unit_file"
    } else {
        "unit_file"
    };
    type Config = FileConfig;

    fn prepare(config: &mut FileConfig, base_dir: &Path) -> std::result::Result<(), InvalidConfig> {
        FileKind::prepare(config, base_dir)
    }

    fn open(
        opening: &Opening<'_>,
        config: &FileConfig,
    ) -> std::result::Result<Box<dyn Source>, SourceError> {
        Ok(Box::new(UnitFile {
            inner: Scripted::new(FileKind::open(opening, config)?, Script::UnitsOf(4)),
            unit: 0,
            unfinished: UNFINISHED,
        }))
    }
}

struct UnitFile {
    inner: Scripted,
    /// Records of the unit in progress.
    unit: usize,
    /// Every step continues its unit.
    unfinished: bool,
}

#[async_trait]
impl Source for UnitFile {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn fault_tolerance(&self) -> FaultTolerance {
        self.inner.fault_tolerance()
    }
    async fn seek(&mut self, position: &Value) -> std::result::Result<(), SourceError> {
        self.inner.seek(position).await
    }
    async fn replay(
        &mut self,
        step: &Resume,
        out: &mut Records,
    ) -> std::result::Result<Step, SourceError> {
        self.inner.replay(step, out).await
    }
    async fn queue(
        &mut self,
        limits: QueueLimits,
        out: &mut Records,
    ) -> std::result::Result<Step, SourceError> {
        let mut step = self.inner.queue(limits, out).await?;
        step.unit_continues |= self.unfinished;
        if step.records > 0 {
            self.unit += step.records;
            if !step.unit_continues {
                let end = step.resume.position().expect("a position").clone();
                UNIT_ENDS.lock().unwrap().push((end, self.unit));
                self.unit = 0;
            }
        }
        Ok(step)
    }
    fn committed(&mut self, _txn: u64, position: &Value) {
        UNITS_TOLD_COMMITTED.lock().unwrap().push(position.clone());
    }
}

/// Every position a `unit_file` source was told is committed ends one of its units, and
/// some unit was larger than the transactions' `max_docs`.
fn assert_units_committed_whole(max_docs: u64) {
    let ends = UNIT_ENDS.lock().unwrap();
    let told = UNITS_TOLD_COMMITTED.lock().unwrap();
    assert!(!told.is_empty(), "the source heard of its commits");
    for position in told.iter() {
        assert!(
            ends.iter().any(|(end, _)| end == position),
            "a commit at {position}, inside a unit (unit ends: {ends:?})"
        );
    }
    let largest = ends.iter().map(|(_, records)| *records).max().unwrap();
    assert!(
        largest as u64 > max_docs,
        "a unit larger than max_docs: {ends:?}"
    );
}

/// Units of 13 documents commit whole although transactions close at 10.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_unit_larger_than_max_docs_commits_whole() {
    let h = Harness::reading("unit_file").await;
    assert_eq!(h.run_to_end().await, Vec::<String>::new());
    h.assert_exact();
    assert_units_committed_whole(FIRST_MAX_DOCS);
}

/// A source that ends its input inside a unit fails the run naming itself, and nothing
/// of the unit commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_ending_inside_a_unit_fails_and_commits_none_of_it() {
    let h = Harness::reading("unfinished_unit_file").await;
    let err = h
        .run_once(FIRST_MAX_DOCS, &mut Summary::default())
        .await
        .unwrap_err();
    assert!(
        err.contains("source input ended its input inside a unit"),
        "{err}"
    );
    assert_eq!(h.rows(), BTreeMap::new(), "nothing of the unit committed");
}

/// A crash between two steps of a unit: the restart reads the unit again whole from the
/// last checkpoint (never inside a unit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_inside_a_unit_reads_it_again_whole() {
    crash_and_recover_reading("unit_file", failpoint::AFTER_QUEUE, THIRD).await;
    assert_units_committed_whole(RESTART_MAX_DOCS);
}

/// A crash after the intent of a transaction holding a unit: the replay re-reads every
/// step of the unit, each checked against its hash.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_unit_replays_whole() {
    crash_and_recover_reading("unit_file", failpoint::AFTER_INTENT, THIRD).await;
    assert_units_committed_whole(RESTART_MAX_DOCS);
}

/// Queue calls of every `flaky_file` source of the process until the one that fails.
static QUEUES_BEFORE_FAILURE: AtomicU64 = AtomicU64::new(u64::MAX);

/// Queue calls of every `flaky_file` source of the process until the one that never
/// returns (as a client retrying an unreachable broker inside one call); `STALLED` is
/// notified when it begins.
static QUEUES_BEFORE_STALL: AtomicU64 = AtomicU64::new(u64::MAX);
static STALLED: tokio::sync::Notify = tokio::sync::Notify::const_new();

/// What every `flaky_file` source of the process was told of commits
/// (`Source::committed`): (which open of the source, transaction, position).
static TOLD_COMMITTED: Mutex<Vec<(usize, u64, Value)>> = Mutex::new(Vec::new());
static OPENS: AtomicU64 = AtomicU64::new(0);

/// The `file` source kind, whose `QUEUES_BEFORE_FAILURE`-th queue call fails once with
/// a transient I/O error (a connection reset, as a network file system gives), whose
/// `QUEUES_BEFORE_STALL`-th never returns, and which notes what it is told of commits
/// in `TOLD_COMMITTED`.
struct FlakyFileKind;

impl SourceKind for FlakyFileKind {
    const NAME: &'static str = "flaky_file";
    type Config = FileConfig;

    fn prepare(config: &mut FileConfig, base_dir: &Path) -> std::result::Result<(), InvalidConfig> {
        FileKind::prepare(config, base_dir)
    }

    fn open(
        opening: &Opening<'_>,
        config: &FileConfig,
    ) -> std::result::Result<Box<dyn Source>, SourceError> {
        Ok(Box::new(FlakyFile {
            inner: FileKind::open(opening, config)?,
            path: config.path.display().to_string(),
            open: OPENS.fetch_add(1, Ordering::SeqCst) as usize,
        }))
    }
}

struct FlakyFile {
    inner: Box<dyn Source>,
    path: String,
    open: usize,
}

#[async_trait]
impl Source for FlakyFile {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn fault_tolerance(&self) -> FaultTolerance {
        self.inner.fault_tolerance()
    }
    async fn seek(&mut self, position: &Value) -> std::result::Result<(), SourceError> {
        self.inner.seek(position).await
    }
    async fn replay(
        &mut self,
        step: &Resume,
        out: &mut Records,
    ) -> std::result::Result<Step, SourceError> {
        self.inner.replay(step, out).await
    }
    async fn queue(
        &mut self,
        limits: QueueLimits,
        out: &mut Records,
    ) -> std::result::Result<Step, SourceError> {
        if QUEUES_BEFORE_STALL.fetch_sub(1, Ordering::SeqCst) == 1 {
            STALLED.notify_one();
            std::future::pending::<()>().await;
        }
        if QUEUES_BEFORE_FAILURE.fetch_sub(1, Ordering::SeqCst) == 1 {
            return Err(SourceError::Io {
                name: self.inner.name().to_string(),
                path: self.path.clone(),
                error: std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer"),
            });
        }
        self.inner.queue(limits, out).await
    }
    fn committed(&mut self, txn: u64, position: &Value) {
        (TOLD_COMMITTED.lock().unwrap()).push((self.open, txn, position.clone()));
    }
}

/// A source hears of a transaction only once its log commit is durable: never of one
/// the crash interrupted before that (the third, between the driver's commit and the
/// log's), first of the recovered checkpoint after a restart (the third: the store
/// committed it, and the log adopts the store's checkpoint), then of every commit in
/// order, the last with the position the log holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sources_are_told_of_each_commit_once_it_is_durable() {
    let h = crash_and_recover_reading("flaky_file", failpoint::AFTER_DRIVER_COMMITTED, THIRD).await;
    let told = TOLD_COMMITTED.lock().unwrap().clone();
    let runs: Vec<usize> = told.iter().map(|(open, ..)| *open).collect();
    let (first, second) = (runs[0], *runs.last().unwrap());
    assert_ne!(first, second, "told in both runs: {told:?}");
    let txns = |run| -> Vec<u64> {
        (told.iter())
            .filter(|(open, ..)| *open == run)
            .map(|(_, txn, _)| *txn)
            .collect()
    };
    let before = txns(first);
    assert!(
        before.iter().all(|txn| *txn <= 2),
        "the first run heard of 3: {told:?}"
    );
    assert!(before.windows(2).all(|w| w[0] + 1 == w[1]), "{told:?}");
    let after = txns(second);
    let last = log_says(&h.log_dir, "last commit: transaction");
    assert_eq!(after, (3..=last).collect::<Vec<_>>(), "{told:?}");
    // One transaction's position is the same whichever run tells it.
    for (_, txn, position) in &told {
        let same = told.iter().filter(|(_, t, _)| t == txn);
        assert!(same.clone().all(|(_, _, p)| p == position), "{told:?}");
    }
    let log = RecoveryLog::open(&h.log_dir).unwrap();
    let checkpoint = log.last_commit().unwrap();
    assert_eq!(
        Some(&told.last().unwrap().2),
        checkpoint.sources.get("input")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transient_source_error_reopens_the_loop_and_the_run_ends_exact() {
    // The fifth queue call (of ten records each): after transactions were committed.
    QUEUES_BEFORE_FAILURE.store(5, Ordering::SeqCst);
    let h = Harness::reading("flaky_file").await;
    let summary = h
        .run_pipeline()
        .await
        .expect("the run recovers from the reset");
    assert_eq!(summary.restarts, 1, "{summary:?}");
    assert!(summary.transactions > 0, "{summary:?}");
    assert_eq!(h.streams().len(), 2, "reopened once");
    h.assert_exact();
}

/// A stop request ends a source call that waits (it would otherwise hold the stop for
/// as long as the call retries): the run ends cleanly with what it committed, and the
/// next run reads the rest, exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_request_ends_a_waiting_source_call_and_the_next_run_is_exact() {
    QUEUES_BEFORE_STALL.store(5, Ordering::SeqCst);
    let h = Harness::reading("flaky_file").await;
    let (stop, shutdown) = tokio::sync::watch::channel(false);
    let stopping = async {
        STALLED.notified().await;
        stop.send(true).unwrap();
    };
    // Half the source timeout (a minute): only the stop can end the call.
    let bound = Duration::from_secs(30);
    let (stopped, ()) = tokio::time::timeout(
        bound,
        futures::future::join(h.run_pipeline_until(shutdown), stopping),
    )
    .await
    .expect("the stop ended the waiting call");
    let summary = stopped.expect("a stop is a clean end");
    assert_eq!(summary.restarts, 0, "{summary:?}");
    assert!(summary.transactions > 0, "{summary:?}");
    assert!(summary.docs < DOCS, "{summary:?}");
    let rest = h.run_pipeline().await.expect("the next run reads the rest");
    assert_eq!(summary.docs + rest.docs, DOCS, "{summary:?} {rest:?}");
    h.assert_exact();
}
