//! The metrics server: `/metrics`, the registry in Prometheus' text format; `/api/status`,
//! the [`status`](super::status) as JSON; `/`, the status page (one static file, its
//! script polling `/api/status`, so nothing to build). Over HTTP/1.1 on the axum the
//! binary already has (the HTTP source's server), on a task of its own.

use super::Metrics;
use axum::Router;
use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::encoding::prometheus_text;
use std::net::SocketAddr;
use std::sync::Arc;

/// The status page: HTML with its script and style inline.
const STATUS_PAGE: &str = include_str!("status.html");

/// Serves `metrics` on `address` until the process ends; returns the address bound (a
/// port 0 is chosen by the system). Fails at once if the address cannot be bound.
pub async fn serve(address: SocketAddr, metrics: Arc<Metrics>) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(scrape))
        .route("/api/status", get(status))
        .route("/", get(page))
        .with_state(metrics);
    tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).await {
            tracing::warn!("the metrics server on {bound} stopped: {err}");
        }
    });
    Ok(bound)
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
