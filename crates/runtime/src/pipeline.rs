//! Orchestration: from a loaded pipeline file to planned materializations (Spec,
//! Validate, field selection), applied resources, and running transaction loops.
//!
//! ```text
//! Pipeline ──plan──▶ Planned { collections, materializations (endpoint, spec) }
//!                      ├──apply──▶ driver ApplyUpsert (idempotent; dry-run describes),
//!                      │           or ApplyDelete; recorded beside the recovery log
//!                      ├──apply_first_start──▶ applies a never-applied spec; refuses a
//!                      │           spec that differs from the applied one
//!                      └──run────▶ one txn::run per materialization, each with its own
//!                                  recovery log `<recovery_log>/<materialization>`
//! ```
//!
//! The applied spec is the contract between the pipeline file and the store
//! ([`applied`]): `sluice apply` changes it; `sluice run` runs only what was applied,
//! and Open carries its version, which the driver checks against its own record.
//!
//! Connecting an endpoint is the caller's job ([`Connect`], usually the binary's
//! [`Registry`](crate::registry::Registry)): the runtime does not know which connectors
//! are linked into the binary.

use crate::admission::{self, Refusal, SinkGuarantee};
use crate::applied;
use crate::config::{self, Pipeline};
use crate::metrics::{Metrics, ShardMetrics, ended};
use crate::projections::{self, BuildError};
use crate::recovery::{self, RecoveryLog};
use crate::txn::{self, BoundSource, Progress, TxnOptions};
use crate::types::{Binding, Collection, RunError, Shard, Summary};

pub use crate::registry::{Connect, Connected};
use async_trait::async_trait;
use serde_json::Value;
use sluice_driver_sdk::Endpoint;
use sluice_driver_sdk::error::within;
use sluice_proto::flow;
use sluice_proto::materialize::{self as m, transaction_request::Open};
use sluice_sink_sdk::EpochParticipant;
use sluice_source_sdk::{Health, Source, SourceError};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tracing::Instrument;

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error("{place}: {reason}")]
    Invalid { place: String, reason: String },
    /// Admission: parts that cannot give the delivery the pipeline asks for.
    #[error("the pipeline asks for {delivery} delivery, which {} cannot give:{}",
        if refusals.len() == 1 { "this part" } else { "these parts" },
        refusals.iter().map(|r| format!("\n  - {r}")).collect::<String>())]
    Refused {
        delivery: &'static str,
        refusals: Vec<Refusal>,
    },
    #[error("materialization {materialization}: {source}")]
    Driver {
        materialization: String,
        #[source]
        source: sluice_driver_sdk::Error,
    },
    /// The pipeline file changed since the store was applied (user action needed).
    #[error(
        "materialization {materialization}: the pipeline file differs from the spec \
             applied to its store (applied version {applied}, the file's {file}): {changes}. \
             If the file reads environment variables, check that each is set as when it \
             was applied: applying would point the store at the new values. If the change \
             is meant, run `sluice apply` on the pipeline file, then run again"
    )]
    NotApplied {
        materialization: String,
        applied: String,
        file: String,
        changes: String,
    },
    /// A source that cannot be read ([`Source::probe`]).
    #[error(transparent)]
    Source(#[from] SourceError),
    /// A stop request came before the run began: nothing was created.
    #[error("stopped before the run began: nothing was created")]
    Stopped,
    /// Several problems at once, each naming its place: what `sluice check` reports,
    /// and what `run` refuses to start with.
    #[error("{} problems:{}", .0.len(), .0.iter().map(|p| format!("\n  - {p}")).collect::<String>())]
    Problems(Vec<PipelineError>),
    /// A materialization's loop failed (and was not retried, or ran out of attempts).
    /// The others were stopped after their transaction in progress.
    #[error("materialization {materialization}: {source}")]
    Run {
        materialization: String,
        #[source]
        source: Box<RunError>,
        /// What every materialization committed before the run ended, the failed one
        /// included, by name.
        summaries: Vec<(String, Summary)>,
    },
}

impl PipelineError {
    /// The one problem, all of them, or `None` without any.
    pub fn gathered(mut problems: Vec<PipelineError>) -> Option<PipelineError> {
        match problems.len() {
            0 => None,
            1 => Some(problems.remove(0)),
            _ => Some(PipelineError::Problems(problems)),
        }
    }
}

fn invalid(place: impl Into<String>, reason: impl Into<String>) -> PipelineError {
    PipelineError::Invalid {
        place: place.into(),
        reason: reason.into(),
    }
}

