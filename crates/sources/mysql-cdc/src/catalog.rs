//! The SQL connection: the server's checks (binary log on, `ROW` format, `FULL` row
//! image, the replication privileges), the captured tables (columns, kinds, primary
//! key), the consistent snapshot and its binlog position, the GTID state at a binlog
//! position (MariaDB), the chunk reads, and which segment of a resumed snapshot a key
//! falls in (both compared by the server, [`crate::key`]).
//!
//! Every call runs under [`CALL_TIMEOUT`]: a server that hangs becomes a retryable
//! [`SourceError::Timeout`], never a stuck pipeline.

use crate::key;
use crate::position::{BinlogPos, GtidState, TableName};
use crate::types::{self, Collation, Column, Kind, Origin};
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts, Row, Value};
use sluice_source_sdk::SourceError;
use std::time::Duration;

/// The longest any one SQL call may take (a chunk of `chunk_rows` rows included).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// A captured table as the catalog describes it.
#[derive(Debug, Clone)]
pub struct Table {
    pub name: TableName,
    pub columns: Vec<Column>,
    /// The primary key's columns, by index into `columns`, in key order.
    pub key: Vec<usize>,
    /// Read by ranges of its key; else whole, in one step (a key of a `JSON` column:
    /// [`key::is_bound`]).
    pub chunked: bool,
}

impl Table {
    /// The key of a row (one value per column, as `origin` sends them) as the text of
    /// its JSON.
    pub fn key_of(&self, values: &[Option<Value>], origin: Origin) -> Vec<String> {
        self.key
            .iter()
            .map(|&i| {
                let mut out = Vec::new();
                let value = values.get(i).cloned().flatten().unwrap_or(Value::NULL);
                types::write(&self.columns[i].kind, &value, origin, &mut out);
                String::from_utf8(out).expect("JSON is UTF-8")
            })
            .collect()
    }

    /// Whether its keys compare as Rust compares their numbers
    /// ([`crate::position::compare_keys`]); else the server compares them.
    pub fn int_key(&self) -> bool {
        self.key.iter().all(|&i| self.columns[i].kind.is_int())
    }

    /// A journaled key (text forms) as typed parameters; Err: one does not read as a
    /// value of its column, named.
    pub fn key_params(&self, key: &[String]) -> Result<Vec<Value>, String> {
        if key.len() != self.key.len() {
            return Err(format!(
                "a key of {} values, and {} has {} key columns",
                key.len(),
                self.name,
                self.key.len()
            ));
        }
        self.key
            .iter()
            .zip(key)
            .map(|(&i, text)| {
                let column = &self.columns[i];
                key::param(&column.kind, text).map_err(|e| format!("column {}: {e}", column.name))
            })
            .collect()
    }

    /// `(?, ?)` of a key bound: each parameter compared as its column orders.
    fn key_row(&self) -> String {
        let marks: Vec<String> = self
            .key
            .iter()
            .map(|&i| key::placeholder(&self.columns[i]))
            .collect();
        format!("({})", marks.join(", "))
    }
}

/// Backquotes an identifier.
pub fn quote(ident: &str) -> String {
    format!("`{}`", ident.replace('`', "``"))
}

pub struct Catalog {
    conn: Conn,
    name: String,
    /// The URL without its password, for messages.
    url: String,
}

impl Catalog {
    pub async fn connect(name: &str, opts: &Opts, url: &str) -> Result<Catalog, SourceError> {
        let conn = timed(name, "connect", Conn::new(opts.clone()))
            .await?
            .map_err(|e| server_error(name, url, "cannot connect", e))?;
        let mut catalog = Catalog {
            conn,
            name: name.to_string(),
            url: url.to_string(),
        };
        // Snapshot TIMESTAMPs in UTC, as the binlog sends them.
        catalog.exec_drop("SET time_zone = '+00:00'").await?;
        Ok(catalog)
    }

    fn err(&self, what: &str, e: mysql_async::Error) -> SourceError {
        server_error(&self.name, &self.url, what, e)
    }

