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
//!  at start: Open + the log's last descriptor and undecided intents ─▶ build, bind_runtime_context,
//!                                   bind_state_dir (the endpoint's folder, if any)
//!                                   abort_cleaner()?.clean(undecided) (before the writer opens)
//!                                   committer()?.commit_epoch(decided)
//!                                   open, recover (what the handles did not)
//!     Load* (standard bindings) ──▶  load: keys as a batch ──────────▶ load(binding, keys) → documents
//!  ── Intent(N) + artifact intent ◀── artifact_intent(N) ◀─────────── checkpoint_artifact_intent(N)
//!     Prepare(N) ─────────────────▶  prepare ────────────────────────▶ begin_epoch(N)
//!     Store* ─────────────────────▶  store: Arrow batches ───────────▶ write_batch*
//!                                    every flush_interval, between calls ─▶ flush
//!     Commit ─────────────────────▶  commit ─────────────────────────▶ pre_commit(N) → descriptor
//!  ── Commit(N) + descriptor      ◀── decision(N)
//!     Acknowledge ────────────────▶  acknowledge ────────────────────▶ commit_epoch(N, descriptor)
//!  end of the stream ─────────────▶  destroy ────────────────────────▶ close; terminal_task_tracker waited
//! ```
//!
//! Every call from `begin_epoch` to `close` has a deadline, the sink's
//! [`EpochSink::suggested_write_timeout`]. A call past it is dropped, and the sink's
//! [`EpochSink::cancellation_policy`] says what follows: a cancel-safe instance is kept
//! (the epoch rolls back on it), a retire-on-cancel one is never called again: its
//! background work ([`TaskTracker`]) is awaited, then a new instance is built, bound,
//! opened and recovered (the epoch in progress is then undecided garbage), and the epoch
//! fails with a retryable error, so the runtime reopens the loop and replays it.
//!
//! What holds:
//! - An epoch's artifact intent (where its staging goes) is durable in the recovery log
//!   before `begin_epoch` runs, so an epoch that never reaches its decision leaves staging
//!   that the abort cleaner can find and remove.
//! - A descriptor is applied (`commit_epoch`) only once the recovery-log commit that holds
//!   it is durable; it may be applied again after a crash, so applying is idempotent.
//! - `rollback_epoch` runs only when a failure is known to come before the decision
//!   (before `pre_commit` returned); after it, only recovery decides.
//! - Calls to one instance come one at a time (a flush never races a write), and two
//!   instances of one sink never run at once, their background tasks included: an
//!   instance's tracked tasks have ended before the next instance is built.

pub mod arrow;
pub mod driver;
pub mod tasks;

pub use arrow_array::RecordBatch;
pub use arrow_schema::{DataType, Field, Schema, SchemaRef};
pub use driver::{EpochDriver, SinkKind};
/// An epoch the recovery log holds an intent of but no decision: its staging is garbage.
pub use sluice_driver_sdk::Undecided;
pub use sluice_driver_sdk::contract::{Consistency, InputMode, Placement, SinkContract};
pub use tasks::{TaskGuard, TaskTracker};

use async_trait::async_trait;
use serde_json::Value;
use std::time::Duration;

/// The identity a sink's staging is named by: stable across restarts, bound before `open`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeContext {
    /// The pipeline's deployment: created once, kept beside its recovery logs, or in a
    /// cluster's etcd for every member alike.
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
    /// `decided` was applied already, through [`EpochSink::committer`]: adopt what it
    /// says (what is pending, the generation), do not apply it again.
    pub decided_applied: bool,
    /// The staging of `undecided` was removed already, through
    /// [`EpochSink::abort_cleaner`].
    pub undecided_cleaned: bool,
}

/// What a cancelled call leaves of a sink instance (LaminarDB's cancellation policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancellationPolicy {
    /// Every call's future may be dropped at any await: the instance stays usable (the
    /// epoch in progress is rolled back on it).
    CancelSafe,
    /// A dropped call may leave the instance inconsistent: it is never called again, and
    /// a new instance is built and recovered in its place.
    RetireOnCancel,
}

/// Applies decided descriptors without the writer: usable once the sink's runtime
/// context is bound, before (or without) `open`, so a decision can be applied by
/// recovery, or elsewhere (another member after a failover).
#[async_trait]
pub trait EpochCommitter: Send + Sync {
    /// What [`EpochSink::commit_epoch`] does: applies `descriptor` of decided epoch
    /// `epoch`. Idempotent.
    async fn commit_epoch(&self, epoch: u64, descriptor: &Value) -> Result<()>;
}

/// Removes the staging of epochs that never reached their decision, without the
/// writer: usable once the sink's runtime context is bound, before (or without) `open`.
#[async_trait]
pub trait AbortCleaner: Send + Sync {
    /// Removes what `undecided` staged, where their artifact intents said. Idempotent;
    /// refuses (`Corrupt`) an intent naming anything this context does not own.
    async fn clean(&self, undecided: &[Undecided]) -> Result<()>;
}

