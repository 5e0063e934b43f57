//! Full Transactions streams through the SDK's in-process endpoint and client, against
//! the real server: stores, loads, checkpoints, fencing, key-range splits, delta
//! updates, connection loss.

mod common;

use common::{DRIVER, TestDb};
use serde_json::{Value, json};
use sluice_driver::Error;
use sluice_driver::testing::{ALL, binding, binding_keyed, load, spec, store, view};

fn sorted(mut docs: Vec<Value>) -> Vec<Value> {
    docs.sort_by_key(|d| d.to_string());
    docs
}

fn table(db: &TestDb, table: &str) -> String {
    sluice_postgres::sql::qualify(&db.schema, table)
}

#[tokio::test(flavor = "multi_thread")]
async fn committed_stores_are_loaded_by_the_next_transaction_in_typed_columns() {
    let db = TestDb::new();
    let spec = spec(&db.endpoint(), vec![binding("pageviews", false)]);
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

    let rows = db
        .rows(&format!(
            "SELECT json_build_array(user_id, views, score, active, tags, \
             seen_at = '2024-05-01 12:00:00+00', pg_typeof(views)) FROM {} ORDER BY user_id",
            table(&db, "pageviews")
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
    let db = TestDb::new();
    let spec = spec(&db.endpoint(), vec![binding("pageviews", false)]);
    DRIVER.apply(&spec).await;
    let (mut session, _) = DRIVER.session(&spec, 0, ALL).await.unwrap();
    // Tabs, newlines and backslashes inside strings need COPY escapes.
    let doc = json!({"user_id": "tab\there", "views": 1, "note": "line\nbreak \\ back\\slash"});
    session
        .transaction(
            vec![],
            b"cp-1",
            vec![store(0, &["/user_id"], &[(doc.clone(), false)])],
        )
        .await
        .unwrap();
    let loaded = session
        .transaction(vec![load(0, &[json!(["tab\there"])])], b"cp-2", vec![])
        .await
        .unwrap();
    assert_eq!(loaded, [doc]);
}

#[tokio::test(flavor = "multi_thread")]
async fn one_load_of_many_keys_finds_every_stored_one() {
    let db = TestDb::new();
    let spec = spec(&db.endpoint(), vec![binding("pageviews", false)]);
    DRIVER.apply(&spec).await;
    let (mut session, _) = DRIVER.session(&spec, 0, ALL).await.unwrap();
    let docs: Vec<(Value, bool)> = (0..5000)
        .map(|i| (view(&format!("u{i}"), i), false))
        .collect();
    session
        .transaction(vec![], b"cp-1", vec![store(0, &["/user_id"], &docs)])
        .await
        .unwrap();
    let keys: Vec<Value> = (0..5100).map(|i| json!([format!("u{i}")])).collect();
    let loaded = session
        .transaction(vec![load(0, &keys)], b"cp-2", vec![])
        .await
        .unwrap();
    let want: Vec<Value> = docs.into_iter().map(|(d, _)| d).collect();
    assert_eq!(sorted(loaded), sorted(want));
}

#[tokio::test(flavor = "multi_thread")]
async fn composite_keys_are_stored_and_loaded() {
    let db = TestDb::new();
    let spec = spec(
        &db.endpoint(),
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
        .transaction(
            vec![load(0, &keys)],
            b"cp-2",
            vec![store(0, &ptrs, &[(doc(2, 21), true)])],
        )
        .await
        .unwrap();
    assert_eq!(loaded, [doc(2, 20)]);
    let rows = db
        .rows(&format!(
            "SELECT json_build_array(day, views) FROM {} ORDER BY day",
            table(&db, "daily")
        ))
        .await;
    assert_eq!(rows, [json!([1, 10]), json!([2, 21])]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_null_document_deletes_its_row() {
    let db = TestDb::new();
    let spec = spec(&db.endpoint(), vec![binding("pageviews", false)]);
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
    let users = db
        .rows(&format!(
            "SELECT to_json(user_id) FROM {}",
            table(&db, "pageviews")
        ))
        .await;
    assert_eq!(users, ["bob"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn storing_a_key_the_runtime_believes_absent_but_present_fails_the_commit() {
    let db = TestDb::new();
    let spec = spec(&db.endpoint(), vec![binding("pageviews", false)]);
    DRIVER.apply(&spec).await;
    let (mut session, _) = DRIVER.session(&spec, 0, ALL).await.unwrap();
    let first = store(0, &["/user_id"], &[(view("alice", 1), false)]);
    session
        .transaction(vec![], b"cp-1", vec![first])
        .await
        .unwrap();
    let wrong = store(0, &["/user_id"], &[(view("alice", 9), false)]);
    let err = session
        .transaction(vec![], b"cp-2", vec![wrong])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("duplicate key"), "{err}");
    drop(session);
    let (_, recovered) = DRIVER.session(&spec, 0, ALL).await.unwrap();
    assert_eq!(
        recovered, b"cp-1",
        "the failed transaction committed nothing"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn reopening_recovers_the_last_committed_checkpoint() {
    let db = TestDb::new();
    let spec = spec(&db.endpoint(), vec![binding("pageviews", false)]);
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
    let db = TestDb::new();
    let spec = spec(&db.endpoint(), vec![binding("pageviews", false)]);
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
    let rows = db
        .rows(&format!(
            "SELECT to_json(user_id) FROM {}",
            table(&db, "pageviews")
        ))
        .await;
    assert!(rows.is_empty(), "the zombie wrote {rows:?}");

    // The newer instance commits and still sees its own checkpoint lineage.
    newer.transaction(vec![], b"cp-2", vec![]).await.unwrap();
    drop(newer);
    let (_, recovered) = DRIVER.session(&spec, 0, ALL).await.unwrap();
    assert_eq!(recovered, b"cp-2");
}

#[tokio::test(flavor = "multi_thread")]
async fn split_ranges_resume_from_the_parent_and_fence_it() {
    let db = TestDb::new();
    let spec = spec(&db.endpoint(), vec![binding("pageviews", false)]);
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

    let (mut right, recovered) = DRIVER.session(&spec, mid, ALL).await.unwrap();
    assert_eq!(recovered, b"cp-parent");
    left.transaction(vec![], b"cp-left", vec![]).await.unwrap();
    right
        .transaction(vec![], b"cp-right", vec![])
        .await
        .unwrap();
    drop((left, right));
    let (_, recovered) = DRIVER.session(&spec, 0, mid - 1).await.unwrap();
    assert_eq!(
        recovered, b"cp-left",
        "a child recovers its own, narrower range"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn delta_updates_append_every_stored_document() {
    let db = TestDb::new();
    let spec = spec(&db.endpoint(), vec![binding("events", true)]);
    DRIVER.apply(&spec).await;
    let (mut session, _) = DRIVER.session(&spec, 0, ALL).await.unwrap();
    for (i, checkpoint) in [b"cp-1", b"cp-2"].iter().enumerate() {
        let docs = [(view("alice", i as i64), false), (view("bob", 5), false)];
        session
            .transaction(vec![], *checkpoint, vec![store(0, &["/user_id"], &docs)])
            .await
            .unwrap();
    }
    let rows = db
        .rows(&format!(
            "SELECT json_build_array(user_id, views) FROM {} ORDER BY user_id, views",
            table(&db, "events")
        ))
        .await;
    assert_eq!(
        rows,
        [
            json!(["alice", 0]),
            json!(["alice", 1]),
            json!(["bob", 5]),
            json!(["bob", 5])
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lost_connection_fails_the_stream_with_a_retryable_error_and_loses_nothing() {
    let db = TestDb::new();
    let spec = spec(&db.endpoint(), vec![binding("pageviews", false)]);
    DRIVER.apply(&spec).await;
    let (mut session, _) = DRIVER.session(&spec, 0, ALL).await.unwrap();
    let first = store(0, &["/user_id"], &[(view("alice", 1), false)]);
    session
        .transaction(vec![], b"cp-1", vec![first])
        .await
        .unwrap();

    assert!(db.kill_driver_connections().await >= 1);
    let next = store(0, &["/user_id"], &[(view("bob", 1), false)]);
    let err = session
        .transaction(vec![], b"cp-2", vec![next])
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::Store {
                retryable: true,
                ..
            }
        ),
        "not retryable: {err:?}"
    );
    assert!(
        !err.to_string().contains("application_name"),
        "the error must not print the URL: {err}"
    );

    // The runtime reopens: the store holds exactly the first commit.
    let (_, recovered) = DRIVER.session(&spec, 0, ALL).await.unwrap();
    assert_eq!(recovered, b"cp-1");
    let users = db
        .rows(&format!(
            "SELECT to_json(user_id) FROM {}",
            table(&db, "pageviews")
        ))
        .await;
    assert_eq!(users, ["alice"]);
}
