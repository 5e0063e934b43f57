//! The committer: one shard's side of each transaction, from the batch the reader hands
//! it to the acknowledgement (see the parent module's picture and invariants), and the
//! in-process driver's calls beside the protocol (`Beside`).

use super::progress::LivePhase;
use super::{
    Drains, RunError, Shared, Summary, binding_specs, combiner_options, driver_err,
    merge_driver_checkpoint, phases, read, state, stored,
};
use crate::metrics::{CombinerRole, Committed, Phase};
use crate::recovery::{Checkpoint, Intent, RecoveryLog};
use sluice_doc::combine::Combiner;
use sluice_driver_sdk::client::{self, Response};
use sluice_driver_sdk::error::within;
use sluice_driver_sdk::machine::violation;
use sluice_driver_sdk::{Error as DriverError, LogHooks, Peer};
use sluice_source_sdk::Resume;
use state::{LogState, Settled};
use std::sync::atomic::Ordering;
use std::time::Instant;
use tracing::Instrument;

/// An in-process driver's calls beside the protocol, each bounded by the driver timeout.
pub(super) struct Beside {
    /// `None` for a driver across the wire: it has no such calls.
    pub(super) hooks: Option<LogHooks>,
    pub(super) timeout: std::time::Duration,
}

impl Beside {
    /// Asks `call` of the driver (`what` names it if the timeout runs out); `None` when
    /// it has no such calls.
    async fn ask<'h, T, F>(
        &'h self,
        endpoint: &str,
        what: impl FnOnce() -> String,
        call: impl FnOnce(&'h LogHooks) -> F,
    ) -> Result<Option<T>, RunError>
    where
        F: std::future::Future<Output = Result<T, DriverError>> + 'h,
    {
        let Some(hooks) = &self.hooks else {
            return Ok(None);
        };
        let answer = within(self.timeout, what, call(hooks)).await;
        answer.map(Some).map_err(|e| driver_err(endpoint, e))
    }
}

/// The committer's side of one run: the stream, and what the last commit left.
pub(super) struct Committer {
    pub(super) endpoint: String,
    pub(super) materialization: String,
    /// In process: the driver's calls beside the protocol (artifact intents, decisions).
    pub(super) beside: Beside,
    pub(super) tx: client::ClientSender,
    pub(super) rx: client::ClientReceiver,
    /// The last committed checkpoint; during a transaction, the one it will commit.
    pub(super) checkpoint: Checkpoint,
    /// What the last committed transaction stored: the next one's loads of those keys.
    pub(super) previous: stored::StoredDocs,
    pub(super) shared: Shared,
    /// What it committed.
    pub(super) summary: Summary,
}

/// What one transaction moved, counted once it is committed.
struct Counts {
    docs: u64,
    bytes: u64,
    rejected: u64,
    loaded: u64,
    stored: u64,
}

impl Committer {
    /// Commits each batch the group sends as one transaction, until the last.
    pub(super) async fn commit_all(
        &mut self,
        mut batches: tokio::sync::mpsc::Receiver<read::ShardBatch>,
        log: RecoveryLog,
    ) -> Result<(), RunError> {
        let mut state = LogState::Settled(Settled::recovered(log));
        loop {
            self.shared.progress.enter(LivePhase::Reading);
            let batch = match batches.recv().await {
                Some(batch) => {
                    self.summary.idle += batch.tally.idle;
                    batch
                }
                None => {
                    // Join the log commit in flight: a restart must find the log's lock
                    // free and its last record written.
                    let _ = state.settle().await;
                    return Err(RunError::GroupStopped(
                        "the reader or another shard of this materialization failed".into(),
                    ));
                }
            };
            // The prior commit must be durable before it is acknowledged (and before a
            // new intent goes to the same log).
            let settled = state.settle().await?;
            crate::failpoint::fail_point!(AFTER_LOG_COMMIT, |e| driver_err(&self.endpoint, e));
            state = if !batch.transaction {
                // Acknowledge the prior commit now, so that idempotent-apply drivers apply
                // it without waiting for more input.
                let sent = matches!(settled, Settled::AckOwed(_)).then(Instant::now);
                let settled = settled
                    .acknowledge(&mut self.tx)
                    .await
                    .map_err(|e| driver_err(&self.endpoint, e))?;
                if batch.last {
                    return self.finish(sent).await;
                }
                LogState::Settled(settled)
            } else {
                // Every line of the transaction's work carries its number.
                let span = tracing::info_span!("txn", txn = self.checkpoint.txn + 1);
                self.transaction(batch, settled).instrument(span).await?
            };
            self.shared.in_flight.done();
        }
    }

