//! Where processing begins after a start: [`plan_recovery`], a pure decision over what
//! the log holds and what the store reported in `Opened` ([`StoreCheckpoint`]),
//! table-tested in `tests/recovery.rs` with no log and no server.

use super::{Checkpoint, Intent, RecoveryError};
pub use sluice_driver_sdk::machine::REBUILD_SENTINEL;

/// What a store reported in `Opened.flow_checkpoint`.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreCheckpoint {
    /// Empty bytes from a store that keeps no checkpoint: use the runtime's own.
    RuntimeOwn,
    /// Empty bytes from a store that keeps the runtime checkpoint (authoritative): it
    /// holds none for this range, so it never committed one, or it lost them all.
    Absent,
    /// The rebuild sentinel: begin again from an empty checkpoint.
    Rebuild,
    /// A checkpoint: processing begins there, whatever the log holds.
    At(Checkpoint),
}

impl StoreCheckpoint {
    /// What `Opened.flow_checkpoint` says, from a store that keeps the runtime
    /// checkpoint in its own transactions (`keeps_checkpoint`: authoritative) or not.
    pub fn from_opened(
        bytes: &[u8],
        keeps_checkpoint: bool,
    ) -> Result<StoreCheckpoint, RecoveryError> {
        if bytes == REBUILD_SENTINEL {
            return Ok(StoreCheckpoint::Rebuild);
        }
        Ok(match Checkpoint::from_bytes(bytes)? {
            None if keeps_checkpoint => StoreCheckpoint::Absent,
            None => StoreCheckpoint::RuntimeOwn,
            Some(checkpoint) => StoreCheckpoint::At(checkpoint),
        })
    }
}

/// What to do at startup.
#[derive(Debug, Clone, PartialEq)]
pub enum RecoveryPlan {
    /// Nothing was ever committed: start every source from the beginning.
    Fresh,
    /// The store asked to rebuild (the sentinel) although the log committed: start every
    /// source from the beginning, from the empty checkpoint.
    Rebuild,
    /// Seek every source to the checkpoint's positions and go on.
    ResumeFrom(Checkpoint),
    /// Seek to `from`, then replay the intent's steps as transaction `replay.txn`
    /// (verifying their hashes), then go on.
    ReplayThenResume { from: Checkpoint, replay: Intent },
    /// A store that keeps the runtime checkpoint holds none, but the log committed
    /// through `log_txn`: the store was recreated, emptied, or is another one. Resuming
    /// would fill it from the middle of its input, so the run is refused.
    StoreLost { log_txn: u64 },
}

/// Decides recovery from observed facts: the log's last commit, what the store reported
/// in Opened, and the log's pending intent.
///
/// - A store checkpoint is where processing begins (the protocol's rule), whether it is
///   newer than the log's (the log's record of a transaction the store committed was
///   lost in a crash), the same, or older (a store restored from a backup asks to be
///   caught up). The sentinel begins from the empty checkpoint. Only a store that keeps
///   no checkpoint leaves the choice to the log. A store that keeps checkpoints but has
///   none, while the log committed, lost what the log's commits stand for: refused.
/// - The intent is replayed only when it was written right after the chosen
///   checkpoint: the pending intent follows the log's last commit (or nothing, for
///   transaction 1), so it is replayed only when that commit is the chosen checkpoint
///   and the intent is for the next transaction. Any other intent was committed
///   already, or belongs to a history the store does not have: it is not replayed.
pub fn plan_recovery(
    log_commit: Option<&Checkpoint>,
    store: &StoreCheckpoint,
    intent: Option<&Intent>,
) -> RecoveryPlan {
    let empty = Checkpoint::default();
    if let (StoreCheckpoint::Absent, Some(log)) = (store, log_commit)
        && log.txn > 0
    {
        return RecoveryPlan::StoreLost { log_txn: log.txn };
    }
    let chosen = match store {
        // The store's copy of the log's last commit: the log's, which also holds the
        // driver checkpoint that the store's copy predates.
        StoreCheckpoint::At(checkpoint) => match log_commit {
            Some(log) if log.same_commit(checkpoint) => Some(log),
            _ => Some(checkpoint),
        },
        StoreCheckpoint::Rebuild | StoreCheckpoint::Absent => Some(&empty),
        StoreCheckpoint::RuntimeOwn => log_commit,
    };
    let follows = |intent: &Intent| match (log_commit, chosen) {
        (Some(log), Some(chosen)) => log.same_commit(chosen) && intent.txn == log.txn + 1,
        (None, chosen) => chosen.is_none_or(|c| c.txn == 0) && intent.txn == 1,
        (Some(_), None) => false,
    };
    if let Some(intent) = intent.filter(|i| follows(i)) {
        return RecoveryPlan::ReplayThenResume {
            from: chosen.cloned().unwrap_or_default(),
            replay: intent.clone(),
        };
    }
    match (store, log_commit, chosen) {
        (StoreCheckpoint::Rebuild, Some(_), _) => RecoveryPlan::Rebuild,
        (StoreCheckpoint::Rebuild | StoreCheckpoint::Absent, None, _) | (_, _, None) => {
            RecoveryPlan::Fresh
        }
        (_, _, Some(c)) => RecoveryPlan::ResumeFrom(c.clone()),
    }
}
