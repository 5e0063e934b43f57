//! The committer's recovery log through a transaction's lifecycle, as a state machine
//! whose transitions consume the state they leave: holding a state is proof that what
//! it names has happened, so the loop cannot reorder the durability steps.
//!
//! ```text
//!  recovered ─▶ Settled::AckOwed ◀──────────────── settle() ◀── LogState::Committing(T)
//!                 │        │ acknowledge() (no input)                          ▲
//!                 │        ▼                                                   │ commit(checkpoint)
//!                 │    Settled::Acknowledged                                   │ (fsync on a blocking
//!                 │        │                                                   │  task; T+1 reads)
//!                 └────────┴── write_intent(T) ─▶ IntentDurable(T) ─▶ DriverCommitted(T)
//!                                                  Ack + Loads, Prepare,     DriverCommitted
//!                                                  Stores, Commit           received
//! ```
//!
//! What must hold, and which transition keeps it:
//! - The step intent of T is durable before any of T's effects reach the driver: the
//!   [`Ack`] a transaction's Loads phase needs comes only from [`IntentDurable`], which
//!   only [`Settled::write_intent`] makes, after the intent is fsync'ed.
//! - Nothing is acknowledged before the recovery log says it is durable: an Acknowledge
//!   is owed only by a [`Settled`] state, which a commit in flight becomes only through
//!   [`LogState::settle`], once its fsync has returned.
//! - Any error ends the stream: every transition that can fail drops the state, and with
//!   it the log, so the transaction in progress is never committed (the next run replays
//!   or resumes it from what the log and the store hold).
//! - T+1 reads while T's log commit fsyncs: [`DriverCommitted::commit`] returns at once,
//!   and the loop settles it only once the next batch is read.
//!
//! Threads: the log's writes (intent, commit) and their fsyncs run on tokio's blocking
//! pool, each owning the log until it returns it; the committer's async task only
//! awaits them, so no fsync blocks an async worker.

use crate::recovery::{Checkpoint, Intent, RecoveryError, RecoveryLog};
use crate::types::RunError;
use sluice_driver_sdk::Error as DriverError;
use sluice_driver_sdk::client::ClientSender;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The log between transactions.
pub(super) enum LogState {
    /// Nothing in flight (see [`Settled`]).
    Settled(Settled),
    /// T's commit record is being written and fsync'ed on a blocking task.
    Committing(JoinHandle<Result<RecoveryLog, RecoveryError>>),
}

/// The log with every record durable.
pub(super) enum Settled {
    /// The last commit (or the checkpoint recovered at open) is durable, and the driver
    /// was not yet told: the next Acknowledge is owed.
    AckOwed(RecoveryLog),
    /// ...and acknowledged: the committer idles until input arrives.
    Acknowledged(RecoveryLog),
}

/// Whether a transaction's Loads phase must first send the Acknowledge of the prior
/// commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ack {
    Owed,
    Sent,
}

/// T's step intent is durable: T's effects may now reach the driver.
pub(super) struct IntentDurable {
    log: RecoveryLog,
    ack: Ack,
}

/// The driver committed T (DriverCommitted received); the log has not recorded it yet.
pub(super) struct DriverCommitted {
    log: RecoveryLog,
}

impl LogState {
    /// Waits for a commit in flight. Returns only once every record is durable (the
    /// commit's fsync has returned): only then is an Acknowledge owed.
    pub async fn settle(self) -> Result<Settled, RunError> {
        match self {
            LogState::Settled(settled) => Ok(settled),
            LogState::Committing(task) => {
                let log = task
                    .await
                    .map_err(|e| RunError::Internal(e.to_string()))??;
                Ok(Settled::AckOwed(log))
            }
        }
    }
}

impl Settled {
    /// The log as opened: what it (or the store) holds is durable, and an opened stream
    /// begins with the Acknowledge of that checkpoint.
    pub fn recovered(log: RecoveryLog) -> Settled {
        Settled::AckOwed(log)
    }

    /// Sends the owed Acknowledge, if any (an idle committer, so that idempotent-apply
    /// drivers apply the last commit without waiting for more input).
    pub async fn acknowledge(self, tx: &mut ClientSender) -> Result<Settled, DriverError> {
        match self {
            Settled::AckOwed(log) => {
                tx.acknowledge().await?;
                Ok(Settled::Acknowledged(log))
            }
            acknowledged @ Settled::Acknowledged(_) => Ok(acknowledged),
        }
    }

    /// Journals T's intent, on a blocking task (fsync must not block an async worker).
    /// Returns only after it is fsync'ed.
    pub async fn write_intent(self, intent: &Intent) -> Result<IntentDurable, RunError> {
        let (mut log, ack) = match self {
            Settled::AckOwed(log) => (log, Ack::Owed),
            Settled::Acknowledged(log) => (log, Ack::Sent),
        };
        let intent = intent.clone();
        let log = crate::blocking::unblock(move || log.write_intent(&intent).map(|()| log)).await?;
        Ok(IntentDurable { log, ack })
    }
}

impl IntentDurable {
    /// Whether the Loads phase sends the prior commit's Acknowledge first.
    pub fn ack(&self) -> Ack {
        self.ack
    }

    /// The driver answered Commit with DriverCommitted.
    pub fn driver_committed(self) -> DriverCommitted {
        DriverCommitted { log: self.log }
    }
}

impl DriverCommitted {
    /// Starts recording `checkpoint` as committed, on a blocking task (fsync must not
    /// block an async worker), and returns at once: the next transaction reads
    /// meanwhile, and [`LogState::settle`] awaits it.
    /// `durable` is told the transaction's number the moment its fsync returns, so the
    /// sources that wait on it (a slot to confirm, clients to answer) need not wait for
    /// the next transaction to settle it; then `on_durable` is called with how long the
    /// write and its fsync took (the metrics).
    pub fn commit(
        self,
        checkpoint: Checkpoint,
        durable: Arc<watch::Sender<u64>>,
        on_durable: impl FnOnce(Duration) + Send + 'static,
    ) -> LogState {
        let mut log = self.log;
        LogState::Committing(crate::blocking::spawn(move || {
            let started = Instant::now();
            // Returns only after the commit record is fsync'ed.
            log.commit(&checkpoint)?;
            durable.send_replace(checkpoint.txn);
            on_durable(started.elapsed());
            Ok(log)
        }))
    }
}
