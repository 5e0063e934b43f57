//! An epoch sink on the one loop, end to end: `pipeline::run` drives a small folder sink
//! (staging per epoch, applied by an idempotent rename) through `EpochDriver`, with a
//! failure injected at every commit boundary in turn; the loop reopens in-process and
//! recovery re-applies the decided descriptor and removes undecided staging.
//!
//! Checked each time: every epoch appears once, epochs are contiguous, each key's rows
//! add up to the input's sums (the sink is a change log of each transaction's reduced
//! changes), no staging is left, and the recovery log recorded an artifact intent in
//! each step intent and a descriptor in each decision.

use arrow_array::{Array, Int64Array, StringArray};
use async_trait::async_trait;
use serde_json::{Value, json};
use sluice_file::FileKind;
use sluice_runtime::config::Pipeline;
use sluice_runtime::failpoint;
use sluice_runtime::pipeline::{self, RunOptions};
use sluice_runtime::registry::Registry;
use sluice_runtime::txn::Progress;
use sluice_runtime::types::Summary;
use sluice_sink_sdk::{
    AbortCleaner, CancellationPolicy, Consistency, EpochCommitter, EpochSink, InputMode, Placement,
    RecordBatch, Recovery, RuntimeContext, SchemaPlan, SinkBinding, SinkContract, SinkError,
    SinkKind, TaskTracker, Undecided, WriteResult,
};
use sluice_source_sdk::kind;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

const DOCS: u64 = 200;
const KEYS: u64 = 7;

/// What the folder sinks of one output folder did, in order: `(instance, event)`.
/// Instances are numbered as the driver binds them (built-only sinks, for a check or an
/// Apply, never are).
#[derive(Default)]
struct Journal {
    events: Mutex<Vec<(u64, String)>>,
    bound: AtomicU64,
    /// The one stall of a run has happened.
    stalled: AtomicBool,
}

impl Journal {
    fn of(dir: &Path) -> Arc<Journal> {
        static JOURNALS: LazyLock<Mutex<HashMap<PathBuf, Arc<Journal>>>> =
            LazyLock::new(Default::default);
        JOURNALS
            .lock()
            .unwrap()
            .entry(dir.to_path_buf())
            .or_default()
            .clone()
    }

    fn record(&self, instance: u64, event: impl Into<String>) {
        self.events.lock().unwrap().push((instance, event.into()));
    }

    fn events(&self) -> Vec<(u64, String)> {
        self.events.lock().unwrap().clone()
    }
}

/// The folder sink's lifecycle knobs, from its endpoint configuration.
#[derive(Clone, Default)]
struct Knobs {
    write_timeout: Option<Duration>,
    /// The first `write_batch` of this epoch (once per run) sleeps `stall`.
    stall_epoch: Option<u64>,
    stall: Duration,
    cancel_safe: bool,
    flush_interval: Option<Duration>,
    /// Each `write_batch` leaves a task of this length on the tracker.
    background: Option<Duration>,
    handles: bool,
}

/// Stages epoch N's rows in `staging/<context>/<N>/rows.jsonl` (buffered rows are
/// appended at each flush and at pre_commit); applying renames it to
/// `table/<N>.jsonl` (idempotent: an applied epoch's file is there already).
struct FolderSink {
    dir: PathBuf,
    context: Option<RuntimeContext>,
    /// Rows written and not yet flushed to the epoch's staging file.
    staged: Vec<String>,
    epoch: Option<u64>,
    knobs: Knobs,
    journal: Arc<Journal>,
    /// Set at `bind_runtime_context`.
    instance: u64,
    /// A call of this instance was dropped at its deadline.
    cancelled: Arc<AtomicBool>,
    tasks: TaskTracker,
}

fn io(e: std::io::Error) -> SinkError {
    SinkError::External(e.to_string())
}

fn staging_dir(dir: &Path, c: &RuntimeContext, epoch: u64) -> PathBuf {
    dir.join("staging")
        .join(format!(
            "{}-{}-{}",
            c.deployment_id, c.sink_id, c.participant_id
        ))
        .join(epoch.to_string())
}

