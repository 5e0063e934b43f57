//! SQL text and value encoding, pure and without a connection.
//!
//! A binding becomes a [`Table`]: its columns are the selected fields in field-selection
//! order (keys, then values, then the document), which is also the order of the values
//! in a Store message (`packed_keys`, `packed_values`, `docs_json`). Every statement the
//! driver runs is generated here, so Apply's action description is exactly what runs.
//!
//! Column types come from the projection's inferred JSON types (`null` ignored):
//!
//! ```text
//!   integer → bigint          number, integer+number → double precision
//!   boolean → boolean         string → text      string with format date-time → timestamptz
//!   object, array, several types → jsonb          the whole document → json
//! ```
//!
//! The document column is `json`, not `jsonb`: it keeps the document's text exactly as
//! the runtime reduced it (property order and number spelling included), loads return
//! that text without a re-serialization, and storing it costs a validation rather than
//! a conversion. Fields users query are their own typed columns.
//!
//! Values travel as PostgreSQL's text forms: rows in `COPY ... FROM STDIN` text format
//! ([`CopyRow`]), keys of loads and deletions as `text[]` parameters cast to the
//! column's array type on the server ([`key_text`]). One conversion serves both, so a
//! key looked up compares equal to the key stored; the server parses numbers and
//! timestamps with its own input functions (a `date-time` string is checked there).
//!
//! Invariants:
//! - Every identifier is quoted with [`quote_ident`] (`"a""b"`), so table and field
//!   names such as `select`, `Mixed Case` or `a"b` are safe; every literal is quoted
//!   with [`quote_literal`].
//! - A value whose JSON type does not fit its column (a string in a `bigint` column) is
//!   an error naming the field, never a silent coercion.
//! - Delta-update tables have no primary key: every store appends a row.

use serde_json::Value;
use sluice_driver_sdk::flow;
use sluice_driver_sdk::{Error, Result};
use sluice_pg_client::{EndpointConfig, NAME_LIMIT};
use sluice_sqlkit::fence::FenceDialect;
use sluice_sqlkit::text::{TextColumn, TextRows};
use sluice_sqlkit::{self as kit, ColumnKind, Inferred, mismatch};
use std::io::Write;

/// The table of fences and runtime checkpoints, one row per (materialization, key range).
pub const CHECKPOINTS_TABLE: &str = "sluice_checkpoints";

/// How a column holds its field's JSON values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnType {
    Bigint,
    Double,
    Boolean,
    Text,
    /// A string of `format: date-time` (RFC 3339).
    Timestamptz,
    /// Objects, arrays and fields of several types.
    Jsonb,
    /// The whole document, text kept as is.
    Json,
}

impl ColumnKind for ColumnType {
    const STORE: &'static str = "PostgreSQL";
    const DOCUMENT: Self = ColumnType::Json;

    fn of_inferred(inferred: Inferred) -> Self {
        match inferred {
            Inferred::Integer => ColumnType::Bigint,
            Inferred::Number => ColumnType::Double,
            Inferred::Boolean => ColumnType::Boolean,
            Inferred::String => ColumnType::Text,
            Inferred::DateTime => ColumnType::Timestamptz,
            Inferred::Other => ColumnType::Jsonb,
        }
    }
}

impl ColumnType {
    pub fn sql(self) -> &'static str {
        match self {
            ColumnType::Bigint => "bigint",
            ColumnType::Double => "double precision",
            ColumnType::Boolean => "boolean",
            ColumnType::Text => "text",
            ColumnType::Timestamptz => "timestamptz",
            ColumnType::Jsonb => "jsonb",
            ColumnType::Json => "json",
        }
    }
}

pub type Column = kit::Column<ColumnType>;

/// One binding's table (see [`kit::Table`]) in `schema`, with the SQL that creates,
/// loads and changes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Table {
    pub schema: String,
    pub table: kit::Table<ColumnType>,
}

impl std::ops::Deref for Table {
    type Target = kit::Table<ColumnType>;

    fn deref(&self) -> &Self::Target {
        &self.table
    }
}

