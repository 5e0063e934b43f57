//! The HTTP source driven as the runtime drives it, with real requests over loopback
//! (each test's server on a port of its own, `listen: 127.0.0.1:0`): answers only at
//! commit, whole bodies per step, replay of journaled steps, idempotency keys across
//! restarts, limits, and the answers of a closing source.

use serde_json::{Value, json};
use sluice_http::client::{Client, Response};
use sluice_http::{HttpConfig, HttpSource};
use sluice_source_sdk::testing::{ALL, texts};
use sluice_source_sdk::{QueueLimits, Records, Resume, Source, Step};
use std::net::SocketAddr;
use std::path::Path;
use std::thread::JoinHandle;

const TOKEN: &str = "s3cret";

fn config(extra: Value) -> HttpConfig {
    let mut config = json!({"listen": "127.0.0.1:0", "token": TOKEN});
    for (k, v) in extra.as_object().unwrap() {
        config[k] = v.clone();
    }
    let mut config: HttpConfig = serde_json::from_value(config).unwrap();
    config.check(Path::new(".")).unwrap();
    config
}

/// A source serving from `state` (an empty first step starts the server).
async fn serving(config: &HttpConfig, state: &Path) -> (HttpSource, SocketAddr) {
    let mut source = HttpSource::new("views", config, state.to_path_buf());
    source.extend();
    let step = source.queue(ALL, &mut Records::default()).await.unwrap();
    assert_eq!(step.records, 0);
    let address = source.address().unwrap();
    (source, address)
}

/// Posts `body` on a thread of its own (it waits for its commit); returns its answer.
fn post(address: SocketAddr, key: Option<&str>, body: &str) -> JoinHandle<Response> {
    let (key, body) = (key.map(str::to_string), body.to_string());
    std::thread::spawn(move || {
        Client::new(address, TOKEN)
            .ingest("views", key.as_deref(), body.as_bytes())
            .unwrap()
    })
}

/// Queues until `n` records came (requests in flight arrive when they arrive).
async fn queue_until(source: &mut HttpSource, n: usize, limits: QueueLimits) -> (Step, Records) {
    let mut out = Records::default();
    loop {
        tokio::time::timeout(std::time::Duration::from_secs(30), source.ready())
            .await
            .expect("a body arrives");
        let step = source.queue(limits, &mut out).await.unwrap();
        if step.records > 0 {
            assert_eq!(step.records, n, "{:?}", texts(&mut out));
            return (step, out);
        }
    }
}

fn seq(step: &Step) -> Value {
    step.resume.position().unwrap().clone()
}

