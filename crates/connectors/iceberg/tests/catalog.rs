//! The SQLite catalog on its own: namespaces, tables, loads, and the compare-and-swap
//! that makes a lost commit a conflict.

use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
use iceberg::transaction::{ApplyTransactionAction, Transaction};
use iceberg::{Catalog, ErrorKind, NamespaceIdent, TableCreation, TableIdent};
use sluice_iceberg::SqlCatalog;
use std::collections::HashMap;

async fn catalog(dir: &tempfile::TempDir) -> SqlCatalog {
    SqlCatalog::open(&dir.path().join("c.db"), &dir.path().join("wh"))
        .await
        .unwrap()
}

fn creation(name: &str) -> TableCreation {
    TableCreation::builder()
        .name(name.into())
        .schema(
            Schema::builder()
                .with_fields(vec![
                    NestedField::required(1, "id", Type::Primitive(PrimitiveType::Long)).into(),
                ])
                .build()
                .unwrap(),
        )
        .build()
}

#[tokio::test]
async fn namespaces_are_created_listed_and_refused_twice() {
    let dir = tempfile::tempdir().unwrap();
    let c = catalog(&dir).await;
    let ns = NamespaceIdent::new("lake".into());
    assert!(!c.namespace_exists(&ns).await.unwrap());
    c.create_namespace(&ns, HashMap::from([("owner".into(), "me".into())]))
        .await
        .unwrap();
    assert!(c.namespace_exists(&ns).await.unwrap());
    assert_eq!(
        c.get_namespace(&ns).await.unwrap().properties()["owner"],
        "me"
    );
    let err = c.create_namespace(&ns, HashMap::new()).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NamespaceAlreadyExists);
    c.create_namespace(
        &NamespaceIdent::from_strs(["lake", "raw"]).unwrap(),
        HashMap::new(),
    )
    .await
    .unwrap();
    assert_eq!(c.list_namespaces(None).await.unwrap(), vec![ns.clone()]);
    assert_eq!(
        c.list_namespaces(Some(&ns)).await.unwrap(),
        vec![NamespaceIdent::from_strs(["lake", "raw"]).unwrap()]
    );
}

#[tokio::test]
async fn a_created_table_loads_back_from_a_second_catalog_on_the_same_file() {
    let dir = tempfile::tempdir().unwrap();
    let c = catalog(&dir).await;
    let ns = NamespaceIdent::new("lake".into());
    c.create_namespace(&ns, HashMap::new()).await.unwrap();
    let created = c.create_table(&ns, creation("t")).await.unwrap();
    let ident = TableIdent::new(ns.clone(), "t".into());
    assert!(c.table_exists(&ident).await.unwrap());
    let err = c.create_table(&ns, creation("t")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::TableAlreadyExists);

    let other = catalog(&dir).await;
    let loaded = other.load_table(&ident).await.unwrap();
    assert_eq!(loaded.metadata_location(), created.metadata_location());
    assert_eq!(
        loaded.metadata().current_schema().as_struct(),
        created.metadata().current_schema().as_struct()
    );
    assert!(
        loaded.metadata().location().ends_with("/wh/lake.db/t"),
        "{}",
        loaded.metadata().location()
    );
    assert_eq!(other.list_tables(&ns).await.unwrap(), vec![ident.clone()]);

    let missing = TableIdent::new(ns, "nope".into());
    assert_eq!(
        other.load_table(&missing).await.unwrap_err().kind(),
        ErrorKind::TableNotFound
    );
}

#[tokio::test]
async fn a_commit_swaps_the_metadata_location_and_keeps_the_previous_one() {
    let dir = tempfile::tempdir().unwrap();
    let c = catalog(&dir).await;
    let ns = NamespaceIdent::new("lake".into());
    c.create_namespace(&ns, HashMap::new()).await.unwrap();
    let t0 = c.create_table(&ns, creation("t")).await.unwrap();
    let tx = Transaction::new(&t0);
    let tx = tx
        .update_table_properties()
        .set("k".into(), "v".into())
        .apply(tx)
        .unwrap();
    let t1 = tx.commit(&c).await.unwrap();
    assert_ne!(t1.metadata_location(), t0.metadata_location());
    let conn = rusqlite_row(&dir);
    assert_eq!(conn.0.as_deref(), t1.metadata_location());
    assert_eq!(conn.1.as_deref(), t0.metadata_location());
}

