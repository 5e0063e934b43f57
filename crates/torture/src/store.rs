//! The stores a torture writes to, read back directly (not through a driver).
//!
//! Every store is the torture's own: a SQLite file in its folder, an Iceberg catalog
//! in its folder over a warehouse there or on S3 (read back by pyiceberg,
//! independently: [`iceberg`](super::iceberg)), a namespace
//! of a unique name in a server, created at the start and dropped at the end: a schema
//! of PostgreSQL, a database of MariaDB/MySQL; or an output's destination, whose
//! changes, folded, are its rows ([`output`](super::output)). The two servers differ only in their
//! [`Dialect`] (client, statements, endpoint configuration); everything else about a
//! server store is written once.

use super::iceberg::IcebergStore;
use super::model::Read;
use super::output::{self, Output};
use super::{TABLE, block_on};
use anyhow::Context;
use mysql_async::prelude::Queryable;
use serde_json::{Value, json};
use sluice_runtime::failpoint::{OnReturn, POINTS};
use std::path::{Path, PathBuf};

pub enum Store {
    Sqlite {
        path: PathBuf,
    },
    /// The Iceberg epoch sink's table `sluice.torture_events`: a change log, or an
    /// upsert table (the view).
    Iceberg(IcebergStore),
    /// `namespace`, created in the server at `url` by [`Store::server`].
    Server {
        dialect: Dialect,
        url: String,
        namespace: String,
    },
    /// A materialization publishing its changes ([`output`]).
    Output(Output),
}

/// A database server's side of a store.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Postgres,
    Mysql,
}