    /// Commits one batch as transaction `checkpoint.txn + 1`, through every state of
    /// [`state`]: returns once the driver committed it, with its log commit in flight.
    async fn transaction(
        &mut self,
        batch: read::ShardBatch,
        log: Settled,
    ) -> Result<LogState, RunError> {
        let read::ShardBatch {
            combiner: c1,
            steps,
            transaction: _,
            docs,
            bytes,
            rejected,
            txn: numbered,
            last: _,
            tally,
        } = batch;
        // Intent: durable before any effect of this transaction reaches the driver.
        let txn = self.checkpoint.txn + 1;
        if numbered.is_some_and(|numbered| numbered != txn) {
            return Err(RunError::Internal(format!(
                "the reader numbered transaction {numbered:?}, but this shard's next is {txn}"
            )));
        }
        let mut intent = Intent {
            txn,
            steps,
            artifacts: Default::default(),
        };
        let what = || format!("the artifact intent of transaction {txn}");
        let asked = self
            .beside
            .ask(&self.endpoint, what, |h| h.artifact_intent(txn));
        if let Some(artifact) = asked.await?.flatten() {
            intent
                .artifacts
                .insert(self.materialization.clone(), artifact);
        }
        let log = log.write_intent(&intent).await?;
        self.shared.barrier.intent_durable(self.shared.index, txn);
        crate::failpoint::fail_point!(AFTER_INTENT, |e| driver_err(&self.endpoint, e));
        // Every shard's intent of this transaction is durable before any of them may
        // commit it, so the shards recover at most one transaction apart ([`group`]).
        // Waited for here, before this shard touches its store: a shard waiting while
        // it held the store's write lock (SQLite's is one per file) could wait on a
        // shard that waits for that lock to finish the transaction before.
        self.shared.barrier.all_durable(txn).await?;
        for (source, resumes) in &intent.steps {
            if let Some(position) = resumes.last().and_then(Resume::position) {
                self.checkpoint
                    .sources
                    .insert(source.clone(), position.clone());
            }
        }
        self.checkpoint.txn = txn;

        // Load phase: Acknowledge(T-1), Loads from C1 (drained into C2), Prepare.
        self.shared.progress.enter(LivePhase::Loading);
        let started = Instant::now();
        let metrics = self.shared.metrics.clone();
        metrics.combiner(CombinerRole::Read, &c1.stats());
        let ack_owed = log.ack() == state::Ack::Owed;
        let c2 = std::sync::Mutex::new(Combiner::new(
            binding_specs(&self.shared.bindings, Drains::IntoStores),
            combiner_options(&self.shared.opts, self.shared.key_range),
        ));
        let (acked_tx, acked_rx) = tokio::sync::oneshot::channel();
        let loads = phases::LoadPhase {
            c1,
            c2: &c2,
            previous: std::mem::replace(&mut self.previous, stored::StoredDocs::empty()),
            bindings: &self.shared.bindings,
            ack: log.ack(),
            checkpoint: &mut self.checkpoint,
        };
        // Either side failing ends the phase at once: waiting for the other could hang
        // (a receiver waits for a Prepared that a failed sender will never ask for).
        let both = tokio::try_join!(
            phases::send_loads(&mut self.tx, loads, acked_rx),
            phases::recv_loaded(&mut self.rx, acked_tx, &c2, &self.shared.bindings),
        );
        let (sent, prepared) = match both {
            Ok(sent_and_received) => sent_and_received,
            Err(err) => return Err(self.phase_error(err).await),
        };
        let prepared_at = Instant::now();
        crate::failpoint::fail_point!(AFTER_PREPARED, |e| driver_err(&self.endpoint, e));
        let to_store = match sent.delta_only {
            Some(c1) => c1,
            None => {
                let c2 = c2
                    .into_inner()
                    .expect("no reduction panicked in the load phase");
                metrics.combiner(CombinerRole::Load, &c2.stats());
                c2
            }
        };

        // Store phase.
        self.shared.progress.enter(LivePhase::Storing);
        let mut kept = stored::StoredDocsBuilder::new(to_store.stats().spilled_runs == 0);
        let stores =
            match phases::send_stores(&mut self.tx, to_store, &self.shared.bindings, &mut kept)
                .await
            {
                Ok(stores) => stores,
                Err(err) => return Err(self.phase_error(err).await),
            };
        let stored_at = Instant::now();
        self.shared.progress.enter(LivePhase::Committing);
        if let Err(err) = self.tx.commit().await {
            return Err(self.phase_error(phases::PhaseError::Driver(err)).await);
        }
        let committed = (self.rx.recv().await).map_err(|e| driver_err(&self.endpoint, e))?;
        // The driver's StartedCommit state: transactional, recorded with this commit.
        let committed_state = phases::state_update(&committed);
        match committed {
            Response::DriverCommitted(_) => {}
            // Not reached: the client's machine accepts only DriverCommitted here.
            other => {
                let violation = violation(Peer::Driver, "DriverCommitted", format!("{other:?}"));
                return Err(driver_err(&self.endpoint, violation.into()));
            }
        }
        let committed_at = Instant::now();
        let log = log.driver_committed();
        crate::failpoint::fail_point!(AFTER_DRIVER_COMMITTED, |e| driver_err(&self.endpoint, e));
        self.previous = kept.finish();
        let (loaded, stored) = (
            prepared.loaded.iter().sum::<u64>(),
            stores.docs.iter().sum::<u64>(),
        );
        tracing::debug!(
            docs,
            loaded,
            reused = sent.reused,
            stored,
            load_ms = (prepared_at - started).as_millis() as u64,
            store_ms = (stored_at - prepared_at).as_millis() as u64,
            commit_ms = (committed_at - stored_at).as_millis() as u64,
            "transaction committed"
        );
        self.count(Counts {
            docs,
            bytes,
            rejected,
            loaded,
            stored,
        });
        let durable = metrics.committed(Committed {
            txn,
            docs,
            bytes,
            sources: tally.sources,
            combined: tally.combined,
            loaded: prepared.loaded,
            stored: stores.docs,
            deleted: stores.deletions,
            phases: [
                (Phase::Read, tally.took),
                (Phase::Loads, sent.at - started),
                (Phase::Prepare, prepared_at - sent.at),
                (Phase::Store, stored_at - prepared_at),
                (Phase::Commit, committed_at - stored_at),
            ],
            // Sent first thing in the phase, when owed (else while the loop was idle).
            acknowledged: (prepared.acknowledged)
                .filter(|_| ack_owed)
                .map(|acknowledged| acknowledged - started),
            first_read: tally.first_read,
            positions: self.checkpoint.sources.clone(),
        });

        // Decision: record the commit durably, overlapping the next transaction's reads.
        // The driver's state updates in the order it sent them: the prior commit's
        // Acknowledged state, this transaction's Prepared, then its StartedCommit state.
        let updates = (prepared.acknowledged_state.iter())
            .chain([&prepared.driver_checkpoint])
            .chain(committed_state.iter());
        for update in updates {
            merge_driver_checkpoint(&mut self.checkpoint, &self.materialization, update)
                .map_err(|e| driver_err(&self.endpoint, e))?;
        }
        // A decision known only once the transaction was staged (an epoch sink's
        // descriptor): the commit record holds it.
        let what = || format!("the decision of transaction {txn}");
        let asked = self.beside.ask(&self.endpoint, what, |h| h.decision(txn));
        if let Some(decision) = asked.await?.flatten() {
            self.checkpoint
                .driver_checkpoints
                .insert(self.materialization.clone(), decision);
        }
        // What the driver reports of itself now that it committed (its memory, its own
        // metrics, its health): into the metrics and the status.
        let what = || format!("the report after transaction {txn}");
        let asked = self.beside.ask(&self.endpoint, what, LogHooks::report);
        if let Some(report) = asked.await? {
            metrics.reported(&report);
        }
        Ok(log.commit(
            self.checkpoint.clone(),
            self.shared.durable.clone(),
            durable,
        ))
    }

