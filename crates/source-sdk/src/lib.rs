//! The source SDK: what a source author implements, and what the runtime drives.
//!
//! A source is a reader driven by commands (after Feldera's input model), reporting per
//! step how to resume:
//!
//! ```text
//!  Kind::parse(config) ─▶ SourceConfig::open ─▶ seek(committed position)? ─▶ replay(journaled step)* ─▶ extend
//!                                                                                                       │
//!          ┌── ready (wake-up) ─▶ queue(limits, &mut Records) ◀──────────────────────────────────────┤
//!          │                        └──▶ Step { records, errors, end_of_input, resume } ──────────────┤
//!          └─ queued() above the source's read-ahead bounds ─▶ pause … below them ─▶ extend ─────────┘
//!                                                                            end of the run ─▶ disconnect
//! ```
//!
//! A step appends its documents to [`Records`], in order. A document is handed over as
//! the JSON text the source has (a JSON line, a generated document), unparsed: the
//! reader's combiner parses that text straight into its compact `Doc`
//! (`Combiner::combine_right_json`), so no `serde_json::Value` is built on the way. Only
//! a source that builds its documents itself (CSV rows) hands over `Value`s. The texts
//! of all records lie back to back in one buffer of the `Records`, so appending one
//! allocates nothing once the buffer has grown to a step's size; the reader clears it
//! after each step.
//!
//! A *step* is what one [`Source::queue`] call hands to the current transaction. Each
//! step says how to get back to it ([`Resume`]):
//!
//! - `Barrier`: nowhere; the runtime cannot checkpoint right after this step.
//! - `Seek { position }`: `position` restarts the source just after the step
//!   (at-least-once).
//! - `Replay { position, data, hash }`: as `Seek`, and the step itself can be re-read
//!   exactly: `position` (or `data`, for sources that cannot re-read their input)
//!   carries everything needed, and `hash` is the [`StepHasher`] hash of the step's raw
//!   records, checked on replay (exactly-once).
//!
//! A run of steps can form one *unit* (Feldera's source-driven transaction): a source
//! that knows its input's own transactions (a CDC transaction too large for one step)
//! marks every step but the unit's last with [`Step::unit_continues`], and the runtime
//! commits the unit whole, never splitting it across two of its transactions, past its
//! size bounds if need be.
//!
//! Invariants every source keeps:
//! - After `seek(p)` with `p` the position of a step's `Resume`, the next `queue`
//!   returns exactly the records that followed that step; a source that can no longer
//!   read from `p` fails the seek with [`SourceError::Unavailable`] rather than skip
//!   ahead.
//! - `replay(r)` returns the same records as the step that produced `r`, leaves the
//!   source positioned just after that step, and fails with
//!   [`SourceError::ReplayMismatch`] rather than return anything else.
//! - `queue` returns quickly: with zero records and `end_of_input == false` when there
//!   is nothing new yet (a followed file, a rate-limited generator ahead of schedule).
//! - Bad input the source itself finds (a CSV row that does not split, a record above
//!   the size limit) is reported in [`Step::errors`] and its record is not emitted. JSON
//!   text is not checked by the source: text that does not parse fails where it is
//!   parsed, in the combiner, and the reader reports it at the record's position as
//!   [`bad_json`] words it. Either way the runtime decides (`on_error`) whether that
//!   fails the transaction.
//!
//! Sources that re-read their input by position (the `file` and `datagen` crates) use
//! [`Span`]s: the step's `begin` and `end` cursors; `seek` restores `end`, `replay`
//! re-reads `begin..end` ([`replay_target`], [`check_replay`]).
//!
//! A source kind is registered with the runtime through [`SourceKind`] (its key in the
//! pipeline file, its configuration, how to open it): a new source is a crate that
//! implements it, plus one line in the binary's registry ([`kind`]).
//!
//! - [`records`]: the records of a step and where each came from.
//! - [`step`]: steps, resume positions, spans and the step hash.
//! - [`config`]: parsing a kind's configuration (errors that name their place, byte
//!   sizes, relative paths).
//! - [`kind`]: what a registered source kind provides.
//! - [`health`]: a part's health (healthy, unhealthy, fatal) and how a source tells it
//!   (a client backing off from a broker it cannot reach), for the status page and the
//!   metrics.
//! - [`intake`]: the check of a document against the collection a source feeds, for a
//!   source that refuses bad documents where they come in (a push source).
//! - [`prefetch`]: the read-ahead task of a source that reads from a network (a log,
//!   a broker): Extend, Pause and the wake-up, written once ([`ReadAhead`]: across the
//!   prefetches a source starts and drops).
//! - [`cdc`]: what the change-data-capture sources share: journaled backfill steps read
//!   in chunks, transactions read ahead and cut into steps, quiet steps.
//! - [`redact`]: secrets (URL passwords, tokens) out of messages and logs.
//! - `testing` (feature `testing`): what the tests of every source share.