impl Table {
    /// The table `schema.name` for `binding`, with columns typed from its projections.
    pub fn new(
        schema: &str,
        name: &str,
        binding: &flow::materialization_spec::Binding,
        delta_updates: bool,
    ) -> Result<Table> {
        Ok(Table {
            schema: schema.to_owned(),
            table: kit::Table::new(name, binding, delta_updates)?,
        })
    }

    /// `"schema"."table"`.
    pub fn qualified(&self) -> String {
        qualify(&self.schema, &self.name)
    }

    /// `CREATE TABLE IF NOT EXISTS`, keys NOT NULL; unless delta-updated, the primary
    /// key and half of each page left free ([`UPDATED_FILLFACTOR`]).
    pub fn create_sql(&self) -> String {
        let mut defs: Vec<String> = self
            .columns
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let not_null = if i < self.key_count { " NOT NULL" } else { "" };
                format!("{} {}{not_null}", quote_ident(&c.field), c.ty.sql())
            })
            .collect();
        if !self.delta_updates {
            defs.push(format!("PRIMARY KEY ({})", idents(self.keys())));
        }
        let fill = if self.delta_updates {
            String::new()
        } else {
            format!(" WITH (fillfactor = {UPDATED_FILLFACTOR})")
        };
        format!(
            "CREATE TABLE IF NOT EXISTS {} ({}){fill}",
            self.qualified(),
            defs.join(", ")
        )
    }

    /// Names the source of `column` in the catalog.
    pub fn comment_sql(&self, column: &Column) -> String {
        let source = if column.ptr.is_empty() {
            format!("the whole document of {}", self.collection)
        } else {
            format!("{} of {}", column.ptr, self.collection)
        };
        format!(
            "COMMENT ON COLUMN {}.{} IS {}",
            self.qualified(),
            quote_ident(&column.field),
            quote_literal(&format!("Materialized by Sluice from {source}"))
        )
    }

    /// Adds a (nullable) column that a later version of the binding selects.
    pub fn add_column_sql(&self, column: &Column) -> String {
        format!(
            "ALTER TABLE {} ADD COLUMN {} {}",
            self.qualified(),
            quote_ident(&column.field),
            column.ty.sql()
        )
    }

    /// Copies rows of every column, in [`CopyRow`] format, into `target` (this table,
    /// or its staging table).
    pub fn copy_sql(&self, target: &str) -> String {
        format!("COPY {target} ({}) FROM STDIN", idents(&self.columns))
    }

    /// A session's staging table for this table's updates: the same columns, no
    /// constraints, emptied at every commit or rollback.
    pub fn create_stage_sql(&self, stage: &str) -> String {
        let defs: Vec<String> = self
            .columns
            .iter()
            .map(|c| format!("{} {}", quote_ident(&c.field), c.ty.sql()))
            .collect();
        format!(
            "CREATE TEMPORARY TABLE {} ({}) ON COMMIT DELETE ROWS",
            quote_ident(stage),
            defs.join(", ")
        )
    }

    /// Moves the staged rows into the table, replacing the non-key columns of rows
    /// whose key is present.
    pub fn merge_sql(&self, stage: &str) -> String {
        let updates: Vec<String> = self.columns[self.key_count..]
            .iter()
            .map(|c| format!("{0} = excluded.{0}", quote_ident(&c.field)))
            .collect();
        let action = if updates.is_empty() {
            "NOTHING".to_owned()
        } else {
            format!("UPDATE SET {}", updates.join(", "))
        };
        let columns = idents(&self.columns);
        format!(
            "INSERT INTO {} ({columns}) SELECT {columns} FROM {} ON CONFLICT ({}) DO {action}",
            self.qualified(),
            quote_ident(stage),
            idents(self.keys())
        )
    }

    /// `unnest($1::text[]::bigint[], ...) AS "k"("k0", ...)` and the join condition
    /// of its columns with the key columns of `"r"`: the keys bound as one `text[]`
    /// parameter per key column (see [`key_text`]).
    fn keys_relation(&self) -> (String, String) {
        let arrays: Vec<String> = self
            .keys()
            .iter()
            .enumerate()
            .map(|(i, c)| format!("${}::text[]::{}[]", i + 1, c.ty.sql()))
            .collect();
        let names: Vec<String> = (0..self.key_count).map(|i| format!("\"k{i}\"")).collect();
        let on: Vec<String> = self
            .keys()
            .iter()
            .zip(&names)
            .map(|(c, k)| format!("\"r\".{} = \"k\".{k}", quote_ident(&c.field)))
            .collect();
        (
            format!(
                "unnest({}) AS \"k\"({})",
                arrays.join(", "),
                names.join(", ")
            ),
            on.join(" AND "),
        )
    }

    /// Selects the document text of every bound key that is present.
    pub fn load_sql(&self) -> Option<String> {
        let document = self.document()?;
        let (keys, on) = self.keys_relation();
        Some(format!(
            "SELECT \"r\".{}::text FROM {} AS \"r\" JOIN {keys} ON {on}",
            quote_ident(&document.field),
            self.qualified()
        ))
    }

    /// Deletes the row of every bound key.
    pub fn delete_sql(&self) -> String {
        let (keys, on) = self.keys_relation();
        format!(
            "DELETE FROM {} AS \"r\" USING {keys} WHERE {on}",
            self.qualified()
        )
    }
}