pub struct PlannedMaterialization {
    pub name: String,
    pub endpoint: Arc<dyn Endpoint>,
    /// An epoch sink's handle (see [`Connected::participant`]).
    pub participant: Option<Arc<dyn EpochParticipant>>,
    /// See [`SinkGuarantee::store_keeps_checkpoint`].
    pub store_keeps_checkpoint: bool,
    pub spec: flow::MaterializationSpec,
    pub validated: m::ValidateResponse,
    pub shard: config::ShardDef,
}

pub struct Planned {
    pub collections: BTreeMap<String, Arc<Collection>>,
    pub materializations: Vec<PlannedMaterialization>,
}

/// Compiles collections and asks every driver for its Spec and Validate; the first
/// problem, or all of them when there are several ([`plan_all`]).
pub async fn plan(pipeline: &Pipeline, connect: &dyn Connect) -> Result<Planned, PipelineError> {
    let (planned, problems) = plan_all(pipeline, connect).await;
    match PipelineError::gathered(problems) {
        Some(err) => Err(err),
        None => Ok(planned),
    }
}

/// Plans every collection and materialization it can, and says what stops the others,
/// each problem naming its place: a materialization binding a collection that does not
/// compile is left out (the collection's problem says why).
pub async fn plan_all(pipeline: &Pipeline, connect: &dyn Connect) -> (Planned, Vec<PipelineError>) {
    let mut problems = Vec::new();
    let mut collections = BTreeMap::new();
    for (name, def) in &pipeline.collections {
        match projections::compile_collection(
            &format!("collections.{name}"),
            name,
            &def.key,
            &def.schema,
        ) {
            Ok(collection) => {
                collections.insert(name.clone(), Arc::new(collection));
            }
            Err(err) => problems.push(err.into()),
        }
    }
    let mut materializations = Vec::new();
    for (name, def) in &pipeline.materializations {
        if def
            .bindings
            .iter()
            .any(|b| !collections.contains_key(&b.source))
        {
            continue;
        }
        match plan_materialization(pipeline, connect, &collections, name, def).await {
            Ok(planned) => materializations.push(planned),
            Err(err) => problems.push(err),
        }
    }
    let planned = Planned {
        collections,
        materializations,
    };
    (planned, problems)
}

/// Connects materialization `name`'s endpoint, admits it, and asks its driver for Spec
/// and Validate; selects each binding's fields.
async fn plan_materialization(
    pipeline: &Pipeline,
    connect: &dyn Connect,
    collections: &BTreeMap<String, Arc<Collection>>,
    name: &String,
    def: &config::MaterializationDef,
) -> Result<PlannedMaterialization, PipelineError> {
    let place = format!("materializations.{name}");
    let connected = connect
        .connect(name, &pipeline.endpoint_state_dir(name), &def.endpoint)
        .await
        .map_err(|reason| invalid(format!("{place}.endpoint"), reason))?;
    // Admission first: a part that cannot give the delivery asked for is refused
    // before any driver is asked anything.
    let refusals = admit(pipeline, name, connected.guarantee)?;
    if !refusals.is_empty() {
        return Err(PipelineError::Refused {
            delivery: match pipeline.delivery {
                admission::Delivery::ExactlyOnce => "exactly-once",
                admission::Delivery::AtLeastOnce => "at-least-once",
            },
            refusals,
        });
    }
    let driver_err = |source| PipelineError::Driver {
        materialization: name.clone(),
        source,
    };
    let timeout = pipeline.runtime.timeouts.driver;
    let endpoint_spec_json = connected.config.to_string();
    let spec = connected.endpoint.spec(m::SpecRequest {
        endpoint_type: connected.endpoint_type as i32,
        endpoint_spec_json: endpoint_spec_json.clone(),
    });
    let spec = within(timeout, || "Spec".into(), spec)
        .await
        .map_err(driver_err)?;
    let resource_schema = resource_schema(&place, &spec.resource_spec_schema_json)?;

    let mut validate = m::ValidateRequest {
        materialization: name.clone(),
        endpoint_type: connected.endpoint_type as i32,
        endpoint_spec_json: endpoint_spec_json.clone(),
        bindings: Vec::new(),
    };
    let mut collection_specs = Vec::new();
    for (i, binding) in def.bindings.iter().enumerate() {
        let binding_place = format!("{place}.bindings[{i}]");
        let collection = &collections[&binding.source];
        if let Err(err) = resource_schema.validate(&binding.resource) {
            let at = err.pointer.trim_start_matches('/').replace('/', ".");
            let at = if at.is_empty() {
                String::new()
            } else {
                format!(".{at}")
            };
            return Err(invalid(format!("{binding_place}.resource{at}"), err.reason));
        }
        let collection_spec = projections::collection_spec(collection);
        validate.bindings.push(m::validate_request::Binding {
            resource_spec_json: binding.resource.to_string(),
            collection: Some(collection_spec.clone()),
            field_config_json: Default::default(),
        });
        collection_specs.push(collection_spec);
    }
    let validated = within(
        timeout,
        || "Validate".into(),
        connected.endpoint.validate(validate),
    )
    .await
    .map_err(driver_err)?;
    if validated.bindings.len() != def.bindings.len() {
        return Err(invalid(
            &place,
            format!(
                "driver validated {} bindings, the pipeline has {}",
                validated.bindings.len(),
                def.bindings.len()
            ),
        ));
    }
    let mut bindings = Vec::new();
    for (i, ((binding, constraints), collection_spec)) in def
        .bindings
        .iter()
        .zip(&validated.bindings)
        .zip(collection_specs)
        .enumerate()
    {
        let fields = binding.fields.clone().unwrap_or_default();
        let selection = projections::select_fields(
            &format!("{place}.bindings[{i}]"),
            &collection_spec,
            constraints,
            &fields.include,
            &fields.exclude,
        )?;
        bindings.push(flow::materialization_spec::Binding {
            resource_spec_json: binding.resource.to_string(),
            resource_path: constraints.resource_path.clone(),
            collection: Some(collection_spec),
            field_selection: Some(selection),
            delta_updates: binding.delta_updates || constraints.delta_updates,
        });
    }
    Ok(PlannedMaterialization {
        name: name.clone(),
        endpoint: connected.endpoint,
        participant: connected.participant,
        store_keeps_checkpoint: connected.guarantee.store_keeps_checkpoint(),
        spec: flow::MaterializationSpec {
            materialization: name.clone(),
            endpoint_type: connected.endpoint_type as i32,
            endpoint_spec_json,
            bindings,
        },
        validated,
        shard: def.shard,
    })
}

