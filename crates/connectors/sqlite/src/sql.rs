//! Talking to SQLite: SQL text and value conversion (pure), then the few operations on a
//! connection (connect, inspect, fence and recover, commit the checkpoint).
//!
//! A binding becomes a [`Table`]: its columns are the selected fields in field-selection
//! order (keys, then values, then the document), which is also the order of the values
//! in a Store message (`packed_keys`, `packed_values`, `docs_json`). Every statement the
//! driver runs is generated here, so Apply's action description is exactly what runs.
//!
//! Column types come from the projection's inferred JSON types (`null` ignored):
//!
//! ```text
//!   integer → INTEGER     number, integer+number → REAL     boolean → INTEGER (0/1)
//!   string  → TEXT        object, array, several types → TEXT holding JSON text
//! ```
//!
//! Invariants:
//! - Every identifier is quoted with [`quote_ident`] (`"a""b"`), so table and field
//!   names such as `select`, `Mixed Case` or `a"b` are safe; every literal in an action
//!   description is quoted with [`quote_literal`].
//! - A key value is converted by the same [`sql_value`] on load and on store, so the
//!   lookup of a key always compares equal to the row stored for it. (SQLite compares
//!   `3` and `3.0` as equal, so a `number` key holding both would collide; the packed
//!   keys differ. We accept that: such keys are rare and Flow's SQLite driver does the
//!   same.)
//! - Delta-update tables have no primary key: every store appends a row.
//! - Fencing: `sluice_checkpoints` holds one row per (materialization, key range) with a
//!   fence counter. [`claim_range`] bumps the fence of every overlapping range and reads
//!   its own; [`commit_checkpoint`] updates the checkpoint only where the fence is still
//!   the one read, inside the transaction that writes the data. SQLite serializes
//!   writers, so either the older instance commits before the newer one claims (and the
//!   newer one recovers that commit), or it finds a stale fence and rolls back.

use rusqlite::types::{ToSqlOutput, Value as SqlValue, ValueRef};
use rusqlite::{Connection, OpenFlags, OptionalExtension, TransactionBehavior, params};
use serde_json::Value;
pub use sluice_driver_sdk::fence::Claim;
use sluice_driver_sdk::{Error, Result};
use sluice_sqlkit::{self as kit, ColumnKind, Inferred};
use std::path::Path;
use std::time::Duration;

/// The table of fences and runtime checkpoints, one row per (materialization, key range).
pub const CHECKPOINTS_TABLE: &str = "sluice_checkpoints";

/// DDL of [`CHECKPOINTS_TABLE`].
pub const CREATE_CHECKPOINTS: &str = "CREATE TABLE IF NOT EXISTS \"sluice_checkpoints\" (\
\"materialization\" TEXT NOT NULL, \"key_begin\" INTEGER NOT NULL, \"key_end\" INTEGER NOT NULL, \
\"fence\" INTEGER NOT NULL, \"checkpoint\" BLOB, \
PRIMARY KEY (\"materialization\", \"key_begin\", \"key_end\"))";

/// How a column holds its field's JSON values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnType {
    Integer,
    Real,
    Boolean,
    Text,
    /// JSON text of any value (objects, arrays, fields of several types, the document).
    Json,
}

impl ColumnKind for ColumnType {
    const STORE: &'static str = "SQLite";
    const DOCUMENT: Self = ColumnType::Json;

    fn of_inferred(inferred: Inferred) -> Self {
        match inferred {
            Inferred::Integer => ColumnType::Integer,
            Inferred::Number => ColumnType::Real,
            Inferred::Boolean => ColumnType::Boolean,
            Inferred::String | Inferred::DateTime => ColumnType::Text,
            Inferred::Other => ColumnType::Json,
        }
    }
}

impl ColumnType {
    /// The declared SQL type. JSON is declared `TEXT`: a type name such as `JSON` would
    /// give the column NUMERIC affinity and turn the text `5` into the integer 5.
    pub fn sql(self) -> &'static str {
        match self {
            ColumnType::Integer | ColumnType::Boolean => "INTEGER",
            ColumnType::Real => "REAL",
            ColumnType::Text | ColumnType::Json => "TEXT",
        }
    }
}

pub type Column = kit::Column<ColumnType>;

sluice_sqlkit::table_newtype!(
    /// One binding's table (see [`sql::Table`]), with the SQL that creates, loads and
    /// changes it.
    Table(ColumnType)
);

impl Table {
    pub fn column_def(column: &Column) -> String {
        format!("{} {}", quote_ident(&column.field), column.ty.sql())
    }

    /// `CREATE TABLE IF NOT EXISTS`, with a primary key unless delta-updated.
    pub fn create_sql(&self) -> String {
        let mut defs: Vec<String> = self.columns.iter().map(Table::column_def).collect();
        if !self.delta_updates {
            defs.push(format!("PRIMARY KEY ({})", idents(self.keys())));
        }
        format!(
            "CREATE TABLE IF NOT EXISTS {} ({})",
            quote_ident(&self.name),
            defs.join(", ")
        )
    }

