//! A materialization's generation: the identity of one run of its output from an empty
//! view, written on everything the output emits, so that a reset is never mistaken for
//! a continuation.
//!
//! ```text
//!  view.db created ─▶ generation G1 minted, kept in the view (meta)
//!  runs, crashes, restarts: G1 (a replay discards what the destination holds of G1)
//!  sluice apply --delete ─▶ view.db removed (documents, checkpoint, snapshots, G1)
//!  next run ─▶ view.db created ─▶ G2: the destination's G1 messages are not G2's tail;
//!             G2 writes every change from an empty view, transactions numbered anew
//! ```
//!
//! An id is 16 lowercase hex digits: 48 bits of the Unix time in milliseconds when it
//! was minted, then 16 random bits. A later generation therefore sorts after an earlier
//! one (while the clock does not go back), which is what lets a files reader list a
//! folder in name order; nothing in Sluice depends on that order, only on ids being
//! different.
//!
//! A view made by a release that wrote no generation keeps its lineage: it mints an id
//! for what it writes from now on, and [`Generation::adopts_unstamped`] says that
//! messages carrying no generation are its own (the older release wrote them from this
//! same view), so a replay across the upgrade still discards them.

use std::fmt;
use std::hash::{BuildHasher, RandomState};

/// A generation's id (displayed as 16 lowercase hex digits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GenerationId(u64);

impl GenerationId {
    /// A new id: the time now in milliseconds (48 bits), then 16 random bits.
    pub fn mint() -> GenerationId {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        // std's RandomState is keyed from the OS's randomness: no dependency for 16 bits.
        let random = RandomState::new().hash_one((now.as_nanos(), std::process::id()));
        let millis = (now.as_millis() as u64) & ((1 << 48) - 1);
        GenerationId(millis << 16 | (random & 0xffff))
    }

    /// Reads an id written by [`fmt::Display`]; the error says what is wrong.
    pub fn parse(text: &str) -> Result<GenerationId, String> {
        let hex = text.len() == 16 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        match hex {
            true => Ok(GenerationId(
                u64::from_str_radix(text, 16).expect("16 hex digits"),
            )),
            false => Err(format!(
                "generation {text:?} is not 16 lowercase hex digits"
            )),
        }
    }
}

impl fmt::Display for GenerationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// The generation an output writes, and which stamps found at a destination are its.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Generation {
    /// Written on every message, file and snapshot from now on.
    pub id: GenerationId,
    /// The view predates generations: what carries no generation was written from it.
    pub adopts_unstamped: bool,
}

impl Generation {
    /// Whether a message stamped `stamped` (`None`: with no generation) is this
    /// generation's: only then may it be the tail a replay discards up to. Another
    /// generation's message is never "already written", whatever its transaction.
    pub fn owns(&self, stamped: Option<GenerationId>) -> bool {
        match stamped {
            Some(id) => id == self.id,
            None => self.adopts_unstamped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_prints_as_16_hex_digits_and_parses_back() {
        let id = GenerationId::mint();
        let text = id.to_string();
        assert_eq!(text.len(), 16, "{text}");
        assert_eq!(GenerationId::parse(&text), Ok(id));
        for bad in [
            "",
            "0123",
            "0123456789ABCDEF",
            "0123456789abcdeg",
            "00000000000000000",
        ] {
            assert!(GenerationId::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_later_id_sorts_after_an_earlier_one_and_ids_differ() {
        let a = GenerationId::mint();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = GenerationId::mint();
        assert!(a < b && a.to_string() < b.to_string(), "{a} {b}");
    }

    #[test]
    fn only_its_own_stamps_belong_to_a_generation() {
        let (ours, theirs) = (GenerationId(7), GenerationId(8));
        let fresh = Generation {
            id: ours,
            adopts_unstamped: false,
        };
        assert!(fresh.owns(Some(ours)));
        assert!(!fresh.owns(Some(theirs)));
        assert!(
            !fresh.owns(None),
            "an older release's messages are a past run's"
        );
        let upgraded = Generation {
            adopts_unstamped: true,
            ..fresh
        };
        assert!(
            upgraded.owns(None),
            "written from this view by the older release"
        );
        assert!(!upgraded.owns(Some(theirs)));
    }
}
