//! Private database servers the `server-restart` scenario crashes and starts again at
//! will, so the shared servers are never disturbed: each lives in a folder of the
//! torture's own, listens on a spare port of 127.0.0.1, and is stopped when dropped
//! (its files go with the torture's folder).
//!
//! ```text
//!  PostgreSQL  initdb ─▶ pg_ctl start      restart: pg_ctl stop -m immediate ─▶ pg_ctl start
//!  MariaDB     mariadb-install-db ─▶ mariadbd (a child)   restart: SIGKILL ─▶ mariadbd
//! ```
//!
//! A restart stops the server as a crash would (no shutdown checkpoint, no clean
//! InnoDB shutdown): the store must then recover what it committed by itself.

use anyhow::{Context, bail};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A server of our own that a scenario may crash and start again.
pub trait PrivateServer {
    /// What the report calls it.
    fn name(&self) -> &'static str;
    /// Where to connect (a database that exists from the start).
    fn url(&self) -> String;
    /// Stops the server as a crash would, then starts it again on the same port;
    /// returns once it accepts connections.
    fn restart(&mut self) -> anyhow::Result<()>;
}

/// A PostgreSQL server: `initdb` in a temporary folder, `pg_ctl` on a spare port of
/// 127.0.0.1. Runs as the `postgres` user when we are root (initdb refuses root).
pub struct PrivatePostgres {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
}

impl PrivatePostgres {
    pub fn start(dir: &Path) -> anyhow::Result<PrivatePostgres> {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .context("PostgreSQL binaries: no /usr/lib/postgresql")?
            .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
            .filter(|bin| bin.join("initdb").exists())
            .max()
            .context("no /usr/lib/postgresql/*/bin/initdb")?;
        std::fs::create_dir_all(dir)?;
        let server = PrivatePostgres {
            bin,
            dir: dir.to_path_buf(),
            port: spare_port()?,
        };
        if is_root() {
            let dir = server.dir_str();
            succeed(Command::new("chown").args(["-R", "postgres:postgres", &dir]))?;
        }
        let data = server.data();
        server.tool(
            "initdb",
            &["-D", &data, "-U", "postgres", "--auth=trust", "--no-sync"],
        )?;
        server.pg_ctl_start()?;
        Ok(server)
    }

    fn stop(&self) -> anyhow::Result<()> {
        let data = self.data();
        self.tool("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"])
    }

    fn pg_ctl_start(&self) -> anyhow::Result<()> {
        let (data, dir) = (self.data(), self.dir_str());
        let options = format!("-p {} -k {dir} -c listen_addresses=127.0.0.1", self.port);
        let log = format!("{dir}/server.log");
        self.tool(
            "pg_ctl",
            &["-D", &data, "-l", &log, "-o", &options, "-w", "start"],
        )
    }

    fn data(&self) -> String {
        format!("{}/data", self.dir_str())
    }

    fn dir_str(&self) -> String {
        self.dir.to_string_lossy().into_owned()
    }

    /// Runs a PostgreSQL tool of `bin`, as `postgres` if we are root.
    fn tool(&self, program: &str, args: &[&str]) -> anyhow::Result<()> {
        let program = self.bin.join(program);
        let mut cmd = if is_root() {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(&program);
            cmd
        } else {
            Command::new(&program)
        };
        succeed(cmd.args(args))
    }
}

impl PrivateServer for PrivatePostgres {
    fn name(&self) -> &'static str {
        "PostgreSQL"
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// `pg_ctl stop -m immediate` (no shutdown checkpoint), then `pg_ctl start -w`.
    fn restart(&mut self) -> anyhow::Result<()> {
        self.stop()?;
        self.pg_ctl_start()
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        if let Err(err) = self.stop() {
            eprintln!("stopping the private PostgreSQL server: {err:#}");
        }
    }
}