    /// Adds a (nullable) column that a later version of the binding selects.
    pub fn add_column_sql(&self, column: &Column) -> String {
        format!(
            "ALTER TABLE {} ADD COLUMN {}",
            quote_ident(&self.name),
            Table::column_def(column)
        )
    }

    pub fn drop_sql(&self) -> String {
        format!("DROP TABLE IF EXISTS {}", quote_ident(&self.name))
    }

    /// Inserts one row (every column, in order).
    pub fn insert_sql(&self) -> String {
        format!(
            "INSERT INTO {} ({}) VALUES ({})",
            quote_ident(&self.name),
            idents(&self.columns),
            placeholders(self.columns.len())
        )
    }

    /// Inserts one row or, if its key is present, replaces every non-key column.
    pub fn upsert_sql(&self) -> String {
        let updates: Vec<String> = self.columns[self.key_count..]
            .iter()
            .map(|c| format!("{0} = excluded.{0}", quote_ident(&c.field)))
            .collect();
        let action = if updates.is_empty() {
            "NOTHING".to_owned()
        } else {
            format!("UPDATE SET {}", updates.join(", "))
        };
        format!(
            "{} ON CONFLICT ({}) DO {action}",
            self.insert_sql(),
            idents(self.keys())
        )
    }

    /// Deletes the row of one key.
    pub fn delete_sql(&self) -> String {
        let conditions: Vec<String> = self
            .keys()
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{} = ?{}", quote_ident(&c.field), i + 1))
            .collect();
        format!(
            "DELETE FROM {} WHERE {}",
            quote_ident(&self.name),
            conditions.join(" AND ")
        )
    }

    /// Selects the documents of `n` keys, bound as `n * key_count` parameters in key
    /// order. Both forms are answered by primary-key lookups, one per distinct key:
    ///
    /// - one key column: `WHERE k IN (?, ...)`;
    /// - several: a join of the distinct VALUES rows to the table. A row-value
    ///   `(a, b) IN (VALUES ...)` would scan the whole table (SQLite's planner does not
    ///   use the index for it), and `CROSS JOIN` pins the VALUES as the outer loop.
    pub fn load_sql(&self, n: usize) -> Option<String> {
        let document = quote_ident(&self.document()?.field);
        let table = quote_ident(&self.name);
        let keys = self.keys();
        if let [key] = keys {
            return Some(format!(
                "SELECT {document} FROM {table} WHERE {} IN ({})",
                quote_ident(&key.field),
                placeholders(n)
            ));
        }
        let row = format!("({})", placeholders(keys.len()));
        let on: Vec<String> = keys
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{table}.{} = k.column{}", quote_ident(&c.field), i + 1))
            .collect();
        Some(format!(
            "SELECT {table}.{document} FROM (SELECT DISTINCT * FROM (VALUES {})) AS k \
             CROSS JOIN {table} ON {}",
            vec![row; n].join(", "),
            on.join(" AND ")
        ))
    }
}

/// `"name"`, with embedded quotes doubled.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `'text'`, with embedded quotes doubled.
pub fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

fn idents(columns: &[Column]) -> String {
    let quoted: Vec<String> = columns.iter().map(|c| quote_ident(&c.field)).collect();
    quoted.join(", ")
}

fn placeholders(n: usize) -> String {
    vec!["?"; n].join(", ")
}

/// The SQL value of a JSON value in a column of type `ty`. JSON null is SQL NULL; a JSON
/// column holds the value's JSON text; other columns hold the natural SQL value.
pub fn sql_value(value: &Value, ty: ColumnType) -> ToSqlOutput<'_> {
    let owned = |v: SqlValue| ToSqlOutput::Owned(v);
    match (value, ty) {
        (Value::Null, _) => owned(SqlValue::Null),
        (_, ColumnType::Json) | (Value::Array(_) | Value::Object(_), _) => {
            owned(SqlValue::Text(value.to_string()))
        }
        (Value::Bool(b), _) => owned(SqlValue::Integer(i64::from(*b))),
        (Value::String(s), _) => ToSqlOutput::Borrowed(ValueRef::Text(s.as_bytes())),
        (Value::Number(n), _) => match n.as_i64() {
            Some(i) => owned(SqlValue::Integer(i)),
            // Floats, and integers above i64::MAX (SQLite has no wider integer).
            None => owned(SqlValue::Real(n.as_f64().unwrap_or(f64::NAN))),
        },
    }
}

