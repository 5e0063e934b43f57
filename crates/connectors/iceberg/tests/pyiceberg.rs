//! An independent reader: pyiceberg's SqlCatalog, over the same SQLite catalog file,
//! reads back what the sink committed (read_table.py).

mod common;

use common::{Fixture, epoch};
use serde_json::{Value, json};
use sluice_sink_sdk::{EpochSink, Recovery};
use std::process::Command;

/// pyiceberg (with pyarrow and SQLAlchemy) importable by `python3`, installing it once
/// if missing. Fails the test, never skips it, when it cannot be had.
fn require_pyiceberg() {
    let importable = || {
        Command::new("python3")
            .args(["-c", "import pyiceberg, pyarrow, sqlalchemy"])
            .status()
            .is_ok_and(|s| s.success())
    };
    if importable() {
        return;
    }
    let _ = Command::new("python3")
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "pyiceberg[sql-sqlite,pyarrow]",
        ])
        .status();
    assert!(
        importable(),
        "pyiceberg, pyarrow and SQLAlchemy are needed for this test and could not be installed: \
         run `python3 -m pip install 'pyiceberg[sql-sqlite,pyarrow]'`"
    );
}

fn read_table(f: &Fixture, table: &str, snapshots: bool) -> Vec<Value> {
    sluice_iceberg::pyiceberg_read(
        &f.catalog_path(),
        &f.warehouse(),
        &format!("sluice.{table}"),
        snapshots,
    )
    .unwrap()
}

#[tokio::test]
async fn pyiceberg_reads_the_rows_and_snapshots_the_sink_committed() {
    require_pyiceberg();
    let f = Fixture::new();
    let bindings = [common::binding("events")];
    let mut sink = f.sink(json!({}), &bindings).await;
    sink.recover(&Recovery::default()).await.unwrap();
    epoch(&mut sink, 1, &[(1, Some("a"), "U"), (2, None, "U")])
        .await
        .unwrap();
    epoch(&mut sink, 2, &[(2, Some("b"), "U"), (1, None, "D")])
        .await
        .unwrap();
    sink.close().await.unwrap();

    let mut ours: Vec<Value> = {
        let catalog = sluice_iceberg::open_catalog(&f.catalog_path(), &f.warehouse())
            .await
            .unwrap();
        sluice_iceberg::read_rows(&catalog, "sluice", "events")
            .await
            .unwrap()
            .into_iter()
            .map(Value::Object)
            .collect()
    };
    let mut theirs = read_table(&f, "events", false);
    let key = |v: &Value| (v["_txn"].as_i64(), v["id"].as_i64());
    ours.sort_by_key(key);
    theirs.sort_by_key(key);
    assert_eq!(theirs.len(), 4);
    assert_eq!(theirs, ours);
    assert_eq!(
        theirs[2],
        json!({"id": 1, "name": null, "flow_document": "{\"id\":1,\"name\":null}", "_txn": 2, "_op": "D"})
    );

    let snapshots = read_table(&f, "events", true);
    assert_eq!(snapshots.len(), 2);
    assert_eq!(snapshots[1]["sluice.txn"], "2");
    assert_eq!(snapshots[1]["sluice.materialization"], "lake");
    assert_eq!(snapshots[1]["operation"], "append");
}

#[tokio::test]
async fn pyiceberg_reads_a_column_added_by_schema_evolution() {
    use sluice_sink_sdk::{DataType, Field, Schema};
    use std::sync::Arc;
    require_pyiceberg();
    let f = Fixture::new();
    let mut sink = f.sink(json!({}), &[common::binding("events")]).await;
    sink.recover(&Recovery::default()).await.unwrap();
    epoch(&mut sink, 1, &[(1, Some("a"), "U")]).await.unwrap();
    sink.close().await.unwrap();

    // The binding gains `score`: apply adds it, and epoch 2 writes it.
    let mut wider = common::binding("events");
    let mut fields: Vec<Field> = wider
        .schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.insert(2, Field::new("score", DataType::Float64, true));
    wider.schema = Arc::new(Schema::new(fields));
    let mut sink = f.sink(json!({}), std::slice::from_ref(&wider)).await;
    sink.recover(&Recovery::default()).await.unwrap();
    let base = common::batch(&[(2, Some("b"), "U")]);
    let mut columns = base.columns().to_vec();
    columns.insert(
        2,
        Arc::new(arrow_array::Float64Array::from(vec![Some(0.5)])),
    );
    let batch = arrow_array::RecordBatch::try_new(wider.schema.clone(), columns).unwrap();
    sink.begin_epoch(2).await.unwrap();
    sink.write_batch(0, &batch).await.unwrap();
    let d = sink.pre_commit(2).await.unwrap().unwrap();
    sink.commit_epoch(2, &d).await.unwrap();

    let mut theirs = read_table(&f, "events", false);
    theirs.sort_by_key(|v| v["_txn"].as_i64());
    assert_eq!(theirs.len(), 2);
    assert_eq!(theirs[0]["score"], Value::Null);
    assert_eq!(theirs[1]["score"], json!(0.5));
    assert_eq!(theirs[1]["name"], "b");
}
