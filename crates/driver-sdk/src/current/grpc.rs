//! The current protocol over gRPC (`materialize.Connector/Materialize`), both sides.
//!
//! ```text
//!   runtime: CurrentEndpoint ─▶ CurrentGrpc ──tonic client──▶ CurrentServer ─▶ serve_current
//!            (one Materialize call per Spec, Validate, Apply or Transactions stream)
//! ```
//!
//! The addresses, the message limits ([`MAX_WIRE_MESSAGE_BYTES`]) and the mapping of
//! errors to statuses and back are those of the seed's gRPC transport ([`crate::grpc`]),
//! as is the lazy call: the call is made by the first read of its responses, so the
//! first request is queued before the driver must answer anything.
//!
//! Detection ([`detect`]): a `Materialize` call carrying a Spec request. A server
//! without the `Connector` service answers `Unimplemented`: a seed driver.

use super::Protocol;
use super::endpoint::{CurrentEndpoint, Detecting, Duplex, Transport, is_current};
use super::serve::serve_current;
use super::translate;
use crate::grpc::{
    GrpcEndpoint, GrpcListener, MAX_WIRE_MESSAGE_BYTES, STREAM_BUFFER, connect_channel,
    status_to_error,
};
use crate::{Driver, Endpoint, Error, Result};
use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt, TryStreamExt};
use sluice_proto::current::materialize::{
    self as cm, connector_client::ConnectorClient, connector_server,
};
use sluice_proto::materialize as m;
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Request, Response, Status, Streaming, transport::Channel};

/// Serves one [`Driver`] as the tonic `materialize.Connector` service.
pub struct CurrentServer {
    driver: Arc<dyn Driver>,
}

impl CurrentServer {
    pub fn new(driver: Arc<dyn Driver>) -> Self {
        Self { driver }
    }

    /// The tonic service, with message limits raised to [`MAX_WIRE_MESSAGE_BYTES`].
    pub fn into_service(self) -> connector_server::ConnectorServer<Self> {
        connector_server::ConnectorServer::new(self)
            .max_decoding_message_size(MAX_WIRE_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_WIRE_MESSAGE_BYTES)
    }
}

#[async_trait]
impl connector_server::Connector for CurrentServer {
    type MaterializeStream = BoxStream<'static, Result<cm::Response, Status>>;

    async fn materialize(
        &self,
        req: Request<Streaming<cm::Request>>,
    ) -> Result<Response<Self::MaterializeStream>, Status> {
        let requests = req
            .into_inner()
            .map_err(|status| {
                Error::Transport(format!("runtime request stream: {}", status.message()))
            })
            .boxed();
        let driver = self.driver.clone();
        let stream = crate::grpc::serve_stream("Materialize", |responses| {
            serve_current(driver, requests, responses)
        });
        Ok(Response::new(stream))
    }
}

/// Serves `driver` as `materialize.Connector` on `listener` until it fails; cancel by
/// dropping the future (see [`GrpcListener::serve`]).
pub async fn serve(listener: GrpcListener, driver: Arc<dyn Driver>) -> Result<()> {
    let service = CurrentServer::new(driver).into_service();
    listener
        .serve_router(tonic::transport::Server::builder().add_service(service))
        .await
}

/// The current protocol's transport to a driver served over gRPC.
pub struct CurrentGrpc {
    address: String,
    client: ConnectorClient<Channel>,
}

impl CurrentGrpc {
    /// Connects to a driver address (as [`GrpcEndpoint::connect`] takes it).
    pub async fn connect(address: &str) -> Result<Self> {
        let channel = connect_channel(address).await?;
        let client = ConnectorClient::new(channel)
            .max_decoding_message_size(MAX_WIRE_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_WIRE_MESSAGE_BYTES);
        Ok(Self {
            address: address.to_string(),
            client,
        })
    }

    /// A `Materialize` call, made at the first read of the responses; its statuses as
    /// they came.
    fn call(
        &self,
    ) -> (
        mpsc::Sender<cm::Request>,
        BoxStream<'static, Result<cm::Response, Status>>,
    ) {
        let (requests, requests_rx) = mpsc::channel(STREAM_BUFFER);
        let mut client = self.client.clone();
        let call = async move {
            match client.materialize(ReceiverStream::new(requests_rx)).await {
                Ok(response) => response.into_inner().left_stream(),
                Err(status) => futures::stream::iter([Err(status)]).right_stream(),
            }
        };
        (requests, futures::stream::once(call).flatten().boxed())
    }
}

#[async_trait]
impl Transport for CurrentGrpc {
    async fn open(&self, _call: &'static str) -> Result<Duplex> {
        let (requests, responses) = self.call();
        let address = self.address.clone();
        let responses = responses
            .map_err(move |status| status_to_error(&address, status))
            .boxed();
        Ok(Duplex {
            requests,
            responses,
        })
    }
}

/// Which protocol the driver at `address` speaks: a `Materialize` call with a Spec
/// request. `Unimplemented` is the seed's protocol; an answer of another protocol
/// number is an error naming it.
pub async fn detect(address: &str) -> Result<Protocol> {
    let transport = CurrentGrpc::connect(address).await?;
    let (requests, mut responses) = transport.call();
    let spec = translate::spec_request(m::SpecRequest::default());
    let _ = requests.send(spec).await;
    drop(requests);
    match responses.next().await {
        Some(Err(status)) if status.code() == Code::Unimplemented => Ok(Protocol::Transactions),
        Some(Err(status)) => Err(status_to_error(address, status)),
        Some(Ok(response)) => {
            is_current(&response)
                .map_err(|what| Error::Malformed(format!("driver at {address}: {what}")))?;
            Ok(Protocol::Current)
        }
        None => Err(Error::Transport(format!(
            "driver at {address}: ended its Spec stream without a response"
        ))),
    }
}

/// The runtime's endpoint for the driver at `address`: of `protocol`, or, if `None`, of
/// the protocol it answers [`detect`] with before its first call.
pub async fn connect(address: &str, protocol: Option<Protocol>) -> Result<Arc<dyn Endpoint>> {
    let current = || async {
        let transport = CurrentGrpc::connect(address).await?;
        Ok::<_, Error>(Arc::new(CurrentEndpoint::new(address, transport)))
    };
    Ok(match protocol {
        Some(Protocol::Current) => current().await?,
        Some(Protocol::Transactions) => Arc::new(GrpcEndpoint::connect(address).await?),
        None => {
            let detected = address.to_string();
            Arc::new(Detecting::new(
                address,
                current().await?,
                Arc::new(GrpcEndpoint::connect(address).await?),
                Box::new(move || {
                    let address = detected.clone();
                    async move { detect(&address).await }.boxed()
                }),
            ))
        }
    })
}
