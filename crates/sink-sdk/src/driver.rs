//! An [`EpochSink`] on the one loop: [`EpochDriver`] speaks the Flow driver protocol in
//! process, as a driver of the idempotent-apply pattern, and uses the transactor's calls
//! beside the protocol (`sluice_driver_sdk::traits`) for what the recovery log records
//! of the sink: its artifact intents and its descriptors.
//!
//! ```text
//!  open_with_log(checkpoint {epoch, descriptor}, log)   build, bind context, open, recover(decided, undecided)
//!  artifact_intent(N)                  checkpoint_artifact_intent(N): into the runtime's Intent(N)
//!  Prepare(runtime checkpoint of N)    begin_epoch(N)              Prepared: no change
//!  Store*                              Arrow batches of bounded size → write_batch
//!  Commit                              last batches; pre_commit(N) → descriptor
//!  decision(N)                         {epoch, descriptor}: into the runtime's Commit(N)
//!  Acknowledge                         commit_epoch(N, descriptor): the decision is durable
//! ```
//!
//! An epoch sink receives each transaction's reduced changes (its bindings are delta
//! updates: Validate says so, and nothing is loaded). A failure before `pre_commit`
//! returned rolls the epoch back; after it only recovery decides, from what the
//! recovery log holds: the last descriptor is re-applied and undecided staging removed.

use crate::arrow::{BatchBuilder, binding_schema};
use crate::{
    Decided, EpochSink, InputMode, Recovery, RuntimeContext, SinkBinding, SinkContract, SinkError,
};
use async_trait::async_trait;
use serde_json::{Value, json};
use sluice_driver_sdk::arena::store_docs;
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
    PriorState, Result, Transactor,
};
use std::path::Path;
use std::sync::Arc;

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

    fn driver(&self, _state_dir: Option<&Path>) -> Option<Arc<dyn Driver>> {
        Some(Arc::new(EpochDriver::new(*self)))
    }

    fn pinned(&self) -> Option<&'static str> {
        Some(
            "an epoch sink names its staging by the deployment id kept beside the local \
             recovery log",
        )
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
}

impl EpochDriver {
    pub fn new(kind: SinkKind) -> EpochDriver {
        EpochDriver { kind }
    }

    fn build(&self, endpoint_spec_json: &str) -> Result<Box<dyn EpochSink>> {
        let config: Value = serde_json::from_str(endpoint_spec_json)
            .map_err(|e| Error::Config(format!("endpoint config is not JSON: {e}")))?;
        (self.kind.build)(&config).map_err(sink_error)
    }

