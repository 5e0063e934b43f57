//! The epoch lifecycle against a real catalog file and warehouse: commits, re-applied
//! decisions, the abort cleaner, and `commit_every`.

mod common;

use common::{Fixture, batch, binding, epoch, orphans, rows};
use serde_json::{Value, json};
use sluice_iceberg::IcebergSink;
use sluice_sink_sdk::{Decided, EpochSink, Recovery, SinkError, Undecided};

fn u(ids: &[i64], txn: i64) -> Vec<(i64, i64, String)> {
    ids.iter().map(|&i| (i, txn, "U".to_string())).collect()
}

/// Stages epoch `n` with `rows` on binding 0 and pre-commits it, never applying it:
/// returns its descriptor.
async fn stage(sink: &mut IcebergSink, n: u64, rows: &[(i64, Option<&str>, &str)]) -> Value {
    sink.begin_epoch(n).await.unwrap();
    sink.write_batch(0, &batch(rows)).await.unwrap();
    sink.pre_commit(n).await.unwrap().unwrap()
}

async fn snapshots(f: &Fixture, table: &str) -> Vec<std::collections::HashMap<String, String>> {
    use iceberg::Catalog;
    let c = sluice_iceberg::open_catalog(&f.catalog_path(), &f.warehouse())
        .await
        .unwrap();
    let t = c
        .load_table(&iceberg::TableIdent::from_strs(["sluice", table]).unwrap())
        .await
        .unwrap();
    let mut s: Vec<_> = t.metadata().snapshots().cloned().collect();
    s.sort_by_key(|s| s.sequence_number());
    s.iter()
        .map(|s| s.summary().additional_properties.clone())
        .collect()
}

#[tokio::test]
async fn three_epochs_commit_three_snapshots_of_their_rows() {
    let f = Fixture::new();
    let bindings = [binding("events")];
    let mut sink = f.sink(json!({}), &bindings).await;
    sink.recover(&Recovery::default()).await.unwrap();
    epoch(&mut sink, 1, &[(1, Some("a"), "U"), (2, Some("b"), "U")])
        .await
        .unwrap();
    epoch(&mut sink, 2, &[(3, None, "U")]).await.unwrap();
    epoch(&mut sink, 3, &[(1, Some("a2"), "U"), (2, None, "D")])
        .await
        .unwrap();
    sink.close().await.unwrap();

    let mut want = u(&[1, 2], 1);
    want.extend(u(&[3], 2));
    want.push((1, 3, "U".into()));
    want.push((2, 3, "D".into()));
    want.sort();
    assert_eq!(rows(&f, "events").await, want);
    let s = snapshots(&f, "events").await;
    assert_eq!(s.len(), 3);
    for (i, p) in s.iter().enumerate() {
        assert_eq!(p["sluice.txn"], (i + 1).to_string());
        assert_eq!(p["sluice.materialization"], "lake");
        assert_eq!(p["sluice.deployment"], "dep1");
    }
    assert_eq!(orphans(&f).await, Vec::<String>::new());
}

#[tokio::test]
async fn reopening_and_recovering_an_applied_decision_adds_nothing() {
    let f = Fixture::new();
    let bindings = [binding("events")];
    let mut sink = f.sink(json!({}), &bindings).await;
    sink.recover(&Recovery::default()).await.unwrap();
    epoch(&mut sink, 1, &[(1, Some("a"), "U")]).await.unwrap();
    let d2 = epoch(&mut sink, 2, &[(2, Some("b"), "U")]).await.unwrap();
    drop(sink); // a crash after the commit, before anything else

    let mut sink = f.sink(json!({}), &bindings).await;
    sink.recover(&Recovery {
        decided: Some(Decided {
            epoch: 2,
            descriptor: d2.clone(),
        }),
        undecided: vec![],
        ..Default::default()
    })
    .await
    .unwrap();
    // And applied once more, as commit_epoch may be after a crash.
    sink.commit_epoch(2, &d2).await.unwrap();
    let mut want = u(&[1], 1);
    want.extend(u(&[2], 2));
    assert_eq!(rows(&f, "events").await, want);
    assert_eq!(snapshots(&f, "events").await.len(), 2);

    epoch(&mut sink, 3, &[(3, None, "U")]).await.unwrap();
    want.extend(u(&[3], 3));
    assert_eq!(rows(&f, "events").await, want);
    assert_eq!(orphans(&f).await, Vec::<String>::new());
}

