//! Fixtures of the SQLite driver's tests beyond [`sluice_testkit::conformance`]: the driver
//! under test, the endpoint configuration of a database file, and [`TestFile`], a
//! private database file that the shared scenarios run against.

#![allow(dead_code)] // Each test binary uses its own subset of the fixtures.

use rusqlite::Connection;
use serde_json::{Value, json};
use sluice_sqlite::SqliteDriver;
use sluice_testkit::conformance::TestDriver;
use sluice_testkit::conformance::scenarios::TestStore;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The SqliteDriver, in process.
pub const DRIVER: TestDriver = TestDriver {
    name: "sqlite",
    driver: || Arc::new(SqliteDriver::new()),
};

/// The endpoint configuration of the database file `db`.
pub fn endpoint(db: &Path) -> Value {
    json!({ "path": db })
}

/// A database file of this test's own, in a temporary directory removed at the end.
pub struct TestFile {
    _dir: tempfile::TempDir,
    pub path: PathBuf,
}

impl TestFile {
    pub fn new() -> TestFile {
        let dir = tempfile::tempdir().expect("creating a temporary directory");
        let path = dir.path().join("views.db");
        TestFile { _dir: dir, path }
    }

    /// The first column of each row of `sql`.
    pub fn query<T: rusqlite::types::FromSql>(&self, sql: &str) -> Vec<T> {
        let conn = Connection::open(&self.path).unwrap();
        let mut stmt = conn
            .prepare(sql)
            .unwrap_or_else(|err| panic!("{sql}: {err}"));
        stmt.query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    }
}

impl TestStore for TestFile {
    fn driver(&self) -> TestDriver {
        DRIVER
    }

    fn endpoint(&self) -> Value {
        endpoint(&self.path)
    }

    async fn user_views(&self, table: &str) -> Vec<Value> {
        let sql =
            format!("SELECT json_array(user_id, views) FROM \"{table}\" ORDER BY user_id, views");
        let rows: Vec<String> = self.query(&sql);
        rows.iter()
            .map(|row| serde_json::from_str(row).expect("json_array is JSON"))
            .collect()
    }
}