    /// The sink's bindings of `spec`, their Arrow schemas as `contract` shapes them.
    fn bindings(
        &self,
        spec: &MaterializationSpec,
        contract: SinkContract,
    ) -> Result<Vec<(SinkBinding, BatchBuilder)>> {
        let keyed = contract.input != InputMode::AppendOnly;
        spec.bindings
            .iter()
            .map(|binding| {
                let columns = binding_schema(binding, keyed).map_err(sink_error)?;
                let resource = serde_json::from_str(&binding.resource_spec_json)
                    .map_err(|e| Error::Config(format!("resource config is not JSON: {e}")))?;
                let sink_binding = SinkBinding {
                    resource,
                    schema: columns.schema.clone(),
                    key: columns.key.clone(),
                };
                Ok((
                    sink_binding,
                    BatchBuilder::new(columns, BATCH_ROWS, BATCH_BYTES),
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
            .bindings(&spec, sink.contract())?
            .into_iter()
            .map(|(b, _)| b)
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
    /// An epoch is applied idempotently once the recovery log holds its decision; delta
    /// bindings only, so nothing is loaded or deleted by key.
    fn declared(&self) -> Declared {
        Declared {
            pattern: CommitPattern::RecoveryLogIdempotentApply,
            deletes: false,
            delta_updates: true,
            strict_exists: false,
        }
    }

    async fn spec(&self, _req: m::SpecRequest) -> Result<m::SpecResponse> {
        Ok(m::SpecResponse {
            endpoint_spec_schema_json: (self.kind.endpoint_schema)(),
            resource_spec_schema_json: (self.kind.resource_schema)(),
            documentation_url: String::new(),
        })
    }

    /// Keys are required; the document is recommended (a change log keeps it), every
    /// other field optional. Always delta updates: the sink takes each transaction's
    /// changes and loads nothing.
    async fn validate(&self, req: m::ValidateRequest) -> Result<m::ValidateResponse> {
        self.build(&req.endpoint_spec_json)?;
        let bindings = req.bindings.iter().map(|binding| {
            let resource: Value = serde_json::from_str(&binding.resource_spec_json)
                .map_err(|e| Error::Config(format!("resource config is not JSON: {e}")))?;
            let resource_path = (self.kind.resource_path)(&resource).map_err(sink_error)?;
            let collection = binding.collection.clone().unwrap_or_default();
            let constraints = ProjectionRules {
                key: "part of the key",
                document: (Type::LocationRecommended, "the document, as JSON text"),
                top_level: (Type::LocationRecommended, "a top-level field"),
                nested: (Type::FieldOptional, "a nested field"),
            }
            .constraints(&collection);
            Ok(m::validate_response::Binding {
                constraints: constraints.collect(),
                resource_path,
                delta_updates: true,
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
        let mut sink = self.build(&spec.endpoint_spec_json)?;
        let (bindings, builders): (Vec<_>, Vec<_>) =
            self.bindings(&spec, sink.contract())?.into_iter().unzip();
        sink.bind_runtime_context(RuntimeContext {
            deployment_id: log.deployment_id,
            sink_id: spec.materialization.clone(),
            participant_id: u64::from(open.key_begin) + 1,
        })
        .map_err(sink_error)?;
        sink.open(&bindings).await.map_err(sink_error)?;
        let decided = decided_epoch(&spec.materialization, &open.driver_checkpoint_json)?;
        let undecided = log.undecided;
        sink.recover(&Recovery { decided, undecided })
            .await
            .map_err(sink_error)?;
        let transactor = EpochTransactor {
            sink,
            builders,
            epoch: None,
            to_apply: None,
        };
        Ok((Box::new(transactor), Opened::default()))
    }
}

/// One Transactions stream of an epoch sink.
struct EpochTransactor {
    sink: Box<dyn EpochSink>,
    builders: Vec<BatchBuilder>,
    /// The epoch begun and not yet pre-committed.
    epoch: Option<u64>,
    /// The descriptor `pre_commit` returned, to record in the epoch's commit and to apply
    /// once the runtime acknowledges it.
    to_apply: Option<(u64, Value)>,
}

impl EpochTransactor {
    /// Runs `step` of the epoch in progress; on failure, rolls the epoch back (the
    /// failure comes before its decision) and returns the step's error.
    async fn or_rollback<T>(&mut self, step: Result<T>) -> Result<T> {
        if step.is_err()
            && let Some(epoch) = self.epoch.take()
            && let Err(err) = self.sink.rollback_epoch(epoch).await
        {
            tracing::warn!(epoch, %err, "rolling back a failed epoch failed; recovery removes its staging");
        }
        step
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
    async fn load(&mut self, load: Load, _: PriorState, _: &mut dyn LoadedSink) -> Result<()> {
        Err(Error::Malformed(format!(
            "Load of binding {}: an epoch sink's bindings are delta updates",
            load.binding
        )))
    }

    async fn prepare(&mut self, prepare: Prepare) -> Result<flow::DriverCheckpoint> {
        let epoch = epoch_of(&prepare.flow_checkpoint)?;
        self.epoch = Some(epoch);
        let begun = self.sink.begin_epoch(epoch).await.map_err(sink_error);
        self.or_rollback(begun).await?;
        Ok(flow::DriverCheckpoint {
            driver_checkpoint_json: b"{}".to_vec(),
            rfc7396_merge_patch: true,
        })
    }

    async fn store(&mut self, store: Store) -> Result<()> {
        let stored = self.push_store(&store).await;
        self.or_rollback(stored).await
    }

    async fn commit(&mut self) -> Result<()> {
        let epoch = self
            .epoch
            .ok_or_else(|| Error::Malformed("Commit without a Prepare".into()))?;
        for binding in 0..self.builders.len() {
            let written = self.write_batch(binding).await;
            self.or_rollback(written).await?;
        }
        let pre_committed = self.sink.pre_commit(epoch).await.map_err(sink_error);
        let descriptor = self.or_rollback(pre_committed).await?;
        self.epoch = None;
        self.to_apply = descriptor.map(|descriptor| (epoch, descriptor));
        Ok(())
    }

    async fn acknowledge(&mut self) -> Result<()> {
        if let Some((epoch, descriptor)) = self.to_apply.take() {
            (self.sink.commit_epoch(epoch, &descriptor).await).map_err(sink_error)?;
        }
        Ok(())
    }

    async fn destroy(mut self: Box<Self>) {
        if let Err(err) = self.sink.close().await {
            tracing::warn!(%err, "closing the epoch sink failed");
        }
    }

    async fn artifact_intent(&mut self, txn: u64) -> Result<Option<Value>> {
        Ok(self.sink.checkpoint_artifact_intent(txn))
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
            (self.sink.write_batch(binding, &batch).await).map_err(sink_error)?;
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
