//! A shard's recovery log kept in etcd, so that it moves with the shard: its latest
//! state as two keys (`commit`, `intent` under `P/log/<mat>/<shard>/`), each write one
//! etcd transaction that holds only while the writer's assignment is current:
//!
//! ```text
//!  txn  if  mod_revision(P/assign/<mat>/<shard>) == token     (the holder's claim)
//!       then put commit (and put or delete intent)            (the log's new state)
//!       else get the assignment                               (to say who fenced us)
//! ```
//!
//! A member's assignment is written with its lease and by a compare-and-swap, so a
//! new holder's claim (after the old holder's lease expired, or its release) changes
//! the assignment's revision, and every later write of the old holder fails as
//! [`RecoveryError::Fenced`]. Its store writes are fenced too, by the new holder's
//! Open. The log keeps only the latest state (what a compacted file log holds), so it
//! stays a few KiB whatever the history; etcd's own history is compacted by etcd. The
//! intent is stored packed ([`crate::pack`]): each step's position as a patch of the
//! step before, so it grows with what each step read rather than with its steps times a
//! source's whole position (a Kafka topic of hundreds of partitions).

use crate::etcd::{Cond, Etcd, Op};
use crate::keys::{Keys, ShardId};
use async_trait::async_trait;
use sluice_runtime::pipeline::OpenLog;
use sluice_runtime::recovery::{
    Checkpoint, Intent, Latest, LogRecord, LogStore, RecoveryError, RecoveryLog,
};

/// The largest record written: below etcd's default request limit (1.5 MiB) with room
/// for the transaction around it.
pub const MAX_RECORD: usize = 1 << 20;

/// Where a holder's log writes go, and the claim that must still be current.
#[derive(Clone)]
pub struct SharedLog {
    etcd: Etcd,
    /// `P/log/<mat>/<shard>/`.
    dir: String,
    assignment: String,
    token: i64,
}

impl SharedLog {
    pub fn new(etcd: Etcd, keys: &Keys, shard: &ShardId, token: i64) -> SharedLog {
        SharedLog {
            etcd,
            dir: keys.log(shard),
            assignment: keys.assignment(shard),
            token,
        }
    }

    fn commit_key(&self) -> String {
        format!("{}commit", self.dir)
    }

    fn intent_key(&self) -> String {
        format!("{}intent", self.dir)
    }

    fn unavailable(
        &self,
        action: &'static str,
    ) -> impl FnOnce(crate::etcd::EtcdError) -> RecoveryError {
        let log = self.dir.clone();
        move |e| RecoveryError::Unavailable {
            log,
            action,
            reason: e.to_string(),
        }
    }

    /// Why a conditional write failed: who holds the assignment now.
    fn fenced(&self, now: Option<&crate::etcd::KeyValue>) -> RecoveryError {
        let reason = match now {
            None => format!(
                "this holder's assignment (revision {}) has ended: its lease expired or it \
                 released the shard",
                self.token
            ),
            Some(kv) => format!(
                "member {} took the shard over (revision {}; this holder's was {})",
                String::from_utf8_lossy(&kv.value),
                kv.mod_revision,
                self.token
            ),
        };
        RecoveryError::Fenced {
            log: self.dir.clone(),
            reason,
        }
    }

    fn encode<T: serde::Serialize>(&self, value: &T) -> Result<Vec<u8>, RecoveryError> {
        let bytes = serde_json::to_vec(value).expect("a log record serializes");
        self.bounded(bytes)
    }

    fn encode_intent(&self, intent: &Intent) -> Result<Vec<u8>, RecoveryError> {
        self.bounded(encode_intent(intent))
    }

    fn bounded(&self, bytes: Vec<u8>) -> Result<Vec<u8>, RecoveryError> {
        if bytes.len() > MAX_RECORD {
            return Err(RecoveryError::TooLarge {
                log: self.dir.clone(),
                bytes: bytes.len(),
                limit: MAX_RECORD,
                hint: " (a cluster keeps shard logs in etcd, whose records are small: a \
                       transaction closes before what its steps journal reaches 256KiB, \
                       and a CDC snapshot's step ends before its rows pass it, but one \
                       body or row must fit: keep an http source's max_body_bytes at \
                       256KiB or less; a CDC row that large, or a table its source reads \
                       whole (a key of a type it cannot chunk by), cannot be snapshotted \
                       under cluster:, so run that pipeline without cluster:, whose file \
                       log takes 64MiB in a record)",
            });
        }
        Ok(bytes)
    }

