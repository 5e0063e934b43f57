//! Spec, Validate and Apply against the real server, each test in a schema of its own.

mod common;

use common::{DRIVER, TestDb};
use serde_json::{Value, json};
use sluice_driver_sdk::Driver;
use sluice_postgres::PostgresDriver;
use sluice_testkit::conformance::{self, apply_request, binding, scenarios, spec, view};

/// `[name, type, nullable, comment]` of each column of `table`, in order.
async fn columns(db: &TestDb, table: &str) -> Vec<Value> {
    let sql = format!(
        "SELECT json_build_array(a.attname, format_type(a.atttypid, a.atttypmod), \
         NOT a.attnotnull, col_description(a.attrelid, a.attnum)) \
         FROM pg_attribute a WHERE a.attrelid = '{}'::regclass AND a.attnum > 0 \
         AND NOT a.attisdropped ORDER BY a.attnum",
        sluice_postgres::sql::qualify(&db.schema, table).replace('\'', "''")
    );
    db.rows(&sql).await
}

/// The primary-key columns of `table`, in key order.
async fn primary_key(db: &TestDb, table: &str) -> Vec<Value> {
    let sql = format!(
        "SELECT to_json(a.attname) FROM pg_index i \
         JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) \
         WHERE i.indrelid = '{}'::regclass AND i.indisprimary",
        sluice_postgres::sql::qualify(&db.schema, table).replace('\'', "''")
    );
    db.rows(&sql).await
}