/// How long a statement waits for another connection's write lock before failing with
/// SQLITE_BUSY. Long enough to outlast a peer's commit (one fsync) or a zombie's store
/// phase of a normal-sized transaction; short enough that a stuck peer surfaces as an
/// error an operator sees.
const BUSY_TIMEOUT: Duration = Duration::from_secs(30);

/// Prepared statements kept per connection: a few per binding plus the load chunks.
const STATEMENT_CACHE: usize = 256;

/// A store error from SQLite; busy and locked databases are worth a retry.
pub fn store_error(context: impl Into<String>, err: rusqlite::Error) -> Error {
    let retryable = matches!(
        err.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    );
    Error::store(context, err, retryable)
}

/// Opens (creating if missing, with its parent directories) the database at `path` in
/// WAL mode with `synchronous=FULL`: a COMMIT returns only after the WAL is fsynced,
/// which is what makes a committed checkpoint durable.
pub fn connect(path: &Path) -> Result<Connection> {
    let at = |what: &str| format!("{what} SQLite database {}", path.display());
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).map_err(|err| {
            Error::store(
                format!("creating directory {}", parent.display()),
                err,
                false,
            )
        })?;
    }
    let conn = Connection::open(path).map_err(|err| store_error(at("opening"), err))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|err| store_error(at("configuring"), err))?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |row| row.get(0))
        .map_err(|err| store_error(at("enabling WAL on"), err))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(Error::store(
            at("enabling WAL on"),
            format!("journal mode is {mode}"),
            false,
        ));
    }
    conn.execute_batch("PRAGMA synchronous = FULL")
        .map_err(|err| store_error(at("configuring"), err))?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(conn)
}

/// Opens the database at `path` read-only, or `None` if it does not exist (dry runs
/// must not create it).
pub fn connect_read_only(path: &Path) -> Result<Option<Connection>> {
    if !path.exists() {
        return Ok(None);
    }
    Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map(Some)
        .map_err(|err| store_error(format!("opening SQLite database {}", path.display()), err))
}

/// The columns of `table`, empty if it does not exist.
pub fn existing_columns(conn: &Connection, table: &str) -> Result<Vec<String>> {
    let context = || format!("reading the columns of table {table:?}");
    let mut stmt = conn
        .prepare_cached("SELECT name FROM pragma_table_info(?1)")
        .map_err(|err| store_error(context(), err))?;
    let names = stmt
        .query_map([table], |row| row.get(0))
        .and_then(|rows| rows.collect())
        .map_err(|err| store_error(context(), err))?;
    Ok(names)
}

/// The claimed range's fence as stored now (`None` if its row is gone), read in a
/// statement of its own to explain a failed store or commit.
pub fn current_fence(conn: &Connection, claim: &Claim) -> Result<Option<i64>> {
    conn.prepare_cached(
        "SELECT \"fence\" FROM \"sluice_checkpoints\" WHERE \"materialization\" = ?1 \
         AND \"key_begin\" = ?2 AND \"key_end\" = ?3",
    )
    .and_then(|mut stmt| {
        stmt.query_row(
            params![
                claim.materialization,
                i64::from(claim.key_begin),
                i64::from(claim.key_end)
            ],
            |row| row.get(0),
        )
        .optional()
    })
    .map_err(|err| store_error("reading the fence of the claimed range", err))
}

/// Fences every overlapping range of `materialization` and recovers the checkpoint of
/// the narrowest stored range covering `[key_begin, key_end]` (empty if none): a split
/// shard resumes from its parent's checkpoint, and records it as its own.
///
/// Postcondition: after this returns, older instances of every overlapping range hold a
/// stale fence, so their [`commit_checkpoint`] fails; this claim holds the current one.
pub fn claim_range(
    conn: &mut Connection,
    materialization: &str,
    key_begin: u32,
    key_end: u32,
) -> Result<(Claim, Vec<u8>)> {
    let context =
        || format!("fencing key range [{key_begin:08x}, {key_end:08x}] of {materialization:?}");
    let err = |err| store_error(context(), err);
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(err)?;
    tx.execute_batch(CREATE_CHECKPOINTS).map_err(err)?;
    let (m, b, e) = (materialization, i64::from(key_begin), i64::from(key_end));
    let checkpoint: Option<Vec<u8>> = tx
        .query_row(
            "SELECT \"checkpoint\" FROM \"sluice_checkpoints\" WHERE \"materialization\" = ?1 \
             AND \"key_begin\" <= ?2 AND \"key_end\" >= ?3 \
             ORDER BY \"key_end\" - \"key_begin\" LIMIT 1",
            params![m, b, e],
            |row| row.get(0),
        )
        .optional()
        .map_err(err)?
        .flatten();
    let checkpoint = checkpoint.unwrap_or_default();
    tx.execute(
        "INSERT INTO \"sluice_checkpoints\" VALUES (?1, ?2, ?3, 0, ?4) ON CONFLICT DO NOTHING",
        params![m, b, e, checkpoint],
    )
    .map_err(err)?;
    tx.execute(
        "UPDATE \"sluice_checkpoints\" SET \"fence\" = \"fence\" + 1 WHERE \"materialization\" = ?1 \
         AND \"key_begin\" <= ?3 AND \"key_end\" >= ?2",
        params![m, b, e],
    )
    .map_err(err)?;
    let fence: i64 = tx
        .query_row(
            "SELECT \"fence\" FROM \"sluice_checkpoints\" WHERE \"materialization\" = ?1 \
             AND \"key_begin\" = ?2 AND \"key_end\" = ?3",
            params![m, b, e],
            |row| row.get(0),
        )
        .map_err(err)?;
    tx.commit().map_err(err)?;
    let claim = Claim::new(materialization, key_begin, key_end, fence);
    Ok((claim, checkpoint))
}

