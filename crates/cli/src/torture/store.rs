//! The stores a torture writes to, read back directly (not through a driver).
//!
//! Every store is the torture's own: a SQLite file in its folder, an Iceberg catalog
//! and warehouse in its folder (read back by pyiceberg, independently), or a namespace
//! of a unique name in a server, created at the start and dropped at the end: a schema
//! of PostgreSQL, a database of MariaDB/MySQL. The two servers differ only in their
//! [`Dialect`] (client, statements, endpoint configuration); everything else about a
//! server store is written once.

use anyhow::Context;
use mysql_async::prelude::Queryable;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

/// The table every torture pipeline materializes into.
pub const TABLE: &str = "torture_events";

pub enum Store {
    Sqlite {
        path: PathBuf,
    },
    /// The Iceberg epoch sink's table `sluice.torture_events`: a change log, one row
    /// per transaction and key.
    Iceberg {
        catalog: PathBuf,
        warehouse: PathBuf,
    },
    /// `namespace`, created in the server at `url` by [`Store::server`].
    Server {
        dialect: Dialect,
        url: String,
        namespace: String,
    },
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
            Dialect::Mysql => json!({ "url": crate::bench::database_url(url, namespace) }),
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
            Store::Iceberg { .. } => "iceberg",
            Store::Server { dialect, .. } => dialect.driver(),
        }
    }

    /// The store's own fail points, beside the runtime's (each `return` retryable).
    pub fn fail_points(&self) -> &'static [&'static str] {
        match self {
            Store::Iceberg { .. } => sluice_iceberg::FAIL_POINTS,
            _ => &[],
        }
    }

    /// The built-in driver that writes this store, and its endpoint configuration.
    pub fn driver(&self) -> (&'static str, Value) {
        match self {
            Store::Sqlite { path } => ("sqlite", json!({ "path": path })),
            Store::Iceberg { catalog, warehouse } => (
                "iceberg",
                json!({ "catalog": catalog, "warehouse": warehouse }),
            ),
            Store::Server {
                dialect,
                url,
                namespace,
            } => (dialect.driver(), dialect.endpoint(url, namespace)),
        }
    }

    /// The built-in endpoint of a pipeline file (YAML flow style: JSON is YAML).
    pub fn endpoint_yaml(&self) -> String {
        let (driver, config) = self.driver();
        format!("{driver}: {config}")
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
            Store::Iceberg { catalog, warehouse } => {
                sluice_iceberg::pyiceberg_read(
                    catalog,
                    warehouse,
                    &format!("sluice.{TABLE}"),
                    false,
                )
                .map_err(anyhow::Error::msg)?
            }
            .into_iter()
            .map(|row| match row.get("flow_document") {
                Some(Value::String(doc)) => Ok(doc.clone()),
                _ => anyhow::bail!("a row without its document: {row}"),
            })
            .collect::<anyhow::Result<_>>()?,
            Store::Server {
                dialect,
                url,
                namespace,
            } => dialect.texts(url, &dialect.documents_sql(namespace))?,
        };
        texts
            .iter()
            .map(|t| serde_json::from_str(t).context("a stored document is not JSON"))
            .collect()
    }

    /// Drops what the torture created in the server (a SQLite file goes with the folder).
    pub fn drop_namespace(&self) -> anyhow::Result<()> {
        match self {
            Store::Sqlite { .. } | Store::Iceberg { .. } => Ok(()),
            Store::Server {
                dialect,
                url,
                namespace,
            } => dialect.execute(url, &dialect.drop_sql(namespace)),
        }
    }
}

/// Data files of the Iceberg store's warehouse that its table does not reference
/// ([`sluice_iceberg::orphan_data_files`]).
pub fn iceberg_orphans(store: &Store) -> anyhow::Result<Vec<String>> {
    let Store::Iceberg { catalog, warehouse } = store else {
        return Ok(Vec::new());
    };
    block_on(async {
        let catalog = sluice_iceberg::open_catalog(catalog, warehouse).await?;
        Ok(sluice_iceberg::orphan_data_files(&catalog).await?)
    })
}

/// A path as a double-quoted YAML string.
pub fn yaml_str(path: &Path) -> String {
    serde_json::to_string(&path.to_string_lossy()).expect("a string serializes")
}

/// Runs `f` to its end on a runtime of its own (the torture itself is synchronous).
pub fn block_on<T>(f: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(f)
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
