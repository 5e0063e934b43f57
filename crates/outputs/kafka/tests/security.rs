//! The kafka output against a broker requiring TLS and SASL (a private tansu behind a
//! TLS-terminating proxy: tansu 0.6.0 cannot serve TLS itself): plain text is refused
//! saying TLS is required, a CA the broker's certificate does not chain to fails
//! naming its issuer, a wrong password fails naming the user and the mechanism, each a
//! configuration error (not retried); with the right settings a transaction is
//! produced and read back.

use serde_json::{Value, json};
use sluice_kafka_output::read::read_topic_over;
use sluice_output_sdk::{
    BatchKind, Buffer, Format, Generation, GenerationId, OutputEndpoint, OutputError, Target,
};
use sluice_testkit::conformance::tls::TestCertificates;
use sluice_testkit::tansu::{PASSWORD, SecuredTansu, USER};

fn endpoint(config: &Value) -> Box<dyn OutputEndpoint> {
    let target = Target {
        materialization: "acme/views-out".into(),
        resource: json!({"topic": "views-out"}),
        format: Format::Json,
        header: None,
        generation: Generation {
            id: GenerationId::mint(),
            adopts_unstamped: false,
        },
        former_writers: false,
    };
    (sluice_kafka_output::kind().endpoint)(config, target).unwrap()
}

/// The configuration error opening an endpoint of `config` fails with.
async fn refusal(config: Value) -> String {
    match endpoint(&config).open().await {
        Err(OutputError::Config(message)) => message,
        other => panic!("expected a configuration error, got {:?}", other.err()),
    }
}

#[tokio::test]
async fn a_secured_broker_takes_messages_only_with_its_ca_and_user() {
    let dir = tempfile::tempdir().unwrap();
    let certificates = TestCertificates::make(dir.path());
    let broker = SecuredTansu::start(&certificates).await;
    let brokers = broker.address();
    let login = json!({"mechanism": "SCRAM-SHA-512", "username": USER, "password": PASSWORD});
    let ca = certificates.file("ca.crt");

    let err = refusal(json!({"brokers": brokers, "sasl": login})).await;
    assert!(
        err.contains("it requires TLS; set tls"),
        "{err}\n{}",
        broker.log()
    );

    let other_ca = json!({"ca": certificates.file("other-ca.crt")});
    let err = refusal(json!({"brokers": brokers, "tls": other_ca, "sasl": login})).await;
    assert!(err.contains("issued by CN=Sluice test ca"), "{err}");

    let wrong = json!({"mechanism": "SCRAM-SHA-512", "username": USER, "password": "nope-1"});
    let err = refusal(json!({"brokers": brokers, "tls": {"ca": ca}, "sasl": wrong})).await;
    let named = format!("refused user \"{USER}\" authenticating with SCRAM-SHA-512");
    assert!(err.contains(&named), "{err}\n{}", broker.log());
    assert!(!err.contains("nope-1"), "{err}");

    let config = json!({"brokers": brokers, "tls": {"ca": ca}, "sasl": login});
    let mut out = endpoint(&config);
    out.open().await.unwrap();
    out.batch_start(1, BatchKind::Delta).await.unwrap();
    let mut buffer = Buffer::default();
    buffer.start(1);
    for i in 0..3 {
        buffer.push(
            format!("{{\"id\":{i}}}").as_bytes(),
            format!("{{\"n\":{i}}}").as_bytes(),
        );
    }
    out.push(&buffer).await.unwrap();
    out.batch_end().await.unwrap();

    let config: sluice_kafka_output::Config = sluice_output_sdk::config::parse(&config).unwrap();
    let written = read_topic_over(&config.connector().unwrap(), "views-out")
        .await
        .unwrap();
    let values: Vec<&[u8]> = written.iter().map(|w| w.value.as_slice()).collect();
    assert_eq!(values, [&b"{\"n\":0}"[..], b"{\"n\":1}", b"{\"n\":2}"]);
    assert!(written.iter().all(|w| w.stamp.txn == 1), "{written:?}");
}
