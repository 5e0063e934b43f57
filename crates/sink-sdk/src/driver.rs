//! An [`EpochSink`] on the one loop: [`EpochDriver`] speaks the Flow driver protocol in
//! process, as a driver of the idempotent-apply pattern, and uses the transactor's calls
//! beside the protocol (`sluice_driver_sdk::traits`) for what the recovery log records
//! of the sink: its artifact intents and its descriptors.
//!
//! ```text
//!  open_with_log(checkpoint {epoch, descriptor}, log)   build, bind context, abort cleaner(undecided),
//!                                      committer(decided), open, recover(what is left)
//!  artifact_intent(N)                  checkpoint_artifact_intent(N): into the runtime's Intent(N)
//!  Prepare(runtime checkpoint of N)    begin_epoch(N)              Prepared: no change
//!  Store*                              Arrow batches of bounded size → write_batch;
//!                                      flush_interval passed: the rows held → write_batch, flush
//!  Commit                              last batches; pre_commit(N) → descriptor
//!  decision(N)                         {epoch, descriptor}: into the runtime's Commit(N)
//!  report()                            rows' bytes buffered, epochs_committed
//!  Acknowledge                         commit_epoch(N, descriptor): the decision is durable
//!  end of the stream                   close; the instance's tracked tasks awaited
//! ```
//!
//! An epoch sink receives each transaction's reduced changes: a binding is a delta one
//! (Validate says so, and nothing is loaded) unless the sink [`EpochSink::loads`] it,
//! and then it is standard: the runtime's Loads (deferred by the serve loop until the
//! prior epoch's `commit_epoch` returned) are the sink's [`EpochSink::load`], each
//! Load's packed keys decoded into a batch of the key columns. A standard binding the
//! pipeline file makes a delta one (`delta_updates: true`) is refused at Open, naming
//! it. A failure before `pre_commit`
//! returned rolls the epoch back; after it only recovery decides, from what the
//! recovery log holds: the last descriptor is re-applied and undecided staging removed.
//!
//! Deadlines: every sink call of a stream (`begin_epoch` to `close`) is bounded by the
//! sink's `suggested_write_timeout` (the runtime's `runtime.timeouts.driver` does not
//! reach an in-process driver, so it caps nothing here; the default suggestion stays
//! well inside the runtime's default). A call past it is dropped and the epoch fails with
//! a retryable error, so the runtime reopens the loop and replays the transaction. Before
//! that error returns, the sink's cancellation policy is honoured: a cancel-safe instance
//! rolls the epoch back and stays; a retire-on-cancel instance is dropped unclosed, its
//! tracked tasks are awaited (bounded by `TASKS_BOUND`; past it the run stops rather than
//! let two instances overlap), and a new instance is built from the kept [`SinkKind`],
//! configuration, context and bindings, then recovered with the last durable decision and
//! this stream's undecided intents (the failing epoch's staging included) as garbage.
//!
//! Flushes run between calls, never beside one: after a Store is taken, when the sink's
//! `flush_interval` has passed since the epoch began or last flushed.

use crate::arrow::{BatchBuilder, binding_schema};
use crate::tasks::TaskTracker;
use crate::{
    CancellationPolicy, Decided, EpochSink, InputMode, Recovery, RuntimeContext, SinkBinding,
    SinkContract, SinkError, Undecided,
};
use async_trait::async_trait;
use serde_json::{Value, json};
use sluice_driver_sdk::arena::{load_keys, store_docs};
use sluice_driver_sdk::flow::{self, EndpointType, MaterializationSpec};
use sluice_driver_sdk::materialize::constraint::Type;
use sluice_driver_sdk::materialize::{
    self as m,
    transaction_request::{Load, Open, Prepare, Store},
    transaction_response::Opened,
};
use sluice_driver_sdk::validate::ProjectionRules;
use sluice_driver_sdk::{
    BuiltinKind, CommitPattern, Declared, Driver, Error, InvalidConfig, LoadedSink, LogContext,
    Metric, PriorState, Report, Result, Transactor,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Rows per Arrow batch, at most.
const BATCH_ROWS: usize = 16 * 1024;
/// Bytes of packed values and documents per Arrow batch, about.
const BATCH_BYTES: usize = 16 << 20;

/// An epoch sink kind, as a binary registers it.
#[derive(Clone, Copy)]
pub struct SinkKind {
    /// Its key in an endpoint of the pipeline file (`iceberg`).
    pub name: &'static str,
    /// Keys of its configuration that hold paths (dotted inside an object: `tls.ca`).
    pub paths: &'static [&'static str],
    /// The JSON schemas of its endpoint configuration and of a binding's resource
    /// (derived from the types they are parsed with).
    pub endpoint_schema: fn() -> String,
    pub resource_schema: fn() -> String,
    /// A sink of this configuration, checked strictly; opens nothing.
    pub build: fn(&Value) -> Result<Box<dyn EpochSink>, SinkError>,
    /// The resource path of a binding's resource configuration (its table).
    pub resource_path: fn(&Value) -> Result<Vec<String>, SinkError>,
}

