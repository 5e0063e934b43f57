//! Connections that cannot be made end as retryable store errors naming the server:
//! a server that accepts and never answers, within `connect_timeout`; a port nobody
//! listens on, at once.

use sluice_mysql::client;
use sluice_mysql::config::EndpointConfig;
use sluice_testkit::conformance::tls::{self, SilentServer};

/// The context and message of a connection to `url` that failed retryably.
async fn retryable_failure(url: &str) -> String {
    let endpoint = serde_json::json!({ "url": url }).to_string();
    tls::retryable_failure(client::connect(&EndpointConfig::parse(&endpoint).unwrap()).await)
}

#[tokio::test]
async fn a_server_that_never_answers_is_a_retryable_error_after_connect_timeout() {
    let silent = SilentServer::start().await;
    let url = format!("mysql://u@127.0.0.1:{}/db?connect_timeout=1", silent.port);
    let err = retryable_failure(&url).await;
    let server = format!("connecting to mysql://u@127.0.0.1:{}/db", silent.port);
    assert!(err.starts_with(&server), "{err}");
    assert!(err.contains("no answer within connect_timeout=1s"), "{err}");
}

#[tokio::test]
async fn a_port_nobody_listens_on_is_a_retryable_error_naming_the_server() {
    let port = tls::closed_port();
    let err = retryable_failure(&format!("mysql://u@127.0.0.1:{port}/db")).await;
    assert!(
        err.starts_with(&format!("connecting to mysql://u@127.0.0.1:{port}/db")),
        "{err}"
    );
}
