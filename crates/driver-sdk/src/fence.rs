//! Fencing of an authoritative store, whatever it is: an instance's [`Claim`] on its key
//! range, the [`PreparedCheckpoint`] between Prepare and Commit, and [`FencedStore`], the
//! transaction protocol of a store whose commit is guarded by a [`RangeFence`], once.
//!
//! Such a store commits the runtime checkpoint with the data in one store transaction,
//! guarded by the fence its instance claimed at open. Every [`Transactor`] call but
//! loading and writing is then the same: Prepare remembers the checkpoint (and returns
//! no driver checkpoint of its own), Store and Commit start or finish the writes and, on
//! failure, roll back and tell whether the instance was fenced off (the store supplies
//! only `rollback` and `current_fence`), and Acknowledge has nothing to do. A connector implements [`FencedStore`]; the blanket impl makes it a
//! [`Transactor`] with [`CommitPattern::RemoteAuthoritative`].
//!
//! A failed store or commit of a fenced-off instance reports [`Error::Fenced`] even when
//! the store failed for another reason first (a zombie that believed absent a key the
//! newer instance stored fails with the store's duplicate-key error):
//! [`RangeFence::explain`] tells the truth.

use crate::materialize::transaction_request::{Load, Prepare, Store};
use crate::{Error, LoadedSink, PriorState, Result, Transactor, flow};
use async_trait::async_trait;

/// The runtime checkpoint of the transaction in progress: set by Prepare (or replaced by
/// the one Commit carried, for a runtime of the current protocol), taken by
/// Commit, which writes it in the same store transaction as the data.
#[derive(Debug, Default)]
pub struct PreparedCheckpoint(Option<Vec<u8>>);

impl PreparedCheckpoint {
    /// Remembers the runtime checkpoint of `prepare`. Returns the driver checkpoint of
    /// an authoritative store: nothing of its own (`{}` as a merge patch), since the
    /// store itself holds what it needs to resume.
    pub fn prepare(&mut self, prepare: Prepare) -> flow::DriverCheckpoint {
        self.0 = Some(prepare.flow_checkpoint);
        flow::DriverCheckpoint {
            driver_checkpoint_json: b"{}".to_vec(),
            rfc7396_merge_patch: true,
        }
    }

    /// Replaces the prepared checkpoint with the one Commit carried
    /// ([`Transactor::commit_checkpoint`]): what the following Commit writes.
    pub fn replace(&mut self, checkpoint: Vec<u8>) {
        self.0 = Some(checkpoint);
    }

    /// The prepared checkpoint, if a Prepare has set it (what transaction a Store is of).
    pub fn peek(&self) -> Option<&[u8]> {
        self.0.as_deref()
    }

    /// The prepared checkpoint, for Commit; an error if no Prepare preceded it.
    pub fn take(&mut self) -> Result<Vec<u8>> {
        self.0.take().ok_or_else(|| {
            Error::store(
                "committing",
                "Commit arrived without a prepared checkpoint",
                false,
            )
        })
    }
}

/// The check of Open's version, once for every store that records the version Apply
/// applied: refuses an Open of another version of the materialization's spec, so no
/// instance writes under a spec its store was not applied with. `applied` is `None`
/// when Apply recorded no version (a store applied before versions were recorded):
/// accepted, since there is nothing to compare.
pub fn check_version(materialization: &str, applied: Option<&str>, opened: &str) -> Result<()> {
    match applied {
        Some(applied) if applied != opened => Err(Error::Config(format!(
            "materialization {materialization:?} was applied at version {applied}, but Open \
             is for version {opened}: apply the spec being run first (`sluice apply`)"
        ))),
        _ => Ok(()),
    }
}

/// One instance's claim on its key range, owned: the fence it must still hold to commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub materialization: String,
    pub key_begin: u32,
    pub key_end: u32,
    pub fence: i64,
}

impl Claim {
    pub fn new(materialization: &str, key_begin: u32, key_end: u32, fence: i64) -> Claim {
        Claim {
            materialization: materialization.to_owned(),
            key_begin,
            key_end,
            fence,
        }
    }

    pub fn range_fence(&self) -> RangeFence<'_> {
        RangeFence {
            materialization: &self.materialization,
            key_begin: self.key_begin,
            key_end: self.key_end,
            claimed: self.fence,
        }
    }
}

