//! A private redis-server for the Redis driver's TLS tests: the shared server
//! (127.0.0.1:6379) is plain text, so a test that needs TLS (or a password) starts its
//! own, on a free port, TLS only (`--port 0`), nothing saved, killed when dropped.
//! Needs `redis-server` 6+ built with TLS (Debian's; `/usr/bin/redis-server`, or
//! `REDIS_SERVER`).

use crate::conformance::tls::TestCertificates;
use crate::ports::{free_port, wait_for_port};
use std::process::{Child, Command, Stdio};

/// The password [`PrivateRedis`] asks of the `default` user.
pub const PASSWORD: &str = "s3cret-of-the-test-user";

pub struct PrivateRedis {
    dir: tempfile::TempDir,
    port: u16,
    child: Child,
    pub certificates: TestCertificates,
}

impl PrivateRedis {
    /// Starts a TLS-only server (its certificate signed by the test CA, naming
    /// `localhost`) requiring [`PASSWORD`]; `client_certificates`: whether clients
    /// must present a certificate of the test CA. Waits until it takes connections.
    pub fn start_tls(client_certificates: bool) -> PrivateRedis {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let certificates = TestCertificates::make(dir.path());
        let port = free_port();
        let log = dir.path().join("redis.log");
        let binary =
            std::env::var("REDIS_SERVER").unwrap_or_else(|_| "/usr/bin/redis-server".into());
        let auth_clients = if client_certificates { "yes" } else { "no" };
        let child = Command::new(&binary)
            .current_dir(dir.path())
            .args(["--port", "0", "--bind", "127.0.0.1"])
            .args(["--tls-port", &port.to_string()])
            .args(["--tls-cert-file", &certificates.file("server.crt")])
            .args(["--tls-key-file", &certificates.file("server.key")])
            .args(["--tls-ca-cert-file", &certificates.file("ca.crt")])
            .args(["--tls-auth-clients", auth_clients])
            .args(["--requirepass", PASSWORD])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--logfile")
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {binary} (redis-server with TLS): {e}"));
        let server = PrivateRedis {
            dir,
            port,
            child,
            certificates,
        };
        wait_for_port(port, "redis-server", || server.log());
        server
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// What the server logged, for a failing test's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
