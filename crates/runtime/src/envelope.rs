//! Change envelopes: records that wrap a document with what happened to it, unwrapped
//! into the document the collection holds, with `/_meta/op` saying the change (`c`
//! insert, `u` update, `d` deletion: a deletion needs only the key, see
//! `sluice_doc::combine`). Set per source with `envelope:`; every source kind's JSON
//! records can carry one (a file's lines, a Kafka message's value, a NATS message).
//!
//! ```text
//!  debezium       {"op": "c"|"r"|"u", "after": doc}      ─▶ doc + _meta.op c|u  (r, a snapshot read: c)
//!                 {"op": "d", "before": doc}              ─▶ doc + _meta.op d
//!                 {"payload": {…}, "schema": {…}}         ─▶ the payload, as above
//!                 null (Kafka's tombstone after a delete) ─▶ skipped
//!  insert_delete  {"insert": doc} / {"delete": doc}       ─▶ doc + _meta.op c / d
//!  none           doc                                     ─▶ doc (an upsert)
//! ```
//!
//! A record that is not such an envelope is bad input of its source, at its position,
//! with the reason (`on_error` decides as for any bad record).

use serde::Deserialize;
use serde_json::{Map, Value};

/// How a source's records wrap their documents.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Envelope {
    /// Each record is the document (an upsert).
    #[default]
    None,
    /// Debezium's change events: `op` c/r/u/d with `before`/`after`.
    Debezium,
    /// Feldera's `insert_delete` format: `{"insert": doc}` or `{"delete": doc}`.
    InsertDelete,
}

/// What one enveloped record holds.
#[derive(Debug, PartialEq)]
pub enum Unwrapped {
    /// The document, with its `_meta/op`.
    Document(Value),
    /// Nothing to apply (a Debezium tombstone, `null`, which follows a deletion).
    Nothing,
}

impl Envelope {
    /// Its name in the pipeline file.
    pub fn name(self) -> &'static str {
        match self {
            Envelope::None => "none",
            Envelope::Debezium => "debezium",
            Envelope::InsertDelete => "insert_delete",
        }
    }

    /// The document `record` carries; `Err` names what is wrong with the envelope.
    pub fn unwrap(self, record: Value) -> Result<Unwrapped, String> {
        match self {
            Envelope::None => Ok(Unwrapped::Document(record)),
            Envelope::Debezium => debezium(record),
            Envelope::InsertDelete => insert_delete(record),
        }
    }
}

fn debezium(record: Value) -> Result<Unwrapped, String> {
    let mut event = match record {
        Value::Null => return Ok(Unwrapped::Nothing),
        Value::Object(event) => event,
        other => {
            return Err(format!(
                "a Debezium event is an object, not {}",
                kind(&other)
            ));
        }
    };
    // The JSON converter with schemas enabled wraps the event.
    if !event.contains_key("op")
        && let Some(Value::Object(payload)) = event.remove("payload")
    {
        event = payload;
    }
    let op = match event.get("op") {
        Some(Value::String(op)) => op.clone(),
        Some(other) => return Err(format!("Debezium `op` is {}, not a string", kind(other))),
        None => return Err("a Debezium event has an `op` (c, r, u or d)".to_string()),
    };
    let (field, meta_op) = match op.as_str() {
        "c" | "r" => ("after", "c"),
        "u" => ("after", "u"),
        "d" => ("before", "d"),
        other => {
            return Err(format!(
                "Debezium `op` is {other:?}: expected c, r, u or d (a truncate `t` \
                 cannot be applied key by key)"
            ));
        }
    };
    match event.remove(field) {
        Some(Value::Object(doc)) => Ok(Unwrapped::Document(with_op(doc, meta_op))),
        Some(Value::Null) | None => Err(format!(
            "a Debezium {op:?} event needs `{field}`{}",
            if field == "before" {
                " with the key (set the table's REPLICA IDENTITY to include it)"
            } else {
                ""
            }
        )),
        Some(other) => Err(format!(
            "Debezium `{field}` is {}, not an object",
            kind(&other)
        )),
    }
}