impl BuiltinKind for SinkKind {
    fn name(&self) -> &'static str {
        self.name
    }

    fn endpoint_type(&self) -> EndpointType {
        EndpointType::SluiceEpochSink
    }

    fn paths(&self) -> &'static [&'static str] {
        self.paths
    }

    fn check(&self, config: &Value) -> std::result::Result<(), InvalidConfig> {
        (self.build)(config)
            .map(drop)
            .map_err(|e| InvalidConfig::new("", e.to_string()))
    }

    fn contract(&self, config: &Value) -> std::result::Result<Option<SinkContract>, String> {
        let sink = (self.build)(config).map_err(|e| e.to_string())?;
        Ok(Some(sink.contract()))
    }

    /// A call's deadline, plus the bound on the tasks a retired instance leaves: the
    /// runtime's wait outlasts both, so the driver, not the runtime, gives up first.
    fn longest_call(&self, config: &Value) -> Option<Duration> {
        let sink = (self.build)(config).ok()?;
        Some(sink.suggested_write_timeout() + TASKS_BOUND)
    }

    /// `state_dir` holds what a sink derives from its target (Iceberg's upsert index):
    /// a cache of the member running it, rebuilt or brought up to the target at open,
    /// so the sink may move between a cluster's members. What it names its staging by,
    /// the deployment id, is the runtime's (a cluster keeps one in etcd for all).
    fn driver(&self, state_dir: Option<&Path>) -> Option<Arc<dyn Driver>> {
        Some(Arc::new(EpochDriver::new(*self, state_dir)))
    }
}

/// The descriptor of the last decided epoch, as the recovery log keeps it (the driver
/// checkpoint of the materialization).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DecidedRecord {
    pub epoch: u64,
    pub descriptor: Value,
}

impl DecidedRecord {
    pub fn to_value(&self) -> Value {
        json!({"epoch": self.epoch, "descriptor": self.descriptor})
    }
}

/// The decided epoch the recovery log hands back at Open: none for no record or `{}`
/// (nothing decided yet), else a [`DecidedRecord`]. Anything else is corruption, never
/// "nothing decided": the abort cleaner would then delete the staging of an epoch that
/// was decided but not yet applied.
pub fn decided_epoch(materialization: &str, checkpoint: &[u8]) -> Result<Option<Decided>> {
    if checkpoint.is_empty() {
        return Ok(None);
    }
    let corrupt = |why: String| Error::Store {
        context: format!("reading the decided epoch of {materialization:?} from the recovery log"),
        message: format!(
            "the record is damaged ({why}): refusing to start, since the abort cleaner \
             could remove the staging of a decided epoch; restore the log, or start over \
             with `sluice apply --delete`"
        ),
        retryable: false,
    };
    let value: Value = serde_json::from_slice(checkpoint).map_err(|e| corrupt(e.to_string()))?;
    if value.as_object().is_some_and(|o| o.is_empty()) {
        return Ok(None);
    }
    let record: DecidedRecord =
        serde_json::from_value(value).map_err(|e| corrupt(e.to_string()))?;
    Ok(Some(Decided {
        epoch: record.epoch,
        descriptor: record.descriptor,
    }))
}

