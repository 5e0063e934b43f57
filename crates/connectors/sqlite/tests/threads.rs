//! Which thread runs SQLite: each connection's own, never the runtime's worker. On a
//! current-thread runtime (one worker for every task), a claim that waits for another
//! connection's write lock must leave the worker free to run the task that releases it;
//! run on the worker, the claim would hold it until the busy timeout failed it.

mod common;

use common::{DRIVER, TestFile, endpoint};
use rusqlite::Connection;
use sluice_testkit::conformance::{binding, spec};
use std::time::Duration;

#[tokio::test(flavor = "current_thread")]
async fn a_claim_waiting_for_the_write_lock_leaves_a_current_thread_runtime_free() {
    let db = TestFile::new();
    let spec = spec(&endpoint(&db.path), vec![binding("pageviews", false)]);
    DRIVER.apply(&spec).await;
    let holder = Connection::open(&db.path).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let opening = tokio::spawn(async move { DRIVER.session(&spec, 0, u32::MAX).await.map(drop) });
    // The claim starts and waits for the lock; this task runs again (and releases the
    // lock) only if that wait does not hold the runtime's one worker.
    tokio::time::sleep(Duration::from_millis(200)).await;
    holder.execute_batch("COMMIT").unwrap();
    opening
        .await
        .unwrap()
        .expect("the claim takes the write lock once it is released");
}
