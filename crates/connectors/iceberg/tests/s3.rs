//! The Iceberg sink over an S3 warehouse (a bucket of each test's own on the local S3
//! server, `.ci/services`): the exactly-once lifecycle where it touches storage (append,
//! restart, abort cleanup of undecided staging, the orphan sweep and check), pyiceberg
//! reading the table from the same server, and no object ever overwritten.

mod common;

use common::{Fixture, batch, binding, epoch, orphans, rows};
use serde_json::{Value, json};
use sluice_iceberg::IcebergSink;
use sluice_sink_sdk::{Decided, EpochSink, Recovery, SinkError, Undecided};

fn u(ids: &[i64], txn: i64) -> Vec<(i64, i64, String)> {
    ids.iter().map(|&i| (i, txn, "U".to_string())).collect()
}

/// Stages epoch `n` on binding 0 and pre-commits it, never applying it.
async fn stage(sink: &mut IcebergSink, n: u64, rows: &[(i64, Option<&str>, &str)]) -> Value {
    sink.begin_epoch(n).await.unwrap();
    sink.write_batch(0, &batch(rows)).await.unwrap();
    sink.pre_commit(n).await.unwrap().unwrap()
}

/// Every object key in the fixture's bucket.
async fn keys(f: &Fixture) -> Vec<String> {
    f.bucket.as_ref().unwrap().store().list("").await.unwrap()
}

#[tokio::test]
async fn epochs_append_to_an_s3_table_that_pyiceberg_reads_back() {
    let f = Fixture::s3("append");
    let bindings = [binding("events")];
    let mut sink = f.sink(json!({}), &bindings).await;
    sink.recover(&Recovery::default()).await.unwrap();
    let d1 = epoch(&mut sink, 1, &[(1, Some("a"), "U"), (2, None, "U")])
        .await
        .unwrap();
    epoch(&mut sink, 2, &[(2, Some("b"), "U"), (1, None, "D")])
        .await
        .unwrap();
    sink.close().await.unwrap();

    let path = d1["epochs"][0]["files"][0]["path"].as_str().unwrap();
    let bucket = &f.bucket.as_ref().unwrap().name;
    assert!(
        path.starts_with(&format!(
            "s3://{bucket}/warehouse/sluice.db/events/data/_sluice/"
        )),
        "{path}"
    );
    let mut want = u(&[1, 2], 1);
    want.extend([(1, 2, "D".into()), (2, 2, "U".into())]);
    want.sort();
    assert_eq!(rows(&f, "events").await, want);
    assert_eq!(orphans(&f).await, Vec::<String>::new());
    // Nothing of the table was written outside the warehouse's prefix.
    assert!(keys(&f).await.iter().all(|k| k.starts_with("warehouse/")));

    let theirs = sluice_iceberg::pyiceberg_read(
        &f.catalog_path(),
        f.warehouse_location(),
        "sluice.events",
        false,
    )
    .unwrap();
    let mut theirs: Vec<(i64, i64, String)> = (theirs.iter())
        .map(|r| common::id_txn_op(r.as_object().unwrap()))
        .collect();
    theirs.sort();
    assert_eq!(theirs, want, "pyiceberg reads what the sink committed");
    let snapshots = sluice_iceberg::pyiceberg_read(
        &f.catalog_path(),
        f.warehouse_location(),
        "sluice.events",
        true,
    )
    .unwrap();
    assert_eq!(snapshots.len(), 2);
    assert_eq!(snapshots[1]["sluice.txn"], "2");
}

#[tokio::test]
async fn a_restart_on_s3_applies_a_decision_once() {
    let f = Fixture::s3("restart");
    let bindings = [binding("events")];
    let mut sink = f.sink(json!({}), &bindings).await;
    sink.recover(&Recovery::default()).await.unwrap();
    epoch(&mut sink, 1, &[(1, Some("a"), "U")]).await.unwrap();
    let d2 = stage(&mut sink, 2, &[(2, Some("b"), "U")]).await;
    drop(sink); // the decision of 2 is durable, its commit never ran

    for _ in 0..2 {
        // Recovered twice: the second finds epoch 2 in the table's ancestry.
        let mut sink = f.sink(json!({}), &bindings).await;
        sink.recover(&Recovery {
            decided: Some(Decided {
                epoch: 2,
                descriptor: d2.clone(),
            }),
            ..Default::default()
        })
        .await
        .unwrap();
        sink.commit_epoch(2, &d2).await.unwrap();
    }
    let mut want = u(&[1], 1);
    want.extend(u(&[2], 2));
    assert_eq!(rows(&f, "events").await, want);
    assert_eq!(orphans(&f).await, Vec::<String>::new());
}

