//! The process layer against scripted connectors (shell scripts speaking the Airbyte
//! protocol): steps end at states, a failing connector's own words reach the error, a
//! silent one hits the timeout, and dropping the source leaves no process behind.

use serde_json::{Value, json};
use sluice_airbyte_source::{AirbyteKind, ConnectorConfig};
use sluice_source_sdk::config::parse;
use sluice_source_sdk::{
    Opening, QueueLimits, RecordDoc, Records, Resume, Source, SourceError, SourceKind,
};
use std::path::Path;
use std::time::Duration;

const ALL: QueueLimits = QueueLimits {
    max_records: usize::MAX,
    max_bytes: u64::MAX,
    max_journaled: u64::MAX,
};

/// A connector that answers `discover` with one stream and runs `read` as `body`.
fn script(dir: &Path, body: &str) -> std::path::PathBuf {
    let path = dir.join("source-scripted");
    let catalog = r#"{"type":"CATALOG","catalog":{"streams":[{"name":"items","json_schema":{},"supported_sync_modes":["full_refresh","incremental"],"source_defined_primary_key":[["id"]]}]}}"#;
    let text = format!(
        "#!/bin/sh\ncase \"$1\" in\n  discover) echo '{catalog}' ;;\n  read)\n{body}\n  ;;\nesac\n"
    );
    std::fs::write(&path, text).unwrap();
    let mut perms = std::fs::metadata(&path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&path, perms).unwrap();
    path
}

fn open(dir: &Path, program: &Path, timeout: &str) -> Box<dyn Source> {
    let config: ConnectorConfig = parse(json!({
        "command": [program],
        "streams": [{"name": "items"}],
        "timeout": timeout,
    }))
    .unwrap();
    AirbyteKind::open(&Opening::standalone("scripted", dir), &config).unwrap()
}

fn texts(records: &mut Records) -> Vec<Value> {
    records
        .iter_mut()
        .map(|r| match r.doc {
            RecordDoc::Json(text) => serde_json::from_slice(text).unwrap(),
            RecordDoc::Value(v) => v.clone(),
        })
        .collect()
}

/// Queues until the connector's input ends (or `steps` steps were read).
async fn read_all(source: &mut Box<dyn Source>) -> Result<Vec<(Vec<Value>, Resume)>, SourceError> {
    source.extend();
    let mut steps = Vec::new();
    // Records queued before their state arrives end on a Barrier (no checkpoint inside):
    // they belong to the step that ends at the next state, as a transaction takes them.
    let mut before_state = Vec::new();
    loop {
        source.ready().await;
        let mut records = Records::default();
        let step = source.queue(ALL, &mut records).await?;
        before_state.extend(texts(&mut records));
        if step.resume != Resume::Barrier {
            steps.push((std::mem::take(&mut before_state), step.resume.clone()));
        }
        if step.end_of_input {
            if !before_state.is_empty() {
                steps.push((before_state, Resume::Barrier));
            }
            return Ok(steps);
        }
    }
}

const TWO_STATES: &str = r#"
    echo '{"type":"RECORD","record":{"stream":"items","data":{"id":1},"emitted_at":0}}'
    echo '{"type":"RECORD","record":{"stream":"other","data":{"id":99},"emitted_at":0}}'
    echo '{"type":"STATE","state":{"type":"STREAM","stream":{"stream_descriptor":{"name":"items"},"stream_state":{"at":1}}}}'
    echo 'a line that is not a message'
    echo '{"type":"RECORD","record":{"stream":"items","data":{"id":2},"emitted_at":0}}'
    echo '{"type":"RECORD","record":{"stream":"items","data":{"id":3},"emitted_at":0}}'
"#;

#[tokio::test]
async fn a_step_ends_at_each_state_and_the_last_one_at_the_exit() {
    let dir = tempfile::tempdir().unwrap();
    let program = script(dir.path(), TWO_STATES);
    let mut source = open(dir.path(), &program, "30s");
    let steps = read_all(&mut source).await.unwrap();
    let state = json!({"state": [{"type": "STREAM", "stream": {
        "stream_descriptor": {"name": "items"}, "stream_state": {"at": 1}}}]});
    let records: Vec<Value> = steps.iter().flat_map(|(r, _)| r.clone()).collect();
    assert_eq!(
        records,
        vec![json!({"id": 1}), json!({"id": 2}), json!({"id": 3})],
        "the unselected stream's record is not read"
    );
    assert_eq!(
        steps[0].1,
        Resume::Seek {
            position: state.clone()
        }
    );
    assert_eq!(
        steps.last().unwrap().1,
        Resume::Seek { position: state },
        "records after the last state resume from it: at-least-once"
    );
}