pub use sluice_config as config;
/// TLS options and their rustls configurations ([`sluice_tls`]).
pub use sluice_tls as tls;
pub mod cdc;
pub mod health;
pub mod intake;
pub mod kind;
pub mod prefetch;
pub mod records;
pub mod redact;
pub mod step;
#[cfg(feature = "testing")]
pub mod testing;

pub use config::InvalidConfig;
pub use health::{Connection, Health, HealthState};
pub use intake::Intake;
pub use kind::{Kind, Opening, ShardKeys, SourceConfig, SourceKind, kind};
pub use prefetch::{Fetch, Prefetch, ReadAhead};
pub use records::{
    InputError, Position, Record, RecordDoc, Records, SharedDoc, SharedRecord, Unit, bad_json,
};
/// A source's own metrics ([`Source::metrics`]): the types every part reports in.
pub use sluice_report::{Metric, MetricKind};
pub use step::{
    QueueLimits, Resume, Span, Step, StepHasher, check_replay, parse_resume, replay_target,
};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::Duration;

/// What a source can promise after a crash, weakest first (so `<` compares strength).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultTolerance {
    /// Cannot resume: input read before a crash is lost or read again.
    None,
    /// Resumes after the last committed step; a step may be read again differently.
    AtLeastOnce,
    /// Every step can be replayed exactly, verified by its hash.
    ExactlyOnce,
}

#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    /// The external system (e.g. the file system) failed; retrying may help.
    #[error("source {name}: cannot read {path}: {error}")]
    Io {
        name: String,
        path: String,
        #[source]
        error: std::io::Error,
    },
    /// The input changed since the step was first read: exactly-once cannot hold.
    #[error(
        "source {name}: replayed step {position} differs from the one first read \
         (hash {actual:016x}, journaled {expected:016x}): the input changed since \
         it was read; restore it, or reset the pipeline's recovery log and store"
    )]
    ReplayMismatch {
        name: String,
        position: Value,
        expected: u64,
        actual: u64,
    },
    /// The input at a committed position is gone (a file cut shorter, a retention
    /// window passed): the source cannot resume there, and reading on would lose
    /// what lay in between.
    #[error("source {name}: cannot resume at {position}: {reason}")]
    Unavailable {
        name: String,
        position: Value,
        reason: String,
    },
    /// The position the source was sought to lies behind what the system it reads has
    /// already released (a replication slot confirmed past it): recovery adopted an
    /// older checkpoint (a store restored from a backup, a failover to an asynchronous
    /// replica), and the input in between is gone from the source. Reading on would
    /// skip it, so the source refuses; `reason` names both positions and what to do.
    #[error("source {name}: cannot seek back to {position}: {reason}")]
    SeekBack {
        name: String,
        position: Value,
        reason: String,
    },
    /// A resume the runtime handed over is not one this source produced.
    #[error("source {name}: cannot {action} {resume}: {reason}")]
    BadResume {
        name: String,
        action: &'static str,
        resume: Value,
        reason: String,
    },
    /// The source's definition cannot work (user error).
    #[error("source {name}: {reason}")]
    Config { name: String, reason: String },
    /// A call did not return within the runtime's `runtime.timeouts.source`: the
    /// external system hangs. Retryable, as a reopened source resumes where the last
    /// commit left it.
    #[error(
        "source {name}: timed out after {after:?} waiting for {call} (raise \
         runtime.timeouts.source if the source is only slow)"
    )]
    Timeout {
        name: String,
        call: &'static str,
        after: Duration,
    },
    /// A stop was asked for while the call waited (a broker not answering): the call
    /// was given up, and what it would have read is read by the next run.
    #[error("source {name}: {call} given up at a stop request")]
    Interrupted { name: String, call: &'static str },
}

impl SourceError {
    /// [`SourceError::BadResume`]: source `name` cannot `action` (`seek to`, `replay`)
    /// `resume`, as it is not one it produced.
    pub fn bad_resume(
        name: &str,
        action: &'static str,
        resume: &Value,
        reason: String,
    ) -> SourceError {
        SourceError::BadResume {
            name: name.to_string(),
            action,
            resume: resume.clone(),
            reason,
        }
    }

