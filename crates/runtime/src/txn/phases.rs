//! The protocol phases of one transaction, as the committer drives them: loads (with the
//! Acknowledge of the prior commit and the Prepare), and stores.
//!
//! The load phase runs two halves at once on the committer's task: [`send_loads`]
//! drains C1 into C2 and sends Loads, while [`recv_loaded`] reduces each Loaded
//! document into C2, to the left of the key's new documents, as it arrives. Both reach
//! C2 through one uncontended lock (only ever held between awaits), so Loaded documents
//! are held under C2's memory budget (spilled like any other) rather than collected
//! until Prepared: a transaction that loads a whole large table holds at most a budget
//! of it.

use super::state::Ack;
use super::stored::{StoredDocs, StoredDocsBuilder};
use crate::recovery::Checkpoint;
use crate::types::Binding;
use sluice_doc::combine::{CombineError, Combiner, Drained};
use sluice_doc::compact::Doc;
use sluice_doc::parse::DocParser;
use sluice_doc::tuple;
use sluice_driver_sdk::Error as DriverError;
use sluice_driver_sdk::Peer;
use sluice_driver_sdk::arena::{self, LoadBuilder, StoreBuilder, StoreDoc};
use sluice_driver_sdk::client::{ClientReceiver, ClientSender, Response};
use sluice_driver_sdk::machine::violation;
use sluice_proto::flow;
use sluice_proto::materialize::transaction_request::Prepare;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The load phase's inputs: this transaction's combined documents (`c1`), the combiner
/// they move into (`c2`, shared with [`recv_loaded`]), what the last transaction stored,
/// and the checkpoint Prepare sends.
pub(super) struct LoadPhase<'a> {
    pub c1: Combiner,
    pub c2: &'a Mutex<Combiner>,
    pub previous: StoredDocs,
    pub bindings: &'a [Binding],
    /// Whether the prior commit's Acknowledge is still owed (not sent while idle).
    pub ack: Ack,
    pub checkpoint: &'a mut Checkpoint,
}

/// What [`send_loads`] did.
pub(super) struct LoadsSent {
    /// `c1` itself when every binding is delta-updates (nothing to load, so the combined
    /// documents are stored as they are; else the store phase drains `c2`).
    pub delta_only: Option<Combiner>,
    /// Documents that came from `previous` instead of a Load.
    pub reused: u64,
    /// When the last Load was sent (the Prepare waits for Acknowledged after it).
    pub at: Instant,
}

/// Sends Acknowledge (if owed), then, for every key of a standard binding: its document
/// as the last transaction stored it, if `previous` has it (left into `c2`, no Load),
/// else a Load if the store may hold the key; meanwhile each drained document moves into
/// `c2`. Then, once Acknowledged has arrived, Prepare with `checkpoint` (whose highest
/// stored keys now include this transaction's).
pub(super) async fn send_loads(
    tx: &mut ClientSender,
    phase: LoadPhase<'_>,
    acked: tokio::sync::oneshot::Receiver<()>,
) -> Result<LoadsSent, PhaseError> {
    let LoadPhase {
        c1,
        c2,
        mut previous,
        bindings,
        ack,
        checkpoint,
    } = phase;
    if ack == Ack::Owed {
        tx.acknowledge().await?;
    }
    if bindings.iter().all(|b| b.delta_updates) {
        let at = Instant::now();
        send_prepare(tx, acked, checkpoint).await?;
        return Ok(LoadsSent {
            delta_only: Some(c1),
            reused: 0,
            at,
        });
    }
    let mut known = KnownKeys::from_checkpoint(checkpoint, bindings);
    let mut builder = LoadBuilder::new();
    let mut reused = 0;
    // Every key C1 holds in memory moves into C2 (a spilled run's keys grow it).
    lock(c2).reserve(c1.stats().entries);
    let drain = c1.drain().map_err(PhaseError::Combine)?;
    // A non-associative binding drains a key's documents one by one: load it once.
    let (mut last_binding, mut last_key) = (None, Vec::new());
    for drained in drain {
        let Drained {
            binding,
            key,
            doc,
            resets,
            ..
        } = drained.map_err(PhaseError::Combine)?;
        let repeated = last_binding == Some(binding) && last_key == key;
        if !repeated {
            last_binding = Some(binding);
            last_key.clear();
            last_key.extend_from_slice(&key);
        }
        if !repeated && !bindings[binding as usize].delta_updates {
            match previous.take(binding, &key) {
                Some(Doc::Null) => {} // Deleted by the last transaction.
                Some(stored) => {
                    lock(c2)
                        .reduce_left(binding, &key, stored)
                        .map_err(PhaseError::Combine)?;
                    reused += 1;
                }
                None if known.may_exist(binding, &key) => {
                    builder.push(binding, &key);
                    for load in builder.take_ready() {
                        tx.load(load).await?;
                    }
                }
                None => {}
            }
        }
        known.stored(binding, &key);
        lock(c2)
            .combine_right_keyed(binding, &key, doc, resets)
            .map_err(PhaseError::Combine)?;
    }
    for load in builder.finish() {
        tx.load(load).await?;
    }
    let at = Instant::now();
    known.into_checkpoint(checkpoint, bindings);
    send_prepare(tx, acked, checkpoint).await?;
    Ok(LoadsSent {
        delta_only: None,
        reused,
        at,
    })
}