/// A MariaDB server: `mariadb-install-db` in a temporary folder (root with an empty
/// password, as on the shared server), then `mariadbd` as our child on a spare port of
/// 127.0.0.1, reading no option file (`--no-defaults`: the machine's `my.cnf` would
/// point it at the shared server's files). As root, `--user=root`: mariadbd refuses to
/// run as root without it.
pub struct PrivateMariadb {
    dir: PathBuf,
    port: u16,
    server: Child,
}

/// How long a MariaDB start (crash recovery included) may take before it is an error.
const MARIADB_START: Duration = Duration::from_secs(120);

impl PrivateMariadb {
    pub fn start(dir: &Path) -> anyhow::Result<PrivateMariadb> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let data = dir.join("data");
        let mut install = Command::new("mariadb-install-db");
        install
            .arg("--no-defaults")
            .arg(format!("--datadir={}", data.display()))
            .args(["--auth-root-authentication-method=normal", "--skip-test-db"]);
        if is_root() {
            install.arg("--user=root");
        }
        succeed(&mut install)?;
        let port = spare_port()?;
        let server = Self::spawn(dir, port)?;
        let mut server = PrivateMariadb {
            dir: dir.to_path_buf(),
            port,
            server,
        };
        server.await_ready()?;
        Ok(server)
    }

    fn spawn(dir: &Path, port: u16) -> anyhow::Result<Child> {
        let mut cmd = Command::new("mariadbd");
        cmd.arg("--no-defaults")
            .arg(format!("--datadir={}", dir.join("data").display()))
            .arg(format!("--port={port}"))
            .arg("--bind-address=127.0.0.1")
            .arg(format!("--socket={}", dir.join("mariadbd.sock").display()))
            .arg(format!("--pid-file={}", dir.join("mariadbd.pid").display()))
            .arg(format!("--log-error={}", dir.join("server.log").display()))
            // Small: the torture's tables are, and the machine is shared.
            .arg("--innodb-buffer-pool-size=32M")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if is_root() {
            cmd.arg("--user=root");
        }
        cmd.spawn().context("starting mariadbd")
    }

    /// Waits until the server accepts TCP connections: it opens its port only once
    /// InnoDB has recovered.
    fn await_ready(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        let address = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        loop {
            if let Some(status) = self.server.try_wait()? {
                bail!(
                    "mariadbd exited ({status}) before accepting connections; see {}",
                    self.dir.join("server.log").display()
                );
            }
            if std::net::TcpStream::connect_timeout(&address, Duration::from_secs(1)).is_ok() {
                return Ok(());
            }
            if started.elapsed() > MARIADB_START {
                bail!(
                    "mariadbd did not accept connections on port {} within {}s; see {}",
                    self.port,
                    MARIADB_START.as_secs(),
                    self.dir.join("server.log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn kill(&mut self) -> anyhow::Result<()> {
        self.server.kill().context("killing mariadbd")?;
        self.server.wait().context("waiting for mariadbd")?;
        Ok(())
    }
}

impl PrivateServer for PrivateMariadb {
    fn name(&self) -> &'static str {
        "MariaDB"
    }

    fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/mysql", self.port)
    }

    /// SIGKILL (InnoDB recovers from its redo log at the next start), then `mariadbd`
    /// again on the same port.
    fn restart(&mut self) -> anyhow::Result<()> {
        self.kill()?;
        self.server = Self::spawn(&self.dir, self.port)?;
        self.await_ready()
    }
}

impl Drop for PrivateMariadb {
    fn drop(&mut self) {
        if let Err(err) = self.kill() {
            eprintln!("stopping the private MariaDB server: {err:#}");
        }
    }
}

/// A port of 127.0.0.1 that was free a moment ago.
fn spare_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Runs `cmd` to its end; an error names it, its status and its stderr.
fn succeed(cmd: &mut Command) -> anyhow::Result<()> {
    let what = format!("{cmd:?}");
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!(
            "{what}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}
