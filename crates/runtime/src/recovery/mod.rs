//! The recovery log: durable checkpoints and step intents of one pipeline shard, over
//! the store that makes them durable ([`LogStore`]: the local file of `file.rs`, the
//! embedded default, or a cluster's etcd log).
//!
//! ```text
//!  Intent{txn 7}  Commit{txn 7}  Intent{txn 8}  Commit{txn 8} ...
//! ```
//!
//! Per transaction `T` the runtime writes `Intent(T)` (the steps it queued, so they can
//! be replayed exactly) before any store may commit `T`, and `Commit(T)` (resume
//! positions and driver checkpoints) once the stores have committed. Both return only
//! after the store made them durable. At startup, [`plan_recovery`] (pure, `plan.rs`)
//! combines what the log holds with what an authoritative store reports in `Opened`
//! ([`StoreCheckpoint`]); when the store says where to begin, [`RecoveryLog::adopt`]
//! records that checkpoint as the log's last commit, even when it is older (a store
//! restored from a backup): transaction numbers then go back, and the log goes on from
//! there.
//!
//! Invariants ([`RecoveryLog`] keeps them, once, over any store):
//! - An intent is pending only while no commit record follows it: `Intent(T+1)` is
//!   written only after `Commit(T)`, and a commit (or an adopted checkpoint) settles
//!   every intent before it.
//! - Records go in transaction order: an intent or commit not newer than the last
//!   commit is refused ([`RecoveryError::OutOfOrder`]).
//!
//! Threads: everything here blocks (reads, fsync, rename). The loop calls it on
//! blocking tasks: [`RecoveryLog::open_async`] opens, `txn::state` writes intents and
//! commits on `spawn_blocking`; tests and `sluice inspect` call it directly.

mod file;
mod plan;

/// The log reader, for the fuzz target (crates/fuzz, issue 34).
#[doc(hidden)]
pub use file::read_log_valid_len;
pub use file::{
    FORMAT_VERSION, MAGIC, amend_last_commit, copy, deployment_id, inspect, lock_dir,
    new_deployment_id, read_latest, remove,
};
pub(crate) use file::{io, sync_dir};
pub use plan::{REBUILD_SENTINEL, RecoveryPlan, StoreCheckpoint, plan_recovery};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sluice_source_sdk::Resume;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// What a committed transaction leaves behind: where each source resumes and each
/// driver's checkpoint. Its [`to_bytes`](Checkpoint::to_bytes) form is the opaque
/// runtime checkpoint sent to drivers in Prepare and recovered from Opened.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// The transaction committed; transactions are numbered from 1, 0 is "none yet".
    pub txn: u64,
    /// Source name → the resume position of its last committed step.
    pub sources: BTreeMap<String, Value>,
    /// Materialization name → the checkpoint its driver returned in Prepared.
    pub driver_checkpoints: BTreeMap<String, Value>,
    /// Binding resource → hex of the highest packed key ever stored, for bindings stored
    /// only through this checkpoint's lineage since their first transaction (`""`: none
    /// yet). A key above it cannot be in the store, so it is not loaded. A binding
    /// missing here is not tracked: all its keys are loaded.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub max_keys: BTreeMap<String, String>,
    /// Binding resource → the backfill counter the stored data reflects (bindings at 0
    /// are left out). A binding whose spec counts higher is read again from the
    /// beginning, once: the first commit carrying the new counter consumes it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub backfills: BTreeMap<String, u32>,
}

impl Checkpoint {
    /// Whether `other` records the same commit: the same transaction, source positions
    /// and stored keys. Driver checkpoints are not compared: a store keeps the copy the
    /// runtime sent in Prepare, before the driver returned this transaction's checkpoint,
    /// so an authoritative store's copy of the log's last commit differs from it there.
    pub fn same_commit(&self, other: &Checkpoint) -> bool {
        self.txn == other.txn && self.sources == other.sources && self.max_keys == other.max_keys
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a checkpoint serializes")
    }

    /// Reads bytes written by [`to_bytes`](Checkpoint::to_bytes); empty bytes (a store
    /// that never committed) are `None`.
    pub fn from_bytes(bytes: &[u8]) -> Result<Option<Checkpoint>, RecoveryError> {
        if bytes.is_empty() {
            return Ok(None);
        }
        serde_json::from_slice(bytes)
            .map(Some)
            .map_err(|e| RecoveryError::BadCheckpoint(e.to_string()))
    }
}

