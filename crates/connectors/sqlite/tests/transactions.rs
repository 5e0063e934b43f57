//! Full Transactions streams through the SDK's in-process endpoint and client, against
//! real SQLite files: stores, loads, fencing and delta
//! updates as the tables show them. The scenarios every SQL connector shares come from
//! [`sluice_testkit::conformance::scenarios`]; this file adds what only SQLite checks.

// Checkpoint recovery and key-range splits, which the protocol alone shows, are
// scenarios of the conformance suite (`tests/conformance.rs`).

mod common;

use common::TestFile;
use serde_json::json;
use sluice_testkit::conformance::scenarios;
use sluice_testkit::conformance::{binding, load, store, view};

#[tokio::test(flavor = "multi_thread")]
async fn committed_stores_are_loaded_by_the_next_transaction() {
    let db = TestFile::new();
    scenarios::loads_read_the_prior_commit(&db).await;
    let rows: Vec<String> = db.query(
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
async fn documents_keep_their_exact_text_through_a_load() {
    let doc = json!({"user_id": "tab\there", "views": 1, "note": "line\nbreak \\ back\\slash \0"});
    scenarios::documents_keep_their_exact_text_through_a_load(&TestFile::new(), doc).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn loads_of_many_keys_span_several_statements() {
    scenarios::one_load_of_many_keys_finds_every_stored_one(&TestFile::new(), 1000, 10).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn composite_keys_are_stored_and_loaded() {
    let db = TestFile::new();
    scenarios::composite_keys_are_stored_and_loaded(&db).await;
    let rows: Vec<String> = db.query("SELECT json_array(day, views) FROM daily ORDER BY day");
    assert_eq!(rows, ["[1,10]", "[2,21]"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_null_document_deletes_its_row() {
    scenarios::a_null_document_deletes_its_row(&TestFile::new()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn zombie_commit_after_newer_open_is_rejected_and_writes_nothing() {
    scenarios::a_zombie_is_fenced_and_writes_nothing(&TestFile::new()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_zombie_storing_a_key_the_newer_instance_committed_is_fenced_not_a_duplicate() {
    scenarios::a_zombie_storing_a_key_the_newer_instance_committed_is_fenced(&TestFile::new())
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn delta_updates_append_every_stored_document() {
    scenarios::delta_updates_append_every_stored_document(&TestFile::new()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn delta_updates_append_a_row_per_store() {
    let db = TestFile::new();
    let (_, mut session, _) = scenarios::apply_and_open(&db, vec![binding("events", true)]).await;
    for (i, cp) in [b"cp-1", b"cp-2"].iter().enumerate() {
        let stores = vec![store(
            0,
            &["/user_id"],
            &[(view("alice", i as i64 + 1), false)],
        )];
        session.transaction(vec![], *cp, stores).await.unwrap();
    }
    let views: Vec<i64> =
        db.query("SELECT views FROM events WHERE user_id = 'alice' ORDER BY rowid");
    assert_eq!(views, [1, 2]);
}

#[tokio::test(flavor = "multi_thread")]
async fn oddly_named_tables_and_fields_round_trip() {
    let db = TestFile::new();
    let mut weird = binding("select", false);
    let collection = weird.collection.as_mut().unwrap();
    collection.projections[2].field = "Mixed Case".into();
    collection.projections[3].field = "a\"b".into();
    weird.field_selection.as_mut().unwrap().values[..2]
        .clone_from_slice(&["Mixed Case".into(), "a\"b".into()]);
    let (_, mut session, _) = scenarios::apply_and_open(&db, vec![weird]).await;
    let stores = vec![store(0, &["/user_id"], &[(view("alice", 7), false)])];
    session.transaction(vec![], b"cp-1", stores).await.unwrap();
    let loaded = session
        .transaction(vec![load(0, &[json!(["alice"])])], b"cp-2", vec![])
        .await
        .unwrap();
    assert_eq!(loaded, [view("alice", 7)]);
    let views: Vec<i64> = db.query(r#"SELECT "Mixed Case" FROM "select""#);
    assert_eq!(views, [7]);
}

/// A table an earlier release created (a rowid table and its key index, before tables
/// were `WITHOUT ROWID`) is taken as it is: applied again, stored to and loaded from.
#[tokio::test(flavor = "multi_thread")]
async fn a_rowid_table_of_an_earlier_release_keeps_working() {
    let db = TestFile::new();
    rusqlite::Connection::open(&db.path)
        .unwrap()
        .execute_batch(
            "CREATE TABLE \"pageviews\" (\"user_id\" TEXT, \"views\" INTEGER, \"score\" REAL, \
             \"active\" INTEGER, \"tags\" TEXT, \"seen_at\" TEXT, \"flow_document\" TEXT, \
             PRIMARY KEY (\"user_id\"))",
        )
        .unwrap();
    scenarios::loads_read_the_prior_commit(&db).await;
    let rows: Vec<String> =
        db.query("SELECT user_id || ':' || views FROM pageviews ORDER BY rowid");
    assert_eq!(rows, ["alice:2", "bob:1"]);
}
