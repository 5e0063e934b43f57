//! Fixtures of the SQLite driver's tests beyond [`sluice_driver::testing`]: the driver
//! under test and the endpoint configuration of a database file.

#![allow(dead_code)] // Each test binary uses its own subset of the fixtures.

use serde_json::{Value, json};
use sluice_driver::testing::TestDriver;
use sluice_sqlite::SqliteDriver;
use std::path::Path;
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
