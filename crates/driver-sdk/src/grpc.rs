//! The gRPC transport (tonic, over TCP or a Unix socket), both sides.
//!
//! ```text
//!   runtime: GrpcEndpoint ──tonic client──▶ GrpcListener::serve ──▶ GrpcServer ──▶ Driver
//!                                                                       │
//!                            Transactions: inbound stream ──▶ serve_transactions ──▶ responses
//! ```
//!
//! - [`GrpcServer`] adapts any [`Driver`] to the generated tonic service: unary calls map
//!   one to one, and `Transactions` runs [`serve_transactions`] over the inbound stream.
//!   When the serve loop fails, the response stream ends with a `Status` carrying the
//!   error's message, after every response the loop produced before failing.
//! - [`GrpcListener`] binds `HOST:PORT` (port 0 picks a free port) or `unix:/path`, and
//!   reports the bound address in the form [`GrpcEndpoint::connect`] accepts.
//! - [`GrpcEndpoint`] is the runtime's [`Endpoint`] for a driver served this way. Its
//!   Transactions call starts at the first read of responses, so Open is queued before
//!   the driver must answer anything: drivers served by grpcio or grpc-go send their
//!   response headers only with Opened, and tonic's call resolves only on headers.
//!
//! Errors cross the wire as a `Status` code plus message, and come back as the same
//! [`Error`] variant where one exists (fenced, configuration, store), so a runtime can
//! tell a zombie from a lost connection whatever the transport.
//!
//! Both sides accept messages up to [`MAX_WIRE_MESSAGE_BYTES`]: one Store or Loaded message
//! carries at least one whole document, and the protocol has no way to split one.

use crate::serve::serve_transactions;
use crate::{Driver, Endpoint, Error, RemoteKind, Result, TransactionStream};
use async_trait::async_trait;
use futures::{StreamExt, TryStreamExt, stream::BoxStream};
use sluice_proto::materialize::{self as m, driver_client::DriverClient, driver_server};
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream, UnixListenerStream};
use tonic::{Code, Request, Response, Status, Streaming, transport::Channel};

/// The largest protobuf message either side sends or accepts (gRPC message or stdio
/// frame). Well above the arena builders' batch bound ([`crate::arena::MAX_MESSAGE_BYTES`]),
/// which a message exceeds when it holds one large document. 64 MiB holds the largest document the conformance suite sends (16 MiB) with
/// room for its keys and values, while still refusing a corrupt length outright.
pub const MAX_WIRE_MESSAGE_BYTES: usize = 64 << 20;

/// How many Transactions messages may wait in a channel between a transport and its peer.
/// Enough to keep pipelined Loads flowing; small enough to push back on a slow peer.
pub(crate) const STREAM_BUFFER: usize = 32;

/// Serves one [`Driver`] as the tonic `materialize.Driver` service.
pub struct GrpcServer {
    driver: Arc<dyn Driver>,
}

impl GrpcServer {
    pub fn new(driver: Arc<dyn Driver>) -> Self {
        Self { driver }
    }

    /// The tonic service, with message limits raised to [`MAX_WIRE_MESSAGE_BYTES`].
    pub fn into_service(self) -> driver_server::DriverServer<Self> {
        driver_server::DriverServer::new(self)
            .max_decoding_message_size(MAX_WIRE_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_WIRE_MESSAGE_BYTES)
    }
}

#[async_trait]
impl driver_server::Driver for GrpcServer {
    async fn spec(
        &self,
        req: Request<m::SpecRequest>,
    ) -> Result<Response<m::SpecResponse>, Status> {
        reply(self.driver.spec(req.into_inner()).await)
    }

    async fn validate(
        &self,
        req: Request<m::ValidateRequest>,
    ) -> Result<Response<m::ValidateResponse>, Status> {
        reply(self.driver.validate(req.into_inner()).await)
    }

