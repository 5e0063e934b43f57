//! One instance's Transactions stream: a [`FencedStore`], so the SDK's blanket impl
//! makes it a [`sluice_driver_sdk::Transactor`] of
//! [`sluice_driver_sdk::CommitPattern::RemoteAuthoritative`].
//!
//! ```text
//!  load_keys ─▶ read committed rows      start_writes ─▶ pending (checked JSON)
//!  commit_writes ─▶ one Backend::update: fence check, every store check, then rows +
//!                   the prepared checkpoint, all or nothing
//! ```
//!
//! What holds:
//! - **Fenced.** A commit writes only if the range's fence is still the one this
//!   instance's [`Claim`] holds; otherwise it fails with
//!   [`sluice_driver_sdk::Error::Fenced`], whatever it stored. A failure for another
//!   reason is explained by the range's current fence ([`FencedStore::fence_checked`]):
//!   a fenced-off instance always reports `Fenced`.
//! - **Atomic and strict.** Every check runs before anything is written. As a SQL
//!   table's would, a document stored with `exists = false` whose key is present, or
//!   with `exists = true` whose key is absent, or twice in one transaction, fails the
//!   commit (the runtime's view of the store is wrong). A `null` document deletes its
//!   row; a delta-updates binding appends every document to its table's log.
//! - **Read committed.** Loads read committed rows only; stores stay pending in the
//!   transactor until the commit, and a failed transaction drops them.

use crate::client::{Backend, MaterializationState, hex};
use async_trait::async_trait;
use sluice_driver_sdk::arena::{load_keys, store_docs};
use sluice_driver_sdk::fence::{Claim, FencedStore, PreparedCheckpoint};
use sluice_driver_sdk::materialize::transaction_request::{Load, Store};
use sluice_driver_sdk::{Error, LoadedSink, Result};
use std::collections::BTreeSet;

/// One document stored in the current transaction, applied at commit.
struct PendingStore {
    binding: usize,
    key: String,
    /// Document JSON; `null` deletes the row of a standard-updates binding.
    doc: String,
    exists: bool,
}

pub struct MemoryTransactor {
    backend: Backend,
    claim: Claim,
    /// Per binding: its table and whether it is delta-updates.
    bindings: Vec<(String, bool)>,
    checkpoint: PreparedCheckpoint,
    pending: Vec<PendingStore>,
}

impl MemoryTransactor {
    pub fn new(backend: Backend, claim: Claim, bindings: Vec<(String, bool)>) -> Self {
        MemoryTransactor {
            backend,
            claim,
            bindings,
            checkpoint: PreparedCheckpoint::default(),
            pending: Vec::new(),
        }
    }

    fn table(&self, binding: usize) -> Result<&(String, bool)> {
        self.bindings.get(binding).ok_or_else(|| {
            Error::Config(format!(
                "binding {binding} is not part of the opened materialization"
            ))
        })
    }

    /// Every check of the commit, before anything is written.
    fn check(&self, mat: &MaterializationState, pending: &[PendingStore]) -> Result<()> {
        let fence = self.claim.range_fence();
        if mat.fence(self.claim.key_begin, self.claim.key_end) != Some(fence.claimed) {
            return Err(fence.fenced(None));
        }
        let mut seen = BTreeSet::new();
        for p in pending {
            let (table, delta) = self.table(p.binding)?;
            if *delta {
                continue;
            }
            if !seen.insert((p.binding, p.key.as_str())) {
                return Err(self.rejected(p, table, "stored twice in one transaction"));
            }
            let present = (mat.tables.get(table)).is_some_and(|t| t.rows.contains_key(&p.key));
            match (p.exists, present) {
                (false, true) => {
                    return Err(self.rejected(
                        p,
                        table,
                        "stored with exists=false but the row exists",
                    ));
                }
                (true, false) => {
                    return Err(self.rejected(
                        p,
                        table,
                        "stored with exists=true but the row is absent",
                    ));
                }
                _ => {}
            }
        }
        Ok(())
    }

    fn rejected(&self, p: &PendingStore, table: &str, why: &str) -> Error {
        Error::store(
            format!(
                "memory driver: commit to table {table} of {}",
                self.claim.materialization
            ),
            format!("key {} {why}", p.key),
            false,
        )
    }
}

#[async_trait]
impl FencedStore for MemoryTransactor {
    fn checkpoint(&mut self) -> &mut PreparedCheckpoint {
        &mut self.checkpoint
    }

    async fn load_keys(&mut self, load: Load, loaded: &mut dyn LoadedSink) -> Result<()> {
        let (table, _) = self.table(load.binding as usize)?;
        let keys = load_keys(&load)
            .map(|k| k.map(hex))
            .collect::<Result<Vec<_>>>()?;
        let found = self
            .backend
            .read(|state| {
                let rows = (state.materializations.get(&self.claim.materialization))
                    .and_then(|m| m.tables.get(table));
                let found: Vec<String> = keys
                    .iter()
                    .filter_map(|k| rows?.rows.get(k).cloned())
                    .collect();
                found
            })
            .await?;
        for doc in found {
            loaded.push(load.binding, doc.as_bytes());
        }
        Ok(())
    }

    async fn start_writes(&mut self, store: Store) -> Result<()> {
        self.table(store.binding as usize)?;
        for doc in store_docs(&store) {
            let doc = doc?;
            let text = doc.json(store.binding)?;
            self.pending.push(PendingStore {
                binding: store.binding as usize,
                key: hex(doc.key),
                doc: text.to_string(),
                exists: doc.exists,
            });
        }
        Ok(())
    }

    async fn commit_writes(&mut self) -> Result<()> {
        let pending = std::mem::take(&mut self.pending);
        let checkpoint = self.checkpoint.take()?;
        let this = &*self;
        this.backend
            .update(|state| {
                let mat = (state.materializations)
                    .entry(this.claim.materialization.clone())
                    .or_default();
                this.check(mat, &pending)?;
                // Nothing below fails: the transaction is applied whole.
                for p in pending {
                    let (table, delta) = &this.bindings[p.binding];
                    let table = mat.tables.entry(table.clone()).or_default();
                    if *delta {
                        table.log.push((p.key, p.doc));
                    } else if p.doc.trim() == "null" {
                        table.rows.remove(&p.key);
                    } else {
                        table.rows.insert(p.key, p.doc);
                    }
                }
                mat.set_checkpoint(this.claim.key_begin, this.claim.key_end, checkpoint);
                Ok(())
            })
            .await
    }

    fn claim(&self) -> &Claim {
        &self.claim
    }

    /// Drops the pending stores: nothing was written (the state changes only in a
    /// whole, successful commit).
    async fn rollback(&mut self) {
        self.pending.clear();
    }

    async fn current_fence(&mut self) -> Result<Option<i64>> {
        let (materialization, begin, end) = (
            &self.claim.materialization,
            self.claim.key_begin,
            self.claim.key_end,
        );
        self.backend
            .read(|state| {
                (state.materializations.get(materialization)).and_then(|m| m.fence(begin, end))
            })
            .await
    }

    /// Nothing to release: the state outlives the instance.
    async fn release(self: Box<Self>) {}
}
