//! The [`OutputTransactor`]: one opened instance of an output materialization, its
//! view and every binding's endpoint. A [`FencedStore`], so the fence checks of a
//! failed Store or Commit are the driver SDK's, once.
//!
//! ```text
//!  Load         one view read for the message's keys → Loaded
//!  Store        per run of the message's documents (distinct keys):
//!                 one view read of their "before" documents   (async: the view)
//!                 before/after → changes, encoded             (blocking pool)
//!                   until the buffer holds max_buffer_size_bytes
//!                 the encoded documents' writes, batched       (async: the view)
//!                 a full buffer pushed, awaited, before going on
//!  Commit       snapshots sent; the rest pushed; batch_end; then the view commits
//!               with the checkpoint, if the range's fence is still the claimed one
//! ```
//!
//! A run ends before a key seen earlier in it, so the "before" documents read at its
//! start are still true for each of its documents (a later run reads the earlier run's
//! writes, which the open view transaction holds). The view's writes all join one
//! transaction of the view, which only the commit closes: what a crash or a fence
//! leaves is the previous transaction's view, whole.

use crate::OutputError;
use crate::change::{Change, Op};
use crate::encode::{Buffer, Encoder};
use crate::endpoint::{BatchKind, OutputEndpoint};
use crate::view::{View, Write};
use crate::{output_error, parse_json};
use async_trait::async_trait;
use serde_json::Value;
use sluice_driver_sdk::arena::{load_keys, store_docs};
use sluice_driver_sdk::fence::{Claim, FencedStore, PreparedCheckpoint};
use sluice_driver_sdk::materialize::transaction_request::{Load, Store};
use sluice_driver_sdk::{Error, LoadedSink, Metric, Report, Result};
use sluice_sink_sdk::driver::epoch_of;
use std::collections::HashSet;
use std::sync::Arc;

/// Documents per chunk of a snapshot's scan of the view.
const SNAPSHOT_CHUNK: usize = 2_000;

/// One binding's side of a stream.
pub(crate) struct BindingOutput {
    /// The binding's view in the view store (its resource path).
    pub view_key: String,
    pub endpoint: Box<dyn OutputEndpoint>,
    pub max_bytes: usize,
    /// `None` only while a blocking task holds it.
    pub encoder: Option<Box<dyn Encoder>>,
    pub buffer: Option<Buffer>,
    /// Its next batch is a snapshot: asked for and not yet sent.
    pub snapshot: bool,
    /// Its endpoint has begun the transaction's batch.
    pub in_batch: bool,
    /// Messages this stream pushed to its endpoint ([`sluice_driver_sdk::Transactor::report`]).
    pub published: u64,
}

fn taken() -> Error {
    Error::store(
        "output",
        "an earlier failure left the binding unusable",
        false,
    )
}

impl BindingOutput {
    /// Pushes the buffered messages.
    async fn push(&mut self) -> Result<()> {
        let buffer = self.buffer.as_mut().ok_or_else(taken)?;
        if !buffer.is_empty() {
            self.endpoint.push(buffer).await.map_err(output_error)?;
            self.published += buffer.len() as u64;
            buffer.pushed();
            crate::fail_point!(crate::AFTER_PUSH);
        }
        Ok(())
    }

    /// Pushes the buffered messages if they fill the buffer.
    async fn push_if_full(&mut self) -> Result<()> {
        if (self.buffer.as_ref()).is_some_and(|b| b.bytes() >= self.max_bytes) {
            self.push().await?;
        }
        Ok(())
    }

    /// Runs `work` with the binding's encoder and buffer on the blocking pool, and
    /// takes them back (an encoder or buffer lost with a failed task leaves the
    /// binding unusable: [`taken`]).
    async fn encoding<T: Send + 'static>(
        &mut self,
        work: impl FnOnce(&mut dyn Encoder, &mut Buffer) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let mut encoder = self.encoder.take().ok_or_else(taken)?;
        let mut buffer = self.buffer.take().ok_or_else(taken)?;
        let (encoder, buffer, done) = tokio::task::spawn_blocking(move || {
            let done = work(&mut *encoder, &mut buffer);
            (encoder, buffer, done)
        })
        .await
        .map_err(|e| Error::store("output encoding", e.to_string(), false))?;
        self.encoder = Some(encoder);
        self.buffer = Some(buffer);
        done
    }
}

pub(crate) struct OutputTransactor {
    pub view: View,
    pub claim: Claim,
    pub checkpoint: PreparedCheckpoint,
    pub outputs: Vec<BindingOutput>,
}

/// Documents of a Store with distinct keys, from its `start`-th on, with the view's
/// documents of their keys before them; `done` of them are applied.
struct Run {
    store: Arc<Store>,
    start: usize,
    befores: Vec<Option<String>>,
    done: usize,
}