/// Admission of materialization `name`: its sources, as each declares itself once
/// opened (which connects nothing), and its endpoint's `guarantee`.
fn admit(
    pipeline: &Pipeline,
    name: &str,
    guarantee: SinkGuarantee,
) -> Result<Vec<Refusal>, PipelineError> {
    let mut sources = Vec::new();
    for (source, def) in pipeline.sources_of(name) {
        let opened = open_to_look(pipeline, name, source, def)
            .map_err(|e| invalid(format!("sources.{source}"), e.to_string()))?;
        sources.push((source.clone(), opened.fault_tolerance()));
    }
    let place = format!("materializations.{name}.endpoint");
    Ok(admission::admit(
        pipeline.delivery,
        &sources,
        (&place, guarantee),
    ))
}

/// Source `source` (`def`) of materialization `materialization`, opened only to be
/// looked at (its fault tolerance, a probe): it serves nothing, so it checks no
/// documents and reports no health.
fn open_to_look(
    pipeline: &Pipeline,
    materialization: &str,
    source: &str,
    def: &config::SourceDef,
) -> Result<Box<dyn Source>, SourceError> {
    def.config.open(&sluice_source_sdk::Opening {
        name: source,
        materialization,
        state_dir: &pipeline.source_state_dir(materialization, source),
        follow: false,
        intake: None,
        health: Health::none(),
    })
}

/// What `sluice check` found past the file ([`probe`]).
#[derive(Debug, Default)]
pub struct Probed {
    /// (materialization, what Apply would do there now) of each store reached.
    pub stores: Vec<(String, String)>,
    /// The sources that can be read.
    pub sources: Vec<String>,
    /// What cannot be reached or read, each naming its place.
    pub problems: Vec<PipelineError>,
}

/// What `sluice check` finds past the file: every planned materialization's Apply as a
/// dry run (its driver connects to the store and reads what is there, creating
/// nothing), and every source probed ([`probe_sources`]).
pub async fn probe(pipeline: &Pipeline, planned: &Planned) -> Probed {
    let mut probed = Probed::default();
    let timeout = pipeline.runtime.timeouts.driver;
    for m in &planned.materializations {
        match apply_materialization(m, ApplyAction::Upsert, true, timeout).await {
            Ok(actions) => probed.stores.push((m.name.clone(), actions)),
            Err(PipelineError::Driver { source, .. }) => probed.problems.push(invalid(
                format!("materializations.{}.endpoint", m.name),
                sluice_driver_sdk::error::chain(&source),
            )),
            Err(err) => probed.problems.push(err),
        }
    }
    // Nothing stops a check but its own bounds.
    let (_never, unstopped) = watch::channel(false);
    for (source, result) in probe_sources(pipeline, &unstopped).await {
        match result {
            Ok(()) => probed.sources.push(source),
            Err(err) => probed.problems.push(err.into()),
        }
    }
    probed
}

