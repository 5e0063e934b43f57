//! What one committed transaction records, in the one call the committer makes
//! ([`ShardMetrics::committed`]) once its driver committed it: the counters, the phase
//! timings, and, once its recovery-log commit is durable, the log commit's time, the
//! end-to-end latency and the status's last committed transaction. The loop hands over
//! plain facts ([`Committed`]); how they are counted and shown is decided here.

use super::status::{BindingCount, Counted, SourceCount, Transaction};
use super::{Phase, ShardMetrics};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A transaction its driver committed, as the loop measured it.
pub(crate) struct Committed {
    pub txn: u64,
    pub docs: u64,
    pub bytes: u64,
    /// Per source, in the loop's order.
    pub sources: Vec<SourceCount>,
    /// Per binding: documents combined, loaded, stored (deletions included) and deleted.
    pub combined: Vec<u64>,
    pub loaded: Vec<u64>,
    pub stored: Vec<u64>,
    pub deleted: Vec<u64>,
    /// How long each phase took, reading to DriverCommitted.
    pub phases: [(Phase, Duration); 5],
    /// How long the prior commit's Acknowledge took to be answered, when this
    /// transaction sent it.
    pub acknowledged: Option<Duration>,
    /// When its first document was read.
    pub first_read: Option<Instant>,
    /// The source positions it commits.
    pub positions: BTreeMap<String, Value>,
}

impl ShardMetrics {
    /// Records transaction `t` the driver committed: its counts and phases now; the
    /// returned callback, given how long the recovery-log commit took once it is
    /// durable, records the rest. Counted once committed, so a restarted run never
    /// counts a document twice.
    pub(crate) fn committed(
        self: &Arc<Self>,
        t: Committed,
    ) -> impl FnOnce(Duration) + Send + use<> {
        let counted = Counted {
            bindings: (0..t.combined.len())
                .map(|i| BindingCount {
                    combined: t.combined[i],
                    loaded: t.loaded[i],
                    stored: t.stored[i],
                    deleted: t.deleted[i],
                })
                .collect(),
            sources: t.sources,
        };
        self.transactions.inc();
        for (source, count) in self.sources.iter().zip(&counted.sources) {
            source.documents.inc_by(count.docs);
            source.bytes.inc_by(count.bytes);
            source.dead_lettered.inc_by(count.dead_lettered);
        }
        for (binding, count) in self.bindings.iter().zip(&counted.bindings) {
            binding.combined.inc_by(count.combined);
            binding.loaded.inc_by(count.loaded);
            binding.stored.inc_by(count.stored);
            binding.deleted.inc_by(count.deleted);
        }
        for (phase, took) in t.phases {
            self.observe(phase, took);
        }
        if let Some(acknowledged) = t.acknowledged {
            self.observe(Phase::Acknowledge, acknowledged);
        }
        let metrics = self.clone();
        let Committed {
            txn,
            docs,
            bytes,
            phases,
            first_read,
            positions,
            ..
        } = t;
        move |took| {
            metrics.observe(Phase::LogCommit, took);
            let end_to_end = first_read.map(|first_read| first_read.elapsed());
            if let Some(end_to_end) = end_to_end {
                metrics.end_to_end(end_to_end);
            }
            let phases = phases.into_iter().chain([(Phase::LogCommit, took)]);
            let committed = Transaction::durable(
                txn,
                (docs, bytes),
                phases.map(|(phase, took)| (phase.label(), took)),
                end_to_end,
                positions,
            );
            metrics.status.committed(committed, counted);
        }
    }
}
