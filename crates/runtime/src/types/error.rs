//! [`RunError`]: why a run of the loop ended, with the typed error underneath and the
//! one decision of whether reopening the loop may help.

use crate::deadletter::DeadLetterError;
use crate::recovery::RecoveryError;
use sluice_doc::combine::CombineError;
use sluice_driver_sdk::Error as DriverError;
use sluice_source_sdk::SourceError;

/// Why a run ended. Each variant keeps the typed error underneath, so that
/// [`RunError::is_retryable`] decides by its kind: a transient failure (a lost
/// connection, a timeout, a source's I/O error) reopens the loop with backoff; a
/// deterministic one (bad input, a malformed or out-of-order message, a configuration
/// or schema error, the recovery log's disk) fails at once, as it would fail again.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Bad input the source found, at its position (the user's data).
    #[error("{position}: {reason}")]
    Input {
        /// The source it came from (its health turns fatal).
        name: String,
        position: String,
        reason: String,
    },
    /// A document that does not parse, validate, key or reduce (the user's data).
    #[error("{position}: {source}")]
    Document {
        position: String,
        #[source]
        source: Box<CombineError>,
    },
    /// A reduction against a loaded document or across spilled runs, or the spill file.
    #[error(transparent)]
    Combine(Box<CombineError>),
    /// A source failed (its error names it).
    #[error(transparent)]
    Source(SourceError),
    /// A source cannot seek back to the store's checkpoint, older than the log's.
    #[error(
        "{source}; the store's checkpoint (transaction {store_txn}) is older than the \
         recovery log's (transaction {log_txn}), so this source must replay from there"
    )]
    SeekBack {
        store_txn: u64,
        log_txn: u64,
        source: SourceError,
    },
    /// The dead-letter file of an `on_error: skip` source.
    #[error("source {name}: {source}")]
    DeadLetter {
        name: String,
        source: DeadLetterError,
    },
    #[error("driver {endpoint}: {source}{}", timeout_hint(source))]
    Driver {
        endpoint: String,
        #[source]
        source: DriverError,
    },
    /// A Loaded document the runtime cannot use (not JSON, no key): the driver's bug.
    #[error("driver {endpoint}: a Loaded document of binding {binding} ({resource}) {reason}")]
    Loaded {
        endpoint: String,
        binding: u32,
        resource: String,
        reason: String,
    },
    /// The checkpoint in the driver's Opened does not decode.
    #[error("driver {endpoint}: the checkpoint recovered from the store: {source}")]
    StoreCheckpoint {
        endpoint: String,
        source: RecoveryError,
    },
    /// A store that keeps the runtime checkpoint holds none, while the recovery log has
    /// committed: it was recreated, emptied, or is not the store this pipeline wrote.
    #[error(
        "driver {endpoint}: the store holds no checkpoint of materialization \
         {materialization:?}, but its recovery log has committed through transaction \
         {log_txn}: the store was recreated or emptied, or the endpoint names another \
         store. Resuming would fill it from the middle of its input, so nothing was \
         written. Point the endpoint back at the store it wrote to (or restore that store \
         from a backup), or start over with `sluice apply --delete <pipeline>`, which \
         forgets the recovery log and drops what the store holds, then run again"
    )]
    StoreLost {
        endpoint: String,
        materialization: String,
        log_txn: u64,
    },
    /// The driver refused Open for its configuration (a table it expects is missing)
    /// after the recovery log had committed: the store changed under the pipeline.
    #[error(
        "driver {endpoint}: {source}; the recovery log of materialization \
         {materialization:?} has committed through transaction {log_txn}, so a table \
         dropped or a store recreated since cannot simply be applied again (it would be \
         filled from the middle of its input): restore the store, or start over with \
         `sluice apply --delete <pipeline>`"
    )]
    OpenAfterCommits {
        endpoint: String,
        materialization: String,
        log_txn: u64,
        #[source]
        source: DriverError,
    },
    /// The recovery log (its file, its lock, its records).
    #[error(transparent)]
    Recovery(#[from] RecoveryError),
    /// The log's pending intent reads a source the pipeline file no longer has.
    #[error(
        "the recovery log's pending intent reads source {name}, which the pipeline file \
         no longer has: restore the source so the interrupted transaction can replay"
    )]
    IntentSource { name: String },
    /// A source ended its input inside a unit it declared (`Step::unit_continues`).
    #[error(
        "source {name} ended its input inside a unit (an upstream transaction) whose \
         end it never handed over: the unit's records are not committed"
    )]
    UnitUnfinished { name: String },
    /// The shards of a materialization that share a reader recovered checkpoints it
    /// cannot resume together.
    #[error("materialization {materialization:?}: {reason}")]
    ShardsDiverged {
        materialization: String,
        reason: String,
    },
    /// Another shard of the group, or its reader, failed first: this shard stopped
    /// without committing its transaction in progress.
    #[error("stopped: {0}")]
    GroupStopped(String),
    /// A bug: a task that panicked, a reader that stopped without a reason.
    #[error("internal error: {0}")]
    Internal(String),
}