/// Probes every source a materialization reads ([`Source::probe`]), once each, each
/// call bounded as the loop bounds a source's calls (`runtime.timeouts.source`, and
/// given up at `shutdown`): (source, what the probe found).
pub async fn probe_sources(
    pipeline: &Pipeline,
    shutdown: &watch::Receiver<bool>,
) -> Vec<(String, Result<(), SourceError>)> {
    let mut probed = Vec::new();
    for (source, def) in &pipeline.sources {
        let reader = (pipeline.materializations.keys())
            .find(|m| pipeline.sources_of(m).any(|(name, _)| name == source));
        let Some(materialization) = reader else {
            continue;
        };
        let after = pipeline.runtime.timeouts.source;
        let result = match open_to_look(pipeline, materialization, source, def) {
            Ok(opened) => txn::bounded(opened, after, shutdown.clone()).probe().await,
            Err(err) => Err(err),
        };
        probed.push((source.clone(), result));
    }
    probed
}

/// What `sluice run` does before it creates anything (tables, the recovery log): probes
/// its sources ([`probe_sources`]), retrying as the loop retries while every failure is
/// retryable (a broker not up yet); `shutdown` ends the wait.
pub async fn check_sources(
    pipeline: &Pipeline,
    shutdown: &watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    let mut retries = Retries::new();
    loop {
        let errors: Vec<SourceError> = (probe_sources(pipeline, shutdown).await.into_iter())
            .filter_map(|(_, probed)| probed.err())
            .collect();
        let retryable = errors.iter().all(SourceError::is_retryable);
        let Some(err) = PipelineError::gathered(errors.into_iter().map(Into::into).collect())
        else {
            return Ok(());
        };
        if *shutdown.borrow() {
            return Err(PipelineError::Stopped);
        }
        if !retries.failed(retryable, shutdown)
            || !retries.wait(&err, "checking again", shutdown).await
        {
            return Err(err);
        }
    }
}

fn resource_schema(place: &str, json: &str) -> Result<sluice_doc::Schema, PipelineError> {
    let value: Value = serde_json::from_str(json).map_err(|e| {
        invalid(
            place,
            format!("the driver's resource schema is not JSON: {e}"),
        )
    })?;
    sluice_doc::Schema::compile(&value).map_err(|e| {
        invalid(
            place,
            format!("the driver's resource schema does not compile: {e}"),
        )
    })
}

/// Which Apply a materialization gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyAction {
    /// Create or update its resources (ApplyUpsert), and record the spec as applied.
    Upsert,
    /// Drop its resources (ApplyDelete), and forget its applied spec and recovery log.
    Delete,
}

/// Applies every materialization (`sluice apply`): the driver's Apply, then, unless
/// `dry_run`, the record beside the recovery log of what was applied ([`applied`]) or
/// of its deletion. Holds each recovery log's lock meanwhile: refused while the
/// pipeline runs. Returns (name, actions).
pub async fn apply(
    pipeline: &Pipeline,
    planned: &Planned,
    action: ApplyAction,
    dry_run: bool,
) -> Result<Vec<(String, String)>, PipelineError> {
    let mut out = Vec::new();
    for m in &planned.materializations {
        let dir = pipeline.recovery_log().join(&m.name);
        let place = format!("materializations.{}", m.name);
        let failed = |e: &dyn std::fmt::Display| invalid(&place, e.to_string());
        // A dry run changes nothing, not even the lock file.
        let lock = match dry_run {
            true => None,
            false => {
                let dir = dir.clone();
                let lock = crate::blocking::unblock(move || recovery::lock_dir(&dir)).await;
                Some(lock.map_err(|e| failed(&e))?)
            }
        };
        let mut actions =
            apply_materialization(m, action, dry_run, pipeline.runtime.timeouts.driver).await?;
        if action == ApplyAction::Delete {
            let verb = if dry_run { "would remove" } else { "removed" };
            actions = format!(
                "{}\n{verb} the recovery log {}",
                actions.trim_end(),
                dir.display()
            );
        }
        if let Some(lock) = lock {
            match action {
                ApplyAction::Upsert => {
                    (applied::record(&dir, &m.spec).await).map_err(|e| failed(&e))?
                }
                ApplyAction::Delete => {
                    applied::forget(&dir).await.map_err(|e| failed(&e))?;
                    let dir = dir.clone();
                    ended::forget(&dir).await.map_err(|e| failed(&e))?;
                    let removed =
                        crate::blocking::unblock(move || recovery::remove(&dir, &lock)).await;
                    removed.map_err(|e| failed(&e))?;
                }
            }
        }
        out.push((m.name.clone(), actions));
    }
    Ok(out)
}

