//! The metrics server: `/metrics`, the registry in Prometheus' text format; `/api/status`,
//! the [`status`](super::status) as JSON; `/`, the status page (one static file, its
//! script polling `/api/status`, so nothing to build). Over HTTP/1.1 on the axum the
//! binary already has (the HTTP source's server), on a task of its own; over HTTPS with
//! `runtime.metrics.tls`.
//!
//! With `runtime.metrics.token`, `/metrics` and `/api/*` answer 401 without
//! `Authorization: Bearer <token>` and 403 with another (compared in constant time); the
//! page holds no data, so it needs none, and asks for the token when the API refuses.

use super::Metrics;
use crate::config::MetricsServer;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::serve::Listener;
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
    L: Listener,
    L::Addr: std::fmt::Debug,
{
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

async fn page() -> impl IntoResponse {
    ([(CONTENT_TYPE, "text/html; charset=utf-8")], STATUS_PAGE)
}
