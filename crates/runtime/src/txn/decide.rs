//! The reader's two decisions, as pure functions over plain facts: when a batch closes
//! ([`close_batch`]) and what bad input does to it ([`triage`]). The reader gathers the
//! facts and executes the returned decision; each function is tested by a table.
//!
//! Why a batch closes when it does (see also the reader, `read/`):
//!
//! ```text
//!  a source inside a unit it declared ─▶ ReadOn, or Wait (never closes there)
//!  full (max_docs / max_bytes), no source at a barrier ─────▶ Full
//!  every source exhausted (not following), or shutdown ─────▶ End { last: no work }
//!  a source's last step was a barrier ─▶ ReadOn, or Wait (never closes there)
//!  work ∧ committer idle ∧ no source backlogged ∧ ≥ min_duration ─▶ Early
//!  ≥ max_duration ∧ (work ∨ nothing progressed) ────────────▶ Timeout
//!  otherwise: progressed ─▶ ReadOn, nothing progressed ─▶ Wait (for a wake-up)
//! ```
//!
//! - A barrier step (`Resume::Barrier`) has no position to resume from, so no
//!   transaction ends right after one: the reader reads on (from the sources at a
//!   barrier only, once full) until that source's next step can be checkpointed. Only
//!   the end of input or shutdown closes such a batch; its source then resumes from its
//!   last position (at-least-once, which is what a barrier source offers).
//!
//! - A unit (a run of steps a source says belong together, `Step::unit_continues`:
//!   an upstream transaction) commits whole: the batch stays open past every bound
//!   and through a stop until the unit's last step, reading on from the sources inside
//!   a unit only once full (their combiners spill). A source that ends its input inside
//!   a unit fails the run; what it handed of the unit is not committed.
//!
//! - A backlogged source (its last step filled the limits it was given) fills
//!   transactions to their bounds: each commit costs about one store write per distinct
//!   key, so closing early there would only write the same hot keys again.
//! - An empty batch closes at `max_duration` only while nothing progresses (an idle
//!   follower): it lets the committer acknowledge the last commit.
//!
//! What bad input does, per source `on_error` ([`Fault`] × [`OnError`] → [`Triage`]):
//!
//! | fault         | `fail`      | `skip`   |
//! |---------------|-------------|----------|
//! | `Unreadable`  | `FailInput` | `Reject` |
//! | `NotJson`     | `FailInput` | `Reject` |
//! | `Invalid`     | `Fail`      | `Reject` |
//! | `Unreducible` | `Fail`      | `Rebuild`|
//! | `Other`       | `Fail`      | `Fail`   |
//!
//! `Other` is every combiner error no single document can be blamed for: spill I/O, a
//! poisoned combiner, a caller bug. Reductions the committer meets (against a loaded
//! document, or across spilled runs) never reach triage: they fail the transaction in
//! either mode.

use super::TxnOptions;
use crate::config::OnError;
use sluice_doc::combine::CombineError;
use std::time::Duration;

impl TxnOptions {
    /// Step data a transaction's intent may journal (sources that cannot re-read their
    /// input, `Resume::Replay` with data) in a log whose records are not bounded: a
    /// batch is full beyond it, keeping each intent far below a log file's largest
    /// record whatever `max_bytes` allows.
    pub const MAX_JOURNALED: u64 = 64 << 20;

    /// Whether a batch of `docs` documents and `bytes` bytes, whose intent journals
    /// `journaled` bytes of step data, has reached a size bound. Asked after every step:
    /// it is on the reading's hot path.
    #[inline]
    pub(super) fn full(&self, docs: u64, bytes: u64, journaled: u64) -> bool {
        docs >= self.max_docs || bytes >= self.max_bytes || journaled >= self.max_journaled
    }
}