/// Applies one planned materialization (its driver's Apply), returning what it did.
pub async fn apply_materialization(
    m: &PlannedMaterialization,
    action: ApplyAction,
    dry_run: bool,
    timeout: Duration,
) -> Result<String, PipelineError> {
    let request = m::ApplyRequest {
        materialization: Some(m.spec.clone()),
        version: applied::version(&m.spec),
        dry_run,
    };
    let response = match action {
        ApplyAction::Upsert => {
            within(timeout, || "Apply".into(), m.endpoint.apply_upsert(request)).await
        }
        ApplyAction::Delete => {
            within(
                timeout,
                || "Apply (delete)".into(),
                m.endpoint.apply_delete(request),
            )
            .await
        }
    };
    let response = response.map_err(|source| PipelineError::Driver {
        materialization: m.name.clone(),
        source,
    })?;
    Ok(response.action_description)
}

/// What `sluice run` does before it runs: applies each materialization that was never
/// applied (a first start) and records it; refuses one whose applied spec differs from
/// the pipeline file's ([`PipelineError::NotApplied`]). Returns (name, actions) of the
/// ones it applied.
/// A driver's retryable failure (an unreachable store) is retried as the loop retries
/// its own; `shutdown` ends the wait.
pub async fn apply_first_start(
    pipeline: &Pipeline,
    planned: &Planned,
    shutdown: &watch::Receiver<bool>,
) -> Result<Vec<(String, String)>, PipelineError> {
    let mut out = Vec::new();
    for m in &planned.materializations {
        let dir = pipeline.recovery_log().join(&m.name);
        let place = format!("materializations.{}", m.name);
        let recorded = (applied::read(&dir).await).map_err(|e| invalid(&place, e.to_string()))?;
        match applied::check(recorded.as_ref(), &m.spec) {
            applied::Check::Current => {}
            applied::Check::FirstApply => {
                let mut retries = Retries::new();
                let actions = loop {
                    let timeout = pipeline.runtime.timeouts.driver;
                    match apply_materialization(m, ApplyAction::Upsert, false, timeout).await {
                        Ok(actions) => break actions,
                        Err(err) => {
                            let retryable = matches!(
                                &err, PipelineError::Driver { source, .. } if source.is_retryable()
                            );
                            if !retries.failed(retryable, shutdown)
                                || !retries.wait(&err, "applying again", shutdown).await
                            {
                                return Err(err);
                            }
                        }
                    }
                };
                (applied::record(&dir, &m.spec).await)
                    .map_err(|e| invalid(&place, e.to_string()))?;
                out.push((m.name.clone(), actions));
            }
            applied::Check::Differs {
                applied,
                file,
                changes,
            } => {
                return Err(PipelineError::NotApplied {
                    materialization: m.name.clone(),
                    applied,
                    file,
                    changes: applied::describe(&changes, pipeline, &m.name),
                });
            }
        }
    }
    Ok(out)
}

/// Options of `sluice run`.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// Keep tailing sources after they are exhausted.
    pub follow: bool,
    /// Where the run's metrics go (an exporter serves them); `None`: nowhere.
    pub metrics: Option<Arc<Metrics>>,
}

/// Runs every materialization until its sources are exhausted (or `shutdown`). The
/// first materialization to fail stops the others after their transaction in progress
/// (as `shutdown` does); the error then carries what each one committed.
pub async fn run(
    pipeline: &Pipeline,
    planned: Planned,
    opts: RunOptions,
    progress: Arc<Progress>,
    shutdown: watch::Receiver<bool>,
) -> Result<Vec<(String, Summary)>, PipelineError> {
    let launcher = Launcher::new(pipeline, planned, opts, progress)?;
    // Fired by the caller's shutdown, or by the first failure.
    let (stop, stopped) = watch::channel(false);
    let stop = Arc::new(stop);
    let forward = {
        let (stop, mut shutdown) = (stop.clone(), shutdown);
        tokio::spawn(async move {
            if shutdown.wait_for(|down| *down).await.is_ok() {
                stop.send_replace(true);
            }
        })
    };
    let mut tasks = tokio::task::JoinSet::new();
    for (name, shard) in launcher.configured_shards() {
        let run = launcher.launch(&name, shard, LogPlace::Local, stopped.clone());
        tasks.spawn(async move {
            let (summary, result) = run.await;
            (name, summary, result)
        });
    }
    let mut summaries = Vec::new();
    let mut failed = None;
    let mut panicked = None;
    while let Some(joined) = tasks.join_next().await {
        match joined {
            Ok((name, summary, result)) => {
                if let Err(err) = result
                    && failed.is_none()
                {
                    stop.send_replace(true);
                    failed = Some((name.clone(), err));
                }
                summaries.push((name, summary));
            }
            Err(join) => {
                stop.send_replace(true);
                panicked.get_or_insert(join);
            }
        }
    }
    forward.abort();
    let _ = forward.await;
    if let Some(join) = panicked {
        return Err(invalid(
            "runtime",
            format!("a materialization task panicked: {join}"),
        ));
    }
    summaries.sort_by(|a, b| a.0.cmp(&b.0));
    match failed {
        None => Ok(summaries),
        Some((materialization, source)) => Err(PipelineError::Run {
            materialization,
            source: Box::new(source),
            summaries,
        }),
    }
}

