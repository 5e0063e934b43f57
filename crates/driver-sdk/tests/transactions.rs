//! Serve loop + client over the in-process transport, with the reference memory driver
//! and with test transactors: full cycles, pipelining, fencing, deferred loads, and
//! protocol violations ending the stream, and the in-process calls beside the protocol.

use async_trait::async_trait;
use futures::StreamExt;
use serde_json::{Value, json};
use sluice_conformance::messages::{load, open, spec, store};
use sluice_driver_sdk::arena::{load_keys, loaded_docs};
use sluice_driver_sdk::client::{self, ClientReceiver, ClientSender, Response};
use sluice_driver_sdk::inprocess::InProcess;
use sluice_driver_sdk::machine::{self, Request};
use sluice_driver_sdk::{
    CommitPattern, Declared, Driver, Endpoint, Error, LoadedSink, LogContext, Peer, PriorState,
    Result, TransactionStream, Transactor, Undecided,
};
use sluice_memory::MemoryDriver;
use sluice_proto::flow;
use sluice_proto::materialize::{
    self as m, TransactionRequest, TransactionResponse,
    transaction_request::{Load, Open, Prepare, Store},
    transaction_response::Opened,
};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

const MAT: &str = "acme/views";
/// Long enough never to trip in these tests, except where a test stops its driver.
const TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