impl Dialect {
    /// The driver's name (pipeline files, `sluice driver`), also what reports call it.
    pub fn driver(self) -> &'static str {
        match self {
            Dialect::Postgres => "postgres",
            Dialect::Mysql => "mysql",
        }
    }

    /// The shared server of this machine (trust / empty-password root, database `test`).
    pub fn default_url(self) -> &'static str {
        match self {
            Dialect::Postgres => "postgres://postgres@127.0.0.1:5432/test",
            Dialect::Mysql => "mysql://root@127.0.0.1:3306/test",
        }
    }

    fn create_sql(self, namespace: &str) -> String {
        match self {
            Dialect::Postgres => format!(r#"CREATE SCHEMA "{namespace}""#),
            Dialect::Mysql => format!("CREATE DATABASE `{namespace}`"),
        }
    }

    fn drop_sql(self, namespace: &str) -> String {
        match self {
            Dialect::Postgres => format!(
                r#"SET client_min_messages = warning; DROP SCHEMA IF EXISTS "{namespace}" CASCADE"#
            ),
            Dialect::Mysql => format!("DROP DATABASE IF EXISTS `{namespace}`"),
        }
    }

    fn documents_sql(self, namespace: &str) -> String {
        match self {
            Dialect::Postgres => {
                format!(r#"SELECT "flow_document"::text FROM "{namespace}"."{TABLE}""#)
            }
            Dialect::Mysql => format!("SELECT `flow_document` FROM `{namespace}`.`{TABLE}`"),
        }
    }

    /// The driver's endpoint configuration for tables in `namespace` of `url`'s server.
    fn endpoint(self, url: &str, namespace: &str) -> Value {
        match self {
            Dialect::Postgres => json!({ "url": url, "schema": namespace }),
            Dialect::Mysql => json!({ "url": sluice_testkit::mysql::database_url(url, namespace) }),
        }
    }

    /// Runs `sql` (statements separated by `;` for PostgreSQL, one for MySQL) on a
    /// connection of its own.
    fn execute(self, url: &str, sql: &str) -> anyhow::Result<()> {
        block_on(async {
            match self {
                Dialect::Postgres => Ok(postgres(url).await?.batch_execute(sql).await?),
                Dialect::Mysql => {
                    let mut conn = mysql(url).await?;
                    conn.query_drop(sql).await?;
                    Ok(conn.disconnect().await?)
                }
            }
        })
        .with_context(|| format!("{sql} (at {url})"))
    }

    /// The first column of every row of `sql`, as text.
    fn texts(self, url: &str, sql: &str) -> anyhow::Result<Vec<String>> {
        block_on(async {
            match self {
                Dialect::Postgres => {
                    let rows = postgres(url).await?.query(sql, &[]).await?;
                    Ok(rows.iter().map(|r| r.get(0)).collect())
                }
                Dialect::Mysql => {
                    let mut conn = mysql(url).await?;
                    let texts = conn.query(sql).await?;
                    conn.disconnect().await?;
                    Ok(texts)
                }
            }
        })
        .with_context(|| format!("{sql} (at {url})"))
    }
}

impl Store {
    /// A store in a new namespace of a unique name (`tag`) in the server at `url`.
    pub fn server(dialect: Dialect, url: &str, tag: &str) -> anyhow::Result<Store> {
        let namespace = format!("sluice_torture_{tag}");
        dialect.execute(url, &dialect.create_sql(&namespace))?;
        Ok(Store::Server {
            dialect,
            url: url.to_string(),
            namespace,
        })
    }

    pub fn describe(&self) -> &'static str {
        match self {
            Store::Sqlite { .. } => "sqlite",
            Store::Iceberg(_) => "iceberg",
            Store::Server { dialect, .. } => dialect.driver(),
            Store::Output(output) => output.describe(),
        }
    }

    /// The fail points a run is faulted at, and what each one's `return` does: the
    /// runtime's and the store's own (retryable), or an output's ([`output::fault_points`]).
    pub fn fault_points(&self) -> Vec<(&'static str, OnReturn)> {
        let own: &[&str] = match self {
            Store::Output(_) => return output::fault_points(),
            Store::Iceberg(_) => sluice_iceberg::FAIL_POINTS,
            _ => &[],
        };
        let own = own.iter().map(|&point| (point, OnReturn::Retryable));
        POINTS.iter().copied().chain(own).collect()
    }

    /// The built-in driver that writes this store, and its endpoint configuration.
    pub fn driver(&self) -> (&'static str, Value) {
        match self {
            Store::Sqlite { path } => ("sqlite", json!({ "path": path })),
            Store::Iceberg(iceberg) => ("iceberg", iceberg.endpoint()),
            Store::Server {
                dialect,
                url,
                namespace,
            } => (dialect.driver(), dialect.endpoint(url, namespace)),
            Store::Output(output) => output.endpoint(),
        }
    }

    /// The binding's resource (YAML flow style: JSON is YAML).
    pub fn resource_yaml(&self) -> String {
        match self {
            Store::Output(output) => output.resource().to_string(),
            Store::Iceberg(iceberg) => iceberg.resource().to_string(),
            _ => json!({ "table": TABLE }).to_string(),
        }
    }

    /// The built-in endpoint of a pipeline file (YAML flow style: JSON is YAML).
    pub fn endpoint_yaml(&self) -> String {
        let (driver, config) = self.driver();
        format!("{driver}: {config}")
    }

    /// What the store holds: the stored document of every row, and what is wrong with
    /// it besides its rows. An output is read once: its changes checked and folded.
    pub fn read(&self) -> anyhow::Result<Read> {
        let texts: Vec<String> = match self {
            Store::Output(output) => {
                let checked = output.check()?;
                let violations = (checked.violations.iter())
                    .map(|v| format!("{}: {v}", output.describe()))
                    .collect();
                let rows = checked.view.into_values().collect();
                return Ok(Read { rows, violations });
            }
            Store::Sqlite { path } => {
                let conn = rusqlite::Connection::open(path)
                    .with_context(|| format!("opening {}", path.display()))?;
                let mut stmt =
                    conn.prepare(&format!(r#"SELECT "flow_document" FROM "{TABLE}""#))?;
                stmt.query_map([], |row| row.get::<_, String>(0))?
                    .collect::<Result<_, _>>()?
            }
            Store::Iceberg(iceberg) => return iceberg.read(),
            Store::Server {
                dialect,
                url,
                namespace,
            } => dialect.texts(url, &dialect.documents_sql(namespace))?,
        };
        let rows = (texts.iter())
            .map(|t| serde_json::from_str(t).context("a stored document is not JSON"))
            .collect::<anyhow::Result<_>>()?;
        Ok(Read {
            rows,
            violations: Vec::new(),
        })
    }

    /// Drops what the torture created outside its folder: a server's namespace, and an
    /// S3 warehouse unless `keep` (kept with the folder, whose catalog reads it). A
    /// SQLite file and a local warehouse go with the folder.
    pub fn drop_namespace(&self, keep: bool) -> anyhow::Result<()> {
        match self {
            Store::Iceberg(iceberg) if !keep => iceberg.remove_warehouse(),
            Store::Sqlite { .. } | Store::Iceberg(_) | Store::Output(_) => Ok(()),
            Store::Server {
                dialect,
                url,
                namespace,
            } => dialect.execute(url, &dialect.drop_sql(namespace)),
        }
    }
}

/// A path as a double-quoted YAML string.
pub fn yaml_str(path: &Path) -> String {
    serde_json::to_string(&path.to_string_lossy()).expect("a string serializes")
}

/// A PostgreSQL client whose connection runs on the current runtime.
async fn postgres(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .with_context(|| format!("connecting to {url}"))?;
    tokio::spawn(conn);
    Ok(client)
}

async fn mysql(url: &str) -> anyhow::Result<mysql_async::Conn> {
    mysql_async::Conn::from_url(url)
        .await
        .with_context(|| format!("connecting to {url}"))
}
