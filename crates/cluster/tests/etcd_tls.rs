//! The etcd client over TLS against a private etcd that requires client certificates
//! (`--client-cert-auth`), with certificates the test makes: plain HTTP gets nothing, a
//! client trusting another CA fails naming the server certificate's issuer, a client
//! without a certificate or with one of another CA is refused, and the right client
//! writes and reads.

use sluice_cluster::etcd::Etcd;
use sluice_testkit::conformance::tls::TestCertificates;
use sluice_testkit::etcd::PrivateEtcd;
use sluice_tls::ClientTls;
use std::path::Path;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(3);

fn client(certs: &Path, url: &str, ca: &str, identity: Option<&str>) -> Etcd {
    let tls = ClientTls {
        ca: Some(certs.join(format!("{ca}.crt"))),
        certificate: identity.map(|i| certs.join(format!("{i}.crt"))),
        key: identity.map(|i| certs.join(format!("{i}.key"))),
    };
    let connector = tls.connector("cluster.tls").unwrap();
    Etcd::connect(&[url.to_string()], TIMEOUT, Some(&connector)).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_reach_etcd_only_over_tls_with_a_certificate_of_its_ca() {
    let certs = tempfile::tempdir().unwrap();
    TestCertificates::make(certs.path());
    let server = PrivateEtcd::start_tls(certs.path());
    let url = server.url();
    let certs = certs.path();

    // The right client: written and read back.
    let etcd = client(certs, &url, "ca", Some("client"));
    let mut attempts = 0;
    while let Err(e) = etcd.put("/tls/k", b"v".to_vec(), 0).await {
        attempts += 1;
        assert!(attempts < 50, "the right client could not write: {e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let read = etcd.get("/tls/k").await.unwrap().expect("the key");
    assert_eq!(read.value, b"v");

    // Plain HTTP to the TLS port: refused (https:// needs cluster.tls, and http:// to
    // the same port gets no gRPC answer).
    let plain_url = url.replace("https://", "http://");
    let plain = Etcd::connect(&[plain_url], TIMEOUT, None).unwrap();
    assert!(
        plain.get("/tls/k").await.is_err(),
        "plain text was answered"
    );
    let https_without_tls = Etcd::connect(std::slice::from_ref(&url), TIMEOUT, None)
        .err()
        .expect("https:// without tls is refused");
    assert!(
        https_without_tls.to_string().contains("needs cluster.tls"),
        "{https_without_tls}"
    );

    // Trusting another CA: the error names the server certificate's issuer.
    let err = (client(certs, &url, "other-ca", Some("client"))
        .get("/tls/k")
        .await)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("issued by CN=Sluice test ca, not by a CA of cluster.tls.ca"),
        "{err}"
    );

    // No client certificate, or one of another CA: refused by etcd.
    for identity in [None, Some("other-client")] {
        let refused = client(certs, &url, "ca", identity).get("/tls/k").await;
        assert!(refused.is_err(), "{identity:?} was let in: {refused:?}");
    }
}
