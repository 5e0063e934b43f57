//! The NATS source against the local nats-server (127.0.0.1:4222, JetStream on): each
//! test makes a stream of its own and deletes it afterwards.

use bytes::Bytes;
use serde_json::{Value, json};
use sluice_nats::admin::Admin;
use sluice_nats::{NatsConfig, NatsSource};
use sluice_source_sdk::testing::{ALL, parsed_docs, records, texts};
use sluice_source_sdk::{QueueLimits, Records, Resume, Source, SourceError, Step};
use sluice_testkit::conformance::unique_name;
use std::time::Duration;

const URL: &str = "nats://127.0.0.1:4222";

/// A stream of this test's own, deleted when the test ends (passed or not).
struct Fixture {
    stream: String,
    admin: Admin,
}

impl Fixture {
    async fn new() -> Fixture {
        let fx = Fixture::named().await;
        fx.admin
            .create_stream(&fx.stream, &[&format!("{}.>", fx.stream)])
            .await
            .unwrap();
        fx
    }

    /// A unique name; no stream made yet.
    async fn named() -> Fixture {
        let stream = format!("SRC_{}", unique_name());
        Fixture {
            stream,
            admin: Admin::connect(URL).await.unwrap(),
        }
    }

    fn subject(&self, leaf: &str) -> String {
        format!("{}.{leaf}", self.stream)
    }

    /// Publishes `docs` to `<stream>.views`; returns the last sequence.
    async fn publish(&self, docs: &[Value]) -> u64 {
        let payloads = docs.iter().map(|d| Bytes::from(d.to_string()));
        self.admin
            .publish_batch(&self.subject("views"), payloads)
            .await
            .unwrap()
    }

    fn source(&self, extra: Value) -> NatsSource {
        let mut config = json!({"url": URL, "stream": self.stream, "meta": null});
        for (k, v) in extra.as_object().unwrap() {
            config[k] = v.clone();
        }
        let mut config: NatsConfig = serde_json::from_value(config).unwrap();
        config.check(std::path::Path::new("/")).unwrap();
        NatsSource::new("events", &config)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // On a thread of its own: the test's runtime may be the one being dropped.
        let stream = self.stream.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Runtime::new().unwrap();
            rt.block_on(async {
                let admin = Admin::connect(URL).await.unwrap();
                admin.delete_stream(&stream).await.ok();
            });
        })
        .join()
        .unwrap();
    }
}

fn docs(range: std::ops::Range<u64>) -> Vec<Value> {
    range.map(|i| json!({"id": i, "views": i % 7})).collect()
}

/// Guards a test against a hang (a wrong `ready` would otherwise block forever);
/// not a timing assertion: it only turns a hang into a failure.
async fn bounded<T>(f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), f)
        .await
        .expect("the source hung")
}

