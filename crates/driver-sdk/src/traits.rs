//! What a driver author implements.
//!
//! A [`Driver`] answers the unary calls and opens a [`Transactor`] for the long-lived
//! Transactions stream. The SDK's serve loop owns the protocol: it checks every message
//! against the state machine and calls the transactor in an order the protocol allows,
//! so a driver cannot get the lifecycle wrong.
//!
//! ## One transaction, as the transactor sees it
//!
//! ```text
//! open ─▶ [ acknowledge (prior commit durable) ⇄ load* ] ─▶ prepare ─▶ store* ─▶ commit ─┐
//!            ▲                                                                           │
//!            └───────────────────────────── next transaction ◀───────────────────────────┘
//! ```
//!
//! The serve loop calls the transactor one request at a time, in wire order: `acknowledge`
//! and `load` never run concurrently, and `load` of transaction T+1 starts only after
//! `commit` of T has returned.
//!
//! ## The three commit patterns, and what each must await before loading
//!
//! - [`CommitPattern::RemoteAuthoritative`]: the store is the source of truth. `commit`
//!   writes data, the runtime checkpoint (from `prepare`) and a fence check in one store
//!   transaction. Loads must see the prior transaction's stores, so they await the prior
//!   **commit** (signal `prior_committed`). The SDK only calls `load` after `commit` of the
//!   prior transaction has returned, so this always holds.
//! - [`CommitPattern::RecoveryLogNonTransactional`]: the store has no transactions;
//!   `prepare` returns a driver checkpoint (recorded by the runtime's recovery log) and
//!   `commit` writes last-write-wins effects. Loads of the next transaction await the prior
//!   **acknowledgement** (signal `prior_acknowledged`): the SDK defers `load` calls until
//!   `acknowledge` has returned.
//! - [`CommitPattern::RecoveryLogIdempotentApply`]: `prepare` stages the transaction's
//!   effects and returns a driver checkpoint that describes them; `acknowledge` applies
//!   them idempotently (it may run again after a crash). Loads must see applied effects,
//!   so they too await the prior **acknowledgement**; the SDK defers them likewise.
//!
//! ## What the protocol cannot carry (in process only)
//!
//! A driver linked into the binary may also take part in the runtime's recovery log, for
//! what no Flow message carries. Each is optional, and a driver across the wire never
//! sees them (the gRPC and stdio transports have no such calls):
//!
//! ```text
//!  runtime log            in-process driver
//!  before Open    ──▶  Driver::open_with_log(open, LogContext {deployment, undecided})
//!  Intent(T)      ◀──  Transactor::artifact_intent(T)   where T's artifacts will go
//!  Commit(T)      ◀──  Transactor::decision(T)          after commit: the checkpoint to record
//!  (status)       ◀──  Transactor::report()             after commit: memory, metrics, health
//! ```
//!
//! This is how an epoch sink's staging is named before it is written and its descriptor
//! is decided by the log, on the same loop and the same seam as every other driver.

use crate::Result;
use async_trait::async_trait;
use serde_json::Value;
use sluice_proto::flow;
use sluice_proto::materialize::{
    self as m,
    transaction_request::{Load, Open, Prepare, Store},
    transaction_response::Opened,
};
use sluice_report::Report;

/// How a driver makes a transaction's effects durable exactly once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommitPattern {
    RemoteAuthoritative,
    RecoveryLogNonTransactional,
    RecoveryLogIdempotentApply,
}

impl CommitPattern {
    /// Whether loads of transaction T+1 must wait for T's acknowledgement.
    pub fn loads_await_acknowledge(self) -> bool {
        !matches!(self, CommitPattern::RemoteAuthoritative)
    }
}

/// What a driver declares where it is defined: how it commits (what admission decides on
/// before the driver is asked anything, and when the serve loop lets Loads run) and what
/// the conformance suite holds it to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Declared {
    pub pattern: CommitPattern,
    /// A null document stored with `exists` deletes its key.
    pub deletes: bool,
    /// Takes delta-updates bindings (stores appended, never loaded).
    pub delta_updates: bool,
    /// Fails the transaction that stores, as absent, a key the store holds.
    pub strict_exists: bool,
    /// Empties what a standard binding stored when Apply raises its backfill counter
    /// (against the last spec's binding of the same resource path), so the run that
    /// reads its input again from the start reduces onto nothing. Without it a backfill
    /// of a standard binding is refused: its sums would count twice.
    pub rebuilds_on_backfill: bool,
}

