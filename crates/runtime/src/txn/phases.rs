//! The protocol phases of one transaction, as the committer drives them: loads (with the
//! Acknowledge of the prior commit and the Prepare), and stores.

use super::Binding;
use serde_json::Value;
use sluice_doc::combine::{CombineError, Combiner, Drained};
use sluice_doc::tuple;
use sluice_driver::Error as DriverError;
use sluice_driver::arena::{LoadBuilder, StoreBuilder, StoreDoc};
use sluice_driver::client::{ClientReceiver, ClientSender, Response};
use sluice_proto::flow;
use sluice_proto::materialize::transaction_request::Prepare;
use sluice_proto::materialize::transaction_response::Loaded;
use std::time::Duration;

/// Sends Acknowledge (unless already sent while idle), then a Load for every key of a standard binding while moving each
/// drained document into `c2`; then, once Acknowledged has arrived, Prepare.
pub(super) async fn send_loads(
    tx: &mut ClientSender,
    c1: Combiner,
    c2: &mut Combiner,
    bindings: &[Binding],
    acknowledged: bool,
    acked: tokio::sync::oneshot::Receiver<()>,
    prepare_checkpoint: Vec<u8>,
) -> Result<(), DriverError> {
    if !acknowledged {
        tx.acknowledge().await?;
    }
    let mut builder = LoadBuilder::new();
    let drain = c1
        .drain()
        .map_err(|e| DriverError::Transport(format!("combiner: {e}")))?;
    for drained in drain {
        let Drained {
            binding, key, doc, ..
        } = drained.map_err(|e| DriverError::Transport(format!("combiner: {e}")))?;
        if !bindings[binding as usize].delta_updates {
            builder.push(binding, &key);
            for load in builder.take_ready() {
                tx.load(load).await?;
            }
        }
        c2.combine_right_keyed(binding, &key, doc)
            .map_err(|e| DriverError::Transport(format!("combiner: {e}")))?;
    }
    for load in builder.finish() {
        tx.load(load).await?;
    }
    crate::failpoint::fail_point!(AFTER_LOADS, std::convert::identity);
    // The prepare phase begins only once the prior commit is acknowledged. If the
    // receiver stopped without seeing Acknowledged, its own error explains why.
    if acked.await.is_err() {
        return Ok(());
    }
    tx.prepare(Prepare {
        flow_checkpoint: prepare_checkpoint,
    })
    .await
}

/// Collects responses until Prepared: Acknowledged (exactly one, signalled to the
/// sender, which may then Prepare) and Loaded documents.
pub(super) async fn recv_until_prepared(
    rx: &mut ClientReceiver,
    acked: tokio::sync::oneshot::Sender<()>,
) -> Result<(Vec<Loaded>, flow::DriverCheckpoint), DriverError> {
    let mut loaded = Vec::new();
    let mut acked = Some(acked);
    loop {
        match rx.recv().await? {
            Response::Loaded(l) => loaded.push(l),
            Response::Acknowledged => {
                if let Some(acked) = acked.take() {
                    let _ = acked.send(());
                }
            }
            Response::Prepared(cp) => return Ok((loaded, cp)),
            Response::DriverCommitted => {
                return Err(DriverError::Transport(
                    "DriverCommitted before Prepared".to_string(),
                ));
            }
        }
    }
}

pub(super) async fn expect_acknowledged(rx: &mut ClientReceiver) -> Result<(), DriverError> {
    match rx.recv().await? {
        Response::Acknowledged => Ok(()),
        other => Err(DriverError::Transport(format!(
            "expected Acknowledged, got {other:?}"
        ))),
    }
}

/// The driver's own reason for a failed send, if it ended the stream with one.
pub(super) async fn receiver_error(rx: &mut ClientReceiver) -> Option<DriverError> {
    match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
        Ok(Err(e)) => Some(e),
        _ => None,
    }
}

pub(super) enum StoreFailure {
    Combine(CombineError),
    Driver(DriverError),
}

/// Drains `c2` into Store messages (exists = the key was loaded). Returns documents stored.
pub(super) async fn send_stores(
    tx: &mut ClientSender,
    c2: Combiner,
    bindings: &[Binding],
) -> Result<u64, StoreFailure> {
    let mut stored = 0;
    let mut builder = StoreBuilder::new();
    let mut values = Vec::new();
    let mut doc_json = Vec::new();
    for drained in c2.drain().map_err(StoreFailure::Combine)? {
        let Drained {
            binding,
            key,
            doc,
            full,
        } = drained.map_err(StoreFailure::Combine)?;
        values.clear();
        for ptr in &bindings[binding as usize].values {
            tuple::pack_value(ptr.query(&doc).unwrap_or(&Value::Null), &mut values);
        }
        doc_json.clear();
        serde_json::to_writer(&mut doc_json, &doc).expect("a Value serializes");
        builder.push(
            binding,
            StoreDoc {
                key: &key,
                values: &values,
                doc: &doc_json,
                exists: full,
            },
        );
        for store in builder.take_ready() {
            tx.store(store).await.map_err(StoreFailure::Driver)?;
        }
        stored += 1;
    }
    crate::failpoint::fail_point!(MID_STORE, StoreFailure::Driver);
    for store in builder.finish() {
        tx.store(store).await.map_err(StoreFailure::Driver)?;
    }
    Ok(stored)
}
