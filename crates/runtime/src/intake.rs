//! The check a source is opened with ([`sluice_source_sdk::Intake`], `Opening::intake`):
//! whether the collection it feeds takes a document, checked where the document comes
//! in, so a push source can refuse it to its client rather than hand on a document that
//! fails the transaction (and so the pipeline) later.
//!
//! ```text
//!  text ─parse─▶ (envelope: unwrap) ─▶ Doc ─▶ Collection::check (schema, then key)
//! ```
//!
//! It is the reader's own check, in the reader's order and words: the text parses as
//! the combiner parses it (`serde_json::from_slice::<Doc>`, which `DocParser` matches
//! exactly), the source's envelope unwraps it as the reader does, and
//! [`Collection::check`] is the combiner's validation and key extraction. So a document
//! the check passes is never rejected by the reader as invalid or keyless, and one it
//! fails is rejected there with the same reason (dead-lettered under `on_error: skip`).
//!
//! [`shard_keys`] reads a record's key hash the same way, for a source that reads only
//! the partitions of its shards' key range (`Opening::shard_keys`): the key the reader
//! routes the record by, so a source's check of where a key belongs agrees with it.

use crate::config::{OnError, SourceDef};
use crate::envelope::{Envelope, Unwrapped};
use crate::types::Collection;
use sluice_doc::compact::Doc;
use sluice_doc::key_hash;
use sluice_doc::keyscan::KeyScan;
use sluice_source_sdk::{Intake, ShardKeys, bad_json};
use std::cell::RefCell;
use std::sync::Arc;

/// The intake check of source `def`, feeding `collection` (its target).
pub fn intake(def: &SourceDef, collection: Arc<Collection>) -> Intake {
    let envelope = def.envelope;
    Intake::new(def.on_error == OnError::Skip, move |text| {
        check_text(&collection, envelope, text)
    })
}

/// The key hashes `ranges` (`[begin, end]` each, in key order) of the shards a source
/// with `envelope` feeds `collection` to, with each record's key hash read as the
/// reader routes it: scanned from the text where `KeyScan` can, else from the parsed
/// document (the one its envelope carries).
pub fn shard_keys(
    envelope: Envelope,
    collection: Arc<Collection>,
    ranges: impl IntoIterator<Item = (u32, u32)>,
) -> ShardKeys {
    let scan = KeyScan::new(collection.key.pointers());
    ShardKeys::new(ranges, move |text| {
        PACKED_KEY.with_borrow_mut(|key| {
            key.clear();
            if envelope == Envelope::None
                && let Some(scan) = &scan
                && scan.pack(text, key)
            {
                return Some(key_hash(key));
            }
            let doc = document(envelope, text).ok()??;
            collection.key.pack_doc(&doc, key).ok()?;
            Some(key_hash(key))
        })
    })
}

thread_local! {
    /// The packed key of the record [`shard_keys`] reads the key hash of on this thread:
    /// it is read for every record of a partitioned source, so reused, not allocated.
    static PACKED_KEY: RefCell<Vec<u8>> = RefCell::new(Vec::with_capacity(64));
}

/// Why `collection` would not take the record `text` of a source with `envelope`.
fn check_text(collection: &Collection, envelope: Envelope, text: &[u8]) -> Result<(), String> {
    let Some(doc) = document(envelope, text)? else {
        return Ok(());
    };
    collection
        .check(&doc, &mut Vec::new())
        .map_err(|e| e.to_string())
}

/// The document the record `text` of a source with `envelope` carries (`None`: an
/// envelope with nothing to apply), parsed as the reader parses it.
fn document(envelope: Envelope, text: &[u8]) -> Result<Option<Doc>, String> {
    Ok(match envelope {
        Envelope::None => {
            Some(serde_json::from_slice::<Doc>(text).map_err(|e| bad_json(text, &e))?)
        }
        envelope => {
            let record = serde_json::from_slice(text).map_err(|e| bad_json(text, &e))?;
            let unwrapped = (envelope.unwrap(record))
                .map_err(|reason| format!("envelope {}: {reason}", envelope.name()))?;
            match unwrapped {
                Unwrapped::Nothing => None,
                Unwrapped::Document(doc) => Some(Doc::from(doc)),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn views() -> Collection {
        crate::projections::compile_collection(
            "collections.acme/views",
            "acme/views",
            &["/user_id".parse().unwrap()],
            &json!({
                "type": "object",
                "properties": {"user_id": {"type": "string"}, "views": {"type": "integer"}},
                "required": ["user_id"],
            }),
        )
        .unwrap()
    }

    #[test]
    fn the_check_is_the_combiners_with_its_reasons() {
        let views = views();
        let check = |envelope, text: &str| check_text(&views, envelope, text.as_bytes());
        assert_eq!(
            check(Envelope::None, r#"{"user_id": "u1", "views": 2}"#),
            Ok(())
        );
        let invalid = check(Envelope::None, r#"{"user_id": "u1", "views": "many"}"#).unwrap_err();
        assert!(
            invalid.starts_with(
                "collection acme/views: document with key [\"u1\"] is invalid: document is \
                 invalid at /views:"
            ) && invalid.contains("schema location #/properties/views/type"),
            "{invalid}"
        );
        let keyless = check(Envelope::None, r#"{"views": 2}"#).unwrap_err();
        assert!(keyless.contains("/user_id"), "{keyless}");
        // A deletion needs only its key.
        assert_eq!(
            check(
                Envelope::None,
                r#"{"user_id": "u1", "_meta": {"op": "d"}, "views": "x"}"#
            ),
            Ok(())
        );
        // Unwrapped first, as the reader does.
        assert_eq!(
            check(Envelope::InsertDelete, r#"{"insert": {"user_id": "u1"}}"#),
            Ok(())
        );
        let inner = check(Envelope::InsertDelete, r#"{"insert": {"views": 1}}"#).unwrap_err();
        assert!(inner.contains("/user_id"), "{inner}");
        let envelope = check(Envelope::InsertDelete, r#"{"user_id": "u1"}"#).unwrap_err();
        assert!(
            envelope.starts_with("envelope insert_delete:"),
            "{envelope}"
        );
        assert_eq!(check(Envelope::Debezium, "null"), Ok(()));
    }

    #[test]
    fn a_records_key_hash_is_the_one_the_reader_routes_it_by() {
        let keys = shard_keys(Envelope::None, Arc::new(views()), [(0, u32::MAX)]);
        let u1 = key_hash(&sluice_doc::tuple::pack_key(&[json!("u1")]));
        // Scanned from the text, and from the parsed document when the scan cannot.
        assert_eq!(keys.key_hash(br#"{"views": 1, "user_id": "u1"}"#), Some(u1));
        assert_eq!(keys.key_hash(br#"{"user_id": "u1", "views": 1}"#), Some(u1));
        assert_eq!(keys.key_hash(br#"{"views": 1}"#), None, "keyless");
        assert_eq!(keys.key_hash(b"{not json"), None);
        // The document an envelope carries.
        let wrapped = shard_keys(Envelope::InsertDelete, Arc::new(views()), [(0, u32::MAX)]);
        assert_eq!(
            wrapped.key_hash(br#"{"insert": {"user_id": "u1"}}"#),
            Some(u1)
        );
        assert_eq!(wrapped.key_hash(br#"{"user_id": "u1"}"#), None);
    }
}