/// Steps of at most `limits` until one says the source caught up; waits on `ready`
/// between empty steps. Returns the non-empty steps with their documents.
/// Starts the source's read-ahead and waits until it buffered `n` messages, so the
/// steps that follow are cut by their limits alone, not by how fast delivery was.
async fn buffered(source: &mut NatsSource, n: usize) {
    bounded(async {
        let mut out = Records::default();
        source.queue(records(0), &mut out).await.unwrap();
        assert!(out.is_empty());
        while source.queued().records < n {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    })
    .await
}

async fn until_caught_up(source: &mut NatsSource, limits: QueueLimits) -> Vec<(Vec<Value>, Step)> {
    bounded(async {
        let mut steps = Vec::new();
        loop {
            let mut out = Records::default();
            let step = source.queue(limits, &mut out).await.unwrap();
            assert_eq!(step.records, out.len());
            let caught_up = step.end_of_input;
            if step.records > 0 || !step.errors.is_empty() {
                steps.push((parsed_docs(&mut out), step));
            } else if !caught_up {
                source.ready().await;
            }
            if caught_up {
                return steps;
            }
        }
    })
    .await
}

/// Steps until `n` documents were read, waiting on `ready` before each.
async fn read_n(source: &mut NatsSource, n: usize) -> Vec<Value> {
    bounded(async {
        let mut docs = Vec::new();
        while docs.len() < n {
            source.ready().await;
            let mut out = Records::default();
            source.queue(ALL, &mut out).await.unwrap();
            docs.extend(parsed_docs(&mut out));
        }
        docs
    })
    .await
}

fn span(step: &Step) -> (u64, u64) {
    let position = step.resume.position().unwrap();
    (
        position["begin"].as_u64().unwrap(),
        position["end"].as_u64().unwrap(),
    )
}

async fn replay(
    source: &mut NatsSource,
    step: &Resume,
) -> Result<(Vec<String>, Step), SourceError> {
    let mut out = Records::default();
    let replayed = bounded(source.replay(step, &mut out)).await?;
    Ok((texts(&mut out), replayed))
}

#[tokio::test]
async fn a_work_queue_stream_is_refused_naming_the_stream_and_its_retention() {
    let fx = Fixture::named().await;
    fx.admin
        .create_work_queue(&fx.stream, &[&fx.subject(">")])
        .await
        .unwrap();
    let mut source = fx.source(json!({}));
    let error = source
        .queue(ALL, &mut Records::default())
        .await
        .unwrap_err();
    assert!(matches!(error, SourceError::Config { .. }), "{error}");
    assert!(!error.is_retryable());
    let text = error.to_string();
    assert!(
        text.contains(&format!("stream {} has WorkQueue retention", fx.stream)),
        "{text}"
    );
    assert!(
        text.contains("cannot") || text.contains("could not be replayed"),
        "{text}"
    );
}

#[tokio::test]
async fn a_missing_stream_is_a_config_error_naming_it() {
    let fx = Fixture::named().await;
    let mut source = fx.source(json!({}));
    let error = source
        .seek(&json!({"begin": 1, "end": 1}))
        .await
        .unwrap_err();
    assert!(matches!(error, SourceError::Config { .. }), "{error}");
    assert!(error.to_string().contains(&fx.stream), "{error}");
    assert!(error.to_string().contains("no such stream"), "{error}");
}

#[tokio::test]
async fn steps_resume_and_replay_exactly_by_sequence_range() {
    let fx = Fixture::new().await;
    let input = docs(0..25);
    fx.publish(&input).await;

    let mut source = fx.source(json!({}));
    buffered(&mut source, input.len()).await;
    let steps = until_caught_up(&mut source, records(10)).await;
    let read: Vec<Value> = steps.iter().flat_map(|(d, _)| d.clone()).collect();
    assert_eq!(read, input, "every message once, in stream order");
    assert!(steps.iter().all(|(d, _)| d.len() <= 10));
    // Ranges tile the stream: each begins where the last ended.
    let mut next = 1;
    for (docs, step) in &steps {
        let (begin, end) = span(step);
        assert_eq!(begin, next);
        assert_eq!(end - begin, docs.len() as u64);
        next = end;
    }
    assert_eq!(next, 26);

    // A fresh source replays each step exactly, and is left after it.
    for (i, (docs, step)) in steps.iter().enumerate() {
        let mut fresh = fx.source(json!({}));
        let (texts, replayed) = replay(&mut fresh, &step.resume).await.unwrap();
        let replayed_docs: Vec<Value> = texts
            .iter()
            .map(|t| serde_json::from_str(t).unwrap())
            .collect();
        assert_eq!(&replayed_docs, docs, "step {i}");
        assert_eq!(replayed.resume, step.resume, "same range and hash");
        let rest = until_caught_up(&mut fresh, ALL).await;
        let rest: Vec<Value> = rest.into_iter().flat_map(|(d, _)| d).collect();
        let (_, end) = span(step);
        assert_eq!(rest, input[end as usize - 1..].to_vec(), "after step {i}");
    }

    // A seek resumes after a step; publishing more is read from there on.
    let mut resumed = fx.source(json!({}));
    resumed
        .seek(steps[0].1.resume.position().unwrap())
        .await
        .unwrap();
    let more = docs(25..30);
    fx.publish(&more).await;
    let rest: Vec<Value> = until_caught_up(&mut resumed, ALL)
        .await
        .into_iter()
        .flat_map(|(d, _)| d)
        .collect();
    // A step holds what the read-ahead had when it was queued: up to 10 messages.
    let (_, first_end) = span(&steps[0].1);
    let after_first = first_end as usize - 1;
    assert_eq!(rest, [&input[after_first..], &more[..]].concat());
}

#[tokio::test]
async fn a_replayed_step_with_a_different_hash_fails() {
    let fx = Fixture::new().await;
    fx.publish(&docs(0..5)).await;
    let mut source = fx.source(json!({}));
    let steps = until_caught_up(&mut source, ALL).await;
    let Resume::Replay {
        position,
        data,
        hash,
    } = steps[0].1.resume.clone()
    else {
        panic!("a replayable step");
    };
    let forged = Resume::Replay {
        position,
        data,
        hash: hash ^ 1,
    };
    let mut out = Records::default();
    let error = source.replay(&forged, &mut out).await.unwrap_err();
    assert!(
        matches!(error, SourceError::ReplayMismatch { .. }),
        "{error}"
    );
    assert!(out.is_empty(), "nothing of a mismatched replay is kept");
}

#[tokio::test]
async fn a_deleted_message_inside_a_step_is_a_gap_the_replay_reproduces() {
    let fx = Fixture::new().await;
    let input = docs(0..10);
    fx.publish(&input).await;
    fx.admin.delete_message(&fx.stream, 5).await.unwrap();

    let mut source = fx.source(json!({}));
    buffered(&mut source, 9).await;
    let steps = until_caught_up(&mut source, ALL).await;
    let read: Vec<Value> = steps.iter().flat_map(|(d, _)| d.clone()).collect();
    let mut expected = input.clone();
    expected.remove(4);
    assert_eq!(read, expected);
    assert_eq!(span(&steps[0].1), (1, 11), "the range spans the gap");

    let mut fresh = fx.source(json!({}));
    let (texts, _) = replay(&mut fresh, &steps[0].1.resume).await.unwrap();
    assert_eq!(texts.len(), 9);
}

#[tokio::test]
async fn a_purged_range_cannot_be_replayed_or_sought_and_says_which_sequences() {
    let fx = Fixture::new().await;
    fx.publish(&docs(0..10)).await;
    let mut source = fx.source(json!({}));
    buffered(&mut source, 10).await;
    let steps = until_caught_up(&mut source, records(4)).await;
    assert_eq!(span(&steps[0].1), (1, 5));
    fx.admin.purge_below(&fx.stream, 7).await.unwrap();

    let mut fresh = fx.source(json!({}));
    let error = replay(&mut fresh, &steps[0].1.resume).await.unwrap_err();
    assert!(matches!(error, SourceError::Unavailable { .. }), "{error}");
    assert!(!error.is_retryable());
    let text = error.to_string();
    assert!(
        text.contains(&format!("stream {} sequences 1..5", fx.stream)),
        "{text}"
    );
    assert!(text.contains("now begins at sequence 7"), "{text}");

    let error = fresh
        .seek(steps[0].1.resume.position().unwrap())
        .await
        .unwrap_err();
    assert!(matches!(error, SourceError::Unavailable { .. }), "{error}");
    let text = error.to_string();
    assert!(
        text.contains(&format!("stream {} now begins at sequence 7", fx.stream)),
        "{text}"
    );
    assert!(text.contains("sequence 5"), "{text}");

    // After the purge, the step from 5 on is still whole... except 5 and 6: gone too.
    let error = replay(&mut fresh, &steps[1].1.resume).await.unwrap_err();
    assert!(matches!(error, SourceError::Unavailable { .. }), "{error}");
    // The last step (9..11) is intact.
    let last = &steps.last().unwrap().1;
    assert_eq!(span(last), (9, 11));
    replay(&mut fresh, &last.resume).await.unwrap();
}

#[tokio::test]
async fn a_position_past_the_end_of_the_stream_is_unavailable() {
    let fx = Fixture::new().await;
    fx.publish(&docs(0..3)).await;
    let mut source = fx.source(json!({}));
    let error = source
        .seek(&json!({"begin": 90, "end": 100}))
        .await
        .unwrap_err();
    assert!(matches!(error, SourceError::Unavailable { .. }), "{error}");
    assert!(error.to_string().contains("ends at sequence 3"), "{error}");
    let error = source.seek(&json!({"offset": 3})).await.unwrap_err();
    assert!(matches!(error, SourceError::BadResume { .. }), "{error}");
}

#[tokio::test]
async fn a_message_that_is_not_an_object_is_bad_input_at_its_stream_and_sequence() {
    let fx = Fixture::new().await;
    fx.publish(&docs(0..2)).await;
    for bad in ["not json", "[1, 2]"] {
        fx.admin
            .publish(&fx.subject("views"), &[], Bytes::from(bad))
            .await
            .unwrap();
    }
    fx.publish(&docs(2..3)).await;

    // With metadata, the source finds a non-object: its record is not emitted.
    let mut source = fx.source(json!({"meta": "_meta"}));
    let steps = until_caught_up(&mut source, ALL).await;
    let docs: Vec<Value> = steps.iter().flat_map(|(d, _)| d.clone()).collect();
    assert_eq!(docs.len(), 3);
    let errors: Vec<_> = steps.iter().flat_map(|(_, s)| s.errors.clone()).collect();
    let positions: Vec<String> = errors.iter().map(|e| e.position.to_string()).collect();
    assert_eq!(
        positions,
        [
            format!("stream {} sequence 3", fx.stream),
            format!("stream {} sequence 4", fx.stream)
        ]
    );
    assert_eq!(errors[0].raw, b"not json");
    assert!(
        errors[0].reason.contains("not a JSON object"),
        "{}",
        errors[0].reason
    );
    assert!(
        errors[0].reason.contains("meta: null"),
        "{}",
        errors[0].reason
    );
    // Bad input is part of the step: its replay finds it again.
    let mut fresh = fx.source(json!({"meta": "_meta"}));
    let (_, replayed) = replay(&mut fresh, &steps[0].1.resume).await.unwrap();
    assert_eq!(replayed.errors, steps[0].1.errors);

    // Without metadata the payload is handed over as it is, at the same position,
    // for the reader to report.
    let mut raw = fx.source(json!({}));
    let mut out = Records::default();
    bounded(async {
        while out.len() < 5 {
            raw.ready().await;
            raw.queue(ALL, &mut out).await.unwrap();
        }
    })
    .await;
    let record = out.iter_mut().nth(2).unwrap();
    assert_eq!(
        record.position.to_string(),
        format!("stream {} sequence 3", fx.stream)
    );
    assert!(matches!(
        record.doc,
        sluice_source_sdk::RecordDoc::Json(b"not json")
    ));
}

#[tokio::test]
async fn metadata_is_spliced_into_each_document() {
    let fx = Fixture::new().await;
    let subject = fx.subject("eu.views");
    let headers = [("X-Id", "a1"), ("Trace", "t"), ("X-Id", "a2")];
    fx.admin
        .publish(&subject, &headers, Bytes::from(r#"{"id": 1}"#))
        .await
        .unwrap();
    fx.admin
        .publish(&subject, &[], Bytes::from("  { }"))
        .await
        .unwrap();

    let mut source = fx.source(json!({"meta": "_meta"}));
    let steps = until_caught_up(&mut source, ALL).await;
    let docs: Vec<Value> = steps.iter().flat_map(|(d, _)| d.clone()).collect();
    assert_eq!(docs.len(), 2);
    let meta = &docs[0]["_meta"];
    assert_eq!(docs[0]["id"], 1);
    assert_eq!(meta["stream"], fx.stream.as_str());
    assert_eq!(meta["subject"], subject.as_str());
    assert_eq!(meta["sequence"], 1);
    assert_eq!(
        meta["headers"],
        json!({"Trace": ["t"], "X-Id": ["a1", "a2"]})
    );
    let timestamp = meta["timestamp"].as_str().unwrap();
    assert!(
        timestamp.len() >= 20 && timestamp.contains('T'),
        "RFC 3339: {timestamp}"
    );
    assert_eq!(
        docs[1]["_meta"]["sequence"], 2,
        "an empty object takes it too"
    );
    assert_eq!(docs[1]["_meta"]["headers"], json!({}));
    assert_eq!(docs[1].as_object().unwrap().len(), 1);

    // The name is configurable; a replay reproduces the text, headers in order.
    let mut named = fx.source(json!({"meta": "m"}));
    let steps = until_caught_up(&mut named, ALL).await;
    assert_eq!(steps[0].0[0]["m"]["sequence"], 1);
    let mut fresh = fx.source(json!({"meta": "m"}));
    replay(&mut fresh, &steps[0].1.resume).await.unwrap();
}

#[tokio::test]
async fn a_subject_filter_reads_only_its_subjects_and_catches_up_by_pending() {
    let fx = Fixture::new().await;
    for i in 0..10u64 {
        let leaf = if i % 3 == 0 { "a" } else { "b" };
        let doc = json!({"id": i});
        fx.admin
            .publish(&fx.subject(leaf), &[], Bytes::from(doc.to_string()))
            .await
            .unwrap();
    }
    let mut source = fx.source(json!({"subject": fx.subject("a")}));
    let steps = until_caught_up(&mut source, records(2)).await;
    let ids: Vec<u64> = steps
        .iter()
        .flat_map(|(d, _)| d.iter().map(|d| d["id"].as_u64().unwrap()))
        .collect();
    assert_eq!(ids, [0, 3, 6, 9]);
    assert_eq!(span(&steps[0].1), (1, 5), "sequences 1 and 4");
    assert_eq!(span(&steps[1].1), (7, 11), "sequences 7 and 10");
    let mut fresh = fx.source(json!({"subject": fx.subject("a")}));
    let (texts, _) = replay(&mut fresh, &steps[1].1.resume).await.unwrap();
    assert_eq!(texts, [r#"{"id":6}"#, r#"{"id":9}"#]);
}

#[tokio::test]
async fn start_picks_the_first_message_read() {
    let fx = Fixture::new().await;
    fx.publish(&docs(0..5)).await;
    let first_id = async |start: Value| {
        let mut source = fx.source(json!({"start": start}));
        let steps = until_caught_up(&mut source, ALL).await;
        let ids: Vec<u64> = steps
            .iter()
            .flat_map(|(d, _)| d.iter().map(|d| d["id"].as_u64().unwrap()))
            .collect();
        ids
    };
    assert_eq!(first_id(json!("first")).await, [0, 1, 2, 3, 4]);
    assert_eq!(first_id(json!("last")).await, [4]);
    assert_eq!(first_id(json!("new")).await, Vec::<u64>::new());
    assert_eq!(first_id(json!(3)).await, [2, 3, 4]);

    fx.admin.purge_below(&fx.stream, 3).await.unwrap();
    let mut source = fx.source(json!({"start": 2}));
    let error = source
        .queue(ALL, &mut Records::default())
        .await
        .unwrap_err();
    assert!(matches!(error, SourceError::Unavailable { .. }), "{error}");
    assert!(error.to_string().contains("start: 2 is below"), "{error}");
}

#[tokio::test]
async fn a_caught_up_source_wakes_when_a_message_arrives() {
    let fx = Fixture::new().await;
    fx.publish(&docs(0..2)).await;
    let mut source = fx.source(json!({}));
    let steps = until_caught_up(&mut source, ALL).await;
    assert_eq!(steps.iter().map(|(d, _)| d.len()).sum::<usize>(), 2);
    fx.publish(&docs(2..3)).await;
    assert_eq!(read_n(&mut source, 1).await, docs(2..3));
}

#[tokio::test]
async fn a_paused_source_buffers_nothing_more_until_extended() {
    let fx = Fixture::new().await;
    let mut source = fx.source(json!({}));
    source.pause();
    let step = source.queue(ALL, &mut Records::default()).await.unwrap();
    assert_eq!(step.records, 0);
    fx.publish(&docs(0..3)).await;
    source.extend();
    assert_eq!(read_n(&mut source, 3).await, docs(0..3));
}
