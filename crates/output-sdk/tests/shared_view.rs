//! An output whose view is in PostgreSQL (`view: {url, schema}`) moves between two
//! members: two `OutputDriver`s with state folders of their own (two machines) over one
//! shared view. The second member's Open fences the first, whose commit then fails as
//! fenced and leaves nothing behind; the second resumes from the first's last
//! committed checkpoint, under the same generation, and publishes the first's committed
//! documents as its changes' before-images. The server is `SLUICE_TEST_POSTGRES_URL`
//! (default `postgres://postgres@127.0.0.1:5432/test`), in a schema of the test's own.

use async_trait::async_trait;
use serde_json::{Value, json};
use sluice_conformance::messages;
use sluice_driver_sdk::materialize::transaction_request::Prepare;
use sluice_driver_sdk::{Driver, Error, LoadedSink, PriorState, Transactor};
use sluice_output_sdk::{
    BatchKind, Buffer, GenerationId, OutputDriver, OutputEndpoint, OutputKind, Result, Target,
};
use sluice_pg_client::tokio_postgres::{self, NoTls};
use sluice_testkit::conformance::{run_detached, server_url, unique_name};
use std::sync::Mutex;

/// A message pushed: its generation, transaction and value.
type Pushed = (GenerationId, u64, String);

/// Every message pushed, with its materialization (each test has its own).
static PUSHED: Mutex<Vec<(String, Pushed)>> = Mutex::new(Vec::new());

/// Takes the messages pushed for `materialization` so far.
fn take_pushed(materialization: &str) -> Vec<Pushed> {
    let mut pushed = PUSHED.lock().unwrap();
    let (taken, others) = std::mem::take(&mut *pushed)
        .into_iter()
        .partition(|(m, _)| m == materialization);
    *pushed = others;
    taken.into_iter().map(|(_, p)| p).collect()
}

struct Recording(Target);

#[async_trait]
impl OutputEndpoint for Recording {
    async fn open(&mut self) -> Result<()> {
        Ok(())
    }
    fn max_buffer_size_bytes(&self) -> usize {
        1 << 20
    }
    async fn batch_start(&mut self, _txn: u64, _kind: BatchKind) -> Result<()> {
        Ok(())
    }
    async fn push(&mut self, buffer: &Buffer) -> Result<()> {
        let mut pushed = PUSHED.lock().unwrap();
        for m in buffer.messages() {
            let value = String::from_utf8(m.value.to_vec()).unwrap();
            let message = (self.0.generation.id, m.txn, value.trim_end().to_owned());
            pushed.push((self.0.materialization.clone(), message));
        }
        Ok(())
    }
    async fn batch_end(&mut self) -> Result<()> {
        Ok(())
    }
    async fn abort(&mut self) {}
}

/// A kind whose own configuration is `{}`: its strict check never sees `view`.
fn kind() -> OutputKind {
    OutputKind {
        name: "recording",
        paths: &[],
        endpoint_schema: || r#"{"type":"object","properties":{}}"#.into(),
        resource_schema: || r#"{"type":"object","properties":{}}"#.into(),
        check: |config| match config.as_object().is_some_and(|c| c.is_empty()) {
            true => Ok(()),
            false => Err(sluice_output_sdk::OutputError::Config(format!(
                "unexpected {config}"
            ))),
        },
        resource_path: |r: &Value| Ok(vec![r["table"].as_str().unwrap_or("t").to_string()]),
        endpoint: |_, target: Target| Ok(Box::new(Recording(target))),
        late_writes: None,
    }
}

fn test_server() -> String {
    server_url(
        "SLUICE_TEST_POSTGRES_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    )
}

/// A schema of the test's own, dropped (with the view's tables) at the end.
struct TestSchema(String);

impl Drop for TestSchema {
    fn drop(&mut self) {
        let drop = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.0);
        run_detached(async move {
            let (client, connection) = tokio_postgres::connect(&test_server(), NoTls)
                .await
                .expect("connecting to the test server");
            tokio::spawn(connection);
            if let Err(err) = client.batch_execute(&drop).await {
                eprintln!("{drop}: {err}");
            }
        });
    }
}

/// The documents a Load found.
#[derive(Default)]
struct Found(Vec<String>);

#[async_trait]
impl LoadedSink for Found {
    fn push(&mut self, _binding: u32, doc_json: &[u8]) {
        self.0.push(String::from_utf8(doc_json.to_vec()).unwrap());
    }
    async fn send_full(&mut self) -> sluice_driver_sdk::Result<()> {
        Ok(())
    }
}

async fn prepare(transactor: &mut Box<dyn Transactor>, txn: u64) {
    let checkpoint = json!({ "txn": txn }).to_string().into_bytes();
    (transactor.prepare(Prepare {
        flow_checkpoint: checkpoint,
    }))
    .await
    .unwrap();
}

