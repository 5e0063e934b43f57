//! When a shard splits itself (`cluster.autosplit`, pure): its holder tracks since when
//! the shard's lag (the largest of its sources', in their units) has stayed above
//! `lag_above`; once that has lasted `for`, it marks the shard for a split, the path
//! `sluice shards split` takes, while the materialization has room under `max_shards`.
//!
//! Only the holder decides about its shard, so its own clock is fair: no other member
//! takes part. A split replaces the shard by two new ones, whose lag must stay high for
//! `for` again: one split per shard per period. The marks of one materialization are
//! serialized in etcd (`P/autosplit/<mat>`, its revision a condition of each mark) and
//! counted with the shards still splitting, so concurrent holders never pass
//! `max_shards`. A singleton never splits.

use sluice_runtime::config::AutoSplit;
use std::time::Instant;

/// Since when the lag has stayed above the threshold, given the lag `behind` seen at
/// `now` and what was tracked `since`: `None` once it is at or below it (or unknown).
pub fn track(
    rule: &AutoSplit,
    behind: Option<u64>,
    since: Option<Instant>,
    now: Instant,
) -> Option<Instant> {
    match behind {
        Some(behind) if behind > rule.lag_above => Some(since.unwrap_or(now)),
        _ => None,
    }
}

/// Whether a lag high `since` has lasted long enough at `now`.
pub fn due(rule: &AutoSplit, since: Option<Instant>, now: Instant) -> bool {
    since.is_some_and(|since| now.duration_since(since) >= rule.sustained)
}

/// Whether one more split keeps `shards` (with `splitting` of them about to become two)
/// within `max_shards`.
pub fn room(rule: &AutoSplit, shards: usize, splitting: usize) -> bool {
    shards + splitting < rule.max_shards as usize
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_lag_that_stays_high_for_the_period_is_due_and_a_dip_starts_over() {
        let rule = AutoSplit {
            lag_above: 1000,
            sustained: Duration::from_secs(30),
            max_shards: 4,
        };
        let t0 = Instant::now();
        let at = |s| t0 + Duration::from_secs(s);
        let since = track(&rule, Some(5000), None, at(0));
        assert_eq!(since, Some(at(0)));
        let since = track(&rule, Some(3000), since, at(10));
        assert_eq!(since, Some(at(0)), "the first time it was high");
        assert!(!due(&rule, since, at(29)));
        assert!(due(&rule, since, at(30)));
        // At the threshold, or unknown: not high.
        assert_eq!(track(&rule, Some(1000), since, at(31)), None);
        assert_eq!(track(&rule, None, since, at(31)), None);
        assert!(!due(&rule, None, at(1000)));
        // Room: 4 at most, a shard splitting counts as its two halves.
        assert!(room(&rule, 3, 0));
        assert!(!room(&rule, 3, 1));
        assert!(!room(&rule, 4, 0));
    }
}
