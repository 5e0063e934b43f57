//! A private nats-server for the tests of the NATS source's and output's TLS and
//! authentication: the shared server (127.0.0.1:4222) takes anyone in plain text, so a
//! test that needs a server requiring TLS or a password starts its own, on a free port,
//! JetStream in a folder of its own, killed when dropped. Needs `nats-server` (2.9;
//! `/usr/sbin/nats-server`, or `NATS_SERVER`).

use crate::conformance::tls::TestCertificates;
use crate::ports::{free_port, wait_for_port};
use std::process::{Child, Command, Stdio};

/// The user [`SecuredNats`] lets in, with [`PASSWORD`].
pub const USER: &str = "sluice";
pub const PASSWORD: &str = "s3cret-of-the-test-user";

pub struct PrivateNats {
    dir: tempfile::TempDir,
    port: u16,
    child: Child,
}

impl PrivateNats {
    /// Starts a server whose configuration file holds `settings` (nats-server blocks
    /// such as `tls {…}` or `authorization {…}`) and waits until it takes connections.
    pub fn start(settings: &str) -> PrivateNats {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let port = free_port();
        let config = dir.path().join("nats.conf");
        std::fs::write(&config, settings).expect("writing the server's configuration");
        let log = std::fs::File::create(dir.path().join("nats.log")).expect("its log");
        let binary =
            std::env::var("NATS_SERVER").unwrap_or_else(|_| "/usr/sbin/nats-server".into());
        let child = Command::new(&binary)
            .arg("-c")
            .arg(&config)
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(dir.path().join("jetstream"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {binary} (nats-server 2.9): {e}"));
        let server = PrivateNats { dir, port, child };
        wait_for_port(port, "nats-server", || server.log());
        server
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// What the server logged, for a failing test's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("nats.log")).unwrap_or_default()
    }
}

impl Drop for PrivateNats {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A private server taking only TLS (its certificate signed by the test CA, naming
/// `localhost`) and only [`USER`] with [`PASSWORD`] or the NKey user it was given.
pub struct SecuredNats {
    pub server: PrivateNats,
    pub certificates: TestCertificates,
    _certificates_dir: tempfile::TempDir,
}

impl SecuredNats {
    /// Starts it; `nkey` is the public key (U…) of the NKey user let in.
    pub fn start(nkey: &str) -> SecuredNats {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let certificates = TestCertificates::make(dir.path());
        let settings = format!(
            "tls {{\n  cert_file: {:?}\n  key_file: {:?}\n}}\n\
             authorization {{\n  users = [\n    {{user: {USER:?}, password: {PASSWORD:?}}}\n    \
             {{nkey: {nkey:?}}}\n  ]\n}}\n",
            certificates.file("server.crt"),
            certificates.file("server.key"),
        );
        SecuredNats {
            server: PrivateNats::start(&settings),
            certificates,
            _certificates_dir: dir,
        }
    }

    /// `tls://localhost:<port>`: the name its certificate holds.
    pub fn url(&self) -> String {
        format!("tls://localhost:{}", self.server.port())
    }
}
