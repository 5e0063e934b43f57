//! Fixtures shared by the PostgreSQL driver's tests: a schema of its own per test
//! ([`TestDb`], dropped at the end even if the test fails)
//! and the driver under test; the collection, specs, messages and the runtime-side
//! session come from [`sluice_testkit::conformance`].
//!
//! The server is `SLUICE_TEST_POSTGRES_URL`, by default
//! `postgres://postgres@127.0.0.1:5432/test` (started by `.ci/services`).

#![allow(dead_code)] // Each test binary uses its own subset of the fixtures.

use serde_json::{Value, json};
use sluice_postgres::PostgresDriver;
use sluice_testkit::conformance::scenarios::{ServerStore, TestStore};
use sluice_testkit::conformance::{self, TestDriver};
use std::sync::Arc;
use tokio_postgres::NoTls;

fn server_url() -> String {
    conformance::server_url(
        "SLUICE_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    )
}

/// A schema of this test's own, named by [`conformance::unique_name`]. Connections of the
/// driver under test carry the schema's name as their `application_name`, so a test
/// can find and kill them.
pub struct TestDb {
    pub schema: String,
    /// The driver's URL: the server plus `application_name=<schema>`.
    pub url: String,
}

impl TestDb {
    pub fn new() -> TestDb {
        let schema = conformance::unique_name();
        let url = format!("{}?application_name={schema}", server_url());
        TestDb { schema, url }
    }

    /// The endpoint configuration of this schema.
    pub fn endpoint(&self) -> Value {
        json!({ "url": self.url, "schema": self.schema })
    }

    /// A connection of the test itself (not named like the driver's).
    pub async fn client(&self) -> tokio_postgres::Client {
        let (client, connection) = tokio_postgres::connect(&server_url(), NoTls)
            .await
            .expect("connecting to the test server");
        tokio::spawn(connection);
        client
    }

    /// Rows of `sql`, each as a JSON value (the query must select one json column).
    pub async fn rows(&self, sql: &str) -> Vec<Value> {
        let client = self.client().await;
        client
            .query(sql, &[])
            .await
            .unwrap_or_else(|err| panic!("{sql}: {err}"))
            .iter()
            .map(|row| row.get(0))
            .collect()
    }

    /// Ends every connection the driver under test holds (a server-side disconnect).
    pub async fn kill_driver_connections(&self) -> u64 {
        self.client()
            .await
            .execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                 WHERE application_name = $1",
                &[&self.schema],
            )
            .await
            .unwrap()
    }
}

impl Drop for TestDb {
    /// Ends the driver's leftover connections, then drops the schema.
    fn drop(&mut self) {
        let schema = self.schema.clone();
        conformance::run_detached(async move {
            let Ok((client, connection)) = tokio_postgres::connect(&server_url(), NoTls).await
            else {
                return;
            };
            tokio::spawn(connection);
            let _ = client
                .execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
                     WHERE application_name = $1",
                    &[&schema],
                )
                .await;
            let drop = format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE");
            if let Err(err) = client.batch_execute(&drop).await {
                eprintln!("{drop}: {err}");
            }
        });
    }
}

/// The PostgresDriver, in process.
pub const DRIVER: TestDriver = TestDriver {
    name: "postgres",
    driver: || Arc::new(PostgresDriver::new()),
};

impl TestStore for TestDb {
    fn driver(&self) -> TestDriver {
        DRIVER
    }

    fn endpoint(&self) -> Value {
        TestDb::endpoint(self)
    }

    async fn user_views(&self, table: &str) -> Vec<Value> {
        let table = sluice_postgres::sql::qualify(&self.schema, table);
        self.rows(&format!(
            "SELECT json_build_array(user_id, views) FROM {table} ORDER BY user_id, views"
        ))
        .await
    }
}

impl ServerStore for TestDb {
    async fn kill_driver_connections(&self) -> usize {
        TestDb::kill_driver_connections(self).await as usize
    }
}
