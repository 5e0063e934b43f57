//! Backpressure: a transaction larger than the endpoint's `max_buffer_size_bytes` is
//! split into several pushes, each within the limit (and one change's messages), and
//! each awaited before more of the transaction is encoded: a Store returns only once
//! all but the last, partly filled buffer is pushed, so a slow endpoint slows the loop
//! instead of growing memory. Numbering runs on across the pushes.

use async_trait::async_trait;
use serde_json::{Value, json};
use sluice_conformance::messages;
use sluice_driver_sdk::Driver;
use sluice_driver_sdk::materialize::transaction_request::Prepare;
use sluice_output_sdk::{
    BatchKind, Buffer, OutputDriver, OutputEndpoint, OutputKind, Result, Target,
};
use std::sync::Mutex;

/// Pushed messages: (txn, index, value length), one Vec per push.
static PUSHES: Mutex<Vec<Vec<(u64, u64, usize)>>> = Mutex::new(Vec::new());
const LIMIT: usize = 2_000;

struct Recording;

#[async_trait]
impl OutputEndpoint for Recording {
    async fn open(&mut self) -> Result<()> {
        Ok(())
    }
    fn max_buffer_size_bytes(&self) -> usize {
        LIMIT
    }
    async fn batch_start(&mut self, _txn: u64, _kind: BatchKind) -> Result<()> {
        Ok(())
    }
    async fn push(&mut self, buffer: &Buffer) -> Result<()> {
        // A slow destination: the driver must wait for it.
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        let push = buffer
            .messages()
            .map(|m| (m.txn, m.index, m.key.len() + m.value.len()))
            .collect();
        PUSHES.lock().unwrap().push(push);
        Ok(())
    }
    async fn batch_end(&mut self) -> Result<()> {
        Ok(())
    }
    async fn abort(&mut self) {}
}

fn kind() -> OutputKind {
    OutputKind {
        name: "recording",
        paths: &[],
        endpoint_schema: || r#"{"type":"object"}"#.into(),
        resource_schema: || r#"{"type":"object","properties":{}}"#.into(),
        check: |_| Ok(()),
        resource_path: |r: &Value| Ok(vec![r["table"].as_str().unwrap_or("t").to_string()]),
        endpoint: |_, _: Target| Ok(Box::new(Recording)),
        late_writes: None,
    }
}

#[tokio::test]
async fn a_large_transaction_is_pushed_in_bounded_awaited_pieces() {
    let dir = tempfile::tempdir().unwrap();
    let driver = OutputDriver::new(kind(), dir.path().to_path_buf());
    let spec = messages::spec("m", "{}", &[("views", false)]);
    let (mut transactor, _) = driver
        .open(messages::open(&spec, 0, u32::MAX))
        .await
        .unwrap();

    let keys: Vec<Vec<u8>> = (0..500u32).map(|i| i.to_be_bytes().to_vec()).collect();
    let docs: Vec<String> = (0..500)
        .map(|i| json!({"id": i, "pad": "x".repeat(100)}).to_string())
        .collect();
    let store: Vec<(&[u8], &str, bool)> = keys
        .iter()
        .zip(&docs)
        .map(|(k, d)| (k.as_slice(), d.as_str(), false))
        .collect();
    transactor
        .prepare(Prepare {
            flow_checkpoint: br#"{"txn":7}"#.to_vec(),
        })
        .await
        .unwrap();
    transactor.store(messages::store(0, &store)).await.unwrap();

    // When the Store returns, every full buffer has been pushed (awaited).
    let pushed_before_commit: usize = PUSHES.lock().unwrap().iter().map(Vec::len).sum();
    let one_message = docs[0].len() + 40;
    assert!(
        500 - pushed_before_commit <= LIMIT / one_message + 1,
        "the Store returned with {} messages unpushed",
        500 - pushed_before_commit
    );
    // What it reports (`Transactor::report`): the partly filled buffer's bytes, then
    // none once the commit pushed them, and every message it published.
    let held = transactor.report();
    assert!(held.memory > 0, "the last buffer is held until Commit");
    transactor.commit().await.unwrap();
    let report = transactor.report();
    assert_eq!(report.memory, 0, "Commit pushed every buffer");
    assert_eq!(report.metrics[0].name, "messages_published");
    assert_eq!(report.metrics[0].value, 500);

    let pushes = std::mem::take(&mut *PUSHES.lock().unwrap());
    assert!(pushes.len() >= 20, "{} pushes", pushes.len());
    for push in &pushes {
        let bytes: usize = push.iter().map(|(_, _, n)| n).sum();
        assert!(bytes < LIMIT + one_message, "a push of {bytes} bytes");
    }
    let numbered: Vec<(u64, u64)> = pushes.iter().flatten().map(|(t, i, _)| (*t, *i)).collect();
    let expected: Vec<(u64, u64)> = (0..500).map(|i| (7, i)).collect();
    assert_eq!(
        numbered, expected,
        "one message per insert, numbered across pushes"
    );
}