/// Applies a descriptor: the writer's `commit_epoch` and the committer handle alike.
fn apply(dir: &Path, c: &RuntimeContext, epoch: u64, descriptor: &Value) -> Result<(), SinkError> {
    let target = dir.join("table").join(format!("{epoch}.jsonl"));
    if target.exists() {
        return Ok(());
    }
    std::fs::rename(descriptor["file"].as_str().unwrap(), &target).map_err(io)?;
    let _ = std::fs::remove_dir_all(staging_dir(dir, c, epoch));
    Ok(())
}

/// Removes undecided staging: the writer's `recover` and the cleaner handle alike.
fn clean(undecided: &[Undecided]) {
    for u in undecided {
        let staging = u.intent["staging"].as_str().expect("recorded");
        let _ = std::fs::remove_dir_all(staging);
    }
}

/// Marks its instance cancelled when dropped armed: the call holding it was dropped.
struct CancelWatch(Option<(Arc<AtomicBool>, Arc<Journal>, u64, String)>);

impl Drop for CancelWatch {
    fn drop(&mut self) {
        if let Some((cancelled, journal, instance, what)) = self.0.take() {
            cancelled.store(true, Ordering::SeqCst);
            journal.record(instance, format!("cancelled {what}"));
        }
    }
}

impl FolderSink {
    fn context(&self) -> &RuntimeContext {
        self.context.as_ref().expect("bound before use")
    }

    fn staging(&self, epoch: u64) -> PathBuf {
        staging_dir(&self.dir, self.context(), epoch)
    }

    /// Records `event`; a call to an instance retired after a cancelled call is a
    /// violation of the cancellation policy.
    fn enter(&self, event: impl Into<String>) {
        let event = event.into();
        if self.cancelled.load(Ordering::SeqCst) && !self.knobs.cancel_safe {
            self.journal
                .record(self.instance, format!("violation: {event} after a cancel"));
        }
        self.journal.record(self.instance, event);
    }

    /// Appends the buffered rows to the epoch's staging file; how many.
    fn append_staged(&mut self, epoch: u64) -> Result<usize, SinkError> {
        let rows = std::mem::take(&mut self.staged);
        if rows.is_empty() {
            return Ok(0);
        }
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.staging(epoch).join("rows.jsonl"))
            .map_err(io)?;
        for row in &rows {
            writeln!(file, "{row}").map_err(io)?;
        }
        Ok(rows.len())
    }
}

