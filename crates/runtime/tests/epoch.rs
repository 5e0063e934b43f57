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
use sluice_sink_sdk::{
    Consistency, EpochSink, InputMode, Placement, RecordBatch, Recovery, RuntimeContext,
    SchemaPlan, SinkBinding, SinkContract, SinkError, SinkKind, WriteResult,
};
use sluice_source_sdk::kind;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

const DOCS: u64 = 200;
const KEYS: u64 = 7;

/// Stages epoch N's rows in `staging/<context>/<N>/rows.jsonl`; applying renames it to
/// `table/<N>.jsonl` (idempotent: an applied epoch's file is there already).
struct FolderSink {
    dir: PathBuf,
    context: Option<RuntimeContext>,
    staged: Vec<String>,
}

fn io(e: std::io::Error) -> SinkError {
    SinkError::External(e.to_string())
}

impl FolderSink {
    fn staging(&self, epoch: u64) -> PathBuf {
        let c = self.context.as_ref().expect("bound before use");
        self.dir
            .join("staging")
            .join(format!(
                "{}-{}-{}",
                c.deployment_id, c.sink_id, c.participant_id
            ))
            .join(epoch.to_string())
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
        Ok(())
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
        assert_eq!(bindings[0].key, ["id"]);
        std::fs::create_dir_all(self.dir.join("table")).map_err(io)
    }
    async fn recover(&mut self, recovery: &Recovery) -> Result<(), SinkError> {
        if let Some(decided) = &recovery.decided {
            self.commit_epoch(decided.epoch, &decided.descriptor)
                .await?;
        }
        for undecided in &recovery.undecided {
            let staging = undecided.intent["staging"].as_str().expect("recorded");
            let _ = std::fs::remove_dir_all(staging);
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
        let staging = self.staging(epoch);
        let _ = std::fs::remove_dir_all(&staging);
        self.staged.clear();
        std::fs::create_dir_all(staging).map_err(io)
    }
    async fn write_batch(
        &mut self,
        _: usize,
        batch: &RecordBatch,
    ) -> Result<WriteResult, SinkError> {
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
    async fn pre_commit(&mut self, epoch: u64) -> Result<Option<Value>, SinkError> {
        if self.staged.is_empty() {
            return Ok(None);
        }
        let path = self.staging(epoch).join("rows.jsonl");
        let rows: String = self.staged.iter().map(|r| format!("{r}\n")).collect();
        std::fs::write(&path, rows).map_err(io)?;
        std::fs::File::open(&path)
            .and_then(|f| f.sync_all())
            .map_err(io)?;
        Ok(Some(json!({"file": path})))
    }
    async fn commit_epoch(&mut self, epoch: u64, descriptor: &Value) -> Result<(), SinkError> {
        let target = self.dir.join("table").join(format!("{epoch}.jsonl"));
        if target.exists() {
            return Ok(());
        }
        std::fs::rename(descriptor["file"].as_str().unwrap(), &target).map_err(io)?;
        let _ = std::fs::remove_dir_all(self.staging(epoch));
        Ok(())
    }
    async fn rollback_epoch(&mut self, epoch: u64) -> Result<(), SinkError> {
        let _ = std::fs::remove_dir_all(self.staging(epoch));
        Ok(())
    }
}

fn folder_sink(config: &Value) -> Result<Box<dyn EpochSink>, SinkError> {
    let dir = config["dir"]
        .as_str()
        .ok_or_else(|| SinkError::Config("dir: missing".into()))?;
    Ok(Box::new(FolderSink {
        dir: PathBuf::from(dir),
        context: None,
        staged: Vec::new(),
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
    bindings: [{source: acme/counts, resource: {table: counts}}]
runtime:
  recovery_log: log
  transactions: {max_docs: 20}
"#;

/// Runs the pipeline to its end with `actions` at `point`, then checks the table.
async fn run_with_failure(point: &str, actions: &str) {
    let dir = tempfile::tempdir().unwrap();
    let sums = write_input(dir.path());
    let scenario = fail::FailScenario::setup();
    fail::cfg(point, actions).unwrap();
    let registry = registry();
    let pipeline = Pipeline::parse(PIPELINE, dir.path(), &registry).unwrap();
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
    fail::remove(point);
    scenario.teardown();
    let (_, summary) = &summaries[0];
    assert!(summary.restarts >= 1, "{point} never fired");

    // Every epoch once, contiguous; each key's change rows add up to its sum.
    let out = dir.path().join("out");
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
    assert_eq!(totals, sums, "{point}: the change log adds up to the input");
    let last = *epochs.last().unwrap();
    assert_eq!(epochs, (1..=last).collect(), "{point}: contiguous epochs");
    assert_eq!(summary.last_txn, last);
    let staged: Vec<_> = walk(&out.join("staging"));
    assert!(staged.is_empty(), "{point}: staging left: {staged:?}");

    // The log recorded where each epoch staged, and the last decision's descriptor.
    let log = std::fs::read(dir.path().join("log/counts/log")).unwrap();
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