/// The keys of the run of `store`'s documents that starts at its `start`-th: up to the
/// end, or to a key the run holds already.
fn run_keys(store: &Store, start: usize) -> Result<Vec<Vec<u8>>> {
    let mut seen = HashSet::new();
    let mut keys = Vec::new();
    for doc in store_docs(store).skip(start) {
        let key = doc?.key;
        if !seen.insert(key) {
            break;
        }
        keys.push(key.to_vec());
    }
    Ok(keys)
}

impl Run {
    /// Applies the run's next documents, encoding each change (`encoder`: none in a
    /// snapshot's transaction, whose batch is the view itself), until the run ends or
    /// the buffer holds `max_bytes`. Returns their writes of the view.
    fn apply(
        &mut self,
        binding_key: &str,
        txn: u64,
        mut encoder: Option<&mut dyn Encoder>,
        (buffer, max_bytes): (&mut Buffer, usize),
    ) -> Result<Vec<Write>> {
        let mut writes = Vec::new();
        let docs = store_docs(&self.store).skip(self.start + self.done);
        for doc in docs.take(self.befores.len() - self.done) {
            let doc = doc?;
            let before_text = self.befores[self.done].take();
            self.done += 1;
            let text = doc.json(self.store.binding)?;
            let after_text = (text.trim() != "null").then_some(text);
            if after_text.is_some() && doc.exists != before_text.is_some() {
                return Err(Error::store(
                    format!("output view of {binding_key}"),
                    format!(
                        "a document was stored with exists={} but the view {} its key: the \
                         runtime's view of the store is wrong",
                        doc.exists,
                        if before_text.is_some() {
                            "holds"
                        } else {
                            "lacks"
                        }
                    ),
                    false,
                ));
            }
            writes.push((doc.key.to_vec(), after_text.map(str::to_owned)));
            let Some(encoder) = encoder.as_deref_mut() else {
                continue;
            };
            let before = (before_text.as_deref())
                .map(|t| parse_json(t, "a document of the view"))
                .transpose()?;
            let after = (after_text.map(|t| parse_json(t, "a stored document"))).transpose()?;
            if let Some(op) = Op::between(before.as_ref(), after.as_ref()) {
                let change = Change {
                    txn,
                    op,
                    before: before.as_ref(),
                    after: after.as_ref(),
                };
                buffer.begin_change(doc.key);
                encoder.encode(&change, buffer).map_err(output_error)?;
                if buffer.bytes() >= max_bytes {
                    break;
                }
            }
        }
        Ok(writes)
    }

    fn ended(&self) -> bool {
        self.done == self.befores.len()
    }
}

impl OutputTransactor {
    /// The transaction being stored (from Prepare's runtime checkpoint).
    fn txn(&self) -> Result<u64> {
        let checkpoint = (self.checkpoint.peek())
            .ok_or_else(|| Error::Malformed("Store before Prepare".into()))?;
        epoch_of(checkpoint)
    }

    fn binding(&self, binding: u32) -> Result<usize> {
        let index = binding as usize;
        match index < self.outputs.len() {
            true => Ok(index),
            false => Err(Error::Malformed(format!(
                "binding {binding} is not part of the opened materialization"
            ))),
        }
    }

    /// Sends a snapshot binding's whole view (as this transaction leaves it).
    async fn send_snapshot(&mut self, binding: usize, txn: u64) -> Result<()> {
        let mut after: Option<Vec<u8>> = None;
        loop {
            let output = &mut self.outputs[binding];
            let rows = (self.view)
                .scan(&output.view_key, after.take(), SNAPSHOT_CHUNK)
                .await?;
            let count = rows.len();
            let key = output.view_key.clone();
            let last = output
                .encoding(move |encoder, buffer| {
                    for (packed_key, doc) in &rows {
                        let doc = serde_json::from_str::<Value>(doc).map_err(|e| {
                            output_error(OutputError::Corrupt(format!(
                                "the view of {key} holds non-JSON: {e}"
                            )))
                        })?;
                        let change = Change {
                            txn,
                            op: Op::Read,
                            before: None,
                            after: Some(&doc),
                        };
                        buffer.begin_change(packed_key);
                        encoder.encode(&change, buffer).map_err(output_error)?;
                    }
                    Ok(rows.last().map(|(k, _)| k.clone()))
                })
                .await?;
            output.push_if_full().await?;
            if count < SNAPSHOT_CHUNK {
                return Ok(());
            }
            after = last;
        }
    }
}

#[async_trait]
impl FencedStore for OutputTransactor {
    fn checkpoint(&mut self) -> &mut PreparedCheckpoint {
        &mut self.checkpoint
    }

    async fn load_keys(&mut self, load: Load, loaded: &mut dyn LoadedSink) -> Result<()> {
        let binding = self.binding(load.binding)?;
        let keys: Vec<Vec<u8>> = load_keys(&load)
            .map(|k| k.map(<[u8]>::to_vec))
            .collect::<Result<_>>()?;
        let found = (self.view)
            .get_many(&self.outputs[binding].view_key, keys)
            .await?;
        for doc in found.into_iter().flatten() {
            loaded.push(load.binding, doc.as_bytes());
        }
        Ok(())
    }