/// Where a shard's recovery log is kept.
#[derive(Clone)]
pub enum LogPlace {
    /// The folder `<recovery_log>/<materialization>` (the embedded default).
    Local,
    /// A shared engine, opened anew by each attempt (a cluster's shard log).
    Shared(Arc<dyn OpenLog>),
}

/// Opens a recovery log kept on a shared engine, fencing its earlier holders.
#[async_trait]
pub trait OpenLog: Send + Sync {
    async fn open(&self) -> Result<RecoveryLog, recovery::RecoveryError>;
}

/// What one materialization's shards share: launched once for the configured shard, or
/// by a cluster for each range it is assigned.
struct Template {
    spec: flow::MaterializationSpec,
    bindings: Vec<Binding>,
    feeds: Vec<SourceFeed>,
    endpoint: Arc<dyn Endpoint>,
    participant: Option<Arc<dyn EpochParticipant>>,
    store_keeps_checkpoint: bool,
    shard: config::ShardDef,
}

/// Starts shard loops of a planned pipeline: each a [`txn::run`] with its restarts.
pub struct Launcher {
    templates: BTreeMap<String, Template>,
    log_root: std::path::PathBuf,
    deployment_id: String,
    metrics: Arc<Metrics>,
    opts: TxnOptions,
    timeouts: config::Timeouts,
    progress: Arc<Progress>,
}

