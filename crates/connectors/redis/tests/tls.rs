//! TLS against a private redis-server started by each test (TLS only, a password,
//! certificates of the test CA naming `localhost`): plain text gets nowhere, told to
//! write `rediss://` and set `tls`; a server certificate from another CA or not naming
//! the host is a configuration error naming the options, a wrong password names the
//! user, mutual TLS needs the client certificate, and with the right CA the conformance
//! suite passes over TLS.

use serde_json::{Value, json};
use sluice_conformance::{Capabilities, Outcome, run_suite};
use sluice_driver_sdk::inprocess::InProcess;
use sluice_driver_sdk::{Driver, Error};
use sluice_redis::RedisDriver;
use sluice_redis::client;
use sluice_redis::config::EndpointConfig;
use sluice_testkit::redis::{PASSWORD, PrivateRedis};
use std::sync::Arc;

fn url(scheme: &str, password: &str, host: &str, port: u16) -> String {
    format!("{scheme}://:{password}@{host}:{port}/0")
}

fn tls(server: &PrivateRedis, ca: &str, client: Option<&str>) -> Value {
    let certs = &server.certificates;
    match client {
        None => json!({ "ca": certs.file(ca) }),
        Some(name) => json!({
            "ca": certs.file(ca),
            "certificate": certs.file(&format!("{name}.crt")),
            "key": certs.file(&format!("{name}.key")),
        }),
    }
}

async fn connect(config: Value) -> sluice_driver_sdk::Result<()> {
    let config = EndpointConfig::parse(&config.to_string())?;
    client::connect(&config).await.map(drop)
}

fn config_error(result: sluice_driver_sdk::Result<()>) -> String {
    match result {
        Err(Error::Config(message)) => message,
        other => panic!("expected a configuration error, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn plain_text_another_ca_a_wrong_host_and_a_wrong_password_are_refused() {
    let server = PrivateRedis::start_tls(false);
    let port = server.port();
    let right = tls(&server, "ca.crt", None);

    let plain = connect(json!({ "url": url("redis", PASSWORD, "localhost", port), "connect_timeout": 3, "response_timeout": 3 })).await;
    let Err(Error::Store { message, .. }) = plain else {
        panic!("plain text to a TLS-only server: {plain:?}");
    };
    assert!(
        message.contains("the server closed the connection")
            && message.contains("a server that requires TLS closes plain text")
            && message.contains("write the URL as rediss:// and set tls"),
        "{message}"
    );

    let other = config_error(
        connect(json!({ "url": url("rediss", PASSWORD, "localhost", port), "tls": tls(&server, "other-ca.crt", None) })).await,
    );
    assert!(other.contains("tls.ca"), "{other}");
    assert!(other.contains("does not verify"), "{other}");

    let host = config_error(
        connect(json!({ "url": url("rediss", PASSWORD, "127.0.0.1", port), "tls": right })).await,
    );
    assert!(host.contains("does not verify"), "{host}");

    let wrong = config_error(
        connect(
            json!({ "url": format!("rediss://default:wrong@localhost:{port}/0"), "tls": right }),
        )
        .await,
    );
    assert!(wrong.contains("\"default\""), "{wrong}");
    assert!(
        !wrong.contains("wrong@"),
        "the password is left out: {wrong}"
    );

    connect(json!({ "url": url("rediss", PASSWORD, "localhost", port), "tls": right }))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn mutual_tls_needs_a_client_certificate_of_the_servers_ca() {
    let server = PrivateRedis::start_tls(true);
    let address = url("rediss", PASSWORD, "localhost", server.port());
    let without = connect(json!({ "url": address, "tls": tls(&server, "ca.crt", None) })).await;
    assert!(without.is_err(), "no client certificate: {without:?}");
    let other =
        connect(json!({ "url": address, "tls": tls(&server, "ca.crt", Some("other-client")) }))
            .await;
    assert!(other.is_err(), "another CA's client certificate: {other:?}");
    connect(json!({ "url": address, "tls": tls(&server, "ca.crt", Some("client")) }))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_conformance_suite_passes_over_tls() {
    let server = PrivateRedis::start_tls(true);
    let driver = RedisDriver::new();
    let claimed = Capabilities::declared(driver.declared());
    let endpoint = InProcess::new("redis", Arc::new(driver));
    let config = json!({
        "url": url("rediss", PASSWORD, "localhost", server.port()),
        "tls": tls(&server, "ca.crt", Some("client")),
    });
    let resource = json!({ "prefix": "sluice-conformance-tls", "format": "json" });
    let results = run_suite(&endpoint, claimed, config, resource).await;
    let failed: Vec<String> = (results.iter())
        .filter(|r| matches!(r.outcome, Outcome::Fail(_)))
        .map(ToString::to_string)
        .collect();
    assert!(failed.is_empty(), "{}\n{}", failed.join("\n"), server.log());
}
