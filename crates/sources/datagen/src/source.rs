//! The datagen [`Source`]: documents by sequence number, resumed and replayed by it.
//!
//! Document `seq` is the pure [`pageview`]`(seed, keys, seq)`, so the source keeps no
//! state but the next sequence number: its position is a [`Span`] of sequence numbers
//! (`end` is the next one), `seek` restores `end` and `replay` regenerates
//! `begin..end`, checked against the journaled hash (the text is fixed byte for byte:
//! see [`crate::pageview`]).
//!
//! With `rate`, documents are released on schedule from the first `queue`: a `queue`
//! ahead of schedule returns zero records.
//!
//! Its [`lag`](Source::lag) is what is left to commit, not only to generate: the
//! generator runs up to a transaction or two ahead of the committer (1.8M generated
//! with 1.2M of 3M committed), and that read-ahead is not done until it is committed
//! (a crash regenerates it). So the source keeps the last committed sequence number
//! beside the next one to generate.

use crate::config::{DatagenConfig, DatagenShape};
use crate::pageview::pageview;
use serde_json::Value;
use sluice_source_sdk::{
    FaultTolerance, Lag, Position, QueueLimits, Records, Resume, Source, SourceError, Span, Step,
    StepHasher, Unit, check_replay, replay_target,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct DatagenSource {
    name: String,
    /// `datagen <name>`, the source of every position.
    label: Arc<str>,
    def: DatagenConfig,
    /// The next sequence number to generate.
    next: u64,
    /// The first sequence number not yet committed: the end of the last step of a
    /// durable transaction (or of the checkpoint sought).
    committed: u64,
    /// Rate schedule: when the first document of this run was due, and its number.
    schedule: Option<(Instant, u64)>,
}

impl DatagenSource {
    pub fn new(name: &str, def: &DatagenConfig) -> Result<DatagenSource, SourceError> {
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
            committed: 0,
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
                unit: Unit::Line,
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
            advances: false,
            unit_continues: false,
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
        self.committed = self.next;
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

    /// `position` ends the last committed step: what comes after it is left.
    fn committed(&mut self, _txn: u64, position: &Value) {
        if let Ok(span) = Span::<u64>::from_value(&self.name, "commit", position) {
            self.committed = self.committed.max(span.end);
        }
    }

    /// The documents not yet committed, when their number is bounded: those still to
    /// generate and those generated into transactions not yet durable.
    fn lag(&self) -> Option<Lag> {
        let documents = self.def.documents?;
        Some(Lag::Messages(documents.saturating_sub(self.committed)))
    }

    /// With a rate: sleeps until the next document is due (at once if one is); without
    /// one, a document is always ready. A finite generator at its end has none to come.
    async fn ready(&mut self) {
        if self.def.documents.is_some_and(|n| self.next >= n) {
            std::future::pending::<()>().await;
        }
        let Some(rate) = self.def.rate else {
            return;
        };
        if self.due() > 0 {
            return;
        }
        let (start, first) = self.schedule.expect("due() set the schedule");
        let next_due = Duration::from_secs_f64((self.next - first) as f64 / rate);
        tokio::time::sleep_until((start + next_due).into()).await;
    }
}
