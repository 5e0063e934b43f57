//! The stdio transport: framing edge cases, and drivers that misbehave (exit, truncate,
//! write garbage) give clear errors naming the driver, never a hang.

use futures::StreamExt;
use sluice_driver_sdk::stdio::{FrameError, StdioEndpoint, read_frame, write_frame};
use sluice_driver_sdk::{Endpoint, Error};
use sluice_proto::materialize::{self as m, TransactionRequest, transaction_request::Open};

async fn read_spec(bytes: &[u8]) -> Result<Option<m::SpecResponse>, FrameError> {
    read_frame(&mut &bytes[..]).await
}

#[tokio::test]
async fn a_frame_round_trips() {
    let sent = m::SpecResponse {
        endpoint_spec_schema_json: "{}".into(),
        resource_spec_schema_json: r#"{"type":"object"}"#.into(),
        documentation_url: "https://example.com".into(),
    };
    let mut wire = Vec::new();
    write_frame(&mut wire, &sent).await.unwrap();
    assert_eq!(&wire[..4], &(wire.len() as u32 - 4).to_le_bytes());
    let mut input = &wire[..];
    assert_eq!(read_frame(&mut input).await.unwrap(), Some(sent));
    assert_eq!(
        read_frame::<_, m::SpecResponse>(&mut input).await.unwrap(),
        None
    );
}

#[tokio::test]
async fn eof_at_a_frame_boundary_is_a_clean_end() {
    assert!(read_spec(&[]).await.unwrap().is_none());
}

#[tokio::test]
async fn eof_inside_the_length_prefix_is_a_truncated_frame() {
    let err = read_spec(&[7, 0]).await.unwrap_err();
    assert!(
        matches!(
            err,
            FrameError::Truncated {
                expected: 4,
                got: 2
            }
        ),
        "{err}"
    );
}

#[tokio::test]
async fn eof_inside_the_body_is_a_truncated_frame() {
    let err = read_spec(&[10, 0, 0, 0, b'a', b'b']).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "stream ended inside a frame (2 of 10 bytes read)"
    );
}

#[tokio::test]
async fn a_length_over_the_maximum_is_refused_before_reading_the_body() {
    let err = read_spec(&u32::MAX.to_le_bytes()).await.unwrap_err();
    assert!(
        matches!(err, FrameError::TooLarge { len, .. } if len == u32::MAX as usize),
        "{err}"
    );
}

#[tokio::test]
async fn bytes_that_are_not_the_message_are_a_malformed_frame_naming_it() {
    let err = read_spec(&[3, 0, 0, 0, 0xff, 0xff, 0xff])
        .await
        .unwrap_err();
    assert!(
        err.to_string().starts_with("malformed SpecResponse frame"),
        "{err}"
    );
}

/// A "driver" that runs `script` under sh; the sub-command arrives as `$1`.
fn shell_driver(script: &str) -> StdioEndpoint {
    let args = vec!["-c".into(), script.into(), "fake-driver".into()];
    StdioEndpoint::new("fake", "sh", args)
}

fn transport_message(err: Error) -> String {
    match err {
        Error::Transport(message) => message,
        other => panic!("expected a transport error, got {other}"),
    }
}

#[tokio::test]
async fn a_unary_call_to_a_failing_driver_reports_its_exit_status_and_stderr() {
    let driver = shell_driver("echo \"cannot $1: bad config\" >&2; exit 3");
    let err = driver.spec(m::SpecRequest::default()).await.unwrap_err();
    let message = transport_message(err);
    assert!(message.contains("driver fake (spec)"), "{message}");
    assert!(message.contains("exit status: 3"), "{message}");
    assert!(message.contains("cannot spec: bad config"), "{message}");
}

