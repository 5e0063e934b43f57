//! An upsert table's test kit, shared by the upsert and maintenance tests: the binding
//! (`mode: upsert`), changes as batches, the reference model they fold into, a sink
//! prepared and opened over a fixture, its epochs, and the two reads a test compares
//! with the model (pyiceberg's scan, and Load).

use super::{Fixture, context};
use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use serde_json::{Value, json};
use sluice_iceberg::IcebergSink;
use sluice_sink_sdk::arrow::{DOCUMENT_METADATA, JSON_METADATA};
use sluice_sink_sdk::{DataType, EpochSink, Field, Schema, SinkBinding};
use std::collections::BTreeMap;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

/// key → name: the view the table must equal.
pub type Model = BTreeMap<i64, String>;

/// A change: `Some(name)` upserts the key, `None` deletes it.
pub type Change<S> = (i64, Option<S>);

/// Table `views` in `mode: upsert`: `id` (key), `name`, the document, `_op`.
pub fn binding() -> SinkBinding {
    let document = Field::new("flow_document", DataType::Utf8, false).with_metadata(
        [
            (JSON_METADATA.to_string(), "true".into()),
            (DOCUMENT_METADATA.to_string(), "true".into()),
        ]
        .into(),
    );
    SinkBinding {
        resource: json!({"table": "views", "mode": "upsert"}),
        schema: Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            document,
            Field::new("_op", DataType::Utf8, false),
        ])),
        key: vec!["id".into()],
    }
}

pub fn doc(id: i64, name: &str) -> String {
    json!({"id": id, "name": name}).to_string()
}

pub fn batch<S: AsRef<str>>(changes: &[Change<S>]) -> RecordBatch {
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(changes.iter().map(|c| c.0)));
    let names: ArrayRef = Arc::new(StringArray::from_iter(
        changes.iter().map(|c| c.1.as_ref().map(AsRef::as_ref)),
    ));
    let docs: ArrayRef = Arc::new(StringArray::from_iter_values(changes.iter().map(
        |c| match &c.1 {
            Some(name) => doc(c.0, name.as_ref()),
            None => json!({"id": c.0, "_meta": {"op": "d"}}).to_string(),
        },
    )));
    let ops: ArrayRef = Arc::new(StringArray::from_iter_values(
        changes
            .iter()
            .map(|c| if c.1.is_some() { "U" } else { "D" }),
    ));
    RecordBatch::try_new(binding().schema, vec![ids, names, docs, ops]).unwrap()
}

pub fn apply<S: AsRef<str>>(model: &mut Model, changes: &[Change<S>]) {
    for (id, name) in changes {
        match name {
            Some(name) => model.insert(*id, name.as_ref().to_string()),
            None => model.remove(id),
        };
    }
}

/// A sink over `f`'s catalog, its state in `state`, prepared and opened, not recovered.
pub async fn sink(f: &Fixture, state: &Path) -> IcebergSink {
    let mut sink = IcebergSink::new(&f.endpoint(json!({}))).unwrap();
    sink.bind_runtime_context(context()).unwrap();
    sink.bind_state_dir(state).unwrap();
    let plan = sink.resolve_schema(&[binding()]).await.unwrap();
    sink.prepare_schema(&plan).await.unwrap();
    sink.open(&[binding()]).await.unwrap();
    sink
}

/// Runs epoch `n` up to its decision: the descriptor, not applied.
pub async fn decide<S: AsRef<str>>(sink: &mut IcebergSink, n: u64, changes: &[Change<S>]) -> Value {
    sink.begin_epoch(n).await.unwrap();
    sink.write_batch(0, &batch(changes)).await.unwrap();
    sink.pre_commit(n)
        .await
        .unwrap()
        .expect("the epoch staged files")
}

/// Runs epoch `n` whole.
pub async fn epoch<S: AsRef<str>>(sink: &mut IcebergSink, n: u64, changes: &[Change<S>]) -> Value {
    let d = decide(sink, n, changes).await;
    sink.commit_epoch(n, &d).await.unwrap();
    d
}

/// The table as pyiceberg reads it: `id → name`, each id once, every row live (`U`).
pub fn pyiceberg_view(f: &Fixture) -> Model {
    let rows = sluice_iceberg::pyiceberg_read(
        &f.catalog_path(),
        f.warehouse_location(),
        "sluice.views",
        false,
    )
    .unwrap();
    let mut view = Model::new();
    for row in &rows {
        let id = row["id"].as_i64().unwrap();
        let name = row["name"].as_str().unwrap().to_string();
        assert_eq!(row["_op"], "U", "{row}");
        assert!(view.insert(id, name).is_none(), "key {id} twice: {rows:?}");
    }
    view
}

/// What Load answers for `keys`, as `id → name`.
pub async fn loaded(sink: &mut IcebergSink, keys: Range<i64>) -> Model {
    let keys = RecordBatch::try_new(
        Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)])),
        vec![Arc::new(Int64Array::from_iter_values(keys)) as ArrayRef],
    )
    .unwrap();
    let docs = sink.load(0, &keys).await.unwrap();
    docs.iter()
        .map(|d| {
            let d: Value = serde_json::from_str(d).unwrap();
            (
                d["id"].as_i64().unwrap(),
                d["name"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}