#[async_trait]
impl EpochSink for FolderSink {
    fn contract(&self) -> SinkContract {
        SinkContract {
            consistency: Consistency::CheckpointCommittable,
            placement: Placement::Singleton,
            input: InputMode::FullChangelog,
        }
    }
    fn bind_runtime_context(&mut self, context: RuntimeContext) -> Result<(), SinkError> {
        assert!(!context.deployment_id.is_empty() && context.participant_id > 0);
        self.context = Some(context);
        self.instance = self.journal.bound.fetch_add(1, Ordering::SeqCst) + 1;
        self.enter("bound");
        Ok(())
    }
    fn cancellation_policy(&self) -> CancellationPolicy {
        if self.knobs.cancel_safe {
            CancellationPolicy::CancelSafe
        } else {
            CancellationPolicy::RetireOnCancel
        }
    }
    fn suggested_write_timeout(&self) -> Duration {
        self.knobs.write_timeout.unwrap_or(Duration::from_secs(60))
    }
    fn flush_interval(&self) -> Option<Duration> {
        self.knobs.flush_interval
    }
    fn terminal_task_tracker(&self) -> Option<TaskTracker> {
        Some(self.tasks.clone())
    }
    fn committer(&self) -> Option<Box<dyn EpochCommitter>> {
        self.knobs.handles.then(|| {
            Box::new(FolderHandles {
                dir: self.dir.clone(),
                context: self.context().clone(),
                journal: self.journal.clone(),
                instance: self.instance,
            }) as Box<dyn EpochCommitter>
        })
    }
    fn abort_cleaner(&self) -> Option<Box<dyn AbortCleaner>> {
        self.knobs.handles.then(|| {
            Box::new(FolderHandles {
                dir: self.dir.clone(),
                context: self.context().clone(),
                journal: self.journal.clone(),
                instance: self.instance,
            }) as Box<dyn AbortCleaner>
        })
    }
    async fn resolve_schema(&mut self, b: &[SinkBinding]) -> Result<SchemaPlan, SinkError> {
        Ok(SchemaPlan {
            actions: vec![format!("create folder table for {} binding(s)", b.len())],
            state: Value::Null,
        })
    }
    async fn prepare_schema(&mut self, _: &SchemaPlan) -> Result<(), SinkError> {
        std::fs::create_dir_all(self.dir.join("table")).map_err(io)
    }
    async fn open(&mut self, bindings: &[SinkBinding]) -> Result<(), SinkError> {
        self.enter("open");
        assert_eq!(bindings[0].key, ["id"]);
        std::fs::create_dir_all(self.dir.join("table")).map_err(io)
    }
    async fn recover(&mut self, recovery: &Recovery) -> Result<(), SinkError> {
        let undecided: Vec<u64> = recovery.undecided.iter().map(|u| u.epoch).collect();
        self.enter(format!(
            "recover decided={:?} undecided={undecided:?} applied={} cleaned={}",
            recovery.decided.as_ref().map(|d| d.epoch),
            recovery.decided_applied,
            recovery.undecided_cleaned
        ));
        if let Some(decided) = &recovery.decided
            && !recovery.decided_applied
        {
            apply(
                &self.dir,
                self.context(),
                decided.epoch,
                &decided.descriptor,
            )?;
        }
        if !recovery.undecided_cleaned {
            clean(&recovery.undecided);
        }
        // Orphans: staging of any epoch after the decided one.
        let decided = recovery.decided.as_ref().map_or(0, |d| d.epoch);
        let root = self.staging(0).parent().unwrap().to_path_buf();
        for entry in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            let epoch: u64 = entry.file_name().to_string_lossy().parse().unwrap();
            if epoch > decided {
                std::fs::remove_dir_all(entry.path()).map_err(io)?;
            }
        }
        Ok(())
    }
    fn checkpoint_artifact_intent(&self, epoch: u64) -> Option<Value> {
        Some(json!({"staging": self.staging(epoch)}))
    }
    async fn begin_epoch(&mut self, epoch: u64) -> Result<(), SinkError> {
        self.enter(format!("begin {epoch}"));
        let staging = self.staging(epoch);
        let _ = std::fs::remove_dir_all(&staging);
        self.staged.clear();
        self.epoch = Some(epoch);
        std::fs::create_dir_all(staging).map_err(io)
    }
    async fn write_batch(
        &mut self,
        _: usize,
        batch: &RecordBatch,
    ) -> Result<WriteResult, SinkError> {
        let epoch = self.epoch.expect("begun");
        self.enter(format!("write {epoch}"));
        if let Some(background) = self.knobs.background {
            let (journal, instance) = (self.journal.clone(), self.instance);
            self.tasks.spawn(async move {
                tokio::time::sleep(background).await;
                journal.record(instance, "background done");
            });
        }
        if self.knobs.stall_epoch == Some(epoch)
            && !self.journal.stalled.swap(true, Ordering::SeqCst)
        {
            let watch = CancelWatch(Some((
                self.cancelled.clone(),
                self.journal.clone(),
                self.instance,
                format!("write {epoch}"),
            )));
            tokio::time::sleep(self.knobs.stall).await;
            std::mem::forget(watch);
            self.journal.record(self.instance, "stall survived");
        }
        let col = |name: &str| batch.column_by_name(name).unwrap().clone();
        let ids = col("id");
        let ids = ids.as_any().downcast_ref::<StringArray>().unwrap();
        let ns = col("n");
        let ns = ns.as_any().downcast_ref::<Int64Array>().unwrap();
        let ops = col("_op");
        let ops = ops.as_any().downcast_ref::<StringArray>().unwrap();
        for i in 0..batch.num_rows() {
            assert!(!ids.is_null(i));
            self.staged.push(
                json!({"id": ids.value(i), "n": ns.value(i), "op": ops.value(i)}).to_string(),
            );
        }
        Ok(WriteResult {
            records: batch.num_rows(),
            bytes: 0,
        })
    }
    async fn flush(&mut self) -> Result<(), SinkError> {
        let epoch = self.epoch.expect("flushed inside an epoch");
        let rows = self.append_staged(epoch)?;
        self.enter(format!("flush {epoch} rows={rows}"));
        Ok(())
    }
    async fn pre_commit(&mut self, epoch: u64) -> Result<Option<Value>, SinkError> {
        self.enter(format!("pre_commit {epoch}"));
        self.append_staged(epoch)?;
        self.epoch = None;
        let path = self.staging(epoch).join("rows.jsonl");
        if !path.exists() {
            return Ok(None);
        }
        std::fs::File::open(&path)
            .and_then(|f| f.sync_all())
            .map_err(io)?;
        Ok(Some(json!({"file": path})))
    }
    async fn commit_epoch(&mut self, epoch: u64, descriptor: &Value) -> Result<(), SinkError> {
        self.enter(format!("commit {epoch}"));
        apply(&self.dir, self.context(), epoch, descriptor)
    }
    async fn rollback_epoch(&mut self, epoch: u64) -> Result<(), SinkError> {
        self.enter(format!("rollback {epoch}"));
        let _ = std::fs::remove_dir_all(self.staging(epoch));
        Ok(())
    }
    async fn close(&mut self) -> Result<(), SinkError> {
        self.enter("close");
        Ok(())
    }
}

