//! The NATS source against private servers requiring TLS and a user, or a token
//! (`sluice_testkit::nats`): plain text, a certificate of another CA and wrong
//! credentials are refused naming what to change, never retried; the right settings
//! (a password, an NKey, a token, a client certificate) read a stream and replay its
//! steps exactly as on the shared server.

use bytes::Bytes;
use serde_json::{Value, json};
use sluice_nats::admin::Admin;
use sluice_nats::{NatsConfig, NatsSource};
use sluice_source_sdk::config::parse;
use sluice_source_sdk::testing::{parsed_docs, records};
use sluice_source_sdk::{Records, Source, SourceError, Step};
use sluice_testkit::conformance::tls::TestCertificates;
use sluice_testkit::nats::{PASSWORD, PrivateNats, SecuredNats, USER};
use std::path::Path;
use std::time::Duration;

const STREAM: &str = "SECURED";
const TOKEN: &str = "t0ken-of-the-test";

/// A source of `config`, checked as a pipeline in `base_dir` would be.
fn source(config: Value, base_dir: &Path) -> NatsSource {
    let mut config: NatsConfig = parse(config).unwrap();
    config.check(base_dir).unwrap();
    NatsSource::new("events", &config)
}

/// The error of reaching the server with `config`: a configuration error, which a
/// retry cannot mend.
async fn refused(config: Value) -> String {
    let error = source(config, Path::new("/")).probe().await.unwrap_err();
    assert!(matches!(error, SourceError::Config { .. }), "{error}");
    assert!(!error.is_retryable(), "{error}");
    error.to_string()
}

/// Makes [`STREAM`] through `config`'s connection and publishes `docs` to it.
async fn publish(config: &Value, base_dir: &Path, docs: &[Value]) {
    let mut config: NatsConfig = parse(config.clone()).unwrap();
    config.check(base_dir).unwrap();
    let admin = Admin::connect_to(&config.server()).await.unwrap();
    let subject = format!("{STREAM}.views");
    admin.create_stream(STREAM, &[&subject]).await.unwrap();
    let payloads = docs.iter().map(|doc| Bytes::from(doc.to_string()));
    admin.publish_batch(&subject, payloads).await.unwrap();
}

/// Steps of at most 4 records until `n` documents were read; bounded, so a hang fails.
async fn read_steps(source: &mut NatsSource, n: usize) -> Vec<(Vec<Value>, Step)> {
    let reading = async {
        let mut steps = Vec::new();
        let mut read = 0;
        while read < n {
            source.ready().await;
            let mut out = Records::default();
            let step = source.queue(records(4), &mut out).await.unwrap();
            let docs = parsed_docs(&mut out);
            read += docs.len();
            if !docs.is_empty() {
                steps.push((docs, step));
            }
        }
        steps
    };
    tokio::time::timeout(Duration::from_secs(60), reading)
        .await
        .expect("the source hung")
}

/// Reads the whole stream with `config`, then replays each step with a fresh source:
/// every document once, in order, and each step again exactly.
async fn reads_exactly_once(config: Value, base_dir: &Path, docs: &[Value]) {
    let steps = read_steps(&mut source(config.clone(), base_dir), docs.len()).await;
    let read: Vec<Value> = steps.iter().flat_map(|(d, _)| d.clone()).collect();
    assert_eq!(read, docs, "{config}");
    for (docs, step) in &steps {
        let mut out = Records::default();
        let mut fresh = source(config.clone(), base_dir);
        let replayed = fresh.replay(&step.resume, &mut out).await.unwrap();
        assert_eq!(&parsed_docs(&mut out), docs, "{config}");
        assert_eq!(replayed.resume, step.resume);
    }
}

fn docs(n: u64) -> Vec<Value> {
    (0..n).map(|i| json!({"id": i})).collect()
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
    let error = refused(json!({"url": plain, "stream": STREAM, "auth": user})).await;
    assert!(error.contains("the server requires TLS"), "{error}");
    assert!(error.contains("tls://"), "{error}");

    let error = refused(json!({
        "url": server.url(), "stream": STREAM, "tls": {"ca": other_ca}, "auth": user
    }))
    .await;
    assert!(error.contains("issued by CN=Sluice test ca"), "{error}");
    assert!(error.contains("tls.ca"), "{error}");

    let wrong = "not-the-password";
    let error = refused(json!({
        "url": server.url(), "stream": STREAM, "tls": {"ca": ca},
        "auth": {"user": USER, "password": wrong}
    }))
    .await;
    assert!(error.contains("refused user sluice"), "{error}");
    assert!(error.contains("auth.password"), "{error}");
    assert!(!error.contains(wrong), "{error}");
}

