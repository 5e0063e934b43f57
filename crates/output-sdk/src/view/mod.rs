//! The view: the authoritative store of an output materialization. It holds each
//! binding's view (each key's last document, which gives a change its `before`), the
//! runtime checkpoint, the key range's fence and the view's generation, in one of two
//! stores behind the one interface the driver calls ([`View`]):
//!
//! ```text
//!  endpoint config        store                              who can open it
//!  (no `view`)            LocalView: <state_dir>/view.db     the machine holding the
//!                         (SQLite, sqlite.rs)                recovery log
//!  view: {url, schema}    SharedView: four sluice_output_*   every member of a cluster:
//!                         tables (PostgreSQL, postgres.rs)   the output can move
//! ```
//!
//! Both keep the same promises: a transaction's writes (documents, checkpoint,
//! snapshots sent) commit together or not at all, and only while the range's fence is
//! the one the instance claimed at open (a newer claim refuses an older instance's
//! commit, which rolls back and reports the current fence); the generation is minted
//! once, with the view; a reset removes the materialization's whole view, so the next
//! open mints a new generation.
//!
//! Threads: the local view is a synchronous SQLite connection, called on the blocking
//! pool (one call at a time, under its mutex); the shared view is one tokio-postgres
//! connection, called on the async worker.

mod postgres;
mod sqlite;

use crate::generation::Generation;
use crate::{OutputError, output_error};
use postgres::SharedView;
use sluice_driver_sdk::{Error, Result};
use sluice_pg_client::EndpointConfig;
use sqlite::LocalView;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// One key's new document in a binding's view (`None`: the key is removed).
pub type Write = (Vec<u8>, Option<String>);

/// Where an output materialization keeps its view.
#[derive(Debug, Clone)]
pub enum Place {
    /// `view.db` in the materialization's state folder, beside the recovery log.
    Local(PathBuf),
    /// Tables in a PostgreSQL schema (the endpoint's `view`), shared by the
    /// materializations whose views it holds, each its own rows.
    Shared(EndpointConfig),
}

impl Place {
    /// The view of materialization `materialization`, for messages (no password).
    pub fn describe(&self, materialization: &str) -> String {
        match self {
            Place::Local(dir) => format!("the output view {}", dir.join(sqlite::FILE).display()),
            Place::Shared(config) => postgres::describe(config, materialization),
        }
    }
}

/// Removes materialization `materialization`'s view whole (a reset: `sluice apply
/// --delete`): documents, checkpoint and fence, snapshots sent and generation, in one
/// step. Returns what it removed (`None`: there was no view), once that is durable.
pub async fn remove(place: &Place, materialization: &str) -> Result<Option<String>> {
    match place {
        Place::Local(dir) => {
            let dir = dir.clone();
            let ended = blocking(move || sqlite::remove(&dir)).await?;
            Ok(ended.map(|generation| format!("generation {generation} ended")))
        }
        Place::Shared(config) => postgres::remove(config, materialization).await,
    }
}

/// An open view: one instance's connection to its materialization's store.
pub(crate) enum View {
    Local(Arc<Mutex<LocalView>>),
    Shared(Box<SharedView>),
}

/// Runs blocking work on the blocking pool.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, OutputError> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::store("output view", format!("its task failed: {e}"), false))?
        .map_err(output_error)
}

impl View {
    /// Opens (creating what is missing) the view at `place`; a view created now gets a
    /// new generation.
    pub async fn open(place: &Place, materialization: &str) -> Result<View> {
        match place {
            Place::Local(dir) => {
                let dir = dir.clone();
                let view = blocking(move || LocalView::open(&dir)).await?;
                Ok(View::Local(Arc::new(Mutex::new(view))))
            }
            Place::Shared(config) => Ok(View::Shared(Box::new(
                SharedView::open(config, materialization).await?,
            ))),
        }
    }

