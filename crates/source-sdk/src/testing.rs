//! What the tests of every source share (feature `testing`): queue limits, reading a
//! step's records back as documents or texts, and [`Scripted`], a source whose steps
//! resume as a script says (the runtime's tests of `Seek` and `Barrier` steps, and of
//! units that span steps).

use crate::{
    FaultTolerance, QueueLimits, Queued, RecordDoc, Records, Resume, Source, SourceError, Step,
};
use serde_json::Value;

/// No bound: a step takes everything ready.
pub const ALL: QueueLimits = QueueLimits {
    max_records: usize::MAX,
    max_bytes: u64::MAX,
    max_journaled: u64::MAX,
};

/// At most `n` records, of any size.
pub fn records(n: usize) -> QueueLimits {
    QueueLimits {
        max_records: n,
        max_bytes: u64::MAX,
        max_journaled: u64::MAX,
    }
}

/// Queues one step; returns its documents (JSON text parsed) and the step.
pub async fn queue(source: &mut dyn Source, limits: QueueLimits) -> (Vec<Value>, Step) {
    let mut out = Records::default();
    let step = source.queue(limits, &mut out).await.unwrap();
    assert_eq!(step.records, out.len());
    (parsed_docs(&mut out), step)
}

/// The records' documents, JSON text parsed.
pub fn parsed_docs(records: &mut Records) -> Vec<Value> {
    records
        .iter_mut()
        .map(|r| match r.doc {
            RecordDoc::Json(text) => serde_json::from_slice(text).expect("a generated document"),
            RecordDoc::Value(doc) => doc.clone(),
        })
        .collect()
}

/// The records' JSON texts (every record must be one).
pub fn texts(records: &mut Records) -> Vec<String> {
    records
        .iter_mut()
        .map(|r| match r.doc {
            RecordDoc::Json(text) => String::from_utf8_lossy(text).into_owned(),
            RecordDoc::Value(doc) => panic!("{doc} was parsed by its source"),
        })
        .collect()
}

/// The position a step resumes from (sources that resume by position).
pub fn position(step: &Step) -> &Value {
    step.resume
        .position()
        .expect("the source resumes by position")
}

/// How a [`Scripted`] source's steps resume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Script {
    /// Every step is `Seek`: it can be resumed after, never replayed (at-least-once).
    Seek,
    /// Of every `n` steps with records, all but the last are `Barrier`s: no position to
    /// resume from; the last is a `Seek`.
    BarrierEvery(usize),
    /// Resumes as the inner source's do (replayed by it), and every `n` steps with
    /// records form one unit: all but the last say the unit continues
    /// ([`Step::unit_continues`]).
    UnitsOf(usize),
}

/// A source read through another (`inner`, which resumes by position), its steps'
/// resumes rewritten by `script`: what a source that cannot replay hands the runtime,
/// or one that groups its steps into units.
pub struct Scripted {
    inner: Box<dyn Source>,
    script: Script,
    /// Steps with records queued so far.
    steps: usize,
}

impl Scripted {
    pub fn new(inner: Box<dyn Source>, script: Script) -> Scripted {
        Scripted {
            inner,
            script,
            steps: 0,
        }
    }
}

#[async_trait::async_trait]
impl Source for Scripted {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn fault_tolerance(&self) -> FaultTolerance {
        match self.script {
            Script::UnitsOf(_) => self.inner.fault_tolerance(),
            Script::Seek | Script::BarrierEvery(_) => FaultTolerance::AtLeastOnce,
        }
    }

    async fn seek(&mut self, position: &Value) -> Result<(), SourceError> {
        self.inner.seek(position).await
    }

    /// The inner source's replay for units; never asked otherwise by a runtime that
    /// keeps the contract: no step of this source is a `Replay`.
    async fn replay(&mut self, step: &Resume, out: &mut Records) -> Result<Step, SourceError> {
        if let Script::UnitsOf(_) = self.script {
            return self.inner.replay(step, out).await;
        }
        Err(SourceError::BadResume {
            name: self.inner.name().to_string(),
            action: "replay",
            resume: serde_json::to_value(step).expect("a resume serializes"),
            reason: "a scripted source never replays".into(),
        })
    }

    async fn queue(&mut self, limits: QueueLimits, out: &mut Records) -> Result<Step, SourceError> {
        let mut step = self.inner.queue(limits, out).await?;
        if step.records == 0 && step.errors.is_empty() {
            return Ok(step);
        }
        self.steps += 1;
        if let Script::UnitsOf(n) = self.script {
            // A source never ends its input inside a unit: the last step ends it.
            step.unit_continues = !step.end_of_input && !self.steps.is_multiple_of(n);
            return Ok(step);
        }
        let position = step.resume.position().cloned();
        step.resume = match (self.script, position) {
            (Script::BarrierEvery(n), _) if !self.steps.is_multiple_of(n) => Resume::Barrier,
            (_, Some(position)) => Resume::Seek { position },
            (_, None) => Resume::Barrier,
        };
        Ok(step)
    }

    async fn ready(&mut self) {
        self.inner.ready().await;
    }

    fn queued(&self) -> Queued {
        self.inner.queued()
    }

    fn extend(&mut self) {
        self.inner.extend();
    }

    fn pause(&mut self) {
        self.inner.pause();
    }

    fn committed(&mut self, txn: u64, position: &Value) {
        self.inner.committed(txn, position);
    }

    async fn disconnect(&mut self) {
        self.inner.disconnect().await;
    }
}
