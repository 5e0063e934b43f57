//! A private `mariadbd` with the binary log on (`ROW` format, `FULL` images), on a
//! spare port, its data in a temporary folder: for the `mysql_cdc` source's tests,
//! which need settings (and `PURGE BINARY LOGS`) the shared MariaDB must not be given.
//!
//! Started with `--skip-grant-tables` (every connection is root, with every privilege),
//! or with the grant tables ([`BinlogMariadb::start_with_grants`]: `root@127.0.0.1`
//! without a password has every privilege, and a test creates the users it needs).
//! Stopped (killed) and its folder removed when dropped.

use crate::ports::{free_port, wait_for_port};
use std::process::{Child, Command, Stdio};

pub struct BinlogMariadb {
    child: Child,
    dir: tempfile::TempDir,
    pub port: u16,
}

impl BinlogMariadb {
    /// `mariadb-install-db` + `mariadbd`; panics with the tool's output if either fails.
    pub fn start() -> BinlogMariadb {
        Self::start_with(&[])
    }

    /// As [`BinlogMariadb::start`], with more server options (`--binlog-format=STATEMENT`).
    pub fn start_with(options: &[&str]) -> BinlogMariadb {
        Self::launch(options, false)
    }

    /// As [`BinlogMariadb::start`], checking privileges: `root@127.0.0.1` (the
    /// [`url`](BinlogMariadb::url)'s user) has them all; other users have what a test
    /// grants them.
    pub fn start_with_grants() -> BinlogMariadb {
        Self::launch(&[], true)
    }

    fn launch(options: &[&str], grants: bool) -> BinlogMariadb {
        let dir = tempfile::Builder::new()
            .prefix("sluice-mariadb-")
            .tempdir()
            .expect("a temporary folder");
        let data = dir.path().join("data");
        // Bootstraps running side by side (one per test process) now and then fail:
        // tried again on a fresh folder.
        let mut last = String::new();
        let installed = (0..3).any(|_| {
            let _ = std::fs::remove_dir_all(&data);
            let out = Command::new("mariadb-install-db")
                .args(["--no-defaults", "--user=root", "--skip-test-db"])
                .arg(format!("--datadir={}", data.display()))
                .output()
                .expect("mariadb-install-db (package mariadb-server)");
            last = format!(
                "{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            out.status.success()
        });
        assert!(installed, "mariadb-install-db: {last}");
        let port = free_port();
        let log = dir.path().join("server.log");
        let child = Command::new("/usr/sbin/mariadbd")
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .arg(format!("--socket={}", dir.path().join("sock").display()))
            .arg(format!("--pid-file={}", dir.path().join("pid").display()))
            .arg(format!("--log-error={}", log.display()))
            .arg(format!("--port={port}"))
            .args([
                "--bind-address=127.0.0.1",
                "--user=root",
                "--skip-name-resolve",
                "--log-bin=mysql-bin",
                "--binlog-format=ROW",
                "--binlog-row-image=FULL",
                "--server-id=1",
                "--character-set-server=utf8mb4",
                "--collation-server=utf8mb4_general_ci",
                "--innodb-buffer-pool-size=32M",
                "--innodb-log-file-size=16M",
                "--innodb-flush-log-at-trx-commit=0",
                "--sync-binlog=0",
            ])
            .args(options)
            .args((!grants).then_some("--skip-grant-tables"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("/usr/sbin/mariadbd");
        let server = BinlogMariadb { child, dir, port };
        wait_for_port(port, "mariadbd", || {
            std::fs::read_to_string(&log).unwrap_or_default()
        });
        if grants {
            // root@localhost authenticates by the socket's peer (unix_socket): this
            // process runs as root.
            let sql = "CREATE USER root@'127.0.0.1'; \
                       GRANT ALL ON *.* TO root@'127.0.0.1' WITH GRANT OPTION";
            let out = Command::new("mariadb")
                .arg(format!(
                    "--socket={}",
                    server.dir.path().join("sock").display()
                ))
                .args(["-u", "root", "-e", sql])
                .output()
                .expect("the mariadb client");
            assert!(
                out.status.success(),
                "granting root@127.0.0.1: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        server
    }

    /// mysql://root@127.0.0.1:port
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}", self.port)
    }

    /// The server's own log, for a failing test's message.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }
}

impl Drop for BinlogMariadb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
