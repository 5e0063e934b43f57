//! Documents to Arrow: a binding's projections become an Arrow schema, and its stored
//! documents become `RecordBatch`es of bounded size.
//!
//! A column's type comes from its projection's inferred types (`null` aside): `integer`
//! is Int64, `number` (or integer and number) Float64, `boolean` Boolean, `string` Utf8,
//! anything else (objects, arrays, several types) Utf8 holding the value's JSON text. A
//! column is nullable unless the location must exist and cannot be null; key columns
//! never are, and in a keyed binding every value column is (a deletion's row carries
//! only its key). The document itself is a Utf8 column of JSON text. A keyed binding ends
//! with `_op`: `U` (the key's new value) or `D` (the key was deleted: the stored
//! document is `null`, or its `/_meta/op` is `d`).
//!
//! Values are read straight from the packed tuples of a Store (borrowed text), so a
//! batch is built without a `serde_json::Value` per document.

use crate::{Result, SinkError};
use arrow_array::builder::{BooleanBuilder, Float64Builder, Int64Builder, StringBuilder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use sluice_doc::tuple::{Element, elements};
use sluice_driver_sdk::flow::{self, materialization_spec::Binding};
use std::collections::HashMap;
use std::sync::Arc;

/// The trailing column of a keyed binding.
pub const OP_COLUMN: &str = "_op";
/// The field metadata key marking a Utf8 column that holds JSON text.
pub const JSON_METADATA: &str = "sluice.json";
/// The field metadata key marking the document column (the whole reduced document as
/// JSON text): what a sink answering Load keeps and hands back.
pub const DOCUMENT_METADATA: &str = "sluice.document";

/// How a column holds its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnKind {
    Int64,
    Float64,
    Boolean,
    Utf8,
    /// Utf8 holding JSON text.
    Json,
}

impl ColumnKind {
    /// From a projection's inferred JSON types.
    pub fn infer(types: &[String]) -> ColumnKind {
        let mut types: Vec<&str> = types
            .iter()
            .map(String::as_str)
            .filter(|t| *t != "null")
            .collect();
        types.sort_unstable();
        match types.as_slice() {
            ["integer"] => ColumnKind::Int64,
            ["number"] | ["integer", "number"] => ColumnKind::Float64,
            ["boolean"] => ColumnKind::Boolean,
            ["string"] => ColumnKind::Utf8,
            _ => ColumnKind::Json,
        }
    }

    fn data_type(self) -> DataType {
        match self {
            ColumnKind::Int64 => DataType::Int64,
            ColumnKind::Float64 => DataType::Float64,
            ColumnKind::Boolean => DataType::Boolean,
            ColumnKind::Utf8 | ColumnKind::Json => DataType::Utf8,
        }
    }
}

/// The columns of a binding, in Store order: keys, values, the document, then `_op`
/// when `keyed`.
#[derive(Debug, Clone)]
pub struct BindingColumns {
    pub schema: SchemaRef,
    pub kinds: Vec<ColumnKind>,
    /// The key columns' names.
    pub key: Vec<String>,
    /// Whether the document is a column.
    pub document: bool,
    pub keyed: bool,
}

/// The Arrow schema of a binding's field selection.
pub fn binding_schema(binding: &Binding, keyed: bool) -> Result<BindingColumns> {
    let collection = binding.collection.as_ref();
    let projections: HashMap<&str, &flow::Projection> = collection
        .map(|c| {
            c.projections
                .iter()
                .map(|p| (p.field.as_str(), p))
                .collect()
        })
        .unwrap_or_default();
    let selection = binding.field_selection.clone().unwrap_or_default();
    let mut fields = Vec::new();
    let mut kinds = Vec::new();
    let mut column = |name: &str, is_key: bool| -> Result<()> {
        let projection = projections.get(name).ok_or_else(|| {
            SinkError::Config(format!("field {name:?} is selected but has no projection"))
        })?;
        let inference = projection.inference.clone().unwrap_or_default();
        let kind = ColumnKind::infer(&inference.types);
        let may_be_absent = keyed || !inference.must_exist;
        let nullable = !is_key && (may_be_absent || inference.types.iter().any(|t| t == "null"));
        let mut field = Field::new(name, kind.data_type(), nullable);
        if kind == ColumnKind::Json {
            field = field.with_metadata([(JSON_METADATA.to_string(), "true".into())].into());
        }
        fields.push(field);
        kinds.push(kind);
        Ok(())
    };
    for key in &selection.keys {
        column(key, true)?;
    }
    for value in &selection.values {
        column(value, false)?;
    }
    let document = !selection.document.is_empty();
    if document {
        fields.push(
            Field::new(&selection.document, DataType::Utf8, false).with_metadata(
                [
                    (JSON_METADATA.to_string(), "true".into()),
                    (DOCUMENT_METADATA.to_string(), "true".into()),
                ]
                .into(),
            ),
        );
        kinds.push(ColumnKind::Json);
    }
    if keyed {
        fields.push(Field::new(OP_COLUMN, DataType::Utf8, false));
        kinds.push(ColumnKind::Utf8);
    }
    Ok(BindingColumns {
        schema: Arc::new(Schema::new(fields)),
        kinds,
        key: selection.keys.clone(),
        document,
        keyed,
    })
}