    fn config(&self, reason: String) -> SourceError {
        SourceError::Config {
            name: self.name.clone(),
            reason: format!("{reason} (at {})", self.url),
        }
    }

    async fn exec_drop(&mut self, sql: &str) -> Result<(), SourceError> {
        timed(&self.name, "query", self.conn.query_drop(sql))
            .await?
            .map_err(|e| server_error(&self.name, &self.url, sql, e))
    }

    async fn rows(&mut self, sql: &str, params: Vec<Value>) -> Result<Vec<Row>, SourceError> {
        let result = match params.is_empty() {
            true => timed(&self.name, "query", self.conn.query::<Row, _>(sql)).await?,
            false => {
                timed(
                    &self.name,
                    "query",
                    self.conn.exec::<Row, _, _>(sql, params),
                )
                .await?
            }
        };
        result.map_err(|e| self.err(sql, e))
    }

    async fn variable(&mut self, name: &str) -> Result<Option<String>, SourceError> {
        let rows = self
            .rows(&format!("SHOW GLOBAL VARIABLES LIKE '{name}'"), vec![])
            .await?;
        Ok(rows.into_iter().next().and_then(|r| r.get::<String, _>(1)))
    }

    /// The binary log is on, in `ROW` format with `FULL` images, uncompressed, and the
    /// user may read it.
    pub async fn check_server(&mut self) -> Result<(), SourceError> {
        let setting = |name: &str, want: &str, now: Option<String>| match now {
            Some(now) if now.eq_ignore_ascii_case(want) => Ok(()),
            now => Err(format!(
                "{name} is {}, and change data capture needs {name}={want}: set it in the \
                 server's configuration ([mysqld] {name}={want}) and restart the server",
                now.as_deref().unwrap_or("unset"),
            )),
        };
        let log_bin = self.variable("log_bin").await?;
        if !log_bin.is_some_and(|on| on.eq_ignore_ascii_case("ON")) {
            return Err(self.config(
                "the binary log is off (log_bin), and change data capture reads it: set \
                 log_bin=mysql-bin (the files' base name), binlog_format=ROW and server_id=1 \
                 in the server's configuration ([mysqld]) and restart the server"
                    .into(),
            ));
        }
        let format = self.variable("binlog_format").await?;
        setting("binlog_format", "ROW", format).map_err(|r| self.config(r))?;
        let image = self.variable("binlog_row_image").await?;
        setting("binlog_row_image", "FULL", image).map_err(|r| self.config(r))?;
        if let Some(compress) = self.variable("log_bin_compress").await?
            && compress.eq_ignore_ascii_case("ON")
        {
            return Err(self.config(
                "log_bin_compress is ON: the compressed binlog events of MariaDB are not \
                 read yet; set log_bin_compress=OFF"
                    .into(),
            ));
        }
        self.master().await.map(drop)
    }

    /// The end of the binary log now (`SHOW MASTER STATUS`: needs REPLICATION CLIENT,
    /// MariaDB 10.5+: BINLOG MONITOR).
    pub async fn master(&mut self) -> Result<BinlogPos, SourceError> {
        let rows = self.rows("SHOW MASTER STATUS", vec![]).await?;
        let row = rows.into_iter().next().ok_or_else(|| {
            self.config(
                "SHOW MASTER STATUS returned nothing: the binary log is off; set \
                 log_bin=mysql-bin in the server's configuration and restart it"
                    .into(),
            )
        })?;
        Ok(BinlogPos::new(
            row.get::<String, _>(0).unwrap_or_default(),
            row.get::<u64, _>(1).unwrap_or(4),
        ))
    }

    /// The GTID state at `pos` of this server's binary log (MariaDB's
    /// `BINLOG_GTID_POS`): what a replica connecting by GTID there says. None: the
    /// server has no GTIDs (MySQL: no such function) or cannot map the position.
    pub async fn gtid_state_at(&mut self, pos: &BinlogPos) -> Option<GtidState> {
        let params = vec![Value::from(pos.file.as_str()), Value::from(pos.pos)];
        let rows = self
            .rows("SELECT BINLOG_GTID_POS(?, ?)", params)
            .await
            .ok()?;
        let text = rows.into_iter().next()?.get::<Option<String>, _>(0)??;
        GtidState::parse(&text)
    }