impl Declared {
    /// An authoritative table store: every capability.
    pub const AUTHORITATIVE_TABLE: Declared = Declared {
        pattern: CommitPattern::RemoteAuthoritative,
        deletes: true,
        delta_updates: true,
        strict_exists: true,
        rebuilds_on_backfill: true,
    };
}

/// What the transactor is told about the prior transaction when asked to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PriorState {
    /// The prior transaction's `commit` has returned (DriverCommitted was sent).
    pub prior_committed: bool,
    /// The prior transaction's `acknowledge` has returned.
    pub prior_acknowledged: bool,
}

/// Collects Loaded documents, batching them into arena messages of bounded size
/// ([`crate::arena::LoadedBuilder`]). The serve loop sends full messages after each
/// `load` returns and whenever the transactor calls [`LoadedSink::send_full`], the rest
/// at Prepare, always before Prepared.
#[async_trait]
pub trait LoadedSink: Send {
    /// Adds one found document of `binding` (its JSON text).
    fn push(&mut self, binding: u32, doc_json: &[u8]);

    /// Sends the messages filled so far, now. A transactor that may find many documents
    /// per Load calls it as it goes (every few thousand documents), so what it holds
    /// stays bounded (about one message per binding) rather than a whole Load's worth.
    /// Cheap when no message is full.
    async fn send_full(&mut self) -> Result<()>;
}

#[async_trait]
pub trait Driver: Send + Sync + 'static {
    /// How this driver commits and what it supports: the one place it is said.
    fn declared(&self) -> Declared;
    /// Endpoint and resource JSON schemas, documentation URL.
    async fn spec(&self, req: m::SpecRequest) -> Result<m::SpecResponse>;
    /// Per binding: constraints on every projection, the resource path, delta updates.
    async fn validate(&self, req: m::ValidateRequest) -> Result<m::ValidateResponse>;
    /// Creates or updates resources. With `dry_run`, only describes the actions.
    /// Re-applying the same spec is a no-op.
    async fn apply_upsert(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse>;
    /// Drops resources. With `dry_run`, only describes the actions.
    async fn apply_delete(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse>;
    /// Opens a transactor for the key range of `open`.
    ///
    /// Postcondition for [`CommitPattern::RemoteAuthoritative`] drivers: after `open`
    /// returns, every earlier instance of an overlapping key range is fenced and can no
    /// longer commit. `Opened.flow_checkpoint` is the checkpoint recovered from the store
    /// (empty: use the runtime's own).
    async fn open(&self, open: Open) -> Result<(Box<dyn Transactor>, Opened)>;

    /// [`Driver::open`], told what the runtime's recovery log holds for this stream
    /// beyond the protocol (in process only; see the module docs). A driver that names
    /// artifacts in [`Transactor::artifact_intent`] overrides it to clean up after the
    /// transactions that never reached their decision.
    async fn open_with_log(
        &self,
        open: Open,
        _log: LogContext,
    ) -> Result<(Box<dyn Transactor>, Opened)> {
        self.open(open).await
    }
}

/// What the runtime's recovery log holds for an in-process driver's stream, told before
/// Open ([`Driver::open_with_log`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogContext {
    /// The pipeline's deployment: created once, kept beside its recovery logs; stable
    /// across restarts, so artifacts may be named by it.
    pub deployment_id: String,
    /// Transactions whose intent the log holds with an artifact intent of this driver,
    /// but no decision: what they staged is garbage.
    pub undecided: Vec<Undecided>,
}

/// A transaction (an epoch) the recovery log holds an intent of but no decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Undecided {
    pub epoch: u64,
    /// The artifact intent [`Transactor::artifact_intent`] gave before it began.
    pub intent: Value,
}

