//! What the end-to-end tests share: the pageviews pipeline, its expected reduction
//! computed independently of Sluice's reducers, and running the binary.

// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::process::Output;

pub const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// The shared PostgreSQL server's test database.
pub const POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// Runs `f` with a client of the shared PostgreSQL server, on a runtime of its own
/// (the tests themselves are synchronous).
pub fn postgres<T>(f: impl AsyncFnOnce(&tokio_postgres::Client) -> T) -> T {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(POSTGRES_URL, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        f(&client).await
    })
}

/// Deterministic input: `n` documents over `keys` users.
pub fn generate(n: usize, keys: usize, seed: u64) -> Vec<Value> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 33
    };
    (0..n)
        .map(|i| {
            let user = next() as usize % keys;
            json!({
                "user_id": format!("user-{user:05}"),
                "views": (next() % 10) as i64,
                "bytes": (next() % 5000) as i64,
                "last_seen": format!("2026-11-{:02}T{:02}:00:{:02}Z", 1 + next() % 28, next() % 24, i % 60),
            })
        })
        .collect()
}

pub fn write_lines(path: &Path, docs: &[Value]) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for d in docs {
        serde_json::to_writer(&mut f, d).unwrap();
        f.write_all(b"\n").unwrap();
    }
}

/// The expected row of one user: views and bytes summed, last_seen maximized.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Row {
    pub views: i64,
    pub bytes: i64,
    pub last_seen: String,
}

impl Row {
    /// Reduces one more document (or row) of this user into the row.
    pub fn add(&mut self, views: i64, bytes: i64, last_seen: &str) {
        self.views += views;
        self.bytes += bytes;
        if last_seen > self.last_seen.as_str() {
            self.last_seen = last_seen.to_string();
        }
    }
}

/// The rows of the `pageviews` table of the SQLite database `db`:
/// (user_id, views, bytes, last_seen).
pub fn sqlite_rows(db: &Path) -> Vec<(String, i64, i64, String)> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut stmt = conn
        .prepare(r#"SELECT "user_id", "views", "bytes", "last_seen" FROM "pageviews""#)
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// The SQLite table `pageviews` of `db`, per user.
pub fn sqlite_table(db: &Path) -> BTreeMap<String, Row> {
    let mut table: BTreeMap<String, Row> = BTreeMap::new();
    for (user, views, bytes, seen) in sqlite_rows(db) {
        table.entry(user).or_default().add(views, bytes, &seen);
    }
    table
}

/// The reduction of `docs` per user, as the pipeline's schema says.
pub fn reduce_expected(docs: &[Value]) -> BTreeMap<String, Row> {
    let mut out: BTreeMap<String, Row> = BTreeMap::new();
    for doc in docs {
        out.entry(doc["user_id"].as_str().unwrap().to_string())
            .or_default()
            .add(
                doc["views"].as_i64().unwrap(),
                doc["bytes"].as_i64().unwrap(),
                doc["last_seen"].as_str().unwrap(),
            );
    }
    out
}

/// A pipeline of the pageviews collection: `source` is the YAML of the source's kind
/// (indented for the source), `endpoint` the endpoint's (indented for the endpoint).
/// Transactions hold exactly `max_docs` documents unless `max_duration` passes first
/// (they never close early otherwise), so tests know which documents each one holds.
pub fn pipeline_yaml(
    source: &str,
    endpoint: &str,
    delta_updates: bool,
    max_docs: u64,
    max_duration: &str,
) -> String {
    format!(
        r#"
collections:
  acme/pageviews:
    key: [/user_id]
    schema:
      type: object
      required: [user_id, views, bytes, last_seen]
      reduce: {{strategy: merge}}
      properties:
        user_id: {{type: string}}
        views: {{type: integer, reduce: {{strategy: sum}}}}
        bytes: {{type: integer, reduce: {{strategy: sum}}}}
        last_seen: {{type: string, reduce: {{strategy: maximize}}}}
sources:
  views-file:
    target: acme/pageviews
{source}
materializations:
  views-db:
    endpoint:
      {endpoint}
    bindings:
      - source: acme/pageviews
        resource: {{table: pageviews}}
        delta_updates: {delta_updates}
runtime:
  transactions: {{max_docs: {max_docs}, max_duration: {max_duration}, min_duration: {max_duration}}}
"#
    )
}

pub fn assert_success(out: &Output) {
    assert!(
        out.status.success(),
        "sluice run failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The `pageviews` table of `schema`, per user, asserting no user has two rows.
pub fn postgres_table(schema: &str) -> BTreeMap<String, Row> {
    let sql =
        format!(r#"SELECT "user_id", "views", "bytes", "last_seen" FROM "{schema}"."pageviews""#);
    let rows: Vec<(String, i64, i64, String)> = postgres(async |c| {
        c.query(&sql, &[])
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect()
    });
    let mut table: BTreeMap<String, Row> = BTreeMap::new();
    for (user, views, bytes, seen) in rows {
        assert!(!table.contains_key(&user), "{user} written twice");
        table.entry(user).or_default().add(views, bytes, &seen);
    }
    table
}

/// A schema of the shared server (`sluice_<tag>_<pid>`), dropped when dropped.
pub struct Schema(pub String);

impl Schema {
    pub fn new(tag: &str) -> Schema {
        let name = format!("sluice_{tag}_{}", std::process::id());
        let sql = format!(r#"DROP SCHEMA IF EXISTS "{name}" CASCADE; CREATE SCHEMA "{name}""#);
        postgres(async |c| c.batch_execute(&sql).await.unwrap());
        Schema(name)
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let sql = format!(r#"DROP SCHEMA IF EXISTS "{}" CASCADE"#, self.0);
        postgres(async |c| c.batch_execute(&sql).await.unwrap());
    }
}