    async fn start_writes(&mut self, store: Store) -> Result<()> {
        let txn = self.txn()?;
        let binding = self.binding(store.binding)?;
        let output = &mut self.outputs[binding];
        if !output.in_batch {
            let kind = if output.snapshot {
                BatchKind::Snapshot
            } else {
                BatchKind::Delta
            };
            output.buffer.as_mut().ok_or_else(taken)?.start(txn);
            output.in_batch = true;
            output
                .endpoint
                .batch_start(txn, kind)
                .await
                .map_err(output_error)?;
            crate::fail_point!(crate::AFTER_BATCH_START);
        }
        // The Store's documents in runs, each run's steps filling the buffer at most,
        // each full buffer pushed before the next step is encoded: a slow endpoint
        // slows the loop, and what is buffered stays within max_buffer_size_bytes (and
        // one change's messages).
        let (key, encode, max_bytes) =
            (output.view_key.clone(), !output.snapshot, output.max_bytes);
        self.view.begin().await?;
        let store = Arc::new(store);
        let mut start = 0;
        loop {
            let keys = run_keys(&store, start)?;
            if keys.is_empty() {
                return Ok(());
            }
            let befores = self.view.get_many(&key, keys).await?;
            let mut run = Run {
                store: store.clone(),
                start,
                befores,
                done: 0,
            };
            while !run.ended() {
                let output = &mut self.outputs[binding];
                let step_key = key.clone();
                let (back, writes) = output
                    .encoding(move |encoder, buffer| {
                        let encoder = encode.then_some(encoder);
                        let writes = run.apply(&step_key, txn, encoder, (buffer, max_bytes));
                        Ok((run, writes))
                    })
                    .await?;
                run = back;
                self.view.write(&key, writes?).await?;
                self.outputs[binding].push_if_full().await?;
            }
            start += run.befores.len();
        }
    }

    async fn commit_writes(&mut self) -> Result<()> {
        let txn = self.txn()?;
        let mut snapshots = Vec::new();
        for binding in 0..self.outputs.len() {
            if !self.outputs[binding].in_batch {
                continue;
            }
            if self.outputs[binding].snapshot {
                self.send_snapshot(binding, txn).await?;
                snapshots.push((self.outputs[binding].view_key.clone(), txn));
            }
            let output = &mut self.outputs[binding];
            output.push().await?;
            crate::fail_point!(crate::BEFORE_BATCH_END);
            output.endpoint.batch_end().await.map_err(output_error)?;
            output.in_batch = false;
        }
        crate::fail_point!(crate::BEFORE_VIEW_COMMIT);
        let checkpoint = self.checkpoint.take()?;
        let range = (self.claim.key_begin, self.claim.key_end, self.claim.fence);
        let now = (self.view)
            .commit(range, checkpoint, snapshots.clone())
            .await?;
        if now != Some(self.claim.fence) {
            return Err(self.claim.range_fence().fenced(None));
        }
        for output in &mut self.outputs {
            if snapshots.iter().any(|(k, _)| *k == output.view_key) {
                output.snapshot = false;
            }
        }
        Ok(())
    }

    fn claim(&self) -> &Claim {
        &self.claim
    }

    async fn rollback(&mut self) {
        self.view.rollback().await;
        for output in &mut self.outputs {
            if output.in_batch {
                output.endpoint.abort().await;
                output.in_batch = false;
            }
        }
    }

    async fn current_fence(&mut self) -> Result<Option<i64>> {
        let (begin, end) = (self.claim.key_begin, self.claim.key_end);
        self.view.fence(begin, end).await
    }

    async fn release(self: Box<Self>) {
        for output in self.outputs {
            output.endpoint.close().await;
        }
    }

    /// The bytes its encode buffers hold (none right after a commit, which pushes them
    /// all), and the messages it published.
    fn report(&self) -> Report {
        let buffered = (self.outputs.iter())
            .filter_map(|o| o.buffer.as_ref())
            .map(|b| b.bytes() as u64)
            .sum();
        let published = self.outputs.iter().map(|o| o.published).sum();
        Report {
            memory: buffered,
            metrics: vec![Metric::counter(
                "messages_published",
                "Messages this stream of the output pushed to its destinations (those of \
                 batches later aborted included).",
                published,
            )],
            health: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_conformance::messages;

    #[test]
    fn a_run_ends_before_a_key_it_holds_already() {
        let docs = [
            (&b"a"[..], "{}", false),
            (&b"b"[..], "{}", false),
            (&b"a"[..], "{}", true),
            (&b"c"[..], "{}", false),
        ];
        let store = messages::store(0, &docs);
        assert_eq!(run_keys(&store, 0).unwrap(), [b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(run_keys(&store, 2).unwrap(), [b"a".to_vec(), b"c".to_vec()]);
        assert!(run_keys(&store, 4).unwrap().is_empty());
    }
}
