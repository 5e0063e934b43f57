//! The sink SDK: LaminarDB's epoch two-phase commit, on Sluice's one transaction loop.
//!
//! An epoch is a transaction of the loop (epoch N = transaction N). A sink implements
//! [`EpochSink`]; [`driver::EpochDriver`] runs it as an in-process Flow driver of the
//! idempotent-apply pattern, and a [`SinkKind`] registers it in a binary like any other
//! built-in driver. What the recovery log records for the sink travels by the
//! transactor's calls beside the protocol (`sluice_driver_sdk::traits`):
//!
//! ```text
//!  runtime                          EpochDriver (Flow driver)        EpochSink
//!  ── Intent(N) + artifact intent ◀── artifact_intent(N) ◀─────────── checkpoint_artifact_intent(N)
//!     Prepare(N) ─────────────────▶  prepare ────────────────────────▶ begin_epoch(N)
//!     Store* ─────────────────────▶  store: Arrow batches ───────────▶ write_batch*
//!     Commit ─────────────────────▶  commit ─────────────────────────▶ pre_commit(N) → descriptor
//!  ── Commit(N) + descriptor      ◀── decision(N)
//!     Acknowledge ────────────────▶  acknowledge ────────────────────▶ commit_epoch(N, descriptor)
//!  at start: Open + the log's last descriptor and undecided intents ─▶ recover (abort cleaner)
//! ```
//!
//! What holds:
//! - An epoch's artifact intent (where its staging goes) is durable in the recovery log
//!   before `begin_epoch` runs, so an epoch that never reaches its decision leaves staging
//!   that the abort cleaner can find and remove.
//! - A descriptor is applied (`commit_epoch`) only once the recovery-log commit that holds
//!   it is durable; it may be applied again after a crash, so applying is idempotent.
//! - `rollback_epoch` runs only when a failure is known to come before the decision
//!   (before `pre_commit` returned); after it, only recovery decides.

pub mod arrow;
pub mod driver;

pub use arrow_array::RecordBatch;
pub use arrow_schema::{DataType, Field, Schema, SchemaRef};
pub use driver::{EpochDriver, SinkKind};
/// An epoch the recovery log holds an intent of but no decision: its staging is garbage.
pub use sluice_driver_sdk::Undecided;
pub use sluice_driver_sdk::contract::{Consistency, InputMode, Placement, SinkContract};

use async_trait::async_trait;
use serde_json::Value;

/// The identity a sink's staging is named by: stable across restarts, bound before `open`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeContext {
    /// The pipeline's deployment: created once, kept beside its recovery logs.
    pub deployment_id: String,
    /// The sink's name in the pipeline file (its materialization).
    pub sink_id: String,
    /// The shard writing (nonzero): `key_begin + 1` of its key range.
    pub participant_id: u64,
}

/// What a sink failed at, and whether trying again may help.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// The configuration cannot work: fix it.
    #[error("{0}")]
    Config(String),
    /// The target's schema cannot take the input (a type change, a dropped key).
    #[error("{0}")]
    Schema(String),
    /// The external system failed (I/O, a conflict, a timeout): a retry may help.
    #[error("{0}")]
    External(String),
    /// The target holds something this sink did not expect (a foreign file, a table
    /// committed by another writer): never guessed past.
    #[error("{0}")]
    Corrupt(String),
}

impl SinkError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, SinkError::External(_))
    }
}

pub type Result<T, E = SinkError> = std::result::Result<T, E>;

/// A binding of the sink: what it receives and where it goes.
#[derive(Debug, Clone)]
pub struct SinkBinding {
    /// The binding's resource configuration, as the user wrote it.
    pub resource: Value,
    /// The Arrow schema of its batches ([`arrow::binding_schema`]).
    pub schema: SchemaRef,
    /// The columns of the collection's key, in key order.
    pub key: Vec<String>,
}

/// What `write_batch` accepted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteResult {
    pub records: usize,
    pub bytes: u64,
}

/// The DDL a sink would run to make its target fit the bindings: `resolve_schema`
/// computes it without changing anything (`sluice apply --dry-run` prints `actions`),
/// `prepare_schema` runs it (idempotently).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SchemaPlan {
    /// One line per change, for people.
    pub actions: Vec<String>,
    /// What the sink needs to run them; opaque to the runtime.
    pub state: Value,
}