/// An epoch sink as an in-process driver of the idempotent-apply pattern.
pub struct EpochDriver {
    kind: SinkKind,
    /// The endpoint's folder beside the recovery log, when the runtime gave one.
    state_dir: Option<PathBuf>,
}

/// A binding as the driver keeps it: the sink's view of it, the builder of its Store
/// batches, and the builder of its Load keys.
type Shaped = (SinkBinding, BatchBuilder, BatchBuilder);

impl EpochDriver {
    pub fn new(kind: SinkKind, state_dir: Option<&Path>) -> EpochDriver {
        EpochDriver {
            kind,
            state_dir: state_dir.map(Path::to_path_buf),
        }
    }

    fn build(&self, endpoint_spec_json: &str) -> Result<Box<dyn EpochSink>> {
        let config: Value = serde_json::from_str(endpoint_spec_json)
            .map_err(|e| Error::Config(format!("endpoint config is not JSON: {e}")))?;
        (self.kind.build)(&config).map_err(sink_error)
    }

    /// The sink's bindings of `spec`, their Arrow schemas as `contract` shapes them. A
    /// binding the sink loads must have stayed standard: the pipeline file's
    /// `delta_updates: true` on it is refused, naming it.
    fn bindings(&self, spec: &MaterializationSpec, sink: &dyn EpochSink) -> Result<Vec<Shaped>> {
        let keyed = sink.contract().input != InputMode::AppendOnly;
        (spec.bindings.iter().enumerate())
            .map(|(i, binding)| {
                let columns = binding_schema(binding, keyed).map_err(sink_error)?;
                let resource = serde_json::from_str(&binding.resource_spec_json)
                    .map_err(|e| Error::Config(format!("resource config is not JSON: {e}")))?;
                if binding.delta_updates && sink.loads(&resource).map_err(sink_error)? {
                    return Err(Error::Config(format!(
                        "{}.bindings[{i}] ({}) is a standard binding of this sink (it keeps \
                         one row per key, reduced onto the stored document), but the \
                         pipeline makes it a delta one: remove `delta_updates: true`, or \
                         choose the sink's change-log mode",
                        spec.materialization, binding.resource_spec_json
                    )));
                }
                let sink_binding = SinkBinding {
                    resource,
                    schema: columns.schema.clone(),
                    key: columns.key.clone(),
                };
                let keys = BatchBuilder::new(columns.keys_only(), BATCH_ROWS, BATCH_BYTES);
                Ok((
                    sink_binding,
                    BatchBuilder::new(columns, BATCH_ROWS, BATCH_BYTES),
                    keys,
                ))
            })
            .collect()
    }

    async fn apply(&self, req: m::ApplyRequest, delete: bool) -> Result<m::ApplyResponse> {
        let spec = req
            .materialization
            .ok_or_else(|| Error::Config("Apply without a materialization".into()))?;
        let mut sink = self.build(&spec.endpoint_spec_json)?;
        let bindings: Vec<SinkBinding> = self
            .bindings(&spec, sink.as_ref())?
            .into_iter()
            .map(|(b, _, _)| b)
            .collect();
        let actions = if delete {
            sink.drop_schema(&bindings, req.dry_run)
                .await
                .map_err(sink_error)?
        } else {
            let plan = sink.resolve_schema(&bindings).await.map_err(sink_error)?;
            if !req.dry_run {
                sink.prepare_schema(&plan).await.map_err(sink_error)?;
            }
            plan.actions
        };
        Ok(m::ApplyResponse {
            action_description: actions.join("\n"),
            driver_checkpoint: None,
        })
    }
}

/// A sink's error as a driver error, retryable as the sink says (also what the runtime
/// reports of a sink's failure outside the protocol).
pub fn sink_error(err: SinkError) -> Error {
    match err {
        SinkError::Config(message) => Error::Config(message),
        other => Error::Store {
            context: "epoch sink".into(),
            retryable: other.is_retryable(),
            message: other.to_string(),
        },
    }
}

