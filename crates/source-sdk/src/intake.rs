//! What the runtime tells a source about the documents its target collection takes, so
//! a source that answers whoever sent it its input (a push source answering its
//! client) can refuse a bad document there, instead of handing it on to fail the
//! transaction, and so the pipeline, later.
//!
//! ```text
//!  runtime: collection (schema, key) + source's envelope + on_error ──▶ Intake ──Opening::intake──▶ source
//!  source:  intake.check(text) per document before it accepts input
//!             Ok ─▶ accept · Err(reason) ─▶ refuse (on_error: fail) or hand on to be
//!                                             dead-lettered (on_error: skip)
//! ```
//!
//! The check is the one the reader's combiner makes (the text parses, its envelope
//! unwraps, it validates against the schema, it has its key), with the same reasons: a
//! document the check passes is never rejected by the combiner for being invalid or
//! keyless. With `on_error: skip` the source refuses nothing for a failing document:
//! the reader dead-letters it, as any skipping source's (the one dead-letter path);
//! the source only learns here that it will.

use std::fmt;
use std::sync::Arc;

/// Why a document's JSON text is not one the collection takes, if it is not.
type Check = dyn Fn(&[u8]) -> Result<(), String> + Send + Sync;

/// A check of one document's JSON text, and what the runtime does with one that fails
/// it (see the module docs). Cheap to clone.
#[derive(Clone)]
pub struct Intake {
    check: Arc<Check>,
    dead_letters: bool,
}

impl Intake {
    /// `check` says why a document's text is not one the collection takes;
    /// `dead_letters`: the source has `on_error: skip`, so the runtime dead-letters
    /// such a document rather than fail the transaction.
    pub fn new(
        dead_letters: bool,
        check: impl Fn(&[u8]) -> Result<(), String> + Send + Sync + 'static,
    ) -> Intake {
        Intake {
            check: Arc::new(check),
            dead_letters,
        }
    }

    /// Why the collection would not take the document `text`, if it would not.
    pub fn check(&self, text: &[u8]) -> Result<(), String> {
        (self.check)(text)
    }

    /// Whether a document failing [`Intake::check`] is dead-lettered by the runtime
    /// (`on_error: skip`); else it would fail the transaction holding it.
    pub fn dead_letters(&self) -> bool {
        self.dead_letters
    }
}

impl fmt::Debug for Intake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Intake")
            .field("dead_letters", &self.dead_letters)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_intake_runs_its_check_and_says_what_happens_to_a_failure() {
        let intake = Intake::new(true, |text| {
            (text.starts_with(b"{"))
                .then_some(())
                .ok_or("not an object".into())
        });
        assert_eq!(intake.check(b"{}"), Ok(()));
        assert_eq!(intake.check(b"1"), Err("not an object".to_string()));
        assert!(intake.clone().dead_letters());
        assert_eq!(format!("{intake:?}"), "Intake { dead_letters: true, .. }");
    }
}
