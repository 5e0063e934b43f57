//! Which partition a message goes to, by a binding's [`Partitioner`]:
//!
//! - `murmur2` (the default): Kafka's default partitioner for keyed messages,
//!   `(murmur2(key) & 0x7fffffff) % partitions`, so that a key lands where a Java (or
//!   librdkafka `murmur2_random`) producer would put it.
//! - `key_range`: partition `h·n >> 32` of `n` for the key hash `h` of the message's
//!   document (the runtime's, [`Message::key_hash`], hashed here from its packed key:
//!   only this partitioner needs it), the slices a Kafka source
//!   `partitioned_by: key_range` reads ([`sluice_kafka_client::key_range`]), so that a
//!   downstream cluster's shards each read only their part of the topic.
//!
//! Both are functions of the change alone: every run of the same change against the same
//! partition count picks the same partition (a replay resumes in the partitions it wrote
//! before).

use schemars::{Schema, SchemaGenerator, json_schema};
use serde::Deserialize;
use sluice_kafka_client::key_range::partition_of_hash;
use sluice_output_sdk::Message;

/// How a binding's messages are spread over its topic's partitions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Partitioner {
    /// Kafka's default: murmur2 of the message key.
    #[default]
    Murmur2,
    /// By the key hash of the message's document, as `partitioned_by: key_range` reads.
    KeyRange,
}

impl Partitioner {
    /// The partition of `message` in a topic of `partitions` partitions (at least one).
    pub fn partition(self, message: &Message<'_>, partitions: usize) -> usize {
        match self {
            Partitioner::Murmur2 => partition_of(message.key, partitions),
            Partitioner::KeyRange => {
                let partitions = u32::try_from(partitions).expect("a topic's i32 partition count");
                partition_of_hash(message.key_hash(), partitions) as usize
            }
        }
    }

    /// The schema of a resource's `partitioner`: a name, `murmur2` by default.
    pub(crate) fn schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"enum": ["murmur2", "key_range"], "default": "murmur2"})
    }
}

/// The partition of `key` in a topic of `partitions` partitions (at least one), by
/// Kafka's default partitioner.
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

    #[test]
    fn each_partitioner_reads_its_own_part_of_the_message() {
        let message = |key: &'static [u8], packed_key| Message {
            txn: 1,
            index: 0,
            packed_key,
            key,
            value: b"",
        };
        let packed: Vec<Vec<u8>> = (0..64)
            .map(|i| format!("packed {i}").into_bytes())
            .collect();
        // key_range: the slice of the packed key's hash, whatever the message key.
        for packed_key in &packed {
            let hash = sluice_doc::key_hash(packed_key);
            let p = Partitioner::KeyRange.partition(&message(b"k", packed_key), 4);
            assert_eq!(p, (hash >> 30) as usize, "hash {hash:#x}");
        }
        // murmur2: the key's, whatever the packed key.
        for packed_key in &packed {
            let p = Partitioner::Murmur2.partition(&message(b"abc", packed_key), 7);
            assert_eq!(p, partition_of(b"abc", 7));
        }
    }
}
