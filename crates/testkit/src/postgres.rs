//! A private PostgreSQL cluster with `wal_level=logical` (the shared server runs
//! `replica`): `initdb` in a temporary folder and `pg_ctl` on a spare port of
//! 127.0.0.1, as the `postgres` user when we are root (initdb refuses root), stopped
//! (`-m immediate`) and removed when dropped. Each test starts its own (nextest runs
//! every test in a process of its own, so a static could not share one), which costs
//! about two seconds and leaves no server behind.
//!
//! [`LogicalPostgres::start_tls`] runs it with `ssl=on`, the certificates of
//! [`TestCertificates`] (the server's names `localhost` only) and a `pg_hba.conf` of
//! `hostssl` lines alone, so a plain connection is refused by the server.

use crate::conformance::tls::TestCertificates;
use std::path::PathBuf;
use std::process::Command;

pub struct LogicalPostgres {
    bin: PathBuf,
    dir: tempfile_dir::Dir,
    pub port: u16,
    /// The certificates of a server started with [`LogicalPostgres::start_tls`].
    pub certificates: Option<TestCertificates>,
}

mod tempfile_dir {
    /// A folder removed when dropped.
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl LogicalPostgres {
    /// initdb + start; panics with the tool's output if either fails.
    pub fn start() -> LogicalPostgres {
        Self::start_with(false)
    }

    /// As [`LogicalPostgres::start`], accepting TLS connections only.
    pub fn start_tls() -> LogicalPostgres {
        Self::start_with(true)
    }

    fn start_with(tls: bool) -> LogicalPostgres {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .expect("PostgreSQL binaries under /usr/lib/postgresql")
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|bin| bin.join("initdb").exists())
            .max()
            .expect("no /usr/lib/postgresql/*/bin/initdb");
        let port = crate::ports::free_port();
        let dir = std::env::temp_dir().join(format!("sluice-cdc-pg-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("the cluster's folder");
        let certificates = tls.then(|| TestCertificates::make(&dir));
        let server = LogicalPostgres {
            bin,
            dir: tempfile_dir::Dir(dir),
            port,
            certificates,
        };
        if is_root() {
            run(Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&server.dir.0));
        }
        let data = server.data();
        server.tool(
            "initdb",
            &["-D", &data, "-U", "postgres", "--auth=trust", "--no-sync"],
        );
        let mut options = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c wal_level=logical \
             -c max_replication_slots=64 -c max_wal_senders=64 -c fsync=off",
            server.dir.0.display()
        );
        if tls {
            let hba = "local all all trust\n\
                       hostssl all all 127.0.0.1/32 trust\n\
                       hostssl replication all 127.0.0.1/32 trust\n";
            std::fs::write(server.dir.0.join("data/pg_hba.conf"), hba).expect("pg_hba.conf");
            options += &format!(
                " -c ssl=on -c ssl_cert_file={dir}/server.crt -c ssl_key_file={dir}/server.key",
                dir = server.dir.0.display()
            );
        }
        let log = format!("{}/server.log", server.dir.0.display());
        server.tool(
            "pg_ctl",
            &["-D", &data, "-l", &log, "-o", &options, "-w", "start"],
        );
        server
    }

    /// postgres://postgres@127.0.0.1:port/postgres
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The cluster's Unix socket as tokio-postgres reads it (trusted, plain text even
    /// when TCP takes TLS only): for a test's own setup queries.
    pub fn socket(&self) -> String {
        format!(
            "host={} port={} user=postgres dbname=postgres",
            self.dir.0.display(),
            self.port
        )
    }

    fn data(&self) -> String {
        format!("{}/data", self.dir.0.display())
    }

    fn tool(&self, program: &str, args: &[&str]) {
        let program = self.bin.join(program);
        let mut cmd = if is_root() {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(&program);
            cmd
        } else {
            Command::new(&program)
        };
        run(cmd.args(args));
    }
}

impl Drop for LogicalPostgres {
    fn drop(&mut self) {
        let data = self.data();
        self.tool("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"]);
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}