fn rusqlite_row(dir: &tempfile::TempDir) -> (Option<String>, Option<String>) {
    let conn = rusqlite::Connection::open(dir.path().join("c.db")).unwrap();
    conn.query_row(
        "SELECT metadata_location, previous_metadata_location FROM iceberg_tables WHERE table_name = 't'",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .unwrap()
}

#[tokio::test]
async fn a_commit_on_a_stale_pinned_base_is_a_conflict_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let c = catalog(&dir).await;
    let ns = NamespaceIdent::new("lake".into());
    c.create_namespace(&ns, HashMap::new()).await.unwrap();
    let t0 = c.create_table(&ns, creation("t")).await.unwrap();
    let stale = t0.metadata_location().unwrap().to_string();

    // Another writer moves the table on.
    let tx = Transaction::new(&t0);
    let tx = tx
        .update_table_properties()
        .set("a".into(), "1".into())
        .apply(tx)
        .unwrap();
    let t1 = tx.commit(&c).await.unwrap();

    // A commit pinned to the old location loses the swap, and is not retried.
    let tx = Transaction::new(&t1);
    let tx = tx
        .update_table_properties()
        .set("b".into(), "2".into())
        .apply(tx)
        .unwrap();
    let err = tx.commit(&c.pinned(&stale)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CatalogCommitConflicts);
    assert!(!err.retryable());
    assert_eq!(rusqlite_row(&dir).0.as_deref(), t1.metadata_location());
    let now = c.load_table(t1.identifier()).await.unwrap();
    assert!(!now.metadata().properties().contains_key("b"));
}

#[tokio::test]
async fn the_swap_itself_refuses_a_base_that_moved_underneath() {
    // The raw compare-and-swap, racing a writer that changes the row between the load
    // and the update (simulated by changing the row by hand).
    let dir = tempfile::tempdir().unwrap();
    let c = catalog(&dir).await;
    let ns = NamespaceIdent::new("lake".into());
    c.create_namespace(&ns, HashMap::new()).await.unwrap();
    let t0 = c.create_table(&ns, creation("t")).await.unwrap();
    let tx = Transaction::new(&t0);
    let tx = tx
        .update_table_properties()
        .set("a".into(), "1".into())
        .apply(tx)
        .unwrap();
    let t1 = tx.commit(&c).await.unwrap();
    // Point the row back at t0's file: a pinned commit from t1 must now fail.
    let conn = rusqlite::Connection::open(dir.path().join("c.db")).unwrap();
    conn.execute(
        "UPDATE iceberg_tables SET metadata_location = ?1",
        [t0.metadata_location().unwrap()],
    )
    .unwrap();
    let tx = Transaction::new(&t1);
    let tx = tx
        .update_table_properties()
        .set("b".into(), "2".into())
        .apply(tx)
        .unwrap();
    let err = tx
        .commit(&c.pinned(t1.metadata_location().unwrap()))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::CatalogCommitConflicts);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_racing_on_separate_connections_lose_no_update() {
    // Each writer commits 15 properties through its own connection to the same file;
    // a lost swap retries from the new base. Without the compare-and-swap, one writer's
    // metadata would overwrite the other's and keys would go missing.
    let dir = tempfile::tempdir().unwrap();
    let c = catalog(&dir).await;
    let ns = NamespaceIdent::new("lake".into());
    c.create_namespace(&ns, HashMap::new()).await.unwrap();
    c.create_table(&ns, creation("t")).await.unwrap();
    let ident = TableIdent::new(ns, "t".into());
    let mut tasks = Vec::new();
    for writer in ["a", "b"] {
        let c = catalog(&dir).await;
        let ident = ident.clone();
        tasks.push(tokio::spawn(async move {
            let mut conflicts = 0;
            for i in 0..15 {
                loop {
                    let table = c.load_table(&ident).await.unwrap();
                    let tx = Transaction::new(&table);
                    let tx = tx
                        .update_table_properties()
                        .set(format!("{writer}{i}"), "1".into())
                        .apply(tx)
                        .unwrap();
                    let pinned = c.pinned(table.metadata_location().unwrap());
                    match tx.commit(&pinned).await {
                        Ok(_) => break,
                        Err(e) if e.kind() == ErrorKind::CatalogCommitConflicts => conflicts += 1,
                        Err(e) => panic!("{e}"),
                    }
                }
            }
            conflicts
        }));
    }
    let mut conflicts = 0;
    for t in tasks {
        conflicts += t.await.unwrap();
    }
    eprintln!("{conflicts} swaps lost and retried");
    let table = c.load_table(&ident).await.unwrap();
    for writer in ["a", "b"] {
        for i in 0..15 {
            assert!(
                table
                    .metadata()
                    .properties()
                    .contains_key(&format!("{writer}{i}")),
                "{writer}{i} lost"
            );
        }
    }
}
