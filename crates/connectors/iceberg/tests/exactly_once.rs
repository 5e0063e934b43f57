//! Exactly once against what others do to the table: another writer's snapshots on top
//! of ours, a table we did not make, staged files that vanished.

mod common;

use common::{Fixture, binding, context, epoch, rows};
use iceberg::Catalog;
use serde_json::json;
use sluice_iceberg::IcebergSink;
use sluice_sink_sdk::{Decided, EpochSink, Recovery, RuntimeContext, SinkError};

#[tokio::test]
async fn a_decision_under_another_writers_snapshot_is_still_found_in_the_ancestry() {
    let f = Fixture::new();
    let bindings = [binding("events")];
    let mut ours = f.sink(json!({}), &bindings).await;
    ours.recover(&Recovery::default()).await.unwrap();
    let d1 = epoch(&mut ours, 1, &[(1, Some("a"), "U")]).await.unwrap();

    // Another materialization appends on top: our snapshot is now an ancestor.
    let mut other = IcebergSink::new(&f.endpoint(json!({}))).unwrap();
    other
        .bind_runtime_context(RuntimeContext {
            sink_id: "other".into(),
            ..context()
        })
        .unwrap();
    other.open(&bindings).await.unwrap();
    other.recover(&Recovery::default()).await.unwrap();
    epoch(&mut other, 1, &[(100, None, "U")]).await.unwrap();

    // Re-applying our epoch 1 (a restart) must not append it again.
    let mut again = f.sink(json!({}), &bindings).await;
    again
        .recover(&Recovery {
            decided: Some(Decided {
                epoch: 1,
                descriptor: d1.clone(),
            }),
            undecided: vec![],
            ..Default::default()
        })
        .await
        .unwrap();
    again.commit_epoch(1, &d1).await.unwrap();
    assert_eq!(
        rows(&f, "events").await,
        vec![(1, 1, "U".into()), (100, 1, "U".into())]
    );
}

#[tokio::test]
async fn a_table_without_the_sinks_columns_is_corrupt_not_adopted() {
    let f = Fixture::new();
    let catalog = sluice_iceberg::open_catalog(&f.catalog_path(), &f.warehouse())
        .await
        .unwrap();
    let ns = iceberg::NamespaceIdent::new("sluice".into());
    catalog
        .create_namespace(&ns, Default::default())
        .await
        .unwrap();
    let schema = iceberg::spec::Schema::builder()
        .with_fields(vec![
            iceberg::spec::NestedField::required(
                1,
                "id",
                iceberg::spec::Type::Primitive(iceberg::spec::PrimitiveType::Long),
            )
            .into(),
        ])
        .build()
        .unwrap();
    catalog
        .create_table(
            &ns,
            iceberg::TableCreation::builder()
                .name("events".into())
                .schema(schema)
                .build(),
        )
        .await
        .unwrap();
    let mut sink = IcebergSink::new(&f.endpoint(json!({}))).unwrap();
    let err = sink.resolve_schema(&[binding("events")]).await.unwrap_err();
    assert!(
        matches!(&err, SinkError::Corrupt(m) if m.contains("_txn")),
        "{err}"
    );
}

#[tokio::test]
async fn a_decided_epoch_whose_staged_files_vanished_is_corrupt() {
    let f = Fixture::new();
    let bindings = [binding("events")];
    let mut sink = f.sink(json!({}), &bindings).await;
    sink.recover(&Recovery::default()).await.unwrap();
    sink.begin_epoch(1).await.unwrap();
    sink.write_batch(0, &common::batch(&[(1, None, "U")]))
        .await
        .unwrap();
    let d = sink.pre_commit(1).await.unwrap().unwrap();
    for file in d["epochs"][0]["files"].as_array().unwrap() {
        let path = file["path"]
            .as_str()
            .unwrap()
            .strip_prefix("file://")
            .unwrap();
        std::fs::remove_file(path).unwrap();
    }
    let err = sink.commit_epoch(1, &d).await.unwrap_err();
    assert!(
        matches!(&err, SinkError::Corrupt(m) if m.contains("gone")),
        "{err}"
    );
    assert!(!err.is_retryable());
}

#[tokio::test]
async fn a_descriptor_of_another_materialization_is_refused() {
    let f = Fixture::new();
    let bindings = [binding("events")];
    let mut sink = f.sink(json!({}), &bindings).await;
    sink.recover(&Recovery::default()).await.unwrap();
    let mut d = epoch(&mut sink, 1, &[(1, None, "U")]).await.unwrap();
    d["materialization"] = json!("someone-else");
    let err = sink.commit_epoch(1, &d).await.unwrap_err();
    assert!(matches!(err, SinkError::Corrupt(_)), "{err}");
}