/// `"schema"."name"`.
/// How full PostgreSQL fills the pages of a standard binding's table: half, so that a
/// transaction rewriting every row it loaded finds room for each new row version on its
/// own page, a heap-only (HOT) update that writes no index entry. A reduced view is
/// rewritten all the time; the table starts twice as large, which its updates' dead
/// rows would make it anyway. Measured by `sluice bench loads` (1M keys, 2 cores): the
/// reload of every row takes 16-22 s against 22-24 s filled whole.
pub const UPDATED_FILLFACTOR: u8 = 50;

pub fn qualify(schema: &str, name: &str) -> String {
    format!("{}.{}", quote_ident(schema), quote_ident(name))
}

pub use sluice_pg_client::quote_ident;

/// `'text'`, with embedded quotes doubled. (`standard_conforming_strings` is on by
/// default since PostgreSQL 9.1, so backslashes need no escaping.)
pub fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

fn idents(columns: &[Column]) -> String {
    let quoted: Vec<String> = columns.iter().map(|c| quote_ident(&c.field)).collect();
    quoted.join(", ")
}

/// DDL of the checkpoints table in `schema`.
pub fn create_checkpoints_sql(schema: &str) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (\"materialization\" text NOT NULL, \
         \"key_begin\" bigint NOT NULL, \"key_end\" bigint NOT NULL, \"fence\" bigint NOT NULL, \
         \"checkpoint\" bytea NOT NULL, PRIMARY KEY (\"materialization\", \"key_begin\", \"key_end\"))",
        qualify(schema, CHECKPOINTS_TABLE)
    )
}

/// The statements Apply plans in the endpoint's `schema` (see [`kit::apply`]): a
/// missing schema is created, and every new column gets a comment naming its source;
/// and the fencing statements over its checkpoints table ([`kit::fence`]).
#[derive(Debug, Clone, Copy)]
pub struct Ddl<'a> {
    pub schema: &'a str,
}

