//! End-to-end: `sluice run` of a `postgres_cdc` source (a private PostgreSQL with
//! `wal_level=logical`) into SQLite: the first run snapshots the table and streams what
//! changed meanwhile, a second run resumes from the slot; each time the store equals
//! the source table (deleted rows, and the old keys of rows whose key changed, gone).

use sluice_postgres_cdc::testing::LogicalPostgres;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

mod common;

use common::{SLUICE, assert_success, postgres_at, postgres_execute};

type Rows = BTreeMap<i64, (Option<String>, Option<i64>)>;

fn source_rows(url: &str) -> Rows {
    postgres_at(url, async |client| {
        let rows = client
            .query("SELECT id, name, qty::bigint FROM items", &[])
            .await
            .unwrap();
        rows.iter()
            .map(|r| (r.get(0), (r.get(1), r.get(2))))
            .collect()
    })
}

fn store_rows(db: &Path) -> Rows {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut stmt = conn
        .prepare(r#"SELECT "id", "name", "qty" FROM "items""#)
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?))))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn pipeline(url: &str) -> String {
    format!(
        r#"
collections:
  shop/items:
    key: [/id]
    schema:
      type: object
      required: [id]
      properties:
        id: {{type: integer}}
        name: {{type: [string, "null"]}}
        qty: {{type: [integer, "null"]}}
sources:
  items-cdc:
    target: shop/items
    postgres_cdc: {{url: "{url}", tables: [public.items], chunk_rows: 500}}
materializations:
  items-db:
    endpoint:
      sqlite: {{path: out/items.db}}
    bindings:
      - source: shop/items
        resource: {{table: items}}
runtime:
  transactions: {{max_docs: 700, max_duration: 1s, min_duration: 1s}}
"#
    )
}

#[test]
fn snapshot_and_streamed_changes_equal_the_source_table() {
    let pg = LogicalPostgres::start();
    let url = pg.url();
    postgres_execute(
        &url,
        "CREATE TABLE items (id bigint PRIMARY KEY, name text, qty int);
         INSERT INTO items SELECT g, 'item ' || g, g FROM generate_series(1, 3000) g;",
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    std::fs::write(&file, pipeline(&url)).unwrap();
    let run = || {
        let out = Command::new(SLUICE)
            .arg("run")
            .arg(&file)
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        assert_success(&out);
    };
    run();
    assert_eq!(
        store_rows(&dir.path().join("out/items.db")),
        source_rows(&url)
    );
    postgres_execute(
        &url,
        "UPDATE items SET qty = qty * 2 WHERE id % 7 = 0;
         INSERT INTO items SELECT g, NULL, NULL FROM generate_series(3001, 3500) g;
         UPDATE items SET name = 'renamed' WHERE id BETWEEN 10 AND 20;
         DELETE FROM items WHERE id % 5 = 0;
         UPDATE items SET id = id + 10000 WHERE id BETWEEN 100 AND 104;",
    );
    run();
    assert_eq!(
        store_rows(&dir.path().join("out/items.db")),
        source_rows(&url)
    );
}