async fn connect(
    driver: &MemoryDriver,
    key_begin: u32,
    key_end: u32,
) -> (ClientSender, ClientReceiver, Vec<u8>) {
    let endpoint = InProcess::new("memory", Arc::new(driver.clone()));
    let spec = spec(MAT, "{}", &[("views", false), ("events", true)]);
    let stream = endpoint.transactions().await.unwrap();
    let (tx, rx, opened) = client::open(stream, open(&spec, key_begin, key_end), TIMEOUT)
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

/// The next response is `want` (its name).
async fn expect(rx: &mut ClientReceiver, want: &str) {
    let got = rx.recv().await.unwrap();
    assert_eq!(got.name(), want, "{got:?}");
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

#[tokio::test]
async fn loads_of_next_transaction_before_its_acknowledge_read_the_prior_commit() {
    let driver = MemoryDriver::new();
    let (mut tx, mut rx, _) = connect(&driver, 0, u32::MAX).await;
    tx.acknowledge().await.unwrap();
    expect(&mut rx, "Acknowledged").await;
    tx.prepare(prepare(b"cp1")).await.unwrap();
    until_prepared(&mut rx).await;
    tx.store(store(0, &[(b"k1", r#"{"n":1}"#, false)]))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    expect(&mut rx, "DriverCommitted").await;

    // Transaction 2: Loads go out before the Acknowledge of transaction 1's commit.
    tx.load(load(0, &[b"k1", b"absent"])).await.unwrap();
    tx.acknowledge().await.unwrap();
    let mut docs = Vec::new();
    loop {
        match rx.recv().await.unwrap() {
            Response::Acknowledged(_) => break,
            Response::Loaded(l) => docs.extend(loaded_docs(&l).map(|d| d.unwrap().to_vec())),
            other => panic!("unexpected {other:?}"),
        }
    }
    tx.prepare(prepare(b"cp2")).await.unwrap();
    for d in until_prepared(&mut rx).await {
        docs.push(d.into_bytes());
    }
    assert_eq!(
        docs,
        vec![br#"{"n":1}"#.to_vec()],
        "read committed: T+1 sees T's store"
    );
    tx.store(store(0, &[(b"k1", r#"{"n":2}"#, true)]))
        .await
        .unwrap();
    tx.commit().await.unwrap();
    expect(&mut rx, "DriverCommitted").await;
    assert_eq!(
        driver.rows(MAT, "views"),
        vec![(b"k1".to_vec(), serde_json::json!({"n": 2}))]
    );
    assert_eq!(driver.checkpoint(MAT, 0, u32::MAX).unwrap(), b"cp2");
}

#[tokio::test]
async fn second_open_fences_the_first_whose_commit_fails() {
    let driver = MemoryDriver::new();
    let (mut zombie, mut zombie_rx, _) = connect(&driver, 0, u32::MAX).await;
    // A newer instance opens a sub-range (a split): it overlaps, so it fences the zombie.
    let (mut newer, mut newer_rx, _) = connect(&driver, 0, u32::MAX / 2).await;

    for (tx, rx) in [(&mut zombie, &mut zombie_rx), (&mut newer, &mut newer_rx)] {
        tx.acknowledge().await.unwrap();
        expect(rx, "Acknowledged").await;
        tx.prepare(prepare(b"cp")).await.unwrap();
        until_prepared(rx).await;
        tx.store(store(0, &[(b"k", "1", false)])).await.unwrap();
        tx.commit().await.unwrap();
    }
    let err = zombie_rx.recv().await.unwrap_err();
    assert!(matches!(err, Error::Fenced(_)), "{err}");
    expect(&mut newer_rx, "DriverCommitted").await;
    assert_eq!(
        driver.rows(MAT, "views").len(),
        1,
        "only the newer instance wrote"
    );
    // The zombie's stream is over: later calls fail too.
    assert!(zombie.acknowledge().await.is_err());
}

#[tokio::test]
async fn runtime_protocol_violation_ends_the_stream_with_an_error_naming_the_message() {
    let endpoint = InProcess::new("memory", Arc::new(MemoryDriver::new()));
    let mut stream = endpoint.transactions().await.unwrap();
    let spec = spec(MAT, "{}", &[("views", false)]);
    let raw = |r: Request| -> TransactionRequest { r.into() };
    stream
        .requests
        .send(raw(Request::Open(open(&spec, 0, 9))))
        .await
        .unwrap();
    assert!(
        stream
            .responses
            .next()
            .await
            .unwrap()
            .unwrap()
            .opened
            .is_some()
    );
    // Prepare before the transaction's Acknowledge: the client would refuse to send it.
    stream
        .requests
        .send(raw(Request::Prepare(prepare(b""))))
        .await
        .unwrap();
    let err = stream.responses.next().await.unwrap().unwrap_err();
    let Error::Protocol(violation) = &err else {
        panic!("{err}")
    };
    assert_eq!(
        (violation.peer, violation.got.as_str()),
        (Peer::Runtime, "Prepare")
    );
    assert_eq!(violation.expected, "Acknowledge or Load");
    assert!(
        stream.responses.next().await.is_none(),
        "the stream has ended"
    );
}

#[tokio::test]
async fn client_refuses_to_send_out_of_order_requests() {
    let driver = MemoryDriver::new();
    let (mut tx, _rx, _) = connect(&driver, 0, 9).await;
    let err = tx.commit().await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "protocol violation by the runtime: expected Acknowledge or Load, got Commit"
    );
}

#[tokio::test]
async fn stream_closed_mid_transaction_is_an_error_naming_the_state() {
    let (requests, _keep) = mpsc::channel(4);
    let opened = TransactionResponse::from(machine::Response::Opened(Default::default()));
    let responses = futures::stream::iter([Ok(opened)]).boxed();
    let stream = TransactionStream {
        requests,
        responses,
        hooks: None,
    };
    let spec = spec(MAT, "{}", &[("views", false)]);
    let (mut tx, mut rx, _) = client::open(stream, open(&spec, 0, 9), TIMEOUT)
        .await
        .unwrap();
    tx.acknowledge().await.unwrap();
    let err = rx.recv().await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "transport: the driver closed the Transactions stream in the load phase of transaction 1, awaiting Acknowledged"
    );
}

/// A stream whose driver is the test: it reads the requests and sends the responses.
async fn played_stream(
    capacity: usize,
    timeout: std::time::Duration,
) -> (
    ClientSender,
    ClientReceiver,
    mpsc::Receiver<TransactionRequest>,
    mpsc::Sender<Result<TransactionResponse>>,
) {
    let (requests, requests_rx) = mpsc::channel(capacity);
    let (responses_tx, responses) = mpsc::channel(4);
    let stream = TransactionStream {
        requests,
        responses: tokio_stream::wrappers::ReceiverStream::new(responses).boxed(),
        hooks: None,
    };
    let opened = TransactionResponse::from(machine::Response::Opened(Default::default()));
    responses_tx.send(Ok(opened)).await.unwrap();
    let spec = spec(MAT, "{}", &[("views", false)]);
    let (tx, rx, _) = client::open(stream, open(&spec, 0, 9), timeout)
        .await
        .unwrap();
    (tx, rx, requests_rx, responses_tx)
}

const SHORT: std::time::Duration = std::time::Duration::from_millis(200);

#[tokio::test]
async fn a_driver_that_owes_an_answer_and_sends_nothing_times_out_naming_what_it_owes() {
    let (mut tx, mut rx, _requests, _responses) = played_stream(4, SHORT).await;
    tx.acknowledge().await.unwrap();
    let err = rx.recv().await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert_eq!(
        err.to_string(),
        "timed out after 200ms waiting for Acknowledged (in the load phase of transaction 1, \
         awaiting Acknowledged)"
    );
    // The stream is broken: later calls name the timeout.
    let later = tx.load(load(0, &[b"a"])).await.unwrap_err();
    assert!(later.to_string().contains("timed out"), "{later}");
}

#[tokio::test]
async fn holding_loaded_until_prepare_is_not_a_timeout_but_silence_after_prepare_is() {
    let (mut tx, mut rx, _requests, responses) = played_stream(8, SHORT).await;
    tx.acknowledge().await.unwrap();
    let acked = machine::Response::Acknowledged(None);
    responses.send(Ok(acked.into())).await.unwrap();
    expect(&mut rx, "Acknowledged").await;
    tx.load(load(0, &[b"a"])).await.unwrap();
    // The driver owes nothing while it may defer Loaded: waiting several timeouts long
    // (the runtime draining a large combiner) is no failure.
    let receiving = tokio::spawn(async move {
        let result = rx.recv().await;
        (rx, result)
    });
    tokio::time::sleep(SHORT * 3).await;
    assert!(
        !receiving.is_finished(),
        "the receiver gave up while nothing was owed"
    );
    // Once Prepare is sent, Loaded or Prepared is owed: the waiting receiver now times out.
    tx.prepare(prepare(b"cp")).await.unwrap();
    let (_rx, result) = receiving.await.unwrap();
    let err = result.unwrap_err();
    assert!(
        err.to_string().starts_with(
            "timed out after 200ms waiting for Loaded or Prepared (awaiting Prepared of \
             transaction 1)"
        ),
        "{err}"
    );
}

#[tokio::test]
async fn a_driver_that_stops_reading_requests_times_the_send_out() {
    let (mut tx, _rx, _requests, _responses) = played_stream(2, SHORT).await;
    // The channel holds two requests (Open, this Load): the next waits for a driver
    // that never reads.
    tx.load(load(0, &[b"a"])).await.unwrap();
    let err = tx.load(load(0, &[b"b"])).await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    assert_eq!(
        err.to_string(),
        "timed out after 200ms waiting for the driver to take Load (in the load phase of \
         transaction 1)"
    );
}

/// A transactor of the recovery-log patterns that records what it is asked, and echoes
/// each load key back as a document of `loaded_binding`.
struct Recorder {
    log: Arc<Mutex<Vec<String>>>,
    loaded_binding: u32,
}

#[async_trait]
impl Driver for Recorder {
    fn declared(&self) -> Declared {
        Declared {
            pattern: CommitPattern::RecoveryLogIdempotentApply,
            ..Declared::AUTHORITATIVE_TABLE
        }
    }

    async fn spec(&self, _: m::SpecRequest) -> Result<m::SpecResponse> {
        Ok(Default::default())
    }
    async fn validate(&self, _: m::ValidateRequest) -> Result<m::ValidateResponse> {
        Ok(Default::default())
    }
    async fn apply_upsert(&self, _: m::ApplyRequest) -> Result<m::ApplyResponse> {
        Ok(Default::default())
    }
    async fn apply_delete(&self, _: m::ApplyRequest) -> Result<m::ApplyResponse> {
        Ok(Default::default())
    }
    async fn open_with_log(
        &self,
        open: Open,
        log: LogContext,
    ) -> Result<(Box<dyn Transactor>, Opened)> {
        // Noted when the runtime told it something (the other tests tell nothing).
        if log != LogContext::default() {
            let undecided: Vec<u64> = log.undecided.iter().map(|u| u.epoch).collect();
            let opening = format!("open in {} undecided {undecided:?}", log.deployment_id);
            self.log.lock().unwrap().push(opening);
        }
        self.open(open).await
    }
    async fn open(&self, _: Open) -> Result<(Box<dyn Transactor>, Opened)> {
        let t = RecorderTransactor {
            log: self.log.clone(),
            loaded_binding: self.loaded_binding,
        };
        Ok((Box::new(t), Opened::default()))
    }
}

struct RecorderTransactor {
    log: Arc<Mutex<Vec<String>>>,
    loaded_binding: u32,
}

impl RecorderTransactor {
    fn note(&self, what: String) {
        self.log.lock().unwrap().push(what);
    }
}

#[async_trait]
impl Transactor for RecorderTransactor {
    async fn load(
        &mut self,
        load: Load,
        prior: PriorState,
        loaded: &mut dyn LoadedSink,
    ) -> Result<()> {
        for key in load_keys(&load) {
            let key = String::from_utf8(key?.to_vec()).unwrap();
            self.note(format!(
                "load {key} acknowledged={}",
                prior.prior_acknowledged
            ));
            loaded.push(self.loaded_binding, format!("\"{key}\"").as_bytes());
        }
        Ok(())
    }
    async fn prepare(&mut self, _: Prepare) -> Result<flow::DriverCheckpoint> {
        self.note("prepare".into());
        Ok(flow::DriverCheckpoint {
            driver_checkpoint_json: br#"{"staged":1}"#.to_vec(),
            rfc7396_merge_patch: true,
        })
    }
    async fn store(&mut self, _: Store) -> Result<()> {
        self.note("store".into());
        Ok(())
    }
    async fn commit(&mut self) -> Result<()> {
        self.note("commit".into());
        Ok(())
    }
    async fn acknowledge(&mut self) -> Result<()> {
        self.note("acknowledge".into());
        Ok(())
    }
    async fn destroy(self: Box<Self>) {
        self.note("destroy".into());
    }
    async fn artifact_intent(&mut self, txn: u64) -> Result<Option<Value>> {
        self.note(format!("artifact intent {txn}"));
        Ok(Some(json!({ "staging": txn })))
    }
    fn decision(&mut self, txn: u64) -> Option<Value> {
        self.note(format!("decision {txn}"));
        Some(json!({ "decided": txn }))
    }
}

async fn connect_recorder(
    loaded_binding: u32,
) -> (ClientSender, ClientReceiver, Arc<Mutex<Vec<String>>>) {
    let log = Arc::new(Mutex::new(Vec::new()));
    let driver = Recorder {
        log: log.clone(),
        loaded_binding,
    };
    let endpoint = InProcess::new("recorder", Arc::new(driver));
    let spec = spec(MAT, "{}", &[("views", false), ("events", true)]);
    let (tx, rx, _) = client::open(
        endpoint.transactions().await.unwrap(),
        open(&spec, 0, 9),
        TIMEOUT,
    )
    .await
    .unwrap();
    (tx, rx, log)
}

#[tokio::test]
async fn loads_awaiting_acknowledge_are_deferred_until_acknowledge_returns() {
    let (mut tx, mut rx, log) = connect_recorder(0).await;
    tx.load(load(0, &[b"a"])).await.unwrap();
    tx.load(load(0, &[b"b"])).await.unwrap();
    tx.acknowledge().await.unwrap();
    tx.load(load(0, &[b"c"])).await.unwrap();
    expect(&mut rx, "Acknowledged").await;
    tx.prepare(prepare(b"cp")).await.unwrap();
    assert_eq!(
        until_prepared(&mut rx).await,
        vec!["\"a\"", "\"b\"", "\"c\""]
    );
    tx.commit().await.unwrap();
    expect(&mut rx, "DriverCommitted").await;
    // Transaction 2 defers again until its own Acknowledge.
    tx.load(load(0, &[b"d"])).await.unwrap();
    tx.acknowledge().await.unwrap();
    expect(&mut rx, "Acknowledged").await;
    drop(tx);
    assert!(
        rx.recv().await.is_err(),
        "stream ends after the runtime closes it"
    );
    assert_eq!(
        *log.lock().unwrap(),
        vec![
            "acknowledge",
            "load a acknowledged=true",
            "load b acknowledged=true",
            "load c acknowledged=true",
            "prepare",
            "commit",
            "acknowledge",
            "load d acknowledged=true",
            "destroy",
        ]
    );
}

#[tokio::test]
async fn loads_deferred_past_the_memory_bound_wait_in_a_file_and_run_in_order() {
    use sluice_driver_sdk::serve::DEFERRED_IN_MEMORY;
    let (mut tx, mut rx, log) = connect_recorder(0).await;
    // Loads of 50-byte keys, half again more of them than the deferral holds in memory.
    let keys_per_load = 10_000;
    let loads = (DEFERRED_IN_MEMORY * 3 / 2) / (keys_per_load * 50) + 1;
    let key = |i: usize| format!("{i:08}{}", "x".repeat(42));
    for l in 0..loads {
        let keys: Vec<String> = (0..keys_per_load)
            .map(|k| key(l * keys_per_load + k))
            .collect();
        let keys: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
        tx.load(load(0, &keys)).await.unwrap();
    }
    tx.acknowledge().await.unwrap();
    expect(&mut rx, "Acknowledged").await;
    tx.prepare(prepare(b"cp")).await.unwrap();
    let docs = until_prepared(&mut rx).await;
    let expected: Vec<String> = (0..loads * keys_per_load)
        .map(|i| format!("\"{}\"", key(i)))
        .collect();
    assert!(
        docs == expected,
        "every deferred key is loaded once, in order"
    );
    let log = log.lock().unwrap();
    assert_eq!(log[0], "acknowledge");
    assert!(
        log[1..=loads * keys_per_load]
            .iter()
            .all(|l| l.ends_with("acknowledged=true"))
    );
}

#[tokio::test]
async fn driver_loaded_for_a_delta_binding_reaches_the_runtime_as_a_driver_violation() {
    let (mut tx, mut rx, log) = connect_recorder(1).await;
    tx.acknowledge().await.unwrap();
    tx.load(load(0, &[b"a"])).await.unwrap();
    expect(&mut rx, "Acknowledged").await;
    tx.prepare(prepare(b"cp")).await.unwrap();
    let err = rx.recv().await.unwrap_err();
    let Error::Protocol(violation) = &err else {
        panic!("{err}")
    };
    assert_eq!(
        (violation.peer, violation.got.as_str()),
        (Peer::Driver, "Loaded of delta-updates binding 1")
    );
    assert!(
        !log.lock().unwrap().contains(&"prepare".to_string()),
        "the transaction never prepares"
    );
    assert_eq!(log.lock().unwrap().last().unwrap(), "destroy");
}

/// In process, the calls beside the protocol reach the driver where they belong: the
/// log's context before Open, an artifact intent between transactions, a decision after
/// commit; a call after the stream ended fails saying so.
#[tokio::test]
async fn in_process_calls_beside_the_protocol_reach_the_transactor_in_order() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let driver = Recorder {
        log: log.clone(),
        loaded_binding: 0,
    };
    let endpoint = InProcess::new("recorder", Arc::new(driver));
    let mut stream = endpoint.transactions().await.unwrap();
    let hooks = stream.hooks.take().expect("an in-process stream has hooks");
    let context = LogContext {
        deployment_id: "d7".into(),
        undecided: vec![Undecided {
            epoch: 3,
            intent: json!({ "staging": 3 }),
        }],
    };
    hooks.opening(context).await.unwrap();
    let spec = spec(MAT, "{}", &[("views", false), ("events", true)]);
    let (mut tx, mut rx, _) = client::open(stream, open(&spec, 0, 9), TIMEOUT)
        .await
        .unwrap();

    let intent = hooks.artifact_intent(4).await.unwrap();
    assert_eq!(intent, Some(json!({ "staging": 4 })));
    tx.acknowledge().await.unwrap();
    expect(&mut rx, "Acknowledged").await;
    tx.prepare(prepare(br#"{"txn":4}"#)).await.unwrap();
    until_prepared(&mut rx).await;
    tx.commit().await.unwrap();
    expect(&mut rx, "DriverCommitted").await;
    assert_eq!(
        hooks.decision(4).await.unwrap(),
        Some(json!({ "decided": 4 }))
    );
    drop(tx);
    assert!(rx.recv().await.is_err(), "the stream ends once closed");
    let err = hooks.decision(5).await.unwrap_err().to_string();
    assert!(err.contains("Transactions stream has ended"), "{err}");
    assert_eq!(
        *log.lock().unwrap(),
        vec![
            "open in d7 undecided [3]",
            "artifact intent 4",
            "acknowledge",
            "prepare",
            "commit",
            "decision 4",
            "destroy",
        ]
    );
}
