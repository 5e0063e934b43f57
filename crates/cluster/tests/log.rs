//! A shard's recovery log in etcd against a private etcd member: what a holder writes
//! survives to the next holder, and once another member has claimed the shard, the old
//! holder's writes (intent or commit) and reads fail as fenced, naming the new holder. A
//! record too large for etcd is refused, and etcd being down is an error the loop may
//! retry. And the prefix condition `sluice apply` writes under.

use serde_json::json;
use sluice_cluster::etcd::{Cond, Etcd, Op};
use sluice_cluster::keys::{Keys, ShardDef, ShardId};
use sluice_cluster::log::{MAX_RECORD, SharedLog};
use sluice_runtime::pipeline::OpenLog;
use sluice_runtime::recovery::{Checkpoint, Intent, RecoveryError, RecoveryLog};
use sluice_source_sdk::Resume;
use sluice_testkit::etcd::PrivateEtcd;
use std::collections::BTreeMap;
use std::time::Duration;

fn checkpoint(txn: u64) -> Checkpoint {
    Checkpoint {
        txn,
        sources: BTreeMap::from([("views".to_string(), json!({"offset": txn * 10}))]),
        ..Default::default()
    }
}

fn intent(txn: u64, data: Vec<u8>) -> Intent {
    let step = Resume::Replay {
        position: json!({"offset": txn * 10}),
        data: Some(data),
        hash: txn,
    };
    Intent {
        txn,
        steps: BTreeMap::from([("views".to_string(), vec![step])]),
        ..Default::default()
    }
}

/// Claims `shard` for `member` as a member does (create if absent); its token.
async fn claim(etcd: &Etcd, keys: &Keys, shard: &ShardId, member: &str) -> Option<i64> {
    let key = keys.assignment(shard);
    let put = Op::Put {
        key: key.clone(),
        value: member.as_bytes().to_vec(),
        lease: 0,
    };
    let outcome = etcd
        .txn(vec![Cond::Absent(key)], vec![put], vec![])
        .await
        .unwrap();
    outcome.succeeded.then_some(outcome.revision)
}

/// Runs a log call on a blocking thread, as the loop does.
async fn blocking<T: Send + 'static>(
    mut log: RecoveryLog,
    f: impl FnOnce(&mut RecoveryLog) -> Result<T, RecoveryError> + Send + 'static,
) -> (RecoveryLog, Result<T, RecoveryError>) {
    tokio::task::spawn_blocking(move || {
        let result = f(&mut log);
        (log, result)
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_is_fenced_once_another_claims_the_shard_and_the_new_one_recovers_its_log() {
    let mut server = PrivateEtcd::start();
    let etcd = Etcd::connect(&[server.url()], Duration::from_secs(2), None).unwrap();
    let keys = Keys::new("/test/log");
    let shard = ShardId {
        materialization: "views".into(),
        range: ShardDef::default(),
    };
    let token_a = claim(&etcd, &keys, &shard, "a")
        .await
        .expect("a claims a free shard");
    assert_eq!(
        claim(&etcd, &keys, &shard, "b").await,
        None,
        "a held shard cannot be claimed"
    );

    let log_a = SharedLog::new(etcd.clone(), &keys, &shard, token_a)
        .open()
        .await
        .unwrap();
    let (log_a, written) = blocking(log_a, |l| {
        l.write_intent(&intent(1, b"one".to_vec()))?;
        l.commit(&checkpoint(1))?;
        l.write_intent(&intent(2, b"two".to_vec()))
    })
    .await;
    written.unwrap();

    // a's lease expires (its assignment goes with it), and b claims the shard.
    etcd.txn(vec![], vec![Op::Delete(keys.assignment(&shard))], vec![])
        .await
        .unwrap();
    let token_b = claim(&etcd, &keys, &shard, "b").await.expect("b claims it");
    let (_, late) = blocking(log_a, |l| l.commit(&checkpoint(2))).await;
    match late {
        Err(RecoveryError::Fenced { reason, .. }) => {
            assert!(reason.contains("member b"), "{reason}")
        }
        other => panic!("a's commit after b's claim: {other:?}"),
    }
    match SharedLog::new(etcd.clone(), &keys, &shard, token_a)
        .open()
        .await
    {
        Err(RecoveryError::Fenced { .. }) => {}
        other => panic!("a reopening after b's claim: {:?}", other.map(|_| ())),
    }

    // b recovers what a made durable: commit 1 and the pending intent 2, not a's
    // fenced commit 2.
    let log_b = SharedLog::new(etcd.clone(), &keys, &shard, token_b)
        .open()
        .await
        .unwrap();
    assert_eq!(log_b.last_commit(), Some(&checkpoint(1)));
    assert_eq!(log_b.pending_intent(), Some(&intent(2, b"two".to_vec())));
    let (log_b, committed) = blocking(log_b, |l| l.commit(&checkpoint(2))).await;
    committed.unwrap();
    assert_eq!(log_b.pending_intent(), None, "a commit settles the intent");

    // A record above etcd's limit is refused, naming it; nothing is written.
    let huge = intent(3, vec![b'x'; MAX_RECORD]);
    let (log_b, refused) = blocking(log_b, move |l| l.write_intent(&huge)).await;
    assert!(
        matches!(refused, Err(RecoveryError::TooLarge { .. })),
        "{refused:?}"
    );

    // etcd down: the write fails as unavailable, which the loop retries by reopening.
    server.stop();
    let (_, down) = blocking(log_b, |l| l.write_intent(&intent(3, b"three".to_vec()))).await;
    assert!(
        matches!(down, Err(RecoveryError::Unavailable { .. })),
        "{down:?}"
    );
}

/// `sluice apply` writes only while no member is registered and no shard of the
/// materialization is assigned: a condition on a whole prefix, which holds when no key
/// is under it and fails on any one, not on a key of a longer name beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_none_under_condition_holds_only_while_no_key_is_under_the_prefix() {
    let server = PrivateEtcd::start();
    let etcd = Etcd::connect(&[server.url()], Duration::from_secs(2), None).unwrap();
    let put = |key: &str| Op::Put {
        key: key.to_string(),
        value: b"x".to_vec(),
        lease: 0,
    };
    let none_under = || vec![Cond::NoneUnder("/test/none/assign/views/".to_string())];
    let written = etcd.txn(none_under(), vec![put("/test/none/written")], vec![]);
    assert!(written.await.unwrap().succeeded, "an empty prefix");
    etcd.txn(vec![], vec![put("/test/none/assign/views2/0-1")], vec![])
        .await
        .unwrap();
    let beside = etcd.txn(none_under(), vec![put("/test/none/written")], vec![]);
    assert!(beside.await.unwrap().succeeded, "a key beside the prefix");
    etcd.txn(vec![], vec![put("/test/none/assign/views/0-1")], vec![])
        .await
        .unwrap();
    let under = etcd.txn(none_under(), vec![put("/test/none/refused")], vec![]);
    assert!(!under.await.unwrap().succeeded, "a key under the prefix");
    assert!(etcd.get("/test/none/refused").await.unwrap().is_none());
}