    /// Runs `work` on the local view, on the blocking pool.
    async fn local<T: Send + 'static>(
        view: &Arc<Mutex<LocalView>>,
        work: impl FnOnce(&mut LocalView) -> Result<T, OutputError> + Send + 'static,
    ) -> Result<T> {
        let view = view.clone();
        blocking(move || work(&mut view.lock().expect("not poisoned"))).await
    }

    /// The generation of what is written from this view.
    pub fn generation(&self) -> Generation {
        match self {
            View::Local(view) => view.lock().expect("not poisoned").generation(),
            View::Shared(view) => view.generation(),
        }
    }

    /// Claims the key range: raises its fence and returns the new fence and the
    /// checkpoint committed last (empty if none). After it returns, an earlier holder
    /// of the range can no longer commit.
    pub async fn claim(&mut self, key_begin: u32, key_end: u32) -> Result<(i64, Vec<u8>)> {
        match self {
            View::Local(view) => Self::local(view, move |v| v.claim(key_begin, key_end)).await,
            View::Shared(view) => view.claim(key_begin, key_end).await,
        }
    }

    /// The range's fence as committed now (`None`: no such range in this generation).
    pub async fn fence(&mut self, key_begin: u32, key_end: u32) -> Result<Option<i64>> {
        match self {
            View::Local(view) => Self::local(view, move |v| v.fence(key_begin, key_end)).await,
            View::Shared(view) => view.fence(key_begin, key_end).await,
        }
    }

    /// Starts the transaction's writes, if not started: what follows is read and
    /// written inside it until [`View::commit`] or [`View::rollback`].
    pub async fn begin(&mut self) -> Result<()> {
        match self {
            View::Local(view) => Self::local(view, LocalView::begin).await,
            View::Shared(view) => view.begin().await,
        }
    }

    /// The documents of `keys` in `binding`'s view (`None`: absent), in their order,
    /// read in one go.
    pub async fn get_many(
        &mut self,
        binding: &str,
        keys: Vec<Vec<u8>>,
    ) -> Result<Vec<Option<String>>> {
        match self {
            View::Local(view) => {
                let binding = binding.to_owned();
                Self::local(view, move |v| v.get_many(&binding, &keys)).await
            }
            View::Shared(view) => view.get_many(binding, &keys).await,
        }
    }

    /// Writes new documents and removals of `binding`'s view, each key at most once,
    /// in the open transaction (begun if not).
    pub async fn write(&mut self, binding: &str, writes: Vec<Write>) -> Result<()> {
        if writes.is_empty() {
            return Ok(());
        }
        match self {
            View::Local(view) => {
                let binding = binding.to_owned();
                Self::local(view, move |v| v.write(&binding, &writes)).await
            }
            View::Shared(view) => view.write(binding, &writes).await,
        }
    }

    /// Up to `limit` documents of `binding`'s view after `after`, in key order (bytes).
    pub async fn scan(
        &mut self,
        binding: &str,
        after: Option<Vec<u8>>,
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, String)>> {
        match self {
            View::Local(view) => {
                let binding = binding.to_owned();
                Self::local(view, move |v| v.scan(&binding, after.as_deref(), limit)).await
            }
            View::Shared(view) => view.scan(binding, after.as_deref(), limit).await,
        }
    }

    /// Whether `binding`'s snapshot batch was sent.
    pub async fn snapshot_sent(&mut self, binding: &str) -> Result<bool> {
        match self {
            View::Local(view) => {
                let binding = binding.to_owned();
                Self::local(view, move |v| v.snapshot_sent(&binding)).await
            }
            View::Shared(view) => view.snapshot_sent(binding).await,
        }
    }

    /// Whether `binding`'s view holds no document.
    pub async fn is_empty(&mut self, binding: &str) -> Result<bool> {
        Ok(self.scan(binding, None, 1).await?.is_empty())
    }

    /// Copies `from`'s view into `binding`'s (empty) view, committed at once; returns
    /// how many documents it copied.
    pub async fn seed(&mut self, binding: &str, from: &str) -> Result<u64> {
        match self {
            View::Local(view) => {
                let (binding, from) = (binding.to_owned(), from.to_owned());
                Self::local(view, move |v| v.seed(&binding, &from).map(|n| n as u64)).await
            }
            View::Shared(view) => view.seed(binding, from).await,
        }
    }

    /// Commits the transaction with `checkpoint` and the snapshots it sent
    /// (`(binding, txn)`), if the range's fence is still `fence`; otherwise rolls back.
    /// Returns the range's fence as it found it: `Some(fence)` when it committed.
    pub async fn commit(
        &mut self,
        (key_begin, key_end, fence): (u32, u32, i64),
        checkpoint: Vec<u8>,
        snapshots: Vec<(String, u64)>,
    ) -> Result<Option<i64>> {
        match self {
            View::Local(view) => {
                Self::local(view, move |v| {
                    v.commit(key_begin, key_end, fence, &checkpoint, &snapshots)
                })
                .await
            }
            View::Shared(view) => {
                (view.commit((key_begin, key_end, fence), &checkpoint, &snapshots)).await
            }
        }
    }

    /// Rolls the transaction back, if one is open. A failure is logged: the
    /// transaction is abandoned either way.
    pub async fn rollback(&mut self) {
        let rolled = match self {
            View::Local(view) => {
                Self::local(view, |v| {
                    v.rollback();
                    Ok(())
                })
                .await
            }
            View::Shared(view) => view.rollback().await,
        };
        if let Err(err) = rolled {
            tracing::warn!(%err, "rolling back the output view's transaction");
        }
    }
}

/// Where a materialization's view is: its endpoint's `view`, else its state folder.
pub fn place(view: Option<&EndpointConfig>, state_dir: &Path) -> Place {
    match view {
        Some(config) => Place::Shared(config.clone()),
        None => Place::Local(state_dir.to_path_buf()),
    }
}

#[cfg(test)]
mod tests;