#[tokio::test]
async fn a_decision_never_applied_is_applied_by_recovery() {
    let f = Fixture::new();
    let bindings = [binding("events")];
    let mut sink = f.sink(json!({}), &bindings).await;
    sink.recover(&Recovery::default()).await.unwrap();
    let d1 = stage(&mut sink, 1, &[(7, Some("x"), "U")]).await;
    drop(sink); // the decision is durable, the commit never ran

    let mut sink = f.sink(json!({}), &bindings).await;
    sink.recover(&Recovery {
        decided: Some(Decided {
            epoch: 1,
            descriptor: d1,
        }),
        undecided: vec![],
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(rows(&f, "events").await, u(&[7], 1));
}

#[tokio::test]
async fn undecided_staging_is_removed_by_recovery() {
    let f = Fixture::new();
    let bindings = [binding("events")];
    let mut sink = f.sink(json!({}), &bindings).await;
    sink.recover(&Recovery::default()).await.unwrap();
    let d1 = epoch(&mut sink, 1, &[(1, Some("a"), "U")]).await.unwrap();
    let intent = sink.checkpoint_artifact_intent(2).unwrap();
    stage(&mut sink, 2, &[(2, Some("b"), "U")]).await; // staged, fsynced, never decided
    // An older attempt's leftover too: a file under our prefix nobody references.
    let intent3 = sink.checkpoint_artifact_intent(3).unwrap();
    stage(&mut sink, 3, &[(3, Some("c"), "U")]).await;
    drop(sink);
    assert_eq!(
        orphans(&f).await.len(),
        2,
        "epochs 2 and 3 left a staged file each"
    );
    let _ = intent3;

    let mut sink = f.sink(json!({}), &bindings).await;
    sink.recover(&Recovery {
        decided: Some(Decided {
            epoch: 1,
            descriptor: d1,
        }),
        // Only epoch 2's intent made it to the log; epoch 3's file is found by the sweep.
        undecided: vec![Undecided { epoch: 2, intent }],
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(orphans(&f).await, Vec::<String>::new());
    assert_eq!(rows(&f, "events").await, u(&[1], 1));

    // Epoch 2 runs again and commits normally.
    epoch(&mut sink, 2, &[(2, Some("b"), "U")]).await.unwrap();
    let mut want = u(&[1], 1);
    want.extend(u(&[2], 2));
    assert_eq!(rows(&f, "events").await, want);
}

#[tokio::test]
async fn rollback_discards_the_epoch_and_the_next_one_commits() {
    let f = Fixture::new();
    let bindings = [binding("events")];
    let mut sink = f.sink(json!({}), &bindings).await;
    sink.recover(&Recovery::default()).await.unwrap();
    sink.begin_epoch(1).await.unwrap();
    sink.write_batch(0, &batch(&[(1, Some("a"), "U")]))
        .await
        .unwrap();
    sink.rollback_epoch(1).await.unwrap();
    assert_eq!(orphans(&f).await, Vec::<String>::new());
    epoch(&mut sink, 1, &[(9, None, "U")]).await.unwrap();
    assert_eq!(rows(&f, "events").await, u(&[9], 1));
}

#[tokio::test]
async fn commit_every_three_makes_one_snapshot_per_three_epochs() {
    let f = Fixture::new();
    let bindings = [binding("events")];
    let mut sink = f.sink(json!({"commit_every": 3}), &bindings).await;
    sink.recover(&Recovery::default()).await.unwrap();
    let d1 = epoch(&mut sink, 1, &[(1, None, "U")]).await.unwrap();
    let d2 = epoch(&mut sink, 2, &[(2, None, "U")]).await.unwrap();
    assert_eq!(d1["commit"], false);
    assert_eq!(
        d2["epochs"].as_array().unwrap().len(),
        2,
        "cumulative: {d2}"
    );
    assert_eq!(
        rows(&f, "events").await,
        vec![],
        "nothing visible before epoch 3"
    );
    let d3 = epoch(&mut sink, 3, &[(3, None, "U")]).await.unwrap();
    assert_eq!(d3["commit"], true);
    let mut want = u(&[1], 1);
    want.extend(u(&[2], 2));
    want.extend(u(&[3], 3));
    assert_eq!(rows(&f, "events").await, want);
    let s = snapshots(&f, "events").await;
    assert_eq!(s.len(), 1);
    assert_eq!(s[0]["sluice.txn"], "3");

    // Epochs 4 and 5 are decided, then the process dies: recovery keeps them pending
    // (nothing is removed), and close commits them under epoch 5.
    epoch(&mut sink, 4, &[(4, None, "U")]).await.unwrap();
    let d5 = epoch(&mut sink, 5, &[(5, None, "U")]).await.unwrap();
    drop(sink);
    let mut sink = f.sink(json!({"commit_every": 3}), &bindings).await;
    sink.recover(&Recovery {
        decided: Some(Decided {
            epoch: 5,
            descriptor: d5.clone(),
        }),
        undecided: vec![],
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(rows(&f, "events").await, want, "4 and 5 are not due yet");
    assert_eq!(orphans(&f).await.len(), 2, "4 and 5 stay staged");
    sink.close().await.unwrap();
    want.extend(u(&[4], 4));
    want.extend(u(&[5], 5));
    assert_eq!(rows(&f, "events").await, want);
    assert_eq!(
        snapshots(&f, "events").await.last().unwrap()["sluice.txn"],
        "5"
    );

    // Re-applying 5's decision after that close adds nothing.
    let mut sink = f.sink(json!({"commit_every": 3}), &bindings).await;
    sink.recover(&Recovery {
        decided: Some(Decided {
            epoch: 5,
            descriptor: d5,
        }),
        undecided: vec![],
        ..Default::default()
    })
    .await
    .unwrap();
    sink.close().await.unwrap();
    assert_eq!(rows(&f, "events").await, want);
    assert_eq!(orphans(&f).await, Vec::<String>::new());
}

#[tokio::test]
async fn an_empty_epoch_stages_nothing_and_returns_no_descriptor() {
    let f = Fixture::new();
    let bindings = [binding("events")];
    let mut sink = f.sink(json!({}), &bindings).await;
    sink.recover(&Recovery::default()).await.unwrap();
    assert_eq!(epoch(&mut sink, 1, &[]).await, None);
    assert!(snapshots(&f, "events").await.is_empty());
}

#[tokio::test]
async fn files_roll_over_at_the_target_size() {
    let f = Fixture::new();
    let bindings = [binding("events")];
    let mut sink = f.sink(json!({"target_file_size": 65536}), &bindings).await;
    sink.recover(&Recovery::default()).await.unwrap();
    sink.begin_epoch(1).await.unwrap();
    let long = "x".repeat(1000);
    for chunk in 0..20 {
        let rows: Vec<(i64, Option<&str>, &str)> = (0..100)
            .map(|i| (chunk * 100 + i, Some(long.as_str()), "U"))
            .collect();
        sink.write_batch(0, &batch(&rows)).await.unwrap();
    }
    let d = sink.pre_commit(1).await.unwrap().unwrap();
    let files = d["epochs"][0]["files"].as_array().unwrap().len();
    assert!(
        files > 1,
        "one epoch of ~2 MB at 64 KiB a file made {files} file(s)"
    );
    sink.commit_epoch(1, &d).await.unwrap();
    assert_eq!(rows(&f, "events").await.len(), 2000);
}

#[tokio::test]
async fn schema_plans_create_then_add_a_column_and_refuse_a_type_change() {
    use sluice_sink_sdk::{DataType, Field, Schema};
    use std::sync::Arc;
    let f = Fixture::new();
    let mut sink = IcebergSink::new(&f.endpoint(json!({}))).unwrap();
    let plan = sink.resolve_schema(&[binding("events")]).await.unwrap();
    assert_eq!(plan.actions.len(), 1);
    assert!(
        plan.actions[0].starts_with("create Iceberg table sluice.events"),
        "{:?}",
        plan.actions
    );
    sink.prepare_schema(&plan).await.unwrap();
    sink.prepare_schema(&plan).await.unwrap(); // idempotent
    assert!(
        sink.resolve_schema(&[binding("events")])
            .await
            .unwrap()
            .actions
            .is_empty()
    );

    let mut wider = binding("events");
    let mut fields: Vec<Field> = wider
        .schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone())
        .collect();
    fields.insert(2, Field::new("score", DataType::Float64, true));
    wider.schema = Arc::new(Schema::new(fields.clone()));
    let plan = sink
        .resolve_schema(std::slice::from_ref(&wider))
        .await
        .unwrap();
    assert_eq!(
        plan.actions,
        vec!["add optional column score double to sluice.events".to_string()]
    );
    sink.prepare_schema(&plan).await.unwrap();
    sink.prepare_schema(&plan).await.unwrap();
    assert!(
        sink.resolve_schema(std::slice::from_ref(&wider))
            .await
            .unwrap()
            .actions
            .is_empty()
    );

    // The old binding (without score) still writes: score is optional.
    let mut old = f.sink(json!({}), &[binding("events")]).await;
    old.recover(&Recovery::default()).await.unwrap();
    epoch(&mut old, 1, &[(1, None, "U")]).await.unwrap();
    assert_eq!(rows(&f, "events").await, u(&[1], 1));

    let mut changed = binding("events");
    fields[0] = Field::new("id", DataType::Utf8, false);
    changed.schema = Arc::new(Schema::new(fields));
    let err = sink.resolve_schema(&[changed]).await.unwrap_err();
    assert!(
        matches!(&err, SinkError::Schema(m) if m.contains("\"id\"")),
        "{err}"
    );
}

/// A reset: the recovery log is removed and started over, so epochs are numbered from 1
/// again while the table keeps the older run's snapshots (`sluice.txn` up to 3, the
/// same deployment and materialization). The new log's generation is not the old
/// one's: none of its epochs is taken for committed, and rolling one back leaves the
/// old run's staging folders alone.
#[tokio::test]
async fn a_new_recovery_log_commits_every_epoch_though_an_older_run_numbered_them_higher() {
    let f = Fixture::new();
    let bindings = [binding("events")];
    let mut old = f.sink(json!({}), &bindings).await;
    old.recover(&Recovery::default()).await.unwrap();
    for n in 1..=3 {
        epoch(&mut old, n, &[(n as i64, Some("old"), "U")])
            .await
            .unwrap();
    }
    old.close().await.unwrap();
    drop(old);

    let mut new = f.sink(json!({}), &bindings).await;
    new.recover(&Recovery::default()).await.unwrap();
    epoch(&mut new, 1, &[(11, Some("new"), "U")]).await.unwrap();
    new.begin_epoch(2).await.unwrap();
    new.rollback_epoch(2).await.unwrap();
    epoch(&mut new, 2, &[(12, Some("new"), "U")]).await.unwrap();
    new.close().await.unwrap();

    let mut want = u(&[1], 1);
    want.extend(u(&[2], 2));
    want.extend(u(&[3], 3));
    want.extend(u(&[11], 1));
    want.extend(u(&[12], 2));
    want.sort();
    assert_eq!(
        rows(&f, "events").await,
        want,
        "every epoch of both runs, once"
    );
    let s = snapshots(&f, "events").await;
    let runs: Vec<(&str, &str)> = (s.iter())
        .map(|p| (p["sluice.generation"].as_str(), p["sluice.txn"].as_str()))
        .collect();
    assert_eq!(runs.len(), 5, "{runs:?}");
    let (first, second) = (runs[0].0, runs[3].0);
    assert_ne!(first, second, "a new log, a new generation");
    assert_eq!(
        runs,
        [
            (first, "1"),
            (first, "2"),
            (first, "3"),
            (second, "1"),
            (second, "2")
        ]
    );
    assert_eq!(orphans(&f).await, Vec::<String>::new());
}

/// The committer and the abort cleaner work from a sink that is only built and bound
/// (never opened): a decision whose commit never ran is applied once, and an undecided
/// epoch's staging is removed; the writer's recovery, told so, adds nothing more.
#[tokio::test]
async fn the_committer_and_cleaner_handles_work_without_the_writer() {
    let f = Fixture::new();
    let bindings = [binding("events")];
    let mut sink = f.sink(json!({}), &bindings).await;
    sink.recover(&Recovery::default()).await.unwrap();
    let d1 = stage(&mut sink, 1, &[(7, Some("x"), "U")]).await; // decided, never applied
    let intent = sink.checkpoint_artifact_intent(2).unwrap();
    stage(&mut sink, 2, &[(8, Some("y"), "U")]).await; // staged, never decided
    drop(sink);
    assert_eq!(orphans(&f).await.len(), 2);

    let mut detached = IcebergSink::new(&f.endpoint(json!({}))).unwrap();
    detached.bind_runtime_context(common::context()).unwrap();
    let undecided = vec![Undecided { epoch: 2, intent }];
    let cleaner = detached
        .abort_cleaner()
        .expect("the Iceberg sink has a cleaner");
    cleaner.clean(&undecided).await.unwrap();
    let committer = detached
        .committer()
        .expect("the Iceberg sink has a committer");
    committer.commit_epoch(1, &d1).await.unwrap();
    committer.commit_epoch(1, &d1).await.unwrap(); // idempotent
    assert_eq!(rows(&f, "events").await, u(&[7], 1));
    assert_eq!(orphans(&f).await, Vec::<String>::new());
    assert_eq!(snapshots(&f, "events").await.len(), 1);

    // A foreign prefix is refused, never removed.
    let foreign = Undecided {
        epoch: 3,
        intent: json!({"prefixes": [format!("file://{}", f.warehouse().display())]}),
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
    epoch(&mut sink, 2, &[(8, Some("y"), "U")]).await.unwrap();
    let mut want = u(&[7], 1);
    want.extend(u(&[8], 2));
    assert_eq!(rows(&f, "events").await, want);
    assert_eq!(snapshots(&f, "events").await.len(), 2);
}

/// Every staging writer runs on the sink's tracker, and a sink dropped mid-epoch (as a
/// retired one is) leaves no writer running once the tracker is awaited.
#[tokio::test]
async fn a_dropped_sinks_writers_end_on_its_tracker() {
    let f = Fixture::new();
    let bindings = [binding("events")];
    let mut sink = f.sink(json!({}), &bindings).await;
    sink.recover(&Recovery::default()).await.unwrap();
    let tracker = sink
        .terminal_task_tracker()
        .expect("the Iceberg sink tracks its tasks");
    sink.begin_epoch(1).await.unwrap();
    sink.write_batch(0, &batch(&[(1, Some("a"), "U")]))
        .await
        .unwrap();
    assert_eq!(tracker.live(), 1, "one writer task for the binding");
    drop(sink);
    tracker
        .wait(std::time::Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(tracker.live(), 0);
}
