//! The built-in sources: what they read, where they say it came from, and that steps
//! resume and replay exactly.

use serde_json::{Value, json};
use sluice_runtime::config::{DatagenDef, DatagenShape, FileDef, FileFormat};
use sluice_runtime::source::datagen::{DatagenSource, pageview};
use sluice_runtime::source::file::FileSource;
use sluice_runtime::source::{
    QueueLimits, RecordDoc, Records, Resume, Source, SourceError, Step, bad_json,
};
use std::io::Write;
use std::path::Path;

const ALL: QueueLimits = QueueLimits {
    max_records: usize::MAX,
    max_bytes: u64::MAX,
};

fn records(n: usize) -> QueueLimits {
    QueueLimits {
        max_records: n,
        max_bytes: u64::MAX,
    }
}

fn file_source(path: &Path, format: FileFormat, follow: bool) -> FileSource {
    let def = FileDef {
        path: path.to_path_buf(),
        format,
        follow,
        max_document_size: sluice_runtime::config::DEFAULT_MAX_DOCUMENT_SIZE,
    };
    FileSource::new("views", &def)
}

fn write(dir: &tempfile::TempDir, name: &str, content: &[u8]) -> std::path::PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, content).unwrap();
    path
}

async fn queue(source: &mut dyn Source, limits: QueueLimits) -> (Vec<Value>, Step) {
    let mut out = Records::default();
    let step = source.queue(limits, &mut out).await.unwrap();
    assert_eq!(step.records, out.len());
    (parsed_docs(&mut out), step)
}

/// The records' documents, JSON text parsed.
fn parsed_docs(records: &mut Records) -> Vec<Value> {
    records
        .iter_mut()
        .map(|r| match r.doc {
            RecordDoc::Json(text) => serde_json::from_slice(text).expect("a generated document"),
            RecordDoc::Value(doc) => doc.clone(),
        })
        .collect()
}

/// The records' JSON texts (every record must be one).
fn texts(records: &mut Records) -> Vec<String> {
    records
        .iter_mut()
        .map(|r| match r.doc {
            RecordDoc::Json(text) => String::from_utf8_lossy(text).into_owned(),
            RecordDoc::Value(doc) => panic!("{doc} was parsed by its source"),
        })
        .collect()
}

fn position(step: &Step) -> &Value {
    step.resume
        .position()
        .expect("built-in sources resume by position")
}

#[tokio::test]
async fn json_lines_are_read_with_their_positions() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "v.jsonl", b"{\"a\":1}\n\n{\"a\":2}\r\n{\"a\":3}");
    let mut source = file_source(&path, FileFormat::Json, false);
    let mut out = Records::default();
    let step = source.queue(ALL, &mut out).await.unwrap();
    assert_eq!(texts(&mut out), [r#"{"a":1}"#, r#"{"a":2}"#, r#"{"a":3}"#]);
    let at: Vec<_> = out
        .iter_mut()
        .map(|r| (r.position.line, r.position.byte_offset, r.bytes))
        .collect();
    assert_eq!(at, vec![(1, 0, 8), (3, 9, 9), (4, 18, 7)]);
    let second = out.iter_mut().nth(1).unwrap().position.to_string();
    assert_eq!(second, format!("{}:3 (byte 9)", path.display()));
    assert_eq!(step.bytes, 25);
    assert!(
        step.end_of_input,
        "the final line without \\n ends the file"
    );
    assert!(step.errors.is_empty());
}

#[tokio::test]
async fn csv_header_names_properties_and_literal_cells_are_typed() {
    let dir = tempfile::tempdir().unwrap();
    let text = "id,views,ratio,ok,zip,note\n\
                a,3,0.5,true,01234,\"x, \"\"y\"\"\"\n\
                b,-7,1e3,false,\"42\",\n\
                c,+1,.5,True,,\"two\nlines\"\n";
    let path = write(&dir, "v.csv", text.as_bytes());
    let mut source = file_source(&path, FileFormat::Csv, false);
    let (docs, step) = queue(&mut source, ALL).await;
    assert_eq!(
        docs,
        vec![
            json!({"id": "a", "views": 3, "ratio": 0.5, "ok": true, "zip": "01234", "note": "x, \"y\""}),
            json!({"id": "b", "views": -7, "ratio": 1000.0, "ok": false, "zip": "42"}),
            json!({"id": "c", "views": "+1", "ratio": ".5", "ok": "True", "note": "two\nlines"}),
        ]
    );
    assert!(step.errors.is_empty(), "{:?}", step.errors);
    assert!(step.end_of_input);
}

#[tokio::test]
async fn seek_resumes_exactly_after_the_step() {
    let dir = tempfile::tempdir().unwrap();
    let lines: String = (0..10).map(|i| format!("{{\"i\":{i}}}\n")).collect();
    let path = write(&dir, "v.jsonl", lines.as_bytes());
    let mut first = file_source(&path, FileFormat::Json, false);
    let (docs, step) = queue(&mut first, records(4)).await;
    assert_eq!(docs.len(), 4);
    assert!(!step.end_of_input);

    let mut resumed = file_source(&path, FileFormat::Json, false);
    resumed.seek(position(&step)).await.unwrap();
    let mut out = Records::default();
    resumed.queue(ALL, &mut out).await.unwrap();
    let rest: Vec<_> = parsed_docs(&mut out)
        .iter()
        .map(|d| d["i"].as_u64().unwrap())
        .collect();
    assert_eq!(rest, (4..10).collect::<Vec<_>>());
    assert_eq!(
        out.iter_mut().next().unwrap().position.line,
        5,
        "line numbers continue after a seek"
    );
}

#[tokio::test]
async fn csv_seek_past_the_header_still_names_properties() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "v.csv", b"id,n\na,1\nb,2\n");
    let mut first = file_source(&path, FileFormat::Csv, false);
    let (_, step) = queue(&mut first, records(1)).await;
    let mut resumed = file_source(&path, FileFormat::Csv, false);
    resumed.seek(position(&step)).await.unwrap();
    let (docs, _) = queue(&mut resumed, ALL).await;
    assert_eq!(docs, vec![json!({"id": "b", "n": 2})]);
}

