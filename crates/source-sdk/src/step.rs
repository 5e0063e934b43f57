//! Steps and how to get back to them: [`Resume`], the [`Span`] of a re-readable step,
//! and the stable [`StepHasher`] that a replay is checked against.

use crate::{FaultTolerance, InputError, SourceError};
use highway::{HighwayHash, HighwayHasher, Key};
use serde::{Deserialize, Serialize, de::DeserializeOwned};
use serde_json::Value;

/// How to get back to a step after a restart (see the module docs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Resume {
    Barrier,
    Seek {
        position: Value,
    },
    Replay {
        position: Value,
        /// The step's raw input, for sources that cannot re-read it (journaled in the
        /// intent; base64 in the log's JSON).
        #[serde(
            default,
            skip_serializing_if = "Option::is_none",
            with = "base64_bytes"
        )]
        data: Option<Vec<u8>>,
        hash: u64,
    },
}

impl Resume {
    /// The position that restarts the source just after this step, if any.
    pub fn position(&self) -> Option<&Value> {
        match self {
            Resume::Barrier => None,
            Resume::Seek { position } | Resume::Replay { position, .. } => Some(position),
        }
    }

    /// The step hash of a `Replay` resume; 0 for the others, which are never replayed.
    pub fn hash(&self) -> u64 {
        match self {
            Resume::Replay { hash, .. } => *hash,
            Resume::Barrier | Resume::Seek { .. } => 0,
        }
    }

    /// The strongest guarantee a step with this resume supports.
    pub fn fault_tolerance(&self) -> FaultTolerance {
        match self {
            Resume::Barrier | Resume::Seek { .. } => FaultTolerance::AtLeastOnce,
            Resume::Replay { .. } => FaultTolerance::ExactlyOnce,
        }
    }
}

/// The result of one `queue` or `replay`.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Records appended to `out` by this step.
    pub records: usize,
    /// Raw bytes consumed, including bad records.
    pub bytes: u64,
    pub errors: Vec<InputError>,
    /// The source has no more input, now or later.
    pub end_of_input: bool,
    /// A step with no records that still moves the source's position and must be
    /// checkpointed: the runtime commits it (as a transaction of its own when nothing
    /// else is read), so that [`Source::committed`](crate::Source::committed) hears of
    /// it. A replication slot's source says so when the server's WAL moved past its
    /// last transaction with nothing captured in between: the slot may then release
    /// that WAL. `false` for every other step: a step with neither records nor errors
    /// is dropped, and its position is not checkpointed.
    pub advances: bool,
    /// The step ends inside a *unit* of the source's input that the source's next
    /// step(s) continue: an upstream transaction too large for one step. The runtime
    /// commits a unit whole or not at all: no transaction ends after this step, past
    /// `max_docs` and `max_bytes` if need be (it then reads on from this source only,
    /// its combiners spilling to disk), and a stop waits for the unit's last step (the
    /// first with `false`). Each step of a unit keeps its own `resume`, so an
    /// interrupted transaction replays the whole unit; a crash before its intent reads
    /// it again whole from the last checkpoint, which never lies inside a unit. A source
    /// must not end its input (`end_of_input`) inside a unit. `false` for every step
    /// that is whole by itself, as most are.
    pub unit_continues: bool,
    pub resume: Resume,
}

/// Bounds on one `queue` call. A step stops at the first bound reached; a single
/// record larger than `max_bytes` (or `max_journaled`) still makes a step of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueLimits {
    pub max_records: usize,
    pub max_bytes: u64,
    /// The step data this step may journal in its resume (`Resume::Replay` with
    /// `data`, a source that cannot read its input again): the room its transaction's
    /// intent has left. A cluster's shard log in etcd bounds an intent (a quarter of its
    /// 1 MiB record); a local file log hardly does (64 MiB). A source that journals
    /// ends its step before its data passes this; `u64::MAX`: no bound.
    pub max_journaled: u64,
}

/// The position of a step of a source that re-reads its input by position (a file by
/// byte offset, a generator by sequence number): the cursors before and after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Span<C> {
    pub begin: C,
    pub end: C,
}

impl<C: Serialize + DeserializeOwned> Span<C> {
    pub fn to_value(&self) -> Value {
        serde_json::to_value(self).expect("a span serializes")
    }

