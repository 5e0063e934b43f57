//! Serve loop + client over the in-process transport, with the reference memory driver
//! and with test transactors: full cycles, pipelining, fencing, deferred loads, and
//! protocol violations ending the stream.

mod common;

use common::{load, open, spec, store};
use sluice_driver::arena::loaded_docs;
use sluice_driver::client::{self, ClientReceiver, ClientSender, Response};
use sluice_driver::inprocess::InProcess;
use sluice_driver::memory::MemoryDriver;
use sluice_driver::{Endpoint, Error, Peer};
use sluice_proto::materialize::transaction_request::Prepare;
use std::sync::Arc;

const MAT: &str = "acme/views";

async fn connect(
    driver: &MemoryDriver,
    key_begin: u32,
    key_end: u32,
) -> (ClientSender, ClientReceiver, Vec<u8>) {
    let endpoint = InProcess::new("memory", Arc::new(driver.clone()));
    let spec = spec(MAT, "{}", &[("views", false), ("events", true)]);
    let stream = endpoint.transactions().await.unwrap();
    let (tx, rx, opened) = client::open(stream, open(&spec, key_begin, key_end))
        .await
        .unwrap();
    (tx, rx, opened.flow_checkpoint)
}

/// Reads responses until Prepared, collecting the documents of every Loaded.
async fn until_prepared(rx: &mut ClientReceiver) -> Vec<String> {
    let mut docs = Vec::new();
    loop {
        match rx.recv().await.unwrap() {
            Response::Loaded(l) => docs
                .extend(loaded_docs(&l).map(|d| String::from_utf8(d.unwrap().to_vec()).unwrap())),
            Response::Prepared(_) => return docs,
            other => panic!("expected Loaded or Prepared, got {other:?}"),
        }
    }
}

async fn expect(rx: &mut ClientReceiver, want: &str) {
    let got = rx.recv().await.unwrap();
    assert_eq!(format!("{got:?}"), want);
}

fn prepare(checkpoint: &[u8]) -> Prepare {
    Prepare {
        flow_checkpoint: checkpoint.to_vec(),
    }
}

#[tokio::test]
async fn full_cycle_stores_commits_and_reopen_recovers_checkpoint() {
    let driver = MemoryDriver::new();
    let (mut tx, mut rx, recovered) = connect(&driver, 0, u32::MAX).await;
    assert!(recovered.is_empty(), "a fresh store has no checkpoint");

    tx.acknowledge().await.unwrap();
    tx.load(load(0, &[b"k1"])).await.unwrap();
    expect(&mut rx, "Acknowledged").await;
    tx.prepare(prepare(b"cp1")).await.unwrap();
    assert!(
        until_prepared(&mut rx).await.is_empty(),
        "absent keys load nothing"
    );
    tx.store(store(0, &[(b"k1", r#"{"n":1}"#, false)]))
        .await
        .unwrap();
    tx.store(store(1, &[(b"e1", r#"{"ev":1}"#, false)]))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    expect(&mut rx, "DriverCommitted").await;

    assert_eq!(
        driver.rows(MAT, "views"),
        vec![(b"k1".to_vec(), serde_json::json!({"n": 1}))]
    );
    assert_eq!(driver.rows(MAT, "events").len(), 1);
    drop(tx);
    drop(rx);

    let (_tx, _rx, recovered) = connect(&driver, 0, u32::MAX).await;
    assert_eq!(recovered, b"cp1");
}