/// The steps transaction `txn` queued, journaled before any store may commit it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Intent {
    pub txn: u64,
    /// Source name → the steps (`queue` calls) it contributed, in order; replaying
    /// them in order reproduces the transaction's input.
    pub steps: BTreeMap<String, Vec<Resume>>,
    /// Materialization name → its epoch sink's artifact intent (where this
    /// transaction's staging goes), durable before the sink begins the epoch.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub artifacts: BTreeMap<String, Value>,
}

/// One record of a recovery log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogRecord {
    Commit(Checkpoint),
    Intent(Intent),
}

#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    /// Another process is running this pipeline shard: stop it, or use another log.
    #[error("recovery log {} is in use by another sluice process ({})", dir.display(),
        pid.map_or("pid unknown".to_string(), |p| format!("pid {p}")))]
    InUse { dir: PathBuf, pid: Option<u32> },
    #[error("recovery log {}: cannot {action}: {error}", path.display())]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        error: std::io::Error,
    },
    /// Damage that is not a torn last write: never guessed past.
    #[error("recovery log {} (format {version}) is corrupt at byte {offset}: {reason}; \
             restore it from a backup, or remove it to start over (the store may then \
             hold data twice)",
             path.display())]
    Corrupt {
        path: PathBuf,
        /// The log's format version.
        version: u32,
        offset: u64,
        reason: String,
    },
    /// Written by a newer release: run that release (or a later one) on it.
    #[error("recovery log {} is of format version {found}, newer than the version \
             {supported} this sluice reads: run the sluice release that wrote it, or a \
             newer one", path.display())]
    NewerFormat {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    /// The shards a materialization's folder was split into cannot run as they are.
    #[error("recovery log {}: {reason}", dir.display())]
    Layout { dir: PathBuf, reason: String },
    #[error("invalid runtime checkpoint: {0}")]
    BadCheckpoint(String),
    /// A backfill that cannot start as the pipeline file asks (the user's to change).
    #[error("materialization {materialization:?}: {reason}")]
    Backfill {
        materialization: String,
        reason: String,
    },
    /// The runtime wrote out of order: an internal bug.
    #[error("recovery log {log}: {reason} (internal error)")]
    OutOfOrder { log: String, reason: String },
    /// Another holder took the shard's log over (a cluster moved the shard): this
    /// holder must stop, and never write again.
    #[error("recovery log {log} is fenced: {reason}")]
    Fenced { log: String, reason: String },
    /// A record larger than the engine keeping the log takes in one write.
    #[error(
        "recovery log {log}: a record of {bytes} bytes is above the {limit} bytes \
             this log takes in one write{hint}"
    )]
    TooLarge {
        log: String,
        bytes: usize,
        limit: usize,
        hint: &'static str,
    },
    /// The shared engine keeping the log did not answer, or failed: the write may or
    /// may not have landed, so the loop reopens and recovers from what the log holds.
    #[error("recovery log {log}: cannot {action}: {reason}")]
    Unavailable {
        log: String,
        action: &'static str,
        reason: String,
    },
}

/// The latest state of a log: its last commit and the intent pending after it. What a
/// compaction keeps, and all a shared engine stores.
#[derive(Clone, Copy)]
pub struct Latest<'a> {
    pub last_commit: Option<&'a Checkpoint>,
    pub pending_intent: Option<&'a Intent>,
}

/// Where a recovery log's records become durable: a local file ([`RecoveryLog::open`],
/// the embedded default) or a shared engine (a cluster shard's log, which moves with the
/// shard). Called on blocking threads.
pub trait LogStore: Send {
    /// Makes `record` durable; `after` is the log's state once it is. Returns only once
    /// a crash can no longer lose it. A store that knows a holder fails with
    /// [`RecoveryError::Fenced`] once another holder has taken the log over.
    fn append(&mut self, record: &LogRecord, after: Latest<'_>) -> Result<(), RecoveryError>;
    /// Names the log in messages (a path, a key prefix).
    fn describe(&self) -> String;
    /// The largest record the store takes, if it has a limit (etcd's request size):
    /// the transactions closed before their intents' journaled step data nears it.
    fn largest_record(&self) -> Option<usize> {
        None
    }
}

/// The open recovery log of one shard: its latest state, over the store that keeps it
/// (a file holds its lock until dropped; a shared engine fences older holders).
pub struct RecoveryLog {
    store: Box<dyn LogStore>,
    last_commit: Option<Checkpoint>,
    pending_intent: Option<Box<Intent>>,
}

impl RecoveryLog {
    /// A log whose latest state `store` holds, as read back from it.
    pub fn over(
        store: Box<dyn LogStore>,
        last_commit: Option<Checkpoint>,
        pending_intent: Option<Intent>,
    ) -> RecoveryLog {
        RecoveryLog {
            store,
            last_commit,
            pending_intent: pending_intent.map(Box::new),
        }
    }