/// The folder sink's committer and abort cleaner: the directory and the context only.
struct FolderHandles {
    dir: PathBuf,
    context: RuntimeContext,
    journal: Arc<Journal>,
    instance: u64,
}

#[async_trait]
impl EpochCommitter for FolderHandles {
    async fn commit_epoch(&self, epoch: u64, descriptor: &Value) -> Result<(), SinkError> {
        self.journal
            .record(self.instance, format!("committer {epoch}"));
        apply(&self.dir, &self.context, epoch, descriptor)
    }
}

#[async_trait]
impl AbortCleaner for FolderHandles {
    async fn clean(&self, undecided: &[Undecided]) -> Result<(), SinkError> {
        let epochs: Vec<u64> = undecided.iter().map(|u| u.epoch).collect();
        self.journal
            .record(self.instance, format!("cleaner {epochs:?}"));
        clean(undecided);
        Ok(())
    }
}

fn folder_sink(config: &Value) -> Result<Box<dyn EpochSink>, SinkError> {
    let dir = config["dir"]
        .as_str()
        .ok_or_else(|| SinkError::Config("dir: missing".into()))?;
    let ms = |key: &str| config[key].as_u64().map(Duration::from_millis);
    let knobs = Knobs {
        write_timeout: ms("write_timeout_ms"),
        stall_epoch: config["stall_epoch"].as_u64(),
        stall: ms("stall_ms").unwrap_or(Duration::from_secs(10)),
        cancel_safe: config["cancel_safe"] == true,
        flush_interval: ms("flush_interval_ms"),
        background: ms("background_ms"),
        handles: config["handles"] == true,
    };
    Ok(Box::new(FolderSink {
        dir: PathBuf::from(dir),
        context: None,
        staged: Vec::new(),
        epoch: None,
        knobs,
        journal: Journal::of(Path::new(dir)),
        instance: 0,
        cancelled: Arc::default(),
        tasks: TaskTracker::new(),
    }))
}

fn registry() -> Registry {
    Registry::new()
        .with_source(kind::<FileKind>())
        .with_builtin(SinkKind {
            name: "folder",
            paths: &["dir"],
            endpoint_schema: || r#"{"type":"object"}"#.into(),
            resource_schema: || r#"{"type":"object"}"#.into(),
            build: folder_sink,
            resource_path: |r| Ok(vec![r["table"].as_str().unwrap_or("t").to_string()]),
        })
}

fn write_input(dir: &Path) -> BTreeMap<String, i64> {
    let mut sums = BTreeMap::new();
    let mut text = String::new();
    for i in 0..DOCS {
        let id = format!("k{}", i % KEYS);
        let n = (i % 5 + 1) as i64;
        *sums.entry(id.clone()).or_insert(0) += n;
        text.push_str(&json!({"id": id, "n": n}).to_string());
        text.push('\n');
    }
    std::fs::write(dir.join("input.jsonl"), text).unwrap();
    sums
}

const PIPELINE: &str = r#"
collections:
  acme/counts:
    key: [/id]
    schema:
      type: object
      required: [id, n]
      reduce: {strategy: merge}
      properties:
        id: {type: string}
        n: {type: integer, reduce: {strategy: sum}}
sources:
  input: {target: acme/counts, file: {path: input.jsonl, format: json}}
materializations:
  counts:
    endpoint: {folder: {dir: out}}
    bindings: [{source: acme/counts, resource: {table: counts}, delta_updates: true}]
