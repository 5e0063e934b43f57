//! SQLite's SQL text and value conversion, pure and without a connection (that is
//! `client.rs`).
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
//! - Fencing ([`Ddl`]'s statements, run by [`sluice_sqlkit::fence`]): `sluice_checkpoints`
//!   holds one row per (materialization, key range) with a fence counter. SQLite
//!   serializes writers (claims and stores begin IMMEDIATE), so either the older
//!   instance commits before the newer one claims (and the newer one recovers that
//!   commit), or it finds a stale fence and rolls back.

use rusqlite::types::{ToSqlOutput, Value as SqlValue, ValueRef};
use serde_json::Value;
use sluice_driver_sdk::{Result, flow};
use sluice_sqlkit::fence::FenceDialect;
use sluice_sqlkit::{self as kit, ColumnKind, Inferred};

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

    /// Every column holds every value: SQLite's typing is flexible (a declared type is
    /// an affinity), and a Store encodes each value by the spec's type, not the column's.
    fn holds(_was: Inferred, _now: Inferred) -> bool {
        true
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

    /// `CREATE TABLE IF NOT EXISTS`; unless delta-updated, with a primary key and
    /// `WITHOUT ROWID`: the rows are stored in the key's own B-tree, so a Load or an
    /// upsert searches one tree, not an index and then the table (and the keys are NOT
    /// NULL, as in PostgreSQL).
    pub fn create_sql(&self) -> String {
        let mut defs: Vec<String> = self.columns.iter().map(Table::column_def).collect();
        let mut options = "";
        if !self.delta_updates {
            defs.push(format!("PRIMARY KEY ({})", idents(self.keys())));
            options = " WITHOUT ROWID";
        }
        format!(
            "CREATE TABLE IF NOT EXISTS {} ({}){options}",
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

/// The statements Apply plans and fencing runs (see [`kit::apply`], [`kit::fence`]).
#[derive(Debug, Clone, Copy)]
pub struct Ddl;

impl kit::apply::Ddl for Ddl {
    type Kind = ColumnType;
    type Table = Table;

    const FENCE: FenceDialect = FenceDialect {
        quote: quote_ident,
        placeholder: FenceDialect::numbered,
        insert_ignore: ("INSERT", " ON CONFLICT DO NOTHING"),
        locking_read: "",
    };

    fn qualified(&self, name: &str) -> String {
        quote_ident(name)
    }

    fn literal(&self, text: &str) -> String {
        quote_literal(text)
    }

    fn create_checkpoints(&self) -> String {
        CREATE_CHECKPOINTS.to_owned()
    }

    fn create_table(&self, table: &Table) -> String {
        table.create_sql()
    }

    fn add_column(&self, table: &Table, column: &Column) -> String {
        table.add_column_sql(column)
    }
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

/// The tables of a materialization's bindings, each named once: what Apply
/// (`driver.rs`) and Open (`transactor.rs`) both start from.
pub(crate) fn spec_tables(spec: &flow::MaterializationSpec) -> Result<Vec<Table>> {
    let tables = kit::spec_tables(spec, None, |a, b| a == b)?;
    Ok(tables.into_iter().map(Table).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::{Connection, params};

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