#[async_trait]
impl Driver for EpochDriver {
    /// An epoch is applied idempotently once the recovery log holds its decision. Delta
    /// bindings always; standard ones where the sink loads them ([`EpochSink::loads`],
    /// per binding: Validate says which), their Loads deferred until the prior epoch is
    /// applied, as the pattern has every Load.
    fn declared(&self) -> Declared {
        Declared {
            pattern: CommitPattern::RecoveryLogIdempotentApply,
            deletes: false,
            delta_updates: true,
            strict_exists: false,
            rebuilds_on_backfill: false,
        }
    }

    async fn spec(&self, _req: m::SpecRequest) -> Result<m::SpecResponse> {
        Ok(m::SpecResponse {
            endpoint_spec_schema_json: (self.kind.endpoint_schema)(),
            resource_spec_schema_json: (self.kind.resource_schema)(),
            documentation_url: String::new(),
        })
    }

    /// Keys are required; the document is recommended (a change log keeps it), and
    /// required for a binding the sink loads (Load hands it back), every other field
    /// optional. Delta updates, unless the sink loads the binding: then standard.
    async fn validate(&self, req: m::ValidateRequest) -> Result<m::ValidateResponse> {
        let sink = self.build(&req.endpoint_spec_json)?;
        let bindings = req.bindings.iter().map(|binding| {
            let resource: Value = serde_json::from_str(&binding.resource_spec_json)
                .map_err(|e| Error::Config(format!("resource config is not JSON: {e}")))?;
            let resource_path = (self.kind.resource_path)(&resource).map_err(sink_error)?;
            let standard = sink.loads(&resource).map_err(sink_error)?;
            let collection = binding.collection.clone().unwrap_or_default();
            let document = if standard {
                (
                    Type::LocationRequired,
                    "the document, which Load hands back",
                )
            } else {
                (Type::LocationRecommended, "the document, as JSON text")
            };
            let constraints = ProjectionRules {
                key: "part of the key",
                document,
                top_level: (Type::LocationRecommended, "a top-level field"),
                nested: (Type::FieldOptional, "a nested field"),
            }
            .constraints(&collection);
            Ok(m::validate_response::Binding {
                constraints: constraints.collect(),
                resource_path,
                delta_updates: !standard,
            })
        });
        Ok(m::ValidateResponse {
            bindings: bindings.collect::<Result<_>>()?,
        })
    }

    async fn apply_upsert(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        self.apply(req, false).await
    }

    async fn apply_delete(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        self.apply(req, true).await
    }

    async fn open(&self, open: Open) -> Result<(Box<dyn Transactor>, Opened)> {
        self.open_with_log(open, LogContext::default()).await
    }

    /// Binds the sink to the deployment and recovers it: the log's last descriptor is
    /// applied again, and what its undecided epochs staged is removed.
    async fn open_with_log(
        &self,
        open: Open,
        log: LogContext,
    ) -> Result<(Box<dyn Transactor>, Opened)> {
        let spec = open
            .materialization
            .clone()
            .ok_or_else(|| Error::Config("Open without a materialization".into()))?;
        let config: Value = serde_json::from_str(&spec.endpoint_spec_json)
            .map_err(|e| Error::Config(format!("endpoint config is not JSON: {e}")))?;
        let probe = (self.kind.build)(&config).map_err(sink_error)?;
        let mut bindings = Vec::new();
        let mut builders = Vec::new();
        let mut keys = Vec::new();
        for (binding, batches, key_batches) in self.bindings(&spec, probe.as_ref())? {
            bindings.push(binding);
            builders.push(batches);
            keys.push(key_batches);
        }
        let recipe = Recipe {
            kind: self.kind,
            config,
            context: RuntimeContext {
                deployment_id: log.deployment_id,
                sink_id: spec.materialization.clone(),
                participant_id: u64::from(open.key_begin) + 1,
            },
            state_dir: self.state_dir.clone(),
            bindings,
        };
        let decided = decided_epoch(&spec.materialization, &open.driver_checkpoint_json)?;
        let instance = recipe.start(1, decided.clone(), log.undecided).await?;
        let transactor = EpochTransactor {
            recipe,
            instance: Some(instance),
            builders,
            keys,
            epoch: None,
            to_apply: None,
            last_decided: decided,
            intents: Vec::new(),
            committed: None,
            epochs_committed: 0,
        };
        Ok((Box::new(transactor), Opened::default()))
    }
}