/// A sink of LaminarDB's epoch contract. Calls come one at a time, in this order:
/// `bind_runtime_context`, `bind_state_dir`, (`abort_cleaner`, `committer`), `open`,
/// `recover`, then per epoch (`load`* for standard bindings) `begin_epoch`, `write_batch`* (with `flush` between them on its interval),
/// `pre_commit`, and (once the decision is durable) `commit_epoch`; `close` at the end.
/// `contract`, `keyed_mutation_key`, `resolve_schema` and `prepare_schema` may run on a
/// sink that is never opened. Each call from `begin_epoch` on is bounded by
/// [`EpochSink::suggested_write_timeout`]; what a call dropped there leaves is the
/// sink's [`EpochSink::cancellation_policy`].
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

    /// Binds the endpoint's own folder beside the recovery log (kept across restarts,
    /// removed by a reset), where a sink may keep state it can rebuild from its target
    /// (an index answering [`EpochSink::load`]). Before `open`, when the runtime has one.
    /// In a cluster it is the folder of the member running the shard: a cache that may
    /// be missing, or stale from an earlier time this member held the shard, so what it
    /// holds is checked against the target at open, never trusted.
    fn bind_state_dir(&mut self, _dir: &std::path::Path) -> Result<()> {
        Ok(())
    }

    /// Whether the binding of `resource` is a standard one: the runtime loads each key's
    /// stored document from the sink ([`EpochSink::load`]), reduces the transaction's
    /// documents onto it, and stores the result, so the sink holds the reduced view (one
    /// row per key) rather than each transaction's changes. `false` (the default): a
    /// delta binding, never loaded. Opens nothing.
    fn loads(&self, _resource: &Value) -> Result<bool> {
        Ok(false)
    }

    /// The stored documents (JSON text) of `keys` (a batch of binding `binding`'s key
    /// columns), for a binding [`EpochSink::loads`] said is standard: each key's
    /// document as of the last applied epoch; keys it does not hold (never stored, or
    /// deleted) are left out. Called between epochs only, after the last decided epoch
    /// was applied (`commit_epoch`), never while one is staging.
    async fn load(&mut self, binding: usize, _keys: &RecordBatch) -> Result<Vec<String>> {
        Err(SinkError::Config(format!(
            "binding {binding} was loaded, but this sink answers no Load"
        )))
    }

    /// Whether the instance survives a call dropped at its deadline. The default,
    /// retirement, is the conservative one: a sink is cancel-safe only once every await
    /// of every call was checked to leave it consistent.
    fn cancellation_policy(&self) -> CancellationPolicy {
        CancellationPolicy::RetireOnCancel
    }

    /// The deadline of each call from `begin_epoch` on (`write_batch`, `flush`,
    /// `pre_commit`, `commit_epoch`, `rollback_epoch`, `close`). One minute by default,
    /// well inside the runtime's own wait on a driver (`runtime.timeouts.driver`, five
    /// minutes by default), so the sink's policy, not the runtime's, handles a hang.
    fn suggested_write_timeout(&self) -> Duration {
        Duration::from_secs(60)
    }

    /// How long rows may stay buffered within an epoch: when this long has passed since
    /// the epoch began or last flushed, the driver hands the sink the rows it holds and
    /// calls [`EpochSink::flush`], between two calls. `None` (the default): only
    /// `pre_commit` flushes.
    fn flush_interval(&self) -> Option<Duration> {
        None
    }

    /// Moves what the sink buffers of the epoch in progress on towards its staging
    /// (bounded work: the thorough part belongs in `pre_commit`). Nothing becomes
    /// visible. The default has nothing to move.
    async fn flush(&mut self) -> Result<()> {
        Ok(())
    }

    /// The tracker of every task this instance spawns in the background, if it spawns
    /// any: the driver waits for them all to end before the instance is dropped or
    /// replaced. Asked once, right after the instance is built.
    fn terminal_task_tracker(&self) -> Option<TaskTracker> {
        None
    }

    /// A handle applying decided descriptors without the writer (see
    /// [`EpochCommitter`]). Asked after `bind_runtime_context`; when it is `Some`,
    /// recovery applies the decided descriptor through it before `open`.
    fn committer(&self) -> Option<Box<dyn EpochCommitter>> {
        None
    }

    /// A handle removing undecided staging without the writer (see [`AbortCleaner`]).
    /// Asked after `bind_runtime_context`; when it is `Some`, recovery removes the
    /// undecided epochs' staging through it before `open`.
    fn abort_cleaner(&self) -> Option<Box<dyn AbortCleaner>> {
        None
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

    /// After `open`: removes the staging of `recovery.undecided` unless the abort
    /// cleaner did, re-applies `recovery.decided` unless the committer did (either way
    /// adopting what it says), and removes what this context left orphaned.
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
