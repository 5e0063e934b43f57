//! The key-range partitioner: partition `p` of `n` holds the keys whose key hash `h`
//! (the runtime's: the high 32 bits of HighwayHash-64 of the packed key) falls in the
//! `p`-th of `n` equal slices of the hash space, `h * n >> 32 == p`.
//!
//! ```text
//!  hash  0 ─────────── 2³²/n ─────────── 2·2³²/n ─── … ─── 2³²-1
//!        │ partition 0  │  partition 1   │   …   │ partition n-1 │
//!  shard [key_begin ─────────── key_end]  reads partitions 0 and 1 only
//! ```
//!
//! Kafka's default partitioner (murmur2 of the message key) spreads every key range over
//! every partition, so a shard of part of the key space would still have to read them
//! all. With this one, a shard reads only the partitions whose slices overlap its range
//! ([`overlapping`]). The producer (`sluice produce` for a source declaring
//! `partitioned_by: key_range`) and the source share these functions, so a slice means
//! the same on both sides. A shard range that
//! halves at its midpoint (a split) stays aligned with the slices when `n` is a power
//! of two times the shard count; any other range only reads one partition more at
//! each of its ends.

use std::ops::RangeInclusive;

/// The partition of key hash `hash` in a topic of `partitions` partitions (at least one).
pub fn partition_of_hash(hash: u32, partitions: u32) -> u32 {
    debug_assert!(partitions > 0, "a topic has a partition");
    ((u64::from(hash) * u64::from(partitions)) >> 32) as u32
}

/// The key hashes partition `partition` of `partitions` holds, inclusive at both ends:
/// from the first hash `h` with `h * n >> 32 == p`, `ceil(p * 2³² / n)`.
pub fn slice(partition: u32, partitions: u32) -> RangeInclusive<u32> {
    let first = |p: u64| (p << 32).div_ceil(u64::from(partitions));
    let begin = first(u64::from(partition));
    let end = first(u64::from(partition) + 1) - 1;
    begin as u32..=end as u32
}

/// The partitions of `partitions` whose slices overlap the key hashes `[begin, end]`.
pub fn overlapping(begin: u32, end: u32, partitions: u32) -> RangeInclusive<u32> {
    partition_of_hash(begin, partitions)..=partition_of_hash(end, partitions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_cover_every_hash_once_and_agree_with_partition_of_hash() {
        for n in [1, 2, 3, 5, 6, 7, 64, 1000] {
            let mut next = 0u64;
            for p in 0..n {
                let s = slice(p, n);
                assert_eq!(u64::from(*s.start()), next, "partition {p} of {n}");
                for h in [*s.start(), *s.end()] {
                    assert_eq!(partition_of_hash(h, n), p, "hash {h:#x} of {n}");
                }
                next = u64::from(*s.end()) + 1;
            }
            assert_eq!(next, 1 << 32, "{n} partitions end at the last hash");
        }
    }

    #[test]
    fn a_range_overlaps_the_partitions_holding_its_ends() {
        assert_eq!(overlapping(0, u32::MAX, 6), 0..=5);
        // Thirds of the hash space over 6 partitions: two each, no more.
        for (i, third) in [(0, slice(0, 3)), (1, slice(1, 3)), (2, slice(2, 3))] {
            assert_eq!(
                overlapping(*third.start(), *third.end(), 6),
                2 * i..=2 * i + 1
            );
        }
        // A split's halves over 4 partitions.
        assert_eq!(overlapping(0, 0x7fff_ffff, 4), 0..=1);
        assert_eq!(overlapping(0x8000_0000, u32::MAX, 4), 2..=3);
        // One hash past a slice's end reaches into the next partition.
        let first = slice(0, 3);
        assert_eq!(overlapping(0, *first.end() + 1, 3), 0..=1);
    }
}