#[tokio::test]
async fn two_bindings_commit_to_two_tables_and_a_half_applied_decision_finishes_once() {
    let f = Fixture::new();
    let bindings = [binding("a"), binding("b")];
    let mut sink = f.sink(json!({}), &bindings).await;
    sink.recover(&Recovery::default()).await.unwrap();
    sink.begin_epoch(1).await.unwrap();
    sink.write_batch(0, &common::batch(&[(1, None, "U")]))
        .await
        .unwrap();
    sink.write_batch(1, &common::batch(&[(2, None, "U")]))
        .await
        .unwrap();
    let d = sink.pre_commit(1).await.unwrap().unwrap();
    // A crash after table `a` took the commit and before `b` did.
    let owner = sluice_iceberg::commit::Owner {
        deployment: "dep1".into(),
        materialization: "lake".into(),
    };
    let desc = sluice_iceberg::commit::Descriptor::parse(&d, &owner).unwrap();
    let catalog = sluice_iceberg::open_catalog(&f.catalog_path(), &f.warehouse())
        .await
        .unwrap();
    let a = iceberg::TableIdent::from_strs(["sluice", "a"]).unwrap();
    assert!(
        sluice_iceberg::commit::commit_table(
            &catalog,
            &a,
            &owner,
            desc.generation.as_ref().unwrap(),
            1,
            &desc.epochs,
            None,
        )
        .await
        .unwrap()
        .added
    );
    drop(sink);

    let mut sink = f.sink(json!({}), &bindings).await;
    sink.recover(&Recovery {
        decided: Some(Decided {
            epoch: 1,
            descriptor: d,
        }),
        undecided: vec![],
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(rows(&f, "a").await, vec![(1, 1, "U".into())]);
    assert_eq!(rows(&f, "b").await, vec![(2, 1, "U".into())]);
    assert_eq!(common::orphans(&f).await, Vec::<String>::new());
}

#[tokio::test]
async fn an_expired_ancestor_fails_closed_instead_of_appending_twice() {
    let f = Fixture::new();
    let bindings = [binding("events")];
    let mut ours = f.sink(json!({}), &bindings).await;
    ours.recover(&Recovery::default()).await.unwrap();
    let d1 = epoch(&mut ours, 1, &[(1, Some("a"), "U")]).await.unwrap();
    let mut other = IcebergSink::new(&f.endpoint(json!({}))).unwrap();
    other
        .bind_runtime_context(RuntimeContext {
            sink_id: "other".into(),
            ..context()
        })
        .unwrap();
    other.open(&bindings).await.unwrap();
    other.recover(&Recovery::default()).await.unwrap();
    epoch(&mut other, 1, &[(100, None, "U")]).await.unwrap();

    // Maintenance expires our snapshot: its files live on in the other's manifests.
    let catalog = sluice_iceberg::open_catalog(&f.catalog_path(), &f.warehouse())
        .await
        .unwrap();
    let ident = iceberg::TableIdent::from_strs(["sluice", "events"]).unwrap();
    let table = catalog.load_table(&ident).await.unwrap();
    let ours_id = table
        .metadata()
        .snapshots()
        .find(|s| {
            s.summary()
                .additional_properties
                .get("sluice.materialization")
                .map(String::as_str)
                == Some("lake")
        })
        .unwrap()
        .snapshot_id();
    let tx = iceberg::transaction::Transaction::new(&table);
    use iceberg::transaction::ApplyTransactionAction;
    let tx = tx
        .expire_snapshots()
        .expire_snapshot_ids([ours_id])
        .apply(tx)
        .unwrap();
    tx.commit(&catalog).await.unwrap();

    // The sink knows the table held its epoch 1: it refuses a table that lost it.
    let err = ours.commit_epoch(1, &d1).await.unwrap_err();
    assert!(
        matches!(&err, SinkError::Config(m) if m.contains("holds transactions up to none")
            && m.contains("expired")),
        "{err}"
    );
    // Without that mark (d1 was made before any commit), iceberg's own check stops it.
    let committer = ours.committer().unwrap();
    let err = committer.commit_epoch(1, &d1).await.unwrap_err();
    assert!(
        matches!(&err, SinkError::Corrupt(m) if m.contains("already holds")),
        "{err}"
    );
    assert_eq!(
        rows(&f, "events").await,
        vec![(1, 1, "U".into()), (100, 1, "U".into())]
    );
}
