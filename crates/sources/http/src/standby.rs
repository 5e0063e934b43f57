//! The HTTP source's stand-in on a cluster member that does not hold its shard: under
//! `cluster:` every member listens on the source's address, and only the holder
//! serves. Everywhere else a POST is refused, naming the holder, so a client behind a
//! load balancer retries and lands there:
//!
//! ```text
//!  POST /ingest/<source> ─▶ 404 other source ─▶ 401/403 token ─▶ 503 + Retry-After: 1
//!       {"error": "...", "holder": {"member": "b", "address": "10.0.0.6:8080"}}
//!       Sluice-Holder: b   Sluice-Holder-Address: 10.0.0.6:8080 (if it published one)
//!  GET /health ─▶ 503 {"status": "standby", "holder": ...}: a load balancer's health
//!       check sends traffic to the holder only
//! ```
//!
//! Refusing rather than forwarding: a refused body was never accepted here, so it can
//! never be applied twice, and the client's retry (with its Idempotency-Key) meets the
//! holder's keys. The member starts a standby when it does not hold the shard and
//! stops it (awaited: the address is free) before it runs the shard; the standby binds
//! on a task of its own, waiting while the address is still held (the source of a
//! shard this member just let go, draining).

use crate::config::HttpConfig;
use crate::server::{self, Server};
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use serde_json::{Value, json};
use sluice_source_sdk::kind::{Holder, Standby};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The header naming the member that holds the source's shard.
pub const HOLDER: &str = "sluice-holder";
/// The header naming the address it listens on, when it published one.
pub const HOLDER_ADDRESS: &str = "sluice-holder-address";

/// How often a standby tries the address again while it is in use.
const BIND_RETRY: Duration = Duration::from_millis(100);

/// A running standby of one source.
pub struct HttpStandby {
    address: String,
    state: Arc<StandbyState>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

struct StandbyState {
    name: String,
    token: String,
    holder: Mutex<Option<Holder>>,
}

impl HttpStandby {
    /// Starts listening on `config.listen` for source `name` (on a task: it binds once
    /// the address is free).
    pub fn start(name: &str, config: &HttpConfig) -> HttpStandby {
        let state = Arc::new(StandbyState {
            name: name.to_string(),
            token: config.token.clone(),
            holder: Mutex::new(None),
        });
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(run(state.clone(), config.clone(), stopped));
        HttpStandby {
            address: config.listen.clone(),
            state,
            stop: Some(stop),
            task,
        }
    }
}

#[async_trait::async_trait]
impl Standby for HttpStandby {
    fn address(&self) -> String {
        self.address.clone()
    }

    fn set_holder(&self, holder: Option<Holder>) {
        *self.state.holder.lock().unwrap_or_else(|e| e.into_inner()) = holder;
    }

    async fn stop(mut self: Box<Self>) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for HttpStandby {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// Binds (waiting while the address is in use), serves until `stopped`, then stops
/// the server and waits for it: the address is free when this returns.
async fn run(state: Arc<StandbyState>, config: HttpConfig, mut stopped: oneshot::Receiver<()>) {
    let name = state.name.clone();
    let acceptor = match server::acceptor(&name, &config) {
        Ok(acceptor) => acceptor,
        Err(e) => {
            tracing::warn!(source = name, "the standby listener cannot start: {e}");
            return;
        }
    };
    let address = config.address();
    let started = Instant::now();
    let mut warned = false;
    let listener = loop {
        match tokio::net::TcpListener::bind(address).await {
            Ok(listener) => break listener,
            Err(e) => {
                if !warned && started.elapsed() > server::BIND_PATIENCE {
                    warned = true;
                    tracing::warn!(
                        source = name,
                        "the standby cannot listen on {address} yet ({e}); still trying"
                    );
                }
            }
        }
        tokio::select! {
            _ = &mut stopped => return,
            () = tokio::time::sleep(BIND_RETRY) => {}
        }
    };
    let router = Router::new()
        .route("/ingest/{source}", post(refuse))
        .route("/health", get(health))
        .fallback(server::not_found)
        .with_state(state);
    let server = match Server::over(&name, listener, acceptor, router) {
        Ok(server) => server,
        Err(e) => {
            tracing::warn!(source = name, "the standby listener cannot start: {e}");
            return;
        }
    };
    tracing::info!(source = name, address = %server.address, "standing by: another member holds the source's shard");
    let _ = stopped.await;
    server.stop().await;
}

impl StandbyState {
    fn holder(&self) -> Option<Holder> {
        self.holder
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// The holder as the refusals' bodies name it.
fn holder_json(holder: &Option<Holder>) -> Value {
    match holder {
        None => Value::Null,
        Some(h) => json!({"member": h.member, "address": h.address}),
    }
}

async fn refuse(
    State(state): State<Arc<StandbyState>>,
    Path(source): Path<String>,
    headers: HeaderMap,
) -> Response {
    if source != state.name {
        return server::other_source(&source, &state.name);
    }
    if let Err(response) = server::authorize(&headers, &state.token) {
        return response;
    }
    let holder = state.holder();
    let message = match &holder {
        Some(h) => format!(
            "this cluster member does not hold source {:?}'s shard; member {}{} does: \
             nothing of this request was applied; retry there (or through the load \
             balancer) with the same Idempotency-Key",
            state.name,
            h.member,
            h.address
                .as_ref()
                .map(|a| format!(" at {a}"))
                .unwrap_or_default()
        ),
        None => format!(
            "no cluster member holds source {:?}'s shard right now (it is moving to \
             another member): nothing of this request was applied; retry after a second \
             with the same Idempotency-Key",
            state.name
        ),
    };
    let mut response = server::reply(
        StatusCode::SERVICE_UNAVAILABLE,
        json!({"error": message, "holder": holder_json(&holder)}),
    );
    if let Some(h) = &holder {
        let headers = response.headers_mut();
        if let Ok(member) = HeaderValue::from_str(&h.member) {
            headers.insert(HOLDER, member);
        }
        if let Some(address) = h
            .address
            .as_deref()
            .and_then(|a| HeaderValue::from_str(a).ok())
        {
            headers.insert(HOLDER_ADDRESS, address);
        }
    }
    response
}

async fn health(State(state): State<Arc<StandbyState>>) -> Response {
    server::reply(
        StatusCode::SERVICE_UNAVAILABLE,
        json!({"status": "standby", "source": state.name, "holder": holder_json(&state.holder())}),
    )
}
