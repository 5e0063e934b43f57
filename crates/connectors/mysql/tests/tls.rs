//! TLS against a private MariaDB server that accepts TLS connections only
//! (`require_secure_transport`), with the certificates of
//! [`sluice_testkit::conformance::tls`] (the server's names `localhost` only):
//! `VERIFY_IDENTITY` with the CA connects to `localhost` and passes the conformance
//! suite; plain connections are refused; a wrong CA, or a host the certificate does
//! not name, fails naming the certificate problem; `REQUIRED` and `PREFERRED` connect
//! without a CA. And a server without TLS fails `REQUIRED` naming the option.
//!
//! The server is `mariadb-install-db` + `mariadbd --user=root` on a spare port in a
//! temporary directory, shut down (and its directory removed) at the end.

use mysql_async::prelude::Queryable;
use serde_json::json;
use sluice_conformance::{Capabilities, assert_all_pass, run_suite};
use sluice_driver_sdk::Error;
use sluice_driver_sdk::inprocess::InProcess;
use sluice_mysql::MysqlDriver;
use sluice_mysql::client;
use sluice_mysql::config::EndpointConfig;
use sluice_testkit::conformance::tls::TestCertificates;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

/// A private server accepting TLS only, killed when dropped.
struct TlsServer {
    dir: tempfile::TempDir,
    certificates: TestCertificates,
    server: Child,
    port: u16,
}

impl TlsServer {
    async fn start() -> TlsServer {
        let dir = tempfile::tempdir().unwrap();
        let certificates = TestCertificates::make(dir.path());
        let data = format!("--datadir={}/data", dir.path().display());
        let out = Command::new("mariadb-install-db")
            .args(["--no-defaults", &data, "--user=root"])
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"])
            .output()
            .expect("running mariadb-install-db");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .unwrap()
            .port();
        let socket = format!("--socket={}/mysqld.sock", dir.path().display());
        let server = Command::new("mariadbd")
            .args(["--no-defaults", &data, &socket, "--user=root"])
            .args([format!("--port={port}"), "--bind-address=127.0.0.1".into()])
            .args(["--skip-log-bin", "--innodb-buffer-pool-size=16M"])
            .arg(format!("--ssl-cert={}", certificates.file("server.crt")))
            .arg(format!("--ssl-key={}", certificates.file("server.key")))
            .arg(format!("--ssl-ca={}", certificates.file("ca.crt")))
            .arg("--require-secure-transport=ON")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting mariadbd");
        let server = TlsServer {
            dir,
            certificates,
            server,
            port,
        };
        server.wait_until_ready().await;
        server
    }

    /// Waits until a TLS login succeeds, then creates the database `tls`.
    async fn wait_until_ready(&self) {
        let url = format!(
            "mysql://root@127.0.0.1:{}/mysql?require_ssl=true&verify_ca=false",
            self.port
        );
        for _ in 0..600 {
            if let Ok(mut conn) = mysql_async::Conn::from_url(&url).await {
                conn.query_drop("CREATE DATABASE tls").await.unwrap();
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!(
            "the private MariaDB server in {} never accepted a login",
            self.dir.path().display()
        );
    }

    /// The endpoint of `host` with the URL options `query`.
    fn endpoint(&self, host: &str, query: &str) -> serde_json::Value {
        json!({ "url": format!("mysql://root@{host}:{}/tls?{query}", self.port) })
    }

    /// Connects with the driver's own client as `endpoint` says.
    async fn connect(&self, endpoint: &serde_json::Value) -> Result<(), Error> {
        let config = EndpointConfig::parse(&endpoint.to_string())?;
        let (conn, _) = client::connect(&config).await?;
        conn.disconnect()
            .await
            .map_err(|err| client::my_error("disconnecting", err))
    }
}

impl Drop for TlsServer {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// The message of a store error that retrying cannot fix.
fn permanent(result: Result<(), Error>) -> String {
    match result {
        Err(Error::Store {
            context,
            message,
            retryable: false,
        }) => format!("{context}: {message}"),
        other => panic!("expected a store error that is not retryable, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_connections_are_verified_as_ssl_mode_says_and_plain_ones_refused() {
    let server = TlsServer::start().await;
    let (ca, other_ca) = (
        server.certificates.file("ca.crt"),
        server.certificates.file("other-ca.crt"),
    );

    let identity = format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={ca}");
    let driver = InProcess::new("mysql", Arc::new(MysqlDriver::new()));
    let endpoint = server.endpoint("localhost", &identity);
    let results = run_suite(
        &driver,
        Capabilities::ALL,
        endpoint,
        json!({ "table": "conf" }),
    )
    .await;
    assert_all_pass(&results);

    let plain = permanent(
        server
            .connect(&server.endpoint("127.0.0.1", "ssl-mode=DISABLED"))
            .await,
    );
    assert!(plain.contains("Access denied"), "{plain}");

    let wrong_ca = format!("ssl-mode=VERIFY_IDENTITY&ssl-ca={other_ca}");
    let err = permanent(
        server
            .connect(&server.endpoint("localhost", &wrong_ca))
            .await,
    );
    assert!(
        err.contains(&format!("ssl-mode=VERIFY_IDENTITY ssl-ca={other_ca}: the server's certificate does not verify: UnknownIssuer")),
        "{err}"
    );
    let err = permanent(
        server
            .connect(&server.endpoint("127.0.0.1", &identity))
            .await,
    );
    assert!(
        err.contains("does not verify: certificate not valid for name"),
        "{err}"
    );
    let chain = format!("ssl-mode=VERIFY_CA&ssl-ca={other_ca}");
    let err = permanent(server.connect(&server.endpoint("localhost", &chain)).await);
    assert!(err.contains("does not verify: UnknownIssuer"), "{err}");
    let chain = format!("ssl-mode=VERIFY_CA&ssl-ca={ca}");
    server
        .connect(&server.endpoint("localhost", &chain))
        .await
        .unwrap();

    for unchecked in ["ssl-mode=REQUIRED", "ssl-mode=PREFERRED", ""] {
        server
            .connect(&server.endpoint("127.0.0.1", unchecked))
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_without_tls_fails_required_naming_the_option() {
    // The shared test server runs without TLS (have_ssl DISABLED).
    let url = std::env::var("SLUICE_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".to_owned());
    let endpoint = json!({ "url": format!("{url}?ssl-mode=REQUIRED") });
    let config = EndpointConfig::parse(&endpoint.to_string()).unwrap();
    let err = client::connect(&config).await.map(drop);
    let err = permanent(err);
    assert!(
        err.contains("ssl-mode=REQUIRED: the server does not accept TLS connections"),
        "{err}"
    );
    // PREFERRED, the default, falls back to plain text.
    let endpoint = json!({ "url": url });
    let config = EndpointConfig::parse(&endpoint.to_string()).unwrap();
    client::connect(&config).await.unwrap();
}
