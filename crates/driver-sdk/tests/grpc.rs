//! The gRPC transport end to end: the reference driver served over TCP and a Unix
//! socket passes the conformance suite, and driver errors keep their kind on the wire.

use sluice_conformance::{Capabilities, Outcome, run_suite};
use sluice_driver_sdk::grpc::{GrpcEndpoint, GrpcListener};
use sluice_driver_sdk::{Endpoint, Error};
use sluice_memory::MemoryDriver;
use sluice_proto::materialize as m;
use std::sync::Arc;

async fn serve_memory(listen: &str) -> (String, tokio::task::JoinHandle<()>) {
    let listener = GrpcListener::bind(listen).await.expect("bind");
    let address = listener.address().to_string();
    let server = tokio::spawn(async move {
        listener
            .serve(Arc::new(MemoryDriver::new()))
            .await
            .expect("serve");
    });
    (address, server)
}

async fn assert_suite_passes(endpoint: &dyn Endpoint) {
    let results = run_suite(
        endpoint,
        Capabilities::ALL,
        serde_json::json!({}),
        serde_json::json!({"table": "grpc"}),
    )
    .await;
    let failed: Vec<String> = results
        .iter()
        .filter(|r| !matches!(r.outcome, Outcome::Pass))
        .map(ToString::to_string)
        .collect();
    assert!(failed.is_empty(), "scenarios not passing: {failed:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_driver_over_tcp_passes_the_conformance_suite() {
    let (address, server) = serve_memory("127.0.0.1:0").await;
    assert!(address.starts_with("grpc://127.0.0.1:"), "{address}");
    assert!(
        !address.ends_with(":0"),
        "the bound port is reported: {address}"
    );
    let endpoint = GrpcEndpoint::connect(&address).await.expect("connect");
    assert_suite_passes(&endpoint).await;
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_driver_over_a_unix_socket_passes_the_conformance_suite() {
    let dir = tempfile::tempdir().unwrap();
    let listen = format!("unix:{}", dir.path().join("driver.sock").display());
    let (address, server) = serve_memory(&listen).await;
    assert_eq!(address, listen);
    let endpoint = GrpcEndpoint::connect(&address).await.expect("connect");
    assert_suite_passes(&endpoint).await;
    server.abort();
}

#[tokio::test]
async fn configuration_errors_come_back_as_configuration_errors() {
    let (address, server) = serve_memory("127.0.0.1:0").await;
    let endpoint = GrpcEndpoint::connect(&address).await.unwrap();
    let err = endpoint
        .validate(m::ValidateRequest {
            endpoint_spec_json: r#"{"no_such_setting": 1}"#.into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Config(msg) if msg.contains("no_such_setting")),
        "{err}"
    );
    server.abort();
}

#[tokio::test]
async fn connecting_to_nothing_is_a_transport_error_naming_the_address() {
    let dir = tempfile::tempdir().unwrap();
    let address = format!("unix:{}", dir.path().join("absent.sock").display());
    let err = GrpcEndpoint::connect(&address)
        .await
        .err()
        .expect("no server there");
    assert!(
        matches!(&err, Error::Transport(msg) if msg.contains(&address)),
        "{err}"
    );
}

#[tokio::test]
async fn an_address_without_a_scheme_is_refused_with_the_accepted_forms() {
    let err = GrpcEndpoint::connect("localhost:1234").await.err().unwrap();
    assert!(err.to_string().contains("grpc://HOST:PORT"), "{err}");
}