impl BindingColumns {
    /// Only the key columns: the shape of a Load's keys ([`BatchBuilder::push`] with
    /// empty values and document).
    pub fn keys_only(&self) -> BindingColumns {
        let n = self.key.len();
        let fields: Vec<Field> = (self.schema.fields().iter().take(n))
            .map(|f| f.as_ref().clone())
            .collect();
        BindingColumns {
            schema: Arc::new(Schema::new(fields)),
            kinds: self.kinds[..n].to_vec(),
            key: self.key.clone(),
            document: false,
            keyed: false,
        }
    }
}

/// The name of the document column of `schema` (marked [`DOCUMENT_METADATA`]), if the
/// binding selects the document.
pub fn document_column(schema: &Schema) -> Option<&str> {
    schema
        .fields()
        .iter()
        .find(|f| f.metadata().contains_key(DOCUMENT_METADATA))
        .map(|f| f.name().as_str())
}

/// Whether a document's JSON text is a deletion: `null` (how the runtime stores the
/// deletion of a standard binding's key, the protocol's deletion), or a document whose
/// `/_meta/op` is `"d"` (a delta binding's deletion, stored as it came). Only a text
/// that holds `"d"` at all is parsed.
pub fn is_deletion(doc_json: &[u8]) -> bool {
    if doc_json.trim_ascii() == b"null" {
        return true;
    }
    #[derive(serde::Deserialize)]
    struct Meta<'a> {
        #[serde(borrow, default)]
        op: Option<&'a str>,
    }
    #[derive(serde::Deserialize)]
    struct Doc<'a> {
        #[serde(borrow, rename = "_meta", default)]
        meta: Option<Meta<'a>>,
    }
    if !doc_json.windows(3).any(|w| w == b"\"d\"") {
        return false;
    }
    serde_json::from_slice::<Doc<'_>>(doc_json)
        .ok()
        .and_then(|d| d.meta)
        .and_then(|m| m.op)
        == Some("d")
}

enum Builder {
    Int64(Int64Builder),
    Float64(Float64Builder),
    Boolean(BooleanBuilder),
    Utf8(StringBuilder),
}

/// Builds one binding's batches, closing each at `max_rows` rows or `max_bytes` of
/// values, whichever comes first.
pub struct BatchBuilder {
    columns: BindingColumns,
    builders: Vec<Builder>,
    rows: usize,
    bytes: usize,
    max_rows: usize,
    max_bytes: usize,
    /// A reusable buffer for JSON text of a non-text element.
    text: String,
}

impl BatchBuilder {
    pub fn new(columns: BindingColumns, max_rows: usize, max_bytes: usize) -> BatchBuilder {
        let builders = columns
            .kinds
            .iter()
            .map(|_| Builder::Int64(Int64Builder::new()))
            .collect();
        let mut builder = BatchBuilder {
            columns,
            builders,
            rows: 0,
            bytes: 0,
            max_rows: max_rows.max(1),
            max_bytes: max_bytes.max(1),
            text: String::new(),
        };
        builder.reset();
        builder
    }

    pub fn schema(&self) -> SchemaRef {
        self.columns.schema.clone()
    }

