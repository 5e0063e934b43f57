//! [`FencedStore`]: the transaction protocol of a remote authoritative SQL store, once.
//!
//! Such a store commits the runtime checkpoint with the data in one store transaction,
//! guarded by its [`super::RangeFence`]. Every [`Transactor`] call but loading and
//! writing is then the same: Prepare remembers the checkpoint (and returns no driver
//! checkpoint of its own), Store and Commit start or finish the writes and, on failure,
//! roll back and tell whether the instance was fenced off, and Acknowledge has nothing
//! to do. A connector implements [`FencedStore`]; the blanket impl makes it a
//! [`Transactor`] with [`CommitPattern::RemoteAuthoritative`].

use super::PreparedCheckpoint;
use crate::{CommitPattern, LoadedSink, PriorState, Result, Transactor};
use async_trait::async_trait;
use sluice_proto::flow;
use sluice_proto::materialize::transaction_request::{Load, Prepare, Store};

/// What a remote authoritative SQL store does itself (see the module docs).
#[async_trait]
pub trait FencedStore: Send + 'static {
    /// The runtime checkpoint between Prepare and Commit.
    fn checkpoint(&mut self) -> &mut PreparedCheckpoint;

    /// [`Transactor::load`].
    async fn load_keys(&mut self, load: Load, loaded: &mut dyn LoadedSink) -> Result<()>;

    /// [`Transactor::flush_loads`].
    async fn flush_loaded(&mut self, _loaded: &mut dyn LoadedSink) -> Result<()> {
        Ok(())
    }

    /// Encodes a Store message and starts its writes.
    async fn start_writes(&mut self, store: Store) -> Result<()>;

    /// Finishes the writes and commits them with the prepared checkpoint, if the fence
    /// still holds.
    async fn commit_writes(&mut self) -> Result<()>;

    /// `result`, or, if it failed, the failure explained by the range's current fence
    /// (after rolling back the store transaction).
    async fn fence_checked(&mut self, result: Result<()>) -> Result<()>;

    /// [`Transactor::destroy`].
    async fn release(self: Box<Self>);
}

#[async_trait]
impl<T: FencedStore> Transactor for T {
    fn pattern(&self) -> CommitPattern {
        CommitPattern::RemoteAuthoritative
    }

    async fn load(
        &mut self,
        load: Load,
        _prior: PriorState,
        loaded: &mut dyn LoadedSink,
    ) -> Result<()> {
        self.load_keys(load, loaded).await
    }

    async fn flush_loads(&mut self, loaded: &mut dyn LoadedSink) -> Result<()> {
        self.flush_loaded(loaded).await
    }

    async fn prepare(&mut self, prepare: Prepare) -> Result<flow::DriverCheckpoint> {
        Ok(self.checkpoint().prepare(prepare))
    }

    async fn store(&mut self, store: Store) -> Result<()> {
        let started = self.start_writes(store).await;
        self.fence_checked(started).await
    }

    async fn commit(&mut self) -> Result<()> {
        let committed = self.commit_writes().await;
        self.fence_checked(committed).await
    }

    /// Nothing to do: the commit itself was authoritative and durable.
    async fn acknowledge(&mut self) -> Result<()> {
        Ok(())
    }

    async fn destroy(self: Box<Self>) {
        self.release().await
    }
}