impl Launcher {
    pub fn new(
        pipeline: &Pipeline,
        planned: Planned,
        opts: RunOptions,
        progress: Arc<Progress>,
    ) -> Result<Launcher, PipelineError> {
        let bounds = &pipeline.runtime.transactions;
        let txn_opts = TxnOptions {
            max_docs: bounds.max_docs,
            max_bytes: bounds.max_bytes,
            max_duration: bounds.max_duration,
            min_duration: bounds.min_duration,
            memory_budget: pipeline.runtime.memory_budget as usize,
            follow: opts.follow,
        };
        let deployment_id = if planned
            .materializations
            .iter()
            .any(|m| m.participant.is_some())
        {
            recovery::deployment_id(pipeline.recovery_log())
                .map_err(|e| invalid("runtime.recovery_log", e.to_string()))?
        } else {
            String::new()
        };
        // Recorded whether or not anything serves them: a few counters per transaction.
        let metrics = opts.metrics.unwrap_or_default();
        metrics.status.set_config(&pipeline.file);
        let mut templates = BTreeMap::new();
        for m in planned.materializations {
            let mut bindings = Vec::new();
            for (i, binding) in m.spec.bindings.iter().enumerate() {
                let collection = binding
                    .collection
                    .as_ref()
                    .map(|c| c.collection.clone())
                    .unwrap_or_default();
                bindings.push(projections::loop_binding(
                    planned.collections[&collection].clone(),
                    &m.spec,
                    i,
                ));
            }
            let mut feeds = Vec::new();
            for (name, def) in &pipeline.sources {
                let bindings: Vec<u32> = m
                    .spec
                    .bindings
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| {
                        b.collection
                            .as_ref()
                            .is_some_and(|c| c.collection == def.target)
                    })
                    .map(|(i, _)| i as u32)
                    .collect();
                if !bindings.is_empty() {
                    feeds.push(SourceFeed {
                        intake: crate::intake::intake(
                            def,
                            planned.collections[&def.target].clone(),
                        ),
                        materialization: m.name.clone(),
                        state_dir: pipeline.source_state_dir(&m.name, name),
                        follow: opts.follow,
                        name: name.clone(),
                        def: def.clone(),
                        bindings,
                    });
                }
            }
            let template = Template {
                spec: m.spec,
                bindings,
                feeds,
                endpoint: m.endpoint,
                participant: m.participant,
                store_keeps_checkpoint: m.store_keeps_checkpoint,
                shard: m.shard,
            };
            templates.insert(m.name, template);
        }
        Ok(Launcher {
            templates,
            log_root: pipeline.recovery_log().to_path_buf(),
            deployment_id,
            metrics,
            opts: txn_opts,
            timeouts: pipeline.runtime.timeouts,
            progress,
        })
    }

    /// Each materialization with the shard its pipeline file configures.
    pub fn configured_shards(&self) -> Vec<(String, config::ShardDef)> {
        (self.templates.iter())
            .map(|(name, t)| (name.clone(), t.shard))
            .collect()
    }

    /// The loop of materialization `materialization`'s shard over `range`, its log at
    /// `log`, reopened after retryable failures until its sources end, it fails, or
    /// `shutdown` (after the transaction in progress). Resolves to what it committed.
    ///
    /// Panics when the planned pipeline has no such materialization.
    pub fn launch(
        &self,
        materialization: &str,
        range: config::ShardDef,
        log: LogPlace,
        shutdown: watch::Receiver<bool>,
    ) -> impl std::future::Future<Output = (Summary, Result<(), RunError>)> + Send + 'static {
        let t = &self.templates[materialization];
        let shard = Shard {
            open: Open {
                version: applied::version(&t.spec),
                materialization: Some(t.spec.clone()),
                key_begin: range.key_begin,
                key_end: range.key_end,
                driver_checkpoint_json: Vec::new(),
            },
            bindings: t.bindings.clone(),
        };
        let metrics =
            Arc::new((self.metrics).shard(&shard, t.feeds.iter().map(|f| f.name.as_str())));
        let attempt = Attempt {
            metrics,
            shard,
            endpoint: t.endpoint.clone(),
            participant: t.participant.clone(),
            store_keeps_checkpoint: t.store_keeps_checkpoint,
            deployment_id: self.deployment_id.clone(),
            feeds: t.feeds.clone(),
            log_dir: self.log_root.join(materialization),
            log,
            opts: self.opts.clone(),
            timeouts: self.timeouts,
            progress: self.progress.clone(),
            shutdown,
        };
        // Every line logged by this shard's work, its retries included, carries its
        // materialization and range.
        let span = tracing::info_span!(
            "materialization",
            materialization = %materialization,
            shard = %range.id(),
        );
        async move {
            let (summary, result) = attempt.run_with_restarts().await;
            attempt.metrics.ended(result.is_ok());
            attempt.record_end().await;
            (summary, result)
        }
        .instrument(span)
    }
}

/// A source of the pipeline file and the bindings of one materialization it feeds.
#[derive(Clone)]
struct SourceFeed {
    name: String,
    materialization: String,
    state_dir: std::path::PathBuf,
    /// The run follows its sources (`--follow`).
    follow: bool,
    def: config::SourceDef,
    bindings: Vec<u32>,
    /// The check of its documents against its target collection, that it is opened
    /// with ([`crate::intake`]).
    intake: sluice_source_sdk::Intake,
}

impl SourceFeed {
    /// Opens the source, reporting its connection to `health`.
    fn open(&self, health: &Health) -> Result<Box<dyn Source>, SourceError> {
        self.def.config.open(&sluice_source_sdk::Opening {
            name: &self.name,
            materialization: &self.materialization,
            state_dir: &self.state_dir,
            follow: self.follow,
            intake: Some(&self.intake),
            health,
        })
    }
}

/// Everything one materialization needs to (re)start its loop.
struct Attempt {
    /// Its sources in the order of `feeds`.
    metrics: Arc<ShardMetrics>,
    shard: Shard,
    endpoint: Arc<dyn Endpoint>,
    participant: Option<Arc<dyn EpochParticipant>>,
    store_keeps_checkpoint: bool,
    deployment_id: String,
    feeds: Vec<SourceFeed>,
    /// `<recovery_log>/<materialization>`: the log when it is [`LogPlace::Local`], and
    /// what stays local in any case (default dead-letter files).
    log_dir: std::path::PathBuf,
    log: LogPlace,
    opts: TxnOptions,
    timeouts: config::Timeouts,
    progress: Arc<Progress>,
    shutdown: watch::Receiver<bool>,
}

/// First pause before reopening after a retryable failure; it doubles up to the cap.
const FIRST_BACKOFF: Duration = Duration::from_millis(250);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Consecutive failed attempts (none committing a transaction) before giving up:
/// with the backoff above, about two minutes of an unreachable store.
const MAX_FAILED_ATTEMPTS: u32 = 10;