/// What the reader knows at the end of a round over its sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RoundFacts {
    pub docs: u64,
    pub bytes: u64,
    /// Step data its intent journals.
    pub journaled: u64,
    /// The batch becomes a transaction: it has documents, rejections, or a step that
    /// advances its source's position without records (`Step::advances`).
    pub has_work: bool,
    /// Since the batch began.
    pub elapsed: Duration,
    /// Some source returned records or errors in this round.
    pub progressed: bool,
    /// Some source filled the limits it was given: more input is ready at once.
    pub backlogged: bool,
    /// Some source's last step was a barrier: no position to checkpoint it at yet.
    pub at_barrier: bool,
    /// Some source's last step ended inside a unit it declared
    /// (`Step::unit_continues`): nothing closes the batch before the unit ends.
    pub in_unit: bool,
    /// The committer has no batch: it waits for this one.
    pub committer_idle: bool,
    /// No more input will come: shutdown, or every source exhausted (not following).
    pub ending: bool,
}

/// What the reader does with its batch after a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Close {
    /// A size bound is reached: send it.
    Full,
    /// No more input: send it; `last` when it has no work (no batch follows).
    End { last: bool },
    /// The committer waits and the sources caught up: send it now (low latency).
    Early,
    /// `max_duration` passed: send it.
    Timeout,
    /// Keep it open and read another round at once.
    ReadOn,
    /// Keep it open; nothing progressed, so wait for a wake-up (a source, the
    /// committer, the deadline).
    Wait,
}

/// When a batch closes (see the module docs).
pub(super) fn close_batch(bounds: &TxnOptions, facts: &RoundFacts) -> Close {
    if facts.in_unit {
        // A unit commits whole: not at a size bound, not at a stop.
        if facts.progressed {
            Close::ReadOn
        } else {
            Close::Wait
        }
    } else if bounds.full(facts.docs, facts.bytes, facts.journaled) && !facts.at_barrier {
        Close::Full
    } else if facts.ending {
        Close::End {
            last: !facts.has_work,
        }
    } else if facts.at_barrier {
        if facts.progressed {
            Close::ReadOn
        } else {
            Close::Wait
        }
    } else if facts.has_work
        && facts.committer_idle
        && !facts.backlogged
        && facts.elapsed >= bounds.min_duration
    {
        Close::Early
    } else if facts.elapsed >= bounds.max_duration && (facts.has_work || !facts.progressed) {
        Close::Timeout
    } else if facts.progressed {
        Close::ReadOn
    } else {
        Close::Wait
    }
}

/// What is wrong with one record of a source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fault {
    /// The source could not read it (an input error of its step).
    Unreadable,
    /// Its text is not JSON.
    NotJson,
    /// The document fails its collection's schema, or has no key.
    Invalid,
    /// Reducing it into its batch failed: the combiner is poisoned.
    Unreducible,
    /// No single document is to blame (spill I/O, a poisoned combiner, a bug).
    Other,
}

impl Fault {
    /// The fault a combiner error reports about the document it was given.
    pub fn of(err: &CombineError) -> Fault {
        match err {
            CombineError::Parse { .. } => Fault::NotJson,
            CombineError::Invalid { .. } | CombineError::Key { .. } => Fault::Invalid,
            CombineError::Reduce { .. } => Fault::Unreducible,
            CombineError::UnknownBinding { .. }
            | CombineError::DuplicateLoad { .. }
            | CombineError::OutsideRange { .. }
            | CombineError::Spill { .. }
            | CombineError::CorruptSpill { .. }
            | CombineError::Poisoned { .. } => Fault::Other,
        }
    }
}

/// What the reader does with a bad record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Triage {
    /// Write it to the dead-letter file and go on without it.
    Reject,
    /// Remember it, and rebuild the batch rejecting it before it is combined.
    Rebuild,
    /// Fail the batch at the record's position, with the source's reason (user input).
    FailInput,
    /// Fail the batch with the combiner's error at the record's position.
    Fail,
}