    /// The GTID state the server's oldest binary log starts from: transactions of it
    /// and before are gone. None: as for [`Catalog::gtid_state_at`].
    pub async fn oldest_gtid_state(&mut self) -> Result<Option<GtidState>, SourceError> {
        let logs = self.binary_logs().await?;
        let Some((first, _)) = logs.into_iter().next() else {
            return Ok(None);
        };
        Ok(self.gtid_state_at(&BinlogPos::new(first, 4)).await)
    }

    /// The binary log files the server holds, with their sizes.
    pub async fn binary_logs(&mut self) -> Result<Vec<(String, u64)>, SourceError> {
        let rows = self.rows("SHOW BINARY LOGS", vec![]).await?;
        Ok(rows
            .into_iter()
            .map(|r| {
                (
                    r.get::<String, _>(0).unwrap_or_default(),
                    r.get::<u64, _>(1).unwrap_or(0),
                )
            })
            .collect())
    }

    /// A captured table: its columns, their kinds, its primary key.
    pub async fn table(&mut self, name: &TableName) -> Result<Table, SourceError> {
        let params = || vec![Value::from(&name.schema), Value::from(&name.table)];
        let rows = self
            .rows(
                "SELECT COLUMN_NAME, LOWER(DATA_TYPE), LOWER(COLUMN_TYPE), \
                 LOWER(CHARACTER_SET_NAME), LOWER(COLLATION_NAME) \
                 FROM information_schema.COLUMNS \
                 WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? ORDER BY ORDINAL_POSITION",
                params(),
            )
            .await?;
        if rows.is_empty() {
            return Err(self.config(format!(
                "table {name} does not exist, or the user may not read it: create it, or \
                 GRANT SELECT ON {name} to the user"
            )));
        }
        // MariaDB's JSON is LONGTEXT with a CHECK (json_valid(`col`)) constraint.
        let checks = self
            .rows(
                "SELECT CHECK_CLAUSE FROM information_schema.CHECK_CONSTRAINTS \
                 WHERE CONSTRAINT_SCHEMA = ? AND TABLE_NAME = ?",
                params(),
            )
            .await
            .unwrap_or_default();
        let json_columns: Vec<String> = checks
            .into_iter()
            .filter_map(|r| r.get::<String, _>(0))
            .filter_map(|c| {
                c.strip_prefix("json_valid(`")
                    .and_then(|c| c.strip_suffix("`)"))
                    .map(str::to_string)
            })
            .collect();
        let mut columns = Vec::new();
        for row in rows {
            let column: String = row.get(0).unwrap_or_default();
            let data_type: String = row.get(1).unwrap_or_default();
            let column_type: String = row.get(2).unwrap_or_default();
            let charset: Option<String> = row.get::<Option<String>, _>(3).flatten();
            let collation = row.get::<Option<String>, _>(4).flatten();
            let mut kind = Kind::of(&data_type, &column_type, json_columns.contains(&column))
                .map_err(|why| {
                    self.config(format!(
                        "column {column} of {name}: {why}; leave the table out of tables"
                    ))
                })?;
            if let Kind::Text { latin1 } = &mut kind {
                match charset.as_deref() {
                    None | Some("utf8mb4" | "utf8mb3" | "utf8" | "ascii") => {}
                    Some("latin1") => *latin1 = true,
                    Some(other) => {
                        return Err(self.config(format!(
                            "column {column} of {name} is in character set {other}, which \
                             the binary log sends as its bytes and is not decoded yet: \
                             convert it (ALTER TABLE {name} MODIFY {column} … CHARACTER SET \
                             utf8mb4) or leave the table out of tables"
                        )));
                    }
                }
            }
            columns.push(Column {
                name: column,
                kind,
                sql_type: column_type,
                collation: charset
                    .zip(collation)
                    .map(|(charset, name)| Collation { charset, name }),
            });
        }
        let keys = self
            .rows(
                "SELECT COLUMN_NAME FROM information_schema.KEY_COLUMN_USAGE \
                 WHERE TABLE_SCHEMA = ? AND TABLE_NAME = ? AND CONSTRAINT_NAME = 'PRIMARY' \
                 ORDER BY ORDINAL_POSITION",
                params(),
            )
            .await?;
        let key: Vec<usize> = keys
            .into_iter()
            .filter_map(|r| r.get::<String, _>(0))
            .filter_map(|k| columns.iter().position(|c| c.name == k))
            .collect();
        if key.is_empty() {
            return Err(self.config(format!(
                "table {name} has no primary key: a change could not name the row it \
                 changes; add one (ALTER TABLE {name} ADD PRIMARY KEY (…)) or leave the \
                 table out of tables"
            )));
        }
        let chunked = key.iter().all(|&i| key::is_bound(&columns[i].kind));
        Ok(Table {
            name: name.clone(),
            columns,
            key,
            chunked,
        })
    }

