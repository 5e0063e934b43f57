//! The current protocol to a child process, against scripted drivers that misbehave:
//! a response the protocol does not allow ends the Transactions stream with an error
//! naming it, a unary call the driver answers and then fails is an error carrying its
//! reported kind, and one it does not answer names the call.

use futures::StreamExt;
use sluice_driver_sdk::current::Codec;
use sluice_driver_sdk::current::endpoint::CurrentEndpoint;
use sluice_driver_sdk::current::stdio::CurrentCommand;
use sluice_driver_sdk::{Endpoint, Error};
use sluice_proto::materialize::{self as m, transaction_request::Open};

/// A current-protocol endpoint running `sh -c SCRIPT`, in the JSON codec.
fn scripted(script: &str) -> CurrentEndpoint {
    let args = vec!["-c".to_string(), script.to_string()];
    CurrentEndpoint::new(
        "scripted",
        CurrentCommand::new("scripted", "sh", args, Codec::Json),
    )
}

#[tokio::test]
async fn a_response_out_of_order_ends_the_transactions_stream_naming_it() {
    // Answers Open with Loaded, which only a Load may be answered with.
    let endpoint =
        scripted(r#"read line; echo '{"loaded": {"binding": 0, "docJson": {}}}'; sleep 5"#);
    let mut stream = endpoint.transactions().await.unwrap();
    let open = m::TransactionRequest {
        open: Some(Open {
            materialization: Some(Default::default()),
            ..Default::default()
        }),
        ..Default::default()
    };
    stream.requests.send(open).await.unwrap();
    let err = loop {
        match stream.responses.next().await {
            Some(Ok(_)) => continue,
            Some(Err(err)) => break err,
            None => panic!("the stream ended without an error"),
        }
    };
    assert!(err.to_string().contains("Loaded"), "{err}");
    assert!(stream.responses.next().await.is_none(), "the error ends it");
}

#[tokio::test]
async fn a_unary_call_failing_with_an_error_line_keeps_its_kind() {
    let endpoint = scripted(
        r#"cat >/dev/null; echo 'sluice-driver-error {"kind": "config", "message": "no such table"}' >&2; exit 1"#,
    );
    let err = endpoint
        .validate(m::ValidateRequest::default())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::Config(m) if m == "no such table"),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_driver_exiting_without_an_answer_names_the_call() {
    let endpoint = scripted("cat >/dev/null; exit 0");
    let err = endpoint
        .spec(m::SpecRequest::default())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("Spec") && err.contains("without a response"),
        "{err}"
    );
}
