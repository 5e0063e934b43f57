//! Full Transactions streams through the SDK's in-process endpoint and client, against
//! real SQLite files: stores, loads, checkpoints, fencing, key-range splits, delta updates.

mod common;

use common::{DRIVER, endpoint};
use rusqlite::Connection;
use serde_json::{Value, json};
use sluice_driver::Error;
use sluice_driver::testing::{binding, binding_keyed, load, spec, store, view};
use std::path::Path;

const ALL: u32 = u32::MAX;

fn query<T: rusqlite::types::FromSql>(db: &Path, sql: &str) -> Vec<T> {
    let conn = Connection::open(db).unwrap();
    let mut stmt = conn.prepare(sql).unwrap();
    stmt.query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn sorted(mut docs: Vec<Value>) -> Vec<Value> {
    docs.sort_by_key(|d| d.to_string());
    docs
}

#[tokio::test(flavor = "multi_thread")]
async fn committed_stores_are_loaded_by_the_next_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("views.db");
    let spec = spec(&endpoint(&db), vec![binding("pageviews", false)]);
    DRIVER.apply(&spec).await;
    let (mut session, recovered) = DRIVER.session(&spec, 0, ALL).await.unwrap();
    assert!(recovered.is_empty(), "a fresh store has no checkpoint");

    let stores = vec![store(
        0,
        &["/user_id"],
        &[(view("alice", 1), false), (view("bob", 1), false)],
    )];
    session.transaction(vec![], b"cp-1", stores).await.unwrap();

    let keys = [json!(["alice"]), json!(["carol"])];
    let updated = store(0, &["/user_id"], &[(view("alice", 2), true)]);
    let loaded = session
        .transaction(vec![load(0, &keys)], b"cp-2", vec![updated])
        .await
        .unwrap();
    assert_eq!(loaded, [view("alice", 1)], "found keys only");

    let loaded = session
        .transaction(vec![load(0, &keys)], b"cp-3", vec![])
        .await
        .unwrap();
    assert_eq!(loaded, [view("alice", 2)], "loads read the prior commit");

    let rows: Vec<String> = query(
        &db,
        "SELECT json_array(user_id, views, score, active, tags, typeof(views)) FROM pageviews ORDER BY user_id",
    );
    assert_eq!(
        rows,
        [
            r#"["alice",2,1.5,1,"[\"a\",\"b\"]","integer"]"#,
            r#"["bob",1,1.5,1,"[\"a\",\"b\"]","integer"]"#
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn loads_of_many_keys_span_several_statements() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("views.db");
    let spec = spec(&endpoint(&db), vec![binding("pageviews", false)]);
    DRIVER.apply(&spec).await;
    let (mut session, _) = DRIVER.session(&spec, 0, ALL).await.unwrap();
    let docs: Vec<(Value, bool)> = (0..1000)
        .map(|i| (view(&format!("u{i}"), i), false))
        .collect();
    session
        .transaction(vec![], b"cp-1", vec![store(0, &["/user_id"], &docs)])
        .await
        .unwrap();
    let keys: Vec<Value> = (0..1010).map(|i| json!([format!("u{i}")])).collect();
    let loaded = session
        .transaction(vec![load(0, &keys)], b"cp-2", vec![])
        .await
        .unwrap();
    let want: Vec<Value> = docs.into_iter().map(|(d, _)| d).collect();
    assert_eq!(sorted(loaded), sorted(want));
}

#[tokio::test(flavor = "multi_thread")]
async fn composite_keys_are_stored_and_loaded() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("views.db");
    let spec = spec(
        &endpoint(&db),
        vec![binding_keyed("daily", false, &["user_id", "day"])],
    );
    DRIVER.apply(&spec).await;
    let (mut session, _) = DRIVER.session(&spec, 0, ALL).await.unwrap();
    let doc = |day: i64, views: i64| json!({"user_id": "alice", "day": day, "views": views});
    let ptrs = ["/user_id", "/day"];
    let docs = [(doc(1, 10), false), (doc(2, 20), false)];
    session
        .transaction(vec![], b"cp-1", vec![store(0, &ptrs, &docs)])
        .await
        .unwrap();
    let keys = [json!(["alice", 2]), json!(["alice", 3]), json!(["bob", 1])];
    let loaded = session
        .transaction(vec![load(0, &keys)], b"cp-2", vec![])
        .await
        .unwrap();
    assert_eq!(loaded, [doc(2, 20)]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_null_document_deletes_its_row() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("views.db");
    let spec = spec(&endpoint(&db), vec![binding("pageviews", false)]);
    DRIVER.apply(&spec).await;
    let (mut session, _) = DRIVER.session(&spec, 0, ALL).await.unwrap();
    let docs = [(view("alice", 1), false), (view("bob", 1), false)];
    session
        .transaction(vec![], b"cp-1", vec![store(0, &["/user_id"], &docs)])
        .await
        .unwrap();
    let tombstone = store(0, &["/user_id"], &[(json!({"key": ["alice"]}), true)]);
    session
        .transaction(vec![], b"cp-2", vec![tombstone])
        .await
        .unwrap();
    let users: Vec<String> = query(&db, "SELECT user_id FROM pageviews");
    assert_eq!(users, ["bob"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn reopening_recovers_the_last_committed_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("views.db");
    let spec = spec(&endpoint(&db), vec![binding("pageviews", false)]);
    DRIVER.apply(&spec).await;
    let (mut session, _) = DRIVER.session(&spec, 0, ALL).await.unwrap();
    session.transaction(vec![], b"cp-1", vec![]).await.unwrap();
    session.transaction(vec![], b"cp-2", vec![]).await.unwrap();
    drop(session);
    let (_, recovered) = DRIVER.session(&spec, 0, ALL).await.unwrap();
    assert_eq!(recovered, b"cp-2");
}

#[tokio::test(flavor = "multi_thread")]
async fn zombie_commit_after_newer_open_is_rejected_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("views.db");
    let spec = spec(&endpoint(&db), vec![binding("pageviews", false)]);
    DRIVER.apply(&spec).await;
    let (mut zombie, _) = DRIVER.session(&spec, 0, ALL).await.unwrap();
    zombie.transaction(vec![], b"cp-1", vec![]).await.unwrap();

    let (mut newer, recovered) = DRIVER.session(&spec, 0, ALL).await.unwrap();
    assert_eq!(recovered, b"cp-1");
    let stores = vec![store(0, &["/user_id"], &[(view("dave", 1), false)])];
    let err = zombie
        .transaction(vec![], b"cp-zombie", stores)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Fenced(_)), "{err}");
    assert!(query::<String>(&db, "SELECT user_id FROM pageviews").is_empty());

    // The newer instance commits and still sees its own checkpoint lineage.
    newer.transaction(vec![], b"cp-2", vec![]).await.unwrap();
    drop(newer);
    let (_, recovered) = DRIVER.session(&spec, 0, ALL).await.unwrap();
    assert_eq!(recovered, b"cp-2");
}

#[tokio::test(flavor = "multi_thread")]
async fn split_ranges_resume_from_the_parent_and_fence_it() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("views.db");
    let spec = spec(&endpoint(&db), vec![binding("pageviews", false)]);
    DRIVER.apply(&spec).await;
    let (mut parent, _) = DRIVER.session(&spec, 0, ALL).await.unwrap();
    parent
        .transaction(vec![], b"cp-parent", vec![])
        .await
        .unwrap();

    let mid = 0x8000_0000;
    let (mut left, recovered) = DRIVER.session(&spec, 0, mid - 1).await.unwrap();
    assert_eq!(recovered, b"cp-parent");
    let err = parent
        .transaction(vec![], b"cp-zombie", vec![])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Fenced(_)), "{err}");

    left.transaction(vec![], b"cp-left", vec![]).await.unwrap();
    let (_, recovered) = DRIVER.session(&spec, mid, ALL).await.unwrap();
    assert_eq!(
        recovered, b"cp-parent",
        "the right half resumes from the parent"
    );
    drop(left);
    let (_, recovered) = DRIVER.session(&spec, 0, mid - 1).await.unwrap();
    assert_eq!(
        recovered, b"cp-left",
        "the left half resumes from its own commit"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn delta_updates_append_a_row_per_store() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("views.db");
    let spec = spec(&endpoint(&db), vec![binding("events", true)]);
    DRIVER.apply(&spec).await;
    let (mut session, _) = DRIVER.session(&spec, 0, ALL).await.unwrap();
    for (i, cp) in [b"cp-1", b"cp-2"].iter().enumerate() {
        let stores = vec![store(
            0,
            &["/user_id"],
            &[(view("alice", i as i64 + 1), false)],
        )];
        session.transaction(vec![], *cp, stores).await.unwrap();
    }
    let views: Vec<i64> = query(
        &db,
        "SELECT views FROM events WHERE user_id = 'alice' ORDER BY rowid",
    );
    assert_eq!(views, [1, 2]);
}

#[tokio::test(flavor = "multi_thread")]
async fn oddly_named_tables_and_fields_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("views.db");
    let mut weird = binding("select", false);
    let collection = weird.collection.as_mut().unwrap();
    collection.projections[2].field = "Mixed Case".into();
    collection.projections[3].field = "a\"b".into();
    weird.field_selection.as_mut().unwrap().values[..2]
        .clone_from_slice(&["Mixed Case".into(), "a\"b".into()]);
    let spec = spec(&endpoint(&db), vec![weird]);
    DRIVER.apply(&spec).await;
    let (mut session, _) = DRIVER.session(&spec, 0, ALL).await.unwrap();
    let stores = vec![store(0, &["/user_id"], &[(view("alice", 7), false)])];
    session.transaction(vec![], b"cp-1", stores).await.unwrap();
    let loaded = session
        .transaction(vec![load(0, &[json!(["alice"])])], b"cp-2", vec![])
        .await
        .unwrap();
    assert_eq!(loaded, [view("alice", 7)]);
    let views: Vec<i64> = query(&db, r#"SELECT "Mixed Case" FROM "select""#);
    assert_eq!(views, [7]);
}
