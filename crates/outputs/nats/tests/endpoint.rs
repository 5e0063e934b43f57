//! The nats output against the local nats-server (127.0.0.1:4222, JetStream on): each
//! test publishes to a stream and subject of its own, deleted when it ends.

use serde_json::{Value, json};
use sluice_nats::admin::Admin;
use sluice_nats_output::read::{StoredMessage, read_subject};
use sluice_nats_output::{Stamp, kind};
use sluice_output_sdk::{
    BatchKind, Buffer, Format, Generation, GenerationId, OutputEndpoint, OutputError, Target,
};
use sluice_testkit::conformance::{run_detached, unique_name};
use std::time::Duration;

const URL: &str = "nats://127.0.0.1:4222";
const MATERIALIZATION: &str = "acme/views";
/// The duplicate window of the streams the crash tests make: short enough to sleep
/// past, so that only the tail can discard what a replay repeats.
const DUPLICATE_WINDOW: Duration = Duration::from_secs(1);

/// A new generation (what a new view mints).
fn new_generation() -> Generation {
    Generation {
        id: GenerationId::mint(),
        adopts_unstamped: false,
    }
}

/// A stream and subject of this test's own; the stream is deleted when the test ends.
/// Its endpoints are instances of one generation unless a test says otherwise.
struct Fixture {
    stream: String,
    subject: String,
    generation: Generation,
}

impl Fixture {
    fn new() -> Fixture {
        let name = unique_name();
        Fixture {
            stream: format!("OUT_{name}"),
            subject: format!("out.{name}"),
            generation: new_generation(),
        }
    }

    /// An endpoint publishing to `subject` (the endpoint config's `stream` is the
    /// fixture's), with `extra` endpoint settings.
    fn endpoint_for(&self, subject: &str, extra: Value) -> Box<dyn OutputEndpoint> {
        self.endpoint_of(self.generation, subject, extra)
    }

    /// An endpoint of `generation` publishing to `subject`.
    fn endpoint_of(
        &self,
        generation: Generation,
        subject: &str,
        extra: Value,
    ) -> Box<dyn OutputEndpoint> {
        let mut config = json!({"url": URL, "stream": self.stream});
        for (k, v) in extra.as_object().unwrap() {
            config[k] = v.clone();
        }
        let target = Target {
            materialization: MATERIALIZATION.into(),
            resource: json!({ "subject": subject }),
            format: Format::Json,
            header: None,
            generation,
            former_writers: true,
        };
        (kind().endpoint)(&config, target).unwrap()
    }

    fn endpoint(&self, extra: Value) -> Box<dyn OutputEndpoint> {
        self.endpoint_for(&self.subject, extra)
    }

    /// Another subject, which [`Fixture::with_short_duplicate_window`] may put in the
    /// stream too.
    fn other_subject(&self) -> String {
        format!("{}.other", self.subject)
    }

    /// Makes the stream holding the subject (and the other subject too, if `shared`)
    /// with a [`DUPLICATE_WINDOW`] (the endpoint then finds it rather than creating one
    /// with the default two minutes).
    async fn with_short_duplicate_window(&self, shared: bool) {
        let js = async_nats::jetstream::new(async_nats::connect(URL).await.unwrap());
        let mut subjects = vec![self.subject.clone()];
        if shared {
            subjects.push(self.other_subject());
        }
        let stream = js
            .create_stream(async_nats::jetstream::stream::Config {
                name: self.stream.clone(),
                subjects,
                duplicate_window: DUPLICATE_WINDOW,
                ..Default::default()
            })
            .await
            .unwrap();
        assert_eq!(
            stream.cached_info().config.duplicate_window,
            DUPLICATE_WINDOW
        );
    }

    async fn read(&self) -> Vec<StoredMessage> {
        read_subject(URL, &self.subject).await.unwrap()
    }