runtime:
  recovery_log: log
  transactions: {max_docs: 20}
"#;

/// The pipeline with the folder sink's endpoint `endpoint` (`{dir: out, …}`).
fn pipeline_text(endpoint: &str) -> String {
    PIPELINE.replace("{folder: {dir: out}}", &format!("{{folder: {endpoint}}}"))
}

/// A finished run: its folder, its summary, and what its sinks did.
struct Ran {
    dir: tempfile::TempDir,
    summary: Summary,
    journal: Arc<Journal>,
}

/// Runs the pipeline with endpoint `endpoint` to its end, with `failure` (`point`,
/// `actions`) configured meanwhile. Runs one at a time (fail points are global).
async fn run_pipeline(endpoint: &str, failure: Option<(&str, &str)>) -> Ran {
    run_pipeline_text(&pipeline_text(endpoint), failure).await
}

/// [`run_pipeline`] of the pipeline file `text`.
async fn run_pipeline_text(text: &str, failure: Option<(&str, &str)>) -> Ran {
    let dir = tempfile::tempdir().unwrap();
    write_input(dir.path());
    let scenario = fail::FailScenario::setup();
    if let Some((point, actions)) = failure {
        fail::cfg(point, actions).unwrap();
    }
    let registry = registry();
    let pipeline = Pipeline::parse(text, dir.path(), &registry).unwrap();
    let planned = pipeline::plan(&pipeline, &registry).await.unwrap();
    pipeline::apply_first_start(&pipeline, &planned, &tokio::sync::watch::channel(false).1)
        .await
        .unwrap();
    let summaries = pipeline::run(
        &pipeline,
        planned,
        RunOptions::default(),
        Arc::new(Progress::default()),
        tokio::sync::watch::channel(false).1,
    )
    .await
    .unwrap();
    if let Some((point, _)) = failure {
        fail::remove(point);
    }
    scenario.teardown();
    let journal = Journal::of(&dir.path().join("out"));
    assert!(
        journal.bound.load(Ordering::SeqCst) > 0,
        "the sink's dir is the pipeline folder's out"
    );
    Ran {
        summary: summaries[0].1.clone(),
        dir,
        journal,
    }
}

/// Runs the pipeline to its end with `actions` at `point`, then checks the table.
async fn run_with_failure(point: &str, actions: &str) {
    let ran = run_pipeline("{dir: out}", Some((point, actions))).await;
    assert!(ran.summary.restarts >= 1, "{point} never fired");
    check_exact(&ran, point);
}

/// Every epoch once, contiguous; each key's change rows add up to its sum; no staging
/// left; the log recorded each epoch's artifact intent and the last descriptor.
fn check_exact(ran: &Ran, what: &str) {
    let sums = write_input(ran.dir.path());
    let out = ran.dir.path().join("out");
    let mut epochs = BTreeSet::new();
    let mut totals = BTreeMap::new();
    for entry in std::fs::read_dir(out.join("table")).unwrap() {
        let path = entry.unwrap().path();
        let epoch: u64 = path.file_stem().unwrap().to_string_lossy().parse().unwrap();
        assert!(epochs.insert(epoch));
        let mut keys = BTreeSet::new();
        for line in std::fs::read_to_string(&path).unwrap().lines() {
            let row: Value = serde_json::from_str(line).unwrap();
            let id = row["id"].as_str().unwrap().to_string();
            assert!(keys.insert(id.clone()), "key {id} twice in epoch {epoch}");
            assert_eq!(row["op"], "U");
            *totals.entry(id).or_insert(0) += row["n"].as_i64().unwrap();
        }
    }
    assert_eq!(totals, sums, "{what}: the change log adds up to the input");
    let last = *epochs.last().unwrap();
    assert_eq!(epochs, (1..=last).collect(), "{what}: contiguous epochs");
    assert_eq!(ran.summary.last_txn, last);
    let staged: Vec<_> = walk(&out.join("staging"));
    assert!(staged.is_empty(), "{what}: staging left: {staged:?}");

    // The log recorded where each epoch staged, and the last decision's descriptor.
    let log = std::fs::read(ran.dir.path().join("log/counts/log")).unwrap();
    let log = String::from_utf8_lossy(&log);
    assert!(
        log.contains(r#""artifacts":{"counts":{"staging":"#),
        "{log}"
    );
    assert!(log.contains(r#""counts":{"descriptor":{"file":"#), "{log}");
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.path().is_dir() {
            files.extend(walk(&entry.path()));
        } else {
            files.push(entry.path());
        }
    }
    files
}

const THIRD: &str = "2*off->1*return";

macro_rules! boundary_tests {
    ($($name:ident: $point:ident,)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            run_with_failure(failpoint::$point, THIRD).await;
        }
    )*};
}