    fn reset(&mut self) {
        self.builders = self
            .columns
            .kinds
            .iter()
            .map(|kind| match kind {
                ColumnKind::Int64 => Builder::Int64(Int64Builder::new()),
                ColumnKind::Float64 => Builder::Float64(Float64Builder::new()),
                ColumnKind::Boolean => Builder::Boolean(BooleanBuilder::new()),
                ColumnKind::Utf8 | ColumnKind::Json => Builder::Utf8(StringBuilder::new()),
            })
            .collect();
        self.rows = 0;
        self.bytes = 0;
    }

    /// Rows added since the last batch.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Bytes of values added since the last batch (its packed keys, values and JSON).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Whether the batch reached a bound.
    pub fn is_full(&self) -> bool {
        self.rows >= self.max_rows || self.bytes >= self.max_bytes
    }

    /// Adds one stored document: its packed key, packed values and JSON text.
    pub fn push(&mut self, packed_key: &[u8], packed_values: &[u8], doc_json: &[u8]) -> Result<()> {
        let mut at = 0;
        for packed in [packed_key, packed_values] {
            for element in elements(packed) {
                let element = element.map_err(|e| SinkError::Corrupt(e.to_string()))?;
                let Some(builder) = self.builders.get_mut(at) else {
                    return Err(self.shape_error(at));
                };
                let name = self.columns.schema.field(at).name();
                append(
                    builder,
                    self.columns.kinds[at],
                    element,
                    name,
                    &mut self.text,
                )?;
                at += 1;
            }
        }
        let document = usize::from(self.columns.document);
        let keyed = usize::from(self.columns.keyed);
        if at + document + keyed != self.builders.len() {
            return Err(self.shape_error(at));
        }
        if self.columns.document {
            let text = std::str::from_utf8(doc_json)
                .map_err(|e| SinkError::Corrupt(format!("document is not UTF-8: {e}")))?;
            let Builder::Utf8(b) = &mut self.builders[at] else {
                unreachable!("the document column is Utf8")
            };
            b.append_value(text);
            at += 1;
        }
        if self.columns.keyed {
            let Builder::Utf8(b) = &mut self.builders[at] else {
                unreachable!("the _op column is Utf8")
            };
            b.append_value(if is_deletion(doc_json) { "D" } else { "U" });
        }
        self.rows += 1;
        self.bytes += packed_key.len() + packed_values.len() + doc_json.len();
        Ok(())
    }

    fn shape_error(&self, at: usize) -> SinkError {
        SinkError::Corrupt(format!(
            "a stored document has {at} or more key and value fields, but the binding selects {}",
            self.builders.len()
                - usize::from(self.columns.document)
                - usize::from(self.columns.keyed)
        ))
    }

    /// The rows added so far as a batch (none when empty); starts the next.
    pub fn finish(&mut self) -> Result<Option<RecordBatch>> {
        if self.rows == 0 {
            return Ok(None);
        }
        let arrays: Vec<ArrayRef> = self
            .builders
            .iter_mut()
            .map(|b| -> ArrayRef {
                match b {
                    Builder::Int64(b) => Arc::new(b.finish()),
                    Builder::Float64(b) => Arc::new(b.finish()),
                    Builder::Boolean(b) => Arc::new(b.finish()),
                    Builder::Utf8(b) => Arc::new(b.finish()),
                }
            })
            .collect();
        let batch = RecordBatch::try_new(self.columns.schema.clone(), arrays)
            .map_err(|e| SinkError::Schema(format!("cannot build a batch: {e}")))?;
        self.reset();
        Ok(Some(batch))
    }
}

fn append(
    builder: &mut Builder,
    kind: ColumnKind,
    element: Element<'_>,
    field: &str,
    text: &mut String,
) -> Result<()> {
    let mismatch = |element: &Element<'_>| {
        SinkError::Schema(format!(
            "field {field:?} is a {kind:?} column, but a document holds {element:?} there"
        ))
    };
    match (builder, element) {
        (Builder::Int64(b), Element::Null) => b.append_null(),
        (Builder::Float64(b), Element::Null) => b.append_null(),
        (Builder::Boolean(b), Element::Null) => b.append_null(),
        (Builder::Utf8(b), Element::Null) => b.append_null(),
        (Builder::Int64(b), Element::Int(i)) => b.append_value(i),
        (Builder::Float64(b), Element::Float(f)) => b.append_value(f),
        (Builder::Float64(b), Element::Int(i)) => b.append_value(i as f64),
        (Builder::Float64(b), Element::UInt(u)) => b.append_value(u as f64),
        (Builder::Boolean(b), Element::Bool(v)) => b.append_value(v),
        (Builder::Utf8(b), Element::Str(s)) if kind == ColumnKind::Utf8 => b.append_value(&s),
        (Builder::Utf8(b), Element::Json(json)) if kind == ColumnKind::Json => b.append_value(
            std::str::from_utf8(&json).map_err(|e| SinkError::Corrupt(e.to_string()))?,
        ),
        (Builder::Utf8(b), element) if kind == ColumnKind::Json => {
            text.clear();
            json_text(&element, text).map_err(|_| mismatch(&element))?;
            b.append_value(&*text);
        }
        (_, element) => return Err(mismatch(&element)),
    }
    Ok(())
}