/// The load phase's combiner, held only between awaits. A poisoned lock means a
/// reduction panicked: nothing of this transaction may be stored.
fn lock(c2: &Mutex<Combiner>) -> std::sync::MutexGuard<'_, Combiner> {
    c2.lock()
        .expect("no reduction panicked while the load phase held C2")
}

/// Prepare with `checkpoint`, once the prior commit is acknowledged.
async fn send_prepare(
    tx: &mut ClientSender,
    acked: tokio::sync::oneshot::Receiver<()>,
    checkpoint: &Checkpoint,
) -> Result<(), PhaseError> {
    crate::failpoint::fail_point!(AFTER_LOADS, PhaseError::Driver);
    // The prepare phase begins only once the prior commit is acknowledged. The receiver
    // drops `acked` only when it fails, and then its own error ends the phase.
    if acked.await.is_err() {
        return Ok(());
    }
    tx.prepare(Prepare {
        flow_checkpoint: checkpoint.to_bytes(),
    })
    .await?;
    Ok(())
}

/// The highest packed key ever stored per tracked binding (see `Checkpoint::max_keys`).
/// Packed keys order like their values, so a key above the highest stored one cannot be
/// in the store and needs no Load.
struct KnownKeys {
    /// Per binding: `None` untracked (load every key), else the highest stored key
    /// (empty: nothing stored yet).
    max: Vec<Option<Vec<u8>>>,
}

impl KnownKeys {
    fn from_checkpoint(checkpoint: &Checkpoint, bindings: &[Binding]) -> Self {
        let max = bindings
            .iter()
            .map(|b| {
                checkpoint
                    .max_keys
                    .get(&b.resource)
                    .and_then(|text| sluice_doc::hex::decode(text))
            })
            .collect();
        KnownKeys { max }
    }

    fn may_exist(&self, binding: u32, key: &[u8]) -> bool {
        match &self.max[binding as usize] {
            None => true,
            Some(max) => key <= max.as_slice(),
        }
    }

    /// Drained keys come in ascending order per binding: each stored key is the new max.
    fn stored(&mut self, binding: u32, key: &[u8]) {
        if let Some(max) = &mut self.max[binding as usize]
            && key > max.as_slice()
        {
            max.clear();
            max.extend_from_slice(key);
        }
    }

    fn into_checkpoint(self, checkpoint: &mut Checkpoint, bindings: &[Binding]) {
        for (binding, max) in bindings.iter().zip(self.max) {
            if let Some(max) = max {
                checkpoint
                    .max_keys
                    .insert(binding.resource.clone(), sluice_doc::hex::encode(&max));
            }
        }
    }
}

/// The driver's state update a response carries beside the protocol's own: the current
/// protocol's StartedCommit state (on DriverCommitted) and Acknowledged state (on
/// Acknowledged), which the seed protocol carries as `driver_checkpoint` extension
/// fields. Prepared's is [`Prepared::driver_checkpoint`].
pub(super) fn state_update(response: &Response) -> Option<flow::DriverCheckpoint> {
    match response {
        Response::Acknowledged(state) | Response::DriverCommitted(state) => state.clone(),
        Response::Loaded(_) | Response::Prepared(_) => None,
    }
}

/// What [`recv_loaded`] received.
pub(super) struct Prepared {
    /// The Acknowledged state of the prior commit, if the driver sent one: merged
    /// before this transaction's Prepared (not transactional: it rides on this commit).
    pub acknowledged_state: Option<flow::DriverCheckpoint>,
    pub driver_checkpoint: flow::DriverCheckpoint,
    /// Documents loaded, per binding.
    pub loaded: Vec<u64>,
    /// When Acknowledged arrived.
    pub acknowledged: Option<Instant>,
}