    /// Waits until the subject holds `count` messages (publishes in flight landed).
    async fn wait_for(&self, count: usize) {
        for _ in 0..500 {
            if self.read().await.len() >= count {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("the subject never held {count} messages");
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let stream = self.stream.clone();
        run_detached(async move {
            if let Ok(admin) = Admin::connect(URL).await {
                admin.delete_stream(&stream).await.ok();
            }
        });
    }
}

fn key(index: u64) -> Vec<u8> {
    json!({ "id": index }).to_string().into_bytes()
}

fn value(txn: u64, index: u64) -> Vec<u8> {
    json!({"insert": {"id": index, "txn": txn}})
        .to_string()
        .into_bytes()
}

/// Pushes transaction `txn`'s messages `0..count`, `per_push` at a time, without
/// ending the batch.
async fn push_messages(
    endpoint: &mut dyn OutputEndpoint,
    buffer: &mut Buffer,
    txn: u64,
    count: u64,
    per_push: u64,
) {
    for index in 0..count {
        buffer.push(&key(index), &value(txn, index));
        if buffer.len() as u64 == per_push || index + 1 == count {
            endpoint.push(buffer).await.unwrap();
            buffer.pushed();
        }
    }
}

/// Writes transaction `txn` whole: `count` messages, `per_push` at a time.
async fn write(
    endpoint: &mut dyn OutputEndpoint,
    txn: u64,
    kind: BatchKind,
    count: u64,
    per_push: u64,
) {
    let mut buffer = Buffer::default();
    buffer.start(txn);
    endpoint.batch_start(txn, kind).await.unwrap();
    push_messages(endpoint, &mut buffer, txn, count, per_push).await;
    endpoint.batch_end().await.unwrap();
}

fn places(messages: &[StoredMessage]) -> Vec<(u64, u64)> {
    messages
        .iter()
        .map(|m| (m.stamp.txn, m.stamp.index))
        .collect()
}

/// `(txn, index)` of transactions `(txn, count)`, in order.
fn expected(transactions: &[(u64, u64)]) -> Vec<(u64, u64)> {
    (transactions.iter())
        .flat_map(|&(txn, count)| (0..count).map(move |index| (txn, index)))
        .collect()
}

#[tokio::test]
async fn transactions_come_back_in_order_with_their_headers() {
    let fx = Fixture::new();
    let mut endpoint = fx.endpoint(json!({"max_in_flight": 2}));
    endpoint.open().await.unwrap();
    write(&mut *endpoint, 1, BatchKind::Snapshot, 3, 3).await;
    write(&mut *endpoint, 2, BatchKind::Delta, 7, 3).await;
    // A key a header cannot carry verbatim is left out; the message is not.
    let mut buffer = Buffer::default();
    buffer.start(3);
    endpoint.batch_start(3, BatchKind::Delta).await.unwrap();
    buffer.push(b"\x02\xff", b"binary");
    endpoint.push(&buffer).await.unwrap();
    endpoint.batch_end().await.unwrap();
    endpoint.close().await;

    let read = fx.read().await;
    assert_eq!(places(&read), expected(&[(1, 3), (2, 7), (3, 1)]));
    let last_of_1 = read[2].sequence;
    let last_of_2 = read[9].sequence;
    for message in &read[..10] {
        let Stamp {
            generation,
            txn,
            index,
            batch,
            after,
        } = message.stamp;
        assert_eq!(generation, Some(fx.generation.id));
        assert_eq!(
            message.msg_id,
            format!(
                "{MATERIALIZATION}/{}/{}/{txn}/{index}",
                fx.subject, fx.generation.id
            )
        );
        assert_eq!(
            message.key.as_deref().map(str::as_bytes),
            Some(&key(index)[..])
        );
        assert_eq!(message.payload, value(txn, index));
        let (kind, begins_after) = match txn {
            1 => (BatchKind::Snapshot, 0),
            _ => (BatchKind::Delta, last_of_1),
        };
        assert_eq!((batch, after), (kind, begins_after), "{message:?}");
    }
    assert_eq!(read[10].key, None);
    assert_eq!(read[10].payload, &b"binary"[..]);
    assert_eq!(read[10].stamp.after, last_of_2);
    assert!(read.windows(2).all(|w| w[0].sequence < w[1].sequence));
    // The endpoint's `stream` was created for the subject.
    let admin = async_nats::jetstream::new(async_nats::connect(URL).await.unwrap());
    let stream = admin.get_stream(&fx.stream).await.unwrap();
    assert_eq!(
        stream.cached_info().config.subjects,
        vec![fx.subject.clone()]
    );
}

#[tokio::test]
async fn bindings_without_a_stream_share_the_configured_one() {
    let fx = Fixture::new();
    let other = format!("{}.other", fx.subject);
    let mut first = fx.endpoint(json!({}));
    let mut second = fx.endpoint_for(&other, json!({}));
    first.open().await.unwrap();
    second.open().await.unwrap();
    write(&mut *first, 1, BatchKind::Delta, 2, 2).await;
    write(&mut *second, 1, BatchKind::Delta, 3, 2).await;
    assert_eq!(places(&fx.read().await), expected(&[(1, 2)]));
    assert_eq!(
        places(&read_subject(URL, &other).await.unwrap()),
        expected(&[(1, 3)])
    );
    let admin = async_nats::jetstream::new(async_nats::connect(URL).await.unwrap());
    let stream = admin.get_stream(&fx.stream).await.unwrap();
    assert_eq!(
        stream.cached_info().config.subjects,
        vec![fx.subject.clone(), other]
    );
}

#[tokio::test]
async fn a_transaction_interrupted_by_a_crash_is_completed_exactly_once() {
    let fx = Fixture::new();
    fx.with_short_duplicate_window(false).await;
    let mut crashed = fx.endpoint(json!({"max_in_flight": 1}));
    crashed.open().await.unwrap();
    write(&mut *crashed, 1, BatchKind::Delta, 4, 4).await;
    let mut buffer = Buffer::default();
    buffer.start(2);
    crashed.batch_start(2, BatchKind::Delta).await.unwrap();
    // One publish in flight: pushing three returns once the first two are stored.
    push_messages(&mut *crashed, &mut buffer, 2, 3, 3).await;
    drop(crashed);
    // Past the duplicate window, the stream would store the replay's copies again.
    tokio::time::sleep(DUPLICATE_WINDOW + Duration::from_millis(500)).await;
    let held = places(&fx.read().await);
    assert!(held.len() == 6 || held.len() == 7, "{held:?}");

    let mut restarted = fx.endpoint(json!({}));
    restarted.open().await.unwrap();
    write(&mut *restarted, 2, BatchKind::Delta, 6, 4).await;
    write(&mut *restarted, 3, BatchKind::Delta, 2, 2).await;

    let read = fx.read().await;
    assert_eq!(places(&read), expected(&[(1, 4), (2, 6), (3, 2)]));
    // Transaction 2's messages all count from where it began, before the crash.
    assert!(
        read[4..10]
            .iter()
            .all(|m| m.stamp.after == read[3].sequence)
    );
}

#[tokio::test]
async fn a_batch_aborted_and_replayed_by_the_same_endpoint_is_written_once() {
    let fx = Fixture::new();
    let mut endpoint = fx.endpoint(json!({"max_in_flight": 2}));
    endpoint.open().await.unwrap();
    let mut buffer = Buffer::default();
    buffer.start(1);
    endpoint.batch_start(1, BatchKind::Delta).await.unwrap();
    push_messages(&mut *endpoint, &mut buffer, 1, 3, 3).await;
    endpoint.abort().await;
    write(&mut *endpoint, 1, BatchKind::Delta, 5, 2).await;
    assert_eq!(places(&fx.read().await), expected(&[(1, 5)]));
}

#[tokio::test]
async fn a_transaction_written_whole_is_discarded_when_replayed() {
    let fx = Fixture::new();
    fx.with_short_duplicate_window(false).await;
    let mut first = fx.endpoint(json!({}));
    first.open().await.unwrap();
    write(&mut *first, 1, BatchKind::Delta, 3, 3).await;
    write(&mut *first, 2, BatchKind::Delta, 2, 1).await;
    drop(first);
    tokio::time::sleep(DUPLICATE_WINDOW + Duration::from_millis(500)).await;

    let mut replaying = fx.endpoint(json!({}));
    replaying.open().await.unwrap();
    write(&mut *replaying, 2, BatchKind::Delta, 2, 2).await;
    assert_eq!(fx.read().await.len(), 5);
    write(&mut *replaying, 3, BatchKind::Delta, 1, 1).await;
    assert_eq!(
        places(&fx.read().await),
        expected(&[(1, 3), (2, 2), (3, 1)])
    );
}

#[tokio::test]
async fn a_new_generation_publishes_every_transaction_after_an_old_generations_tail() {
    let fx = Fixture::new();
    let mut old = fx.endpoint(json!({}));
    old.open().await.unwrap();
    for txn in 1..=3 {
        write(&mut *old, txn, BatchKind::Delta, 2, 2).await;
    }
    drop(old);
    // A reset: a new view, a new generation, transactions numbered from 1 again, in the
    // duplicate window of the old ones (the same numbers would be dropped as duplicates
    // if the generation were not in Nats-Msg-Id).
    let new = new_generation();
    let mut endpoint = fx.endpoint_of(new, &fx.subject, json!({}));
    endpoint.open().await.unwrap();
    write(&mut *endpoint, 1, BatchKind::Delta, 3, 2).await;
    write(&mut *endpoint, 2, BatchKind::Delta, 1, 1).await;
    drop(endpoint);
    // A restart of the new generation discards its own transaction 2 when replayed.
    let mut restarted = fx.endpoint_of(new, &fx.subject, json!({}));
    restarted.open().await.unwrap();
    write(&mut *restarted, 2, BatchKind::Delta, 1, 1).await;
    write(&mut *restarted, 3, BatchKind::Delta, 1, 1).await;

    let read = fx.read().await;
    let stamped: Vec<_> = (read.iter())
        .map(|m| (m.stamp.generation, m.stamp.txn, m.stamp.index))
        .collect();
    let (old_id, new_id) = (Some(fx.generation.id), Some(new.id));
    let mut want: Vec<_> = (expected(&[(1, 2), (2, 2), (3, 2)]).into_iter())
        .map(|(txn, index)| (old_id, txn, index))
        .collect();
    want.extend(
        (expected(&[(1, 3), (2, 1), (3, 1)]).into_iter()).map(|(txn, index)| (new_id, txn, index)),
    );
    assert_eq!(stamped, want);
    // The new generation's first transaction counts from the old one's last message.
    assert!(read[6..9].iter().all(|m| m.stamp.after == read[5].sequence));
}

#[tokio::test]
async fn a_foreign_message_at_the_end_of_the_subject_is_corrupt() {
    let fx = Fixture::new();
    let mut endpoint = fx.endpoint(json!({}));
    endpoint.open().await.unwrap();
    write(&mut *endpoint, 1, BatchKind::Delta, 2, 2).await;
    let admin = Admin::connect(URL).await.unwrap();
    admin
        .publish(&fx.subject, &[("X-Other", "1")], "not ours".into())
        .await
        .unwrap();

    let mut reopened = fx.endpoint(json!({}));
    let error = reopened.open().await.unwrap_err();
    let OutputError::Corrupt(message) = &error else {
        panic!("{error:?}");
    };
    for needle in [fx.stream.as_str(), &fx.subject, "no Sluice-Txn header"] {
        assert!(message.contains(needle), "{message}");
    }
}

#[tokio::test]
async fn a_gap_in_the_last_transaction_is_corrupt() {
    let fx = Fixture::new();
    let mut endpoint = fx.endpoint(json!({}));
    endpoint.open().await.unwrap();
    write(&mut *endpoint, 1, BatchKind::Delta, 2, 2).await;
    write(&mut *endpoint, 2, BatchKind::Delta, 5, 5).await;
    let read = fx.read().await;
    // As if transaction 2's message 2 were lost while 3 and 4 were stored.
    let admin = Admin::connect(URL).await.unwrap();
    admin
        .delete_message(&fx.stream, read[4].sequence)
        .await
        .unwrap();

    let mut reopened = fx.endpoint(json!({}));
    let error = reopened.open().await.unwrap_err();
    let OutputError::Corrupt(message) = &error else {
        panic!("{error:?}");
    };
    for needle in [
        fx.stream.as_str(),
        &fx.subject,
        "should hold 5 messages",
        "holds 4",
    ] {
        assert!(message.contains(needle), "{message}");
    }
}

#[tokio::test]
async fn an_unreachable_server_is_a_retryable_error_naming_it() {
    let target = Target {
        materialization: MATERIALIZATION.into(),
        resource: json!({"subject": "out.nowhere"}),
        format: Format::Json,
        header: None,
        generation: new_generation(),
        former_writers: true,
    };
    let url = "nats://127.0.0.1:1";
    let mut endpoint = (kind().endpoint)(&json!({ "url": url }), target).unwrap();
    let error = endpoint.open().await.unwrap_err();
    assert!(error.is_retryable(), "{error:?}");
    for needle in [url, "out.nowhere"] {
        assert!(error.to_string().contains(needle), "{error}");
    }
}

/// Past the stream's duplicate window, where only the fence can refuse a copy.
async fn outlast_the_duplicate_window() {
    tokio::time::sleep(DUPLICATE_WINDOW + Duration::from_millis(500)).await;
}

/// The error of pushing `buffer` and ending the batch, which must fail: a pipelined
/// push returns before its acks, whose refusal then fails the batch's end.
async fn refused(endpoint: &mut dyn OutputEndpoint, buffer: &Buffer) -> OutputError {
    match endpoint.push(buffer).await {
        Err(error) => error,
        Ok(()) => endpoint.batch_end().await.unwrap_err(),
    }
}

fn assert_another_writer(fx: &Fixture, error: &OutputError) {
    assert!(error.is_retryable(), "{error:?}");
    let message = error.to_string();
    for needle in [
        fx.stream.as_str(),
        "was refused",
        &format!("Another writer appended to subject {}", fx.subject),
    ] {
        assert!(message.contains(needle), "{message}");
    }
}

/// A former holder Z of the shard, paused mid-transaction while a new holder H took
/// over, replayed the transaction whole and went on: Z's late publishes of the rest of
/// it are refused, and the subject holds every message once, in order. `shared`: the
/// stream holds another subject too, whose messages H interleaves with its own.
async fn a_former_writers_late_messages_are_refused(shared: bool) {
    let fx = Fixture::new();
    fx.with_short_duplicate_window(shared).await;
    let mut former = fx.endpoint(json!({}));
    former.open().await.unwrap();
    write(&mut *former, 1, BatchKind::Delta, 3, 3).await;
    let mut late = Buffer::default();
    late.start(2);
    former.batch_start(2, BatchKind::Delta).await.unwrap();
    push_messages(&mut *former, &mut late, 2, 3, 3).await;
    for index in 3..5 {
        late.push(&key(index), &value(2, index));
    }
    // Its last publish may still be in flight: the new holder reads the tail after it.
    fx.wait_for(6).await;

    let mut holder = fx.endpoint(json!({}));
    holder.open().await.unwrap();
    let mut other = shared.then(|| fx.endpoint_for(&fx.other_subject(), json!({})));
    if let Some(other) = &mut other {
        other.open().await.unwrap();
    }
    for (txn, count) in [(2, 5), (3, 2)] {
        write(&mut *holder, txn, BatchKind::Delta, count, 2).await;
        if let Some(other) = &mut other {
            write(&mut **other, txn, BatchKind::Delta, 1, 1).await;
        }
    }
    outlast_the_duplicate_window().await;

    let error = refused(&mut *former, &late).await;
    assert_another_writer(&fx, &error);
    let want = expected(&[(1, 3), (2, 5), (3, 2)]);
    assert_eq!(places(&fx.read().await), want);
    // What the runtime does next: it replays the transaction, of which the former
    // holder now finds the subject holds everything (its view commit is then fenced).
    write(&mut *former, 2, BatchKind::Delta, 5, 5).await;
    // The new holder goes on undisturbed.
    write(&mut *holder, 4, BatchKind::Delta, 2, 2).await;
    let read = fx.read().await;
    assert_eq!(places(&read), expected(&[(1, 3), (2, 5), (3, 2), (4, 2)]));
    assert!(read.windows(2).all(|w| w[0].sequence < w[1].sequence));
}

#[tokio::test]
async fn a_former_writers_late_messages_are_refused_when_publishes_are_pipelined() {
    a_former_writers_late_messages_are_refused(false).await;
}

#[tokio::test]
async fn a_former_writers_late_messages_are_refused_in_a_stream_shared_by_subjects() {
    a_former_writers_late_messages_are_refused(true).await;
}

/// The fence's edge: an endpoint that read the subject empty expects "no message"
/// (sequence 0), which the server checks as any other sequence.
#[tokio::test]
async fn a_former_writer_that_found_the_subject_empty_is_refused() {
    let fx = Fixture::new();
    fx.with_short_duplicate_window(false).await;
    let mut former = fx.endpoint(json!({}));
    former.open().await.unwrap();
    let mut holder = fx.endpoint(json!({}));
    holder.open().await.unwrap();
    write(&mut *holder, 1, BatchKind::Delta, 2, 2).await;
    write(&mut *holder, 2, BatchKind::Delta, 1, 1).await;
    outlast_the_duplicate_window().await;

    let mut late = Buffer::default();
    late.start(1);
    former.batch_start(1, BatchKind::Delta).await.unwrap();
    for index in 0..2 {
        late.push(&key(index), &value(1, index));
    }
    let error = refused(&mut *former, &late).await;
    assert_another_writer(&fx, &error);
    assert!(
        error.to_string().contains("sequence 0 (0: none)"),
        "{error}"
    );
    assert_eq!(places(&fx.read().await), expected(&[(1, 2), (2, 1)]));
}

/// A stream that starts holding another subject while an endpoint publishes pipelined
/// (each publish expecting the stream to end with the one before it): the other
/// subject's message in between has the rest of the batch refused, nothing stored out
/// of order, and the next attempt publishes one at a time, exactly.
#[tokio::test]
async fn a_stream_taking_another_subject_midway_refuses_the_rest_then_publishes_one_at_a_time() {
    let fx = Fixture::new();
    let mut endpoint = fx.endpoint(json!({}));
    endpoint.open().await.unwrap();
    write(&mut *endpoint, 1, BatchKind::Delta, 2, 2).await;
    // Another binding under the same `stream` adds its subject and publishes.
    let mut other = fx.endpoint_for(&fx.other_subject(), json!({}));
    other.open().await.unwrap();
    write(&mut *other, 1, BatchKind::Delta, 1, 1).await;

    let mut buffer = Buffer::default();
    buffer.start(2);
    endpoint.batch_start(2, BatchKind::Delta).await.unwrap();
    for index in 0..3 {
        buffer.push(&key(index), &value(2, index));
    }
    let error = refused(&mut *endpoint, &buffer).await;
    assert!(error.is_retryable(), "{error:?}");
    for needle in ["was refused", "wrong last msg ID", &fx.other_subject()] {
        assert!(error.to_string().contains(needle), "{error}");
    }
    write(&mut *endpoint, 2, BatchKind::Delta, 3, 3).await;
    write(&mut *other, 2, BatchKind::Delta, 1, 1).await;
    write(&mut *endpoint, 3, BatchKind::Delta, 2, 1).await;
    assert_eq!(
        places(&fx.read().await),
        expected(&[(1, 2), (2, 3), (3, 2)])
    );
}