    async fn apply_upsert(
        &self,
        req: Request<m::ApplyRequest>,
    ) -> Result<Response<m::ApplyResponse>, Status> {
        reply(self.driver.apply_upsert(req.into_inner()).await)
    }

    async fn apply_delete(
        &self,
        req: Request<m::ApplyRequest>,
    ) -> Result<Response<m::ApplyResponse>, Status> {
        reply(self.driver.apply_delete(req.into_inner()).await)
    }

    type TransactionsStream = BoxStream<'static, Result<m::TransactionResponse, Status>>;

    async fn transactions(
        &self,
        req: Request<Streaming<m::TransactionRequest>>,
    ) -> Result<Response<Self::TransactionsStream>, Status> {
        let requests = req
            .into_inner()
            .map_err(|status| {
                Error::Transport(format!("runtime request stream: {}", status.message()))
            })
            .boxed();
        let driver = self.driver.clone();
        let stream = serve_stream("Transactions", |responses| {
            serve_transactions(driver, requests, responses)
        });
        Ok(Response::new(stream))
    }
}

/// The response stream of a streaming call served by `serve` (a task), which sends its
/// responses on the channel it is given: its responses, then, if it failed, the status
/// of its error. `call` names the call in the log of a failure.
pub(crate) fn serve_stream<T, F>(
    call: &'static str,
    serve: impl FnOnce(mpsc::Sender<T>) -> F,
) -> BoxStream<'static, Result<T, Status>>
where
    T: Send + 'static,
    F: Future<Output = Result<()>> + Send + 'static,
{
    let (responses, responses_rx) = mpsc::channel(STREAM_BUFFER);
    let (done, outcome) = oneshot::channel();
    let served = serve(responses);
    tokio::spawn(async move {
        let result = served.await;
        if let Err(err) = &result {
            tracing::warn!(error = %err, "{call} stream ended with an error");
        }
        let _ = done.send(result);
    });
    // The serve loop owns the only response sender, so the channel drains completely
    // before its outcome is read: responses first, then the closing status, if any.
    let closing = futures::stream::once(async move {
        match outcome.await {
            Ok(Ok(())) => None,
            Ok(Err(err)) => Some(Err(error_to_status(&err))),
            Err(_) => Some(Err(Status::internal("the driver's serve loop panicked"))),
        }
    })
    .filter_map(futures::future::ready);
    ReceiverStream::new(responses_rx)
        .map(Ok)
        .chain(closing)
        .boxed()
}

fn reply<T>(result: Result<T>) -> Result<Response<T>, Status> {
    result
        .map(Response::new)
        .map_err(|err| error_to_status(&err))
}

/// The status a driver error travels as. [`status_to_error`] is its inverse.
pub(crate) fn error_to_status(err: &Error) -> Status {
    let (kind, message) = err.remote();
    let code = match kind {
        RemoteKind::Malformed => Code::FailedPrecondition,
        RemoteKind::Timeout => Code::DeadlineExceeded,
        RemoteKind::Fenced => Code::Aborted,
        RemoteKind::Config => Code::InvalidArgument,
        RemoteKind::Unavailable => Code::Unavailable,
        RemoteKind::Store => Code::Internal,
    };
    Status::new(code, message)
}

/// The error a status from the driver at `address` stands for.
pub(crate) fn status_to_error(address: &str, status: Status) -> Error {
    let message = status.message().to_string();
    let kind = match status.code() {
        Code::Aborted => RemoteKind::Fenced,
        Code::InvalidArgument => RemoteKind::Config,
        Code::Internal => RemoteKind::Store,
        Code::FailedPrecondition => RemoteKind::Malformed,
        code => {
            return Error::Transport(format!("driver at {address}: {code:?}: {message}"));
        }
    };
    Error::from_remote(kind, &format!("driver at {address}"), message)
}

/// A bound, not yet serving, gRPC listener.
pub struct GrpcListener {
    address: String,
    socket: Socket,
}