#[tokio::test]
async fn undecided_staging_on_s3_is_removed_and_the_orphan_check_sees_it_first() {
    let f = Fixture::s3("abort-cleanup");
    let bindings = [binding("events")];
    let mut sink = f.sink(json!({}), &bindings).await;
    sink.recover(&Recovery::default()).await.unwrap();
    let d1 = epoch(&mut sink, 1, &[(1, Some("a"), "U")]).await.unwrap();
    let intent2 = sink.checkpoint_artifact_intent(2).unwrap();
    stage(&mut sink, 2, &[(2, Some("b"), "U")]).await; // uploaded, never decided
    // An attempt whose intent never reached the log: found by the orphan sweep.
    stage(&mut sink, 3, &[(3, Some("c"), "U")]).await;
    drop(sink);
    let left = orphans(&f).await;
    assert_eq!(
        left.len(),
        2,
        "epochs 2 and 3 left a data file each: {left:?}"
    );
    assert!(
        left.iter()
            .all(|o| o.starts_with("s3://") && o.ends_with(".parquet"))
    );

    // The cleaner alone (no writer) removes what the intent names, and refuses a prefix
    // that is not this attempt's staging.
    let mut detached = IcebergSink::new(&f.endpoint(json!({}))).unwrap();
    detached.bind_runtime_context(common::context()).unwrap();
    let cleaner = detached.abort_cleaner().unwrap();
    let undecided = vec![Undecided {
        epoch: 2,
        intent: intent2,
    }];
    cleaner.clean(&undecided).await.unwrap();
    assert_eq!(orphans(&f).await.len(), 1, "epoch 3's file is left");
    let foreign = Undecided {
        epoch: 4,
        intent: json!({"prefixes": [f.bucket.as_ref().unwrap().url("warehouse")]}),
    };
    let err = cleaner.clean(&[foreign]).await.unwrap_err();
    assert!(matches!(err, SinkError::Corrupt(_)), "{err}");

    let mut sink = f.sink(json!({}), &bindings).await;
    sink.recover(&Recovery {
        decided: Some(Decided {
            epoch: 1,
            descriptor: d1,
        }),
        undecided,
        decided_applied: true,
        undecided_cleaned: true,
    })
    .await
    .unwrap();
    assert_eq!(
        orphans(&f).await,
        Vec::<String>::new(),
        "the sweep took epoch 3's"
    );
    epoch(&mut sink, 2, &[(2, Some("b"), "U")]).await.unwrap();
    let mut want = u(&[1], 1);
    want.extend(u(&[2], 2));
    assert_eq!(rows(&f, "events").await, want);
}

#[tokio::test]
async fn a_rolled_back_epoch_leaves_no_object_on_s3() {
    let f = Fixture::s3("rollback");
    let bindings = [binding("events")];
    let mut sink = f.sink(json!({}), &bindings).await;
    sink.recover(&Recovery::default()).await.unwrap();
    let before = keys(&f).await;
    sink.begin_epoch(1).await.unwrap();
    sink.write_batch(0, &batch(&[(1, Some("a"), "U")]))
        .await
        .unwrap();
    sink.pre_commit(1).await.unwrap().unwrap();
    assert!(
        keys(&f).await.len() > before.len(),
        "epoch 1 uploaded its file"
    );
    sink.rollback_epoch(1).await.unwrap();
    assert_eq!(keys(&f).await, before);
}

/// Metadata JSON, manifests and manifest lists are whole-object writes: a name written a
/// second time fails and the first object stays, so a snapshot's files never change.
#[tokio::test]
async fn an_object_is_never_overwritten() {
    let f = Fixture::s3("no-overwrite");
    let warehouse = f.warehouse_location().open().unwrap();
    let location = format!(
        "{}/sluice.db/t/metadata/00001-x.metadata.json",
        warehouse.root()
    );
    let file = warehouse.file_io().new_output(&location).unwrap();
    file.write("first".into()).await.unwrap();
    let err = file.write("second".into()).await.unwrap_err();
    assert!(err.to_string().contains("never overwritten"), "{err}");
    let read = warehouse
        .file_io()
        .new_input(&location)
        .unwrap()
        .read()
        .await;
    assert_eq!(read.unwrap(), "first");
    assert_eq!(
        warehouse.list(warehouse.root()).await.unwrap(),
        vec![location]
    );
}
