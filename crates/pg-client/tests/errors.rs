//! The server's errors as [`pg_error`] classifies them, on the real server
//! (`SLUICE_TEST_POSTGRES_URL`, by default `postgres://postgres@127.0.0.1:5432/test`):
//! what a retry cannot mend fails for good with the server's reason; a conflict with
//! another transaction, or a connection the server ends, is retryable.

use sluice_driver_sdk::Error;
use sluice_pg_client::tokio_postgres::Client;
use sluice_pg_client::{EndpointConfig, connect, pg_error};
use sluice_testkit::conformance;

fn server_url() -> String {
    conformance::server_url(
        "SLUICE_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    )
}

fn endpoint(url: &str) -> EndpointConfig {
    EndpointConfig::parse(&serde_json::json!({ "url": url }).to_string()).unwrap()
}

async fn connected(url: &str) -> Client {
    connect(&endpoint(url)).await.unwrap()
}

/// The message and retryability of `err`, which must be a store error.
fn store_error(err: Error) -> (String, bool) {
    match err {
        Error::Store {
            message, retryable, ..
        } => (message, retryable),
        other => panic!("expected a store error, got {other:?}"),
    }
}

#[tokio::test]
async fn an_error_is_retryable_only_for_the_codes_a_new_attempt_may_pass() {
    let client = connected(&server_url()).await;
    let cases = [
        ("40001", "serialization_failure", true),
        ("40P01", "deadlock_detected", true),
        ("53300", "too_many_connections", true),
        ("08006", "connection_failure", true),
        ("23505", "unique_violation", false),
        ("22012", "division_by_zero", false),
    ];
    for (code, name, retryable) in cases {
        // The server itself raises the error, with the code a real failure carries.
        let raise = format!(
            "DO $$ BEGIN RAISE EXCEPTION 'raised {name}' USING ERRCODE = '{code}', \
             DETAIL = 'on purpose'; END $$"
        );
        let err = client.batch_execute(&raise).await.unwrap_err();
        let (message, is_retryable) = store_error(pg_error(format!("raising {code}"), err));
        assert_eq!(is_retryable, retryable, "{code} ({name}): {message}");
        assert_eq!(message, format!("raised {name} (on purpose)"), "{code}");
    }
}

#[tokio::test]
async fn a_connection_the_server_ends_is_retryable() {
    let name = conformance::unique_name();
    let client = connected(&format!("{}?application_name={name}", server_url())).await;
    let admin = connected(&server_url()).await;
    let ended = admin
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE application_name = $1",
            &[&name],
        )
        .await
        .unwrap();
    assert_eq!(ended.get::<_, i64>(0), 1, "one connection of {name} ended");
    let err = client.simple_query("SELECT 1").await.unwrap_err();
    let (message, retryable) = store_error(pg_error("SELECT 1", err));
    assert!(retryable, "{message}");
}

#[tokio::test]
async fn a_database_that_does_not_exist_is_refused_for_good_naming_the_server() {
    let url = server_url();
    let (server, _) = url.rsplit_once('/').unwrap();
    let missing = format!("{server}/{}", conformance::unique_name());
    let err = connect(&endpoint(&missing)).await.map(drop).unwrap_err();
    let shown = err.to_string();
    let (message, retryable) = store_error(err);
    assert!(!retryable, "{message}");
    assert!(message.contains("does not exist"), "{message}");
    assert!(shown.contains("connecting to postgres://"), "{shown}");
}
