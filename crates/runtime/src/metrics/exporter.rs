//! The metrics server: `/metrics`, the registry in Prometheus' text format; `/api/status`,
//! the [`status`](super::status) as JSON; `/`, the status page (one static file, its
//! script polling `/api/status`, so nothing to build). Over HTTP/1.1 on the axum the
//! binary already has (the HTTP source's server), on a task of its own; over HTTPS with
//! `runtime.metrics.tls`.
//!
//! With `runtime.metrics.token`, `/metrics` and `/api/*` answer 401 without
//! `Authorization: Bearer <token>` and 403 with another (compared in constant time); the
//! page holds no data, so it needs none, and asks for the token when the API refuses.
//!
//! `POST /api/pause` and `POST /api/resume` (optionally `?source=NAME`) pause and resume
//! the pipeline's sources ([`crate::pause`]), behind the same token: they answer
//! the resulting state (`{"state": "paused", "sources": {"a": "paused"}}`), or 404
//! naming the pipeline's sources for a source it does not have. Each change is logged
//! once, naming the client's address.

use super::Metrics;
use crate::config::MetricsServer;
use crate::pause::{Request as PauseRequest, Scope};
use axum::Router;
use axum::extract::connect_info::{ConnectInfo, Connected};
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::{IncomingStream, Listener};
use prometheus_client::encoding::prometheus_text;
use sluice_source_sdk::tls::TlsListener;
use std::net::SocketAddr;
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The status page: HTML with its script and style inline.
const STATUS_PAGE: &str = include_str!("status.html");

/// Serves `metrics` as `server` says until the process ends; returns the address bound
/// (a port 0 is chosen by the system). Fails at once if the address cannot be bound or
/// the TLS files cannot be read.
pub async fn serve(server: &MetricsServer, metrics: Arc<Metrics>) -> std::io::Result<SocketAddr> {
    let acceptor = match &server.tls {
        None => None,
        Some(tls) => Some(
            tls.acceptor("runtime.metrics.tls")
                .map_err(std::io::Error::other)?,
        ),
    };
    let listener = tokio::net::TcpListener::bind(server.listen).await?;
    let bound = listener.local_addr()?;
    let guarded = Router::new()
        .route("/metrics", get(scrape))
        .route("/api/status", get(status))
        .route("/api/pause", post(pause))
        .route("/api/resume", post(resume))
        .with_state(metrics);
    let guarded = match &server.token {
        None => guarded,
        Some(token) => guarded.layer(middleware::from_fn_with_state(
            Arc::<str>::from(token.as_str()),
            bearer,
        )),
    };
    let app = Router::new().route("/", get(page)).merge(guarded);
    match acceptor {
        None => tokio::spawn(run(listener, app, bound)),
        Some(acceptor) => tokio::spawn(run(TlsListener::new(listener, acceptor)?, app, bound)),
    };
    Ok(bound)
}

async fn run<L>(listener: L, app: Router, bound: SocketAddr)
where
    L: Listener<Addr = SocketAddr>,
    for<'a> Peer: Connected<IncomingStream<'a, L>>,
{
    let app = app.into_make_service_with_connect_info::<Peer>();
    if let Err(err) = axum::serve(listener, app).await {
        tracing::warn!("the metrics server on {bound} stopped: {err}");
    }
}

/// Lets a request through only with the bearer token.
async fn bearer(State(token): State<Arc<str>>, request: Request, next: Next) -> Response {
    let given = (request.headers().get(AUTHORIZATION))
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    match given {
        None => (
            StatusCode::UNAUTHORIZED,
            [(WWW_AUTHENTICATE, "Bearer")],
            "a bearer token is required (Authorization: Bearer <runtime.metrics.token>)",
        )
            .into_response(),
        Some(given) if bool::from(given.as_bytes().ct_eq(token.as_bytes())) => {
            next.run(request).await
        }
        Some(_) => (StatusCode::FORBIDDEN, "wrong bearer token").into_response(),
    }
}

async fn scrape(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(CONTENT_TYPE, prometheus_text::CONTENT_TYPE)],
        metrics.render(),
    )
}

async fn status(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    let json = serde_json::to_string(&metrics.status.snapshot()).expect("a status serializes");
    ([(CONTENT_TYPE, "application/json")], json)
}

/// The address of a request's client (over TCP or TLS alike): who paused, in the log.
#[derive(Debug, Clone, Copy)]
struct Peer(SocketAddr);

impl Connected<IncomingStream<'_, tokio::net::TcpListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, tokio::net::TcpListener>) -> Peer {
        Peer(*stream.remote_addr())
    }
}

impl Connected<IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: IncomingStream<'_, TlsListener>) -> Peer {
        Peer(*stream.remote_addr())
    }
}

async fn pause(
    State(metrics): State<Arc<Metrics>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    request: Request,
) -> Response {
    control(&metrics, PauseRequest::Pause, peer, &request)
}

async fn resume(
    State(metrics): State<Arc<Metrics>>,
    ConnectInfo(peer): ConnectInfo<Peer>,
    request: Request,
) -> Response {
    control(&metrics, PauseRequest::Resume, peer, &request)
}

/// Applies a pause or resume to the whole pipeline, or to `?source=NAME`; answers the
/// resulting state as JSON, or 404 for a source the pipeline does not have.
fn control(metrics: &Metrics, request: PauseRequest, peer: Peer, http: &Request) -> Response {
    let source = http.uri().query().and_then(|query| {
        (query.split('&'))
            .find_map(|pair| pair.strip_prefix("source="))
            .map(percent_decoded)
    });
    let scope = match &source {
        Some(name) => Scope::Source(name),
        None => Scope::Pipeline,
    };
    let by = format!("{} {} from {}", http.method(), http.uri(), peer.0);
    let status = &metrics.status;
    match (status.pauses()).apply(&status.source_names(), request, scope, &by) {
        Ok(answer) => {
            let json = serde_json::to_string(&answer).expect("an answer serializes");
            ([(CONTENT_TYPE, "application/json")], json).into_response()
        }
        Err(unknown) => (StatusCode::NOT_FOUND, unknown.to_string()).into_response(),
    }
}

/// A query value with its `%XX` escapes and `+` decoded (what is not valid UTF-8 after
/// that is replaced: no source has such a name).
fn percent_decoded(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn page() -> impl IntoResponse {
    ([(CONTENT_TYPE, "text/html; charset=utf-8")], STATUS_PAGE)
}
