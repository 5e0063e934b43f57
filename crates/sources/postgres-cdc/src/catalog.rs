//! The ordinary (SQL) connection: what the source checks before it reads (wal_level,
//! the publication, primary keys), the tables' columns and keys, the type catalog, the
//! slot's state, and the snapshot reads of the backfill.
//!
//! TLS as the URL's `sslmode` says, through `tokio-postgres-rustls` with the rustls
//! configuration the replication connection uses ([`crate::wire`]).
//!
//! Snapshot rows are read with the simple query protocol, so every value arrives in
//! its text form under the settings of [`crate::wire::SESSION`], as pgoutput sends it.

use crate::position::{KeyKind, TableName};
use crate::types::Types;
use crate::wire::{SESSION, Target, parse_lsn};
use sluice_source_sdk::SourceError;
use sluice_source_sdk::tls::handshake_failure;
use sluice_source_sdk::tls::libpq::Attempt;
use sluice_source_sdk::tls::rustls::ClientConfig;
use std::sync::Arc;
use std::time::Duration;
use tokio_postgres::config::SslMode;
use tokio_postgres::{Client, SimpleQueryMessage};
use tokio_postgres_rustls::MakeRustlsConnect;

/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// A published table as the catalog describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub name: TableName,
    /// (name, type OID), in column order (generated and dropped columns left out, as
    /// pgoutput leaves them out).
    pub columns: Vec<(String, u32)>,
    /// The primary key's columns (indexes into `columns`), in key order.
    pub key: Vec<usize>,
    /// How the key compares, when the backfill can read the table in chunks of it.
    pub kinds: Option<Vec<KeyKind>>,
}

/// The source's SQL connection.
pub struct Catalog {
    name: String,
    url: String,
    client: Client,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Catalog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The tokio-postgres setting of one attempt.
fn ssl_mode(attempt: Attempt) -> SslMode {
    match attempt {
        Attempt::Plain => SslMode::Disable,
        Attempt::Prefer => SslMode::Prefer,
        Attempt::Require => SslMode::Require,
    }
}

/// `"a""b"`: an identifier quoted for SQL.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `'it''s'`: a string literal.
pub fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

impl Catalog {
    /// Connects to `target` (over TLS as its `sslmode` says, checked by `tls`); `redacted`
    /// is its URL without the password, for messages. A certificate that does not verify,
    /// or TLS the server does not offer where it is required, is a configuration error
    /// naming the options; an unreachable server is retryable I/O.
    pub async fn connect(
        name: &str,
        target: &Target,
        tls: &Arc<ClientConfig>,
        redacted: &str,
    ) -> Result<Catalog, SourceError> {
        let io = |e: String| SourceError::Io {
            name: name.to_string(),
            path: redacted.to_string(),
            error: std::io::Error::other(e),
        };
        let mut config: tokio_postgres::Config = (target.url.parse())
            .map_err(|e: tokio_postgres::Error| io(format!("the URL is unreadable: {e}")))?;
        let connector = MakeRustlsConnect::new(ClientConfig::clone(tls));
        let (first, if_refused) = target.ssl.mode.attempts();
        let attempts = async {
            let connected = (config.ssl_mode(ssl_mode(first)))
                .connect(connector.clone())
                .await;
            match (connected, if_refused) {
                // `allow`: the server refused the plain attempt, perhaps for want of TLS.
                (Err(e), Some(retry)) if e.as_db_error().is_some() => {
                    config.ssl_mode(ssl_mode(retry)).connect(connector).await
                }
                (connected, _) => connected,
            }
        };
        let tls_error = |why: String| SourceError::Config {
            name: name.to_string(),
            reason: format!(
                "cannot connect to {redacted} ({}): {why}",
                target.ssl.describe()
            ),
        };
        let (client, connection) = tokio::time::timeout(CONNECT_TIMEOUT, attempts)
            .await
            .map_err(|_| {
                io(format!(
                    "connecting took over {}s",
                    CONNECT_TIMEOUT.as_secs()
                ))
            })?
            .map_err(|e| {
                if let Some(why) = handshake_failure(&e) {
                    return tls_error(why);
                }
                // tokio-postgres says so in words only, in the error's source.
                let source = std::error::Error::source(&e).map(ToString::to_string);
                if source.as_deref() == Some("server does not support TLS") {
                    return tls_error("the server does not accept TLS (is ssl off?)".into());
                }
                io(db_error(&e))
            })?;
        let task = tokio::spawn(async move {
            let _ = connection.await;
        });
        let catalog = Catalog {
            name: name.to_string(),
            url: redacted.to_string(),
            client,
            task,
        };
        let settings: String = SESSION
            .iter()
            .map(|(k, v)| format!("SET {k} = {};", quote_literal(v)))
            .collect();
        catalog.batch(&settings).await?;
        Ok(catalog)
    }