impl kit::apply::Ddl for Ddl<'_> {
    type Kind = ColumnType;
    type Table = Table;

    const FENCE: FenceDialect = FenceDialect {
        quote: quote_ident,
        placeholder: FenceDialect::dollar,
        insert_ignore: ("INSERT", " ON CONFLICT DO NOTHING"),
        locking_read: "",
    };

    fn qualified(&self, name: &str) -> String {
        qualify(self.schema, name)
    }

    /// A bytea in hex input form (`X'…'` would be a bit string here).
    fn bytes_literal(&self, hex: &str) -> String {
        format!("'\\x{hex}'::bytea")
    }

    fn literal(&self, text: &str) -> String {
        quote_literal(text)
    }

    fn create_schema(&self) -> Option<String> {
        Some(format!(
            "CREATE SCHEMA IF NOT EXISTS {}",
            quote_ident(self.schema)
        ))
    }

    /// Not `public`, which every database has whether or not Apply ran.
    fn drop_schema(&self) -> Option<String> {
        (self.schema != "public")
            .then(|| format!("DROP SCHEMA IF EXISTS {}", quote_ident(self.schema)))
    }

    fn create_checkpoints(&self) -> String {
        create_checkpoints_sql(self.schema)
    }

    fn create_table(&self, table: &Table) -> String {
        table.create_sql()
    }

    fn add_column(&self, table: &Table, column: &Column) -> String {
        table.add_column_sql(column)
    }

    fn comment(&self, table: &Table, column: &Column) -> Option<String> {
        Some(table.comment_sql(column))
    }
}

/// Takes the lock that serializes the claims of one materialization (its `$1`), until
/// the claim's transaction ends.
pub const CLAIM_LOCK: &str = "SELECT pg_advisory_xact_lock(hashtext($1))";

/// Writes the text form of `value` for `column` (unescaped), or returns `false` for
/// SQL NULL (JSON null).
fn write_text(out: &mut Vec<u8>, column: &Column, value: &Value) -> Result<bool> {
    match (column.ty, value) {
        (_, Value::Null) => return Ok(false),
        (ColumnType::Jsonb | ColumnType::Json, v) => {
            serde_json::to_writer(&mut *out, v).map_err(|err| {
                Error::store(format!("converting field {:?}", column.field), err, false)
            })?;
        }
        (ColumnType::Bigint, Value::Number(n)) if n.is_i64() || n.is_u64() => {
            // u64 above i64::MAX is refused by the server, naming the column.
            write!(out, "{n}").expect("writing to a Vec");
        }
        (ColumnType::Bigint, Value::Number(n))
            if n.as_f64()
                .is_some_and(|f| f.fract() == 0.0 && f.abs() < 9.2e18) =>
        {
            // An integral float (`3.0`) is an integer to JSON Schema.
            write!(out, "{}", n.as_f64().unwrap_or_default() as i64).expect("writing to a Vec");
        }
        (ColumnType::Double, Value::Number(n)) => write!(out, "{n}").expect("writing to a Vec"),
        (ColumnType::Boolean, Value::Bool(b)) => {
            out.extend_from_slice(if *b { b"true" } else { b"false" })
        }
        (ColumnType::Text | ColumnType::Timestamptz, Value::String(s)) => {
            out.extend_from_slice(s.as_bytes())
        }
        _ => {
            let why = format!("does not fit a {} column", column.ty.sql());
            return Err(mismatch(&column.field, value, &why));
        }
    }
    Ok(true)
}

/// The text form of one key component, as bound in the `text[]` parameters of
/// [`Table::load_sql`] and [`Table::delete_sql`]; `None` for JSON null.
pub fn key_text(column: &Column, value: &Value) -> Result<Option<String>> {
    let mut out = Vec::new();
    if !write_text(&mut out, column, value)? {
        return Ok(None);
    }
    // Only strings and JSON text were written, both from valid UTF-8.
    String::from_utf8(out)
        .map(Some)
        .map_err(|err| Error::store(format!("converting field {:?}", column.field), err, false))
}

/// Rows in the text format of `COPY ... FROM STDIN` (see [`sluice_sqlkit::text`]).
pub type CopyRow = TextRows<kit::Table<ColumnType>>;

impl TextColumn for ColumnType {
    const ESCAPE_NUL: bool = false;

    fn write_text(out: &mut Vec<u8>, column: &Column, value: &Value) -> Result<bool> {
        write_text(out, column, value)
    }
}

