//! Fixtures shared by the MariaDB driver's tests: a database of its own per test
//! ([`TestDb`], dropped at the end even if the test fails)
//! and the driver under test; the collection, specs, messages and the runtime-side
//! session come from [`sluice_testkit::conformance`].
//!
//! The server is `SLUICE_TEST_MYSQL_URL`, by default `mysql://root@127.0.0.1:3306/test`
//! (started by `.ci/services`); each test's database is created on it.

#![allow(dead_code)] // Each test binary uses its own subset of the fixtures.

use mysql_async::prelude::Queryable;
use serde_json::{Value, json};
use sluice_mysql::MysqlDriver;
use sluice_testkit::conformance::scenarios::{ServerStore, TestStore};
use sluice_testkit::conformance::{self, TestDriver};
use std::sync::Arc;

fn server_url() -> String {
    conformance::server_url("SLUICE_TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test")
}

/// A database of this test's own, named by [`conformance::unique_name`]. Only the driver
/// under test connects to it by name, so a test can find and kill its connections.
pub struct TestDb {
    pub database: String,
    /// The driver's URL: the server with this database.
    pub url: String,
}

impl TestDb {
    pub async fn new() -> TestDb {
        let database = conformance::unique_name();
        let server = server_url();
        let base = server
            .rsplit_once('/')
            .map_or(server.as_str(), |(base, _)| base);
        let url = format!("{base}/{database}");
        let db = TestDb { database, url };
        db.execute(&format!("CREATE DATABASE `{}`", db.database))
            .await;
        db
    }

    /// The endpoint configuration of this database.
    pub fn endpoint(&self) -> Value {
        json!({ "url": self.url })
    }

    /// A connection of the test itself, to the server's default database.
    pub async fn conn(&self) -> mysql_async::Conn {
        mysql_async::Conn::from_url(server_url())
            .await
            .expect("connecting to the test server")
    }

    pub async fn execute(&self, sql: &str) {
        let mut conn = self.conn().await;
        conn.query_drop(sql)
            .await
            .unwrap_or_else(|err| panic!("{sql}: {err}"));
        let _ = conn.disconnect().await;
    }

    /// Rows of `sql` (in this database), each as a JSON value: the query must select
    /// one column of JSON text, e.g. `JSON_ARRAY(...)`.
    pub async fn rows(&self, sql: &str) -> Vec<Value> {
        let mut conn = self.conn().await;
        conn.query_drop(format!("USE `{}`", self.database))
            .await
            .unwrap();
        let texts: Vec<String> = conn
            .query(sql)
            .await
            .unwrap_or_else(|err| panic!("{sql}: {err}"));
        let _ = conn.disconnect().await;
        texts
            .iter()
            .map(|t| serde_json::from_str(t).unwrap_or_else(|err| panic!("{t}: {err}")))
            .collect()
    }

    /// Ends every connection the driver under test holds (a server-side disconnect).
    pub async fn kill_driver_connections(&self) -> usize {
        let mut conn = self.conn().await;
        let ids: Vec<u64> = conn
            .exec(
                "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = ?",
                (&self.database,),
            )
            .await
            .unwrap();
        for id in &ids {
            let _ = conn.query_drop(format!("KILL {id}")).await;
        }
        ids.len()
    }
}

impl Drop for TestDb {
    /// Drops the database.
    fn drop(&mut self) {
        let database = self.database.clone();
        conformance::run_detached(async move {
            let Ok(mut conn) = mysql_async::Conn::from_url(server_url()).await else {
                return;
            };
            let drop = format!("DROP DATABASE IF EXISTS `{database}`");
            if let Err(err) = conn.query_drop(&drop).await {
                eprintln!("{drop}: {err}");
            }
            let _ = conn.disconnect().await;
        });
    }
}

/// The MysqlDriver, in process.
pub const DRIVER: TestDriver = TestDriver {
    name: "mysql",
    driver: || Arc::new(MysqlDriver::new()),
};

impl TestStore for TestDb {
    fn driver(&self) -> TestDriver {
        DRIVER
    }

    fn endpoint(&self) -> Value {
        TestDb::endpoint(self)
    }

    async fn user_views(&self, table: &str) -> Vec<Value> {
        self.rows(&format!(
            "SELECT JSON_ARRAY(CAST(user_id AS CHAR), views) FROM {table} ORDER BY user_id, views"
        ))
        .await
    }
}

impl ServerStore for TestDb {
    async fn kill_driver_connections(&self) -> usize {
        TestDb::kill_driver_connections(self).await
    }
}
