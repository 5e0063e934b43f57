//! The HTTP server: `POST /ingest/<source>` and `GET /health` on axum (HTTP/1.1).
//!
//! ```text
//!  POST /ingest/views ─▶ 404 other source ─▶ 401 no token / 403 wrong one ─▶ 413 too large
//!       ─▶ Idempotency-Key known? answer (or wait for) its first request's outcome
//!       ─▶ 400 first bad line ─▶ 503 closed / 429 buffer full ─▶ wait for the commit: 200
//! ```
//!
//! Status codes and bodies (always JSON):
//! - `200 {"txn": N, "documents": M}`: the body's transaction N is durable (also for a
//!   retry of a key that committed: its original N and M, nothing applied again); with
//!   `"dead_lettered": D` when D of its documents went to the dead-letter file instead
//!   of the store (`on_error: skip`; M counts only the stored ones).
//! - `400 {"error": "line 3: ...", "at": "line 3"}`: a bad body (not JSON objects, or
//!   a document the collection would not take: invalid against its schema, or without
//!   its key, unless `on_error: skip`), or a bad `Idempotency-Key`; nothing of it is
//!   kept, its key included.
//! - `401` without a bearer token (with `WWW-Authenticate: Bearer`), `403` with a wrong
//!   one (compared in constant time), `404` for another source or path.
//! - `413` for a body above `max_body_bytes` (by its `Content-Length`, or as it streams).
//! - `429` with `Retry-After` while the buffer is full or the runtime paused the source,
//!   or (a cluster's shard) while the idempotency window holds as many keys as the
//!   shard's log can carry (`keys::CARRIED_BUDGET`).
//! - `503` with `Retry-After` when the source closes or failed before the body's
//!   transaction committed (the error says whether the body may have been applied).
//!
//! The server runs as a task of the source's own; it stops accepting when the source
//! closes, and lets the requests in hand finish (they are answered by then). With
//! `tls` it serves HTTPS only: a plain request gets no answer, and a client certificate
//! that `client_ca` did not sign is refused in the handshake (logged, naming its issuer).

use crate::body::Batch;
use crate::ingest::{Answer, Outcome, Shared};
use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::{Listener, ListenerExt};
use serde_json::{Value, json};
use sluice_source_sdk::SourceError;
use sluice_source_sdk::tls::TlsListener;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};
use subtle::ConstantTimeEq;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The header a client names its request with, for safe retries.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";
/// The longest key taken (keys are kept in memory and in the keys file).
const MAX_KEY_LEN: usize = 256;
/// How long a bind waits for the address to be released: a source reopened after a
/// failure binds while the previous instance's listener is still closing.
pub(crate) const BIND_PATIENCE: Duration = Duration::from_secs(5);
/// What a 429 or 503 tells the client to wait, in seconds.
const RETRY_AFTER: &str = "1";
/// How long a stopping server waits for its connections to finish.
const DRAIN: Duration = Duration::from_secs(5);

/// The running server task.
pub struct Server {
    task: JoinHandle<()>,
    stop: Option<oneshot::Sender<()>>,
    pub address: SocketAddr,
}

impl Server {
    /// Binds `shared.config.listen` and serves it, over TLS when the config has `tls`.
    pub async fn start(shared: Arc<Shared>) -> Result<Server, SourceError> {
        let (name, config) = (shared.name.clone(), shared.config.clone());
        let router = Router::new()
            .route("/ingest/{source}", post(ingest))
            .route("/health", get(health))
            .fallback(not_found)
            .with_state(shared);
        let acceptor = acceptor(&name, &config)?;
        let listener = bind(&name, config.address()).await?;
        Server::over(&name, listener, acceptor, router)
    }

    /// Serves `router` on `listener`, over TLS with `acceptor`.
    pub(crate) fn over(
        name: &str,
        listener: tokio::net::TcpListener,
        acceptor: Option<sluice_source_sdk::tls::TlsAcceptor>,
        router: Router,
    ) -> Result<Server, SourceError> {
        let address = listener.local_addr().map_err(|error| SourceError::Io {
            name: name.to_string(),
            path: "the listening socket".to_string(),
            error,
        })?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = match acceptor {
            None => serve(listener.tap_io(nodelay), router, stopped),
            Some(acceptor) => {
                let listener =
                    TlsListener::new(listener, acceptor).map_err(|error| SourceError::Io {
                        name: name.to_string(),
                        path: format!("listen address {address}"),
                        error,
                    })?;
                serve(listener, router, stopped)
            }
        };
        Ok(Server {
            task,
            stop: Some(stop),
            address,
        })
    }