boundary_tests! {
    failing_after_the_intent_rolls_the_epoch_back: AFTER_INTENT,
    failing_after_prepared_rolls_the_begun_epoch_back: AFTER_PREPARED,
    failing_mid_store_rolls_the_epoch_back: MID_STORE,
    failing_before_the_driver_commits_rolls_back: DRIVER_BEFORE_COMMIT,
    failing_after_pre_commit_leaves_recovery_to_decide: AFTER_DRIVER_COMMITTED,
    failing_after_the_decision_reapplies_it: AFTER_LOG_COMMIT,
    failing_to_apply_reapplies_at_recovery: DRIVER_ACKNOWLEDGE,
}

/// A decided epoch whose descriptor the log holds damaged stops the run: taking it for
/// "nothing decided" would let the abort cleaner remove the staging of an epoch that
/// was decided but not yet applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_decided_epoch_refuses_to_start_and_keeps_its_staging() {
    let dir = tempfile::tempdir().unwrap();
    write_input(dir.path());
    let registry = registry();
    let pipeline = Pipeline::parse(PIPELINE, dir.path(), &registry).unwrap();
    let run = || async {
        let planned = pipeline::plan(&pipeline, &registry).await.unwrap();
        pipeline::apply_first_start(&pipeline, &planned, &tokio::sync::watch::channel(false).1)
            .await
            .unwrap();
        pipeline::run(
            &pipeline,
            planned,
            RunOptions::default(),
            Arc::new(Progress::default()),
            tokio::sync::watch::channel(false).1,
        )
        .await
    };
    let summaries = run().await.unwrap();
    let last = summaries[0].1.last_txn;

    // The next epoch was decided (its descriptor is in the log) and staged, not applied.
    let staging_root = std::fs::read_dir(dir.path().join("out/staging"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let staged = staging_root.join((last + 1).to_string()).join("rows.jsonl");
    std::fs::create_dir_all(staged.parent().unwrap()).unwrap();
    std::fs::write(&staged, "{\"id\":\"k0\",\"n\":1,\"op\":\"U\"}\n").unwrap();
    {
        let mut log =
            sluice_runtime::recovery::RecoveryLog::open(&dir.path().join("log/counts")).unwrap();
        let mut decided = log.last_commit().unwrap().clone();
        decided.txn = last + 1;
        decided.driver_checkpoints.insert(
            "counts".into(),
            json!({"epoch": "seven", "descriptor": {"file": staged}}),
        );
        log.commit(&decided).unwrap();
    }

    let err = run().await.unwrap_err().to_string();
    assert!(
        err.contains("decided epoch") && err.contains("damaged"),
        "the refusal names the damaged record: {err}"
    );
    assert!(staged.exists(), "the decided epoch's staging was removed");
}

/// What a run's sinks did, in order: `(instance, event)`.
type Events = Vec<(u64, String)>;

/// [`run_pipeline`], then [`check_exact`] (`what` names the run); the run and what its
/// sinks did.
async fn run_checked(endpoint: &str, failure: Option<(&str, &str)>, what: &str) -> (Ran, Events) {
    run_checked_text(&pipeline_text(endpoint), failure, what).await
}

/// [`run_checked`] of the pipeline file `text`.
async fn run_checked_text(text: &str, failure: Option<(&str, &str)>, what: &str) -> (Ran, Events) {
    let ran = run_pipeline_text(text, failure).await;
    check_exact(&ran, what);
    let events = ran.journal.events();
    (ran, events)
}

/// [`run_checked`] with `write_batch` of epoch 3 sleeping 20 s past the sink's 1 s
/// deadline once (`knobs`: more endpoint settings, each after a comma); no retired
/// instance is called. The run, what its sinks did, and the instance whose write was
/// dropped.
async fn run_stalled(knobs: &str, what: &str) -> (Ran, Events, u64) {
    let endpoint =
        format!("{{dir: out, write_timeout_ms: 1000, stall_epoch: 3, stall_ms: 20000{knobs}}}");
    let (ran, events) = run_checked(&endpoint, None, what).await;
    let violations: Vec<_> = (events.iter())
        .filter(|(_, e)| e.contains("violation"))
        .collect();
    assert!(
        violations.is_empty(),
        "{what}: a retired instance was called: {violations:?}"
    );
    let stalled = stalled_instance(&events);
    (ran, events, stalled)
}

/// The events of `instance`.
fn of(events: &[(u64, String)], instance: u64) -> Vec<&str> {
    (events.iter())
        .filter(|(i, _)| *i == instance)
        .map(|(_, e)| e.as_str())
        .collect()
}

/// The instance whose `write 3` was dropped at its deadline.
fn stalled_instance(events: &[(u64, String)]) -> u64 {
    let stalled: Vec<u64> = (events.iter())
        .filter(|(_, e)| e == "cancelled write 3")
        .map(|(i, _)| *i)
        .collect();
    assert_eq!(
        stalled.len(),
        1,
        "one write was dropped at its deadline: {events:?}"
    );
    stalled[0]
}

/// `write_batch` of epoch 3 sleeps past the sink's 1 s deadline once. The driver drops
/// the call and retires the instance (the default policy): it is never called again (no
/// rollback, no close), a new instance is built, bound, opened and recovered with epoch
/// 3 undecided, the epoch fails retryably, and the run ends exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_past_its_deadline_retires_the_sink_and_a_new_instance_recovers() {
    let (ran, events, old) = run_stalled("", "a retired sink").await;
    assert!(
        ran.summary.restarts >= 1,
        "the dropped write failed its epoch"
    );
    assert_eq!(
        of(&events, old).last(),
        Some(&"cancelled write 3"),
        "nothing of the retired instance after its cancelled call: {events:?}"
    );
    assert_eq!(
        of(&events, old + 1),
        [
            "bound",
            "open",
            "recover decided=Some(2) undecided=[3] applied=false cleaned=false",
            "close"
        ],
        "the replacement recovers epoch 3 as garbage, then the stream ends: {events:?}"
    );
    assert!(!events.iter().any(|(_, e)| e == "stall survived"));
}