/// The tables of a materialization's bindings, each named once: what Apply
/// (`driver.rs`) and Open (`transactor.rs`) both start from.
pub(crate) fn spec_tables(
    endpoint: &EndpointConfig,
    spec: &flow::MaterializationSpec,
) -> Result<Vec<Table>> {
    let tables = kit::spec_tables(spec, Some(NAME_LIMIT), |a, b| a == b)?;
    let schema = endpoint.schema();
    Ok((tables.into_iter())
        .map(|table| Table {
            schema: schema.to_owned(),
            table,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn column(field: &str, ty: ColumnType) -> Column {
        Column {
            field: field.to_owned(),
            ptr: format!("/{field}"),
            ty,
            key: field == "k",
        }
    }

    #[test]
    fn each_inferred_shape_is_declared_as_its_column_type() {
        for (inferred, declared) in [
            (Inferred::Integer, "bigint"),
            (Inferred::Number, "double precision"),
            (Inferred::Boolean, "boolean"),
            (Inferred::String, "text"),
            (Inferred::DateTime, "timestamptz"),
            (Inferred::Other, "jsonb"),
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
        assert_eq!(qualify("Mixed Case", "select"), "\"Mixed Case\".\"select\"");
        assert_eq!(quote_literal("it's"), "'it''s'");
    }

    /// Table `"s"."t"` keyed by its first column, ending with the document unless
    /// delta-updated.
    fn table(columns: Vec<Column>, delta_updates: bool) -> Table {
        let table = kit::Table {
            name: "t".into(),
            collection: "c".into(),
            columns,
            key_count: 1,
            has_document: !delta_updates,
            delta_updates,
        };
        Table {
            schema: "s".into(),
            table,
        }
    }

    #[test]
    fn copy_rows_escape_special_bytes_and_write_nulls() {
        let table = table(
            vec![
                column("k", ColumnType::Text),
                column("n", ColumnType::Bigint),
                column("j", ColumnType::Jsonb),
                column("flow_document", ColumnType::Json),
            ],
            false,
        );
        let mut rows = CopyRow::default();
        let values = [json!("a\tb\\c\nd"), Value::Null, json!({"x": "q\"\\"})];
        rows.push(&table, &values, Some(br#"{"k":"\\"}"#)).unwrap();
        rows.push(&table, &[json!("e"), json!(3.0), json!([1])], Some(b"{}"))
            .unwrap();
        assert_eq!(rows.rows(), 2);
        assert_eq!(
            String::from_utf8(rows.take()).unwrap(),
            "a\\tb\\\\c\\nd\t\\N\t{\"x\":\"q\\\\\"\\\\\\\\\"}\t{\"k\":\"\\\\\\\\\"}\n\
             e\t3\t[1]\t{}\n"
        );
        assert!(rows.is_empty());
    }

    #[test]
    fn a_value_that_does_not_fit_its_column_names_the_field() {
        let table = table(
            vec![
                column("k", ColumnType::Text),
                column("n", ColumnType::Bigint),
            ],
            true,
        );
        let mut rows = CopyRow::default();
        let err = rows
            .push(&table, &[json!("a"), json!("seven")], None)
            .unwrap_err();
        assert!(err.to_string().contains("field \"n\""), "{err}");
        assert!(err.to_string().contains("bigint"), "{err}");
        assert!(rows.is_empty(), "a failed row leaves nothing behind");
        let err = rows
            .push(&table, &[json!("a"), json!(1.5)], None)
            .unwrap_err();
        assert!(err.to_string().contains("1.5"), "{err}");
    }

    #[test]
    fn key_text_is_the_columns_text_form() {
        let text = |ty, v: Value| key_text(&column("k", ty), &v).unwrap();
        assert_eq!(text(ColumnType::Bigint, json!(-7)), Some("-7".into()));
        assert_eq!(text(ColumnType::Double, json!(1.5)), Some("1.5".into()));
        assert_eq!(text(ColumnType::Boolean, json!(true)), Some("true".into()));
        assert_eq!(text(ColumnType::Text, json!("a\tb")), Some("a\tb".into()));
        assert_eq!(
            text(ColumnType::Jsonb, json!({"a": 1})),
            Some("{\"a\":1}".into())
        );
        assert_eq!(text(ColumnType::Text, Value::Null), None);
    }
}
