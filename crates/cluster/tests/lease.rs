//! A member's lease against a private etcd member: once it has ended, a write with it
//! is refused as `lease_gone` (how a member stopped past its lease while joining learns
//! that it lost it, and exits naming it fenced) and a renewal says it expired; other
//! refusals are not mistaken for it.

use sluice_cluster::etcd::{Cond, Etcd, Op};
use sluice_testkit::etcd::PrivateEtcd;
use std::time::Duration;

#[tokio::test]
async fn a_write_with_an_ended_lease_is_refused_as_lease_gone_and_its_renewal_says_expired() {
    let server = PrivateEtcd::start();
    let etcd = Etcd::connect(&[server.url()], Duration::from_secs(5), None).unwrap();
    let lease = etcd.grant(Duration::from_secs(30)).await.unwrap();
    let put = |lease| Op::Put {
        key: "/l/lock".to_string(),
        value: b"m1".to_vec(),
        lease,
    };
    let when = || vec![Cond::Absent("/l/lock".to_string())];
    let taken = etcd.txn(when(), vec![put(lease)], vec![]).await.unwrap();
    assert!(taken.succeeded);
    assert!(etcd.keep_alive(lease).await.unwrap().is_some());
    etcd.revoke(lease).await.unwrap();
    let err = etcd
        .txn(when(), vec![put(lease)], vec![])
        .await
        .unwrap_err();
    assert!(err.lease_gone, "{err}");
    assert_eq!(etcd.keep_alive(lease).await.unwrap(), None);
    // A failed condition is no error, and an unreachable etcd is not a lost lease.
    let free = etcd.grant(Duration::from_secs(30)).await.unwrap();
    let taken = etcd.txn(when(), vec![put(free)], vec![]).await.unwrap();
    assert!(taken.succeeded);
    let taken = etcd.txn(when(), vec![put(free)], vec![]).await.unwrap();
    assert!(!taken.succeeded);
    drop(server);
    let err = etcd.txn(when(), vec![put(free)], vec![]).await.unwrap_err();
    assert!(!err.lease_gone, "{err}");
}