fn insert_delete(record: Value) -> Result<Unwrapped, String> {
    let Value::Object(mut change) = record else {
        return Err(format!(
            "an insert_delete record is an object, not {}",
            kind(&record)
        ));
    };
    let (name, op) = match (change.contains_key("insert"), change.contains_key("delete")) {
        (true, false) => ("insert", "c"),
        (false, true) => ("delete", "d"),
        (true, true) => {
            return Err("an insert_delete record has `insert` or `delete`, not both".into());
        }
        (false, false) => return Err("an insert_delete record has `insert` or `delete`".into()),
    };
    if change.len() != 1 {
        let extra: Vec<&String> = change.keys().filter(|k| *k != name).collect();
        return Err(format!(
            "an insert_delete record has only `{name}`, not also {extra:?}"
        ));
    }
    match change.remove(name) {
        Some(Value::Object(doc)) => Ok(Unwrapped::Document(with_op(doc, op))),
        Some(other) => Err(format!("`{name}` is {}, not an object", kind(&other))),
        None => unreachable!("checked above"),
    }
}

/// `doc` with `/_meta/op` set (other `_meta` properties kept).
fn with_op(mut doc: Map<String, Value>, op: &str) -> Value {
    let meta = doc
        .entry("_meta")
        .or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    meta.as_object_mut()
        .expect("made an object above")
        .insert("op".to_string(), Value::String(op.to_string()));
    Value::Object(doc)
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn doc(envelope: Envelope, record: Value) -> Value {
        match envelope.unwrap(record).unwrap() {
            Unwrapped::Document(doc) => doc,
            Unwrapped::Nothing => panic!("nothing"),
        }
    }

    #[test]
    fn debezium_events_become_documents_with_their_op() {
        let e = Envelope::Debezium;
        let after = json!({"id": 1, "name": "a"});
        assert_eq!(
            doc(e, json!({"op": "c", "before": null, "after": after})),
            json!({"id": 1, "name": "a", "_meta": {"op": "c"}})
        );
        assert_eq!(
            doc(e, json!({"op": "r", "after": after})),
            json!({"id": 1, "name": "a", "_meta": {"op": "c"}})
        );
        assert_eq!(
            doc(e, json!({"op": "u", "before": {"id": 1}, "after": after})),
            json!({"id": 1, "name": "a", "_meta": {"op": "u"}})
        );
        assert_eq!(
            doc(e, json!({"op": "d", "before": {"id": 1}, "after": null})),
            json!({"id": 1, "_meta": {"op": "d"}})
        );
        assert_eq!(
            doc(
                e,
                json!({"schema": {}, "payload": {"op": "d", "before": {"id": 2}}})
            ),
            json!({"id": 2, "_meta": {"op": "d"}})
        );
        assert_eq!(e.unwrap(Value::Null), Ok(Unwrapped::Nothing));
    }

    #[test]
    fn insert_delete_records_become_documents_with_their_op() {
        let e = Envelope::InsertDelete;
        assert_eq!(
            doc(e, json!({"insert": {"id": 1, "_meta": {"uuid": "x"}}})),
            json!({"id": 1, "_meta": {"uuid": "x", "op": "c"}})
        );
        assert_eq!(
            doc(e, json!({"delete": {"id": 1}})),
            json!({"id": 1, "_meta": {"op": "d"}})
        );
        assert_eq!(doc(Envelope::None, json!({"id": 1})), json!({"id": 1}));
    }

    /// Each malformed envelope is refused with a reason that names what is missing.
    #[test]
    fn malformed_envelopes_say_what_is_wrong() {
        let cases = [
            (Envelope::Debezium, json!([1]), "is an object, not an array"),
            (Envelope::Debezium, json!({"after": {}}), "has an `op`"),
            (Envelope::Debezium, json!({"op": 1}), "`op` is a number"),
            (Envelope::Debezium, json!({"op": "t"}), "truncate"),
            (
                Envelope::Debezium,
                json!({"op": "d", "before": null}),
                "REPLICA IDENTITY",
            ),
            (Envelope::Debezium, json!({"op": "c"}), "needs `after`"),
            (
                Envelope::Debezium,
                json!({"op": "u", "after": 3}),
                "`after` is a number",
            ),
            (
                Envelope::InsertDelete,
                json!({"upsert": {}}),
                "has `insert` or `delete`",
            ),
            (
                Envelope::InsertDelete,
                json!({"insert": {}, "delete": {}}),
                "not both",
            ),
            (
                Envelope::InsertDelete,
                json!({"insert": {}, "x": 1}),
                "not also [\"x\"]",
            ),
            (
                Envelope::InsertDelete,
                json!({"delete": "k"}),
                "is a string",
            ),
            (
                Envelope::InsertDelete,
                json!(null),
                "is an object, not null",
            ),
        ];
        for (envelope, record, expected) in cases {
            let err = envelope.unwrap(record.clone()).unwrap_err();
            assert!(err.contains(expected), "{record}: {err}");
        }
    }
}
