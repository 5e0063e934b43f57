//! The stores a torture writes to, read back directly (not through a driver), and a
//! private PostgreSQL server the torture may restart at will.
//!
//! Every store is the torture's own: a SQLite file in its folder, or a schema of a
//! unique name in the PostgreSQL server (dropped at the end). The private server lives
//! in a temporary folder on a spare port, so the shared server is never disturbed.

use anyhow::{Context, bail};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The table every torture pipeline materializes into.
pub const TABLE: &str = "torture_events";

pub enum Store {
    Sqlite { path: PathBuf },
    Postgres { url: String, schema: String },
}

impl Store {
    /// A PostgreSQL store in a new schema of a unique name.
    pub fn postgres(url: &str, tag: &str) -> anyhow::Result<Store> {
        let schema = format!("sluice_torture_{tag}");
        let store = Store::Postgres {
            url: url.to_string(),
            schema,
        };
        store.postgres_sql(|schema| format!(r#"CREATE SCHEMA "{schema}""#))?;
        Ok(store)
    }

    pub fn describe(&self) -> &'static str {
        match self {
            Store::Sqlite { .. } => "sqlite",
            Store::Postgres { .. } => "postgres",
        }
    }

    /// The built-in endpoint of a pipeline file (YAML flow style).
    pub fn endpoint_yaml(&self) -> String {
        match self {
            Store::Sqlite { path } => format!("sqlite: {{path: {}}}", yaml_str(path)),
            Store::Postgres { url, schema } => {
                format!("postgres: {{url: \"{url}\", schema: {schema}}}")
            }
        }
    }

    /// The stored document of every row.
    pub fn rows(&self) -> anyhow::Result<Vec<Value>> {
        let texts: Vec<String> = match self {
            Store::Sqlite { path } => {
                let conn = rusqlite::Connection::open(path)
                    .with_context(|| format!("opening {}", path.display()))?;
                let mut stmt =
                    conn.prepare(&format!(r#"SELECT "flow_document" FROM "{TABLE}""#))?;
                stmt.query_map([], |row| row.get::<_, String>(0))?
                    .collect::<Result<_, _>>()?
            }
            Store::Postgres { url, schema } => {
                let sql = format!(r#"SELECT "flow_document"::text FROM "{schema}"."{TABLE}""#);
                postgres(url, async |client| {
                    let rows = client.query(&sql, &[]).await?;
                    Ok(rows.iter().map(|r| r.get(0)).collect())
                })?
            }
        };
        texts
            .iter()
            .map(|t| serde_json::from_str(t).context("a stored document is not JSON"))
            .collect()
    }

    /// Drops what the torture created in the server (a SQLite file goes with the folder).
    pub fn drop_schema(&self) -> anyhow::Result<()> {
        match self {
            Store::Sqlite { .. } => Ok(()),
            Store::Postgres { .. } => self.postgres_sql(|schema| {
                format!(
                    r#"SET client_min_messages = warning; DROP SCHEMA IF EXISTS "{schema}" CASCADE"#
                )
            }),
        }
    }

    fn postgres_sql(&self, sql: impl Fn(&str) -> String) -> anyhow::Result<()> {
        let Store::Postgres { url, schema } = self else {
            return Ok(());
        };
        let sql = sql(schema);
        postgres(url, async |client| Ok(client.batch_execute(&sql).await?))
    }
}

/// A path as a double-quoted YAML string.
pub fn yaml_str(path: &Path) -> String {
    serde_json::to_string(&path.to_string_lossy()).expect("a string serializes")
}

fn postgres<T>(
    url: &str,
    f: impl AsyncFnOnce(&tokio_postgres::Client) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .with_context(|| format!("connecting to {url}"))?;
        tokio::spawn(conn);
        f(&client).await
    })
}

/// A PostgreSQL server of our own: `initdb` in a temporary folder, `pg_ctl` on a spare
/// port of 127.0.0.1. Runs as the `postgres` user when we are root (initdb refuses root).
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
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let server = PrivatePostgres {
            bin,
            dir: dir.to_path_buf(),
            port,
        };
        if is_root() {
            server.command(
                "chown",
                &["-R", "postgres:postgres", &server.dir_str()],
                false,
            )?;
        }
        let data = server.data();
        server.command(
            "initdb",
            &["-D", &data, "-U", "postgres", "--auth=trust", "--no-sync"],
            true,
        )?;
        server.pg_ctl_start()?;
        Ok(server)
    }

    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Stops the server as a crash would (`immediate`: no shutdown checkpoint), then
    /// starts it again on the same port.
    pub fn restart(&self) -> anyhow::Result<()> {
        self.stop()?;
        self.pg_ctl_start()
    }

    pub fn stop(&self) -> anyhow::Result<()> {
        let data = self.data();
        self.command(
            "pg_ctl",
            &["-D", &data, "-m", "immediate", "-w", "stop"],
            true,
        )
    }

    fn pg_ctl_start(&self) -> anyhow::Result<()> {
        let (data, dir) = (self.data(), self.dir_str());
        let options = format!("-p {} -k {dir} -c listen_addresses=127.0.0.1", self.port);
        let log = format!("{dir}/server.log");
        self.command(
            "pg_ctl",
            &["-D", &data, "-l", &log, "-o", &options, "-w", "start"],
            true,
        )
    }

    fn data(&self) -> String {
        format!("{}/data", self.dir_str())
    }

    fn dir_str(&self) -> String {
        self.dir.to_string_lossy().into_owned()
    }

    /// Runs a PostgreSQL tool (from `bin` when `postgres_tool`), as `postgres` if root.
    fn command(&self, program: &str, args: &[&str], postgres_tool: bool) -> anyhow::Result<()> {
        let program = if postgres_tool {
            self.bin.join(program)
        } else {
            PathBuf::from(program)
        };
        let mut cmd = if postgres_tool && is_root() {
            let mut cmd = Command::new("runuser");
            cmd.args(["-u", "postgres", "--"]).arg(&program);
            cmd
        } else {
            Command::new(&program)
        };
        let out = cmd
            .args(args)
            .output()
            .with_context(|| format!("running {}", program.display()))?;
        if !out.status.success() {
            bail!(
                "{} {}: {}\n{}",
                program.display(),
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        if let Err(err) = self.stop() {
            eprintln!("stopping the private PostgreSQL server: {err:#}");
        }
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| o.stdout.trim_ascii() == b"0")
}
