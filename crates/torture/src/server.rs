//! Private servers that the `server-restart` and `broker-restart` scenarios crash and
//! start again at will, so the shared servers are never disturbed: each lives in a
//! folder of the torture's own, listens on a spare port of 127.0.0.1, and is stopped
//! when dropped (its files go with the torture's folder). Every kafka or nats torture
//! reads from a private broker, so that runs are isolated.
//!
//! ```text
//!  PostgreSQL  initdb ─▶ pg_ctl start      restart: pg_ctl stop -m immediate ─▶ pg_ctl start
//!  MariaDB     mariadb-install-db ─▶ mariadbd (a child)   restart: SIGKILL ─▶ mariadbd
//!  Kafka       tansu broker (a child, SQLite)             restart: SIGKILL ─▶ tansu
//!  NATS        nats-server -js (a child)                  restart: SIGKILL ─▶ nats-server
//! ```
//!
//! A restart stops the server as a crash would (no shutdown checkpoint, no clean
//! InnoDB shutdown): the store must then recover what it committed by itself.

use anyhow::{Context, bail};
use sluice_testkit::ports::free_port;
use sluice_testkit::tansu::tansu_binary;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A server of our own that a scenario may crash and start again.
pub trait PrivateServer {
    /// What the report calls it.
    fn name(&self) -> &'static str;
    /// Where to connect (a database that exists from the start).
    fn url(&self) -> String;
    /// Stops the server as a crash would, leaves it down for `down`, then starts it
    /// again on the same port; returns once it accepts connections.
    fn restart(&mut self, down: Duration) -> anyhow::Result<()>;
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
            port: free_port(),
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
    fn restart(&mut self, down: Duration) -> anyhow::Result<()> {
        self.stop()?;
        std::thread::sleep(down);
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
pub struct PrivateMariadb(Daemon);

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
        let port = free_port();
        let path = |name: &str| dir.join(name).display().to_string();
        let mut args = vec![
            "--no-defaults".to_string(),
            format!("--datadir={}", data.display()),
            format!("--port={port}"),
            "--bind-address=127.0.0.1".to_string(),
            format!("--socket={}", path("mariadbd.sock")),
            format!("--pid-file={}", path("mariadbd.pid")),
            format!("--log-error={}", path("server.log")),
            // Small: the torture's tables are, and the machine is shared.
            "--innodb-buffer-pool-size=32M".to_string(),
        ];
        if is_root() {
            args.push("--user=root".to_string());
        }
        let daemon = Daemon::start("mariadbd".into(), args, dir, port, MARIADB_START)?;
        Ok(PrivateMariadb(daemon))
    }
}

impl PrivateServer for PrivateMariadb {
    fn name(&self) -> &'static str {
        "MariaDB"
    }

    fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/mysql", self.0.port)
    }

    /// SIGKILL (InnoDB recovers from its redo log at the next start), then `mariadbd`
    /// again on the same port.
    fn restart(&mut self, down: Duration) -> anyhow::Result<()> {
        self.0.restart(down)
    }
}

/// A private log broker of a kafka or nats torture: tansu (Kafka's protocol, its data
/// in a SQLite file of its folder) or nats-server with JetStream (its store in its
/// folder), a child of ours on a spare port of 127.0.0.1. A restart is a SIGKILL:
/// what the broker acknowledged must survive it.
pub struct PrivateBroker {
    name: &'static str,
    url: String,
    daemon: Daemon,
}

/// How long a broker start may take before it is an error.
const BROKER_START: Duration = Duration::from_secs(60);

impl PrivateBroker {
    /// tansu in `dir`: the ready build beside the project, else `tansu` on PATH
    /// ([`tansu_binary`]).
    pub fn tansu(dir: &Path) -> anyhow::Result<PrivateBroker> {
        let program = Some(tansu_binary())
            .filter(|program| program.is_file() || on_path("tansu").is_some())
            .context(
                "no tansu on PATH (nor ../shared/tools/tansu): install it with \
             `cargo install tansu --locked --features libsql`",
            )?;
        let port = free_port();
        let listener = format!("tcp://127.0.0.1:{port}");
        let args = [
            "broker",
            "--listener-url",
            &listener,
            "--advertised-listener-url",
            &listener,
            // Relative to its working directory, `dir`.
            "--storage-engine",
            "sqlite://tansu.db",
        ];
        let args = args.map(String::from).to_vec();
        Ok(PrivateBroker {
            name: "tansu",
            url: format!("127.0.0.1:{port}"),
            daemon: Daemon::start(program, args, dir, port, BROKER_START)?,
        })
    }

