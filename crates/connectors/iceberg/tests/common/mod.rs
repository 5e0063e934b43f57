//! Shared by the Iceberg sink's tests: a binding of `id` (key), `name`, the document and
//! `_op`, its batches, and a sink over a fresh catalog and warehouse: a local folder, or
//! a bucket of the test's own on the local S3 server ([`Fixture::s3`]).
#![allow(dead_code)]

pub mod upsert;

use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use serde_json::{Value, json};
use sluice_iceberg::{IcebergSink, Warehouse};
use sluice_object_store::S3Url;
use sluice_sink_sdk::{DataType, EpochSink, Field, RuntimeContext, Schema, SinkBinding};
use std::path::PathBuf;
use std::sync::Arc;

pub struct Fixture {
    pub dir: tempfile::TempDir,
    /// The bucket of an S3 warehouse; `None`: the warehouse is a local folder.
    pub bucket: Option<sluice_testkit::s3::TestBucket>,
}

impl Fixture {
    pub fn new() -> Fixture {
        Fixture {
            dir: tempfile::tempdir().unwrap(),
            bucket: None,
        }
    }

    /// A fixture whose warehouse is `s3://<a bucket of its own>/warehouse` on the local
    /// S3 server (the catalog stays a local SQLite file).
    pub fn s3(test: &str) -> Fixture {
        Fixture {
            bucket: Some(sluice_testkit::s3::TestBucket::create(test)),
            ..Fixture::new()
        }
    }

    /// The warehouse, local or S3, as `open_catalog` and `pyiceberg_read` take it.
    pub fn warehouse_location(&self) -> Warehouse {
        match &self.bucket {
            Some(b) => Warehouse::S3 {
                url: S3Url::parse(&b.url("warehouse")).unwrap(),
                settings: sluice_testkit::s3::settings(),
            },
            None => Warehouse::Local(self.warehouse()),
        }
    }

    pub fn catalog_path(&self) -> PathBuf {
        self.dir.path().join("catalog.db")
    }

    pub fn warehouse(&self) -> PathBuf {
        self.dir.path().join("warehouse")
    }

    pub fn endpoint(&self, extra: Value) -> Value {
        let mut e = json!({
            "catalog": self.catalog_path(),
            "warehouse": self.warehouse(),
            "namespace": "sluice",
        });
        if let Some(b) = &self.bucket {
            e["warehouse"] = json!(b.url("warehouse"));
            e["s3"] = serde_json::to_value(sluice_testkit::s3::settings()).unwrap();
        }
        e.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        e
    }

    /// A sink with its context bound, schema prepared and bindings opened (not recovered).
    pub async fn sink(&self, extra: Value, bindings: &[SinkBinding]) -> IcebergSink {
        let mut sink = IcebergSink::new(&self.endpoint(extra)).unwrap();
        sink.bind_runtime_context(context()).unwrap();
        let plan = sink.resolve_schema(bindings).await.unwrap();
        sink.prepare_schema(&plan).await.unwrap();
        sink.open(bindings).await.unwrap();
        sink
    }
}

pub fn context() -> RuntimeContext {
    RuntimeContext {
        deployment_id: "dep1".into(),
        sink_id: "lake".into(),
        participant_id: 1,
    }
}

pub fn binding(table: &str) -> SinkBinding {
    SinkBinding {
        resource: json!({ "table": table }),
        schema: Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("name", DataType::Utf8, true),
            Field::new("flow_document", DataType::Utf8, false),
            Field::new("_op", DataType::Utf8, false),
        ])),
        key: vec!["id".into()],
    }
}

/// Rows `(id, name, op)` as a batch of [`binding`]'s schema.
pub fn batch(rows: &[(i64, Option<&str>, &str)]) -> RecordBatch {
    let schema = binding("x").schema;
    let ids: ArrayRef = Arc::new(Int64Array::from_iter_values(rows.iter().map(|r| r.0)));
    let names: ArrayRef = Arc::new(StringArray::from_iter(rows.iter().map(|r| r.1)));
    let docs: ArrayRef = Arc::new(StringArray::from_iter_values(
        rows.iter()
            .map(|r| json!({"id": r.0, "name": r.1}).to_string()),
    ));
    let ops: ArrayRef = Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.2)));
    RecordBatch::try_new(schema, vec![ids, names, docs, ops]).unwrap()
}

/// Runs one whole epoch writing `rows` to binding 0: returns its descriptor.
pub async fn epoch(
    sink: &mut IcebergSink,
    n: u64,
    rows: &[(i64, Option<&str>, &str)],
) -> Option<Value> {
    let _intent = sink.checkpoint_artifact_intent(n);
    sink.begin_epoch(n).await.unwrap();
    if !rows.is_empty() {
        sink.write_batch(0, &batch(rows)).await.unwrap();
    }
    let d = sink.pre_commit(n).await.unwrap();
    if let Some(d) = &d {
        sink.commit_epoch(n, d).await.unwrap();
    }
    d
}

/// `(id, _txn, _op)` of every row, sorted.
pub async fn rows(f: &Fixture, table: &str) -> Vec<(i64, i64, String)> {
    let catalog = sluice_iceberg::open_catalog(&f.catalog_path(), f.warehouse_location())
        .await
        .unwrap();
    let mut out: Vec<(i64, i64, String)> = sluice_iceberg::read_rows(&catalog, "sluice", table)
        .await
        .unwrap()
        .iter()
        .map(id_txn_op)
        .collect();
    out.sort();
    out
}

/// `(id, _txn, _op)` of a row read back (by the sink's reader or by pyiceberg).
pub fn id_txn_op(row: &serde_json::Map<String, Value>) -> (i64, i64, String) {
    (
        row["id"].as_i64().unwrap(),
        row["_txn"].as_i64().unwrap(),
        row["_op"].as_str().unwrap().to_string(),
    )
}

pub async fn orphans(f: &Fixture) -> Vec<String> {
    let catalog = sluice_iceberg::open_catalog(&f.catalog_path(), f.warehouse_location())
        .await
        .unwrap();
    sluice_iceberg::orphan_files(&catalog).await.unwrap()
}