#[tokio::test]
async fn a_member_taking_an_output_over_fences_the_former_holder_and_continues_its_view() {
    let schema = TestSchema(unique_name());
    let endpoint = json!({"view": {"url": test_server(), "schema": schema.0}}).to_string();
    let spec = messages::spec(&schema.0, &endpoint, &[("changes", false)]);
    let (first_dir, second_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first = OutputDriver::new(kind(), first_dir.path().to_path_buf());
    let second = OutputDriver::new(kind(), second_dir.path().to_path_buf());

    // The first member publishes transaction 1 and starts transaction 2.
    let (mut former, opened) = first
        .open(messages::open(&spec, 0, u32::MAX))
        .await
        .unwrap();
    assert!(opened.flow_checkpoint.is_empty(), "a new view");
    prepare(&mut former, 1).await;
    let stored = [(&b"k1"[..], r#"{"id":1,"v":"first"}"#, false)];
    former.store(messages::store(0, &stored)).await.unwrap();
    former.commit().await.unwrap();
    prepare(&mut former, 2).await;
    let stored = [(&b"k1"[..], r#"{"id":1,"v":"lost"}"#, true)];
    former.store(messages::store(0, &stored)).await.unwrap();

    // The second member takes the shard over: the first's commit is refused.
    let (mut holder, opened) = second
        .open(messages::open(&spec, 0, u32::MAX))
        .await
        .unwrap();
    assert_eq!(
        opened.flow_checkpoint, br#"{"txn":1}"#,
        "the last committed checkpoint"
    );
    let refused = former.commit().await.unwrap_err();
    assert!(matches!(refused, Error::Fenced(_)), "{refused}");
    let former_pushed = take_pushed(&schema.0);

    // It loads and publishes from the first's committed view, under its generation.
    let mut found = Found::default();
    let settled = PriorState {
        prior_committed: true,
        prior_acknowledged: true,
    };
    (holder.load(messages::load(0, &[b"k1"]), settled, &mut found))
        .await
        .unwrap();
    assert_eq!(
        found.0,
        [r#"{"id":1,"v":"first"}"#],
        "not the fenced transaction's"
    );
    prepare(&mut holder, 2).await;
    let stored = [
        (&b"k1"[..], r#"{"id":1,"v":"second"}"#, true),
        (&b"k2"[..], r#"{"id":2}"#, false),
    ];
    holder.store(messages::store(0, &stored)).await.unwrap();
    holder.commit().await.unwrap();
    let holder_pushed = take_pushed(&schema.0);

    let generation = former_pushed[0].0;
    let values = |pushed: &[Pushed], txn: u64| -> Vec<String> {
        (pushed.iter())
            .inspect(|(g, _, _)| assert_eq!(*g, generation, "one generation"))
            .filter(|(_, t, _)| *t == txn)
            .map(|(_, _, v)| v.clone())
            .collect()
    };
    assert_eq!(
        values(&former_pushed, 1),
        [r#"{"insert":{"id":1,"v":"first"}}"#]
    );
    assert_eq!(
        values(&former_pushed, 2),
        [
            r#"{"delete":{"id":1,"v":"first"}}"#,
            r#"{"insert":{"id":1,"v":"lost"}}"#
        ],
        "the fenced transaction's batch reached the destination (which discards it)"
    );
    assert_eq!(
        values(&holder_pushed, 2),
        [
            r#"{"delete":{"id":1,"v":"first"}}"#,
            r#"{"insert":{"id":1,"v":"second"}}"#,
            r#"{"insert":{"id":2}}"#,
        ],
        "the before-image is the first member's committed document"
    );
    assert!(values(&holder_pushed, 1).is_empty());
}

#[tokio::test]
async fn a_reset_removes_the_shared_view_and_says_what_it_removed() {
    let schema = TestSchema(unique_name());
    let endpoint = json!({"view": {"url": test_server(), "schema": schema.0}}).to_string();
    let spec = messages::spec(&schema.0, &endpoint, &[("changes", false)]);
    let dir = tempfile::tempdir().unwrap();
    let driver = OutputDriver::new(kind(), dir.path().to_path_buf());
    let (mut transactor, _) = driver
        .open(messages::open(&spec, 0, u32::MAX))
        .await
        .unwrap();
    prepare(&mut transactor, 1).await;
    let stored = [(&b"k1"[..], r#"{"id":1}"#, false)];
    transactor.store(messages::store(0, &stored)).await.unwrap();
    transactor.commit().await.unwrap();
    transactor.destroy().await;

    let dry = driver
        .apply_delete(messages::apply_request(&spec, true))
        .await
        .unwrap();
    let says = format!("remove the output view of {:?} in postgres://", schema.0);
    assert!(
        dry.action_description.starts_with(&says),
        "{}",
        dry.action_description
    );
    let (_, opened) = driver
        .open(messages::open(&spec, 0, u32::MAX))
        .await
        .unwrap();
    assert_eq!(
        opened.flow_checkpoint, br#"{"txn":1}"#,
        "a dry run removes nothing"
    );

    let reset = driver
        .apply_delete(messages::apply_request(&spec, false))
        .await
        .unwrap();
    let first_line = reset.action_description.lines().next().unwrap();
    assert!(
        first_line.contains(&format!("schema {:?}", schema.0)),
        "{first_line}"
    );
    assert!(
        first_line.contains(": 1 documents, 1 key ranges"),
        "{first_line}"
    );
    assert!(first_line.contains("generation"), "{first_line}");
    let (_, opened) = driver
        .open(messages::open(&spec, 0, u32::MAX))
        .await
        .unwrap();
    assert!(
        opened.flow_checkpoint.is_empty(),
        "the next run starts over"
    );
}
