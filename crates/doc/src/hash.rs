//! The key hash that shard key ranges are defined over.
//!
//! `key_hash(packed) = HighwayHash-64(KEY, packed) >> 32`: the high 32 bits, as in Flow,
//! so a range `[key_begin, key_end]` covers the same documents in Sluice and in Flow.
//! The 32-byte key is Flow's fixed key, hex
//! `ba737e89155238d47d8067c35aad4d25ecdd1c3488227e011ffa480c022bd3ba`, read as four
//! little-endian u64 words in order (a unit test derives [`KEY`] from that hex).
//! The golden vectors of `shared/protocol.md` are tested in `tests/keys.rs`.

use highway::{HighwayHash, HighwayHasher, Key};

/// Flow's HighwayHash key, as four little-endian words of its published hex.
const KEY: [u64; 4] = [
    0xd438_5215_897e_73ba,
    0x254d_ad5a_c367_807d,
    0x017e_2288_341c_ddec,
    0xbad3_2b02_0c48_fa1f,
];

/// High 32 bits of HighwayHash-64 of `packed` with Flow's fixed key.
pub fn key_hash(packed: &[u8]) -> u32 {
    (HighwayHasher::new(Key(KEY)).hash64(packed) >> 32) as u32
}

/// A shard's range of key hashes, inclusive at both ends: the documents it owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyRange {
    pub begin: u32,
    pub end: u32,
}

impl KeyRange {
    /// Every key.
    pub const ALL: KeyRange = KeyRange {
        begin: 0,
        end: u32::MAX,
    };

    pub fn is_all(&self) -> bool {
        *self == KeyRange::ALL
    }

    /// Whether the key packed as `packed` hashes into this range (no hashing for
    /// [`KeyRange::ALL`]).
    pub fn owns(&self, packed: &[u8]) -> bool {
        self.is_all() || (self.begin..=self.end).contains(&key_hash(packed))
    }
}

impl Default for KeyRange {
    fn default() -> Self {
        KeyRange::ALL
    }
}

impl std::fmt::Display for KeyRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:08x}-{:08x}", self.begin, self.end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_words_are_the_published_hex_read_little_endian() {
        let hex = "ba737e89155238d47d8067c35aad4d25ecdd1c3488227e011ffa480c022bd3ba";
        let bytes: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        let words: Vec<u64> = bytes
            .chunks(8)
            .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(words, KEY);
    }
}