#[async_trait]
pub trait Transactor: Send + 'static {
    /// Looks up the keys of `load` (its arena and packed_keys) and pushes each found
    /// document to `loaded`; keys not found are simply skipped. May instead remember the
    /// keys and push their documents in [`Transactor::flush_loads`]. Never called for a
    /// delta-updates binding. See the module docs for which of `prior` is guaranteed.
    async fn load(
        &mut self,
        load: Load,
        prior: PriorState,
        loaded: &mut dyn LoadedSink,
    ) -> Result<()>;

    /// Called at Prepare, before [`Transactor::prepare`]: push every deferred document.
    async fn flush_loads(&mut self, _loaded: &mut dyn LoadedSink) -> Result<()> {
        Ok(())
    }

    /// Begins the store phase. `prepare.flow_checkpoint` is the runtime checkpoint to
    /// commit with this transaction. Returns the driver checkpoint update (empty JSON
    /// object `{}` with merge-patch set means "no change").
    async fn prepare(&mut self, prepare: Prepare) -> Result<flow::DriverCheckpoint>;

    /// Called before [`Transactor::commit`] when the runtime gave the checkpoint to
    /// commit only at Commit (a runtime of Flow's current protocol, whose StartCommit
    /// carries it, while its Flush, this Prepare, carries none): `checkpoint` replaces
    /// `prepare.flow_checkpoint`. A driver that commits the runtime checkpoint (an
    /// authoritative store) takes it; the default ignores it, as a driver of the
    /// recovery-log patterns ignores the runtime checkpoint.
    fn commit_checkpoint(&mut self, _checkpoint: Vec<u8>) {}

    /// After `commit` returned: an update of the driver checkpoint, recorded with this
    /// transaction's commit to the runtime's log (transactional: Flow's StartedCommit
    /// state). `None`: no change.
    fn committed_state(&mut self) -> Option<flow::DriverCheckpoint> {
        None
    }

    /// After `acknowledge` returned: an update of the driver checkpoint that is not
    /// transactional (Flow's Acknowledged state): recorded with the next commit, and
    /// lost if the runtime stops first, so the driver must tolerate seeing the prior
    /// state again. `None`: no change.
    fn acknowledged_state(&mut self) -> Option<flow::DriverCheckpoint> {
        None
    }

    /// Stores documents of one binding; `exists[i]` says whether the runtime loaded key i.
    async fn store(&mut self, store: Store) -> Result<()>;

    /// Commits the transaction. An authoritative driver verifies its fence here, in the
    /// same store transaction as the data and checkpoint; a fenced commit fails with
    /// [`crate::Error::Fenced`].
    async fn commit(&mut self) -> Result<()>;

    /// The runtime's recovery log has durably recorded the prior commit. May be called more
    /// than once for one commit (after a crash, for the recovered checkpoint): idempotent.
    async fn acknowledge(&mut self) -> Result<()>;

    /// Releases resources. Called once when the stream ends, cleanly or not.
    async fn destroy(self: Box<Self>) {}

    /// In process only: where transaction `txn`'s artifacts will go, recorded durably in
    /// the runtime's intent of `txn` before any request of it is sent. Bounded, naming
    /// only what this stream and transaction own; `None`: it names nothing.
    async fn artifact_intent(&mut self, _txn: u64) -> Result<Option<Value>> {
        Ok(None)
    }

    /// In process only, after `commit` of `txn` returned: the driver checkpoint the
    /// runtime's commit record of `txn` holds, in place of the one Prepared gave (a
    /// decision known only once the transaction was staged). `None`: Prepared's stands.
    fn decision(&mut self, _txn: u64) -> Option<Value> {
        None
    }

    /// In process only, after each transaction it committed: what it reports of itself
    /// (after Feldera's `memory()` and connector health): the bytes of memory it holds
    /// (staging, an encode buffer), its own metrics (`sluice_endpoint_custom{name, …}`)
    /// and, if it has something to say, its health (see [`Report::health`]). Cheap: no
    /// I/O. The default reports nothing. A driver across the wire is never asked: its
    /// health is what the runtime sees of its calls.
    fn report(&self) -> Report {
        Report::default()
    }
}
