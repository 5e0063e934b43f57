//! Full Transactions streams through the SDK's in-process endpoint and client, against
//! the real server: stores, loads, fencing and delta
//! updates as the tables show them, connection loss. The scenarios every SQL connector shares come from
//! [`sluice_testkit::conformance::scenarios`]; this file adds what only PostgreSQL checks.

// Checkpoint recovery and key-range splits, which the protocol alone shows, are
// scenarios of the conformance suite (`tests/conformance.rs`).

mod common;

use common::TestDb;
use serde_json::json;
use sluice_testkit::conformance::scenarios;

#[tokio::test(flavor = "multi_thread")]
async fn committed_stores_are_loaded_by_the_next_transaction_in_typed_columns() {
    let db = TestDb::new();
    scenarios::loads_read_the_prior_commit(&db).await;
    let rows = db
        .rows(&format!(
            "SELECT json_build_array(user_id, views, score, active, tags, \
             seen_at = '2024-05-01 12:00:00+00', pg_typeof(views)) FROM {} ORDER BY user_id",
            sluice_postgres::sql::qualify(&db.schema, "pageviews")
        ))
        .await;
    assert_eq!(
        rows,
        [
            json!(["alice", 2, 1.5, true, ["a", "b"], true, "bigint"]),
            json!(["bob", 1, 1.5, true, ["a", "b"], true, "bigint"]),
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn documents_keep_their_exact_text_through_a_load() {
    // Tabs, newlines and backslashes inside strings need COPY escapes.
    let doc = json!({"user_id": "tab\there", "views": 1, "note": "line\nbreak \\ back\\slash"});
    scenarios::documents_keep_their_exact_text_through_a_load(&TestDb::new(), doc).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn one_load_of_many_keys_finds_every_stored_one() {
    scenarios::one_load_of_many_keys_finds_every_stored_one(&TestDb::new(), 5000, 100).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn composite_keys_are_stored_and_loaded() {
    let db = TestDb::new();
    scenarios::composite_keys_are_stored_and_loaded(&db).await;
    let rows = db
        .rows(&format!(
            "SELECT json_build_array(day, views) FROM {} ORDER BY day",
            sluice_postgres::sql::qualify(&db.schema, "daily")
        ))
        .await;
    assert_eq!(rows, [json!([1, 10]), json!([2, 21])]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_null_document_deletes_its_row() {
    scenarios::a_null_document_deletes_its_row(&TestDb::new()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn storing_a_key_the_runtime_believes_absent_but_present_fails_the_commit() {
    let err =
        scenarios::storing_a_key_believed_absent_but_present_fails_the_commit(&TestDb::new()).await;
    assert!(err.to_string().contains("duplicate key"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn zombie_commit_after_newer_open_is_rejected_and_writes_nothing() {
    scenarios::a_zombie_is_fenced_and_writes_nothing(&TestDb::new()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_zombie_storing_a_key_the_newer_instance_committed_is_fenced_not_a_duplicate() {
    scenarios::a_zombie_storing_a_key_the_newer_instance_committed_is_fenced(&TestDb::new()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn delta_updates_append_every_stored_document() {
    scenarios::delta_updates_append_every_stored_document(&TestDb::new()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_connection_fails_the_stream_with_a_retryable_error_and_loses_nothing() {
    let err = scenarios::a_lost_connection_fails_retryably_and_loses_nothing(&TestDb::new()).await;
    assert!(
        !err.to_string().contains("application_name"),
        "the error must not print the URL: {err}"
    );
}