/// How long the background tasks of an instance being dropped or replaced may take to
/// end: a tracked task is one batch's encoding or a file's close, seconds at most; a
/// minute means it hangs, and the next instance must not start beside it.
const TASKS_BOUND: Duration = Duration::from_secs(60);

/// What the driver keeps to build its sink again: the kind, the endpoint configuration,
/// the runtime context, the state folder and the bindings.
struct Recipe {
    kind: SinkKind,
    config: Value,
    context: RuntimeContext,
    state_dir: Option<PathBuf>,
    bindings: Vec<SinkBinding>,
}

/// One built, opened and recovered instance of the sink, with what the driver read of
/// it once.
struct Instance {
    /// 1 for the stream's first instance, then one more per replacement (for logs).
    number: u64,
    sink: Box<dyn EpochSink>,
    policy: CancellationPolicy,
    deadline: Duration,
    flush_interval: Option<Duration>,
    tasks: Option<TaskTracker>,
}

impl Instance {
    /// Drops the sink, then waits until its background tasks have ended. Postcondition
    /// of `Ok`: nothing of this instance runs any more.
    async fn retire(self) -> Result<()> {
        let Instance {
            number,
            sink,
            tasks,
            ..
        } = self;
        drop(sink);
        match tasks {
            Some(tasks) => tasks.wait(TASKS_BOUND).await.map_err(|e| Error::Store {
                context: "epoch sink".into(),
                message: format!(
                    "instance {number} of the sink is done, but {e}: refusing to start \
                     another instance beside its work (the sink's tasks must end once it \
                     is dropped)"
                ),
                retryable: false,
            }),
            None => Ok(()),
        }
    }
}

impl Recipe {
    /// Builds instance `number`, binds its context, and recovers it: the abort cleaner
    /// removes `undecided`'s staging and the committer applies `decided` (each if the
    /// sink has the handle), then `open`, then `recover` with what is left to do. On
    /// failure the instance is retired before the error returns.
    async fn start(
        &self,
        number: u64,
        decided: Option<Decided>,
        undecided: Vec<Undecided>,
    ) -> Result<Instance> {
        let sink = (self.kind.build)(&self.config).map_err(sink_error)?;
        let mut instance = Instance {
            number,
            policy: sink.cancellation_policy(),
            deadline: sink.suggested_write_timeout(),
            flush_interval: sink.flush_interval(),
            tasks: sink.terminal_task_tracker(),
            sink,
        };
        let recovery = Recovery {
            decided,
            undecided,
            decided_applied: false,
            undecided_cleaned: false,
        };
        match self.recover(&mut instance, recovery).await {
            Ok(()) => Ok(instance),
            Err(err) => {
                instance.retire().await?;
                Err(err)
            }
        }
    }

    async fn recover(&self, instance: &mut Instance, mut recovery: Recovery) -> Result<()> {
        let sink = &mut instance.sink;
        sink.bind_runtime_context(self.context.clone())
            .map_err(sink_error)?;
        if let Some(dir) = &self.state_dir {
            sink.bind_state_dir(dir).map_err(sink_error)?;
        }
        if let Some(cleaner) = sink.abort_cleaner() {
            cleaner
                .clean(&recovery.undecided)
                .await
                .map_err(sink_error)?;
            recovery.undecided_cleaned = true;
        }
        if let (Some(committer), Some(decided)) = (sink.committer(), &recovery.decided) {
            (committer
                .commit_epoch(decided.epoch, &decided.descriptor)
                .await)
                .map_err(sink_error)?;
            recovery.decided_applied = true;
        }
        sink.open(&self.bindings).await.map_err(sink_error)?;
        sink.recover(&recovery).await.map_err(sink_error)
    }
}

