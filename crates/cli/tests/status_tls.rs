//! The metrics and status server behind TLS and a bearer token (`runtime.metrics: {listen,
//! tls, token}`), against certificates the test makes: plain HTTP gets no answer, a
//! client trusting another CA fails naming the server certificate's issuer, `/metrics`
//! and `/api` refuse a missing (401) or wrong (403) token, the page needs none, the
//! token never shows in the status API's configuration, and `sluice status --ca` reads
//! the live status over TLS with the file's token.

use sluice_http::client::Client;
use sluice_source_sdk::tls::{ClientTls, handshake_failure, server_name};
use sluice_testkit::conformance::tls::TestCertificates;
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;

use common::{SLUICE, generate, pipeline_yaml, write_lines};

const TOKEN: &str = "status-s3cret";

/// A running `sluice run`, killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A client of `address` over TLS, trusting `<ca>.crt`.
fn client(certs: &Path, address: SocketAddr, ca: &str, token: &str) -> Client {
    let tls = ClientTls {
        ca: Some(certs.join(format!("{ca}.crt"))),
        certificate: None,
        key: None,
    };
    let config = tls.client_config("tls").unwrap();
    Client::new(address, token).with_tls(config, server_name("localhost").unwrap())
}

fn get(client: &mut Client, path: &str, token: Option<&str>) -> std::io::Result<(u16, String)> {
    let auth = token.map(|t| format!("Bearer {t}"));
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
    let response = client.request("GET", path, &headers, b"")?;
    Ok((
        response.status,
        String::from_utf8_lossy(&response.body).into_owned(),
    ))
}

#[test]
fn the_status_server_takes_only_tls_and_its_token() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    std::fs::create_dir(&certs).unwrap();
    TestCertificates::make(&certs);
    write_lines(&dir.path().join("views.jsonl"), &generate(1_000, 100, 3));
    let address = common::free_address();
    let pipeline = format!(
        "{}  metrics:
    listen: {address}
    tls: {{certificate: certs/server.crt, key: certs/server.key}}
    token: \"${{STATUS_TOKEN}}\"
",
        pipeline_yaml(
            "    file: {path: views.jsonl, format: json}",
            "sqlite: {path: out/views.db}",
            false,
            1000,
            "1s",
        )
    );
    let file = dir.path().join("pipeline.yaml");
    std::fs::write(&file, pipeline).unwrap();
    let child = Command::new(SLUICE)
        .arg("run")
        .arg("--follow")
        .arg(&file)
        .env("STATUS_TOKEN", TOKEN)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut running = Running(child);

    let mut trusted = client(&certs, address, "ca", TOKEN);
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        assert!(running.0.try_wait().unwrap().is_none(), "sluice run exited");
        assert!(
            Instant::now() < deadline,
            "the status server did not answer"
        );
        if let Ok((200, body)) = get(&mut trusted, "/api/status", Some(TOKEN)) {
            break body;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.contains("\"shards\""), "{status}");
    assert!(
        !status.contains(TOKEN),
        "the token shows in the status: {status}"
    );

    // Plain HTTP: a TLS server answers none.
    let plain = Client::new(address, "").request("GET", "/", &[], b"");
    assert!(plain.is_err(), "plain HTTP was answered: {plain:?}");
    // Another CA: the error names the certificate's issuer and the file trusted.
    let err = get(&mut client(&certs, address, "other-ca", TOKEN), "/", None).unwrap_err();
    let reason = handshake_failure(&err).unwrap_or_else(|| err.to_string());
    assert!(
        reason.contains("issued by CN=Sluice test ca, not by a CA of tls.ca"),
        "{reason}"
    );
    // The token guards the data, not the page.
    for path in ["/api/status", "/metrics"] {
        assert_eq!(get(&mut trusted, path, None).unwrap().0, 401, "{path}");
        assert_eq!(
            get(&mut trusted, path, Some("wrong")).unwrap().0,
            403,
            "{path}"
        );
        assert_eq!(
            get(&mut trusted, path, Some(TOKEN)).unwrap().0,
            200,
            "{path}"
        );
    }
    assert_eq!(get(&mut trusted, "/", None).unwrap().0, 200);

    // `sluice status`: over TLS with the file's token, given the CA.
    let status = |ca: Option<&Path>| {
        let mut command = Command::new(SLUICE);
        command.arg("status").arg(&file).env("STATUS_TOKEN", TOKEN);
        if let Some(ca) = ca {
            command.arg("--ca").arg(ca);
        }
        let out = command.output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let live = status(Some(&certs.join("ca.crt")));
    assert!(live.starts_with("sluice "), "{live}");
    let without_ca = status(None);
    assert!(without_ca.contains("give --ca FILE"), "{without_ca}");
}