#[tokio::test]
async fn the_right_ca_with_a_password_file_or_an_nkey_reads_a_stream_exactly_once() {
    let nkey = nkeys::KeyPair::new_user();
    let server = SecuredNats::start(&nkey.public_key());
    // Secret files relative to the pipeline's folder, as a pipeline file names them.
    let pipeline = tempfile::tempdir().unwrap();
    std::fs::write(pipeline.path().join("password"), format!("{PASSWORD}\n")).unwrap();
    std::fs::write(pipeline.path().join("user.nk"), nkey.seed().unwrap()).unwrap();
    let config = |url: String, auth: Value| {
        json!({
            "url": url, "stream": STREAM, "meta": null,
            "tls": {"ca": server.certificates.file("ca.crt")}, "auth": auth
        })
    };
    let input = docs(10);
    let by_password = config(
        server.url(),
        json!({"user": USER, "password_file": "password"}),
    );
    publish(&by_password, pipeline.path(), &input).await;
    reads_exactly_once(by_password, pipeline.path(), &input).await;
    // `tls` set is TLS with a nats:// url too.
    let plain_scheme = format!("nats://localhost:{}", server.server.port());
    let by_nkey = config(plain_scheme, json!({"nkey_file": "user.nk"}));
    reads_exactly_once(by_nkey, pipeline.path(), &input).await;
}

#[tokio::test]
async fn a_server_verifying_clients_refuses_none_or_another_cas_and_takes_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let certificates = TestCertificates::make(dir.path());
    let file = |name: &str| certificates.file(name);
    let server = PrivateNats::start(&format!(
        "tls {{ cert_file: {:?}, key_file: {:?}, ca_file: {:?}, verify: true }}",
        file("server.crt"),
        file("server.key"),
        file("ca.crt"),
    ));
    let url = format!("tls://localhost:{}", server.port());
    let config = |tls: Value| json!({"url": url, "stream": STREAM, "meta": null, "tls": tls});

    // No client certificate, or one of another CA: the server's alert, said plainly.
    let error = refused(config(json!({"ca": file("ca.crt")}))).await;
    assert!(
        error.contains("refused this client's certificate"),
        "{error}"
    );
    let other = json!({"ca": file("ca.crt"), "certificate": file("other-client.crt"),
                       "key": file("other-client.key")});
    let error = refused(config(other)).await;
    assert!(
        error.contains("refused this client's certificate"),
        "{error}"
    );

    let own = config(
        json!({"ca": file("ca.crt"), "certificate": file("client.crt"),
                            "key": file("client.key")}),
    );
    let input = docs(3);
    publish(&own, dir.path(), &input).await;
    reads_exactly_once(own, dir.path(), &input).await;
}

#[tokio::test]
async fn a_token_server_refuses_a_wrong_token_or_none_and_takes_the_token_file() {
    let server = PrivateNats::start(&format!("authorization {{ token: {TOKEN:?} }}"));
    let url = format!("nats://127.0.0.1:{}", server.port());

    let wrong = "not-the-token";
    let error = refused(json!({"url": url, "stream": STREAM, "auth": {"token": wrong}})).await;
    assert!(error.contains("refused the token"), "{error}");
    assert!(!error.contains(wrong), "{error}");
    let error = refused(json!({"url": url, "stream": STREAM})).await;
    assert!(
        error.contains("the server requires authentication"),
        "{error}"
    );
    assert!(
        error.contains("set auth (user and password, token"),
        "{error}"
    );

    let pipeline = tempfile::tempdir().unwrap();
    std::fs::write(pipeline.path().join("token"), TOKEN).unwrap();
    let config = json!({
        "url": url, "stream": STREAM, "meta": null, "auth": {"token_file": "token"}
    });
    let input = docs(6);
    publish(&config, pipeline.path(), &input).await;
    reads_exactly_once(config, pipeline.path(), &input).await;
}
