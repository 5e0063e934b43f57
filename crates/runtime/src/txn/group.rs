//! A group: the key-range shards of one materialization that share one reader.
//!
//! ```text
//!  sources ─▶ reader (one read; each document routed by its key hash) ─▶ part of shard 0 ─▶ committer 0 ─▶ log 0
//!                                                                    └▶ part of shard 1 ─▶ committer 1 ─▶ log 1
//! ```
//!
//! Every batch the reader closes is one transaction of every shard, with the same steps
//! and the same number: each shard commits its part as its own transaction, through its
//! own stream, fence range and recovery log, exactly as a shard with a reader of its own.
//!
//! One rule keeps the shards recoverable together: a shard sends the driver its Commit of
//! transaction T only once every shard's intent of T is durable ([`IntentBarrier`]; it
//! waits before any of T's requests, so it never waits holding a store's lock). So
//! after a crash the shards are at most one transaction apart, and each one behind holds
//! T's intent: the reader starts from the checkpoint of the shards behind, replays T for
//! them, and the shards that committed T already are not sent it ([`plan_group`]).
//! The reader tells its sources a transaction is durable once every shard's log commit
//! of it is ([`Durables`]).

use crate::recovery::{Checkpoint, Intent};
use crate::types::RunError;
use sluice_source_sdk::Resume;
use tokio::sync::watch;

/// Where a group starts, from what each of its shards recovered.
#[derive(Debug, PartialEq)]
pub(super) struct GroupStart {
    /// The checkpoint every source is positioned at: the shards' furthest behind.
    pub from: Checkpoint,
    /// The interrupted transaction the reader replays first, exactly.
    pub replay: Option<Intent>,
    /// Per shard: it committed the replayed transaction already, so is not sent it.
    pub skips_replay: Vec<bool>,
}

/// The shards of a group recovered checkpoints one reader cannot resume together.
#[derive(Debug, PartialEq, thiserror::Error)]
#[error(
    "the shards of this materialization recovered checkpoints that one reader cannot \
     resume together ({shards}): {why}. The store was restored from a backup taken \
     while its shards were committing, or their logs come from different histories; \
     restore a backup taken while the pipeline was stopped, or start over with \
     `sluice apply --delete`"
)]
pub(super) struct Diverged {
    /// Each shard's transaction, by its range.
    shards: String,
    why: &'static str,
}

/// Decides where a group starts from each shard's recovered checkpoint and the
/// interrupted transaction it would replay (`recovered`, in shard order; `names` their
/// ranges, for the error). Pure.
///
/// - All at one transaction, at the same positions: start there, replaying the
///   interrupted transaction if any shard has one (all that have one have the same: one
///   reader wrote it); a shard without it takes the replay as its next transaction,
///   which it is.
/// - One transaction apart: every shard behind holds the intent of the next one (the
///   barrier's rule), fully replayable, ending where the shards ahead are. Start behind,
///   replay it, and skip it for the shards ahead.
/// - Anything else cannot be resumed by one reader: [`Diverged`].
pub(super) fn plan_group(
    recovered: &[(&Checkpoint, Option<&Intent>)],
    names: &[String],
) -> Result<GroupStart, Diverged> {
    let diverged = |why| Diverged {
        shards: recovered
            .iter()
            .zip(names)
            .map(|((cp, _), name)| format!("shard {name} at transaction {}", cp.txn))
            .collect::<Vec<_>>()
            .join(", "),
        why,
    };
    let lo = recovered.iter().map(|(cp, _)| cp.txn).min().unwrap_or(0);
    let hi = recovered.iter().map(|(cp, _)| cp.txn).max().unwrap_or(0);
    let behind: Vec<_> = recovered.iter().filter(|(cp, _)| cp.txn == lo).collect();
    let (from, _) = behind[0];
    if behind.iter().any(|(cp, _)| cp.sources != from.sources) {
        return Err(diverged(
            "shards at one transaction hold different positions",
        ));
    }
    let mut intents = recovered
        .iter()
        .filter_map(|(cp, i)| i.filter(|_| cp.txn == lo));
    let replay = intents.next();
    if intents.any(|other| Some(other) != replay) {
        return Err(diverged("their interrupted transactions differ"));
    }
    if lo == hi {
        return Ok(GroupStart {
            from: (*from).clone(),
            replay: replay.cloned(),
            skips_replay: vec![false; recovered.len()],
        });
    }
    if hi != lo + 1 {
        return Err(diverged("they are more than one transaction apart"));
    }
    let Some(replay) = replay.filter(|r| r.txn == hi && behind.iter().all(|(_, i)| i.is_some()))
    else {
        return Err(diverged(
            "a shard behind holds no intent of the next transaction",
        ));
    };
    let replayable = (replay.steps.values().flatten()).all(|r| matches!(r, Resume::Replay { .. }));
    if !replayable {
        return Err(diverged(
            "the interrupted transaction's steps cannot be replayed exactly",
        ));
    }
    let mut after = from.sources.clone();
    for (source, resumes) in &replay.steps {
        if let Some(position) = resumes.last().and_then(Resume::position) {
            after.insert(source.clone(), position.clone());
        }
    }
    let ahead_elsewhere = recovered
        .iter()
        .any(|(cp, _)| cp.txn == hi && cp.sources != after);
    if ahead_elsewhere {
        return Err(diverged(
            "a shard ahead is not where the interrupted transaction ends",
        ));
    }
    Ok(GroupStart {
        from: (*from).clone(),
        replay: Some(replay.clone()),
        skips_replay: recovered.iter().map(|(cp, _)| cp.txn == hi).collect(),
    })
}

