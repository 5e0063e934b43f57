//! The gRPC transport end to end: the reference driver served over TCP and a Unix
//! socket passes the conformance suite, driver errors keep their kind on the wire, the
//! accepted address forms, and Open reaching a driver that, like grpcio's and
//! grpc-go's servers, sends response headers only with its first message.

use futures::StreamExt;
use futures::stream::BoxStream;
use sluice_conformance::{Capabilities, Outcome, run_suite};
use sluice_driver_sdk::client;
use sluice_driver_sdk::grpc::{GrpcEndpoint, GrpcListener};
use sluice_driver_sdk::{Endpoint, Error};
use sluice_memory::MemoryDriver;
use sluice_proto::materialize::{self as m, driver_server};
use std::sync::Arc;
use std::time::Duration;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status, Streaming};

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
async fn a_plain_host_and_port_reaches_the_driver() {
    let (address, server) = serve_memory("127.0.0.1:0").await;
    let host_port = address.strip_prefix("grpc://").unwrap();
    let endpoint = GrpcEndpoint::connect(host_port).await.expect("connect");
    let spec = endpoint
        .spec(m::SpecRequest::default())
        .await
        .expect("spec");
    assert!(!spec.endpoint_spec_schema_json.is_empty());
    server.abort();
}

#[tokio::test]
async fn an_address_of_another_scheme_is_refused_with_the_accepted_forms() {
    let err = GrpcEndpoint::connect("http://localhost:1234")
        .await
        .err()
        .unwrap();
    assert!(
        matches!(&err, Error::Config(msg) if msg.contains("grpc://HOST:PORT, HOST:PORT or unix:/path")),
        "{err}"
    );
}

/// A driver that, like grpcio and grpc-go servers, sends its response headers only with
/// its first message: it answers nothing until Open has arrived, then Opened.
struct HeadersWithFirstMessage;

type Responses = BoxStream<'static, Result<m::TransactionResponse, Status>>;

#[tonic::async_trait]
impl driver_server::Driver for HeadersWithFirstMessage {
    async fn spec(&self, _: Request<m::SpecRequest>) -> Result<Response<m::SpecResponse>, Status> {
        Err(Status::unimplemented("spec"))
    }
    async fn validate(
        &self,
        _: Request<m::ValidateRequest>,
    ) -> Result<Response<m::ValidateResponse>, Status> {
        Err(Status::unimplemented("validate"))
    }
    async fn apply_upsert(
        &self,
        _: Request<m::ApplyRequest>,
    ) -> Result<Response<m::ApplyResponse>, Status> {
        Err(Status::unimplemented("apply_upsert"))
    }
    async fn apply_delete(
        &self,
        _: Request<m::ApplyRequest>,
    ) -> Result<Response<m::ApplyResponse>, Status> {
        Err(Status::unimplemented("apply_delete"))
    }

    type TransactionsStream = Responses;

    async fn transactions(
        &self,
        req: Request<Streaming<m::TransactionRequest>>,
    ) -> Result<Response<Responses>, Status> {
        // Tonic sends headers when this returns: not before Open has been read.
        let mut requests = req.into_inner();
        let open = requests.message().await?.and_then(|r| r.open);
        let Some(open) = open else {
            return Err(Status::failed_precondition("expected Open"));
        };
        let opened = m::TransactionResponse {
            opened: Some(m::transaction_response::Opened {
                flow_checkpoint: open.driver_checkpoint_json,
            }),
            ..Default::default()
        };
        // Opened, then hold the stream open until the runtime closes its side.
        let rest = futures::stream::once(async move {
            while requests.message().await.ok().flatten().is_some() {}
        })
        .filter_map(|()| futures::future::ready(None));
        Ok(Response::new(
            futures::stream::iter([Ok(opened)]).chain(rest).boxed(),
        ))
    }
}

#[tokio::test]
async fn open_reaches_a_driver_that_sends_headers_only_with_its_first_message() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = format!("grpc://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(driver_server::DriverServer::new(HeadersWithFirstMessage))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    let endpoint = GrpcEndpoint::connect(&address).await.expect("connect");
    let spec = sluice_conformance::messages::spec("hang", "{}", &[("t", false)]);
    let mut open = sluice_conformance::messages::open(&spec, 0, u32::MAX);
    open.driver_checkpoint_json = b"recovered".to_vec();
    let opened = tokio::time::timeout(Duration::from_secs(10), async {
        let stream = endpoint.transactions().await?;
        client::open(stream, open, Duration::from_secs(60)).await
    })
    .await
    .expect("Open hung: the Transactions call waited for response headers the driver sends only with Opened")
    .expect("open");
    assert_eq!(opened.2.flow_checkpoint, b"recovered");
    server.abort();
}