    /// Starts a consistent snapshot and returns the binlog position it is consistent
    /// with, and `@@gtid_binlog_pos` (MariaDB: `binlog_snapshot_file/position`, given
    /// by the server for exactly this snapshot, no lock taken).
    pub async fn begin_snapshot(&mut self) -> Result<(BinlogPos, String), SourceError> {
        self.exec_drop("SET SESSION TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            .await?;
        self.exec_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT, READ ONLY")
            .await?;
        let rows = self
            .rows("SHOW STATUS LIKE 'binlog_snapshot_%'", vec![])
            .await?;
        let (mut file, mut pos) = (None, None);
        for row in rows {
            let name: String = row.get(0).unwrap_or_default();
            let value: String = row.get(1).unwrap_or_default();
            match name.to_ascii_lowercase().as_str() {
                "binlog_snapshot_file" => file = Some(value),
                "binlog_snapshot_position" => pos = value.parse().ok(),
                _ => {}
            }
        }
        let (Some(file), Some(pos)) = (file.filter(|f| !f.is_empty()), pos) else {
            return Err(self.config(
                "the server gives no binlog position for a consistent snapshot \
                 (binlog_snapshot_file): that is MariaDB's; MySQL is not supported yet"
                    .into(),
            ));
        };
        let gtid = self
            .rows("SELECT @@GLOBAL.gtid_binlog_pos", vec![])
            .await
            .ok()
            .and_then(|rows| rows.into_iter().next())
            .and_then(|r| r.get::<Option<String>, _>(0).flatten())
            .unwrap_or_default();
        Ok((BinlogPos::new(file, pos), gtid))
    }

    /// Up to `limit` rows of `table` after the key `after` (typed by
    /// [`Table::key_params`]), in key order; a table not chunked is read whole.
    ///
    /// `WHERE k1 >= ? AND (k1, k2) > (?, ?)`: the server compares the bound as it
    /// orders the rows, and the leading `k1 >= ?` lets it seek the key's index (MariaDB
    /// reads a row comparison alone by scanning the index from its start).
    pub async fn chunk(
        &mut self,
        table: &Table,
        after: Option<Vec<Value>>,
        limit: usize,
    ) -> Result<Vec<Vec<Option<Value>>>, SourceError> {
        let columns: Vec<String> = table.columns.iter().map(|c| quote(&c.name)).collect();
        let keys: Vec<String> = table.key.iter().map(|&i| columns[i].clone()).collect();
        let from = format!("{}.{}", quote(&table.name.schema), quote(&table.name.table));
        let mut sql = format!("SELECT {} FROM {from}", columns.join(", "));
        let mut params = Vec::new();
        if table.chunked {
            if let Some(after) = after {
                if keys.len() > 1 {
                    let first = key::placeholder(&table.columns[table.key[0]]);
                    sql += &format!(" WHERE {} >= {first} AND", keys[0]);
                    params.push(after[0].clone());
                } else {
                    sql += " WHERE";
                }
                sql += &format!(" ({}) > {}", keys.join(", "), table.key_row());
                params.extend(after);
            }
            sql += &format!(" ORDER BY {} LIMIT {limit}", keys.join(", "));
        }
        // The binary protocol (typed values, as the binlog's) even without parameters.
        let result = timed(
            &self.name,
            "query",
            self.conn.exec::<Row, _, _>(sql.as_str(), params),
        )
        .await?;
        let rows = result.map_err(|e| self.err(&sql, e))?;
        Ok(rows
            .into_iter()
            .map(|row| row.unwrap().into_iter().map(Some).collect())
            .collect())
    }
}

impl Catalog {
    /// Which of `uptos` (the upper bounds of a table's segments, in key order; none:
    /// the end of the table) the key `key` falls in, first to last, as the server
    /// orders the table's keys. Err: a key does not read as a value of its column.
    pub async fn segment_of(
        &mut self,
        table: &Table,
        key: &[String],
        uptos: &[Option<&[String]>],
    ) -> Result<usize, SourceError> {
        let bad = |e: String| SourceError::Io {
            name: self.name.clone(),
            path: self.url.clone(),
            error: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "a key of {} to place among its snapshot's segments: {e}",
                    table.name
                ),
            ),
        };
        let row = table.key_row();
        let mut tests = Vec::new();
        let mut params = Vec::new();
        let bounded = uptos.iter().take_while(|u| u.is_some()).flatten();
        for upto in bounded {
            tests.push(format!("{row} <= {row}"));
            params.extend(table.key_params(key).map_err(bad)?);
            params.extend(table.key_params(upto).map_err(bad)?);
        }
        if tests.is_empty() {
            return Ok(0);
        }
        let sql = format!("SELECT {}", tests.join(", "));
        let rows = self.rows(&sql, params).await?;
        let within: Vec<Option<i64>> = rows
            .into_iter()
            .next()
            .map(|row| {
                row.unwrap()
                    .into_iter()
                    .map(|v| mysql_async::from_value_opt(v).ok())
                    .collect()
            })
            .unwrap_or_default();
        Ok(within
            .iter()
            .position(|w| *w == Some(1))
            .unwrap_or(tests.len()))
    }
}