enum Socket {
    Tcp(tokio::net::TcpListener),
    Unix(tokio::net::UnixListener, SocketFile),
}

/// Removes the socket file when serving ends: a stale one would block the next bind.
struct SocketFile(std::path::PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl GrpcListener {
    /// Binds `HOST:PORT` (port 0 picks a free one) or `unix:/path/to/socket`.
    pub async fn bind(listen: &str) -> Result<Self> {
        let bind_error =
            |err: std::io::Error| Error::Transport(format!("cannot listen on {listen}: {err}"));
        if let Some(path) = listen.strip_prefix("unix:") {
            let path = std::path::PathBuf::from(path);
            let socket = tokio::net::UnixListener::bind(&path).map_err(bind_error)?;
            return Ok(Self {
                address: format!("unix:{}", path.display()),
                socket: Socket::Unix(socket, SocketFile(path)),
            });
        }
        let host_port = listen.strip_prefix("grpc://").unwrap_or(listen);
        let socket = tokio::net::TcpListener::bind(host_port)
            .await
            .map_err(bind_error)?;
        let local = socket.local_addr().map_err(bind_error)?;
        Ok(Self {
            address: format!("grpc://{local}"),
            socket: Socket::Tcp(socket),
        })
    }

    /// The bound address, as [`GrpcEndpoint::connect`] accepts it: `grpc://IP:PORT` with
    /// the actual port, or `unix:/path`.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Serves `driver` until the listener fails; cancel by dropping the future (open
    /// streams are cut, and their transactions roll back, as after any transport error).
    pub async fn serve(self, driver: Arc<dyn Driver>) -> Result<()> {
        let service = GrpcServer::new(driver).into_service();
        self.serve_router(tonic::transport::Server::builder().add_service(service))
            .await
    }

    /// Serves `server`'s services (e.g. the current protocol's `CurrentServer`) until
    /// the listener fails, as [`GrpcListener::serve`] does.
    pub async fn serve_router(self, server: tonic::transport::server::Router) -> Result<()> {
        let result = match self.socket {
            Socket::Tcp(socket) => {
                server
                    .serve_with_incoming(TcpListenerStream::new(socket))
                    .await
            }
            Socket::Unix(socket, _file) => {
                server
                    .serve_with_incoming(UnixListenerStream::new(socket))
                    .await
            }
        };
        result.map_err(|err| {
            Error::Transport(format!(
                "serving {}: {}",
                self.address,
                crate::error::chain(&err)
            ))
        })
    }
}

/// The runtime's view of a driver served over gRPC.
pub struct GrpcEndpoint {
    address: String,
    client: DriverClient<Channel>,
}

impl GrpcEndpoint {
    /// Connects to a driver address ([`channel_uri`]: `grpc://HOST:PORT`, `HOST:PORT` or
    /// `unix:/path`). Fails with [`Error::Transport`] naming the address when nothing
    /// answers there.
    pub async fn connect(address: &str) -> Result<Self> {
        let channel = connect_channel(address).await?;
        let client = DriverClient::new(channel)
            .max_decoding_message_size(MAX_WIRE_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_WIRE_MESSAGE_BYTES);
        Ok(Self {
            address: address.to_string(),
            client,
        })
    }

    fn status_error(&self) -> impl Fn(Status) -> Error + '_ {
        |status| status_to_error(&self.address, status)
    }
}

#[async_trait]
impl Endpoint for GrpcEndpoint {
    fn name(&self) -> &str {
        &self.address
    }

    async fn spec(&self, req: m::SpecRequest) -> Result<m::SpecResponse> {
        let response = self.client.clone().spec(req).await;
        response
            .map(Response::into_inner)
            .map_err(self.status_error())
    }

    async fn validate(&self, req: m::ValidateRequest) -> Result<m::ValidateResponse> {
        let response = self.client.clone().validate(req).await;
        response
            .map(Response::into_inner)
            .map_err(self.status_error())
    }

