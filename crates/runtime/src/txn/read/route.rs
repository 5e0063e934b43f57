//! Routing: which shard's part of a batch each record goes to, by its key hash: the one
//! its source read already when it set one (a Kafka source `partitioned_by:
//! key_range` reads it to check the record's partition, as `intake::shard_keys` reads
//! it here), else read from the text where `KeyScan` can, else from the parsed document
//! (or from the document an envelope carries). A step's records are routed in slices,
//! one per thread.

use super::super::BoundSource;
use crate::envelope::{Envelope, Unwrapped};
use crate::types::Binding;
use sluice_doc::keyscan::KeyScan;
use sluice_doc::parse::DocParser;
use sluice_doc::{KeyExtractor, KeyRange, key_hash};
use sluice_source_sdk::{Position, Records, SharedDoc, bad_json};
use std::sync::Arc;

/// Where each document goes: the shard of the group whose key range holds its key hash.
pub(super) struct Router {
    /// The shards' ranges, in key order, disjoint.
    ranges: Arc<[KeyRange]>,
    /// Per source (the run's order): how its documents' keys are read.
    keys: Vec<SourceKey>,
    key: Vec<u8>,
    unwrapped: Vec<u8>,
}

/// How a source's documents' keys are read: scanned from the text where `KeyScan` can,
/// else from the parsed document.
pub(super) struct SourceKey {
    scan: Option<KeyScan>,
    extractor: KeyExtractor,
    parser: DocParser,
}

/// Where a record goes.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Route {
    Part(usize),
    /// Its key is of no shard of the group.
    Outside,
}

impl Router {
    pub(super) fn new(
        ranges: Arc<[KeyRange]>,
        sources: &[BoundSource],
        bindings: &[Binding],
    ) -> Router {
        let keys = sources
            .iter()
            .map(|bound| {
                // Every binding of a source materializes its one target collection.
                let first = bound.bindings[0] as usize;
                let key = &bindings[first].collection.key;
                SourceKey {
                    scan: KeyScan::new(key.pointers()),
                    extractor: key.clone(),
                    parser: DocParser::default(),
                }
            })
            .collect();
        Router {
            ranges,
            keys,
            key: Vec::with_capacity(64),
            unwrapped: Vec::new(),
        }
    }

    /// The part a record of source `source` goes to, by the key hash its source set, if
    /// any. A record whose key cannot be read here (not JSON, no key, not its envelope)
    /// goes to the first part, whose combiner reports what is wrong with it, as a
    /// shard's own would.
    fn route(
        &mut self,
        source: usize,
        envelope: Envelope,
        doc: SharedDoc<'_>,
        key_hash: Option<u32>,
    ) -> Route {
        let hash = match key_hash {
            Some(hash) => hash,
            None => match self.read_key_hash(source, envelope, doc) {
                Some(hash) => hash,
                None => return Route::Part(0),
            },
        };
        let at = self.ranges.partition_point(|r| r.end < hash);
        match self.ranges.get(at) {
            Some(range) if range.begin <= hash => Route::Part(at),
            _ => Route::Outside,
        }
    }

    /// The key hash of a record of source `source`, read from its document; `None`
    /// when it has no key to read here.
    fn read_key_hash(
        &mut self,
        source: usize,
        envelope: Envelope,
        doc: SharedDoc<'_>,
    ) -> Option<u32> {
        self.key.clear();
        let keys = &mut self.keys[source];
        let keyed = match (envelope, doc) {
            (Envelope::None, SharedDoc::Json(text)) => keys.pack_text(text, &mut self.key),
            (Envelope::None, SharedDoc::Value(value)) => {
                keys.extractor.pack(value, &mut self.key).is_ok()
            }
            (envelope, doc) => {
                matches!(
                    unwrap_envelope(envelope, doc, &mut self.unwrapped),
                    Ok(true)
                ) && keys.pack_text(&self.unwrapped, &mut self.key)
            }
        };
        keyed.then(|| key_hash(&self.key))
    }
}

impl SourceKey {
    /// Appends the packed key of the document `text` holds to `out`; false when it has
    /// none to read.
    fn pack_text(&mut self, text: &[u8], out: &mut Vec<u8>) -> bool {
        if let Some(scan) = &self.scan
            && scan.pack(text, out)
        {
            return true;
        }
        out.clear();
        match self.parser.parse(text) {
            Ok(doc) => self.extractor.pack_doc(&doc, out).is_ok(),
            Err(_) => false,
        }
    }
}

/// A slice of a step's records, routed on one thread.
pub(super) struct Slice {
    pub(super) router: Router,
    /// The records' numbers in the step.
    pub(super) range: std::ops::Range<usize>,
    /// Per part: the numbers of the slice's records it takes, in order.
    pub(super) parts: Vec<Vec<usize>>,
    /// Records whose key no shard of the group owns, and their bytes.
    pub(super) outside: (u64, u64),
}

impl Slice {
    /// Routes the slice's records of source `source`, up to the one at `stop` (the
    /// step's first input error, which then fails it).
    pub(super) fn route(
        &mut self,
        records: &Records,
        source: usize,
        envelope: Envelope,
        stop: Stop,
    ) {
        for ordinal in self.range.clone() {
            let record = records.get(ordinal).expect("a record of the step");
            if past(record.position, stop) {
                break;
            }
            match (self.router).route(source, envelope, record.doc, record.key_hash) {
                Route::Part(part) => self.parts[part].push(ordinal),
                Route::Outside => {
                    self.outside.0 += 1;
                    self.outside.1 += record.bytes as u64;
                }
            }
        }
    }
}

/// Where a failing step's first input error stands (`line`, `byte_offset`): the records
/// after it are not combined.
pub(super) type Stop = Option<(u64, u64)>;

pub(super) fn past(position: &Position, stop: Stop) -> bool {
    stop.is_some_and(|stop| (position.line, position.byte_offset) > stop)
}

/// Writes the text of the document `doc` carries under `envelope` ([`crate::envelope`])
/// to `buf`; `false` for a record with nothing to apply; `Err` names why the record is
/// not such an envelope (the record is left as it was, for its dead letter).
pub(super) fn unwrap_envelope(
    envelope: Envelope,
    doc: SharedDoc<'_>,
    buf: &mut Vec<u8>,
) -> Result<bool, String> {
    let record = match doc {
        SharedDoc::Json(text) => serde_json::from_slice(text).map_err(|e| bad_json(text, &e))?,
        SharedDoc::Value(value) => value.clone(),
    };
    let unwrapped = (envelope.unwrap(record))
        .map_err(|reason| format!("envelope {}: {reason}", envelope.name()))?;
    match unwrapped {
        Unwrapped::Nothing => Ok(false),
        Unwrapped::Document(doc) => {
            buf.clear();
            serde_json::to_writer(&mut *buf, &doc).expect("a document serializes");
            Ok(true)
        }
    }
}