#[tokio::test]
async fn replay_reproduces_the_step_and_continues_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let lines: String = (0..6).map(|i| format!("{{\"i\":{i}}}\n")).collect();
    let path = write(&dir, "v.jsonl", lines.as_bytes());
    let mut source = file_source(&path, FileFormat::Json, false);
    let (_, first) = queue(&mut source, records(2)).await;
    let (docs, second) = queue(&mut source, records(2)).await;

    let mut recovered = file_source(&path, FileFormat::Json, false);
    recovered.seek(position(&first)).await.unwrap();
    let mut out = Records::default();
    let replayed = recovered.replay(&second.resume, &mut out).await.unwrap();
    assert_eq!(parsed_docs(&mut out), docs);
    assert_eq!(replayed.resume, second.resume);
    let (rest, _) = queue(&mut recovered, ALL).await;
    assert_eq!(rest, vec![json!({"i": 4}), json!({"i": 5})]);
}

#[tokio::test]
async fn replay_of_a_modified_file_fails_with_a_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "v.jsonl", b"{\"i\":1}\n{\"i\":2}\n");
    let mut source = file_source(&path, FileFormat::Json, false);
    let (_, step) = queue(&mut source, ALL).await;
    std::fs::write(&path, b"{\"i\":1}\n{\"i\":3}\n").unwrap();

    let mut recovered = file_source(&path, FileFormat::Json, false);
    let mut out = Records::default();
    let err = recovered.replay(&step.resume, &mut out).await.unwrap_err();
    assert!(
        matches!(err, SourceError::ReplayMismatch { expected, actual, .. } if expected == step.resume.hash() && actual != expected),
        "{err}"
    );
    assert!(out.is_empty(), "a mismatching replay emits nothing");
    assert!(err.to_string().contains("the input changed"), "{err}");
}

#[tokio::test]
async fn followed_file_picks_up_appended_lines_and_waits_for_partial_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "v.jsonl", b"{\"i\":1}\n{\"i\":");
    let mut source = file_source(&path, FileFormat::Json, true);
    let (docs, step) = queue(&mut source, ALL).await;
    assert_eq!(docs, vec![json!({"i": 1})]);
    assert!(!step.end_of_input, "a followed file never ends");

    let (docs, step) = queue(&mut source, ALL).await;
    assert!(docs.is_empty() && !step.end_of_input, "nothing new yet");

    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(b"2}\n{\"i\":3}\n").unwrap();
    let (docs, step) = queue(&mut source, ALL).await;
    assert_eq!(docs, vec![json!({"i": 2}), json!({"i": 3})]);
    assert!(!step.end_of_input);
}

/// Whoever parses a JSON line (the reader's combiner) reports it at its position, with
/// these words: `bad_input.rs` checks them end to end.
#[tokio::test]
async fn json_lines_are_handed_over_unparsed_bad_ones_included() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        &dir,
        "v.jsonl",
        b"{\"i\":1}\n{\"i\":\n{\"s\":\"\xff\"}\n{\"i\":3}\n",
    );
    let mut source = file_source(&path, FileFormat::Json, false);
    let mut out = Records::default();
    let step = source.queue(ALL, &mut out).await.unwrap();
    assert!(step.errors.is_empty(), "{:?}", step.errors);
    let records: Vec<_> = out
        .iter_mut()
        .map(|r| match r.doc {
            RecordDoc::Json(text) => (r.position.to_string(), text.to_vec()),
            RecordDoc::Value(doc) => panic!("{doc} was parsed by its source"),
        })
        .collect();
    let at = |line: u64, byte: u64| format!("{}:{line} (byte {byte})", path.display());
    let expected: [(String, &[u8]); 4] = [
        (at(1, 0), b"{\"i\":1}"),
        (at(2, 8), b"{\"i\":"),
        (at(3, 14), b"{\"s\":\"\xff\"}"),
        (at(4, 24), b"{\"i\":3}"),
    ];
    assert_eq!(records, expected.map(|(at, text)| (at, text.to_vec())));

    let error = |text: &[u8]| serde_json::from_slice::<Value>(text).unwrap_err();
    let truncated = bad_json(&records[1].1, &error(&records[1].1));
    assert!(truncated.starts_with("invalid JSON: EOF"), "{truncated}");
    let not_utf8 = bad_json(&records[2].1, &error(&records[2].1));
    assert_eq!(not_utf8, "invalid UTF-8 at byte 6 of the line");
}