/// The highest transaction whose intent each shard of a group has made durable, and
/// whether the group is failing. A shard waits on it before sending its driver Commit.
#[derive(Clone)]
pub(super) struct IntentBarrier {
    state: std::sync::Arc<watch::Sender<Intents>>,
}

#[derive(Clone)]
struct Intents {
    durable: Vec<u64>,
    failed: bool,
}

impl IntentBarrier {
    /// A barrier over shards whose durable intents are (at least) `recovered`: their
    /// recovered checkpoints' transactions.
    pub fn new(recovered: Vec<u64>) -> IntentBarrier {
        IntentBarrier {
            state: std::sync::Arc::new(watch::Sender::new(Intents {
                durable: recovered,
                failed: false,
            })),
        }
    }

    /// Shard `shard`'s intent of `txn` is durable.
    pub fn intent_durable(&self, shard: usize, txn: u64) {
        self.state
            .send_modify(|s| s.durable[shard] = s.durable[shard].max(txn));
    }

    /// A shard or the reader failed: nobody waits for the others any longer.
    pub fn fail(&self) {
        self.state.send_modify(|s| s.failed = true);
    }

    /// Returns once the group fails.
    pub async fn failed(&self) {
        let mut state = self.state.subscribe();
        let _ = state.wait_for(|s| s.failed).await;
    }

    /// Returns once every shard's intent of `txn` is durable; an error once the group
    /// fails first (its transaction in progress is then never committed).
    pub async fn all_durable(&self, txn: u64) -> Result<(), RunError> {
        let mut state = self.state.subscribe();
        let passed = state
            .wait_for(|s| s.failed || s.durable.iter().all(|&d| d >= txn))
            .await
            .map(|s| !s.failed);
        match passed {
            Ok(true) => Ok(()),
            _ => Err(RunError::GroupStopped(format!(
                "another shard of this materialization failed before its intent of \
                 transaction {txn} was durable"
            ))),
        }
    }
}

/// Each shard's last transaction whose log commit is durable: a transaction is durable
/// for the group once it is for every shard.
pub(super) struct Durables {
    shards: Vec<watch::Receiver<u64>>,
}

impl Durables {
    pub fn new(shards: Vec<watch::Receiver<u64>>) -> Durables {
        Durables { shards }
    }

    /// The last transaction durable in every shard's log.
    pub fn borrow_and_update(&mut self) -> u64 {
        (self.shards.iter_mut())
            .map(|d| *d.borrow_and_update())
            .min()
            .unwrap_or(0)
    }

    /// Returns `true` when some shard's durable transaction changed, `false` once every
    /// committer is gone (a shard whose committer ended is waited on no longer).
    pub async fn changed(&mut self) -> bool {
        let open: Vec<_> = (self.shards.iter_mut())
            .filter(|d| d.has_changed().is_ok())
            .map(|d| Box::pin(d.changed()))
            .collect();
        if open.is_empty() {
            return false;
        }
        let (changed, _, _) = futures::future::select_all(open).await;
        changed.is_ok()
    }
}