/// An epoch whose decision the recovery log holds: its descriptor must be applied (it
/// may have been already).
#[derive(Debug, Clone, PartialEq)]
pub struct Decided {
    pub epoch: u64,
    pub descriptor: Value,
}

/// What recovery tells a sink at start, before its first epoch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recovery {
    /// The last decided epoch that carried a descriptor, if any.
    pub decided: Option<Decided>,
    /// Epochs begun and never decided.
    pub undecided: Vec<Undecided>,
}

/// A sink of LaminarDB's epoch contract. Calls come one at a time, in this order:
/// `bind_runtime_context`, `open`, `recover`, then per epoch `begin_epoch`,
/// `write_batch`*, `pre_commit`, and (once the decision is durable) `commit_epoch`;
/// `close` at the end. `contract`, `keyed_mutation_key`, `resolve_schema` and
/// `prepare_schema` may run on a sink that is never opened.
#[async_trait]
pub trait EpochSink: Send + 'static {
    /// Durability, placement and input mode of this configuration. Opens nothing. The
    /// default fails closed: ephemeral, singleton, append-only.
    fn contract(&self) -> SinkContract {
        SinkContract::default()
    }

    /// The columns by which this sink applies keyed mutations (a trailing `_op` of `U`
    /// replaces the row of that key, `D` deletes it, reading only the key columns), or
    /// `None` when it cannot.
    fn keyed_mutation_key(&self, _binding: &SinkBinding) -> Option<Vec<String>> {
        None
    }

    /// Binds the identity staging is named by. Before `open`.
    fn bind_runtime_context(&mut self, _context: RuntimeContext) -> Result<()> {
        Ok(())
    }

    /// Read-only: what `prepare_schema` would change for these bindings.
    async fn resolve_schema(&mut self, bindings: &[SinkBinding]) -> Result<SchemaPlan>;

    /// Runs `plan` (explicit, idempotent DDL).
    async fn prepare_schema(&mut self, plan: &SchemaPlan) -> Result<()>;

    /// Drops what `prepare_schema` created for these bindings (`sluice apply --delete`),
    /// or with `dry_run` only says what it would drop.
    async fn drop_schema(
        &mut self,
        _bindings: &[SinkBinding],
        _dry_run: bool,
    ) -> Result<Vec<String>> {
        Err(SinkError::Config(
            "this sink cannot drop what it created".into(),
        ))
    }

    /// Connects, ready to write `bindings` (whose schemas were prepared).
    async fn open(&mut self, bindings: &[SinkBinding]) -> Result<()>;

    /// The abort cleaner: removes the staging of `recovery.undecided` (and of any
    /// attempt of this context it finds orphaned), and re-applies `recovery.decided`.
    async fn recover(&mut self, recovery: &Recovery) -> Result<()>;

    /// Where epoch `epoch`'s artifacts will go: bounded, no credentials, naming only
    /// what this context and epoch own. Recorded durably before `begin_epoch(epoch)`.
    fn checkpoint_artifact_intent(&self, _epoch: u64) -> Option<Value> {
        None
    }

    /// Starts staging epoch `epoch` (where its artifact intent said).
    async fn begin_epoch(&mut self, epoch: u64) -> Result<()>;

    /// Stages one batch of binding `binding` (an index into `open`'s bindings).
    async fn write_batch(&mut self, binding: usize, batch: &RecordBatch) -> Result<WriteResult>;

    /// Makes what was staged durable, and describes it; `None` when the epoch staged
    /// nothing to apply. Nothing becomes visible yet.
    async fn pre_commit(&mut self, epoch: u64) -> Result<Option<Value>>;

    /// Applies a descriptor `pre_commit` returned, once its decision is durable.
    /// Idempotent: after a crash it runs again for an epoch that may be applied already.
    async fn commit_epoch(&mut self, epoch: u64, descriptor: &Value) -> Result<()>;

    /// Discards epoch `epoch`'s staging: a failure came before its decision. Idempotent,
    /// and called even when `pre_commit` never ran.
    async fn rollback_epoch(&mut self, epoch: u64) -> Result<()>;

    /// Releases connections.
    async fn close(&mut self) -> Result<()> {
        Ok(())
    }
}