#[tokio::test]
async fn a_seek_hands_the_state_to_the_next_read() {
    let dir = tempfile::tempdir().unwrap();
    // Echoes the state file it was given as a record.
    let body = r#"
    state=null; while [ $# -gt 0 ]; do [ "$1" = --state ] && state=$(cat "$2"); shift; done
    echo "{\"type\":\"RECORD\",\"record\":{\"stream\":\"items\",\"data\":{\"id\":1,\"given\":$state}}}"
"#;
    let program = script(dir.path(), body);
    let mut source = open(dir.path(), &program, "30s");
    let given = json!({"cursor": 7});
    source.seek(&json!({"state": given})).await.unwrap();
    let steps = read_all(&mut source).await.unwrap();
    assert_eq!(steps[0].0, vec![json!({"id": 1, "given": {"cursor": 7}})]);
    let refused = source.seek(&json!({"offset": 3})).await.unwrap_err();
    assert!(
        refused.to_string().contains("not a connector state"),
        "{refused}"
    );
}

#[tokio::test]
async fn a_failing_connector_is_retryable_and_says_its_own_error() {
    let dir = tempfile::tempdir().unwrap();
    let body = r#"
    echo '{"type":"LOG","log":{"level":"ERROR","message":"the API answered 503"}}'
    echo 'Traceback: something' >&2
    exit 3
"#;
    let program = script(dir.path(), body);
    let mut source = open(dir.path(), &program, "30s");
    let err = read_all(&mut source).await.unwrap_err();
    assert!(err.is_retryable(), "{err}");
    let text = err.to_string();
    assert!(text.starts_with("source scripted:"), "{text}");
    assert!(
        text.contains("exit status: 3") && text.contains("the API answered 503"),
        "{text}"
    );
}

#[tokio::test]
async fn a_config_error_trace_is_not_retried() {
    let dir = tempfile::tempdir().unwrap();
    let body = r#"
    echo '{"type":"TRACE","trace":{"type":"ERROR","emitted_at":0,"error":{"message":"api_key is invalid","failure_type":"config_error"}}}'
    exit 1
"#;
    let program = script(dir.path(), body);
    let mut source = open(dir.path(), &program, "30s");
    let err = read_all(&mut source).await.unwrap_err();
    assert!(!err.is_retryable(), "{err}");
    assert!(err.to_string().contains("api_key is invalid"), "{err}");
}

/// Whether a process whose command line holds `marker` runs.
fn running(marker: &str) -> bool {
    let out = std::process::Command::new("pgrep")
        .args(["-f", marker])
        .output()
        .unwrap();
    !out.stdout.is_empty()
}

#[tokio::test]
async fn a_silent_connector_times_out_and_dropping_the_source_kills_its_group() {
    let dir = tempfile::tempdir().unwrap();
    let marker = format!("sluice-silent-{}", std::process::id());
    // A child of the connector's own: killed with its group.
    let body = format!("    sh -c 'sleep 300; echo {marker}' &\n    sleep 300\n");
    let program = script(dir.path(), &body);
    let mut source = open(dir.path(), &program, "1s");
    let err = read_all(&mut source).await.unwrap_err();
    assert!(
        matches!(err, SourceError::Timeout { .. }) && err.is_retryable(),
        "{err}"
    );
    drop(source);
    for _ in 0..100 {
        if !running(&marker) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the connector's child outlived the source");
}

#[tokio::test]
async fn a_missing_connector_names_how_to_install_it() {
    let dir = tempfile::tempdir().unwrap();
    let config: ConnectorConfig = parse(json!({
        "connector": "no-such-connector-here",
        "streams": [{"name": "items"}],
    }))
    .unwrap();
    let mut source =
        AirbyteKind::open(&Opening::standalone("missing", dir.path()), &config).unwrap();
    let err = source.probe().await.unwrap_err();
    let text = err.to_string();
    assert!(text.contains("source-no-such-connector-here"), "{text}");
    assert!(text.contains("pip install"), "{text}");
}

#[tokio::test]
async fn estimates_say_how_much_is_left_for_the_progress_line() {
    let dir = tempfile::tempdir().unwrap();
    let body = r#"
    echo '{"type":"TRACE","trace":{"type":"ESTIMATE","estimate":{"name":"items","type":"STREAM","row_estimate":10}}}'
    echo '{"type":"RECORD","record":{"stream":"items","data":{"id":1},"emitted_at":0}}'
    echo '{"type":"RECORD","record":{"stream":"items","data":{"id":2},"emitted_at":0}}'
    echo '{"type":"RECORD","record":{"stream":"items","data":{"id":3},"emitted_at":0}}'
"#;
    let program = script(dir.path(), body);
    let mut source = open(dir.path(), &program, "30s");
    assert_eq!(source.lag(), None, "nothing estimated yet");
    let steps = read_all(&mut source).await.unwrap();
    assert_eq!(steps.iter().map(|(r, _)| r.len()).sum::<usize>(), 3);
    assert_eq!(source.lag(), Some(sluice_source_sdk::Lag::Messages(7)));
}