    /// The checkpoint of the last transaction committed to this log.
    /// The step data one intent may journal in this log, if its store bounds records:
    /// a quarter of the largest record, the rest left to the steps' positions (an http
    /// source's idempotency keys take up to 384 KiB of etcd's 1 MiB) and the encoding.
    pub fn journal_limit(&self) -> Option<u64> {
        self.store.largest_record().map(|bytes| bytes as u64 / 4)
    }

    pub fn last_commit(&self) -> Option<&Checkpoint> {
        self.last_commit.as_ref()
    }

    /// An intent for a transaction newer than the last commit, if any.
    pub fn pending_intent(&self) -> Option<&Intent> {
        self.pending_intent.as_deref()
    }

    /// Journals the steps of transaction `intent.txn`.
    pub fn write_intent(&mut self, intent: &Intent) -> Result<(), RecoveryError> {
        self.check_newer(intent.txn, "intent")?;
        // Returns only once durable: the steps can be replayed after any later crash.
        let after = Latest {
            last_commit: self.last_commit.as_ref(),
            pending_intent: Some(intent),
        };
        self.store
            .append(&LogRecord::Intent(intent.clone()), after)?;
        self.pending_intent = Some(Box::new(intent.clone()));
        Ok(())
    }

    /// Records that transaction `checkpoint.txn` committed.
    pub fn commit(&mut self, checkpoint: &Checkpoint) -> Result<(), RecoveryError> {
        self.check_newer(checkpoint.txn, "commit")?;
        // A commit settles every intent up to its transaction.
        let settles = |i: &Intent| i.txn <= checkpoint.txn;
        let after = Latest {
            last_commit: Some(checkpoint),
            pending_intent: self.pending_intent.as_deref().filter(|i| !settles(i)),
        };
        // Returns only once durable: a restart resumes after this transaction.
        self.store
            .append(&LogRecord::Commit(checkpoint.clone()), after)?;
        self.last_commit = Some(checkpoint.clone());
        if self.pending_intent.as_deref().is_some_and(settles) {
            self.pending_intent = None;
        }
        Ok(())
    }

    /// Makes `from`, the checkpoint recovery begins at, the log's last commit: appends
    /// it as a commit record unless it is that already (or the log is empty and `from`
    /// is the empty checkpoint). Its transaction number may be lower than the last
    /// commit's: a store restored from a backup, or rebuilding, is caught up from there.
    /// Any pending intent is dropped (the plan replays one only when `from` is the
    /// commit it follows, and then this appends nothing). Returns only once durable, so
    /// the next intent follows `from` in the log too.
    pub fn adopt(&mut self, from: &Checkpoint) -> Result<(), RecoveryError> {
        let current = match &self.last_commit {
            Some(last) => last.same_commit(from),
            None => from.txn == 0,
        };
        if current {
            return Ok(());
        }
        if let Some(last) = &self.last_commit {
            tracing::info!(
                log = %self.store.describe(),
                "the store's checkpoint (transaction {}) replaces the recovery log's \
                 (transaction {}): processing begins there",
                from.txn,
                last.txn
            );
        }
        let after = Latest {
            last_commit: Some(from),
            pending_intent: None,
        };
        self.store.append(&LogRecord::Commit(from.clone()), after)?;
        self.last_commit = Some(from.clone());
        self.pending_intent = None;
        Ok(())
    }

    fn check_newer(&self, txn: u64, what: &str) -> Result<(), RecoveryError> {
        match &self.last_commit {
            Some(last) if txn <= last.txn => Err(RecoveryError::OutOfOrder {
                log: self.store.describe(),
                reason: format!("{what} for transaction {txn} after commit of {}", last.txn),
            }),
            _ => Ok(()),
        }
    }
}
