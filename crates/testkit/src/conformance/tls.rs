//! Certificates for the SQL drivers' TLS tests, made by the `openssl` command in a
//! directory of the test's: a CA, a second CA, a server certificate signed by the first
//! that names `localhost` only (no IP address), so a test can tell a chain check
//! (`verify-ca`) from a host check (`verify-full`) by connecting to `localhost` or to
//! `127.0.0.1`, and a client certificate signed by each CA (`client`, `other-client`),
//! for mutual TLS. And [`SilentServer`], a server hung
//! after accepting, [`closed_port`] and [`retryable_failure`], for the drivers' connect
//! tests.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The files [`TestCertificates::make`] wrote.
pub struct TestCertificates {
    dir: PathBuf,
}

impl TestCertificates {
    /// Writes `ca.crt`, `other-ca.crt`, `server.crt`/`.key`, `client.crt`/`.key` and
    /// `other-client.crt`/`.key` (and their by-products) into `dir`; panics with
    /// openssl's output if it fails.
    pub fn make(dir: &Path) -> TestCertificates {
        let certificates = TestCertificates {
            dir: dir.to_path_buf(),
        };
        for ca in ["ca", "other-ca"] {
            let (key, crt, subject) = (
                format!("{ca}.key"),
                format!("{ca}.crt"),
                format!("/CN=Sluice test {ca}"),
            );
            certificates.openssl(&[
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-keyout", &key,
                "-out", &crt, "-subj", &subject,
            ]);
        }
        certificates.sign(
            "server",
            "/CN=localhost",
            "ca",
            "subjectAltName=DNS:localhost",
        );
        certificates.sign(
            "client",
            "/CN=sluice test client",
            "ca",
            "extendedKeyUsage=clientAuth",
        );
        certificates.sign(
            "other-client",
            "/CN=sluice other client",
            "other-ca",
            "extendedKeyUsage=clientAuth",
        );
        certificates
    }

    /// Writes `<name>.key` and `<name>.crt`, for `subject`, signed by `<ca>.crt` with
    /// the extension `extension`.
    fn sign(&self, name: &str, subject: &str, ca: &str, extension: &str) {
        let (key, csr, ext, crt) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.ext"),
            format!("{name}.crt"),
        );
        std::fs::write(self.dir.join(&ext), format!("{extension}\n")).expect("writing an ext file");
        self.openssl(&[
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj", subject,
        ]);
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &format!("{ca}.crt"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &ext,
            "-out",
            &crt,
        ]);
    }

    /// The path of one of the files, e.g. `ca.crt`, as a URL option's value.
    pub fn file(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }

    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .current_dir(&self.dir)
            .args(args)
            .output()
            .expect("running openssl");
        assert!(
            out.status.success(),
            "openssl {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A port on 127.0.0.1 that accepts TCP connections and never answers, as a hung server
/// does; it stops listening when dropped.
pub struct SilentServer {
    pub port: u16,
    accepting: tokio::task::JoinHandle<()>,
}

impl SilentServer {
    pub async fn start() -> SilentServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binding a silent server");
        let port = listener.local_addr().expect("its address").port();
        let accepting = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((connection, _)) = listener.accept().await {
                held.push(connection);
            }
        });
        SilentServer { port, accepting }
    }
}

impl Drop for SilentServer {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// A port on 127.0.0.1 that nobody listens on, nor will while this process lives
/// (claimed as a server's would be).
pub fn closed_port() -> u16 {
    crate::ports::free_port()
}

/// The context and message of a connection that failed as a retryable store error;
/// any other outcome fails the test.
pub fn retryable_failure<T>(connected: Result<T, sluice_driver_sdk::Error>) -> String {
    match connected {
        Err(sluice_driver_sdk::Error::Store {
            context,
            message,
            retryable: true,
        }) => format!("{context}: {message}"),
        other => panic!(
            "expected a retryable store error, got {:?}",
            other.map(drop)
        ),
    }
}
