//! Connections that cannot be made end as retryable store errors naming the server:
//! a server that accepts and never answers, within `connect_timeout`; a port nobody
//! listens on, at once. A server that refuses TLS fails `sslmode=require` for good.

use sluice_driver_sdk::Error;
use sluice_pg_client::{EndpointConfig, connect};
use sluice_testkit::conformance::tls::{self, SilentServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The context and message of a connection to `url` that failed retryably.
async fn retryable_failure(url: &str) -> String {
    let endpoint = serde_json::json!({ "url": url }).to_string();
    tls::retryable_failure(connect(&EndpointConfig::parse(&endpoint).unwrap()).await)
}

#[tokio::test]
async fn a_server_that_never_answers_is_a_retryable_error_after_connect_timeout() {
    let silent = SilentServer::start().await;
    let url = format!(
        "postgres://u@127.0.0.1:{}/db?connect_timeout=1",
        silent.port
    );
    let err = retryable_failure(&url).await;
    let server = format!("connecting to postgres://u@127.0.0.1:{}/db", silent.port);
    assert!(err.starts_with(&server), "{err}");
    assert!(err.contains("no answer within connect_timeout=1s"), "{err}");
}

#[tokio::test]
async fn a_port_nobody_listens_on_is_a_retryable_error_naming_the_server() {
    let port = tls::closed_port();
    let err = retryable_failure(&format!("postgres://u@127.0.0.1:{port}/db")).await;
    assert!(
        err.starts_with(&format!("connecting to postgres://u@127.0.0.1:{port}/db")),
        "{err}"
    );
}

#[tokio::test]
async fn a_server_refusing_tls_fails_sslmode_require_naming_the_option() {
    // Answers the client's SSLRequest (8 bytes) with 'N', as a server with ssl=off does.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let refusing = tokio::spawn(async move {
        let (mut connection, _) = listener.accept().await.unwrap();
        let mut request = [0; 8];
        connection.read_exact(&mut request).await.unwrap();
        connection.write_all(b"N").await.unwrap();
        connection
    });
    let url = format!("postgres://u@127.0.0.1:{port}/db?sslmode=require");
    let endpoint = serde_json::json!({ "url": url }).to_string();
    let err = connect(&EndpointConfig::parse(&endpoint).unwrap())
        .await
        .map(drop);
    match err {
        Err(Error::Store {
            message,
            retryable: false,
            ..
        }) => assert!(
            message.contains("sslmode=require: the server does not accept TLS connections"),
            "{message}"
        ),
        other => panic!("expected a store error that is not retryable, got {other:?}"),
    }
    drop(refusing.await);
}
