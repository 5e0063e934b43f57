//! Spec, Validate and Apply against the real server, each test in a database of its own.

mod common;

use common::{DRIVER, TestDb};
use serde_json::{Value, json};
use sluice_driver_sdk::Driver;
use sluice_mysql::MysqlDriver;
use sluice_testkit::conformance::{self, apply_request, binding, scenarios, spec, view};

/// `[name, type, nullable, key, comment]` of each column of `table`, in order.
async fn columns(db: &TestDb, table: &str) -> Vec<Value> {
    db.rows(&format!(
        "SELECT JSON_ARRAY(COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLUMN_KEY, COLUMN_COMMENT) \
         FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE() \
         AND TABLE_NAME = '{table}' ORDER BY ORDINAL_POSITION"
    ))
    .await
}

fn comment(source: &str) -> String {
    format!("Materialized by Sluice from {source}")
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_creates_typed_table_keyed_by_collection_key_with_source_comments() {
    let db = TestDb::new().await;
    let spec = spec(&db.endpoint(), vec![binding("pageviews", false)]);
    DRIVER.apply(&spec).await;
    let col = |name: &str, ty: &str, nullable: &str, key: &str, source: &str| {
        json!([name, ty, nullable, key, comment(source)])
    };
    let of = |ptr: &str| format!("{ptr} of acme/pageviews");
    assert_eq!(
        columns(&db, "pageviews").await,
        [
            col("user_id", "varchar(255)", "NO", "PRI", &of("/user_id")),
            col("views", "bigint(20)", "YES", "", &of("/views")),
            col("score", "double", "YES", "", &of("/score")),
            col("active", "tinyint(1)", "YES", "", &of("/active")),
            col("tags", "longtext", "YES", "", &of("/tags")),
            col("seen_at", "longtext", "YES", "", &of("/seen_at")),
            col(
                "flow_document",
                "longtext",
                "YES",
                "",
                "the whole document of acme/pageviews"
            ),
        ]
    );
    let collation = db
        .rows(
            "SELECT JSON_ARRAY(COLLATION_NAME) FROM information_schema.COLUMNS \
             WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'pageviews' \
             AND COLUMN_NAME = 'user_id'",
        )
        .await;
    assert_eq!(collation, [json!(["utf8mb4_nopad_bin"])]);
    let checkpoints: Vec<Value> = columns(&db, "sluice_checkpoints")
        .await
        .into_iter()
        .map(|c| c[0].clone())
        .collect();
    assert_eq!(checkpoints, conformance::CHECKPOINT_COLUMNS);
}

#[tokio::test(flavor = "multi_thread")]
async fn json_columns_refuse_text_that_is_not_json() {
    let db = TestDb::new().await;
    DRIVER
        .apply(&spec(&db.endpoint(), vec![binding("pageviews", false)]))
        .await;
    let mut conn = db.conn().await;
    let insert = format!(
        "INSERT INTO `{}`.`pageviews` (`user_id`, `tags`) VALUES ('a', 'not json')",
        db.database
    );
    let err = mysql_async::prelude::Queryable::query_drop(&mut conn, insert)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("CONSTRAINT"), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn reapplying_the_same_spec_does_nothing() {
    scenarios::reapplying_the_same_spec_does_nothing(&TestDb::new().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn dry_run_returns_the_exact_sql_and_changes_nothing() {
    let db = TestDb::new().await;
    let spec = spec(&db.endpoint(), vec![binding("pageviews", false)]);
    let dry = MysqlDriver::new()
        .apply_upsert(apply_request(&spec, true))
        .await
        .unwrap();
    let c = |field: &str, ty: &str, source: &str| {
        format!("`{field}` {ty} COMMENT '{}'", comment(source))
    };
    let of = |ptr: &str| format!("{ptr} of acme/pageviews");
    let expected = [
        "CREATE TABLE IF NOT EXISTS `sluice_checkpoints` (`materialization` VARCHAR(512) \
         CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL, `key_begin` BIGINT NOT NULL, \
         `key_end` BIGINT NOT NULL, `fence` BIGINT NOT NULL, `checkpoint` LONGBLOB NOT NULL, \
         PRIMARY KEY (`materialization`, `key_begin`, `key_end`)) ENGINE=InnoDB;\n"
            .to_owned(),
        format!(
            "CREATE TABLE IF NOT EXISTS `pageviews` ({}, {}, {}, {}, {}, {}, {}, \
             PRIMARY KEY (`user_id`)) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4;\n",
            c(
                "user_id",
                "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin NOT NULL",
                &of("/user_id")
            ),
            c("views", "BIGINT", &of("/views")),
            c("score", "DOUBLE", &of("/score")),
            c("active", "BOOLEAN", &of("/active")),
            c("tags", "JSON", &of("/tags")),
            c("seen_at", "LONGTEXT", &of("/seen_at")),
            c(
                "flow_document",
                "JSON",
                "the whole document of acme/pageviews"
            ),
        ),
        "INSERT IGNORE INTO `sluice_checkpoints` VALUES ('acme/views-db', -1, -1, 0, X'7631');\n"
            .to_owned(),
    ]
    .concat();
    assert_eq!(dry.action_description, expected);
    let tables = db
        .rows("SELECT JSON_ARRAY(TABLE_NAME) FROM information_schema.TABLES WHERE TABLE_SCHEMA = DATABASE()")
        .await;
    assert!(tables.is_empty(), "a dry run created {tables:?}");
    // The real apply runs exactly what the dry run described.
    assert_eq!(DRIVER.apply(&spec).await, dry.action_description);
}

/// An integer column does not take numbers: the Apply that would write them is
/// refused until the binding's backfill is raised.
#[tokio::test(flavor = "multi_thread")]
async fn a_field_retyped_beyond_its_column_is_refused_unless_backfilled() {
    let db = TestDb::new().await;
    let refused = scenarios::a_retyped_field_is_refused_unless_backfilled(&db).await;
    assert!(
        refused.contains("which its MariaDB column cannot hold"),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_newly_selected_field_becomes_a_nullable_column() {
    let db = TestDb::new().await;
    let dry = scenarios::a_newly_selected_field_is_added_as_the_dry_run_describes(&db).await;
    assert_eq!(
        dry,
        format!(
            "ALTER TABLE `pageviews` ADD COLUMN `meta/source` LONGTEXT COMMENT '{}';\n",
            comment("/meta/source of acme/pageviews")
        )
    );
    let last = columns(&db, "pageviews").await.pop().unwrap();
    assert_eq!(
        last,
        json!([
            "meta/source",
            "longtext",
            "YES",
            "",
            comment("/meta/source of acme/pageviews")
        ])
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn reserved_mixed_case_and_quoted_names_store_and_load() {
    let db = TestDb::new().await;
    let weird = conformance::odd_names_binding("a`b");
    let mut other = binding("a`b", false);
    other.field_selection.as_mut().unwrap().values.clear();
    let (_, mut session, _) = scenarios::apply_and_open(&db, vec![weird, other]).await;
    let stored = conformance::store_values(
        0,
        &["/user_id"],
        &["/views", "/score"],
        &[(view("o'hara\\", 3), false)],
    );
    let other = conformance::store_values(1, &["/user_id"], &[], &[(view("x", 1), false)]);
    session
        .transaction(vec![], b"cp-1", vec![stored, other])
        .await
        .unwrap();
    let loaded = session
        .transaction(
            vec![
                conformance::load(0, &[json!(["o'hara\\"])]),
                conformance::load(1, &[json!(["x"])]),
            ],
            b"cp-2",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(loaded, [view("o'hara\\", 3), view("x", 1)]);
    let rows = db
        .rows("SELECT JSON_ARRAY(`user_id`, `Mixed Case`, `a``b`) FROM `select`")
        .await;
    assert_eq!(rows, [json!(["o'hara\\", 3, 1.5])]);
}

#[tokio::test(flavor = "multi_thread")]
async fn validate_requires_keys_and_document_and_forbids_untyped_fields() {
    let db = TestDb::new().await;
    let path = scenarios::validate_requires_keys_and_document_and_forbids_untyped_fields(&db).await;
    assert_eq!(path, [db.database.clone(), "pageviews".into()]);
}

#[tokio::test(flavor = "multi_thread")]
async fn apply_delete_drops_tables_and_forgets_checkpoints() {
    let deleted = scenarios::apply_delete_forgets_checkpoints(&TestDb::new().await).await;
    assert_eq!(
        deleted,
        "DROP TABLE IF EXISTS `pageviews`;\nDROP TABLE IF EXISTS `sluice_checkpoints`;\n"
    );
}