fn comment(source: &str) -> String {
    format!("Materialized by Sluice from {source}")
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_creates_typed_table_keyed_by_collection_key_with_source_comments() {
    let db = TestDb::new();
    let spec = spec(&db.endpoint(), vec![binding("pageviews", false)]);
    DRIVER.apply(&spec).await;
    let col = |name: &str, ty: &str, nullable: bool, source: &str| {
        json!([name, ty, nullable, comment(source)])
    };
    assert_eq!(
        columns(&db, "pageviews").await,
        [
            col("user_id", "text", false, "/user_id of acme/pageviews"),
            col("views", "bigint", true, "/views of acme/pageviews"),
            col(
                "score",
                "double precision",
                true,
                "/score of acme/pageviews"
            ),
            col("active", "boolean", true, "/active of acme/pageviews"),
            col("tags", "jsonb", true, "/tags of acme/pageviews"),
            col(
                "seen_at",
                "timestamp with time zone",
                true,
                "/seen_at of acme/pageviews"
            ),
            col(
                "flow_document",
                "json",
                true,
                "the whole document of acme/pageviews"
            ),
        ]
    );
    assert_eq!(primary_key(&db, "pageviews").await, [json!("user_id")]);
    let checkpoints: Vec<Value> = columns(&db, "sluice_checkpoints")
        .await
        .into_iter()
        .map(|c| c[0].clone())
        .collect();
    assert_eq!(checkpoints, conformance::CHECKPOINT_COLUMNS);
}

#[tokio::test(flavor = "multi_thread")]
async fn reapplying_the_same_spec_does_nothing() {
    scenarios::reapplying_the_same_spec_does_nothing(&TestDb::new()).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn dry_run_returns_the_exact_sql_and_changes_nothing() {
    let db = TestDb::new();
    let spec = spec(&db.endpoint(), vec![binding("pageviews", false)]);
    let driver = PostgresDriver::new();
    let dry = driver
        .apply_upsert(apply_request(&spec, true))
        .await
        .unwrap();
    let s = &db.schema;
    let c = |field: &str, source: &str| {
        format!(
            "COMMENT ON COLUMN \"{s}\".\"pageviews\".\"{field}\" IS '{}';\n",
            comment(source)
        )
    };
    let expected = [
        format!("CREATE SCHEMA IF NOT EXISTS \"{s}\";\n"),
        format!(
            "CREATE TABLE IF NOT EXISTS \"{s}\".\"sluice_checkpoints\" (\"materialization\" text NOT NULL, \
             \"key_begin\" bigint NOT NULL, \"key_end\" bigint NOT NULL, \"fence\" bigint NOT NULL, \
             \"checkpoint\" bytea NOT NULL, PRIMARY KEY (\"materialization\", \"key_begin\", \"key_end\"));\n"
        ),
        format!(
            "CREATE TABLE IF NOT EXISTS \"{s}\".\"pageviews\" (\"user_id\" text NOT NULL, \
             \"views\" bigint, \"score\" double precision, \"active\" boolean, \"tags\" jsonb, \
             \"seen_at\" timestamptz, \"flow_document\" json, PRIMARY KEY (\"user_id\")) \
             WITH (fillfactor = 50);\n"
        ),
        c("user_id", "/user_id of acme/pageviews"),
        c("views", "/views of acme/pageviews"),
        c("score", "/score of acme/pageviews"),
        c("active", "/active of acme/pageviews"),
        c("tags", "/tags of acme/pageviews"),
        c("seen_at", "/seen_at of acme/pageviews"),
        c("flow_document", "the whole document of acme/pageviews"),
        format!(
            "INSERT INTO \"{s}\".\"sluice_checkpoints\" VALUES ('acme/views-db', -1, -1, 0, \
             '\\x7631'::bytea) ON CONFLICT DO NOTHING;\n"
        ),
    ]
    .concat();
    assert_eq!(dry.action_description, expected);
    let schemas = db
        .rows(&format!(
            "SELECT to_json(nspname) FROM pg_namespace WHERE nspname = '{s}'"
        ))
        .await;
    assert!(schemas.is_empty(), "a dry run must not create the schema");
    // The real apply runs exactly what the dry run described.
    assert_eq!(DRIVER.apply(&spec).await, dry.action_description);
    // Half of each page stays free for its rows' next versions (HOT updates).
    let options = db
        .rows(&format!(
            "SELECT to_json(c.reloptions) FROM pg_class c JOIN pg_namespace n \
             ON n.oid = c.relnamespace WHERE n.nspname = '{s}' AND c.relname = 'pageviews'"
        ))
        .await;
    assert_eq!(options, vec![json!(["fillfactor=50"])]);
}

/// An integer column does not take numbers: the Apply that would write them is
/// refused until the binding's backfill is raised.
#[tokio::test(flavor = "multi_thread")]
async fn a_field_retyped_beyond_its_column_is_refused_unless_backfilled() {
    let db = TestDb::new();
    let refused = scenarios::a_retyped_field_is_refused_unless_backfilled(&db).await;
    assert!(
        refused.contains("which its PostgreSQL column cannot hold"),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_newly_selected_field_becomes_a_nullable_column() {
    let db = TestDb::new();
    let dry = scenarios::a_newly_selected_field_is_added_as_the_dry_run_describes(&db).await;
    let s = &db.schema;
    assert_eq!(
        dry,
        format!(
            "ALTER TABLE \"{s}\".\"pageviews\" ADD COLUMN \"meta/source\" text;\n\
             COMMENT ON COLUMN \"{s}\".\"pageviews\".\"meta/source\" IS '{}';\n",
            comment("/meta/source of acme/pageviews")
        )
    );
    let last = columns(&db, "pageviews").await.pop().unwrap();
    assert_eq!(
        last,
        json!([
            "meta/source",
            "text",
            true,
            comment("/meta/source of acme/pageviews")
        ])
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn reserved_mixed_case_and_quoted_names_store_and_load() {
    let db = TestDb::new();
    let weird = conformance::odd_names_binding("a\"b");
    let mut other = binding("Mixed Case", false);
    other.field_selection.as_mut().unwrap().values.clear();
    let (_, mut session, _) = scenarios::apply_and_open(&db, vec![weird, other]).await;
    let stored = conformance::store_values(
        0,
        &["/user_id"],
        &["/views", "/score"],
        &[(view("o'hara", 3), false)],
    );
    session
        .transaction(vec![], b"cp-1", vec![stored])
        .await
        .unwrap();
    let loaded = session
        .transaction(
            vec![conformance::load(0, &[json!(["o'hara"])])],
            b"cp-2",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(loaded, [view("o'hara", 3)]);
    let rows = db
        .rows(&format!(
            "SELECT json_build_array(\"user_id\", \"Mixed Case\", \"a\"\"b\") FROM \"{}\".\"select\"",
            db.schema
        ))
        .await;
    assert_eq!(rows, [json!(["o'hara", 3, 1.5])]);
}

#[tokio::test(flavor = "multi_thread")]
async fn validate_requires_keys_and_document_and_forbids_untyped_fields() {
    let db = TestDb::new();
    let path = scenarios::validate_requires_keys_and_document_and_forbids_untyped_fields(&db).await;
    assert_eq!(path, [db.schema.clone(), "pageviews".into()]);
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_delete_drops_tables_and_forgets_checkpoints() {
    let deleted = scenarios::apply_delete_forgets_checkpoints(&TestDb::new()).await;
    assert!(deleted.contains("DROP TABLE IF EXISTS"), "{deleted}");
    // The test's schema held nothing else: it goes with the checkpoints table.
    assert!(deleted.contains("DROP SCHEMA IF EXISTS"), "{deleted}");
}