    /// Reads a span back from a resume position this source kind produced.
    pub fn from_value(
        name: &str,
        action: &'static str,
        value: &Value,
    ) -> Result<Self, SourceError> {
        parse_resume(name, action, value)
    }

    /// The `Replay` resume of a re-readable source's step.
    pub fn replay(&self, hash: u64) -> Resume {
        Resume::Replay {
            position: self.to_value(),
            data: None,
            hash,
        }
    }
}

/// Reads back a resume position of type `P` that source `name` produced; fails with
/// [`SourceError::BadResume`] (it cannot `action` it) for one it did not.
pub fn parse_resume<P: DeserializeOwned>(
    name: &str,
    action: &'static str,
    value: &Value,
) -> Result<P, SourceError> {
    serde_json::from_value(value.clone())
        .map_err(|e| SourceError::bad_resume(name, action, value, e.to_string()))
}

/// The span a re-readable source re-reads to replay `step`; fails with
/// [`SourceError::BadResume`] for a resume it did not produce.
pub fn replay_target<C: Serialize + DeserializeOwned>(
    name: &str,
    step: &Resume,
) -> Result<Span<C>, SourceError> {
    match step {
        Resume::Replay {
            position,
            data: None,
            ..
        } => Span::from_value(name, "replay", position),
        other => Err(SourceError::bad_resume(
            name,
            "replay",
            &serde_json::to_value(other).expect("a resume serializes"),
            "this source only replays by position".to_string(),
        )),
    }
}

/// Fails with [`SourceError::ReplayMismatch`] unless a replayed step hashes as journaled.
pub fn check_replay(name: &str, step: &Resume, actual: u64) -> Result<(), SourceError> {
    match step {
        Resume::Replay { position, hash, .. } if *hash != actual => {
            Err(SourceError::ReplayMismatch {
                name: name.to_string(),
                position: position.clone(),
                expected: *hash,
                actual,
            })
        }
        _ => Ok(()),
    }
}

/// The stable 64-bit hash of a step's raw records: HighwayHash-64 with a fixed key, so
/// it is the same across processes, platforms and releases (unlike `DefaultHasher`).
#[derive(Clone)]
pub struct StepHasher(HighwayHasher);

impl StepHasher {
    /// "sluice step hash" spelled in ASCII over four words; any fixed key would do.
    const KEY: [u64; 4] = [
        0x736c_7569_6365_2073,
        0x7465_7020_6861_7368,
        0x0000_0000_0000_0001,
        0x0000_0000_0000_0002,
    ];

    pub fn new() -> StepHasher {
        StepHasher(HighwayHasher::new(Key(Self::KEY)))
    }

    pub fn append(&mut self, bytes: &[u8]) {
        self.0.append(bytes);
    }

    pub fn finish(self) -> u64 {
        self.0.finalize64()
    }
}

impl Default for StepHasher {
    fn default() -> Self {
        StepHasher::new()
    }
}

/// Journaled step data as one base64 string in the recovery log's JSON (a JSON array of
/// numbers would take about four bytes per byte).
mod base64_bytes {
    use base64::Engine as _;
    use base64::engine::general_purpose::STANDARD;
    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

    pub fn serialize<S: Serializer>(data: &Option<Vec<u8>>, s: S) -> Result<S::Ok, S::Error> {
        match data {
            Some(bytes) => s.serialize_str(&STANDARD.encode(bytes)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| STANDARD.decode(text).map_err(D::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Journaled data goes into the log as base64 and comes back byte for byte.
    #[test]
    fn journaled_data_round_trips_as_base64() {
        let resume = Resume::Replay {
            position: serde_json::json!({"seq": 3}),
            data: Some(b"{\"a\":1}\n\xff".to_vec()),
            hash: 7,
        };
        let text = serde_json::to_string(&resume).unwrap();
        assert!(text.contains("\"data\":\"eyJhIjoxfQr/\""), "{text}");
        assert_eq!(serde_json::from_str::<Resume>(&text).unwrap(), resume);
        let none = Resume::Replay {
            position: serde_json::json!(1),
            data: None,
            hash: 7,
        };
        let text = serde_json::to_string(&none).unwrap();
        assert!(!text.contains("data"), "{text}");
        assert_eq!(serde_json::from_str::<Resume>(&text).unwrap(), none);
    }
}