async fn join(handle: JoinHandle<Response>) -> Response {
    tokio::task::spawn_blocking(move || handle.join().unwrap())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_is_answered_only_when_its_transaction_commits() {
    let dir = tempfile::tempdir().unwrap();
    let (mut source, address) = serving(&config(json!({})), dir.path()).await;
    let request = post(address, None, "{\"id\": 1}\n{\"id\": 2}\n");
    let (step, mut out) = queue_until(&mut source, 2, ALL).await;
    assert_eq!(texts(&mut out), ["{\"id\": 1}", "{\"id\": 2}"]);
    assert_eq!(seq(&step), json!({"seq": 1}));
    assert!(!request.is_finished(), "answered before its commit");
    // A commit of an earlier position answers nothing.
    source.committed(6, &json!({"seq": 0}));
    assert!(!request.is_finished());
    source.committed(7, &json!({"seq": 1}));
    let answer = join(request).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.json(), json!({"txn": 7, "documents": 2}));
    source.disconnect().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steps_hold_whole_bodies_and_replay_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let (mut source, address) = serving(&config(json!({})), dir.path()).await;
    let first = post(address, Some("k1"), "[{\"a\": 1}, {\"a\": 2}, {\"a\": 3}]");
    let (step, mut out) = queue_until(&mut source, 3, ALL).await;
    let second = post(address, None, "{\"b\": 1}\n{\"b\": 2}\n");
    // A limit smaller than a body still hands the whole body, alone.
    let limits = QueueLimits {
        max_records: 1,
        max_bytes: 1,
        max_journaled: u64::MAX,
    };
    let (step2, mut out2) = queue_until(&mut source, 2, limits).await;
    assert_eq!(texts(&mut out2), ["{\"b\": 1}", "{\"b\": 2}"]);
    // Replayed (a rebuild): the same records and hash.
    let mut again = Records::default();
    let replayed = source.replay(&step.resume, &mut again).await.unwrap();
    assert_eq!(replayed.resume, step.resume);
    assert_eq!(texts(&mut again), texts(&mut out));
    // A journaled step whose data changed is refused.
    let Resume::Replay {
        position,
        data: Some(mut data),
        hash,
    } = step2.resume.clone()
    else {
        panic!("a replayable step");
    };
    *data.last_mut().unwrap() = b']';
    let changed = Resume::Replay {
        position,
        data: Some(data),
        hash,
    };
    let error = source
        .replay(&changed, &mut Records::default())
        .await
        .unwrap_err();
    assert!(error.to_string().contains("differs"), "{error}");
    source.committed(3, &seq(&step2));
    assert_eq!(join(first).await.json(), json!({"txn": 3, "documents": 3}));
    assert_eq!(join(second).await.json(), json!({"txn": 3, "documents": 2}));
    source.disconnect().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_committed_key_answers_its_original_outcome_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(json!({}));
    let (mut source, address) = serving(&config, dir.path()).await;
    let request = post(address, Some("order-17"), "{\"n\": 1}");
    let (step, _) = queue_until(&mut source, 1, ALL).await;
    // A retry while the first is pending waits for the same outcome.
    let retry = post(address, Some("order-17"), "{\"n\": 1}");
    source.committed(4, &seq(&step));
    assert_eq!(
        join(request).await.json(),
        json!({"txn": 4, "documents": 1})
    );
    assert_eq!(join(retry).await.json(), json!({"txn": 4, "documents": 1}));
    // After the commit: answered at once, nothing queued.
    let late = join(post(address, Some("order-17"), "{\"n\": 1}")).await;
    assert_eq!(late.json(), json!({"txn": 4, "documents": 1}));
    assert_eq!(source.queued().records, 0);
    drop(source); // no disconnect: as a killed run leaves it

    // Restarted from transaction 6 (the store's checkpoint): the key committed in 4.
    let mut source = HttpSource::new("views", &config, dir.path().to_path_buf());
    source.seek(&json!({"seq": 1})).await.unwrap();
    source.committed(6, &json!({"seq": 1}));
    source.extend();
    source.queue(ALL, &mut Records::default()).await.unwrap();
    let address = source.address().unwrap();
    let again = join(post(address, Some("order-17"), "{\"n\": 1}")).await;
    assert_eq!(again.json(), json!({"txn": 4, "documents": 1}));
    assert_eq!(source.queued().records, 0);
    // New bodies are numbered after the recovered ones.
    let next = post(address, None, "{\"n\": 2}");
    let (step, _) = queue_until(&mut source, 1, ALL).await;
    assert_eq!(seq(&step), json!({"seq": 2}));
    source.committed(7, &seq(&step));
    assert_eq!(join(next).await.json(), json!({"txn": 7, "documents": 1}));
    source.disconnect().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_of_the_interrupted_transaction_commits_with_its_replay() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(json!({}));
    let (mut source, address) = serving(&config, dir.path()).await;
    let request = post(address, Some("k"), "{\"n\": 1}");
    let (journaled, _) = queue_until(&mut source, 1, ALL).await;
    // Another keyed body, accepted but never in a journaled step: forgotten on restart.
    let lost = post(address, Some("lost"), "{\"n\": 2}");
    queue_until(&mut source, 1, ALL).await;
    drop(source);
    assert_eq!(join(request).await.status, 503);
    assert_eq!(join(lost).await.status, 503);

    // Recovery: nothing committed yet; the journaled step is replayed.
    let mut source = HttpSource::new("views", &config, dir.path().to_path_buf());
    source.extend();
    let mut out = Records::default();
    source.replay(&journaled.resume, &mut out).await.unwrap();
    assert_eq!(texts(&mut out), ["{\"n\": 1}"]);
    source.queue(ALL, &mut Records::default()).await.unwrap();
    let address = source.address().unwrap();
    // The retry of the replayed key waits for the replayed transaction's commit.
    let retry = post(address, Some("k"), "{\"n\": 1}");
    // The forgotten one is applied anew, numbered after the replayed step.
    let lost_again = post(address, Some("lost"), "{\"n\": 2}");
    let (step, _) = queue_until(&mut source, 1, ALL).await;
    assert_eq!(seq(&step), json!({"seq": 2}));
    source.committed(1, &seq(&journaled));
    assert_eq!(join(retry).await.json(), json!({"txn": 1, "documents": 1}));
    source.committed(2, &seq(&step));
    assert_eq!(
        join(lost_again).await.json(),
        json!({"txn": 2, "documents": 1})
    );
    source.disconnect().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_buffer_answers_429_and_a_closing_source_503() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(json!({"max_body_bytes": 64, "max_buffered_bytes": 64}));
    let (mut source, address) = serving(&config, dir.path()).await;
    let body = format!("{{\"pad\": \"{}\"}}", "x".repeat(40));
    let queued = post(address, None, &body);
    while source.queued().records == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let busy = join(post(address, None, &body)).await;
    assert_eq!(busy.status, 429, "{}", String::from_utf8_lossy(&busy.body));
    assert_eq!(busy.header("retry-after"), Some("1"));
    // Paused by the runtime: refused likewise, whatever the buffer holds.
    let (step, _) = queue_until(&mut source, 1, ALL).await;
    source.pause();
    assert_eq!(join(post(address, None, "{}")).await.status, 429);
    source.extend();
    let handed = post(address, None, "{\"n\": 1}");
    queue_until(&mut source, 1, ALL).await;
    let waiting = post(address, None, "{\"n\": 2}");
    while source.queued().records == 0 {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    source.committed(1, &seq(&step));
    assert_eq!(join(queued).await.status, 200);
    // Shutdown: the body in a step but not committed may have been applied; the one
    // never handed was not; both are told to retry.
    source.disconnect().await;
    let handed = join(handed).await;
    assert_eq!(handed.status, 503);
    assert!(
        String::from_utf8_lossy(&handed.body).contains("may or may not"),
        "{}",
        String::from_utf8_lossy(&handed.body)
    );
    let waiting = join(waiting).await;
    assert_eq!(waiting.status, 503);
    assert!(String::from_utf8_lossy(&waiting.body).contains("not applied"));
    assert!(
        Client::new(address, TOKEN)
            .ingest("views", None, b"{}")
            .is_err(),
        "the listener is closed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_instance_on_the_same_address_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let (source, address) = serving(&config(json!({})), dir.path()).await;
    let taken = config(json!({"listen": address.to_string()}));
    let other = tempfile::tempdir().unwrap();
    let mut second = HttpSource::new("views", &taken, other.path().to_path_buf());
    let error = second
        .queue(ALL, &mut Records::default())
        .await
        .unwrap_err();
    let text = error.to_string();
    assert!(
        text.contains(&format!("cannot listen on {address}"))
            && text.contains("two materializations"),
        "{text}"
    );
    drop(source);
}

/// A cluster's shard (`keeping_keys_in_positions`): no keys file; a new holder on
/// another machine (another state folder) knows the key its predecessor committed from
/// the position alone, and the key of the interrupted transaction from its replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_travel_in_the_positions_to_a_new_holder() {
    let config = config(json!({}));
    let (old_dir, new_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut source =
        HttpSource::new("views", &config, old_dir.path().to_path_buf()).keeping_keys_in_positions();
    source.extend();
    source.queue(ALL, &mut Records::default()).await.unwrap();
    let address = source.address().unwrap();
    let request = post(address, Some("order-17"), "{\"n\": 1}");
    let (committed, _) = queue_until(&mut source, 1, ALL).await;
    let position = seq(&committed);
    assert_eq!(position["seq"], 1);
    // [seq, docs, dead_lettered, accepted at, txn: not known yet]
    let carried = position["keys"]["order-17"].as_array().unwrap();
    assert_eq!(
        (&carried[..3], &carried[4]),
        (&[json!(1), json!(1), json!(0)][..], &Value::Null)
    );
    source.committed(4, &position);
    assert_eq!(
        join(request).await.json(),
        json!({"txn": 4, "documents": 1})
    );
    let interrupted = post(address, Some("k2"), "{\"n\": 2}");
    let (journaled, _) = queue_until(&mut source, 1, ALL).await;
    drop(source); // killed before transaction 5 committed
    assert_eq!(join(interrupted).await.status, 503);
    assert!(!old_dir.path().join("keys.jsonl").exists());

    let mut source =
        HttpSource::new("views", &config, new_dir.path().to_path_buf()).keeping_keys_in_positions();
    source.seek(&position).await.unwrap();
    source.committed(4, &position);
    source.extend();
    let mut out = Records::default();
    source.replay(&journaled.resume, &mut out).await.unwrap();
    source.queue(ALL, &mut Records::default()).await.unwrap();
    let address = source.address().unwrap();
    let again = join(post(address, Some("order-17"), "{\"n\": 1}")).await;
    assert_eq!(again.json(), json!({"txn": 4, "documents": 1}));
    let retry = post(address, Some("k2"), "{\"n\": 2}");
    std::thread::sleep(std::time::Duration::from_millis(100));
    assert_eq!(
        source.queued().records,
        0,
        "a known key is never queued again"
    );
    source.committed(5, &seq(&journaled));
    assert_eq!(join(retry).await.json(), json!({"txn": 5, "documents": 1}));
    assert!(!new_dir.path().join("keys.jsonl").exists());
    source.disconnect().await;
}
