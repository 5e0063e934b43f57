//! The JSON formats: Feldera's `insert_delete` and the Debezium envelope, one JSON
//! object per message, each ending with a newline.

use super::{Buffer, Encoder, Fields, write_json};
use crate::Result;
use crate::change::{Change, Op};
use serde_json::Value;

/// `{"insert": doc}` / `{"delete": doc}`; an update is a delete then an insert.
pub struct InsertDelete {
    fields: Fields,
    key: Vec<u8>,
    value: Vec<u8>,
}

impl InsertDelete {
    pub fn new(fields: Fields) -> InsertDelete {
        InsertDelete {
            fields,
            key: Vec::new(),
            value: Vec::new(),
        }
    }

    fn message(&mut self, verb: &str, doc: &Value, out: &mut Buffer) {
        self.value.clear();
        self.value.extend_from_slice(b"{\"");
        self.value.extend_from_slice(verb.as_bytes());
        self.value.extend_from_slice(b"\":");
        write_json(doc, &mut self.value);
        self.value.extend_from_slice(b"}\n");
        out.push(&self.key, &self.value);
    }
}

impl Encoder for InsertDelete {
    fn encode(&mut self, change: &Change<'_>, out: &mut Buffer) -> Result<()> {
        self.key.clear();
        self.fields.write_json_key(change.current(), &mut self.key);
        if let (Op::Update | Op::Delete, Some(before)) = (change.op, change.before) {
            self.message("delete", before, out);
        }
        if let Some(after) = change.after {
            self.message("insert", after, out);
        }
        Ok(())
    }
}

/// `{"before", "after", "op", "source"}`, one message per change.
pub struct Debezium {
    fields: Fields,
    key: Vec<u8>,
    value: Vec<u8>,
}

impl Debezium {
    pub fn new(fields: Fields) -> Debezium {
        Debezium {
            fields,
            key: Vec::new(),
            value: Vec::new(),
        }
    }
}

impl Encoder for Debezium {
    fn encode(&mut self, change: &Change<'_>, out: &mut Buffer) -> Result<()> {
        self.key.clear();
        self.fields.write_json_key(change.current(), &mut self.key);
        let v = &mut self.value;
        v.clear();
        v.extend_from_slice(b"{\"before\":");
        write_json(change.before.unwrap_or(&Value::Null), v);
        v.extend_from_slice(b",\"after\":");
        write_json(change.after.unwrap_or(&Value::Null), v);
        v.extend_from_slice(b",\"op\":\"");
        v.extend_from_slice(change.op.debezium().as_bytes());
        v.extend_from_slice(b"\",\"source\":{\"connector\":\"sluice\",\"materialization\":");
        write_json(&Value::String(self.fields.materialization.clone()), v);
        v.extend_from_slice(b",\"txn\":");
        v.extend_from_slice(change.txn.to_string().as_bytes());
        v.extend_from_slice(b"}}\n");
        out.push(&self.key, &self.value);
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::encode::Field;
    use serde_json::json;
    use sluice_sink_sdk::arrow::ColumnKind;

    pub(crate) fn fields() -> Fields {
        let field = |name: &str, kind| Field {
            name: name.into(),
            ptr: format!("/{name}"),
            kind,
            nullable: name != "id",
        };
        Fields {
            materialization: "views".into(),
            name: "pageviews".into(),
            keys: vec![field("id", ColumnKind::Utf8)],
            values: vec![field("n", ColumnKind::Int64)],
        }
    }

    fn encode(encoder: &mut dyn Encoder, change: Change<'_>) -> Vec<(String, String)> {
        let mut out = Buffer::default();
        out.start(change.txn);
        encoder.encode(&change, &mut out).unwrap();
        out.messages()
            .map(|m| {
                (
                    String::from_utf8(m.key.to_vec()).unwrap(),
                    String::from_utf8(m.value.to_vec()).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn insert_delete_splits_an_update_into_a_delete_and_an_insert() {
        let (old, new) = (json!({"id": "a", "n": 1}), json!({"id": "a", "n": 2}));
        let mut enc = InsertDelete::new(fields());
        let update = Change {
            txn: 3,
            op: Op::Update,
            before: Some(&old),
            after: Some(&new),
        };
        assert_eq!(
            encode(&mut enc, update),
            [
                (
                    r#"{"id":"a"}"#.into(),
                    "{\"delete\":{\"id\":\"a\",\"n\":1}}\n".into()
                ),
                (
                    r#"{"id":"a"}"#.into(),
                    "{\"insert\":{\"id\":\"a\",\"n\":2}}\n".into()
                ),
            ]
        );
        let delete = Change {
            txn: 3,
            op: Op::Delete,
            before: Some(&old),
            after: None,
        };
        assert_eq!(encode(&mut enc, delete).len(), 1);
        let read = Change {
            txn: 3,
            op: Op::Read,
            before: None,
            after: Some(&new),
        };
        assert!(encode(&mut enc, read)[0].1.starts_with("{\"insert\""));
    }

    #[test]
    fn debezium_carries_before_after_op_and_source() {
        let (old, new) = (json!({"id": "a", "n": 1}), json!({"id": "a", "n": 2}));
        let mut enc = Debezium::new(fields());
        let got = encode(
            &mut enc,
            Change {
                txn: 9,
                op: Op::Update,
                before: Some(&old),
                after: Some(&new),
            },
        );
        let value: Value = serde_json::from_str(&got[0].1).unwrap();
        assert_eq!(
            value,
            json!({"before": old, "after": new, "op": "u",
                   "source": {"connector": "sluice", "materialization": "views", "txn": 9}})
        );
        assert!(got[0].1.ends_with('\n'));
    }
}
