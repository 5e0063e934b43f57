//! A deterministic document generator, for the quickstart, tests and benchmarks.
//!
//! Document `seq` (0, 1, 2, ...) is the pure function [`pageview`]`(seed, keys, seq)`:
//! no state but the sequence number, so the source resumes and replays by sequence
//! number (its position is a [`Span`] of sequence numbers; `end` is the next one), and
//! a test computes the expected reduction independently:
//!
//! ```
//! use sluice_runtime::source::datagen::pageview;
//! let (seed, keys, n) = (7, 10, 1000);
//! let mut views = std::collections::BTreeMap::<String, u64>::new();
//! for seq in 0..n {
//!     let doc = pageview(seed, keys, seq);
//!     *views.entry(doc.user_id().to_string()).or_default() += doc.views;
//! }
//! assert!(views.len() <= 10);
//! ```
//!
//! The `pageviews` shape (matching design.md's example collection):
//! `{user_id: "user-000042", views: 1..=10, bytes: 0..100000,
//!   last_seen: RFC 3339 (2024-01-01T00:00:00Z + seq seconds), tags: {browser: ...}}`.
//! The key is `mix(seed, seq) % keys`, so every key recurs about `n / keys` times.
//!
//! Each document is written straight as JSON text ([`Pageview::write_json`]), no
//! `Value` in between. The text is fixed, byte for byte (properties in sorted order, no
//! spaces: what `serde_json` wrote for these documents before), because a step's hash
//! covers it: a recovery log written by an older release replays against it.
//!
//! With `rate`, documents are released on schedule from the first `queue`: a `queue`
//! ahead of schedule returns zero records.

use super::{
    FaultTolerance, Position, QueueLimits, Records, Resume, Source, SourceError, Span, Step,
    StepHasher, check_replay, replay_target,
};
use crate::config::{DatagenDef, DatagenShape};
use serde_json::Value;
use std::fmt;
use std::io::Write as _;
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

/// One document of a `pageviews` generator, as its fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pageview {
    /// The number in `user_id` (see [`Pageview::user_id`]).
    pub key: u64,
    pub views: u64,
    pub bytes: u64,
    /// `last_seen` as seconds since the Unix epoch (see [`Pageview::last_seen`]).
    pub last_seen: i64,
    /// `tags.browser`.
    pub browser: &'static str,
}

/// Document `seq` of a `pageviews` generator.
pub fn pageview(seed: u64, keys: u64, seq: u64) -> Pageview {
    let h = mix(seed.wrapping_add(seq).wrapping_mul(31) ^ 0x5eed);
    Pageview {
        key: key_of(seed, keys, seq),
        views: 1 + (h % 10),
        bytes: (h >> 8) % 100_000,
        last_seen: EPOCH_2024 + seq as i64,
        browser: BROWSERS[(h >> 40) as usize % BROWSERS.len()],
    }
}

impl Pageview {
    /// Appends the document as JSON text, exactly as it has always been written (see
    /// the module docs).
    pub fn write_json(&self, out: &mut Vec<u8>) {
        write!(
            out,
            r#"{{"bytes":{},"last_seen":"{}","tags":{},"user_id":"{}","views":{}}}"#,
            self.bytes,
            self.last_seen(),
            self.tags(),
            self.user_id(),
            self.views
        )
        .expect("writing to a Vec does not fail");
    }

    /// `user_id`: `user-000042`.
    pub fn user_id(&self) -> impl fmt::Display {
        UserId(self.key)
    }

    /// `last_seen`: `2024-01-01T00:00:42Z`.
    pub fn last_seen(&self) -> impl fmt::Display {
        Rfc3339(self.last_seen)
    }

    /// `tags` as JSON text: `{"browser":"firefox"}`.
    pub fn tags(&self) -> impl fmt::Display {
        Tags(self.browser)
    }
}

struct UserId(u64);

impl fmt::Display for UserId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "user-{:06}", self.0)
    }
}

struct Tags(&'static str);

impl fmt::Display for Tags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Browser names need no JSON escaping.
        write!(f, r#"{{"browser":"{}"}}"#, self.0)
    }
}

/// `YYYY-MM-DDTHH:MM:SSZ` for seconds since the Unix epoch (days→civil date after
/// Howard Hinnant's `civil_from_days`).
struct Rfc3339(i64);

impl fmt::Display for Rfc3339 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = self.0;
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
        write!(
            f,
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
            rem / 3600,
            rem / 60 % 60,
            rem % 60
        )
    }
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
        })
    }

    /// Generates documents from `begin`, up to `count` of them and stopping once
    /// `max_bytes` is reached, into a step.
    fn step(&mut self, begin: u64, count: u64, max_bytes: u64, out: &mut Records) -> Step {
        let DatagenShape::Pageviews = self.def.shape;
        let mut hasher = StepHasher::new();
        let (mut end, mut bytes) = (begin, 0);
        while end - begin < count && bytes < max_bytes {
            let doc = pageview(self.def.seed, self.def.keys, end);
            let position = Position {
                source: self.label.clone(),
                line: end,
                byte_offset: 0,
            };
            let text = out.push_json_with(position, |out| doc.write_json(out));
            hasher.append(text);
            bytes += text.len() as u64;
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

    async fn replay(&mut self, step: &Resume, out: &mut Records) -> Result<Step, SourceError> {
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

    async fn queue(&mut self, limits: QueueLimits, out: &mut Records) -> Result<Step, SourceError> {
        let remaining = self
            .def
            .documents
            .map_or(u64::MAX, |n| n.saturating_sub(self.next));
        let count = remaining.min(limits.max_records as u64).min(self.due());
        Ok(self.step(self.next, count, limits.max_bytes, out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The documents as they were built before they were written as text: the
    /// reference their bytes (and so the step hashes of existing recovery logs) must
    /// match. Frozen: do not change it along with the generator.
    fn document_as_built_before(seed: u64, keys: u64, seq: u64) -> Value {
        let key = key_of(seed, keys, seq);
        let h = mix(seed.wrapping_add(seq).wrapping_mul(31) ^ 0x5eed);
        json!({
            "user_id": format!("user-{key:06}"),
            "views": 1 + (h % 10),
            "bytes": (h >> 8) % 100_000,
            "last_seen": Rfc3339(EPOCH_2024 + seq as i64).to_string(),
            "tags": {"browser": BROWSERS[(h >> 40) as usize % BROWSERS.len()]},
        })
    }

    #[test]
    fn documents_are_written_byte_for_byte_as_serde_json_wrote_them() {
        let mut text = Vec::new();
        for (seed, keys) in [(7, 100_000), (0, 1), (u64::MAX, 10_000_000)] {
            for seq in (0..20_000).chain([1 << 31, 1 << 40]) {
                text.clear();
                pageview(seed, keys, seq).write_json(&mut text);
                let before = serde_json::to_vec(&document_as_built_before(seed, keys, seq))
                    .expect("a document serializes");
                assert_eq!(
                    String::from_utf8_lossy(&text),
                    String::from_utf8_lossy(&before),
                    "seed {seed}, seq {seq}"
                );
            }
        }
    }
}