    async fn apply_upsert(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        let response = self.client.clone().apply_upsert(req).await;
        response
            .map(Response::into_inner)
            .map_err(self.status_error())
    }

    async fn apply_delete(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        let response = self.client.clone().apply_delete(req).await;
        response
            .map(Response::into_inner)
            .map_err(self.status_error())
    }

    async fn transactions(&self) -> Result<TransactionStream> {
        let (requests, requests_rx) = mpsc::channel(STREAM_BUFFER);
        let mut client = self.client.clone();
        let address = self.address.clone();
        // Tonic resolves the call when the driver's response headers arrive, and grpcio
        // and grpc-go servers send them with their first message, Opened, which answers
        // Open. So the call is made by the first read of the responses, not here: the
        // runtime queues Open first, and the call then carries it.
        let call = async move {
            match client.transactions(ReceiverStream::new(requests_rx)).await {
                Ok(response) => response
                    .into_inner()
                    .map_err(move |status| status_to_error(&address, status))
                    .left_stream(),
                Err(status) => {
                    futures::stream::iter([Err(status_to_error(&address, status))]).right_stream()
                }
            }
        };
        let responses = futures::stream::once(call).flatten().boxed();
        Ok(TransactionStream {
            requests,
            responses,
            hooks: None,
        })
    }
}

/// A channel to the driver at `address` ([`channel_uri`]). Fails with
/// [`Error::Transport`] naming the address when nothing answers there.
pub(crate) async fn connect_channel(address: &str) -> Result<Channel> {
    let uri = channel_uri(address).map_err(Error::Config)?;
    let transport_error = |err: tonic::transport::Error| {
        Error::Transport(format!("{address}: {}", crate::error::chain(&err)))
    };
    tonic::transport::Endpoint::from_shared(uri)
        .map_err(transport_error)?
        .connect()
        .await
        .map_err(transport_error)
}

/// The URI tonic connects to for a driver address: `grpc://HOST:PORT` or a plain
/// `HOST:PORT` (as users write it) over TCP, `unix:/path` over a Unix socket. Anything
/// else is the user's error, and the message lists the accepted forms.
pub fn channel_uri(address: &str) -> std::result::Result<String, String> {
    if address.starts_with("unix:") {
        return Ok(address.to_string());
    }
    let host_port = address.strip_prefix("grpc://").unwrap_or(address);
    let tcp = match host_port.rsplit_once(':') {
        Some((host, port)) => {
            !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok()
        }
        None => false,
    };
    if tcp {
        Ok(format!("http://{host_port}"))
    } else {
        Err(format!(
            "driver address {address:?} is none of grpc://HOST:PORT, HOST:PORT or unix:/path"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::channel_uri;

    #[test]
    fn driver_addresses_map_to_channel_uris() {
        let accepted = [
            ("grpc://127.0.0.1:7000", "http://127.0.0.1:7000"),
            ("127.0.0.1:7000", "http://127.0.0.1:7000"),
            ("localhost:7000", "http://localhost:7000"),
            ("driver.internal:443", "http://driver.internal:443"),
            ("[::1]:7000", "http://[::1]:7000"),
            ("grpc://[::1]:7000", "http://[::1]:7000"),
            ("unix:/run/driver.sock", "unix:/run/driver.sock"),
        ];
        for (address, uri) in accepted {
            assert_eq!(channel_uri(address).as_deref(), Ok(uri), "{address}");
        }
        let refused = [
            "localhost",
            "localhost:",
            ":7000",
            "localhost:http",
            "localhost:70000",
            "http://localhost:7000",
            "grpc://localhost",
            "",
        ];
        for address in refused {
            let err = channel_uri(address).expect_err(address);
            assert!(
                err.contains(&format!("{address:?}"))
                    && err.contains("grpc://HOST:PORT, HOST:PORT or unix:/path"),
                "{err}"
            );
        }
    }
}