/// Splits shards into groups that one reader each can resume (each accepted by
/// [`plan_group`]), from what their logs hold (`recovered`, each shard's last commit,
/// `None` before its first, and its interrupted transaction): each shard, in order,
/// joins the first group it can share a reader with, else starts one. Returns each
/// group's indices into `recovered`, in order. A cluster member runs the shards it
/// holds of one materialization as these groups: shards that came to it together
/// (from one group, or halves of one split) read once; one that comes from elsewhere,
/// at its own position, reads on its own.
pub fn shared_reads(recovered: &[(Option<Checkpoint>, Option<Intent>)]) -> Vec<Vec<usize>> {
    let none = Checkpoint::default();
    let entry = |i: usize| {
        let (cp, intent) = &recovered[i];
        (cp.as_ref().unwrap_or(&none), intent.as_ref())
    };
    // Names only serve plan_group's error, not looked at here.
    let names = vec![String::new(); recovered.len()];
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for i in 0..recovered.len() {
        let joins = groups.iter_mut().find(|group| {
            let with: Vec<_> = group.iter().chain([&i]).map(|&j| entry(j)).collect();
            plan_group(&with, &names[..with.len()]).is_ok()
        });
        match joins {
            Some(group) => group.push(i),
            None => groups.push(vec![i]),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn cp(txn: u64, offset: u64) -> Checkpoint {
        Checkpoint {
            txn,
            sources: BTreeMap::from([("in".to_string(), json!(offset))]),
            ..Checkpoint::default()
        }
    }

    fn intent(txn: u64, to: u64) -> Intent {
        Intent {
            txn,
            steps: BTreeMap::from([(
                "in".to_string(),
                vec![Resume::Replay {
                    position: json!(to),
                    data: None,
                    hash: 7,
                }],
            )]),
            ..Intent::default()
        }
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("s{i}")).collect()
    }

    #[test]
    fn shards_at_one_checkpoint_start_there_and_share_its_replay() {
        let (a, b) = (cp(4, 40), cp(4, 40));
        let pending = intent(5, 50);
        let start = plan_group(&[(&a, None), (&b, Some(&pending))], &names(2)).unwrap();
        assert_eq!(
            start,
            GroupStart {
                from: a.clone(),
                replay: Some(pending.clone()),
                skips_replay: vec![false, false],
            }
        );
        let none = plan_group(&[(&a, None), (&b, None)], &names(2)).unwrap();
        assert_eq!(none.replay, None);
    }

    #[test]
    fn shards_share_a_read_only_with_those_whose_logs_one_reader_resumes() {
        let (at4, at4_too, at7) = (cp(4, 40), cp(4, 40), cp(7, 70));
        let recovered = [
            (Some(at4), None),
            (Some(at7.clone()), None),
            (Some(at4_too), Some(intent(5, 50))),
            (None, None),
            (None, None),
            (Some(at7), None),
        ];
        // The two at 4 (one interrupted in 5), the two at 7, the two never committed.
        assert_eq!(
            shared_reads(&recovered),
            [vec![0, 2], vec![1, 5], vec![3, 4]]
        );
        assert_eq!(shared_reads(&[]), Vec::<Vec<usize>>::new());
    }

    #[test]
    fn a_shard_one_behind_replays_what_the_others_committed() {
        let (ahead, behind) = (cp(5, 50), cp(4, 40));
        let pending = intent(5, 50);
        let start = plan_group(&[(&ahead, None), (&behind, Some(&pending))], &names(2)).unwrap();
        assert_eq!(start.from, behind);
        assert_eq!(start.replay, Some(pending));
        assert_eq!(start.skips_replay, vec![true, false]);
    }

    #[test]
    fn what_one_reader_cannot_resume_is_refused_naming_the_shards() {
        // Each case: the shards' recovered checkpoints and intents, and why refused.
        type Shards = Vec<(Checkpoint, Option<Intent>)>;
        let cases: Vec<(Shards, &str)> = vec![
            (
                vec![(cp(4, 40), None), (cp(4, 41), None)],
                "different positions",
            ),
            (
                vec![
                    (cp(4, 40), Some(intent(5, 50))),
                    (cp(4, 40), Some(intent(5, 51))),
                ],
                "interrupted transactions differ",
            ),
            (
                vec![(cp(6, 60), None), (cp(4, 40), Some(intent(5, 50)))],
                "more than one",
            ),
            (
                vec![(cp(5, 50), None), (cp(4, 40), None)],
                "holds no intent",
            ),
            (
                vec![(cp(5, 55), None), (cp(4, 40), Some(intent(5, 50)))],
                "not where the interrupted transaction ends",
            ),
        ];
        for (shards, why) in cases {
            let refs: Vec<_> = shards.iter().map(|(c, i)| (c, i.as_ref())).collect();
            let err = plan_group(&refs, &names(2)).unwrap_err().to_string();
            assert!(err.contains(why), "{err}");
            assert!(err.contains("shard s1 at transaction"), "{err}");
            assert!(err.contains("sluice apply --delete"), "{err}");
        }
        let seek = Intent {
            txn: 5,
            steps: BTreeMap::from([(
                "in".into(),
                vec![Resume::Seek {
                    position: json!(50),
                }],
            )]),
            ..Intent::default()
        };
        let (ahead, behind) = (cp(5, 50), cp(4, 40));
        let err = plan_group(&[(&ahead, None), (&behind, Some(&seek))], &names(2)).unwrap_err();
        assert!(
            err.to_string().contains("cannot be replayed exactly"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn the_barrier_opens_once_every_intent_is_durable_and_fails_with_the_group() {
        let barrier = IntentBarrier::new(vec![3, 3]);
        barrier.all_durable(3).await.unwrap();
        barrier.intent_durable(0, 4);
        let waiting = tokio::spawn({
            let barrier = barrier.clone();
            async move { barrier.all_durable(4).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        barrier.intent_durable(1, 4);
        waiting.await.unwrap().unwrap();
        let failing = tokio::spawn({
            let barrier = barrier.clone();
            async move { barrier.all_durable(5).await }
        });
        barrier.fail();
        assert!(failing.await.unwrap().is_err());
    }
}