/// Writes `element` as JSON text.
fn json_text(element: &Element<'_>, out: &mut String) -> std::result::Result<(), ()> {
    use std::fmt::Write;
    match element {
        Element::Null => out.push_str("null"),
        Element::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Element::Int(i) => write!(out, "{i}").map_err(drop)?,
        Element::UInt(u) => write!(out, "{u}").map_err(drop)?,
        Element::Float(f) => {
            let n = serde_json::Number::from_f64(*f).ok_or(())?;
            write!(out, "{n}").map_err(drop)?
        }
        Element::Str(s) => out.push_str(&serde_json::to_string(&**s).map_err(drop)?),
        Element::Json(json) => out.push_str(std::str::from_utf8(json).map_err(drop)?),
        Element::Tuple(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                json_text(item, out)?;
            }
            out.push(']');
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Array, BooleanArray, Float64Array, Int64Array, StringArray};
    use serde_json::{Value, json};
    use sluice_doc::tuple::pack_key;
    use sluice_driver_sdk::flow::{CollectionSpec, FieldSelection, Inference, Projection};

    fn projection(field: &str, types: &[&str], must_exist: bool) -> Projection {
        Projection {
            ptr: format!("/{field}"),
            field: field.into(),
            inference: Some(Inference {
                types: types.iter().map(|t| t.to_string()).collect(),
                must_exist,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn binding() -> Binding {
        let mut projections = vec![
            projection("id", &["string"], true),
            projection("n", &["integer"], true),
            projection("score", &["integer", "number", "null"], false),
            projection("ok", &["boolean"], false),
            projection("tags", &["object"], false),
        ];
        projections.push(Projection {
            field: "flow_document".into(),
            ..Default::default()
        });
        Binding {
            collection: Some(CollectionSpec {
                projections,
                ..Default::default()
            }),
            field_selection: Some(FieldSelection {
                keys: vec!["id".into()],
                values: vec!["n".into(), "score".into(), "ok".into(), "tags".into()],
                document: "flow_document".into(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn push(b: &mut BatchBuilder, id: &str, values: &[Value], doc: &Value) {
        let key = pack_key(&[json!(id)]);
        let values = pack_key(values);
        b.push(&key, &values, doc.to_string().as_bytes()).unwrap();
    }

    #[test]
    fn projections_become_typed_columns_and_rows_keep_their_values() {
        let columns = binding_schema(&binding(), true).unwrap();
        let schema = columns.schema.clone();
        let names: Vec<&str> = schema.fields().iter().map(|f| f.name().as_str()).collect();
        assert_eq!(
            names,
            ["id", "n", "score", "ok", "tags", "flow_document", "_op"]
        );
        let types: Vec<&DataType> = schema.fields().iter().map(|f| f.data_type()).collect();
        assert_eq!(
            types,
            [
                &DataType::Utf8,
                &DataType::Int64,
                &DataType::Float64,
                &DataType::Boolean,
                &DataType::Utf8,
                &DataType::Utf8,
                &DataType::Utf8
            ]
        );
        // Keyed: a deletion carries only its key, so even `n`, which must exist, may be null.
        assert!(!schema.field(0).is_nullable());
        assert!((1..5).all(|i| schema.field(i).is_nullable()));
        let append_only = binding_schema(&binding(), false).unwrap().schema;
        assert!(!append_only.field(1).is_nullable() && append_only.field(2).is_nullable());
        assert_eq!(
            schema.field(4).metadata().get(JSON_METADATA).unwrap(),
            "true"
        );

        let mut b = BatchBuilder::new(columns, 100, 1 << 20);
        push(
            &mut b,
            "a",
            &[json!(3), json!(2), json!(true), json!({"x": [1]})],
            &json!({"id": "a", "n": 3}),
        );
        push(
            &mut b,
            "b\u{0}z",
            &[json!(null), json!(null), json!(null), json!(null)],
            &json!(null),
        );
        let batch = b.finish().unwrap().unwrap();
        assert!(
            b.finish().unwrap().is_none(),
            "a finished batch starts the next"
        );
        let col = |i: usize| batch.column(i).clone();
        let ids = col(0);
        let ids = ids.as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!((ids.value(0), ids.value(1)), ("a", "b\u{0}z"));
        let n = col(1);
        let n = n.as_any().downcast_ref::<Int64Array>().unwrap();
        assert!(n.value(0) == 3 && n.is_null(1), "the deletion's n is null");
        let score = col(2);
        let score = score.as_any().downcast_ref::<Float64Array>().unwrap();
        assert_eq!(score.value(0), 2.0);
        assert!(score.is_null(1));
        let ok = col(3);
        assert!(ok.as_any().downcast_ref::<BooleanArray>().unwrap().value(0));
        let tags = col(4);
        let tags = tags.as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!(tags.value(0), r#"{"x":[1]}"#);
        assert!(tags.is_null(1));
        let ops = col(6);
        let ops = ops.as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!((ops.value(0), ops.value(1)), ("U", "D"));
    }

    #[test]
    fn a_loads_keys_decode_into_the_key_columns_and_the_document_is_marked() {
        let columns = binding_schema(&binding(), true).unwrap();
        assert_eq!(document_column(&columns.schema), Some("flow_document"));
        let mut keys = BatchBuilder::new(columns.keys_only(), 10, 1 << 20);
        keys.push(&pack_key(&[json!("a")]), &[], &[]).unwrap();
        keys.push(&pack_key(&[json!("b")]), &[], &[]).unwrap();
        let batch = keys.finish().unwrap().unwrap();
        assert_eq!(batch.num_columns(), 1);
        assert_eq!(batch.schema().field(0).name(), "id");
        let ids = batch
            .column(0)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        assert_eq!((ids.value(0), ids.value(1)), ("a", "b"));
    }

    #[test]
    fn a_batch_is_full_at_its_row_or_byte_bound() {
        let columns = binding_schema(&binding(), false).unwrap();
        assert_eq!(
            columns.schema.fields().len(),
            6,
            "no _op without keyed mutations"
        );
        let values = [json!(1), json!(1.5), json!(false), json!([])];
        let mut rows = BatchBuilder::new(columns.clone(), 2, 1 << 20);
        push(&mut rows, "a", &values, &json!({}));
        assert!(!rows.is_full());
        push(&mut rows, "b", &values, &json!({}));
        assert!(rows.is_full());
        let mut bytes = BatchBuilder::new(columns, 1000, 64);
        push(&mut bytes, "a", &values, &json!({"pad": "x".repeat(64)}));
        assert!(bytes.is_full());
    }

    #[test]
    fn a_value_of_the_wrong_type_names_its_field() {
        let mut b = BatchBuilder::new(binding_schema(&binding(), true).unwrap(), 10, 1 << 20);
        let key = pack_key(&[json!("a")]);
        let values = pack_key(&[json!("three"), json!(1), json!(true), json!({})]);
        let err = b.push(&key, &values, b"{}").unwrap_err();
        assert!(
            err.to_string().contains("field \"n\" is a Int64 column"),
            "{err}"
        );
        let short = pack_key(&[json!(1)]);
        let err = b.push(&key, &short, b"{}").unwrap_err();
        assert!(err.to_string().contains("binding selects"), "{err}");
    }

    #[test]
    fn only_null_or_a_meta_op_of_d_is_a_deletion() {
        assert!(is_deletion(b"null"), "a standard binding's deletion");
        assert!(is_deletion(br#"{"_meta":{"op":"d"},"id":1}"#));
        assert!(!is_deletion(br#"{"_meta":{"op":"u"},"v":"d"}"#));
        assert!(!is_deletion(br#"{"op":"d"}"#));
        assert!(!is_deletion(b"{}"));
    }
}
