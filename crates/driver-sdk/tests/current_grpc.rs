//! Flow's current protocol over gRPC, end to end in one process: the reference driver
//! served as `materialize.Connector` passes the conformance suite through a
//! `CurrentEndpoint` (every scenario but the dry run, which the current protocol lacks),
//! detection tells the two services apart, and a driver error keeps its kind.

use sluice_conformance::{Capabilities, Capability, Outcome, run_suite};
use sluice_driver_sdk::Error;
use sluice_driver_sdk::current::endpoint::CurrentEndpoint;
use sluice_driver_sdk::current::grpc::{self as current_grpc, CurrentGrpc};
use sluice_driver_sdk::current::{Protocol, translate};
use sluice_driver_sdk::grpc::GrpcListener;
use sluice_memory::MemoryDriver;
use sluice_proto::materialize as m;
use std::sync::Arc;

/// Serves the memory driver on a free port in `protocol`; returns its address.
async fn serve_memory(protocol: Protocol) -> (String, tokio::task::JoinHandle<()>) {
    let listener = GrpcListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.address().to_string();
    let driver = Arc::new(MemoryDriver::new());
    let server = tokio::spawn(async move {
        let served = match protocol {
            Protocol::Current => current_grpc::serve(listener, driver).await,
            Protocol::Transactions => listener.serve(driver).await,
        };
        served.expect("serve");
    });
    (address, server)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_driver_served_as_a_connector_passes_the_conformance_suite() {
    let (address, server) = serve_memory(Protocol::Current).await;
    let transport = CurrentGrpc::connect(&address).await.expect("connect");
    let endpoint = CurrentEndpoint::new(address.clone(), transport);
    let results = run_suite(
        &endpoint,
        Capabilities::ALL.without(Capability::DryRun),
        serde_json::json!({}),
        serde_json::json!({"table": "current"}),
    )
    .await;
    // Every scenario passes but the dry run's, skipped: the protocol has none.
    let not_passed: Vec<String> = results
        .iter()
        .filter(|r| !matches!(r.outcome, Outcome::Pass))
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        not_passed.len(),
        1,
        "scenarios not passing: {not_passed:#?}"
    );
    assert!(
        not_passed[0].starts_with("SKIP apply-dry-run:"),
        "{not_passed:#?}"
    );
    server.abort();
}

#[tokio::test]
async fn detection_tells_a_connector_from_a_seed_driver() {
    let (current, current_server) = serve_memory(Protocol::Current).await;
    let (seed, seed_server) = serve_memory(Protocol::Transactions).await;
    assert_eq!(
        current_grpc::detect(&current).await.unwrap(),
        Protocol::Current
    );
    assert_eq!(
        current_grpc::detect(&seed).await.unwrap(),
        Protocol::Transactions
    );
    // Undeclared, each endpoint speaks what detection found.
    for address in [&current, &seed] {
        let endpoint = current_grpc::connect(address, None).await.unwrap();
        let spec = endpoint.spec(m::SpecRequest::default()).await.unwrap();
        assert!(
            spec.endpoint_spec_schema_json.contains("object"),
            "{spec:?}"
        );
    }
    current_server.abort();
    seed_server.abort();
}

#[tokio::test]
async fn a_driver_error_keeps_its_kind_across_the_connector() {
    let (address, server) = serve_memory(Protocol::Current).await;
    let endpoint = current_grpc::connect(&address, Some(Protocol::Current))
        .await
        .unwrap();
    let validate = m::ValidateRequest {
        materialization: "current".into(),
        endpoint_spec_json: r#"{"no_such_setting": true}"#.into(),
        ..Default::default()
    };
    let err = endpoint.validate(validate).await.unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err:?}");
    assert!(err.to_string().contains("no_such_setting"), "{err}");
    server.abort();
}

#[tokio::test]
async fn a_seed_driver_asked_in_the_current_protocol_is_unimplemented() {
    let (address, server) = serve_memory(Protocol::Transactions).await;
    let endpoint = current_grpc::connect(&address, Some(Protocol::Current))
        .await
        .unwrap();
    let err = endpoint.spec(m::SpecRequest::default()).await.unwrap_err();
    assert!(err.to_string().contains("Unimplemented"), "{err}");
    // The request is what a current driver would be sent.
    assert!(
        translate::spec_request(m::SpecRequest::default())
            .spec
            .is_some()
    );
    server.abort();
}
