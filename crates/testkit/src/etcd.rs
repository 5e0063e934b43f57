//! A private single-member etcd for tests: on free ports, its data
//! in a folder of its own, stopped and started again on the same data by a test, killed
//! when dropped; with [`PrivateEtcd::start_tls`], over TLS with client certificates
//! required. Needs the `etcd` binary (`.ci/services` installs etcd-server).

use crate::ports::{free_port, wait_for_port};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct PrivateEtcd {
    dir: tempfile::TempDir,
    client: u16,
    peer: u16,
    /// The folder of `TestCertificates` it serves TLS with, if any.
    tls: Option<PathBuf>,
    child: Option<Child>,
}

impl PrivateEtcd {
    pub fn start() -> PrivateEtcd {
        PrivateEtcd::launched(None)
    }

    /// An etcd serving TLS with `certs`' `server.crt` (it names `localhost`) and
    /// requiring client certificates signed by its `ca.crt` (`--client-cert-auth`).
    pub fn start_tls(certs: &Path) -> PrivateEtcd {
        PrivateEtcd::launched(Some(certs.to_path_buf()))
    }

    fn launched(tls: Option<PathBuf>) -> PrivateEtcd {
        let mut etcd = PrivateEtcd {
            dir: tempfile::tempdir().expect("a temporary folder"),
            client: free_port(),
            peer: free_port(),
            tls,
            child: None,
        };
        etcd.launch();
        etcd
    }

    /// Its client URL (`https://localhost:…` over TLS).
    pub fn url(&self) -> String {
        match self.tls {
            None => format!("http://127.0.0.1:{}", self.client),
            Some(_) => format!("https://localhost:{}", self.client),
        }
    }

    fn launch(&mut self) {
        let client = self.url();
        let listen = match self.tls {
            None => client.clone(),
            Some(_) => format!("https://127.0.0.1:{}", self.client),
        };
        let peer = format!("http://127.0.0.1:{}", self.peer);
        let mut command = Command::new("etcd");
        if let Some(certs) = &self.tls {
            command
                .arg("--cert-file")
                .arg(certs.join("server.crt"))
                .arg("--key-file")
                .arg(certs.join("server.key"))
                .arg("--trusted-ca-file")
                .arg(certs.join("ca.crt"))
                .arg("--client-cert-auth");
        }
        // Appended to: a restarted server's log follows the first one's.
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.path().join("etcd.log"))
            .expect("its log");
        let child = command
            .args(["--name", "test", "--data-dir"])
            .arg(self.dir.path().join("data"))
            .args([
                "--listen-client-urls",
                &listen,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("test={peer}")])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd is installed (.ci/services installs etcd-server)");
        self.child = Some(child);
        let log_path = self.dir.path().join("etcd.log");
        wait_for_port(self.client, "etcd", || {
            std::fs::read_to_string(&log_path).unwrap_or_default()
        });
    }

    /// Stops etcd as a service manager would (SIGTERM) and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").arg(child.id().to_string()).status();
            let _ = child.wait();
        }
    }

    /// What etcd wrote to its log, for a failing test's message (every start's).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default()
    }

    /// Stops etcd and starts it again on the same data after `down`.
    pub fn restart(&mut self, down: Duration) {
        self.stop();
        std::thread::sleep(down);
        self.launch();
    }
}

impl Drop for PrivateEtcd {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