/// The one retry policy of `run`, for the loop and for the first start's Apply alike:
/// a retryable failure is tried again after a backoff (250 ms doubling to 30 s), each
/// retry logged once with its cause, until [`MAX_FAILED_ATTEMPTS`] in a row made no
/// progress; a stop request ends a wait at once.
struct Retries {
    backoff: Duration,
    failed: u32,
}

impl Retries {
    fn new() -> Retries {
        Retries {
            backoff: FIRST_BACKOFF,
            failed: 0,
        }
    }

    /// An attempt made progress (committed a transaction): the count starts again.
    fn progressed(&mut self) {
        *self = Retries::new();
    }

    /// Counts a failed attempt, and says whether to try again.
    fn failed(&mut self, retryable: bool, shutdown: &watch::Receiver<bool>) -> bool {
        self.failed += 1;
        retryable && self.failed < MAX_FAILED_ATTEMPTS && !*shutdown.borrow()
    }

    /// Logs `err` and what follows (`then`: "reopening", "applying again"), then waits
    /// out the backoff; `false` when a stop request came first.
    async fn wait(
        &mut self,
        err: &(dyn std::fmt::Display + Sync),
        then: &str,
        shutdown: &watch::Receiver<bool>,
    ) -> bool {
        tracing::warn!(
            "{err}; {then} in {:.1}s (attempt {} of {MAX_FAILED_ATTEMPTS})",
            self.backoff.as_secs_f64(),
            self.failed
        );
        let mut shutdown = shutdown.clone();
        let waited = tokio::select! {
            () = tokio::time::sleep(self.backoff) => true,
            _ = shutdown.wait_for(|down| *down) => false,
        };
        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
        waited
    }
}

impl Attempt {
    /// Runs the loop, reopening it with backoff after a retryable failure (a lost
    /// connection, a timeout, a source's I/O error: [`RunError::is_retryable`]), each
    /// retry logged with its cause. Recovery makes every restart exact: sources resume
    /// from the committed checkpoint and an interrupted step replays. Returns what was
    /// committed, also when an error ends the run.
    async fn run_with_restarts(&self) -> (Summary, Result<(), RunError>) {
        let mut summary = Summary::default();
        let mut retries = Retries::new();
        loop {
            let committed_before = summary.transactions;
            let err = match self.run_once(&mut summary).await {
                Ok(()) => return (summary, Ok(())),
                Err(RunError::Source(stopped @ SourceError::Interrupted { .. })) => {
                    tracing::info!(
                        "stopped: {stopped}; the transaction in progress was not committed, \
                         and the next run reads it again"
                    );
                    return (summary, Ok(()));
                }
                Err(err) => err,
            };
            if summary.transactions > committed_before {
                retries.progressed();
            }
            let retry = retries.failed(err.is_retryable(), &self.shutdown);
            self.metrics.failed(&err, retry);
            if !retry {
                return (summary, Err(err));
            }
            summary.restarts += 1;
            if !retries.wait(&err, "reopening", &self.shutdown).await {
                return (summary, Err(err));
            }
        }
    }

    /// Records the state the loop ended in beside its log ([`ended`]), for `sluice
    /// status` once the process is gone.
    async fn record_end(&self) {
        if let Err(err) = ended::record(&self.log_dir, self.metrics.status.view()).await {
            tracing::warn!("cannot record how the loop ended: {err}");
        }
    }

    async fn run_once(&self, summary: &mut Summary) -> Result<(), RunError> {
        self.metrics.opening();
        let mut sources = Vec::with_capacity(self.feeds.len());
        for (feed, metrics) in self.feeds.iter().zip(&self.metrics.sources) {
            let source = feed.open(&metrics.health).map_err(RunError::Source)?;
            sources.push(BoundSource {
                source,
                bindings: feed.bindings.clone(),
                dead_letter: feed.def.dead_letter_path(&self.log_dir),
                read_ahead: feed.def.read_ahead,
                envelope: feed.def.envelope,
            });
        }
        let log = match &self.log {
            LogPlace::Local => RecoveryLog::open_async(&self.log_dir).await?,
            LogPlace::Shared(log) => log.open().await?,
        };
        let ctx = txn::Context {
            shard: self.shard.clone(),
            endpoint: self.endpoint.clone(),
            participant: self.participant.clone(),
            store_keeps_checkpoint: self.store_keeps_checkpoint,
            deployment_id: self.deployment_id.clone(),
            sources,
            log,
            opts: self.opts.clone(),
            timeouts: self.timeouts,
            progress: self.progress.clone(),
            metrics: self.metrics.clone(),
            shutdown: self.shutdown.clone(),
        };
        txn::run(ctx, summary).await
    }
}
