//! A TLS listener for axum's server: TCP connections accepted on a task of their own,
//! each handshake on a task of its own (a slow or silent client holds up no other),
//! the handshaken connections handed to the server as they complete. A refused
//! handshake is logged with its reason: a client certificate of another CA names its
//! issuer.

use crate::client_handshake_failure;
use axum::serve::Listener;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// The longest a client may take over its handshake.
const HANDSHAKE: Duration = Duration::from_secs(10);

/// TLS connections of a bound TCP listener (see the module docs).
pub struct TlsListener {
    local: SocketAddr,
    accepted: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    /// Accepts and handshakes; aborted when the server drops the listener.
    acceptor: JoinHandle<()>,
}

impl TlsListener {
    /// Serves TLS on `listener` with `tls`; its connections have `TCP_NODELAY` (the
    /// servers answer small messages one by one).
    pub fn new(listener: TcpListener, tls: TlsAcceptor) -> std::io::Result<TlsListener> {
        let local = listener.local_addr()?;
        let (handshaken, accepted) = mpsc::channel(64);
        let acceptor = tokio::spawn(async move {
            loop {
                let (tcp, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of descriptors, say: wait, as axum's own listener does.
                        tracing::debug!("accepting a connection failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                let (tls, handshaken) = (tls.clone(), handshaken.clone());
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE, tls.accept(tcp)).await {
                        Ok(Ok(stream)) => {
                            let _ = handshaken.send((stream, peer)).await;
                        }
                        Ok(Err(e)) => {
                            let reason =
                                client_handshake_failure(&e).unwrap_or_else(|| e.to_string());
                            tracing::warn!(%peer, "refused a connection: {reason}");
                        }
                        Err(_) => tracing::warn!(
                            %peer,
                            "refused a connection: no TLS handshake within {HANDSHAKE:?}"
                        ),
                    }
                });
            }
        });
        Ok(TlsListener {
            local,
            accepted,
            acceptor,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(connection) => connection,
            // The acceptor ended (aborted): nothing more comes.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local)
    }
}
