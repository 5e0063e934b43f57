//! The one way tests drive a Transactions stream: as a runtime does, through the
//! checked client ([`sluice_driver_sdk::client`]), over any [`Endpoint`].
//!
//! ```text
//!   Session::open(endpoint, Open) ──▶ client::open ──▶ Opened (the recovered checkpoint)
//!   Session::run(Txn):  ┌ send: Acknowledge ⇄ Loads ─(Acknowledged)─▶ Prepare ┐ concurrently
//!                       └ recv: Acknowledged, Loaded* ... Prepared ──────────┘
//!                       then Stores, Commit, [Loads of T+1] ──▶ DriverCommitted
//! ```
//!
//! What holds:
//! - The sending and receiving halves of the load phase run concurrently, as a runtime's
//!   must: a driver may answer Loads while more are being sent, so neither side blocks
//!   on a full channel.
//! - A failure reports the driver's own error (e.g. [`Error::Fenced`]), never the
//!   "stream closed" that a send into a stream the driver just ended returns: the
//!   receiving half's error wins, and a failed send is replaced by the next response.
//! - Any answer the protocol does not allow is an error, never a panic, so the suite
//!   can report it as a failed scenario.

use serde_json::Value;
use sluice_driver_sdk::arena::loaded_docs;
use sluice_driver_sdk::client::{self, ClientReceiver, ClientSender, Response};
use sluice_driver_sdk::materialize::transaction_request::{Load, Open, Prepare, Store};
use sluice_driver_sdk::materialize::transaction_response::Opened;
use sluice_driver_sdk::{Endpoint, Error, Result};
use tokio::sync::oneshot;

/// How long a session waits for the driver under test: a hung driver fails its
/// scenario instead of the suite hanging.
const SESSION_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// A runtime's side of one Transactions stream, opened.
pub struct Session {
    tx: ClientSender,
    rx: ClientReceiver,
    /// What the driver answered to Open: the recovered runtime checkpoint.
    pub opened: Opened,
}

/// One transaction: Loads, the runtime checkpoint Prepare carries, Stores.
#[derive(Default)]
pub struct Txn {
    pub loads: Vec<Load>,
    pub checkpoint: Vec<u8>,
    pub stores: Vec<Store>,
    /// Send the Loads before the Acknowledge of the prior commit (pipelining), not after.
    pub loads_first: bool,
}

impl Session {
    /// Starts a Transactions stream on `endpoint` and opens it with `open`.
    pub async fn open(endpoint: &dyn Endpoint, open: Open) -> Result<Session> {
        let stream = endpoint.transactions().await?;
        let (tx, rx, opened) = client::open(stream, open, SESSION_TIMEOUT).await?;
        Ok(Session { tx, rx, opened })
    }

    /// The runtime checkpoint the driver recovered at Open (empty: none).
    pub fn recovered(&self) -> &[u8] {
        &self.opened.flow_checkpoint
    }

    /// Runs `txn` through DriverCommitted; returns the loaded documents with their
    /// binding, in the order they arrived.
    pub async fn run(&mut self, txn: Txn) -> Result<Vec<(u32, Value)>> {
        self.run_then_load(txn, Vec::new()).await
    }

    /// Runs `txn` as [`Session::run`] does, but sends `next_loads`, Loads of the next
    /// transaction, right after its Commit and before reading DriverCommitted, as Flow's
    /// runtime does while a transaction commits. Their documents come back in the next
    /// transaction's `run`. Nothing reads responses while they are sent, so they must
    /// fit the transport's buffers: a few messages.
    pub async fn run_then_load(
        &mut self,
        txn: Txn,
        next_loads: Vec<Load>,
    ) -> Result<Vec<(u32, Value)>> {
        let Txn {
            loads,
            checkpoint,
            stores,
            loads_first,
        } = txn;
        let (acked_tx, acked_rx) = oneshot::channel();
        let tx = &mut self.tx;
        let send = async {
            if !loads_first {
                tx.acknowledge().await?;
            }
            for load in loads {
                tx.load(load).await?;
            }
            if loads_first {
                tx.acknowledge().await?;
            }
            // Prepare may only follow Acknowledged; the receiving half says when.
            acked_rx
                .await
                .map_err(|_| Error::Transport("the stream ended before Acknowledged".into()))?;
            tx.prepare(Prepare {
                flow_checkpoint: checkpoint,
            })
            .await
        };
        let rx = &mut self.rx;
        let recv = async {
            let mut acked = Some(acked_tx);
            let mut loaded = Vec::new();
            loop {
                match rx.recv().await? {
                    Response::Acknowledged(_) => {
                        if let Some(acked) = acked.take() {
                            let _ = acked.send(());
                        }
                    }
                    Response::Loaded(msg) => {
                        for doc in loaded_docs(&msg) {
                            let doc: Value = serde_json::from_slice(doc?).map_err(|err| {
                                Error::Transport(format!("a Loaded document is not JSON: {err}"))
                            })?;
                            loaded.push((msg.binding, doc));
                        }
                    }
                    Response::Prepared(_) => return Ok(loaded),
                    // The state machine rejects DriverCommitted before Commit.
                    Response::DriverCommitted(_) => {
                        return Err(Error::Transport("DriverCommitted before Commit".into()));
                    }
                }
            }
        };
        let (sent, received) = tokio::join!(send, recv);
        let loaded = received?;
        sent?;

        for store in stores {
            let sent = self.tx.store(store).await;
            self.driver_error(sent).await?;
        }
        let sent = self.tx.commit().await;
        self.driver_error(sent).await?;
        for load in next_loads {
            let sent = self.tx.load(load).await;
            self.driver_error(sent).await?;
        }
        match self.rx.recv().await? {
            Response::DriverCommitted(_) => Ok(loaded),
            // Not reached: the state machine accepts only DriverCommitted after Commit.
            other => Err(Error::Transport(format!(
                "expected DriverCommitted, got {other:?}"
            ))),
        }
    }

    /// One transaction that acknowledges the prior one, loads `loads`, prepares with
    /// `checkpoint`, stores `stores` and commits. Returns the loaded documents in the
    /// order they arrived.
    pub async fn transaction(
        &mut self,
        loads: Vec<Load>,
        checkpoint: &[u8],
        stores: Vec<Store>,
    ) -> Result<Vec<Value>> {
        let txn = Txn {
            loads,
            checkpoint: checkpoint.to_vec(),
            stores,
            loads_first: false,
        };
        let loaded = self.run(txn).await?;
        Ok(loaded.into_iter().map(|(_, doc)| doc).collect())
    }

    /// Acknowledges the last commit, waits for Acknowledged, and closes the stream.
    pub async fn close(mut self) -> Result<()> {
        let sent = self.tx.acknowledge().await;
        self.driver_error(sent).await?;
        match self.rx.recv().await? {
            Response::Acknowledged(_) => Ok(()),
            other => Err(Error::Transport(format!(
                "expected Acknowledged, got {other:?}"
            ))),
        }
    }

    /// A request that could not be sent because the driver ended the stream fails with
    /// the driver's own error, the next response, rather than "stream closed".
    async fn driver_error(&mut self, sent: Result<()>) -> Result<()> {
        match sent {
            Ok(()) => Ok(()),
            Err(closed) => Err(self.rx.recv().await.err().unwrap_or(closed)),
        }
    }
}