    /// Counts a committed transaction: counted once committed, so a restarted run never
    /// counts a document twice.
    fn count(&mut self, n: Counts) {
        let summary = &mut self.summary;
        summary.docs += n.docs;
        summary.rejected += n.rejected;
        summary.bytes += n.bytes;
        summary.loaded += n.loaded;
        summary.stored += n.stored;
        summary.transactions += 1;
        summary.last_txn = self.checkpoint.txn;
        let progress = &self.shared.progress;
        progress.docs.fetch_add(n.docs, Ordering::Relaxed);
        progress.bytes.fetch_add(n.bytes, Ordering::Relaxed);
        progress.transactions.fetch_add(1, Ordering::Relaxed);
        progress.stored.fetch_add(n.stored, Ordering::Relaxed);
    }

    /// Ends a run whose input is exhausted: the last Acknowledge was sent (just now, at
    /// `sent`, or while the loop idled); waits for the driver to confirm it, then closes
    /// the stream.
    async fn finish(&mut self, sent: Option<Instant>) -> Result<(), RunError> {
        phases::expect_acknowledged(&mut self.rx)
            .await
            .map_err(|e| driver_err(&self.endpoint, e))?;
        if let Some(sent) = sent {
            self.shared
                .metrics
                .observe(Phase::Acknowledge, sent.elapsed());
        }
        Ok(())
    }

    /// The error that ends a failed phase. A failed send usually means the driver ended
    /// the stream: its own reason, if it gives one promptly, says more.
    async fn phase_error(&mut self, err: phases::PhaseError) -> RunError {
        match err {
            phases::PhaseError::Combine(e) => e.into(),
            phases::PhaseError::Loaded { binding, reason } => RunError::Loaded {
                endpoint: self.endpoint.clone(),
                binding,
                resource: (self.shared.bindings.get(binding as usize))
                    .map_or_else(|| "no such binding".into(), |b| b.resource.clone()),
                reason,
            },
            phases::PhaseError::Driver(e) => driver_err(
                &self.endpoint,
                phases::receiver_error(&mut self.rx).await.unwrap_or(e),
            ),
        }
    }
}