    /// The source whose error it is.
    pub fn source_name(&self) -> &str {
        match self {
            SourceError::Io { name, .. }
            | SourceError::ReplayMismatch { name, .. }
            | SourceError::Unavailable { name, .. }
            | SourceError::SeekBack { name, .. }
            | SourceError::BadResume { name, .. }
            | SourceError::Config { name, .. }
            | SourceError::Timeout { name, .. }
            | SourceError::Interrupted { name, .. } => name,
        }
    }

    /// Whether reopening the source and reading again may succeed: a timeout, or an I/O
    /// error that does not say the input is missing, forbidden or unreadable as it is.
    /// Changed input, a position the source can no longer read, a resume it did not
    /// produce and a bad definition fail the same way again.
    pub fn is_retryable(&self) -> bool {
        use std::io::ErrorKind;
        match self {
            SourceError::Io { error, .. } => !matches!(
                error.kind(),
                ErrorKind::NotFound
                    | ErrorKind::PermissionDenied
                    | ErrorKind::InvalidInput
                    | ErrorKind::InvalidData
                    | ErrorKind::Unsupported
            ),
            SourceError::Timeout { .. } => true,
            SourceError::ReplayMismatch { .. }
            | SourceError::Unavailable { .. }
            | SourceError::SeekBack { .. }
            | SourceError::BadResume { .. }
            | SourceError::Config { .. }
            | SourceError::Interrupted { .. } => false,
        }
    }
}

/// A reader driven by the runtime's commands (see the module docs).
#[async_trait::async_trait]
pub trait Source: Send {
    fn name(&self) -> &str;
    fn fault_tolerance(&self) -> FaultTolerance;
    /// Connects to what the source reads and confirms that it can be read: the file
    /// exists and opens, the broker answers and holds the topic, the server accepts the
    /// user and has what replication needs. Reads no record and creates nothing (no
    /// slot, no consumer, no publication), and is followed by no other command: `sluice
    /// check` asks it, and `sluice run` before it creates anything. A source with
    /// nothing to reach answers `Ok` (the default).
    async fn probe(&mut self) -> Result<(), SourceError> {
        Ok(())
    }
    /// Restores a committed position: the `position` of a step's [`Resume`].
    async fn seek(&mut self, position: &Value) -> Result<(), SourceError>;
    /// Told after [`seek`](Source::seek) when recovery adopted a checkpoint older than
    /// the recovery log's last commit (a store restored from a backup, a failover to a
    /// replica that lagged): `released` is this source's position in that last commit,
    /// whose input was already released upstream (confirmed, acknowledged, answered). A
    /// source that cannot read again what lies between the two refuses with
    /// [`SourceError::Unavailable`], naming the gap; one that re-reads by position has
    /// checked it in `seek` already (the default).
    async fn rewound(&mut self, released: &Value) -> Result<(), SourceError> {
        let _ = released;
        Ok(())
    }
    /// Re-reads exactly the step `step` describes and leaves the source after it.
    async fn replay(&mut self, step: &Resume, out: &mut Records) -> Result<Step, SourceError>;
    /// Reads the next step, within `limits`. A step that fills its limits says more input
    /// is ready at once (a backlog), and the runtime then fills the transaction to its
    /// bounds; a source returns less only when it has caught up, else transactions stay
    /// small while it is behind.
    async fn queue(&mut self, limits: QueueLimits, out: &mut Records) -> Result<Step, SourceError>;
    /// Returns when `queue` may have something new: at once when input is buffered, or
    /// the source failed or ended; otherwise when it is told of new input (a broker's
    /// message, a file-change notification). A source with no way to be told (the
    /// default) waits [`IDLE_POLL`]. The runtime waits on this, never on a timer, when
    /// it has nothing to do, so a trickle is read as it arrives. Cancel-safe: the runtime
    /// drops the wait when something else wakes it.
    async fn ready(&mut self) {
        tokio::time::sleep(IDLE_POLL).await;
    }
    /// What the source has read ahead and buffered, not yet queued; the runtime
    /// [pauses](Source::pause) it above its `max_queued_records` / `max_queued_bytes`.
    fn queued(&self) -> Queued {
        Queued::default()
    }
    /// Start or continue reading ahead (the runtime extends every source once it is
    /// positioned, and again when its buffer drained below the limits after a pause).
    fn extend(&mut self) {}
    /// Stop reading ahead, keeping the connection: the runtime's backpressure.
    fn pause(&mut self) {}
    /// The transaction `txn`, holding this source's steps up to the one whose resume
    /// position is `position`, is durable in the recovery log: it will never be read
    /// again from the source, only replayed from the log or skipped. Called after every
    /// commit holding steps of this source, in order, and once at start with the
    /// recovered checkpoint (where the source was [sought](Source::seek)). A source
    /// that holds input for the system it reads from releases it here and never
    /// earlier: a replication slot confirms its position, a push source answers the
    /// clients whose data that transaction holds. Cheap and non-blocking: it runs on
    /// the reader (hand slow work to a task of the source's own).
    fn committed(&mut self, txn: u64, position: &Value) {
        let _ = (txn, position);
    }
    /// How far the source is behind the input it reads, if it knows that cheaply (from
    /// what it already tracks: a file's size, a partition's high watermark); `None` by
    /// default. Sampled by the runtime after every step and after every
    /// [commit](Source::committed) it is told of, for the metrics and the progress line.
    /// A source that knows where its input ends may count what it read but is not yet
    /// committed as left too (datagen does): that is what a user reads as "left".
    fn lag(&self) -> Option<Lag> {
        None
    }
    /// Bytes of input the system it reads keeps for this source and has not yet let go
    /// (a replication slot's WAL from its restart point to the server's end), if it
    /// knows that cheaply; `None` by default. Sampled with [`lag`](Source::lag), for
    /// the metrics (`sluice_source_retained_bytes`) and the status page.
    fn retained(&self) -> Option<u64> {
        None
    }
    /// Bytes of memory the source holds (after Feldera's `memory()`): its read-ahead
    /// buffer, a client's own buffers if it knows them. Sampled with [`lag`](Source::lag)
    /// (at most once a second), for `sluice_source_memory_bytes` and the status page's
    /// "where memory goes". By default the bytes it has read ahead ([`queued`](Source::queued)):
    /// a source that buffers more than that says so ([`Prefetch::memory`]).
    fn memory(&self) -> u64 {
        self.queued().bytes
    }
    /// The source's own metrics (a broker's lag per partition, messages a consumer has
    /// pending), sampled with [`memory`](Source::memory) and exported as
    /// `sluice_source_custom{name, …}` (gauges) and `sluice_source_custom_counter_total{name, …}`
    /// (counters), labelled with the source; none by default. Names and label keys are
    /// snake_case and fixed in code; a label's values must stay few (partitions, not
    /// keys).
    fn metrics(&self) -> Vec<Metric> {
        Vec::new()
    }
    /// Release resources; no command follows.
    async fn disconnect(&mut self) {}
}