impl RunError {
    /// Whether reopening the loop may succeed, by the kind of the error underneath.
    /// Recovery-log (but a shared engine's that did not answer) and dead-letter
    /// failures are never retried in-process: after a
    /// failed fsync what the file holds is unknown (the page cache may have dropped the
    /// write), and a lock held elsewhere or a corrupt record stays so. A spill file that
    /// cannot be written is retried: the transaction's combiners are rebuilt from
    /// nothing, and the disk may have room again.
    pub fn is_retryable(&self) -> bool {
        match self {
            RunError::Driver { source, .. } => source.is_retryable(),
            RunError::Source(source) | RunError::SeekBack { source, .. } => source.is_retryable(),
            RunError::Combine(source) => matches!(**source, CombineError::Spill { .. }),
            // A shared engine's log (a cluster's) that did not answer: reopening reads
            // back what it holds, as after a crash.
            RunError::Recovery(RecoveryError::Unavailable { .. }) => true,
            RunError::Input { .. }
            | RunError::Document { .. }
            | RunError::DeadLetter { .. }
            | RunError::Loaded { .. }
            | RunError::StoreCheckpoint { .. }
            | RunError::StoreLost { .. }
            | RunError::OpenAfterCommits { .. }
            | RunError::Recovery(_)
            | RunError::IntentSource { .. }
            | RunError::UnitUnfinished { .. }
            | RunError::ShardsDiverged { .. }
            | RunError::GroupStopped(_)
            | RunError::Internal(_) => false,
        }
    }

    /// The source whose call (or dead-letter file) failed, if one did.
    pub fn source_name(&self) -> Option<&str> {
        match self {
            RunError::Source(source) | RunError::SeekBack { source, .. } => {
                Some(source.source_name())
            }
            RunError::DeadLetter { name, .. }
            | RunError::UnitUnfinished { name }
            | RunError::Input { name, .. } => Some(name),
            _ => None,
        }
    }

    /// The error's kind, as the metrics name it (a timeout apart from its system's
    /// other failures: it says the system is slow rather than broken).
    pub fn kind(&self) -> &'static str {
        match self {
            RunError::Input { .. } => "input",
            RunError::Document { .. } => "document",
            RunError::Combine(_) => "combine",
            RunError::Source(SourceError::Timeout { .. }) => "source_timeout",
            RunError::Source(_) => "source",
            RunError::SeekBack { .. } => "seek_back",
            RunError::DeadLetter { .. } => "dead_letter",
            RunError::Driver {
                source: DriverError::Timeout { .. },
                ..
            } => "driver_timeout",
            RunError::Driver { .. } => "driver",
            RunError::Loaded { .. } => "loaded",
            RunError::StoreCheckpoint { .. } => "store_checkpoint",
            RunError::StoreLost { .. } | RunError::OpenAfterCommits { .. } => "store_lost",
            RunError::Recovery(_) => "recovery",
            RunError::IntentSource { .. } => "intent_source",
            RunError::UnitUnfinished { .. } => "unit_unfinished",
            RunError::ShardsDiverged { .. } => "shards_diverged",
            RunError::GroupStopped(_) => "group_stopped",
            RunError::Internal(_) => "internal",
        }
    }
}

/// Where a driver timeout is configured, after its message.
fn timeout_hint(err: &DriverError) -> &'static str {
    match err {
        DriverError::Timeout { .. } => " (raise runtime.timeouts.driver if the store is only slow)",
        _ => "",
    }
}