/// Within the caller's open transaction: records `checkpoint` for the claimed range if
/// the claim's fence is still current, else rolls the transaction back and fails with
/// [`Error::Fenced`].
pub fn commit_checkpoint(conn: &Connection, claim: &Claim, checkpoint: &[u8]) -> Result<()> {
    let context = "committing the runtime checkpoint";
    let changed = conn
        .prepare_cached(
            "UPDATE \"sluice_checkpoints\" SET \"checkpoint\" = ?1 WHERE \"materialization\" = ?2 \
             AND \"key_begin\" = ?3 AND \"key_end\" = ?4 AND \"fence\" = ?5",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                checkpoint,
                claim.materialization,
                i64::from(claim.key_begin),
                i64::from(claim.key_end),
                claim.fence
            ])
        })
        .map_err(|err| store_error(context, err))?;
    if changed != 1 {
        conn.execute_batch("ROLLBACK")
            .map_err(|err| store_error("rolling back a fenced transaction", err))?;
        return Err(claim.range_fence().fenced(None));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_inferred_shape_is_declared_as_its_column_type() {
        for (inferred, declared) in [
            (Inferred::Integer, "INTEGER"),
            (Inferred::Number, "REAL"),
            (Inferred::Boolean, "INTEGER"),
            (Inferred::String, "TEXT"),
            (Inferred::DateTime, "TEXT"),
            (Inferred::Other, "TEXT"),
        ] {
            assert_eq!(
                ColumnType::of_inferred(inferred).sql(),
                declared,
                "{inferred:?}"
            );
        }
    }

    #[test]
    fn identifiers_and_literals_are_quoted() {
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_ident("select"), "\"select\"");
        assert_eq!(quote_literal("it's"), "'it''s'");
    }

    /// A table keyed by `(a, b)` with a document column `d`.
    fn composite_table() -> Table {
        let column = |field: &str, ty, key| Column {
            field: field.to_owned(),
            ptr: format!("/{field}"),
            ty,
            key,
        };
        Table(kit::Table {
            name: "t".into(),
            collection: "c".into(),
            columns: vec![
                column("a", ColumnType::Text, true),
                column("b", ColumnType::Integer, true),
                column("d", ColumnType::Json, false),
            ],
            key_count: 2,
            has_document: true,
            delta_updates: false,
        })
    }

    #[test]
    fn composite_key_loads_search_the_primary_key() {
        let table = composite_table();
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(&table.create_sql()).unwrap();
        let sql = table.load_sql(2).unwrap();
        let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
        let plan: Vec<String> = stmt
            .query_map(params!["x", 1, "y", 2], |row| row.get(3))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert!(
            plan.iter().any(|step| step.starts_with("SEARCH t USING")),
            "{plan:?}"
        );
        assert!(!plan.iter().any(|step| step == "SCAN t"), "{plan:?}");
    }

    #[test]
    fn composite_key_loads_return_each_found_key_once() {
        let table = composite_table();
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(&table.create_sql()).unwrap();
        conn.execute(&table.insert_sql(), params!["x", 1, "{}"])
            .unwrap();
        let sql = table.load_sql(3).unwrap();
        let found: Vec<String> = conn
            .prepare(&sql)
            .unwrap()
            .query_map(params!["x", 1, "x", 1, "x", 2], |row| row.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert_eq!(found, ["{}"]);
    }

    #[test]
    fn json_columns_hold_json_text() {
        let v = serde_json::json!("x");
        assert_eq!(
            sql_value(&v, ColumnType::Json),
            ToSqlOutput::Owned(SqlValue::Text("\"x\"".into()))
        );
        assert_eq!(
            sql_value(&v, ColumnType::Text),
            ToSqlOutput::Borrowed(ValueRef::Text(b"x"))
        );
        assert_eq!(
            sql_value(&serde_json::json!(true), ColumnType::Boolean),
            ToSqlOutput::Owned(SqlValue::Integer(1))
        );
    }
}