/// An instance's claim on its key range of a materialization: the fence it read when
/// it opened, which its commit must still find in the range's checkpoints row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeFence<'a> {
    pub materialization: &'a str,
    pub key_begin: u32,
    pub key_end: u32,
    /// The fence claimed at open.
    pub claimed: i64,
}

impl RangeFence<'_> {
    /// The error of this instance once a newer one has opened its range; `cause` is
    /// the store's error that revealed it, if any.
    pub fn fenced(&self, cause: Option<&Error>) -> Error {
        let cause = cause
            .map(|err| format!(" (it failed with: {err})"))
            .unwrap_or_default();
        Error::Fenced(format!(
            "key range [{:08x}, {:08x}] of {:?} was opened by a newer instance \
             (this instance holds stale fence {}); its transaction was rolled back{cause}",
            self.key_begin, self.key_end, self.materialization, self.claimed
        ))
    }

    /// What a store or commit that failed with `err` really is, given the range's
    /// fence read afresh after the failure (`current`; `None` if its row is gone):
    /// [`Error::Fenced`], naming `err`, if the fence moved since this instance claimed
    /// it, else `err` itself. A failed read proves nothing, so it leaves `err` as is.
    pub fn explain(&self, err: Error, current: Result<Option<i64>>) -> Error {
        match current {
            Ok(now) if now != Some(self.claimed) && !matches!(err, Error::Fenced(_)) => {
                self.fenced(Some(&err))
            }
            Ok(_) => err,
            Err(read) => {
                tracing::debug!(%read, "reading the fence of a failed transaction");
                err
            }
        }
    }
}

/// What an authoritative fenced store does itself (see the module docs); the fence
/// check of a failed store or commit is [`FencedStore::fence_checked`], written once
/// over [`FencedStore::rollback`] and [`FencedStore::current_fence`].
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

    /// The claim this instance opened with.
    fn claim(&self) -> &Claim;

    /// Rolls back the store transaction in progress, if any (after the writes in
    /// flight, if any, have ended). A failure to roll back is the store's to log: the
    /// transaction is abandoned either way.
    async fn rollback(&mut self);

    /// The claimed range's fence as committed now (`None` if its row is gone), read
    /// outside any transaction.
    async fn current_fence(&mut self) -> Result<Option<i64>>;

    /// `result`, unless it failed: then the store transaction is rolled back, and the
    /// error is [`Error::Fenced`] if a newer instance has opened this range since
    /// ([`RangeFence::explain`]).
    async fn fence_checked(&mut self, result: Result<()>) -> Result<()> {
        let Err(err) = result else { return Ok(()) };
        self.rollback().await;
        let current = self.current_fence().await;
        Err(self.claim().range_fence().explain(err, current))
    }

    /// [`Transactor::destroy`].
    async fn release(self: Box<Self>);

    /// [`Transactor::report`]: by default nothing.
    fn report(&self) -> crate::Report {
        crate::Report::default()
    }
}

#[async_trait]
impl<T: FencedStore> Transactor for T {
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