    /// Stops accepting (the listener closes; open connections finish what they have).
    pub fn signal_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Stops, and waits (a bounded time) for the connections to finish.
    pub async fn stop(mut self) {
        self.signal_stop();
        if tokio::time::timeout(DRAIN, &mut self.task).await.is_err() {
            self.task.abort();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.signal_stop();
    }
}

/// Answers are small and awaited one by one: never hold them back.
fn nodelay(tcp: &mut tokio::net::TcpStream) {
    let _ = tcp.set_nodelay(true);
}

/// Serves `router` on `listener` until `stopped`, on a task of its own.
fn serve<L>(listener: L, router: Router, stopped: oneshot::Receiver<()>) -> JoinHandle<()>
where
    L: Listener,
    L::Addr: std::fmt::Debug,
{
    tokio::spawn(async move {
        let serving = axum::serve(listener, router).with_graceful_shutdown(async {
            let _ = stopped.await;
        });
        if let Err(e) = serving.await {
            tracing::warn!("the HTTP server stopped: {e}");
        }
    })
}

/// The TLS acceptor of `config`, when it has `tls`.
pub(crate) fn acceptor(
    name: &str,
    config: &crate::HttpConfig,
) -> Result<Option<sluice_source_sdk::tls::TlsAcceptor>, SourceError> {
    match &config.tls {
        None => Ok(None),
        Some(tls) => tls
            .acceptor("tls")
            .map(Some)
            .map_err(|e| SourceError::Config {
                name: name.to_string(),
                reason: e.to_string(),
            }),
    }
}

pub(crate) async fn bind(
    name: &str,
    address: SocketAddr,
) -> Result<tokio::net::TcpListener, SourceError> {
    let started = Instant::now();
    loop {
        match tokio::net::TcpListener::bind(address).await {
            Ok(listener) => return Ok(listener),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                if started.elapsed() < BIND_PATIENCE {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
                return Err(SourceError::Config {
                    name: name.to_string(),
                    reason: format!(
                        "cannot listen on {address}: the address is in use. Another \
                         process listens there, or this source is read by two \
                         materializations (each binds the address): give each \
                         materialization a source of its own with its own listen address"
                    ),
                });
            }
            Err(error) => {
                return Err(SourceError::Io {
                    name: name.to_string(),
                    path: format!("listen address {address}"),
                    error,
                });
            }
        }
    }
}

pub(crate) fn reply(status: StatusCode, body: Value) -> Response {
    let mut response = (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body.to_string(),
    )
        .into_response();
    if matches!(
        status,
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
    ) {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static(RETRY_AFTER));
    }
    response
}

/// The body of a 200: `dead_lettered` only when some were.
fn committed(txn: u64, documents: u64, dead_lettered: u64) -> Value {
    let mut body = json!({"txn": txn, "documents": documents});
    if dead_lettered > 0 {
        body["dead_lettered"] = dead_lettered.into();
    }
    body
}

pub(crate) fn error(status: StatusCode, message: impl Into<String>) -> Response {
    reply(status, json!({ "error": message.into() }))
}

fn answer(answer: Answer) -> Response {
    match answer {
        Answer::Committed {
            txn,
            documents,
            dead_lettered,
        } => reply(StatusCode::OK, committed(txn, documents, dead_lettered)),
        Answer::NotApplied(why) | Answer::Unknown(why) => {
            error(StatusCode::SERVICE_UNAVAILABLE, why)
        }
    }
}

async fn outcome(outcome: Outcome) -> Response {
    match outcome {
        Outcome::Answer(a) => answer(a),
        Outcome::Busy => error(
            StatusCode::TOO_MANY_REQUESTS,
            "the source's buffer is full (max_buffered_bytes) while transactions \
             commit: retry after a second",
        ),
        Outcome::KeysFull { keys } => error(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "the idempotency window holds {keys} keys, as many as a cluster's shard log \
                 can carry ({} KiB): retry after a second (keys leave as their window \
                 passes), or shorten idempotency_window",
                crate::keys::CARRIED_BUDGET >> 10
            ),
        ),
        Outcome::Wait(rx) => match rx.await {
            Ok(a) => answer(a),
            // The source was dropped without closing (its run failed).
            Err(_) => answer(Answer::Unknown(
                "the pipeline's run stopped before this request's transaction was \
                 known to commit: retry with the same Idempotency-Key"
                    .to_string(),
            )),
        },
    }
}