    /// Writes `ops` if the claim is current.
    async fn write(&self, ops: Vec<Op>) -> Result<(), RecoveryError> {
        let outcome = self
            .etcd
            .txn(
                vec![Cond::ModRevision(self.assignment.clone(), self.token)],
                ops,
                vec![Op::Get(self.assignment.clone())],
            )
            .await
            .map_err(self.unavailable("write"))?;
        match outcome.succeeded {
            true => Ok(()),
            false => Err(self.fenced(outcome.got.first().and_then(Option::as_ref))),
        }
    }

    /// The log's state, read only if the claim is current.
    pub async fn read(&self) -> Result<(Option<Checkpoint>, Option<Intent>), RecoveryError> {
        let outcome = self
            .etcd
            .txn(
                vec![Cond::ModRevision(self.assignment.clone(), self.token)],
                vec![Op::Get(self.commit_key()), Op::Get(self.intent_key())],
                vec![Op::Get(self.assignment.clone())],
            )
            .await
            .map_err(self.unavailable("read"))?;
        if !outcome.succeeded {
            return Err(self.fenced(outcome.got.first().and_then(Option::as_ref)));
        }
        let corrupt = |what: &str, e: serde_json::Error| {
            RecoveryError::BadCheckpoint(format!("etcd:{}{what} does not read: {e}", self.dir))
        };
        let commit = match &outcome.got[0] {
            Some(kv) => Some(serde_json::from_slice(&kv.value).map_err(|e| corrupt("commit", e))?),
            None => None,
        };
        let intent = match &outcome.got[1] {
            Some(kv) => Some(crate::pack::unpack(&kv.value).map_err(|e| {
                RecoveryError::BadCheckpoint(format!("etcd:{}intent does not read: {e}", self.dir))
            })?),
            None => None,
        };
        Ok((commit, intent))
    }

    /// The log's state as operations writing it under `to` (another shard's log
    /// folder): what a split copies to each half.
    pub fn copy_ops(to: &str, commit: Option<&Checkpoint>, intent: Option<&Intent>) -> Vec<Op> {
        let mut ops = Vec::new();
        if let Some(commit) = commit {
            ops.push(Op::Put {
                key: format!("{to}commit"),
                value: serde_json::to_vec(commit).expect("a checkpoint serializes"),
                lease: 0,
            });
        }
        if let Some(intent) = intent {
            ops.push(Op::Put {
                key: format!("{to}intent"),
                value: encode_intent(intent),
                lease: 0,
            });
        }
        ops
    }
}

/// An intent as the log stores it, packed.
pub fn encode_intent(intent: &Intent) -> Vec<u8> {
    serde_json::to_vec(&crate::pack::pack(intent)).expect("a packed intent serializes")
}

/// The log as the loop writes it, from blocking threads.
struct Writer {
    log: SharedLog,
    runtime: tokio::runtime::Handle,
}

impl LogStore for Writer {
    fn append(&mut self, record: &LogRecord, after: Latest<'_>) -> Result<(), RecoveryError> {
        let log = &self.log;
        let mut ops = Vec::new();
        if matches!(record, LogRecord::Commit(_)) {
            let commit = after.last_commit.expect("a commit is the last commit");
            ops.push(Op::Put {
                key: log.commit_key(),
                value: log.encode(commit)?,
                lease: 0,
            });
        }
        ops.push(match after.pending_intent {
            Some(intent) => Op::Put {
                key: log.intent_key(),
                value: log.encode_intent(intent)?,
                lease: 0,
            },
            None => Op::Delete(log.intent_key()),
        });
        self.runtime.block_on(log.write(ops))
    }

    fn describe(&self) -> String {
        format!("etcd:{}", self.log.dir)
    }

    fn largest_record(&self) -> Option<usize> {
        Some(MAX_RECORD)
    }
}

#[async_trait]
impl OpenLog for SharedLog {
    async fn open(&self) -> Result<RecoveryLog, RecoveryError> {
        let (commit, intent) = self.read().await?;
        let writer = Writer {
            log: self.clone(),
            runtime: tokio::runtime::Handle::current(),
        };
        Ok(RecoveryLog::over(Box::new(writer), commit, intent))
    }
}