    /// An error of the server or the connection: I/O, so retryable unless it says
    /// otherwise.
    pub fn io(&self, e: impl std::fmt::Display) -> SourceError {
        SourceError::Io {
            name: self.name.clone(),
            path: self.url.clone(),
            error: std::io::Error::other(e.to_string()),
        }
    }

    fn config(&self, reason: String) -> SourceError {
        SourceError::Config {
            name: self.name.clone(),
            reason,
        }
    }

    /// Runs statements whose results are not needed.
    pub async fn batch(&self, sql: &str) -> Result<(), SourceError> {
        self.client
            .batch_execute(sql)
            .await
            .map_err(|e| self.io(db_error(&e)))
    }

    /// Rows of a simple query, each value as text.
    pub async fn rows(&self, sql: &str) -> Result<Vec<Vec<Option<String>>>, SourceError> {
        let messages = self
            .client
            .simple_query(sql)
            .await
            .map_err(|e| self.io(db_error(&e)))?;
        Ok(messages
            .into_iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(row) => Some(
                    (0..row.len())
                        .map(|i| row.get(i).map(str::to_string))
                        .collect(),
                ),
                _ => None,
            })
            .collect())
    }

    /// Fails unless the server decodes WAL logically.
    pub async fn check_wal_level(&self) -> Result<(), SourceError> {
        let rows = self.rows("SHOW wal_level").await?;
        let level = rows.first().and_then(|r| r[0].clone()).unwrap_or_default();
        if level != "logical" {
            return Err(self.config(format!(
                "the server at {} has wal_level = {level}, and change data capture needs \
                 logical: run ALTER SYSTEM SET wal_level = logical (or set it in \
                 postgresql.conf) and restart the server",
                self.url
            )));
        }
        Ok(())
    }

    /// Makes sure `publication` exists: created for `tables` if they are given and it
    /// is missing; an error saying how to create it otherwise.
    pub async fn ensure_publication(
        &self,
        publication: &str,
        tables: Option<&[TableName]>,
    ) -> Result<(), SourceError> {
        let exists = !self
            .rows(&format!(
                "SELECT 1 FROM pg_publication WHERE pubname = {}",
                quote_literal(publication)
            ))
            .await?
            .is_empty();
        match (exists, tables) {
            (true, _) => Ok(()),
            (false, Some(tables)) => {
                let list: Vec<String> = tables
                    .iter()
                    .map(|t| format!("{}.{}", quote_ident(&t.schema), quote_ident(&t.table)))
                    .collect();
                let sql = format!(
                    "CREATE PUBLICATION {} FOR TABLE {}",
                    quote_ident(publication),
                    list.join(", ")
                );
                self.client.batch_execute(&sql).await.map_err(|e| {
                    self.config(format!(
                        "cannot create publication {publication}: {}",
                        db_error(&e)
                    ))
                })
            }
            (false, None) => Err(self.config(format!(
                "publication `{publication}` does not exist at {}: create it with CREATE \
                 PUBLICATION {publication} FOR TABLE …, or list `tables:` and Sluice \
                 creates it",
                self.url
            ))),
        }
    }

    /// The tables of `publication`, each with its columns and primary key; a table
    /// without a primary key is an error naming it.
    pub async fn tables(&self, publication: &str) -> Result<Vec<Table>, SourceError> {
        let names = self
            .rows(&format!(
                "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = {} \
                 ORDER BY 1, 2",
                quote_literal(publication)
            ))
            .await?;
        let mut tables = Vec::new();
        for row in names {
            let name = TableName {
                schema: row[0].clone().unwrap_or_default(),
                table: row[1].clone().unwrap_or_default(),
            };
            tables.push(self.table(&name).await?);
        }
        Ok(tables)
    }

    pub async fn table(&self, name: &TableName) -> Result<Table, SourceError> {
        let regclass = quote_literal(&format!(
            "{}.{}",
            quote_ident(&name.schema),
            quote_ident(&name.table)
        ));
        let columns: Vec<(String, u32)> = self
            .rows(&format!(
                "SELECT attname, atttypid FROM pg_attribute WHERE attrelid = {regclass}::regclass \
                 AND attnum > 0 AND NOT attisdropped AND attgenerated = '' ORDER BY attnum"
            ))
            .await?
            .into_iter()
            .map(|r| {
                let oid = r[1].as_deref().and_then(|o| o.parse().ok()).unwrap_or(0);
                (r[0].clone().unwrap_or_default(), oid)
            })
            .collect();
        let key_names: Vec<String> = self
            .rows(&format!(
                "SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid \
                 AND a.attnum = ANY (i.indkey) WHERE i.indrelid = {regclass}::regclass AND \
                 i.indisprimary ORDER BY array_position(i.indkey::int2[], a.attnum)"
            ))
            .await?
            .into_iter()
            .filter_map(|r| r[0].clone())
            .collect();
        if key_names.is_empty() {
            return Err(self.config(format!(
                "table {name} has no primary key: change documents are keyed by it; add one \
                 (ALTER TABLE {name} ADD PRIMARY KEY (…)) or leave the table out of the \
                 publication"
            )));
        }
        let key: Vec<usize> = key_names
            .iter()
            .filter_map(|k| columns.iter().position(|(c, _)| c == k))
            .collect();
        let kinds = key.iter().map(|&i| KeyKind::of(columns[i].1)).collect();
        Ok(Table {
            name: name.clone(),
            columns,
            key,
            kinds,
        })
    }

    /// The whole type catalog: array element types.
    pub async fn types(&self) -> Result<Types, SourceError> {
        let rows = self
            .rows("SELECT oid, typcategory = 'A', typelem FROM pg_type")
            .await?;
        Ok(Types::from_rows(rows.into_iter().map(|r| {
            let num = |i: usize| r[i].as_deref().and_then(|v| v.parse().ok()).unwrap_or(0);
            (num(0), r[1].as_deref() == Some("t"), num(2))
        })))
    }

    /// The slot's confirmed position, if it exists (and is a logical slot of this
    /// database).
    pub async fn slot(&self, slot: &str) -> Result<Option<u64>, SourceError> {
        let rows = self
            .rows(&format!(
                "SELECT coalesce(confirmed_flush_lsn, '0/0')::text FROM pg_replication_slots \
                 WHERE slot_name = {} AND database = current_database()",
                quote_literal(slot)
            ))
            .await?;
        Ok(rows
            .first()
            .and_then(|r| r[0].as_deref().and_then(parse_lsn)))
    }

    /// Drops `slot` (inactive) if it exists.
    pub async fn drop_slot(&self, slot: &str) -> Result<(), SourceError> {
        self.batch(&format!(
            "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE \
             slot_name = {}",
            quote_literal(slot)
        ))
        .await
    }

    /// The server's current WAL position.
    pub async fn current_lsn(&self) -> Result<u64, SourceError> {
        let rows = self.rows("SELECT pg_current_wal_lsn()::text").await?;
        Ok(rows
            .first()
            .and_then(|r| r[0].as_deref().and_then(parse_lsn))
            .unwrap_or(0))
    }

    /// Starts the read-only transaction of the backfill, under an exported snapshot.
    pub async fn begin_snapshot(&self, snapshot: &str) -> Result<(), SourceError> {
        self.batch(&format!(
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SET TRANSACTION SNAPSHOT {}",
            quote_literal(snapshot)
        ))
        .await
    }

    /// The next rows of `table` after key `after` (all of them when the table cannot
    /// be chunked), in key order, at most `limit`.
    pub async fn chunk(
        &self,
        table: &Table,
        after: Option<&[String]>,
        limit: usize,
    ) -> Result<Vec<Vec<Option<String>>>, SourceError> {
        let columns: Vec<String> = table.columns.iter().map(|(c, _)| quote_ident(c)).collect();
        let from = format!(
            "{}.{}",
            quote_ident(&table.name.schema),
            quote_ident(&table.name.table)
        );
        let sql = match &table.kinds {
            None => format!("SELECT {} FROM ONLY {from}", columns.join(", ")),
            Some(kinds) => {
                // Text keys order byte-wise, as the stream compares them; uuids and
                // integers natively.
                let collated: Vec<bool> = (table.key.iter().zip(kinds))
                    .map(|(&i, kind)| *kind == KeyKind::Text && table.columns[i].1 != 2950)
                    .collect();
                let collate = |text: String, c: bool| match c {
                    true => format!("{text} COLLATE \"C\""),
                    false => text,
                };
                let ordered: Vec<String> = (table.key.iter().zip(&collated))
                    .map(|(&i, &c)| collate(columns[i].clone(), c))
                    .collect();
                let filter = match after {
                    None => String::new(),
                    Some(after) => {
                        let values: Vec<String> = (after.iter().zip(&collated))
                            .map(|(v, &c)| collate(quote_literal(v), c))
                            .collect();
                        format!(" WHERE ({}) > ({})", ordered.join(", "), values.join(", "))
                    }
                };
                format!(
                    "SELECT {} FROM ONLY {from}{filter} ORDER BY {} LIMIT {limit}",
                    columns.join(", "),
                    ordered.join(", ")
                )
            }
        };
        self.rows(&sql).await
    }
}

/// A server error with its detail and hint, not tokio-postgres's "db error".
pub fn db_error(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut text = db.message().to_string();
            if let Some(detail) = db.detail() {
                text = format!("{text}: {detail}");
            }
            if let Some(hint) = db.hint() {
                text = format!("{text} ({hint})");
            }
            text
        }
        None => e.to_string(),
    }
}
