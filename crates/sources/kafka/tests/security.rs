//! The Kafka source against a broker requiring TLS and SASL (a private tansu behind a
//! TLS-terminating proxy: tansu 0.6.0 cannot serve TLS itself): plain text is refused
//! saying TLS is required, a CA the broker's certificate does not chain to fails
//! naming its issuer, a wrong password fails naming the user and the mechanism, none of
//! them retried; with the right settings the topic is read.

use serde_json::{Value, json};
use sluice_kafka::admin::Admin;
use sluice_kafka::{KafkaConfig, KafkaKind, KafkaSource};
use sluice_kafka_client::Connector;
use sluice_source_sdk::testing::{ALL, parsed_docs};
use sluice_source_sdk::{Records, Source, SourceError, kind};
use sluice_testkit::conformance::tls::TestCertificates;
use sluice_testkit::tansu::{PASSWORD, SecuredTansu, USER};
use std::path::Path;
use std::time::{Duration, Instant};

/// The source's configuration as a pipeline file in `dir` writes it: `tls` and `sasl`
/// merged in, their files relative to `dir`.
fn config(dir: &Path, broker: &str, topic: &str, security: Value) -> KafkaConfig {
    let mut config = json!({"brokers": broker, "topic": topic, "format": "json", "meta": null});
    for (key, value) in security.as_object().unwrap() {
        config[key] = value.clone();
    }
    let parsed = kind::<KafkaKind>().parse(config, dir).unwrap();
    parsed.get::<KafkaConfig>().unwrap().clone()
}

/// The error probing a source of `config` fails with, which must not be retryable.
async fn refusal(config: &KafkaConfig) -> String {
    let err = KafkaSource::new("views", config).probe().await.unwrap_err();
    assert!(!err.is_retryable(), "retryable: {err}");
    err.to_string()
}

#[tokio::test]
async fn a_secured_broker_is_read_only_with_its_ca_and_user() {
    let dir = tempfile::tempdir().unwrap();
    let certificates = TestCertificates::make(dir.path());
    let broker = SecuredTansu::start(&certificates).await;
    let address = broker.address();
    std::fs::write(dir.path().join("password"), format!("{PASSWORD}\n")).unwrap();
    let login = json!({"mechanism": "SCRAM-SHA-256", "username": USER,
                       "password_file": "password"});
    let secured = json!({"tls": {"ca": "ca.crt"}, "sasl": login});

    let plain = config(dir.path(), &address, "views", json!({"sasl": login}));
    let err = refusal(&plain).await;
    assert!(
        err.contains("it requires TLS; set tls"),
        "{err}\n{}",
        broker.log()
    );

    let other_ca = json!({"tls": {"ca": "other-ca.crt"}, "sasl": login});
    let err = refusal(&config(dir.path(), &address, "views", other_ca)).await;
    assert!(err.contains("issued by CN=Sluice test ca"), "{err}");

    let wrong = json!({"tls": {"ca": "ca.crt"}, "sasl": {"mechanism": "SCRAM-SHA-256",
                       "username": USER, "password": "not-the-password"}});
    let err = refusal(&config(dir.path(), &address, "views", wrong)).await;
    let named = format!("refused user \"{USER}\" authenticating with SCRAM-SHA-256");
    assert!(err.contains(&named), "{err}\n{}", broker.log());
    assert!(!err.contains("not-the-password"), "{err}");

    let config = config(dir.path(), &address, "views", secured);
    let (tls, sasl) = (config.tls.as_ref(), config.sasl.as_ref());
    let connector = Connector::new("test", &config.brokers, tls, sasl).unwrap();
    let admin = Admin::over(&connector).await.unwrap();
    admin.create_topic("views", 1).await.unwrap();
    let messages = (0..3).map(|i| (None, json!({"i": i}).to_string().into_bytes()));
    admin.produce("views", 0, messages).await.unwrap();

    let mut source = KafkaSource::new("views", &config);
    source.probe().await.unwrap();
    assert_eq!(
        read_to_end(&mut source).await.unwrap(),
        [json!({"i": 0}), json!({"i": 1}), json!({"i": 2})]
    );
}

/// Every document until a step ends the input.
async fn read_to_end(source: &mut KafkaSource) -> Result<Vec<Value>, SourceError> {
    source.extend();
    let mut docs = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(Instant::now() < deadline, "the source never caught up");
        let _ = tokio::time::timeout(Duration::from_millis(200), source.ready()).await;
        let mut out = Records::default();
        let step = source.queue(ALL, &mut out).await?;
        docs.extend(parsed_docs(&mut out));
        if step.end_of_input {
            return Ok(docs);
        }
    }
}
