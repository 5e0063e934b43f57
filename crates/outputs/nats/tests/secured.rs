//! The nats output against a private server requiring TLS and a user
//! (`sluice_testkit::nats::SecuredNats`): plain text, a certificate of another CA and a
//! wrong password are refused naming what to change, never retried; the right settings
//! publish transactions that read back once each, a replayed one discarded.

use serde_json::{Value, json};
use sluice_nats_output::kind;
use sluice_nats_output::read::read_subject_on;
use sluice_output_sdk::{
    BatchKind, Buffer, Format, Generation, GenerationId, OutputEndpoint, OutputError, Target,
};
use sluice_testkit::nats::{PASSWORD, SecuredNats, USER};

const SUBJECT: &str = "secured.views";

/// An endpoint of `generation` publishing to [`SUBJECT`] with `config`.
fn endpoint(config: &Value, generation: Generation) -> Box<dyn OutputEndpoint> {
    let target = Target {
        materialization: "acme/secured".into(),
        resource: json!({ "subject": SUBJECT }),
        format: Format::Json,
        header: None,
        generation,
        former_writers: false,
    };
    (kind().endpoint)(config, target).unwrap()
}

fn new_generation() -> Generation {
    Generation {
        id: GenerationId::mint(),
        adopts_unstamped: false,
    }
}

/// The error of opening an endpoint of `config`: a configuration error, which a retry
/// cannot mend.
async fn refused(config: Value) -> String {
    let error = endpoint(&config, new_generation())
        .open()
        .await
        .unwrap_err();
    assert!(matches!(error, OutputError::Config(_)), "{error}");
    assert!(!error.is_retryable(), "{error}");
    error.to_string()
}

/// Publishes transaction `txn`: `count` changes.
async fn write(endpoint: &mut dyn OutputEndpoint, txn: u64, count: u64) {
    let mut buffer = Buffer::default();
    buffer.start(txn);
    endpoint.batch_start(txn, BatchKind::Delta).await.unwrap();
    for index in 0..count {
        let key = json!({ "id": index }).to_string();
        let value = json!({"insert": {"id": index, "txn": txn}}).to_string();
        buffer.push(key.as_bytes(), value.as_bytes());
    }
    endpoint.push(&buffer).await.unwrap();
    buffer.pushed();
    endpoint.batch_end().await.unwrap();
}

#[tokio::test]
async fn a_tls_server_refuses_plain_text_another_ca_and_a_wrong_password_naming_them() {
    let server = SecuredNats::start(&nkeys::KeyPair::new_user().public_key());
    let user = json!({"user": USER, "password": PASSWORD});
    let (ca, other_ca) = (
        server.certificates.file("ca.crt"),
        server.certificates.file("other-ca.crt"),
    );

    let plain = format!("nats://localhost:{}", server.server.port());
    let error = refused(json!({"url": plain, "auth": user})).await;
    assert!(error.contains("the server requires TLS"), "{error}");

    let error = refused(json!({"url": server.url(), "tls": {"ca": other_ca}, "auth": user})).await;
    assert!(error.contains("issued by CN=Sluice test ca"), "{error}");

    let wrong = "not-the-password";
    let error = refused(json!({
        "url": server.url(), "tls": {"ca": ca}, "auth": {"user": USER, "password": wrong}
    }))
    .await;
    assert!(error.contains("refused user sluice"), "{error}");
    assert!(!error.contains(wrong), "{error}");
}

#[tokio::test]
async fn the_right_settings_publish_each_transaction_once_and_read_back_by_nkey() {
    let nkey = nkeys::KeyPair::new_user();
    let server = SecuredNats::start(&nkey.public_key());
    let secrets = tempfile::tempdir().unwrap();
    let (password, seed) = (
        secrets.path().join("password"),
        secrets.path().join("user.nk"),
    );
    std::fs::write(&password, PASSWORD).unwrap();
    std::fs::write(&seed, nkey.seed().unwrap()).unwrap();
    let tls = json!({"ca": server.certificates.file("ca.crt")});
    // Paths as the runtime hands them over: made absolute against the pipeline's folder.
    let config = json!({
        "url": server.url(), "stream": "SECURED", "tls": tls,
        "auth": {"user": USER, "password_file": password}
    });

    let generation = new_generation();
    let mut first = endpoint(&config, generation);
    first.open().await.unwrap();
    write(&mut *first, 1, 3).await;
    write(&mut *first, 2, 2).await;
    drop(first);
    // A restart replays transaction 2: the tail discards it; 3 is new.
    let mut replaying = endpoint(&config, generation);
    replaying.open().await.unwrap();
    write(&mut *replaying, 2, 2).await;
    write(&mut *replaying, 3, 1).await;
    replaying.close().await;

    let reader: sluice_nats_output::Config = serde_json::from_value(json!({
        "url": server.url(), "tls": tls, "auth": {"nkey_file": seed}
    }))
    .unwrap();
    let read = read_subject_on(&reader.server(), SUBJECT).await.unwrap();
    let places: Vec<(u64, u64)> = read.iter().map(|m| (m.stamp.txn, m.stamp.index)).collect();
    assert_eq!(places, [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (3, 0)]);
}
