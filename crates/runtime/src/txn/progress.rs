//! Live counters of a run, for the CLI's progress line: what is committed, what the
//! open transactions have read, the phase the committer is in, and how much input the
//! sources still have (their [`Lag`]), so a bounded run can show a bar and an ETA.
//!
//! Shared by every materialization of a run: with several, counts add up, the phase
//! is the one last entered and the input left is the last reported. Relaxed atomics:
//! a reader sees each value as of some recent moment, never a torn one.

use sluice_source_sdk::Lag;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct Progress {
    /// Documents, their bytes, transactions and stored documents committed.
    pub docs: AtomicU64,
    pub bytes: AtomicU64,
    pub transactions: AtomicU64,
    pub stored: AtomicU64,
    /// Documents (and their bytes) read into transactions, committed or not; a
    /// replay after a restart reads them again.
    pub read_docs: AtomicU64,
    pub read_bytes: AtomicU64,
    /// What the sources have left to read, as last reported (once a step).
    remaining: Mutex<Option<Remaining>>,
    phase: AtomicU8,
}

/// Where the committer of a materialization is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LivePhase {
    /// Opening the driver and recovering.
    Starting,
    /// Waiting for the reader to close a transaction.
    Reading,
    /// Acknowledge, Loads and Prepare.
    Loading,
    /// Sending the transaction's documents.
    Storing,
    /// Waiting for the driver's commit.
    Committing,
}

impl LivePhase {
    const ALL: [LivePhase; 5] = [
        LivePhase::Starting,
        LivePhase::Reading,
        LivePhase::Loading,
        LivePhase::Storing,
        LivePhase::Committing,
    ];

    pub fn label(self) -> &'static str {
        match self {
            LivePhase::Starting => "starting",
            LivePhase::Reading => "reading",
            LivePhase::Loading => "loading",
            LivePhase::Storing => "storing",
            LivePhase::Committing => "committing",
        }
    }
}

/// How much input is left, in the unit the sources count it in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Remaining {
    Bytes(u64),
    Messages(u64),
}

impl Progress {
    pub fn phase(&self) -> LivePhase {
        LivePhase::ALL[self.phase.load(Ordering::Relaxed) as usize]
    }

    pub fn enter(&self, phase: LivePhase) {
        self.phase.store(phase as u8, Ordering::Relaxed);
    }

    pub fn read(&self, docs: u64, bytes: u64) {
        self.read_docs.fetch_add(docs, Ordering::Relaxed);
        self.read_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Records what one reader's sources reported last (`None`: a source that does not
    /// know, which makes the whole unknown, as do sources counting in different units).
    pub fn behind<'a>(&self, lags: impl IntoIterator<Item = &'a Option<Lag>>) {
        let total = lags.into_iter().try_fold(None, |total, lag| {
            Some(Some(match (total, lag) {
                (None, Some(Lag::Bytes(n))) => Remaining::Bytes(*n),
                (None, Some(Lag::Messages(n))) => Remaining::Messages(*n),
                (Some(Remaining::Bytes(t)), Some(Lag::Bytes(n))) => Remaining::Bytes(t + n),
                (Some(Remaining::Messages(t)), Some(Lag::Messages(n))) => {
                    Remaining::Messages(t + n)
                }
                _ => return None,
            }))
        });
        *self.remaining.lock().expect("never poisoned") = total.flatten();
    }

    /// The input left, when every source said in one unit.
    pub fn remaining(&self) -> Option<Remaining> {
        *self.remaining.lock().expect("never poisoned")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_input_left_is_known_only_when_every_source_counts_it_in_one_unit() {
        let progress = Progress::default();
        assert_eq!(progress.remaining(), None, "nothing reported yet");
        progress.behind(&[Some(Lag::Bytes(10)), Some(Lag::Bytes(5))]);
        assert_eq!(progress.remaining(), Some(Remaining::Bytes(15)));
        progress.behind(&[Some(Lag::Messages(3))]);
        assert_eq!(progress.remaining(), Some(Remaining::Messages(3)));
        progress.behind(&[Some(Lag::Messages(3)), Some(Lag::Bytes(1))]);
        assert_eq!(progress.remaining(), None, "units do not add up");
        progress.behind(&[Some(Lag::Messages(3)), None]);
        assert_eq!(progress.remaining(), None, "a source that cannot say");
    }

    #[test]
    fn phases_read_back_as_entered() {
        let progress = Progress::default();
        assert_eq!(progress.phase(), LivePhase::Starting);
        for phase in LivePhase::ALL {
            progress.enter(phase);
            assert_eq!(progress.phase(), phase);
        }
    }
}