/// A sink's suggested write timeout feeds the runtime's: with `runtime.timeouts.driver`
/// at 1 s, a write of 2.5 s within the sink's 5 s deadline completes, and the runtime,
/// whose wait outlasts the sink's deadline, neither times out nor restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_waits_out_a_write_within_the_sinks_suggested_timeout() {
    let text = pipeline_text("{dir: out, write_timeout_ms: 5000, stall_epoch: 3, stall_ms: 2500}")
        .replace(
            "  transactions: {max_docs: 20}",
            "  transactions: {max_docs: 20}\n  timeouts: {driver: 1s}",
        );
    assert!(text.contains("timeouts: {driver: 1s}"));
    let (ran, events) = run_checked_text(&text, None, "a slow write within its deadline").await;
    assert!(
        events.iter().any(|(_, e)| e == "stall survived"),
        "the slow write completed: {events:?}"
    );
    assert_eq!(
        ran.summary.restarts, 0,
        "no timeout, no restart: {events:?}"
    );
}

/// The same stall on a cancel-safe sink: the instance is kept, epoch 3 rolls back on
/// it, and no instance is built until the runtime reopens the loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_safe_sink_is_kept_past_a_deadline_and_rolls_the_epoch_back() {
    let (_, events, kept) = run_stalled(", cancel_safe: true", "a cancel-safe sink").await;
    let after: Vec<&str> = of(&events, kept)
        .into_iter()
        .skip_while(|e| *e != "cancelled write 3")
        .collect();
    assert_eq!(
        after,
        ["cancelled write 3", "rollback 3", "close"],
        "{events:?}"
    );
    let next = of(&events, kept + 1);
    assert_eq!(
        next.get(..3),
        Some(
            &[
                "bound",
                "open",
                "recover decided=Some(2) undecided=[3] applied=false cleaned=false"
            ][..]
        ),
        "the next instance is the reopened loop's: {events:?}"
    );
    assert!(next.contains(&"begin 3"), "{events:?}");
}

