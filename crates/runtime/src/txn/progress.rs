//! Live counters of a run, for the CLI's progress line: what is committed, what the
//! open transactions have read, the phase the committer is in, and how much input the
//! sources still have (their [`Lag`]), so a bounded run can show a bar and an ETA.
//!
//! Shared by every materialization of a run: with several, counts add up, the phase
//! is the one last entered and the input left is the last reported. Relaxed atomics:
//! a reader sees each value as of some recent moment, never a torn one.

use sluice_source_sdk::Lag;
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
    /// What the sources have left to read, summed per unit, as last reported.
    behind_bytes: AtomicU64,
    behind_messages: AtomicU64,
    /// Which units were reported: bit 0 bytes, bit 1 messages.
    behind_units: AtomicU8,
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
    /// know).
    pub fn behind(&self, lags: impl IntoIterator<Item = Option<Lag>>) {
        let (mut bytes, mut messages, mut units) = (0, 0, 0);
        for lag in lags {
            match lag {
                Some(Lag::Bytes(n)) => (bytes, units) = (bytes + n, units | 1),
                Some(Lag::Messages(n)) => (messages, units) = (messages + n, units | 2),
                // A source that cannot say makes the whole unknown.
                None => units |= 4,
            }
        }
        self.behind_bytes.store(bytes, Ordering::Relaxed);
        self.behind_messages.store(messages, Ordering::Relaxed);
        self.behind_units.store(units, Ordering::Relaxed);
    }

    /// The input left, when every source said in one unit.
    pub fn remaining(&self) -> Option<Remaining> {
        match self.behind_units.load(Ordering::Relaxed) {
            1 => Some(Remaining::Bytes(self.behind_bytes.load(Ordering::Relaxed))),
            2 => Some(Remaining::Messages(
                self.behind_messages.load(Ordering::Relaxed),
            )),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_input_left_is_known_only_when_every_source_counts_it_in_one_unit() {
        let progress = Progress::default();
        assert_eq!(progress.remaining(), None, "nothing reported yet");
        progress.behind([Some(Lag::Bytes(10)), Some(Lag::Bytes(5))]);
        assert_eq!(progress.remaining(), Some(Remaining::Bytes(15)));
        progress.behind([Some(Lag::Messages(3))]);
        assert_eq!(progress.remaining(), Some(Remaining::Messages(3)));
        progress.behind([Some(Lag::Messages(3)), Some(Lag::Bytes(1))]);
        assert_eq!(progress.remaining(), None, "units do not add up");
        progress.behind([Some(Lag::Messages(3)), None]);
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