/// Runs `call` under [`CALL_TIMEOUT`].
pub async fn timed<T>(
    name: &str,
    call: &'static str,
    future: impl std::future::Future<Output = T>,
) -> Result<T, SourceError> {
    tokio::time::timeout(CALL_TIMEOUT, future)
        .await
        .map_err(|_| SourceError::Timeout {
            name: name.to_string(),
            call,
            after: CALL_TIMEOUT,
        })
}

/// A server's error, named: a missing privilege, a purged log, a bad password are the
/// user's to fix (not retryable); the rest is I/O (retryable).
pub fn server_error(name: &str, url: &str, what: &str, e: mysql_async::Error) -> SourceError {
    let config = |reason: String| SourceError::Config {
        name: name.to_string(),
        reason: format!("{what} at {url}: {reason}"),
    };
    match &e {
        mysql_async::Error::Server(server) => match server.code {
            // ER_SPECIFIC_ACCESS_DENIED_ERROR, ER_ACCESS_DENIED_NO_PASSWORD_ERROR
            1227 | 1698 => config(format!(
                "{}: the user needs REPLICATION SLAVE and REPLICATION CLIENT (MariaDB 10.5+: \
                 REPLICATION SLAVE and BINLOG MONITOR): GRANT REPLICATION SLAVE, \
                 REPLICATION CLIENT ON *.* TO the user",
                server.message
            )),
            // ER_ACCESS_DENIED_ERROR, ER_DBACCESS_DENIED_ERROR, ER_TABLEACCESS_DENIED_ERROR
            1045 | 1044 | 1142 => config(format!(
                "{}: check the user and password in url, and GRANT SELECT on the tables",
                server.message
            )),
            _ => io(name, url, what, e),
        },
        _ => io(name, url, what, e),
    }
}

fn io(name: &str, url: &str, what: &str, e: mysql_async::Error) -> SourceError {
    SourceError::Io {
        name: name.to_string(),
        path: url.to_string(),
        error: std::io::Error::other(format!("{what}: {e}")),
    }
}
