//! Apply, Validate and Transactions scenarios every authoritative SQL connector shares,
//! written once and run by each connector's `tests/apply.rs` and `tests/transactions.rs`
//! against its own store through
//! [`TestStore`]: a fresh, private store per test that the driver under test can open
//! and the test can read back.
//!
//! Each scenario opens [`binding`]s of the pageviews collection into tables of the
//! store, drives [`Session`](super::Session)s through whole transactions and asserts
//! what a runtime would see (loaded documents, recovered checkpoints, errors) and what
//! the store holds afterwards (`(user_id, views)` rows). What only one store can check
//! (typed columns, its own error texts) stays in the connector's test, which the
//! scenarios that return their session or error leave room for.
//!
//! What every driver must do, as the protocol shows it (checkpoint recovery, split
//! ranges, fencing as `Fenced`, atomic commits), is the suite's ([`sluice_conformance::run_suite`]),
//! which each connector's `tests/conformance.rs` runs on its real server; the fencing,
//! deletion and delta-updates scenarios here add what only the store's tables show.

use super::{
    ALL, MATERIALIZATION, Session, TestDriver, apply_request, binding, binding_keyed, collection,
    load, spec, store, view,
};
use serde_json::{Value, json};
use sluice_driver_sdk::Error;
use sluice_driver_sdk::flow::{MaterializationSpec, materialization_spec::Binding};
use sluice_driver_sdk::materialize::{ValidateRequest, constraint::Type, validate_request};
use std::future::Future;

/// A private store of one test, as the shared scenarios need it.
pub trait TestStore {
    /// The driver under test.
    fn driver(&self) -> TestDriver;

    /// The endpoint configuration of this store.
    fn endpoint(&self) -> Value;

    /// The rows of `table` as `[user_id, views]` JSON arrays, ordered by both.
    fn user_views(&self, table: &str) -> impl Future<Output = Vec<Value>>;
}

/// A [`TestStore`] on a server whose connections a test can end.
pub trait ServerStore: TestStore {
    /// Ends every connection the driver under test holds; returns how many.
    fn kill_driver_connections(&self) -> impl Future<Output = usize>;
}

/// The `user_id` of each row of `table`.
async fn users(db: &impl TestStore, table: &str) -> Vec<Value> {
    let rows = db.user_views(table).await;
    rows.into_iter().map(|row| row[0].clone()).collect()
}

/// Applies `bindings` to the store and opens the whole key range: the spec, the
/// session and the recovered checkpoint.
pub async fn apply_and_open(
    db: &impl TestStore,
    bindings: Vec<Binding>,
) -> (MaterializationSpec, Session, Vec<u8>) {
    let spec = spec(&db.endpoint(), bindings);
    db.driver().apply(&spec).await;
    let (session, recovered) = db.driver().session(&spec, 0, ALL).await.unwrap();
    (spec, session, recovered)
}

/// The checkpoint a new session of the whole key range recovers.
async fn recovered(db: &impl TestStore, spec: &MaterializationSpec) -> Vec<u8> {
    db.driver().session(spec, 0, ALL).await.unwrap().1
}

/// Commits a transaction of `docs` (each with its `exists` flag) into binding 0,
/// keyed by `/user_id`.
async fn commit(session: &mut Session, checkpoint: &[u8], docs: &[(Value, bool)]) {
    let stores = vec![store(0, &["/user_id"], docs)];
    session
        .transaction(vec![], checkpoint, stores)
        .await
        .unwrap();
}

/// A fresh store recovers no checkpoint; a Load finds only stored keys, and reads what
/// the prior transaction committed. Leaves `pageviews` holding alice (2 views) and bob
/// (1), from [`view`], for the connector to check its columns.
pub async fn loads_read_the_prior_commit(db: &impl TestStore) {
    let (_, mut session, recovered) = apply_and_open(db, vec![binding("pageviews", false)]).await;
    assert!(recovered.is_empty(), "a fresh store has no checkpoint");
    let docs = [(view("alice", 1), false), (view("bob", 1), false)];
    commit(&mut session, b"cp-1", &docs).await;

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
}

