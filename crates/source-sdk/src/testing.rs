//! What the tests of every source share (feature `testing`): queue limits, and reading
//! a step's records back as documents or texts.

use crate::{QueueLimits, RecordDoc, Records, Source, Step};
use serde_json::Value;

/// No bound: a step takes everything ready.
pub const ALL: QueueLimits = QueueLimits {
    max_records: usize::MAX,
    max_bytes: u64::MAX,
};

/// At most `n` records, of any size.
pub fn records(n: usize) -> QueueLimits {
    QueueLimits {
        max_records: n,
        max_bytes: u64::MAX,
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
