//! The datagen source: the documents it generates, and that steps resume and replay
//! exactly, including steps journaled by earlier releases.

use serde_json::json;
use sluice_datagen::{DatagenConfig, DatagenShape, DatagenSource, pageview};
use sluice_source_sdk::testing::{ALL, parsed_docs, position, queue, records, texts};
use sluice_source_sdk::{Records, Resume, Source, SourceError};

fn datagen(documents: Option<u64>) -> DatagenSource {
    let def = DatagenConfig {
        seed: 7,
        documents,
        keys: 10,
        rate: None,
        shape: DatagenShape::Pageviews,
    };
    DatagenSource::new("gen", &def).unwrap()
}

/// The documents' JSON text, as the generator writes it.
fn generated(seqs: std::ops::Range<u64>) -> Vec<String> {
    seqs.map(|seq| {
        let mut text = Vec::new();
        pageview(7, 10, seq).write_json(&mut text);
        String::from_utf8(text).unwrap()
    })
    .collect()
}

#[tokio::test]
async fn datagen_emits_the_pure_documents_as_text_and_ends_after_its_count() {
    let mut source = datagen(Some(25));
    let mut out = Records::default();
    let step = source.queue(ALL, &mut out).await.unwrap();
    assert_eq!(texts(&mut out), generated(0..25));
    let docs = parsed_docs(&mut out);
    assert!(step.end_of_input);
    let bytes: usize = out.iter_mut().map(|r| r.bytes).sum();
    assert_eq!(step.bytes, bytes as u64);
    let keys: std::collections::BTreeSet<_> = docs
        .iter()
        .map(|d| d["user_id"].as_str().unwrap().to_string())
        .collect();
    assert!(keys.len() <= 10 && keys.len() > 1, "{keys:?}");
    let last_seen = docs[0]["last_seen"].as_str().unwrap();
    assert_eq!(last_seen, "2024-01-01T00:00:00Z");
    assert_eq!(docs[24]["last_seen"], "2024-01-01T00:00:24Z");
}

#[tokio::test]
async fn datagen_resumes_by_sequence_number_and_replays_exactly() {
    let mut source = datagen(None);
    let (_, first) = queue(&mut source, records(10)).await;
    let (docs, second) = queue(&mut source, records(5)).await;
    assert!(!second.end_of_input, "an endless generator never ends");

    let mut recovered = datagen(None);
    recovered.seek(position(&first)).await.unwrap();
    let mut out = Records::default();
    recovered.replay(&second.resume, &mut out).await.unwrap();
    assert_eq!(parsed_docs(&mut out), docs);
    let mut out = Records::default();
    recovered.queue(records(1), &mut out).await.unwrap();
    assert_eq!(texts(&mut out), generated(15..16));

    let other_seed = DatagenConfig {
        seed: 8,
        documents: None,
        keys: 10,
        rate: None,
        shape: DatagenShape::Pageviews,
    };
    let mut changed = DatagenSource::new("gen", &other_seed).unwrap();
    let err = changed
        .replay(&second.resume, &mut Records::default())
        .await
        .unwrap_err();
    assert!(matches!(err, SourceError::ReplayMismatch { .. }), "{err}");
}

/// Steps the quickstart pipeline (seed 7, 100,000 keys) journaled in its recovery log
/// before documents were written as text: they must replay, hash for hash.
#[tokio::test]
async fn datagen_replays_steps_journaled_by_earlier_releases() {
    let def = DatagenConfig {
        seed: 7,
        documents: Some(1_000_000),
        keys: 100_000,
        rate: None,
        shape: DatagenShape::Pageviews,
    };
    let mut source = DatagenSource::new("views-gen", &def).unwrap();
    for (begin, end, hash) in [
        (0u64, 8192u64, 2_908_522_411_663_469_288u64),
        (491_520, 499_712, 18_215_297_823_161_174_517),
        (999_424, 1_000_000, 453_469_916_905_594_758),
    ] {
        let journaled: Resume = serde_json::from_value(json!({
            "kind": "replay", "position": {"begin": begin, "end": end}, "hash": hash,
        }))
        .unwrap();
        let mut out = Records::default();
        let step = source.replay(&journaled, &mut out).await.unwrap();
        assert_eq!(step.records as u64, end - begin);
    }
}

#[tokio::test]
async fn replay_rejects_a_resume_that_cannot_be_replayed() {
    let mut source = datagen(None);
    let seek = Resume::Seek {
        position: json!({"begin": 0, "end": 3}),
    };
    let err = source
        .replay(&seek, &mut Records::default())
        .await
        .unwrap_err();
    assert!(matches!(err, SourceError::BadResume { .. }), "{err}");
}

/// `ready` says when the next document is due: a rate-limited generator wakes its
/// reader on schedule, not before, and a finite one at its end never does.
#[tokio::test]
async fn ready_waits_for_the_next_due_document_and_never_after_the_last() {
    use std::time::{Duration, Instant};
    use tokio::time::timeout;
    let def = DatagenConfig {
        seed: 7,
        documents: Some(3),
        keys: 10,
        rate: Some(10.0),
        shape: DatagenShape::Pageviews,
    };
    let mut source = DatagenSource::new("gen", &def).unwrap();
    let (docs, _) = queue(&mut source, ALL).await;
    assert_eq!(docs.len(), 1, "the first document is due at once");
    let asked = Instant::now();
    source.ready().await;
    let waited = asked.elapsed();
    assert!(
        waited >= Duration::from_millis(95),
        "the second document is due 100 ms after the first: ready after {waited:?}"
    );
    let (docs, _) = queue(&mut source, ALL).await;
    assert_eq!(docs.len(), 1);
    source.ready().await;
    let (docs, step) = queue(&mut source, ALL).await;
    assert_eq!(docs.len(), 1);
    assert!(step.end_of_input);
    assert!(
        timeout(Duration::from_millis(300), source.ready())
            .await
            .is_err(),
        "nothing comes after the last document"
    );
}

#[tokio::test]
async fn datagen_lag_counts_what_is_not_yet_committed_not_only_what_is_not_generated() {
    use sluice_source_sdk::Lag;
    let mut source = datagen(Some(3_000));
    assert_eq!(
        source.lag(),
        Some(Lag::Messages(3_000)),
        "nothing committed"
    );
    let (_, first) = queue(&mut source, records(1_200)).await;
    source.committed(1, position(&first));
    // Generated ahead of the committer: 1 800 of 3 000, of which 1 200 are committed.
    let (_, second) = queue(&mut source, records(600)).await;
    assert_eq!(source.lag(), Some(Lag::Messages(1_800)));
    source.committed(2, position(&second));
    assert_eq!(source.lag(), Some(Lag::Messages(1_200)));

    let mut recovered = datagen(Some(3_000));
    recovered.seek(position(&second)).await.unwrap();
    assert_eq!(
        recovered.lag(),
        Some(Lag::Messages(1_200)),
        "the checkpoint sought is committed"
    );
    assert_eq!(datagen(None).lag(), None, "an endless generator");
}