/// How far a source is behind its input, in the unit the input counts in
/// ([`Source::lag`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lag {
    /// Bytes not yet read: of a file, of the WAL a replication slot still has to send.
    Bytes(u64),
    /// Messages not yet read: offsets of a Kafka partition, sequences of a stream.
    Messages(u64),
}

/// How long a source with no way to be told of new input waits before it is asked
/// again ([`Source::ready`]).
pub const IDLE_POLL: Duration = Duration::from_millis(50);

/// What a source has buffered ahead of `queue` ([`Source::queued`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Queued {
    pub records: usize,
    pub bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::io::{Error, ErrorKind};

    fn io(kind: ErrorKind) -> SourceError {
        SourceError::Io {
            name: "views".into(),
            path: "views.jsonl".into(),
            error: Error::new(kind, "test"),
        }
    }

    /// Every kind, and whether a retry may help: decided here, where the error is born.
    #[test]
    fn only_transient_failures_are_retryable() {
        let cases = [
            (io(ErrorKind::ConnectionReset), true),
            (io(ErrorKind::Interrupted), true),
            (io(ErrorKind::Other), true),
            (io(ErrorKind::NotFound), false),
            (io(ErrorKind::PermissionDenied), false),
            (io(ErrorKind::InvalidData), false),
            (
                SourceError::Timeout {
                    name: "views".into(),
                    call: "queue",
                    after: Duration::from_secs(60),
                },
                true,
            ),
            (
                SourceError::ReplayMismatch {
                    name: "views".into(),
                    position: json!(1),
                    expected: 1,
                    actual: 2,
                },
                false,
            ),
            (
                SourceError::Unavailable {
                    name: "views".into(),
                    position: json!(1),
                    reason: "the file is shorter".into(),
                },
                false,
            ),
            (
                SourceError::SeekBack {
                    name: "views".into(),
                    position: json!("0/16B3748"),
                    reason: "the slot confirmed past it".into(),
                },
                false,
            ),
            (
                SourceError::BadResume {
                    name: "views".into(),
                    action: "seek",
                    resume: json!(null),
                    reason: "not a position".into(),
                },
                false,
            ),
            (
                SourceError::Config {
                    name: "views".into(),
                    reason: "no path".into(),
                },
                false,
            ),
        ];
        for (err, retryable) in cases {
            assert_eq!(err.is_retryable(), retryable, "{err}");
        }
    }
}