    /// nats-server with JetStream in `dir`: on PATH, else Debian's `/usr/sbin`.
    pub fn nats(dir: &Path) -> anyhow::Result<PrivateBroker> {
        let debian = PathBuf::from("/usr/sbin/nats-server");
        let program = on_path("nats-server")
            .or_else(|| debian.exists().then_some(debian))
            .context("no nats-server on PATH (nor /usr/sbin/nats-server)")?;
        let port = free_port();
        let store = dir.join("jetstream").display().to_string();
        let port_arg = port.to_string();
        let args = ["-a", "127.0.0.1", "-p", &port_arg, "-js", "-sd", &store];
        let args = args.map(String::from).to_vec();
        Ok(PrivateBroker {
            name: "NATS",
            url: format!("nats://127.0.0.1:{port}"),
            daemon: Daemon::start(program, args, dir, port, BROKER_START)?,
        })
    }

    /// The address a run's error names when the broker is unreachable (`host:port`).
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.daemon.port)
    }
}

impl PrivateServer for PrivateBroker {
    fn name(&self) -> &'static str {
        self.name
    }

    /// What the pipeline's source names: `host:port` (Kafka) or `nats://host:port`.
    fn url(&self) -> String {
        self.url.clone()
    }

    /// SIGKILL, `down` with no broker, then the same command on the same port.
    fn restart(&mut self, down: Duration) -> anyhow::Result<()> {
        self.daemon.restart(down)
    }
}

/// A server that runs as our child: its output appended to `server.out` of its folder,
/// ready once its port accepts TCP connections, crashed with SIGKILL, stopped when
/// dropped.
struct Daemon {
    program: PathBuf,
    args: Vec<String>,
    dir: PathBuf,
    port: u16,
    start_timeout: Duration,
    child: Child,
}

impl Daemon {
    fn start(
        program: PathBuf,
        args: Vec<String>,
        dir: &Path,
        port: u16,
        start_timeout: Duration,
    ) -> anyhow::Result<Daemon> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let child = Self::spawn(&program, &args, dir)?;
        let mut daemon = Daemon {
            program,
            args,
            dir: dir.to_path_buf(),
            port,
            start_timeout,
            child,
        };
        daemon.await_ready()?;
        Ok(daemon)
    }

    fn spawn(program: &Path, args: &[String], dir: &Path) -> anyhow::Result<Child> {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("server.out"))?;
        Command::new(program)
            .args(args)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", program.display()))
    }

    /// Waits until the server accepts TCP connections (MariaDB opens its port only
    /// once InnoDB has recovered, nats-server once JetStream has).
    fn await_ready(&mut self) -> anyhow::Result<()> {
        let started = Instant::now();
        let address = std::net::SocketAddr::from(([127, 0, 0, 1], self.port));
        let program = self.program.display();
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!(
                    "{program} exited ({status}) before accepting connections; see {}",
                    self.dir.display()
                );
            }
            if std::net::TcpStream::connect_timeout(&address, Duration::from_secs(1)).is_ok() {
                return Ok(());
            }
            if started.elapsed() > self.start_timeout {
                bail!(
                    "{program} did not accept connections on port {} within {}s; see {}",
                    self.port,
                    self.start_timeout.as_secs(),
                    self.dir.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill(&mut self) -> anyhow::Result<()> {
        let program = self.program.display();
        self.child
            .kill()
            .with_context(|| format!("killing {program}"))?;
        self.child
            .wait()
            .with_context(|| format!("waiting for {program}"))?;
        Ok(())
    }

    /// SIGKILL, `down`, then the same command again (on the same port).
    fn restart(&mut self, down: Duration) -> anyhow::Result<()> {
        self.kill()?;
        std::thread::sleep(down);
        self.child = Self::spawn(&self.program, &self.args, &self.dir)?;
        self.await_ready()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Err(err) = self.kill() {
            eprintln!("stopping {}: {err:#}", self.program.display());
        }
    }
}

/// `program` in a folder of PATH, if there is one.
fn on_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
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
