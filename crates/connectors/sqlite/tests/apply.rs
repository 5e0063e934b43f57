//! Spec, Validate and Apply against real SQLite files.

mod common;

use common::{DRIVER, TestFile, endpoint};
use rusqlite::Connection;
use sluice_driver_sdk::Driver;
use sluice_driver_sdk::materialize::{self as m, constraint::Type};
use sluice_sqlite::SqliteDriver;
use sluice_testkit::conformance::scenarios::{self, TestStore};
use sluice_testkit::conformance::{self, apply_request, binding, collection, spec};
use std::path::Path;

/// `(name, declared type, primary-key position)` of each column of `table`.
fn columns(db: &Path, table: &str) -> Vec<(String, String, i64)> {
    let conn = Connection::open(db).unwrap();
    let mut stmt = conn
        .prepare("SELECT name, type, pk FROM pragma_table_info(?1) ORDER BY cid")
        .unwrap();
    stmt.query_map([table], |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn col(name: &str, ty: &str, pk: i64) -> (String, String, i64) {
    (name.to_owned(), ty.to_owned(), pk)
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_creates_typed_table_keyed_by_collection_key() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("nested/dirs/views.db");
    let spec = spec(&endpoint(&db), vec![binding("pageviews", false)]);
    let response = SqliteDriver::new()
        .apply_upsert(apply_request(&spec, false))
        .await
        .unwrap();
    assert!(
        response
            .action_description
            .contains("CREATE TABLE IF NOT EXISTS \"pageviews\"")
    );
    assert_eq!(
        columns(&db, "pageviews"),
        [
            col("user_id", "TEXT", 1),
            col("views", "INTEGER", 0),
            col("score", "REAL", 0),
            col("active", "INTEGER", 0),
            col("tags", "TEXT", 0),
            col("seen_at", "TEXT", 0),
            col("flow_document", "TEXT", 0),
        ]
    );
    let checkpoints: Vec<String> = columns(&db, "sluice_checkpoints")
        .into_iter()
        .map(|c| c.0)
        .collect();
    assert_eq!(checkpoints, conformance::CHECKPOINT_COLUMNS);
}

#[tokio::test(flavor = "multi_thread")]
async fn reapplying_the_same_spec_does_nothing() {
    scenarios::reapplying_the_same_spec_does_nothing(&TestFile::new()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn dry_run_prints_the_sql_and_changes_nothing() {
    let db = TestFile::new();
    let spec = spec(&db.endpoint(), vec![binding("pageviews", false)]);
    let driver = SqliteDriver::new();
    let dry = driver
        .apply_upsert(apply_request(&spec, true))
        .await
        .unwrap();
    assert!(!db.path.exists(), "a dry run must not create the database");
    assert_eq!(
        dry.action_description,
        "CREATE TABLE IF NOT EXISTS \"sluice_checkpoints\" (\"materialization\" TEXT NOT NULL, \
         \"key_begin\" INTEGER NOT NULL, \"key_end\" INTEGER NOT NULL, \"fence\" INTEGER NOT NULL, \
         \"checkpoint\" BLOB, PRIMARY KEY (\"materialization\", \"key_begin\", \"key_end\"));\n\
         CREATE TABLE IF NOT EXISTS \"pageviews\" (\"user_id\" TEXT, \"views\" INTEGER, \
         \"score\" REAL, \"active\" INTEGER, \"tags\" TEXT, \"seen_at\" TEXT, \
         \"flow_document\" TEXT, PRIMARY KEY (\"user_id\")) WITHOUT ROWID;\n\
         INSERT INTO \"sluice_checkpoints\" VALUES ('acme/views-db', -1, -1, 0, X'7631') ON CONFLICT DO NOTHING;\n"
    );
    // The real apply runs exactly what the dry run described.
    let real = driver
        .apply_upsert(apply_request(&spec, false))
        .await
        .unwrap();
    assert_eq!(real.action_description, dry.action_description);
    // A dry run against an existing database does not touch it either.
    let mut wider = binding("pageviews", false);
    wider
        .field_selection
        .as_mut()
        .unwrap()
        .values
        .push("meta/source".into());
    let wider = conformance::spec(&db.endpoint(), vec![wider]);
    driver
        .apply_upsert(apply_request(&wider, true))
        .await
        .unwrap();
    assert!(
        !columns(&db.path, "pageviews")
            .iter()
            .any(|c| c.0 == "meta/source")
    );
}

/// SQLite's columns hold any value (a declared type is an affinity): a field whose type
/// widens from integer to number applies with nothing to change, and the column keeps
/// what is stored in it next.
#[tokio::test(flavor = "multi_thread")]
async fn a_retyped_field_applies_with_nothing_to_change() {
    let db = TestFile::new();
    let first = spec(&db.endpoint(), vec![binding("pageviews", false)]);
    db.driver().apply(&first).await;
    let mut retyped = binding("pageviews", false);
    let collection = retyped.collection.as_mut().unwrap();
    let views = collection
        .projections
        .iter_mut()
        .find(|p| p.field == "views")
        .unwrap();
    views.inference.as_mut().unwrap().types = vec!["number".into()];
    let mut request = apply_request(&spec(&db.endpoint(), vec![retyped]), false);
    request.last_materialization = Some(first);
    let applied = SqliteDriver::new().apply_upsert(request).await.unwrap();
    assert_eq!(applied.action_description, "");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_newly_selected_field_becomes_a_nullable_column() {
    let db = TestFile::new();
    let added = scenarios::a_newly_selected_field_is_added_as_the_dry_run_describes(&db).await;
    assert_eq!(
        added,
        "ALTER TABLE \"pageviews\" ADD COLUMN \"meta/source\" TEXT;\n"
    );
    assert_eq!(
        columns(&db.path, "pageviews").last().unwrap(),
        &col("meta/source", "TEXT", 0)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn delta_update_tables_have_no_primary_key() {
    let db = TestFile::new();
    DRIVER
        .apply(&spec(&db.endpoint(), vec![binding("events", true)]))
        .await;
    assert!(columns(&db.path, "events").iter().all(|c| c.2 == 0));
}

#[tokio::test(flavor = "multi_thread")]
async fn reserved_mixed_case_and_quoted_names_are_quoted() {
    let db = TestFile::new();
    let weird = conformance::odd_names_binding("a\"b");
    DRIVER.apply(&spec(&db.endpoint(), vec![weird])).await;
    let names: Vec<String> = (columns(&db.path, "select").into_iter())
        .map(|c| c.0)
        .collect();
    assert_eq!(names, ["user_id", "Mixed Case", "a\"b", "flow_document"]);
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_delete_drops_tables_and_forgets_checkpoints() {
    let db = TestFile::new();
    let spec = spec(&db.endpoint(), vec![binding("pageviews", false)]);
    DRIVER.apply(&spec).await;
    let driver = SqliteDriver::new();
    let (transactor, _) = driver
        .open(conformance::open(&spec, 0, u32::MAX))
        .await
        .unwrap();
    transactor.destroy().await;

    let deleted = driver
        .apply_delete(apply_request(&spec, false))
        .await
        .unwrap();
    assert_eq!(
        deleted.action_description,
        "DROP TABLE IF EXISTS \"pageviews\";\nDROP TABLE IF EXISTS \"sluice_checkpoints\";\n"
    );
    assert!(columns(&db.path, "pageviews").is_empty());
    let again = driver
        .apply_delete(apply_request(&spec, false))
        .await
        .unwrap();
    assert_eq!(again.action_description, "");
}

#[tokio::test(flavor = "multi_thread")]
async fn open_before_apply_asks_for_apply() {
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(
        &endpoint(&dir.path().join("views.db")),
        vec![binding("pageviews", false)],
    );
    let err = SqliteDriver::new()
        .open(conformance::open(&spec, 0, u32::MAX))
        .await
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("apply the materialization first"),
        "{err}"
    );
}

#[tokio::test]
async fn spec_returns_both_schemas() {
    let spec = SqliteDriver::new()
        .spec(m::SpecRequest::default())
        .await
        .unwrap();
    let endpoint: serde_json::Value =
        serde_json::from_str(&spec.endpoint_spec_schema_json).unwrap();
    let resource: serde_json::Value =
        serde_json::from_str(&spec.resource_spec_schema_json).unwrap();
    assert_eq!(endpoint["required"], serde_json::json!(["path"]));
    assert_eq!(resource["required"], serde_json::json!(["table"]));
    assert!(!spec.documentation_url.is_empty());
}

fn validate_request(resource: serde_json::Value) -> m::ValidateRequest {
    m::ValidateRequest {
        materialization: conformance::MATERIALIZATION.into(),
        endpoint_type: sluice_driver_sdk::flow::EndpointType::Sqlite as i32,
        endpoint_spec_json: r#"{"path": "views.db"}"#.into(),
        bindings: vec![m::validate_request::Binding {
            resource_spec_json: resource.to_string(),
            collection: Some(collection()),
            field_config_json: Default::default(),
            backfill: 0,
        }],
    }
}

fn constraint_types(binding: &m::validate_response::Binding) -> Vec<(String, Type)> {
    let mut types: Vec<(String, Type)> = binding
        .constraints
        .iter()
        .map(|(field, c)| (field.clone(), c.r#type()))
        .collect();
    types.sort_by(|a, b| a.0.cmp(&b.0));
    types
}

#[tokio::test]
async fn validate_constrains_every_projection() {
    let response = SqliteDriver::new()
        .validate(validate_request(serde_json::json!({"table": "pageviews"})))
        .await
        .unwrap();
    let binding = &response.bindings[0];
    assert_eq!(binding.resource_path, ["pageviews"]);
    assert!(!binding.delta_updates);
    let want = [
        ("active", Type::LocationRecommended),
        ("day", Type::LocationRecommended),
        ("flow_document", Type::FieldRequired),
        ("meta/source", Type::FieldOptional),
        ("nothing", Type::FieldForbidden),
        ("score", Type::LocationRecommended),
        ("seen_at", Type::LocationRecommended),
        ("tags", Type::LocationRecommended),
        ("user_id", Type::LocationRequired),
        ("views", Type::LocationRecommended),
    ];
    let want: Vec<(String, Type)> = want.iter().map(|(f, t)| (f.to_string(), *t)).collect();
    assert_eq!(constraint_types(binding), want);
}

#[tokio::test]
async fn validate_of_delta_updates_only_recommends_the_document() {
    let response = SqliteDriver::new()
        .validate(validate_request(
            serde_json::json!({"table": "events", "delta_updates": true}),
        ))
        .await
        .unwrap();
    let binding = &response.bindings[0];
    assert!(binding.delta_updates);
    assert_eq!(
        binding.constraints["flow_document"].r#type(),
        Type::LocationRecommended
    );
}

#[tokio::test]
async fn validate_names_the_bad_resource_field() {
    let err = SqliteDriver::new()
        .validate(validate_request(serde_json::json!({"tabel": "pageviews"})))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("bindings[0]: invalid configuration: resource config"),
        "{err}"
    );
}
