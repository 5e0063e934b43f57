//! `mode: upsert` against a reference model (a `BTreeMap` of key → name): keys inserted,
//! updated and deleted across epochs, read back by pyiceberg (position deletes applied)
//! as one row per live key, and by Load as each live key's document; restarts between
//! epochs, a lost index, and a crash after the decision but before the table commit
//! (the descriptor applied again at start, by the committer or by `recover`) change
//! nothing.
//!
//! Needs `python3` with `pyiceberg[sql-sqlite,pyarrow]` (`.ci/services` installs it).

mod common;

use common::upsert::{self, Model, apply, batch, binding, decide, epoch, pyiceberg_view, sink};
use common::{Fixture, context};
use serde_json::json;
use sluice_iceberg::IcebergSink;
use sluice_sink_sdk::{Decided, EpochSink, Recovery};

/// A change of the tests' constant epochs.
type Change = upsert::Change<&'static str>;

const EPOCHS: [&[Change]; 3] = [
    &[
        (1, Some("a")),
        (2, Some("b")),
        (3, Some("c")),
        (4, Some("d")),
        (5, Some("e")),
    ],
    &[(2, Some("b2")), (3, Some("c2")), (4, None), (9, None)],
    &[(2, Some("b3")), (6, Some("f")), (1, None), (4, Some("d2"))],
];

#[tokio::test]
async fn upserts_updates_and_deletes_read_back_as_the_view() {
    let f = Fixture::new();
    let state = f.dir.path().join("state");
    let mut s = sink(&f, &state).await;
    s.recover(&Recovery::default()).await.unwrap();
    let mut model = Model::new();
    for (i, changes) in EPOCHS.iter().enumerate() {
        epoch(&mut s, i as u64 + 1, changes).await;
        apply(&mut model, changes);
        assert_eq!(pyiceberg_view(&f), model, "after epoch {}", i + 1);
        assert_eq!(
            upsert::loaded(&mut s, 0..10).await,
            model,
            "Load after epoch {}",
            i + 1
        );
    }
    // The deletes are position deletes, in the snapshots that replaced the rows.
    let snapshots =
        sluice_iceberg::pyiceberg_read(&f.catalog_path(), &f.warehouse(), "sluice.views", true)
            .unwrap();
    assert_eq!(snapshots.len(), 3, "{snapshots:?}");
    assert_eq!(snapshots[1]["operation"], "overwrite", "{snapshots:?}");
    assert_eq!(snapshots[2]["sluice.txn"], "3", "{snapshots:?}");
}

#[tokio::test]
async fn a_restart_between_epochs_or_a_lost_index_changes_nothing() {
    let f = Fixture::new();
    let state = f.dir.path().join("state");
    let mut model = Model::new();
    let mut decided: Option<Decided> = None;
    for (i, changes) in EPOCHS.iter().enumerate() {
        let n = i as u64 + 1;
        if n == 3 {
            // The index is derived state: without it, the next start rebuilds it.
            std::fs::remove_dir_all(&state).unwrap();
        }
        let mut s = sink(&f, &state).await;
        let recovery = Recovery {
            decided: decided.clone(),
            ..Default::default()
        };
        s.recover(&recovery).await.unwrap();
        assert_eq!(
            upsert::loaded(&mut s, 0..10).await,
            model,
            "Load at the start of epoch {n}"
        );
        let descriptor = epoch(&mut s, n, changes).await;
        decided = Some(Decided {
            epoch: n,
            descriptor,
        });
        apply(&mut model, changes);
        s.close().await.unwrap();
    }
    assert_eq!(pyiceberg_view(&f), model);
}

#[tokio::test]
async fn a_crash_after_the_decision_before_the_table_commit_changes_nothing() {
    // Recovery applies the decided descriptor through the committer (before `open`), or
    // through `recover`; either way the index rolls forward to the table.
    for by_committer in [false, true] {
        let f = Fixture::new();
        let state = f.dir.path().join("state");
        let mut s = sink(&f, &state).await;
        s.recover(&Recovery::default()).await.unwrap();
        let mut model = Model::new();
        let d1 = epoch(&mut s, 1, EPOCHS[0]).await;
        apply(&mut model, EPOCHS[0]);
        let d2 = decide(&mut s, 2, EPOCHS[1]).await;
        drop(s); // the crash: epoch 2 decided, not in the table

        let decided = Decided {
            epoch: 2,
            descriptor: d2,
        };
        let mut s = IcebergSink::new(&f.endpoint(json!({}))).unwrap();
        s.bind_runtime_context(context()).unwrap();
        s.bind_state_dir(&state).unwrap();
        if by_committer {
            let committer = s.committer().unwrap();
            committer
                .commit_epoch(2, &decided.descriptor)
                .await
                .unwrap();
            // Applied again: still once.
            committer
                .commit_epoch(2, &decided.descriptor)
                .await
                .unwrap();
        }
        s.open(&[binding()]).await.unwrap();
        let recovery = Recovery {
            decided: Some(decided),
            decided_applied: by_committer,
            ..Default::default()
        };
        s.recover(&recovery).await.unwrap();
        apply(&mut model, EPOCHS[1]);
        assert_eq!(pyiceberg_view(&f), model, "by committer: {by_committer}");
        assert_eq!(
            upsert::loaded(&mut s, 0..10).await,
            model,
            "by committer: {by_committer}"
        );
        // Epoch 1's descriptor applied again (a log replayed further back) is a no-op.
        s.commit_epoch(1, &d1).await.unwrap();
        epoch(&mut s, 3, EPOCHS[2]).await;
        apply(&mut model, EPOCHS[2]);
        assert_eq!(pyiceberg_view(&f), model, "by committer: {by_committer}");
        assert_eq!(
            upsert::loaded(&mut s, 0..10).await,
            model,
            "by committer: {by_committer}"
        );
    }
}

#[tokio::test]
async fn an_upsert_table_refuses_what_it_cannot_keep_exact() {
    let f = Fixture::new();
    let state = f.dir.path().join("state");
    // commit_every > 1: the index must match the table after every epoch.
    let mut s = IcebergSink::new(&f.endpoint(json!({"commit_every": 2}))).unwrap();
    s.bind_runtime_context(context()).unwrap();
    s.bind_state_dir(&state).unwrap();
    let plan = s.resolve_schema(&[binding()]).await.unwrap();
    s.prepare_schema(&plan).await.unwrap();
    let err = s.open(&[binding()]).await.unwrap_err().to_string();
    assert!(err.contains("commit_every: 1"), "{err}");

    // A key twice in one epoch.
    let mut s = sink(&f, &state).await;
    s.recover(&Recovery::default()).await.unwrap();
    s.begin_epoch(1).await.unwrap();
    let err = s
        .write_batch(0, &batch(&[(1, Some("a")), (1, Some("b"))]))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("twice in one transaction"), "{err}");

    // Upsert bindings are standard (loaded) and apply keyed mutations by their key.
    assert!(
        s.loads(&json!({"table": "views", "mode": "upsert"}))
            .unwrap()
    );
    assert!(!s.loads(&json!({"table": "views"})).unwrap());
    assert_eq!(
        s.keyed_mutation_key(&binding()),
        Some(vec!["id".to_string()])
    );
    let mut changelog = binding();
    changelog.resource = json!({"table": "views"});
    assert_eq!(s.keyed_mutation_key(&changelog), None);
}
