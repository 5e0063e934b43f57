//! One Transactions stream driven the way a runtime drives it, through the checked client.
//!
//! A transaction runs its sending and receiving halves concurrently (as a runtime must:
//! a driver may answer Loads while more are being sent), and reports the driver's own
//! error rather than a "channel closed" from the sending half when both fail.

use super::fixture::{Fixture, key, values};
use serde_json::Value;
use sluice_driver_sdk::arena::{LoadBuilder, StoreBuilder, StoreDoc, loaded_docs};
use sluice_driver_sdk::client::{self, ClientReceiver, ClientSender, Response};
use sluice_driver_sdk::flow;
use sluice_driver_sdk::materialize::transaction_request::Prepare;
use sluice_driver_sdk::materialize::transaction_response::Opened;
use sluice_driver_sdk::{Error, Result};
use tokio::sync::oneshot;

pub struct Session {
    tx: ClientSender,
    rx: ClientReceiver,
    pub opened: Opened,
}

/// One document to store: its binding, key, JSON (`null` to delete) and whether the
/// runtime believes the key exists.
pub struct Put {
    pub binding: u32,
    pub id: i64,
    pub doc: Value,
    pub exists: bool,
}

/// One transaction: keys to load, documents to store, the runtime checkpoint to commit.
#[derive(Default)]
pub struct Txn {
    pub loads: Vec<(u32, i64)>,
    pub stores: Vec<Put>,
    pub checkpoint: Vec<u8>,
    /// Send the Loads before the Acknowledge of the prior commit (pipelining), not after.
    pub loads_first: bool,
}

impl Session {
    pub async fn open(fx: &Fixture<'_>, spec: &flow::MaterializationSpec) -> Result<Session> {
        let stream = fx.endpoint.transactions().await?;
        let (tx, rx, opened) = client::open(stream, fx.open(spec)).await?;
        Ok(Session { tx, rx, opened })
    }

    /// Runs `txn` through DriverCommitted; returns the loaded documents, sorted by
    /// binding, then JSON text.
    pub async fn run(&mut self, txn: Txn) -> Result<Vec<(u32, Value)>> {
        let Txn {
            loads: keys,
            stores: puts,
            checkpoint,
            loads_first,
        } = txn;
        let mut loads = LoadBuilder::new();
        for (binding, id) in &keys {
            loads.push(*binding, &key(*id));
        }
        let (acked_tx, acked_rx) = oneshot::channel();
        let tx = &mut self.tx;
        let send = async {
            if !loads_first {
                tx.acknowledge().await?;
            }
            for load in loads.finish() {
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
                    Response::Acknowledged => {
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
                    Response::DriverCommitted => {
                        return Err(Error::Transport("DriverCommitted before Commit".into()));
                    }
                }
            }
        };
        let (sent, received) = tokio::join!(send, recv);
        let mut loaded = received?;
        sent?;

        let mut stores = StoreBuilder::new();
        for put in &puts {
            let json = serde_json::to_vec(&put.doc).expect("a JSON value serializes");
            let doc = StoreDoc {
                key: &key(put.id),
                values: &values(&put.doc),
                doc: &json,
                exists: put.exists,
            };
            stores.push(put.binding, doc);
        }
        for store in stores.finish() {
            self.tx.store(store).await?;
        }
        self.tx.commit().await?;
        match self.rx.recv().await? {
            Response::DriverCommitted => {}
            // The state machine accepts only DriverCommitted after Commit.
            other => {
                return Err(Error::Transport(format!(
                    "expected DriverCommitted, got {other:?}"
                )));
            }
        }
        loaded.sort_by_cached_key(|(binding, doc)| (*binding, doc.to_string()));
        Ok(loaded)
    }

    /// Acknowledges the last commit, waits for Acknowledged, and closes the stream.
    pub async fn close(mut self) -> Result<()> {
        self.tx.acknowledge().await?;
        match self.rx.recv().await? {
            Response::Acknowledged => Ok(()),
            other => Err(Error::Transport(format!(
                "expected Acknowledged, got {other:?}"
            ))),
        }
    }
}