/// One Transactions stream of an epoch sink.
struct EpochTransactor {
    recipe: Recipe,
    /// `None` once an instance was retired and its replacement failed to start: the
    /// stream then fails every call.
    instance: Option<Instance>,
    builders: Vec<BatchBuilder>,
    /// Per binding, the builder of a Load's keys as a batch of the key columns.
    keys: Vec<BatchBuilder>,
    /// The epoch begun and not yet pre-committed, and when it last flushed.
    epoch: Option<(u64, Instant)>,
    /// The descriptor `pre_commit` returned, to record in the epoch's commit and to apply
    /// once the runtime acknowledges it.
    to_apply: Option<(u64, Value)>,
    /// The last decision whose record is durable: what a replacement instance recovers.
    last_decided: Option<Decided>,
    /// The artifact intents handed out this stream whose epochs are not decided yet:
    /// what a replacement instance removes as garbage.
    intents: Vec<Undecided>,
    /// The epoch pre-committed last: the one the next Acknowledge acknowledges.
    committed: Option<u64>,
    /// Epochs this stream pre-committed ([`Transactor::report`]).
    epochs_committed: u64,
}

/// Runs one call of the sink under the instance's deadline, and settles a dropped call
/// by the instance's cancellation policy ([`EpochTransactor::settle`]).
macro_rules! bounded {
    ($self:ident, $what:expr, |$sink:ident| $call:expr) => {{
        let instance = $self.live()?;
        let deadline = instance.deadline;
        let $sink = instance.sink.as_mut();
        let outcome = tokio::time::timeout(deadline, $call).await;
        $self.settle($what, deadline, outcome).await
    }};
}

impl EpochTransactor {
    fn live(&mut self) -> Result<&mut Instance> {
        self.instance.as_mut().ok_or_else(|| Error::Store {
            context: "epoch sink".into(),
            message: "the sink was retired and no instance replaced it".into(),
            retryable: true,
        })
    }

    /// A call's outcome as the driver's: a call that returned is its result; a call
    /// dropped at its deadline is a retryable error, after which a cancel-safe instance
    /// stays and a retire-on-cancel one is replaced ([`EpochTransactor::replace`]).
    async fn settle<T>(
        &mut self,
        what: &str,
        deadline: Duration,
        outcome: std::result::Result<Result<T, SinkError>, tokio::time::error::Elapsed>,
    ) -> Result<T> {
        let returned = match outcome {
            Ok(returned) => return returned.map_err(sink_error),
            Err(_) => Error::Store {
                context: "epoch sink".into(),
                message: format!(
                    "{what} did not return within {deadline:?} (the sink's suggested write \
                     timeout): the call was dropped"
                ),
                retryable: true,
            },
        };
        match self.instance.as_ref().map(|i| i.policy) {
            Some(CancellationPolicy::RetireOnCancel) => {
                let old = self.instance.take().expect("live");
                tracing::warn!(
                    instance = old.number,
                    what,
                    ?deadline,
                    "an epoch sink call passed its deadline: retiring the instance"
                );
                // The new instance recovers the epoch in progress as garbage: nothing
                // is rolled back on it, and the old one is never called again.
                self.epoch = None;
                match self.replace(old).await {
                    Ok(()) => Err(returned),
                    Err(err) => Err(err),
                }
            }
            _ => Err(returned),
        }
    }

    /// Retires `old` (its tasks ended) and starts the next instance, recovering the last
    /// durable decision and the undecided epochs of this stream.
    async fn replace(&mut self, old: Instance) -> Result<()> {
        let number = old.number + 1;
        old.retire().await?;
        let instance = (self.recipe)
            .start(number, self.last_decided.clone(), self.intents.clone())
            .await?;
        tracing::info!(
            instance = number,
            "a new epoch sink instance replaced the retired one"
        );
        self.instance = Some(instance);
        Ok(())
    }

    /// Runs `step` of the epoch in progress; on failure, rolls the epoch back (the
    /// failure comes before its decision) and returns the step's error.
    async fn or_rollback<T>(&mut self, step: Result<T>) -> Result<T> {
        if step.is_err()
            && let Some((epoch, _)) = self.epoch.take()
            && self.instance.is_some()
            && let Err(err) = bounded!(self, "rollback_epoch", |sink| sink.rollback_epoch(epoch))
        {
            tracing::warn!(epoch, %err, "rolling back a failed epoch failed; recovery removes its staging");
        }
        step
    }

