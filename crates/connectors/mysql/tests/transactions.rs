//! Full Transactions streams through the SDK's in-process endpoint and client, against
//! the real server: stores, loads, fencing and delta
//! updates as the tables show them, connection loss, and the keys MariaDB would otherwise confuse. The scenarios
//! every SQL connector shares come from [`sluice_testkit::conformance::scenarios`]; this file
//! adds what only MariaDB checks.

// Checkpoint recovery and key-range splits, which the protocol alone shows, are
// scenarios of the conformance suite (`tests/conformance.rs`).

mod common;

use common::TestDb;
use serde_json::{Value, json};
use sluice_testkit::conformance::{binding, load, scenarios, store, view};

#[tokio::test(flavor = "multi_thread")]
async fn committed_stores_are_loaded_by_the_next_transaction_in_typed_columns() {
    let db = TestDb::new().await;
    scenarios::loads_read_the_prior_commit(&db).await;
    let rows = db
        .rows(
            "SELECT JSON_ARRAY(CAST(user_id AS CHAR), views, score, active, JSON_EXTRACT(tags, '$'), seen_at) \
             FROM pageviews ORDER BY user_id",
        )
        .await;
    let tags = json!(["a", "b"]);
    let seen = "2024-05-01T12:00:00Z";
    assert_eq!(
        rows,
        [
            json!(["alice", 2, 1.5, 1, tags, seen]),
            json!(["bob", 1, 1.5, 1, tags, seen]),
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn documents_keep_their_exact_text_through_a_load() {
    // Tabs, newlines, backslashes and NUL inside strings need LOAD DATA escapes.
    let doc =
        json!({"user_id": "tab\there", "views": 1, "note": "line\nbreak \\ back\\slash \r \0 \\N"});
    scenarios::documents_keep_their_exact_text_through_a_load(&TestDb::new().await, doc).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn one_load_of_many_keys_finds_every_stored_one() {
    scenarios::one_load_of_many_keys_finds_every_stored_one(&TestDb::new().await, 5000, 100).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn composite_keys_are_stored_and_loaded() {
    let db = TestDb::new().await;
    scenarios::composite_keys_are_stored_and_loaded(&db).await;
    let rows = db
        .rows("SELECT JSON_ARRAY(day, views) FROM daily ORDER BY day")
        .await;
    assert_eq!(rows, [json!([1, 10]), json!([2, 21])]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_null_document_deletes_its_row() {
    scenarios::a_null_document_deletes_its_row(&TestDb::new().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn storing_a_key_the_runtime_believes_absent_but_present_fails_the_commit() {
    let db = TestDb::new().await;
    let err = scenarios::storing_a_key_believed_absent_but_present_fails_the_commit(&db).await;
    assert!(err.to_string().contains("Duplicate entry"), "{err}");
    assert!(err.to_string().contains("reported 1 warning(s)"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn zombie_commit_after_newer_open_is_rejected_and_writes_nothing() {
    scenarios::a_zombie_is_fenced_and_writes_nothing(&TestDb::new().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_zombie_storing_a_key_the_newer_instance_committed_is_fenced_not_a_duplicate() {
    scenarios::a_zombie_storing_a_key_the_newer_instance_committed_is_fenced(&TestDb::new().await)
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn delta_updates_append_every_stored_document() {
    scenarios::delta_updates_append_every_stored_document(&TestDb::new().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_connection_fails_the_stream_with_a_retryable_error_and_loses_nothing() {
    scenarios::a_lost_connection_fails_retryably_and_loses_nothing(&TestDb::new().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn keys_differing_in_case_or_trailing_spaces_are_distinct_rows() {
    let db = TestDb::new().await;
    let (_, mut session, _) =
        scenarios::apply_and_open(&db, vec![binding("pageviews", false)]).await;
    let users = ["bob", "Bob", "bob ", "böb"];
    let docs: Vec<(Value, bool)> = (users.iter().enumerate())
        .map(|(i, u)| (view(u, i as i64), false))
        .collect();
    session
        .transaction(vec![], b"cp-1", vec![store(0, &["/user_id"], &docs)])
        .await
        .unwrap();
    let loaded = session
        .transaction(
            vec![load(0, &[json!(["bob "]), json!(["BOB"])])],
            b"cp-2",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(loaded, [view("bob ", 2)]);
    let count = db.rows("SELECT JSON_ARRAY(COUNT(*)) FROM pageviews").await;
    assert_eq!(count, [json!([4])]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_longer_than_its_column_fails_the_transaction_instead_of_truncating() {
    let db = TestDb::new().await;
    let (_, mut session, _) =
        scenarios::apply_and_open(&db, vec![binding("pageviews", false)]).await;
    let long = "k".repeat(256);
    let err = session
        .transaction(
            vec![],
            b"cp-1",
            vec![store(0, &["/user_id"], &[(view(&long, 1), false)])],
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("255 characters"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn committing_an_unchanged_checkpoint_is_not_mistaken_for_a_fence() {
    let db = TestDb::new().await;
    let (_, mut session, _) =
        scenarios::apply_and_open(&db, vec![binding("pageviews", false)]).await;
    session.transaction(vec![], b"cp-1", vec![]).await.unwrap();
    session.transaction(vec![], b"cp-1", vec![]).await.unwrap();
}
