//! Which partition a message goes to: Kafka's default partitioner for keyed messages,
//! `(murmur2(key) & 0x7fffffff) % partitions`, so that a key lands where a Java (or
//! librdkafka `murmur2_random`) producer would put it, and every run of the same key
//! against the same partition count picks the same partition (a replay resumes in the
//! partitions it wrote before).

/// The partition of `key` in a topic of `partitions` partitions (at least one).
pub fn partition_of(key: &[u8], partitions: usize) -> usize {
    (murmur2(key) & 0x7fff_ffff) as usize % partitions
}

/// Kafka's `Utils.murmur2`: MurmurHash2, 32 bits, seed `0x9747b28c`.
pub fn murmur2(data: &[u8]) -> u32 {
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h: u32 = 0x9747_b28c ^ data.len() as u32;
    let mut words = data.chunks_exact(4);
    for word in &mut words {
        let mut k = u32::from_le_bytes(word.try_into().expect("four bytes"));
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M) ^ k;
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        for (i, &byte) in rest.iter().enumerate() {
            h ^= u32::from(byte) << (8 * i);
        }
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^ (h >> 15)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn murmur2_is_kafkas() {
        // Kafka's UtilsTest.testMurmur2 (Java ints).
        let cases: [(&[u8], i32); 6] = [
            (b"21", -973932308),
            (b"foobar", -790332482),
            (b"a-little-bit-long-string", -985981536),
            (b"a-little-bit-longer-string", -1486304829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58897971,
            ),
            (b"abc", 479470107),
        ];
        for (data, expected) in cases {
            assert_eq!(murmur2(data) as i32, expected, "{:?}", data);
        }
    }

    #[test]
    fn a_key_always_picks_the_same_partition_within_the_count() {
        for partitions in [1, 3, 7] {
            for i in 0..200 {
                let key = format!("{{\"id\":{i}}}");
                let p = partition_of(key.as_bytes(), partitions);
                assert!(p < partitions);
                assert_eq!(p, partition_of(key.as_bytes(), partitions));
            }
        }
        assert_eq!(partition_of(b"", 5), partition_of(b"", 5));
        // Spread: 200 keys over 3 partitions leave none empty.
        let used: std::collections::BTreeSet<usize> = (0..200)
            .map(|i| partition_of(format!("k{i}").as_bytes(), 3))
            .collect();
        assert_eq!(used.len(), 3);
    }
}
