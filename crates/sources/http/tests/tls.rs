//! The HTTP source over TLS with mutual authentication, against certificates the test
//! makes: plain HTTP gets no answer, a client trusting another CA fails naming the
//! server certificate's issuer, a client without a certificate or with one of another
//! CA is refused, and a client with the right certificate is answered at commit.

use serde_json::json;
use sluice_http::HttpSource;
use sluice_http::client::Client;
use sluice_http::config::HttpConfig;
use sluice_source_sdk::testing::ALL;
use sluice_source_sdk::tls::{ClientTls, handshake_failure, server_name};
use sluice_source_sdk::{Records, Source};
use sluice_testkit::conformance::tls::TestCertificates;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

const TOKEN: &str = "s3cret";

/// A client of `address` trusting `ca`, presenting `identity` (`client` →
/// `client.crt` and `client.key`) if any.
fn client(certs: &Path, address: SocketAddr, ca: &str, identity: Option<&str>) -> Client {
    let file = |name: String| -> PathBuf { certs.join(name) };
    let tls = ClientTls {
        ca: Some(file(format!("{ca}.crt"))),
        certificate: identity.map(|i| file(format!("{i}.crt"))),
        key: identity.map(|i| file(format!("{i}.key"))),
    };
    let config = tls.client_config("tls").unwrap();
    Client::new(address, TOKEN).with_tls(config, server_name("localhost").unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_lets_in_only_clients_of_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    TestCertificates::make(&certs);
    // Relative paths are the pipeline folder's.
    let mut config: HttpConfig = serde_json::from_value(json!({
        "listen": "127.0.0.1:0", "token": TOKEN,
        "tls": {"certificate": "certs/server.crt", "key": "certs/server.key",
                "client_ca": "certs/ca.crt"}
    }))
    .unwrap();
    config.check(dir.path()).unwrap();
    let state = dir.path().join("state");
    let mut source = HttpSource::new("views", &config, state);
    source.extend();
    source.queue(ALL, &mut Records::default()).await.unwrap();
    let address = source.address().unwrap();

    let certs_ = certs.clone();
    let refused = tokio::task::spawn_blocking(move || {
        let body = b"{\"id\": 1}\n";
        // Plain HTTP: the TLS server answers no HTTP.
        let plain = Client::new(address, TOKEN).ingest("views", None, body);
        assert!(plain.is_err(), "plain HTTP was answered: {plain:?}");
        // The client trusts another CA: the server's certificate names its issuer.
        let err = client(&certs_, address, "other-ca", Some("client"))
            .ingest("views", None, body)
            .unwrap_err();
        let reason = handshake_failure(&err).unwrap_or_else(|| err.to_string());
        assert!(
            reason.contains("issued by CN=Sluice test ca, not by a CA of tls.ca")
                && reason.contains("other-ca.crt"),
            "{reason}"
        );
        // No client certificate, or one of another CA: refused.
        for identity in [None, Some("other-client")] {
            let refused = client(&certs_, address, "ca", identity).ingest("views", None, body);
            assert!(refused.is_err(), "{identity:?} was let in: {refused:?}");
        }
    });
    refused.await.unwrap();

    // The right client: answered once its body's transaction commits.
    let request = std::thread::spawn(move || {
        client(&certs, address, "ca", Some("client"))
            .ingest("views", Some("k1"), b"{\"id\": 1}\n")
            .unwrap()
    });
    let mut out = Records::default();
    let step = loop {
        tokio::time::timeout(Duration::from_secs(30), source.ready())
            .await
            .expect("the body arrives");
        let step = source.queue(ALL, &mut out).await.unwrap();
        if step.records > 0 {
            break step;
        }
    };
    assert_eq!(step.records, 1, "only the right client's body was taken");
    source.committed(1, step.resume.position().unwrap());
    let answer = tokio::task::spawn_blocking(move || request.join().unwrap())
        .await
        .unwrap();
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.json(), json!({"txn": 1, "documents": 1}));
    source.disconnect().await;
}