    /// Flushes the epoch in progress when the sink's interval has passed since it began
    /// or last flushed: the rows the driver holds go to `write_batch`, then `flush`.
    async fn flush_if_due(&mut self) -> Result<()> {
        let Some(interval) = self.instance.as_ref().and_then(|i| i.flush_interval) else {
            return Ok(());
        };
        if self
            .epoch
            .is_none_or(|(_, flushed)| flushed.elapsed() < interval)
        {
            return Ok(());
        }
        for binding in 0..self.builders.len() {
            self.write_batch(binding).await?;
        }
        bounded!(self, "flush", |sink| sink.flush())?;
        if let Some((_, flushed)) = &mut self.epoch {
            *flushed = Instant::now();
        }
        Ok(())
    }
}

/// The transaction number of a runtime checkpoint (the epoch it commits).
pub fn epoch_of(flow_checkpoint: &[u8]) -> Result<u64> {
    #[derive(serde::Deserialize)]
    struct Txn {
        txn: u64,
    }
    serde_json::from_slice::<Txn>(flow_checkpoint)
        .map(|t| t.txn)
        .map_err(|e| Error::Malformed(format!("Prepare's runtime checkpoint has no txn: {e}")))
}

#[async_trait]
impl Transactor for EpochTransactor {
    /// A standard binding's keys, as a batch of its key columns, to the sink's `load`
    /// (Loads come only once the prior epoch is applied: the pattern defers them).
    async fn load(&mut self, load: Load, _: PriorState, loaded: &mut dyn LoadedSink) -> Result<()> {
        let binding = load.binding as usize;
        let Some(keys) = self.keys.get_mut(binding) else {
            return Err(Error::Malformed(format!(
                "Load of binding {binding}, which does not exist"
            )));
        };
        for key in load_keys(&load) {
            keys.push(key?, &[], &[]).map_err(sink_error)?;
        }
        let Some(batch) = keys.finish().map_err(sink_error)? else {
            return Ok(());
        };
        let docs = bounded!(self, "load", |sink| sink.load(binding, &batch))?;
        for doc in docs {
            loaded.push(load.binding, doc.as_bytes());
        }
        Ok(())
    }

    async fn prepare(&mut self, prepare: Prepare) -> Result<flow::DriverCheckpoint> {
        let epoch = epoch_of(&prepare.flow_checkpoint)?;
        self.epoch = Some((epoch, Instant::now()));
        let begun = bounded!(self, "begin_epoch", |sink| sink.begin_epoch(epoch));
        self.or_rollback(begun).await?;
        Ok(flow::DriverCheckpoint {
            driver_checkpoint_json: b"{}".to_vec(),
            rfc7396_merge_patch: true,
        })
    }

    async fn store(&mut self, store: Store) -> Result<()> {
        let mut stored = self.push_store(&store).await;
        if stored.is_ok() {
            stored = self.flush_if_due().await;
        }
        self.or_rollback(stored).await
    }

    async fn commit(&mut self) -> Result<()> {
        let (epoch, _) = self
            .epoch
            .ok_or_else(|| Error::Malformed("Commit without a Prepare".into()))?;
        for binding in 0..self.builders.len() {
            let written = self.write_batch(binding).await;
            self.or_rollback(written).await?;
        }
        let pre_committed = bounded!(self, "pre_commit", |sink| sink.pre_commit(epoch));
        let descriptor = self.or_rollback(pre_committed).await?;
        self.epoch = None;
        self.committed = Some(epoch);
        self.epochs_committed += 1;
        self.to_apply = descriptor.map(|descriptor| (epoch, descriptor));
        Ok(())
    }

    /// The decision of the epoch committed last is durable now: it is no longer a
    /// replacement's garbage but its decision, and its descriptor is applied.
    async fn acknowledge(&mut self) -> Result<()> {
        if let Some(epoch) = self.committed.take() {
            self.intents.retain(|u| u.epoch > epoch);
        }
        if let Some((epoch, descriptor)) = self.to_apply.take() {
            self.last_decided = Some(Decided {
                epoch,
                descriptor: descriptor.clone(),
            });
            bounded!(self, "commit_epoch", |sink| sink
                .commit_epoch(epoch, &descriptor))?;
        }
        Ok(())
    }