async fn ingest(
    State(shared): State<Arc<Shared>>,
    Path(source): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    if source != shared.name {
        return other_source(&source, &shared.name);
    }
    if let Err(response) = authorize(&headers, &shared.config.token) {
        return response;
    }
    let limit = shared.config.max_body_bytes;
    let too_large = || {
        error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!(
                "the body is larger than this source's max_body_bytes ({limit} bytes): send smaller batches"
            ),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit) {
        return too_large();
    }
    let key = match idempotency_key(&headers) {
        Ok(key) => key,
        Err(response) => return response,
    };
    let Some(body) = read_body(body, limit).await else {
        return too_large();
    };
    let body = match body {
        Ok(body) => body,
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("cannot read the body: {e}"),
            );
        }
    };
    if let Some(key) = &key
        && let Some(known) = shared.lookup(key)
    {
        return outcome(known).await;
    }
    let checked = match Batch::parse_checked(&body, shared.intake.as_ref()) {
        Ok(checked) => checked,
        Err(bad) => {
            return reply(
                StatusCode::BAD_REQUEST,
                json!({
                    "error": format!("{bad}; nothing of this body was applied"),
                    "at": bad.place,
                }),
            );
        }
    };
    drop(body);
    outcome(shared.accept(checked, key)).await
}

/// The 404 of a POST to another source than `name`.
pub(crate) fn other_source(source: &str, name: &str) -> Response {
    error(
        StatusCode::NOT_FOUND,
        format!(
            "no source {source:?} here: this server ingests into source {name:?} \
             (POST /ingest/{name})"
        ),
    )
}

/// `Err` is the 401 or 403 to answer.
#[allow(clippy::result_large_err)]
pub(crate) fn authorize(headers: &HeaderMap, token: &str) -> Result<(), Response> {
    let presented = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        });
    match presented {
        None => {
            let mut response = error(
                StatusCode::UNAUTHORIZED,
                "no bearer token: send Authorization: Bearer <token>, the source's token",
            );
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            Err(response)
        }
        Some(presented) if bool::from(presented.as_bytes().ct_eq(token.as_bytes())) => Ok(()),
        Some(_) => Err(error(
            StatusCode::FORBIDDEN,
            "the bearer token is not this source's token",
        )),
    }
}

#[allow(clippy::result_large_err)]
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, Response> {
    let Some(value) = headers.get(IDEMPOTENCY_KEY) else {
        return Ok(None);
    };
    match value.to_str() {
        Ok(key) if !key.is_empty() && key.len() <= MAX_KEY_LEN => Ok(Some(key.to_string())),
        _ => Err(error(
            StatusCode::BAD_REQUEST,
            format!(
                "the Idempotency-Key must be 1 to {MAX_KEY_LEN} visible ASCII characters \
                 (e.g. a UUID)"
            ),
        )),
    }
}

/// The whole body, or `None` once it streams past `limit`.
async fn read_body(body: Body, limit: u64) -> Option<Result<Vec<u8>, axum::Error>> {
    use futures::StreamExt;
    let mut stream = body.into_data_stream();
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(chunk) => {
                if out.len() as u64 + chunk.len() as u64 > limit {
                    return None;
                }
                out.extend_from_slice(&chunk);
            }
            Err(e) => return Some(Err(e)),
        }
    }
    Some(Ok(out))
}

async fn health(State(shared): State<Arc<Shared>>) -> Response {
    if shared.running() {
        reply(
            StatusCode::OK,
            json!({"status": "ok", "source": shared.name}),
        )
    } else {
        reply(
            StatusCode::SERVICE_UNAVAILABLE,
            json!({"status": "closing", "source": shared.name}),
        )
    }
}

pub(crate) async fn not_found() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "no such route: POST /ingest/<source> or GET /health",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `documents` counts the stored documents; `dead_lettered` is there when some were.
    #[test]
    fn a_200_says_how_many_documents_were_stored_and_dead_lettered() {
        assert_eq!(committed(4, 2, 0), json!({"txn": 4, "documents": 2}));
        assert_eq!(
            committed(4, 1, 1),
            json!({"txn": 4, "documents": 1, "dead_lettered": 1})
        );
    }
}
