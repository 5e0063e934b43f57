//! A deterministic document generator, for the quickstart, tests and benchmarks.
//!
//! Document `seq` (0, 1, 2, ...) is the pure function [`document`]`(seed, keys, seq)`:
//! no state but the sequence number, so the source resumes and replays by sequence
//! number (its position is a [`Span`] of sequence numbers; `end` is the next one), and
//! a test computes the expected reduction independently:
//!
//! ```
//! use sluice_runtime::source::datagen::document;
//! let (seed, keys, n) = (7, 10, 1000);
//! let mut views = std::collections::BTreeMap::<String, i64>::new();
//! for seq in 0..n {
//!     let doc = document(seed, keys, seq);
//!     *views.entry(doc["user_id"].as_str().unwrap().to_string()).or_default() +=
//!         doc["views"].as_i64().unwrap();
//! }
//! assert!(views.len() <= 10);
//! ```
//!
//! The `pageviews` shape (matching design.md's example collection):
//! `{user_id: "user-000042", views: 1..=10, bytes: 0..100000,
//!   last_seen: RFC 3339 (2024-01-01T00:00:00Z + seq seconds), tags: {browser: ...}}`.
//! The key is `mix(seed, seq) % keys`, so every key recurs about `n / keys` times.
//!
//! With `rate`, documents are released on schedule from the first `queue`: a `queue`
//! ahead of schedule returns zero records.

use super::{
    FaultTolerance, Position, QueueLimits, Record, Resume, Source, SourceError, Span, Step,
    StepHasher, check_replay, replay_target,
};
use crate::config::{DatagenDef, DatagenShape};
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Instant;

/// Seconds since the Unix epoch of 2024-01-01T00:00:00Z, the first `last_seen`.
const EPOCH_2024: i64 = 1_704_067_200;
const BROWSERS: [&str; 4] = ["firefox", "chrome", "safari", "edge"];

/// SplitMix64's finaliser: a well-mixed 64-bit function of its input.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The key (in `0..keys`) of document `seq`.
pub fn key_of(seed: u64, keys: u64, seq: u64) -> u64 {
    mix(seed ^ mix(seq)) % keys
}

/// Document `seq` of a `pageviews` generator.
pub fn document(seed: u64, keys: u64, seq: u64) -> Value {
    let key = key_of(seed, keys, seq);
    let h = mix(seed.wrapping_add(seq).wrapping_mul(31) ^ 0x5eed);
    json!({
        "user_id": format!("user-{key:06}"),
        "views": 1 + (h % 10),
        "bytes": (h >> 8) % 100_000,
        "last_seen": rfc3339(EPOCH_2024 + seq as i64),
        "tags": {"browser": BROWSERS[(h >> 40) as usize % BROWSERS.len()]},
    })
}

/// `YYYY-MM-DDTHH:MM:SSZ` for seconds since the Unix epoch (days→civil date after
/// Howard Hinnant's `civil_from_days`).
fn rfc3339(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

pub struct DatagenSource {
    name: String,
    /// `datagen <name>`, the source of every position.
    label: Arc<str>,
    def: DatagenDef,
    /// The next sequence number to generate.
    next: u64,
    /// Rate schedule: when the first document of this run was due, and its number.
    schedule: Option<(Instant, u64)>,
    buf: Vec<u8>,
}

impl DatagenSource {
    pub fn new(name: &str, def: &DatagenDef) -> Result<DatagenSource, SourceError> {
        if def.keys == 0 {
            return Err(SourceError::Config {
                name: name.to_string(),
                reason: "datagen needs at least one key".to_string(),
            });
        }
        Ok(DatagenSource {
            name: name.to_string(),
            label: format!("datagen {name}").into(),
            def: def.clone(),
            next: 0,
            schedule: None,
            buf: Vec::new(),
        })
    }

    /// Generates documents from `begin`, up to `count` of them and stopping once
    /// `max_bytes` is reached, into a step.
    fn step(&mut self, begin: u64, count: u64, max_bytes: u64, out: &mut Vec<Record>) -> Step {
        let DatagenShape::Pageviews = self.def.shape;
        let mut hasher = StepHasher::new();
        let (mut end, mut bytes) = (begin, 0);
        while end - begin < count && bytes < max_bytes {
            let doc = document(self.def.seed, self.def.keys, end);
            self.buf.clear();
            serde_json::to_writer(&mut self.buf, &doc).expect("a document serializes");
            hasher.append(&self.buf);
            bytes += self.buf.len() as u64;
            out.push(Record {
                doc,
                position: Position {
                    source: self.label.clone(),
                    line: end,
                    byte_offset: 0,
                },
                bytes: self.buf.len(),
            });
            end += 1;
        }
        self.next = end;
        Step {
            records: (end - begin) as usize,
            bytes,
            errors: Vec::new(),
            end_of_input: self.def.documents.is_some_and(|n| end >= n),
            resume: Span { begin, end }.replay(hasher.finish()),
        }
    }

    /// How many documents may be generated now under the rate limit.
    fn due(&mut self) -> u64 {
        let Some(rate) = self.def.rate else {
            return u64::MAX;
        };
        let (start, first) = *self.schedule.get_or_insert((Instant::now(), self.next));
        let due = first + (start.elapsed().as_secs_f64() * rate) as u64 + 1;
        due.saturating_sub(self.next)
    }
}

#[async_trait::async_trait]
impl Source for DatagenSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn fault_tolerance(&self) -> FaultTolerance {
        FaultTolerance::ExactlyOnce
    }

    async fn seek(&mut self, position: &Value) -> Result<(), SourceError> {
        self.next = Span::<u64>::from_value(&self.name, "seek to", position)?.end;
        self.schedule = None;
        Ok(())
    }

    async fn replay(&mut self, step: &Resume, out: &mut Vec<Record>) -> Result<Step, SourceError> {
        let span = replay_target::<u64>(&self.name, step)?;
        let first = out.len();
        let replayed = self.step(
            span.begin,
            span.end.saturating_sub(span.begin),
            u64::MAX,
            out,
        );
        if let Err(e) = check_replay(&self.name, step, replayed.resume.hash()) {
            out.truncate(first);
            return Err(e);
        }
        Ok(replayed)
    }

    async fn queue(
        &mut self,
        limits: QueueLimits,
        out: &mut Vec<Record>,
    ) -> Result<Step, SourceError> {
        let remaining = self
            .def
            .documents
            .map_or(u64::MAX, |n| n.saturating_sub(self.next));
        let count = remaining.min(limits.max_records as u64).min(self.due());
        Ok(self.step(self.next, count, limits.max_bytes, out))
    }
}