#[tokio::test]
async fn a_driver_error_line_keeps_the_kind_of_the_error() {
    let fenced = shell_driver(
        "echo 'some log line' >&2; \
         echo 'sluice-driver-error {\"kind\":\"fenced\",\"message\":\"range 0-ff reopened\"}' >&2; \
         exit 1",
    );
    match fenced.spec(m::SpecRequest::default()).await {
        Err(Error::Fenced(message)) => assert_eq!(message, "range 0-ff reopened"),
        other => panic!("expected a fenced error, got {other:?}"),
    }
    let store = shell_driver(
        "echo 'sluice-driver-error {\"kind\":\"store\",\"message\":\"duplicate key\"}' >&2; exit 1",
    );
    let err = store.spec(m::SpecRequest::default()).await.unwrap_err();
    assert!(!err.is_retryable(), "{err}");
    assert!(matches!(&err, Error::Store { .. }), "{err}");
    assert!(err.to_string().contains("duplicate key"), "{err}");
    // A line that is not one of ours is stderr like any other.
    let garbled = shell_driver("echo 'sluice-driver-error {not json' >&2; exit 1");
    let message = transport_message(garbled.spec(m::SpecRequest::default()).await.unwrap_err());
    assert!(
        message.contains("sluice-driver-error {not json"),
        "{message}"
    );
}

#[tokio::test]
async fn a_unary_response_that_is_not_protobuf_is_a_clear_error() {
    let driver = shell_driver("cat >/dev/null; printf '\\003\\000\\000\\000\\377\\377\\377'");
    let err = driver.spec(m::SpecRequest::default()).await.unwrap_err();
    let message = transport_message(err);
    assert!(
        message.contains("malformed SpecResponse frame"),
        "{message}"
    );
}

#[tokio::test]
async fn a_driver_that_exits_without_answering_is_an_error_not_a_hang() {
    let driver = shell_driver("exit 0");
    let err = driver
        .validate(m::ValidateRequest::default())
        .await
        .unwrap_err();
    let message = transport_message(err);
    assert!(message.contains("exited without a response"), "{message}");
}

fn open_request() -> TransactionRequest {
    TransactionRequest {
        open: Some(Open::default()),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_driver_exiting_mid_stream_ends_the_stream_with_its_exit_status() {
    let driver = shell_driver("head -c 1 >/dev/null; echo 'lost my store' >&2; exit 7");
    let mut stream = driver.transactions().await.unwrap();
    stream.requests.send(open_request()).await.unwrap();
    let err = stream.responses.next().await.expect("an item").unwrap_err();
    let message = transport_message(err);
    assert!(message.contains("exited mid-stream"), "{message}");
    assert!(message.contains("exit status: 7"), "{message}");
    assert!(message.contains("lost my store"), "{message}");
    assert!(
        stream.responses.next().await.is_none(),
        "the stream ends after its error"
    );
}

#[tokio::test]
async fn a_successful_exit_before_the_runtime_closed_is_still_an_error() {
    let driver = shell_driver("head -c 1 >/dev/null; exit 0");
    let mut stream = driver.transactions().await.unwrap();
    stream.requests.send(open_request()).await.unwrap();
    let err = stream.responses.next().await.expect("an item").unwrap_err();
    assert!(transport_message(err).contains("exited mid-stream"));
}

#[tokio::test]
async fn a_truncated_frame_mid_stream_is_an_error_naming_the_driver() {
    let driver = shell_driver("printf '\\012\\000\\000\\000ab'");
    let mut stream = driver.transactions().await.unwrap();
    let err = stream.responses.next().await.expect("an item").unwrap_err();
    let message = transport_message(err);
    assert!(message.contains("driver fake (transactions)"), "{message}");
    assert!(
        message.contains("stream ended inside a frame (2 of 10 bytes read)"),
        "{message}"
    );
}

#[tokio::test]
async fn the_stream_ends_cleanly_when_the_runtime_closes_first_and_the_driver_exits_0() {
    let driver = shell_driver("cat >/dev/null");
    let stream = driver.transactions().await.unwrap();
    let mut responses = stream.responses;
    drop(stream.requests);
    assert!(responses.next().await.is_none());
}

#[tokio::test]
async fn a_program_that_cannot_start_is_an_error_naming_it() {
    let driver = StdioEndpoint::new("ghost", "/nonexistent/driver", Vec::new());
    let message = transport_message(driver.spec(m::SpecRequest::default()).await.unwrap_err());
    assert!(
        message.contains("cannot start /nonexistent/driver spec"),
        "{message}"
    );
}