/// `doc`, stored, is loaded back with exactly its text.
pub async fn documents_keep_their_exact_text_through_a_load(db: &impl TestStore, doc: Value) {
    let (_, mut session, _) = apply_and_open(db, vec![binding("pageviews", false)]).await;
    commit(&mut session, b"cp-1", &[(doc.clone(), false)]).await;
    let key = json!([doc["user_id"].clone()]);
    let loaded = session
        .transaction(vec![load(0, &[key])], b"cp-2", vec![])
        .await
        .unwrap();
    assert_eq!(loaded, [doc]);
}

fn sorted(mut docs: Vec<Value>) -> Vec<Value> {
    docs.sort_by_key(|d| d.to_string());
    docs
}

/// One Load of `stored + absent` keys, of which `stored` were committed, finds every
/// stored document.
pub async fn one_load_of_many_keys_finds_every_stored_one(
    db: &impl TestStore,
    stored: i64,
    absent: i64,
) {
    let (_, mut session, _) = apply_and_open(db, vec![binding("pageviews", false)]).await;
    let docs: Vec<(Value, bool)> = (0..stored)
        .map(|i| (view(&format!("u{i}"), i), false))
        .collect();
    commit(&mut session, b"cp-1", &docs).await;
    let keys: Vec<Value> = (0..stored + absent)
        .map(|i| json!([format!("u{i}")]))
        .collect();
    let loaded = session
        .transaction(vec![load(0, &keys)], b"cp-2", vec![])
        .await
        .unwrap();
    let want: Vec<Value> = docs.into_iter().map(|(d, _)| d).collect();
    assert_eq!(sorted(loaded), sorted(want));
}

/// Documents keyed by `(user_id, day)` are loaded by both components and updated in
/// place. Leaves `daily` holding alice's day 1 (10 views) and day 2 (21 views).
pub async fn composite_keys_are_stored_and_loaded(db: &impl TestStore) {
    let keyed = binding_keyed("daily", false, &["user_id", "day"]);
    let (_, mut session, _) = apply_and_open(db, vec![keyed]).await;
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
}

/// A Store of a null document (a deletion) removes the key's row.
pub async fn a_null_document_deletes_its_row(db: &impl TestStore) {
    let (_, mut session, _) = apply_and_open(db, vec![binding("pageviews", false)]).await;
    let docs = [(view("alice", 1), false), (view("bob", 1), false)];
    commit(&mut session, b"cp-1", &docs).await;
    commit(&mut session, b"cp-2", &[(json!({"key": ["alice"]}), true)]).await;
    assert_eq!(users(db, "pageviews").await, ["bob"]);
}

/// Storing a key as absent (`exists: false`) that the store holds fails the commit,
/// which commits nothing; returns the error for the connector to check its text.
pub async fn storing_a_key_believed_absent_but_present_fails_the_commit(
    db: &impl TestStore,
) -> Error {
    let (spec, mut session, _) = apply_and_open(db, vec![binding("pageviews", false)]).await;
    commit(&mut session, b"cp-1", &[(view("alice", 1), false)]).await;
    let wrong = store(0, &["/user_id"], &[(view("alice", 9), false)]);
    let err = session
        .transaction(vec![], b"cp-2", vec![wrong])
        .await
        .unwrap_err();
    drop(session);
    assert_eq!(
        recovered(db, &spec).await,
        b"cp-1",
        "the failed transaction committed nothing"
    );
    err
}

