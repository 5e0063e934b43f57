//! The file source: what it reads, where it says each record came from, and that
//! steps resume and replay exactly.

use serde_json::{Value, json};
use sluice_file::config::DEFAULT_MAX_DOCUMENT_SIZE;
use sluice_file::{FileConfig, FileFormat, FileSource};
use sluice_source_sdk::testing::{ALL, parsed_docs, position, queue, records, texts};
use sluice_source_sdk::{Lag, QueueLimits, RecordDoc, Records, Source, SourceError, bad_json};
use std::io::Write;
use std::path::Path;

fn file_source(path: &Path, format: FileFormat, follow: bool) -> FileSource {
    let def = FileConfig {
        path: path.to_path_buf(),
        format,
        follow,
        max_document_size: DEFAULT_MAX_DOCUMENT_SIZE,
    };
    FileSource::new("views", &def)
}

fn write(dir: &tempfile::TempDir, name: &str, content: &[u8]) -> std::path::PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, content).unwrap();
    path
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
async fn seek_past_the_end_of_a_shortened_file_is_unavailable_naming_the_gap() {
    let dir = tempfile::tempdir().unwrap();
    let lines: String = (0..10).map(|i| format!("{{\"i\":{i}}}\n")).collect();
    let path = write(&dir, "v.jsonl", lines.as_bytes());
    let mut first = file_source(&path, FileFormat::Json, true);
    let (_, step) = queue(&mut first, records(8)).await;
    std::fs::write(&path, &lines.as_bytes()[..20]).unwrap();

    let mut resumed = file_source(&path, FileFormat::Json, true);
    let err = resumed.seek(position(&step)).await.unwrap_err();
    assert!(matches!(err, SourceError::Unavailable { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.starts_with("source views: cannot resume at"),
        "{message}"
    );
    assert!(
        message.contains("now has 20 bytes, and this position is byte 64 (line 9)"),
        "{message}"
    );

    std::fs::remove_file(&path).unwrap();
    let err = resumed.seek(position(&step)).await.unwrap_err();
    assert!(err.to_string().contains("no longer exists"), "{err}");
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

/// The reader of a followed file waits on `ready`: it returns when the file is written
/// (a change notification), not at a poll: well before the watch's safety poll, and
/// not at all while nothing is written, not even when another file of the folder is.
#[tokio::test]
async fn a_followed_file_is_ready_when_written_and_not_before() {
    use sluice_file::watch::SAFETY_POLL;
    use tokio::time::timeout;
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "v.jsonl", b"{\"i\":1}\n");
    let mut source = file_source(&path, FileFormat::Json, true);
    let (docs, _) = queue(&mut source, ALL).await;
    assert_eq!(docs.len(), 1);
    // The first wait starts the watch and returns at once.
    timeout(SAFETY_POLL / 2, source.ready())
        .await
        .expect("the first wait returns at once");
    let quiet = SAFETY_POLL / 2;
    write(&dir, "other.db", b"another file of the folder");
    assert!(
        timeout(quiet, source.ready()).await.is_err(),
        "ready while nothing was written to the file"
    );
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    f.write_all(b"{\"i\":2}\n").unwrap();
    timeout(quiet, source.ready())
        .await
        .expect("a write wakes the reader before any poll would");
    let (docs, _) = queue(&mut source, ALL).await;
    assert_eq!(docs, vec![json!({"i": 2})]);
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
    assert!(
        truncated.starts_with("invalid JSON at column ") && truncated.contains(": EOF while"),
        "the column in the line, not serde_json's line 1: {truncated}"
    );
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
        max_journaled: u64::MAX,
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

fn limited_source(path: &Path, format: FileFormat, follow: bool, max: u64) -> FileSource {
    let def = FileConfig {
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

/// The lag is the file's bytes after the cursor, as of the last read.
#[tokio::test]
async fn lag_is_the_unread_bytes_of_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(&dir, "v.jsonl", b"{\"a\":1}\n{\"a\":2}\n{\"a\":3}\n");
    let mut source = file_source(&path, FileFormat::Json, true);
    assert_eq!(source.lag(), Some(Lag::Bytes(0)), "nothing read yet");
    let one = QueueLimits {
        max_records: 1,
        max_bytes: u64::MAX,
        max_journaled: u64::MAX,
    };
    source.queue(one, &mut Records::default()).await.unwrap();
    assert_eq!(source.lag(), Some(Lag::Bytes(16)));
    source.queue(ALL, &mut Records::default()).await.unwrap();
    assert_eq!(source.lag(), Some(Lag::Bytes(0)));
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(b"{\"a\":4}\n")
        .unwrap();
    source.queue(one, &mut Records::default()).await.unwrap();
    assert_eq!(
        source.lag(),
        Some(Lag::Bytes(0)),
        "the appended line is read"
    );
}