#[tokio::test]
async fn csv_row_with_the_wrong_number_of_columns_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "v.csv", b"id,n\na,1\nb,2,3\nc\n");
    let mut source = file_source(&path, FileFormat::Csv, false);
    let (docs, step) = queue(&mut source, ALL).await;
    assert_eq!(docs, vec![json!({"id": "a", "n": 1})]);
    let messages: Vec<_> = step.errors.iter().map(|e| e.to_string()).collect();
    assert_eq!(messages.len(), 2);
    assert!(
        messages[0].ends_with(":3 (byte 9): row has 3 columns, the header has 2"),
        "{messages:?}"
    );
    assert!(
        messages[1].ends_with(":4 (byte 15): row has 1 columns, the header has 2"),
        "{messages:?}"
    );
}

#[tokio::test]
async fn byte_limit_ends_a_step_but_an_oversized_record_still_makes_progress() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "v.jsonl", b"{\"i\":1}\n{\"i\":2}\n");
    let mut source = file_source(&path, FileFormat::Json, false);
    let tiny = QueueLimits {
        max_records: usize::MAX,
        max_bytes: 1,
    };
    let (docs, _) = queue(&mut source, tiny).await;
    assert_eq!(docs, vec![json!({"i": 1})]);
    let (docs, _) = queue(&mut source, tiny).await;
    assert_eq!(docs, vec![json!({"i": 2})]);
    let (docs, step) = queue(&mut source, tiny).await;
    assert!(docs.is_empty());
    assert!(step.end_of_input);
}

#[tokio::test]
async fn missing_file_is_an_io_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("absent.jsonl");
    let mut source = file_source(&path, FileFormat::Json, false);
    let err = source
        .queue(ALL, &mut Records::default())
        .await
        .unwrap_err();
    assert!(matches!(err, SourceError::Io { .. }));
    assert!(err.to_string().contains("absent.jsonl"), "{err}");
}

fn datagen(documents: Option<u64>) -> DatagenSource {
    let def = DatagenDef {
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

    let other_seed = DatagenDef {
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
    let def = DatagenDef {
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

fn limited_source(path: &Path, format: FileFormat, follow: bool, max: u64) -> FileSource {
    let def = FileDef {
        path: path.to_path_buf(),
        format,
        follow,
        max_document_size: max,
    };
    FileSource::new("views", &def)
}

#[tokio::test]
async fn a_record_above_max_document_size_is_streamed_past_and_replays_exactly() {
    let dir = tempfile::tempdir().unwrap();
    // 3 MiB in one CSV record (a quoted cell spanning lines), between two good rows.
    let big = format!("\"{}\",2\n", "x\n".repeat(3 << 19));
    let text = format!("a,b\n1,1\n{big}3,3\n");
    let path = write(&dir, "v.csv", text.as_bytes());
    let mut source = limited_source(&path, FileFormat::Csv, false, 1 << 20);
    let (docs, step) = queue(&mut source, ALL).await;
    assert_eq!(docs, vec![json!({"a": 1, "b": 1}), json!({"a": 3, "b": 3})]);
    assert_eq!(step.errors.len(), 1);
    let err = &step.errors[0];
    assert_eq!((err.position.line, err.position.byte_offset), (3, 8));
    assert!(err.reason.contains("max_document_size"), "{}", err.reason);
    assert!(err.raw.len() <= 256);

    let mut recovered = limited_source(&path, FileFormat::Csv, false, 1 << 20);
    let mut out = Records::default();
    let replayed = recovered.replay(&step.resume, &mut out).await.unwrap();
    assert_eq!(replayed.resume, step.resume);
    assert_eq!(replayed.errors, step.errors);
    assert_eq!(out.len(), 2);
}

#[tokio::test]
async fn a_followed_file_ending_inside_an_oversized_record_ends_the_step_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let partial = format!("{{\"i\":1}}\n{{\"big\":\"{}", "x".repeat(3 << 20));
    let path = write(&dir, "v.jsonl", partial.as_bytes());
    let mut source = limited_source(&path, FileFormat::Json, true, 1 << 20);
    let (docs, step) = queue(&mut source, ALL).await;
    assert_eq!(docs, vec![json!({"i": 1})]);
    assert!(step.errors.is_empty());
    assert_eq!(position(&step)["end"]["offset"], 8);

    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    file.write_all(b"\"}\n{\"i\":2}\n").unwrap();
    let (docs, step) = queue(&mut source, ALL).await;
    assert_eq!(docs, vec![json!({"i": 2})]);
    assert_eq!(step.errors.len(), 1);
    assert_eq!(step.errors[0].position.line, 2);
}