/// Once a newer session of the same range opens, the older one's commit is fenced and
/// writes nothing, while the newer one commits on.
pub async fn a_zombie_is_fenced_and_writes_nothing(db: &impl TestStore) {
    let (spec, mut zombie, _) = apply_and_open(db, vec![binding("pageviews", false)]).await;
    zombie.transaction(vec![], b"cp-1", vec![]).await.unwrap();

    let (mut newer, recovered_by_newer) = db.driver().session(&spec, 0, ALL).await.unwrap();
    assert_eq!(recovered_by_newer, b"cp-1");
    let stores = vec![store(0, &["/user_id"], &[(view("dave", 1), false)])];
    let err = zombie
        .transaction(vec![], b"cp-zombie", stores)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Fenced(_)), "{err}");
    let rows = users(db, "pageviews").await;
    assert!(rows.is_empty(), "the zombie wrote {rows:?}");

    // The newer instance commits and still sees its own checkpoint lineage.
    newer.transaction(vec![], b"cp-2", vec![]).await.unwrap();
    drop(newer);
    assert_eq!(recovered(db, &spec).await, b"cp-2");
}

/// A zombie whose Loads went stale stores as absent a key the newer instance has
/// committed since: its transaction fails as fenced off, not with the store's
/// duplicate-key error, and the table holds exactly the newer instance's row.
pub async fn a_zombie_storing_a_key_the_newer_instance_committed_is_fenced(db: &impl TestStore) {
    let (spec, mut zombie, _) = apply_and_open(db, vec![binding("pageviews", false)]).await;
    let (mut newer, _) = db.driver().session(&spec, 0, ALL).await.unwrap();
    commit(&mut newer, b"cp-newer", &[(view("alice", 1), false)]).await;

    let stale = store(0, &["/user_id"], &[(view("alice", 9), false)]);
    let err = zombie
        .transaction(vec![], b"cp-zombie", vec![stale])
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Fenced(_)), "{err:?}");
    assert_eq!(db.user_views("pageviews").await, [json!(["alice", 1])]);
}

/// A delta-updates binding appends a row per stored document, even of the same key.
pub async fn delta_updates_append_every_stored_document(db: &impl TestStore) {
    let (_, mut session, _) = apply_and_open(db, vec![binding("events", true)]).await;
    for (i, checkpoint) in [b"cp-1", b"cp-2"].iter().enumerate() {
        let docs = [(view("alice", i as i64), false), (view("bob", 5), false)];
        commit(&mut session, *checkpoint, &docs).await;
    }
    assert_eq!(
        db.user_views("events").await,
        [
            json!(["alice", 0]),
            json!(["alice", 1]),
            json!(["bob", 5]),
            json!(["bob", 5])
        ]
    );
}

/// A connection the server ends fails the transaction in flight with a retryable
/// error; reopening finds exactly the prior commit. Returns the error for the connector
/// to check what it prints.
pub async fn a_lost_connection_fails_retryably_and_loses_nothing(db: &impl ServerStore) -> Error {
    let (spec, mut session, _) = apply_and_open(db, vec![binding("pageviews", false)]).await;
    commit(&mut session, b"cp-1", &[(view("alice", 1), false)]).await;

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

    // The runtime reopens: the store holds exactly the first commit.
    assert_eq!(recovered(db, &spec).await, b"cp-1");
    assert_eq!(users(db, "pageviews").await, ["alice"]);
    err
}

/// Applying the spec just applied does nothing.
pub async fn reapplying_the_same_spec_does_nothing(db: &impl TestStore) {
    let spec = spec(&db.endpoint(), vec![binding("pageviews", false)]);
    assert_ne!(db.driver().apply(&spec).await, "");
    assert_eq!(db.driver().apply(&spec).await, "");
}

/// Selecting `meta/source` in addition to the applied fields: the real apply runs
/// exactly what the dry run described, which is returned for the connector to check.
pub async fn a_newly_selected_field_is_added_as_the_dry_run_describes(
    db: &impl TestStore,
) -> String {
    let narrow = spec(&db.endpoint(), vec![binding("pageviews", false)]);
    db.driver().apply(&narrow).await;
    let mut wider = binding("pageviews", false);
    let selection = wider.field_selection.as_mut().expect("a field selection");
    selection.values.push("meta/source".into());
    let wider = spec(&db.endpoint(), vec![wider]);
    let dry = (db.driver().driver)()
        .apply_upsert(apply_request(&wider, true))
        .await
        .unwrap()
        .action_description;
    assert_eq!(db.driver().apply(&wider).await, dry);
    dry
}