/// Skip or fail (see the module docs' table).
pub(super) fn triage(fault: Fault, on_error: OnError) -> Triage {
    match (fault, on_error) {
        (Fault::Other, _) => Triage::Fail,
        (Fault::Unreadable | Fault::NotJson | Fault::Invalid, OnError::Skip) => Triage::Reject,
        (Fault::Unreducible, OnError::Skip) => Triage::Rebuild,
        (Fault::Unreadable | Fault::NotJson, OnError::Fail) => Triage::FailInput,
        (Fault::Invalid | Fault::Unreducible, OnError::Fail) => Triage::Fail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn bounds() -> TxnOptions {
        TxnOptions {
            max_docs: 100,
            max_bytes: 1000,
            max_duration: 50 * MS,
            min_duration: 10 * MS,
            memory_budget: 0,
            follow: false,
            max_journaled: MAX_JOURNALED,
        }
    }

    /// A small journal bound, as a log with bounded records sets it.
    const MAX_JOURNALED: u64 = 4096;

    /// A batch of 10 documents, 20 ms old, after a round that read some, with the
    /// committer busy and no backlog: nothing closes it yet.
    fn open_batch() -> RoundFacts {
        RoundFacts {
            docs: 10,
            bytes: 100,
            journaled: 0,
            has_work: true,
            elapsed: 20 * MS,
            progressed: true,
            backlogged: false,
            at_barrier: false,
            in_unit: false,
            committer_idle: false,
            ending: false,
        }
    }

    #[test]
    fn a_batch_closes_at_the_first_reason_that_holds() {
        let base = open_batch();
        let empty = RoundFacts {
            docs: 0,
            bytes: 0,
            has_work: false,
            ..base
        };
        #[rustfmt::skip]
        let table: &[(&str, RoundFacts, Close)] = &[
            ("committer busy, below every bound", base, Close::ReadOn),
            ("max_docs reached", RoundFacts { docs: 100, ..base }, Close::Full),
            ("max_bytes reached", RoundFacts { bytes: 1000, ..base }, Close::Full),
            ("journaled data at its cap", RoundFacts { journaled: MAX_JOURNALED, ..base }, Close::Full),
            ("journaled data below its cap", RoundFacts { journaled: MAX_JOURNALED - 1, ..base }, Close::ReadOn),
            ("full wins over ending", RoundFacts { docs: 100, ending: true, ..base }, Close::Full),
            ("full wins over a backlog", RoundFacts { docs: 100, backlogged: true, ..base }, Close::Full),
            ("end of input with work", RoundFacts { ending: true, ..base }, Close::End { last: false }),
            ("end of input without work", RoundFacts { ending: true, ..empty }, Close::End { last: true }),
            ("rejections alone are work", RoundFacts { has_work: true, ending: true, ..empty }, Close::End { last: false }),
            ("an advancing step alone is work", RoundFacts { has_work: true, committer_idle: true, ..empty }, Close::Early),
            ("an advancing step alone waits for a busy committer", RoundFacts { has_work: true, progressed: false, ..empty }, Close::Wait),
            ("committer idle, caught up", RoundFacts { committer_idle: true, ..base }, Close::Early),
            ("committer idle, before min_duration", RoundFacts { committer_idle: true, elapsed: 5 * MS, ..base }, Close::ReadOn),
            ("committer idle, at min_duration", RoundFacts { committer_idle: true, elapsed: 10 * MS, ..base }, Close::Early),
            ("committer idle, backlogged", RoundFacts { committer_idle: true, backlogged: true, ..base }, Close::ReadOn),
            ("committer idle, nothing to commit", RoundFacts { committer_idle: true, progressed: false, ..empty }, Close::Wait),
            ("max_duration with work", RoundFacts { elapsed: 50 * MS, ..base }, Close::Timeout),
            ("max_duration with work, backlogged", RoundFacts { elapsed: 50 * MS, backlogged: true, ..base }, Close::Timeout),
            ("max_duration, empty, idle sources", RoundFacts { elapsed: 50 * MS, progressed: false, ..empty }, Close::Timeout),
            ("max_duration, empty, sources still reading", RoundFacts { elapsed: 50 * MS, ..empty }, Close::ReadOn),
            ("nothing progressed, before max_duration", RoundFacts { progressed: false, ..base }, Close::Wait),
            ("a barrier holds a full batch open", RoundFacts { docs: 100, at_barrier: true, ..base }, Close::ReadOn),
            ("a barrier holds an early close", RoundFacts { committer_idle: true, at_barrier: true, ..base }, Close::ReadOn),
            ("a barrier holds past max_duration", RoundFacts { elapsed: 50 * MS, at_barrier: true, progressed: false, ..base }, Close::Wait),
            ("the end of input closes at a barrier", RoundFacts { ending: true, at_barrier: true, ..base }, Close::End { last: false }),
            ("a unit holds a full batch open", RoundFacts { docs: 100, in_unit: true, ..base }, Close::ReadOn),
            ("a unit holds past max_bytes and the journal bound", RoundFacts { bytes: 1 << 40, journaled: MAX_JOURNALED, in_unit: true, ..base }, Close::ReadOn),
            ("a unit holds an early close", RoundFacts { committer_idle: true, in_unit: true, ..base }, Close::ReadOn),
            ("a unit holds past max_duration", RoundFacts { elapsed: 50 * MS, in_unit: true, progressed: false, ..base }, Close::Wait),
            ("a unit holds at a stop", RoundFacts { ending: true, in_unit: true, ..base }, Close::ReadOn),
        ];
        for (case, facts, expected) in table {
            assert_eq!(close_batch(&bounds(), facts), *expected, "{case}");
        }
    }

    #[test]
    fn a_size_bound_is_reached_at_any_limit() {
        let b = bounds();
        for (docs, bytes, journaled, full) in [
            (0, 0, 0, false),
            (99, 999, MAX_JOURNALED - 1, false),
            (100, 0, 0, true),
            (0, 1000, 0, true),
            (0, 0, MAX_JOURNALED, true),
            (101, 1001, 0, true),
        ] {
            assert_eq!(
                b.full(docs, bytes, journaled),
                full,
                "{docs} docs, {bytes} bytes, {journaled} journaled"
            );
        }
    }

    #[test]
    fn bad_input_is_skipped_only_when_a_single_record_is_to_blame() {
        use Fault::*;
        use Triage::*;
        let table = [
            (Unreadable, OnError::Fail, FailInput),
            (Unreadable, OnError::Skip, Reject),
            (NotJson, OnError::Fail, FailInput),
            (NotJson, OnError::Skip, Reject),
            (Invalid, OnError::Fail, Fail),
            (Invalid, OnError::Skip, Reject),
            (Unreducible, OnError::Fail, Fail),
            (Unreducible, OnError::Skip, Rebuild),
            (Other, OnError::Fail, Fail),
            (Other, OnError::Skip, Fail),
        ];
        for (fault, on_error, expected) in table {
            assert_eq!(triage(fault, on_error), expected, "{fault:?} {on_error:?}");
        }
    }

    #[test]
    fn combiner_errors_name_their_fault() {
        let poisoned = CombineError::Poisoned {
            first: "earlier".into(),
        };
        let spill = CombineError::Spill {
            dir: "/tmp".into(),
            source: std::io::Error::other("full"),
        };
        let parse = CombineError::Parse {
            collection: "c".into(),
            source: serde_json::from_str::<serde_json::Value>("{").unwrap_err(),
        };
        let table = [
            (parse, Fault::NotJson),
            (poisoned, Fault::Other),
            (spill, Fault::Other),
            (
                CombineError::DuplicateLoad {
                    collection: "c".into(),
                    key: "k".into(),
                },
                Fault::Other,
            ),
            (
                CombineError::UnknownBinding {
                    binding: 3,
                    count: 1,
                },
                Fault::Other,
            ),
        ];
        for (err, fault) in table {
            assert_eq!(Fault::of(&err), fault, "{err}");
        }
    }
}