impl From<CombineError> for RunError {
    fn from(err: CombineError) -> Self {
        RunError::Combine(Box::new(err))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use sluice_driver_sdk::Peer;
    use sluice_driver_sdk::machine::violation;
    use std::io::{Error as IoError, ErrorKind};
    use std::path::PathBuf;
    use std::time::Duration;

    fn source_io(kind: ErrorKind) -> SourceError {
        SourceError::Io {
            name: "views".into(),
            path: "views.jsonl".into(),
            error: IoError::new(kind, "test"),
        }
    }

    fn driver(source: DriverError) -> RunError {
        RunError::Driver {
            endpoint: "postgres".into(),
            source,
        }
    }

    /// Every kind of failure and whether the loop is reopened after it.
    #[test]
    fn only_transient_failures_reopen_the_loop() {
        let combine = |e: CombineError| RunError::Combine(Box::new(e));
        let cases = [
            // Transient: a retry may succeed.
            (
                driver(DriverError::Transport("connection reset".into())),
                true,
            ),
            (
                driver(DriverError::Timeout {
                    waiting_for: "DriverCommitted".into(),
                    after: Duration::from_secs(300),
                }),
                true,
            ),
            (driver(DriverError::store("committing", "lost", true)), true),
            (
                RunError::Source(source_io(ErrorKind::ConnectionReset)),
                true,
            ),
            (
                RunError::Source(SourceError::Timeout {
                    name: "views".into(),
                    call: "queue",
                    after: Duration::from_secs(60),
                }),
                true,
            ),
            (
                combine(CombineError::Spill {
                    dir: PathBuf::from("/tmp"),
                    source: IoError::new(ErrorKind::StorageFull, "full"),
                }),
                true,
            ),
            // Deterministic: the same failure again.
            (
                driver(DriverError::store("storing", "constraint", false)),
                false,
            ),
            (driver(DriverError::Malformed("not JSON".into())), false),
            (driver(DriverError::Config("no table".into())), false),
            (driver(DriverError::Fenced("newer instance".into())), false),
            (
                driver(DriverError::Protocol(violation(
                    Peer::Driver,
                    "Prepared",
                    "Opened",
                ))),
                false,
            ),
            (
                RunError::Loaded {
                    endpoint: "postgres".into(),
                    binding: 0,
                    resource: "pageviews".into(),
                    reason: "is not JSON".into(),
                },
                false,
            ),
            (RunError::Source(source_io(ErrorKind::NotFound)), false),
            (
                RunError::SeekBack {
                    store_txn: 6,
                    log_txn: 8,
                    source: SourceError::Unavailable {
                        name: "views".into(),
                        position: Value::from(10),
                        reason: "the file is shorter".into(),
                    },
                },
                false,
            ),
            (
                RunError::Input {
                    name: "views".into(),
                    position: "views.jsonl:3".into(),
                    reason: "too large".into(),
                },
                false,
            ),
            (
                RunError::Document {
                    position: "views.jsonl:3".into(),
                    source: Box::new(CombineError::Poisoned {
                        first: "sum of a string".into(),
                    }),
                },
                false,
            ),
            (
                combine(CombineError::Poisoned {
                    first: "sum of a string".into(),
                }),
                false,
            ),
            (
                RunError::DeadLetter {
                    name: "views".into(),
                    source: DeadLetterError::Io {
                        path: PathBuf::from("dead-letters.jsonl"),
                        error: IoError::new(ErrorKind::StorageFull, "full"),
                    },
                },
                false,
            ),
            (
                RunError::StoreCheckpoint {
                    endpoint: "postgres".into(),
                    source: RecoveryError::BadCheckpoint("truncated".into()),
                },
                false,
            ),
            (
                RunError::Recovery(RecoveryError::InUse {
                    dir: PathBuf::from("log"),
                    pid: Some(1),
                }),
                false,
            ),
            (
                RunError::IntentSource {
                    name: "views".into(),
                },
                false,
            ),
            (
                RunError::UnitUnfinished {
                    name: "views".into(),
                },
                false,
            ),
            (RunError::Internal("a task panicked".into()), false),
        ];
        for (err, retryable) in cases {
            assert_eq!(err.is_retryable(), retryable, "{err}");
        }
    }

    #[test]
    fn a_driver_timeout_names_the_endpoint_the_wait_and_the_setting() {
        let err = driver(DriverError::Timeout {
            waiting_for: "DriverCommitted (awaiting DriverCommitted of transaction 3)".into(),
            after: Duration::from_secs(2),
        });
        assert_eq!(
            err.to_string(),
            "driver postgres: timed out after 2s waiting for DriverCommitted (awaiting \
             DriverCommitted of transaction 3) (raise runtime.timeouts.driver if the store \
             is only slow)"
        );
    }
}