/// Receives responses until Prepared: Acknowledged (exactly one, signalled to the
/// sender, which may then Prepare) and Loaded documents, each reduced into `c2` to the
/// left of its key's new documents as it arrives.
pub(super) async fn recv_loaded(
    rx: &mut ClientReceiver,
    acked: tokio::sync::oneshot::Sender<()>,
    c2: &Mutex<Combiner>,
    bindings: &[Binding],
) -> Result<Prepared, PhaseError> {
    let mut acked = Some(acked);
    let mut parser = DocParser::default();
    let mut key = Vec::new();
    let mut loaded = vec![0; bindings.len()];
    let mut acknowledged = None;
    let mut acknowledged_state = None;
    loop {
        let response = rx.recv().await?;
        if let (Response::Acknowledged(_), Some(state)) = (&response, state_update(&response)) {
            acknowledged_state = Some(state);
        }
        match response {
            Response::Loaded(msg) => {
                let binding = msg.binding;
                let Some(b) = bindings.get(binding as usize) else {
                    return Err(PhaseError::Loaded {
                        binding,
                        reason: format!("is of no binding: there are {}", bindings.len()),
                    });
                };
                let mut c2 = lock(c2);
                for doc in arena::loaded_docs(&msg) {
                    let bad = |reason: String| PhaseError::Loaded { binding, reason };
                    let doc = parser
                        .parse(doc?)
                        .map_err(|e| bad(format!("is not JSON: {e}")))?;
                    key.clear();
                    b.collection
                        .key
                        .pack_doc(&doc, &mut key)
                        .map_err(|e| bad(format!("has no key: {e}")))?;
                    // A document of a key the shard does not own is the driver's fault.
                    c2.reduce_left(binding, &key, doc).map_err(|e| match e {
                        CombineError::OutsideRange { .. } => bad(e.to_string()),
                        e => PhaseError::Combine(e),
                    })?;
                    loaded[binding as usize] += 1;
                }
            }
            Response::Acknowledged(_) => {
                acknowledged = Some(Instant::now());
                if let Some(acked) = acked.take() {
                    let _ = acked.send(());
                }
            }
            Response::Prepared(driver_checkpoint) => {
                return Ok(Prepared {
                    acknowledged_state,
                    driver_checkpoint,
                    loaded,
                    acknowledged,
                });
            }
            Response::DriverCommitted(_) => {
                return Err(PhaseError::Driver(
                    violation(
                        Peer::Driver,
                        "Loaded, Acknowledged or Prepared",
                        "DriverCommitted",
                    )
                    .into(),
                ));
            }
        }
    }
}

pub(super) async fn expect_acknowledged(rx: &mut ClientReceiver) -> Result<(), DriverError> {
    match rx.recv().await? {
        Response::Acknowledged(_) => Ok(()),
        other => Err(violation(Peer::Driver, "Acknowledged", other.name()).into()),
    }
}

/// The driver's own reason for a failed send, if it ended the stream with one.
pub(super) async fn receiver_error(rx: &mut ClientReceiver) -> Option<DriverError> {
    match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await {
        Ok(Err(e)) => Some(e),
        _ => None,
    }
}

/// Why a phase failed: the combiner (the transaction's documents; never retryable), a
/// Loaded document the driver sent that is not a document of its binding (never
/// retryable: the store holds it), or the driver stream.
pub(super) enum PhaseError {
    Combine(CombineError),
    Loaded { binding: u32, reason: String },
    Driver(DriverError),
}

impl From<DriverError> for PhaseError {
    fn from(err: DriverError) -> Self {
        PhaseError::Driver(err)
    }
}

/// What [`send_stores`] stored, per binding.
pub(super) struct Stored {
    /// Documents stored, deletions included.
    pub docs: Vec<u64>,
    pub deletions: Vec<u64>,
}

/// Drains `c2` into Store messages (exists = the key was loaded), keeping the stored
/// documents of standard bindings in `kept` for the next transaction. A key whose full
/// reduction deleted it is stored as `null` (a deletion) when it was loaded, and not at
/// all otherwise; either way it is kept as deleted.
pub(super) async fn send_stores(
    tx: &mut ClientSender,
    c2: Combiner,
    bindings: &[Binding],
    kept: &mut StoredDocsBuilder,
) -> Result<Stored, PhaseError> {
    let mut stored = Stored {
        docs: vec![0; bindings.len()],
        deletions: vec![0; bindings.len()],
    };
    let mut builder = StoreBuilder::new();
    let mut values = Vec::new();
    let mut doc_json = Vec::new();
    for drained in c2.drain().map_err(PhaseError::Combine)? {
        let Drained {
            binding,
            key,
            doc,
            full,
            deleted,
            resets: _,
        } = drained.map_err(PhaseError::Combine)?;
        let standard = !bindings[binding as usize].delta_updates;
        if deleted && !full {
            // Deleted, and not in the store (it was not loaded): nothing to store. The
            // key is remembered as absent, so the next transaction neither loads it nor
            // reduces onto a stale document.
            kept.push(binding, key, Doc::Null);
            continue;
        }
        // A deleted document is stored as the JSON document `null` of an existing key:
        // the protocol's deletion.
        values.clear();
        for ptr in &bindings[binding as usize].values {
            tuple::pack_doc(ptr.query_doc(&doc).unwrap_or(&Doc::Null), &mut values);
        }
        doc_json.clear();
        serde_json::to_writer(&mut doc_json, &doc).expect("a document serializes");
        builder.push(
            binding,
            StoreDoc {
                key: &key,
                values: &values,
                doc: &doc_json,
                exists: full,
            },
        );
        if standard {
            kept.push(binding, key, doc);
        }
        for store in builder.take_ready() {
            tx.store(store).await.map_err(PhaseError::Driver)?;
        }
        stored.docs[binding as usize] += 1;
        stored.deletions[binding as usize] += u64::from(deleted);
    }
    crate::failpoint::fail_point!(MID_STORE, PhaseError::Driver);
    for store in builder.finish() {
        tx.store(store).await.map_err(PhaseError::Driver)?;
    }
    Ok(stored)
}