    fn commit_checkpoint(&mut self, checkpoint: Vec<u8>) {
        self.checkpoint().replace(checkpoint);
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

    fn report(&self) -> crate::Report {
        FencedStore::report(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_open_of_another_version_than_applied_is_refused_naming_both() {
        for (applied, opened, ok) in [
            (None, "v2", true),
            (Some("v2"), "v2", true),
            (Some("v1"), "v2", false),
        ] {
            match check_version("m", applied, opened) {
                Ok(()) => assert!(ok, "{applied:?} {opened}"),
                Err(err) => {
                    assert!(!ok, "{applied:?} {opened}: {err}");
                    let text = err.to_string();
                    assert!(text.contains("applied at version v1, but Open is for version v2"));
                    assert!(text.contains("sluice apply"), "{text}");
                }
            }
        }
    }

    #[test]
    fn commit_takes_the_prepared_checkpoint_once() {
        let mut prepared = PreparedCheckpoint::default();
        let driver = prepared.prepare(Prepare {
            flow_checkpoint: b"cp1".to_vec(),
        });
        assert_eq!(driver.driver_checkpoint_json, b"{}");
        assert!(driver.rfc7396_merge_patch);
        assert_eq!(prepared.take().unwrap(), b"cp1");
        let err = prepared.take().unwrap_err();
        assert!(
            err.to_string().contains("without a prepared checkpoint"),
            "{err}"
        );
    }

    /// A runtime of the current protocol gives the checkpoint at Commit, Prepare none.
    #[test]
    fn commit_writes_the_checkpoint_commit_carried_in_place_of_prepares() {
        let mut store = Scripted {
            claim: Claim::new("m", 0, u32::MAX, 3),
            now: Ok(Some(3)),
            rolled_back: false,
            checkpoint: PreparedCheckpoint::default(),
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime
            .block_on(Transactor::prepare(&mut store, Prepare::default()))
            .unwrap();
        Transactor::commit_checkpoint(&mut store, b"cp2".to_vec());
        assert_eq!(store.checkpoint.take().unwrap(), b"cp2");
        let err = store.checkpoint.take().unwrap_err();
        assert!(
            err.to_string().contains("without a prepared checkpoint"),
            "{err}"
        );
    }

    #[test]
    fn a_failure_is_fenced_only_if_the_fence_moved() {
        let range = RangeFence {
            materialization: "m",
            key_begin: 0,
            key_end: u32::MAX,
            claimed: 3,
        };
        let duplicate = || Error::store("storing", "duplicate key", false);
        let err = range.explain(duplicate(), Ok(Some(4)));
        assert!(matches!(err, Error::Fenced(_)), "{err}");
        assert!(err.to_string().contains("stale fence 3"), "{err}");
        assert!(err.to_string().contains("duplicate key"), "{err}");
        let err = range.explain(duplicate(), Ok(None));
        assert!(matches!(err, Error::Fenced(_)), "{err}");
        let err = range.explain(duplicate(), Ok(Some(3)));
        assert!(matches!(err, Error::Store { .. }), "{err}");
        let err = range.explain(duplicate(), Err(Error::Transport("lost".into())));
        assert!(matches!(err, Error::Store { .. }), "{err}");
        let fenced = range.explain(range.fenced(None), Ok(Some(4)));
        assert_eq!(fenced.to_string(), range.fenced(None).to_string());
    }

    /// A store whose rollback and fence read are recorded and scripted.
    struct Scripted {
        claim: Claim,
        now: Result<Option<i64>>,
        rolled_back: bool,
        checkpoint: PreparedCheckpoint,
    }

    #[async_trait]
    impl FencedStore for Scripted {
        fn checkpoint(&mut self) -> &mut PreparedCheckpoint {
            &mut self.checkpoint
        }
        async fn load_keys(&mut self, _: Load, _: &mut dyn LoadedSink) -> Result<()> {
            Ok(())
        }
        async fn start_writes(&mut self, _: Store) -> Result<()> {
            Ok(())
        }
        async fn commit_writes(&mut self) -> Result<()> {
            Ok(())
        }
        fn claim(&self) -> &Claim {
            &self.claim
        }
        async fn rollback(&mut self) {
            self.rolled_back = true;
        }
        async fn current_fence(&mut self) -> Result<Option<i64>> {
            std::mem::replace(&mut self.now, Ok(None))
        }
        async fn release(self: Box<Self>) {}
    }

    #[test]
    fn a_failed_store_is_rolled_back_and_explained_by_the_fence_now() {
        let duplicate = || Err(Error::store("storing", "duplicate key", false));
        // (case, what the store or commit returned, the fence read after it, whether
        // the outcome is an error and then whether it is Fenced)
        type Case = (&'static str, Result<()>, Result<Option<i64>>, Option<bool>);
        let cases: [Case; 4] = [
            ("success", Ok(()), Ok(Some(9)), None),
            ("failure, fence held", duplicate(), Ok(Some(3)), Some(false)),
            ("failure, fence moved", duplicate(), Ok(Some(4)), Some(true)),
            ("failure, row gone", duplicate(), Ok(None), Some(true)),
        ];
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        for (case, result, now, fenced) in cases {
            let mut store = Scripted {
                claim: Claim::new("m", 0, u32::MAX, 3),
                now,
                rolled_back: false,
                checkpoint: PreparedCheckpoint::default(),
            };
            let checked = runtime.block_on(store.fence_checked(result));
            assert_eq!(store.rolled_back, fenced.is_some(), "{case}");
            match (checked, fenced) {
                (Ok(()), None) => {}
                (Err(Error::Fenced(message)), Some(true)) => {
                    assert!(message.contains("duplicate key"), "{case}: {message}")
                }
                (Err(Error::Store { .. }), Some(false)) => {}
                (other, _) => panic!("{case}: {other:?}"),
            }
        }
    }
}