/// A field whose inferred type changes from integer to number between two applies
/// (`views`, an integer column) refuses the second Apply, naming the table, the field,
/// both types and the backfill; nothing changes. With the binding's backfill raised the
/// same change applies (the table is rebuilt). Returns the refusal for the connector
/// to check its store's name in.
pub async fn a_retyped_field_is_refused_unless_backfilled(db: &impl TestStore) -> String {
    let first = spec(&db.endpoint(), vec![binding("pageviews", false)]);
    db.driver().apply(&first).await;
    let retyped = |backfill| {
        let mut b = binding("pageviews", false);
        b.backfill = backfill;
        let collection = b.collection.as_mut().expect("a collection");
        let views = (collection.projections.iter_mut())
            .find(|p| p.field == "views")
            .expect("a views projection");
        views.inference.as_mut().expect("an inference").types = vec!["number".into()];
        spec(&db.endpoint(), vec![b])
    };
    let apply_after = |next: MaterializationSpec| {
        let mut request = apply_request(&next, false);
        request.last_materialization = Some(first.clone());
        request
    };
    let refused = (db.driver().driver)()
        .apply_upsert(apply_after(retyped(0)))
        .await
        .expect_err("an integer column cannot hold numbers")
        .to_string();
    for part in [
        "table \"pageviews\"",
        "field \"views\" was integer and is now number",
        "raise the binding's `backfill`",
    ] {
        assert!(refused.contains(part), "{part:?} missing from: {refused}");
    }
    // Nothing was applied: re-applying the first spec changes nothing.
    assert_eq!(db.driver().apply(&first).await, "");
    let rebuilt = (db.driver().driver)()
        .apply_upsert(apply_after(retyped(1)))
        .await
        .expect("a raised backfill rebuilds the table")
        .action_description;
    assert!(rebuilt.contains("DROP TABLE"), "{rebuilt}");
    refused
}

/// Validate of the pageviews collection requires the key and the document, recommends
/// typed values, leaves nested fields optional and forbids always-null ones. Returns
/// the resource path for the connector to check.
pub async fn validate_requires_keys_and_document_and_forbids_untyped_fields(
    db: &impl TestStore,
) -> Vec<String> {
    let request = ValidateRequest {
        materialization: MATERIALIZATION.into(),
        endpoint_type: 0,
        endpoint_spec_json: db.endpoint().to_string(),
        bindings: vec![validate_request::Binding {
            resource_spec_json: json!({"table": "pageviews"}).to_string(),
            collection: Some(collection()),
            field_config_json: Default::default(),
            backfill: 0,
        }],
    };
    let mut response = (db.driver().driver)().validate(request).await.unwrap();
    let binding = response.bindings.remove(0);
    let of = |field: &str| Type::try_from(binding.constraints[field].r#type).unwrap();
    assert_eq!(of("user_id"), Type::LocationRequired);
    assert_eq!(of("flow_document"), Type::FieldRequired);
    assert_eq!(of("views"), Type::LocationRecommended);
    assert_eq!(of("meta/source"), Type::FieldOptional);
    assert_eq!(of("nothing"), Type::FieldForbidden);
    binding.resource_path
}

/// Apply-delete after a commit drops what apply created: applying again starts over,
/// with no checkpoint to recover. Returns the delete's action description.
pub async fn apply_delete_forgets_checkpoints(db: &impl TestStore) -> String {
    let (spec, mut session, _) = apply_and_open(db, vec![binding("pageviews", false)]).await;
    session.transaction(vec![], b"cp-1", vec![]).await.unwrap();
    drop(session);
    let deleted = (db.driver().driver)()
        .apply_delete(apply_request(&spec, false))
        .await
        .unwrap()
        .action_description;
    db.driver().apply(&spec).await;
    let recovered = recovered(db, &spec).await;
    assert!(recovered.is_empty(), "the checkpoint was forgotten");
    deleted
}