    /// Closes the instance (bounded; a close past its deadline is dropped, and the
    /// instance with it), then waits for its background tasks.
    async fn destroy(mut self: Box<Self>) {
        let Some(mut instance) = self.instance.take() else {
            return;
        };
        match tokio::time::timeout(instance.deadline, instance.sink.close()).await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!(%err, "closing the epoch sink failed"),
            Err(_) => {
                tracing::warn!(deadline = ?instance.deadline, "closing the epoch sink passed its deadline")
            }
        }
        if let Err(err) = instance.retire().await {
            tracing::error!(%err, "the epoch sink's background work did not end");
        }
    }

    async fn artifact_intent(&mut self, txn: u64) -> Result<Option<Value>> {
        let intent = self.live()?.sink.checkpoint_artifact_intent(txn);
        if let Some(intent) = &intent {
            self.intents.retain(|u| u.epoch != txn);
            self.intents.push(Undecided {
                epoch: txn,
                intent: intent.clone(),
            });
        }
        Ok(intent)
    }

    /// The descriptor of epoch `txn`, as the recovery log keeps it: the driver checkpoint
    /// its commit records (`None`: it staged nothing; the last descriptor stays).
    fn decision(&mut self, txn: u64) -> Option<Value> {
        match &self.to_apply {
            Some((epoch, descriptor)) if *epoch == txn => Some(
                DecidedRecord {
                    epoch: txn,
                    descriptor: descriptor.clone(),
                }
                .to_value(),
            ),
            _ => None,
        }
    }

    /// The bytes of rows its batch builders hold (none right after a commit, which
    /// writes them all), and the epochs this stream committed.
    fn report(&self) -> Report {
        let buffered = self.builders.iter().map(|b| b.bytes() as u64).sum();
        Report {
            memory: buffered,
            metrics: vec![Metric::counter(
                "epochs_committed",
                "Epochs this stream of the epoch sink pre-committed.",
                self.epochs_committed,
            )],
            health: None,
        }
    }
}

impl EpochTransactor {
    /// Pushes a Store's documents into its binding's batch, writing each batch that fills.
    async fn push_store(&mut self, store: &Store) -> Result<()> {
        let binding = store.binding as usize;
        if binding >= self.builders.len() {
            return Err(Error::Malformed(format!(
                "Store of binding {binding}, which does not exist"
            )));
        }
        for doc in store_docs(store) {
            let doc = doc?;
            let builder = &mut self.builders[binding];
            builder
                .push(doc.key, doc.values, doc.doc)
                .map_err(sink_error)?;
            if builder.is_full() {
                self.write_batch(binding).await?;
            }
        }
        Ok(())
    }

    /// Writes the rows binding `binding`'s batch holds, if any.
    async fn write_batch(&mut self, binding: usize) -> Result<()> {
        if let Some(batch) = self.builders[binding].finish().map_err(sink_error)? {
            bounded!(self, "write_batch", |sink| sink
                .write_batch(binding, &batch))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_no_record_or_a_whole_one_reads_as_a_decision() {
        assert_eq!(decided_epoch("m", b"").unwrap(), None);
        assert_eq!(decided_epoch("m", b"{}").unwrap(), None);
        assert_eq!(
            decided_epoch("m", br#"{"epoch":3,"descriptor":{"file":"f"}}"#).unwrap(),
            Some(Decided {
                epoch: 3,
                descriptor: json!({"file": "f"})
            })
        );
        for damaged in [
            &b"{\"epoch\":3,"[..],
            br#"{"epoch":"three","descriptor":{}}"#,
            br#"{"descriptor":{}}"#,
            br#"{"epoch":3,"descriptor":{},"extra":1}"#,
            b"[]",
            b"null",
        ] {
            let err = decided_epoch("m", damaged).unwrap_err().to_string();
            assert!(err.contains("damaged"), "{err}");
            assert!(!decided_epoch("m", damaged).unwrap_err().is_retryable());
        }
    }
}