/// Every write leaves a 2 s task on the sink's tracker; the write of epoch 3 is dropped
/// at its 1 s deadline. The retired instance's task ends before the replacement is even
/// built: two instances never overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retired_sinks_background_work_ends_before_its_replacement_starts() {
    let (_, events, old) = run_stalled(", background_ms: 2000", "background work").await;
    let at = |wanted: &(u64, &str)| {
        (events.iter())
            .position(|(i, e)| (*i, e.as_str()) == *wanted)
            .unwrap_or_else(|| panic!("no {wanted:?} in {events:?}"))
    };
    let last_done = (events.iter())
        .rposition(|(i, e)| *i == old && e == "background done")
        .unwrap_or_else(|| panic!("the retired instance's task never ended: {events:?}"));
    assert!(
        last_done < at(&(old + 1, "bound")),
        "the replacement started beside the retired instance's task: {events:?}"
    );
}

/// A flush interval of zero: after each Store the driver hands the sink the rows it
/// holds and flushes, so rows reach staging before `pre_commit`; without an interval
/// (every other test) no flush runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushes_run_on_the_sinks_interval_within_each_epoch() {
    let (ran, events) = run_checked("{dir: out, flush_interval_ms: 0}", None, "flushes").await;
    for epoch in 1..=ran.summary.last_txn {
        let within: Vec<&str> = (events.iter())
            .map(|(_, e)| e.as_str())
            .skip_while(|e| *e != format!("begin {epoch}"))
            .take_while(|e| *e != format!("pre_commit {epoch}"))
            .collect();
        assert!(
            within
                .iter()
                .any(|e| e.starts_with(&format!("flush {epoch} rows=")) && !e.ends_with("=0")),
            "epoch {epoch} flushed no rows before pre_commit: {within:?}"
        );
    }

    let (_, events) = run_checked(
        "{dir: out, flush_interval_ms: 3600000}",
        None,
        "no flush due",
    )
    .await;
    assert!(
        !events.iter().any(|(_, e)| e.starts_with("flush")),
        "an hour never passed: {events:?}"
    );
}

/// With the sink's committer and abort cleaner, recovery applies the decided descriptor
/// and removes the undecided staging through them, before the writer opens, and tells
/// `recover` so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_applies_and_cleans_through_the_sinks_handles() {
    const HANDLES: &str = "{dir: out, handles: true}";

    // Decided, not applied: the committer applies it at the restart.
    let failure = Some((failpoint::AFTER_LOG_COMMIT, THIRD));
    let (_, events) = run_checked(HANDLES, failure, "the committer").await;
    let (restarted, committed) = (events.iter())
        .find_map(|(i, e)| Some((*i, e.strip_prefix("committer ")?.parse::<u64>().ok()?)))
        .unwrap_or_else(|| panic!("the committer never applied the decided epoch: {events:?}"));
    let seen = of(&events, restarted);
    let recovered =
        format!("recover decided=Some({committed}) undecided=[] applied=true cleaned=true");
    assert_eq!(
        seen.get(..5),
        Some(
            &[
                "bound",
                "cleaner []",
                &format!("committer {committed}"),
                "open",
                &recovered
            ][..]
        ),
        "{events:?}"
    );
    assert!(
        !of(&events, restarted - 1).contains(&format!("commit {committed}").as_str()),
        "the epoch was applied before the failure: {events:?}"
    );

    // Undecided: the cleaner removes its staging at the restart.
    let failure = Some((failpoint::MID_STORE, THIRD));
    let (_, events) = run_checked(HANDLES, failure, "the cleaner").await;
    let cleaned: Vec<(u64, &str)> = (events.iter())
        .filter(|(_, e)| e.starts_with("cleaner [") && e != "cleaner []")
        .map(|(i, e)| (*i, e.as_str()))
        .collect();
    let [(restarted, cleaner)] = cleaned[..] else {
        panic!("one restart cleaned undecided staging: {events:?}");
    };
    let seen = of(&events, restarted);
    assert_eq!(
        seen[..2],
        ["bound", cleaner],
        "before the writer opens: {events:?}"
    );
    let epochs = cleaner.trim_start_matches("cleaner ");
    let recover = seen.iter().find(|e| e.starts_with("recover")).unwrap();
    assert!(
        recover.contains(&format!("undecided={epochs}")) && recover.ends_with("cleaned=true"),
        "{events:?}"
    );
}
