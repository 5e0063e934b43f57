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
//!   integer → BIGINT      number, integer+number → DOUBLE      boolean → BOOLEAN
//!   string  → LONGTEXT    object, array, several types → JSON  the whole document → JSON
//!   a key of string, object, array or several types → VARCHAR(255), binary no-pad collation
//! ```
//!
//! Key columns cannot be LONGTEXT (InnoDB indexes at most 3072 bytes of a key): a string
//! key is `VARCHAR(255)`, the usual MySQL key width, which holds any e-mail address or
//! UUID and leaves room for three such columns in one primary key (255 × 4 bytes of
//! utf8mb4 each). A longer key value is refused with an error naming the field, never
//! truncated. Keys compare byte for byte, trailing spaces included (`utf8mb4_nopad_bin`
//! on MariaDB, `utf8mb4_0900_bin` on MySQL 8, see [`Flavor`]): `"Bob"`, `"bob"` and
//! `"bob "` are three keys, as they are three packed keys to the runtime.
//!
//! Values travel as text: rows in `LOAD DATA` format ([`InfileRows`]) and keys of loads
//! and deletions as SQL literals ([`KeyLists`]). One conversion ([`write_text`]) serves
//! both, so a key looked up compares equal to the key stored.
//!
//! Invariants:
//! - Every identifier is quoted with [`quote_ident`] (`` `a``b` ``), so table and field
//!   names such as `select`, `Mixed Case` or ``a`b`` are safe; every string literal is
//!   quoted with [`quote_literal`], which relies on the session's `sql_mode` without
//!   `NO_BACKSLASH_ESCAPES` (set by the client at connect).
//! - A value whose JSON type does not fit its column (a string in a `BIGINT` column) is
//!   an error naming the field, checked here: `LOAD DATA LOCAL` would only warn.
//! - Delta-update tables have no primary key: every store appends a row.

use crate::config::NAME_LIMIT;
use serde_json::Value;
use sluice_driver_sdk::{Error, Result, flow};
use sluice_sqlkit::fence::FenceDialect;
use sluice_sqlkit::text::{TextColumn, TextRows, escape_into};
use sluice_sqlkit::{self as kit, ColumnKind, Inferred, mismatch};
use std::io::Write;

/// The table of fences and runtime checkpoints, one row per (materialization, key range).
pub const CHECKPOINTS_TABLE: &str = "sluice_checkpoints";

/// Characters of a string key column (see the module docs).
pub const KEY_CHARS: usize = 255;

/// Bytes of SQL text per statement of keys (loads, deletions). Under every server's
/// default `max_allowed_packet` (4 MiB in MySQL 5.7, 16 MiB in MariaDB, 64 MiB in MySQL
/// 8), and enough for ~50k short keys, so a Load message costs one or a few queries.
pub const STATEMENT_BYTES: usize = 1 << 20;

/// Which server: they differ in the name of the binary no-pad collation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flavor {
    MariaDb,
    MySql,
}

impl Flavor {
    /// The flavor of a server reporting `version` (`SELECT VERSION()`).
    pub fn of_version(version: &str) -> Flavor {
        if version.contains("MariaDB") {
            Flavor::MariaDb
        } else {
            Flavor::MySql
        }
    }

    /// Compares utf8mb4 strings byte for byte, trailing spaces included.
    pub fn key_collation(self) -> &'static str {
        match self {
            Flavor::MariaDb => "utf8mb4_nopad_bin",
            Flavor::MySql => "utf8mb4_0900_bin",
        }
    }
}

/// How a column holds its field's JSON values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnType {
    Bigint,
    Double,
    Boolean,
    Text,
    /// Objects, arrays and fields of several types, and the whole document.
    Json,
}

impl ColumnKind for ColumnType {
    const STORE: &'static str = "MariaDB";
    const DOCUMENT: Self = ColumnType::Json;

    fn of_inferred(inferred: Inferred) -> Self {
        match inferred {
            Inferred::Integer => ColumnType::Bigint,
            Inferred::Number => ColumnType::Double,
            Inferred::Boolean => ColumnType::Boolean,
            Inferred::String | Inferred::DateTime => ColumnType::Text,
            Inferred::Other => ColumnType::Json,
        }
    }
}

pub type Column = kit::Column<ColumnType>;

/// Whether `column` holds text of at most [`KEY_CHARS`] characters.
fn is_key_text(column: &Column) -> bool {
    column.key && matches!(column.ty, ColumnType::Text | ColumnType::Json)
}

/// The declared SQL type of `column`.
pub fn sql_type(column: &Column, flavor: Flavor) -> String {
    if is_key_text(column) {
        return format!(
            "VARCHAR({KEY_CHARS}) CHARACTER SET utf8mb4 COLLATE {}",
            flavor.key_collation()
        );
    }
    match column.ty {
        ColumnType::Bigint => "BIGINT",
        ColumnType::Double => "DOUBLE",
        ColumnType::Boolean => "BOOLEAN",
        ColumnType::Text => "LONGTEXT",
        ColumnType::Json => "JSON",
    }
    .to_owned()
}

sluice_sqlkit::table_newtype!(
    /// One binding's table (see [`sql::Table`]), with the SQL that creates, loads and
    /// changes it.
    Table(ColumnType)
);

impl Table {
    fn column_def(&self, column: &Column, flavor: Flavor) -> String {
        let source = if column.ptr.is_empty() {
            format!("the whole document of {}", self.collection)
        } else {
            format!("{} of {}", column.ptr, self.collection)
        };
        let not_null = if column.key { " NOT NULL" } else { "" };
        format!(
            "{} {}{not_null} COMMENT {}",
            quote_ident(&column.field),
            sql_type(column, flavor),
            quote_literal(&format!("Materialized by Sluice from {source}"))
        )
    }

    /// `CREATE TABLE IF NOT EXISTS`, keys NOT NULL and the primary key unless
    /// delta-updated; every column's comment names its source.
    pub fn create_sql(&self, flavor: Flavor) -> String {
        let mut defs: Vec<String> = (self.columns.iter())
            .map(|c| self.column_def(c, flavor))
            .collect();
        if !self.delta_updates {
            defs.push(format!("PRIMARY KEY ({})", idents(self.keys())));
        }
        format!(
            "CREATE TABLE IF NOT EXISTS {} ({}) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
            quote_ident(&self.name),
            defs.join(", ")
        )
    }

    /// Adds a (nullable) column that a later version of the binding selects.
    pub fn add_column_sql(&self, column: &Column, flavor: Flavor) -> String {
        format!(
            "ALTER TABLE {} ADD COLUMN {}",
            quote_ident(&self.name),
            self.column_def(column, flavor)
        )
    }

    /// Loads [`InfileRows`] of every column into this table. `replace`: a row whose key
    /// is present replaces it (the upsert of keys the runtime loaded); otherwise it is
    /// a duplicate, which `LOCAL` turns into a warning the caller must fail on.
    pub fn load_data_sql(&self, replace: bool) -> String {
        format!(
            "LOAD DATA LOCAL INFILE 'sluice'{} INTO TABLE {} CHARACTER SET utf8mb4 \
             FIELDS TERMINATED BY '\\t' ESCAPED BY '\\\\' LINES TERMINATED BY '\\n' ({})",
            if replace { " REPLACE" } else { "" },
            quote_ident(&self.name),
            idents(&self.columns)
        )
    }

    /// `SELECT document FROM t WHERE `, followed by a [`KeyLists`] condition.
    pub fn load_prefix(&self) -> Option<String> {
        Some(format!(
            "SELECT {} FROM {} WHERE ",
            quote_ident(&self.document()?.field),
            quote_ident(&self.name)
        ))
    }

    /// `DELETE FROM t WHERE `, followed by a [`KeyLists`] condition.
    pub fn delete_prefix(&self) -> String {
        format!("DELETE FROM {} WHERE ", quote_ident(&self.name))
    }
}

/// `` `name` ``, with embedded backticks doubled.
pub fn quote_ident(name: &str) -> String {
    format!("`{}`", name.replace('`', "``"))
}

/// `'text'`, with quotes, backslashes and NUL escaped (the session's `sql_mode` has no
/// `NO_BACKSLASH_ESCAPES`).
pub fn quote_literal(text: &str) -> String {
    let mut out = Vec::with_capacity(text.len() + 2);
    push_literal(&mut out, text.as_bytes());
    String::from_utf8(out).expect("escaping keeps UTF-8 valid")
}

fn push_literal(out: &mut Vec<u8>, text: &[u8]) {
    out.push(b'\'');
    escape_into(out, text, |b| match b {
        b'\'' => Some(b"\\'"),
        b'\\' => Some(b"\\\\"),
        0 => Some(b"\\0"),
        _ => None,
    });
    out.push(b'\'');
}

fn idents(columns: &[Column]) -> String {
    let quoted: Vec<String> = columns.iter().map(|c| quote_ident(&c.field)).collect();
    quoted.join(", ")
}

/// DDL of the checkpoints table. The materialization name is compared byte for byte.
pub fn create_checkpoints_sql(flavor: Flavor) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (`materialization` VARCHAR(512) CHARACTER SET utf8mb4 \
         COLLATE {} NOT NULL, `key_begin` BIGINT NOT NULL, `key_end` BIGINT NOT NULL, \
         `fence` BIGINT NOT NULL, `checkpoint` LONGBLOB NOT NULL, \
         PRIMARY KEY (`materialization`, `key_begin`, `key_end`)) ENGINE=InnoDB",
        quote_ident(CHECKPOINTS_TABLE),
        flavor.key_collation()
    )
}

/// The statements Apply plans in the endpoint's database (see [`kit::apply`]): every
/// column's comment is part of its definition. Of the fencing statements
/// ([`kit::fence`]), the read of the covering checkpoint locks (`FOR UPDATE`): a plain
/// read would see the claim transaction's snapshot, taken before the commit the fence
/// waited for.
#[derive(Debug, Clone, Copy)]
pub struct Ddl {
    pub flavor: Flavor,
}

impl kit::apply::Ddl for Ddl {
    type Kind = ColumnType;
    type Table = Table;

    const FENCE: FenceDialect = FenceDialect {
        quote: quote_ident,
        placeholder: FenceDialect::question,
        insert_ignore: ("INSERT IGNORE", ""),
        locking_read: " FOR UPDATE",
    };

    fn qualified(&self, name: &str) -> String {
        quote_ident(name)
    }

    fn literal(&self, text: &str) -> String {
        quote_literal(text)
    }

    fn create_checkpoints(&self) -> String {
        create_checkpoints_sql(self.flavor)
    }

    fn create_table(&self, table: &Table) -> String {
        table.create_sql(self.flavor)
    }

    fn add_column(&self, table: &Table, column: &Column) -> String {
        table.add_column_sql(column, self.flavor)
    }
}

/// Takes the lock that serializes the claims of one materialization (its `?`); `1`
/// once held, waiting at most 60 s.
pub const CLAIM_LOCK: &str = "SELECT GET_LOCK(CONCAT('sluice_claim_', MD5(?)), 60)";

/// Releases [`CLAIM_LOCK`].
pub const CLAIM_UNLOCK: &str = "SELECT RELEASE_LOCK(CONCAT('sluice_claim_', MD5(?)))";

/// Writes the text form of `value` for `column` (unescaped), or returns `false` for
/// SQL NULL (JSON null).
pub fn write_text(out: &mut Vec<u8>, column: &Column, value: &Value) -> Result<bool> {
    let start = out.len();
    match (column.ty, value) {
        (_, Value::Null) => return Ok(false),
        (ColumnType::Json, v) => serde_json::to_writer(&mut *out, v).map_err(|err| {
            Error::store(format!("converting field {:?}", column.field), err, false)
        })?,
        (ColumnType::Bigint, Value::Number(n)) if n.is_i64() => {
            write!(out, "{n}").expect("writing to a Vec")
        }
        (ColumnType::Bigint, Value::Number(n))
            if n.as_f64()
                .is_some_and(|f| f.fract() == 0.0 && f.abs() < 9.2e18) =>
        {
            // An integral float (`3.0`) is an integer to JSON Schema.
            write!(out, "{}", n.as_f64().unwrap_or_default() as i64).expect("writing to a Vec");
        }
        (ColumnType::Double, Value::Number(n)) => {
            write!(out, "{n}").expect("writing to a Vec");
            // `1.5e0` is a DOUBLE literal, `1.5` a DECIMAL one: keys compare as doubles.
            if !out[start..].contains(&b'e') {
                out.extend_from_slice(b"e0");
            }
        }
        (ColumnType::Boolean, Value::Bool(b)) => out.push(if *b { b'1' } else { b'0' }),
        (ColumnType::Text, Value::String(s)) => out.extend_from_slice(s.as_bytes()),
        (ty, _) => {
            let name = sql_type(
                &Column {
                    key: false,
                    ..column.clone()
                },
                Flavor::MariaDb,
            );
            let why = match ty {
                ColumnType::Bigint => "does not fit a BIGINT column (a 64-bit signed integer)",
                _ => "does not fit the column's type",
            };
            return Err(mismatch(&column.field, value, &format!("{why} ({name})")));
        }
    }
    if is_key_text(column) {
        let text = std::str::from_utf8(&out[start..]).unwrap_or_default();
        if text.chars().count() > KEY_CHARS {
            return Err(mismatch(
                &column.field,
                value,
                &format!("is longer than the {KEY_CHARS} characters of a key column"),
            ));
        }
    }
    Ok(true)
}

/// Rows in the text format of `LOAD DATA`'s defaults, NUL escaped as `\0` (see
/// [`sluice_sqlkit::text`]).
pub type InfileRows = TextRows<kit::Table<ColumnType>>;

impl TextColumn for ColumnType {
    const ESCAPE_NUL: bool = true;

    fn write_text(out: &mut Vec<u8>, column: &Column, value: &Value) -> Result<bool> {
        write_text(out, column, value)
    }
}

/// Statements of the form `<prefix> key IN (...)` (one key column) or
/// `<prefix> (k1, k2) IN ((...), ...)` (several), each at most about
/// [`STATEMENT_BYTES`] long, together covering every pushed key once per push.
pub struct KeyLists<'t> {
    table: &'t Table,
    prefix: String,
    statements: Vec<String>,
    current: Vec<u8>,
    scratch: Vec<u8>,
}

impl<'t> KeyLists<'t> {
    pub fn new(table: &'t Table, prefix: String) -> Self {
        KeyLists {
            table,
            prefix,
            statements: Vec::new(),
            current: Vec::new(),
            scratch: Vec::new(),
        }
    }

    /// Adds one key (its components, in key-column order).
    pub fn push(&mut self, key: &[Value]) -> Result<()> {
        let keys = self.table.keys();
        if self.current.is_empty() {
            self.current.extend_from_slice(self.prefix.as_bytes());
            if let [key] = keys {
                self.current
                    .extend_from_slice(quote_ident(&key.field).as_bytes());
                self.current.extend_from_slice(b" IN (");
            } else {
                write!(self.current, "({}) IN (", idents(keys)).expect("writing to a Vec");
            }
        } else {
            self.current.push(b',');
        }
        if keys.len() > 1 {
            self.current.push(b'(');
        }
        for (i, (column, value)) in keys.iter().zip(key).enumerate() {
            if i > 0 {
                self.current.push(b',');
            }
            self.scratch.clear();
            if !write_text(&mut self.scratch, column, value)? {
                return Err(mismatch(
                    &column.field,
                    value,
                    "cannot be a key (keys are NOT NULL)",
                ));
            }
            match column.ty {
                ColumnType::Text | ColumnType::Json => {
                    push_literal(&mut self.current, &self.scratch)
                }
                _ => self.current.extend_from_slice(&self.scratch),
            }
        }
        if keys.len() > 1 {
            self.current.push(b')');
        }
        if self.current.len() >= STATEMENT_BYTES {
            self.cut();
        }
        Ok(())
    }

    fn cut(&mut self) {
        if !self.current.is_empty() {
            self.current.push(b')');
            let text = String::from_utf8(std::mem::take(&mut self.current))
                .expect("keys and identifiers are UTF-8");
            self.statements.push(text);
        }
    }

    /// Every statement; empty if no key was pushed.
    pub fn finish(mut self) -> Vec<String> {
        self.cut();
        self.statements
    }
}

/// The tables of a materialization's bindings, each named once: what Apply
/// (`driver.rs`) and Open (`transactor.rs`) both start from.
pub(crate) fn spec_tables(spec: &flow::MaterializationSpec) -> Result<Vec<Table>> {
    // Table names compare case-insensitively on some servers (lower_case_table_names).
    let same_name = |a: &str, b: &str| a.to_lowercase() == b.to_lowercase();
    let tables = kit::spec_tables(spec, Some(NAME_LIMIT), same_name)?;
    Ok(tables.into_iter().map(Table).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn column(field: &str, ty: ColumnType, key: bool) -> Column {
        Column {
            field: field.to_owned(),
            ptr: format!("/{field}"),
            ty,
            key,
        }
    }

    fn table(columns: Vec<Column>, has_document: bool) -> Table {
        Table(kit::Table {
            name: "t".into(),
            collection: "c".into(),
            key_count: columns.iter().filter(|c| c.key).count(),
            columns,
            has_document,
            delta_updates: false,
        })
    }

    #[test]
    fn each_inferred_shape_is_declared_as_its_column_type() {
        for (inferred, declared) in [
            (Inferred::Integer, "BIGINT"),
            (Inferred::Number, "DOUBLE"),
            (Inferred::Boolean, "BOOLEAN"),
            (Inferred::String, "LONGTEXT"),
            (Inferred::DateTime, "LONGTEXT"),
            (Inferred::Other, "JSON"),
        ] {
            assert_eq!(
                sql_type(
                    &column("v", ColumnType::of_inferred(inferred), false),
                    Flavor::MariaDb
                ),
                declared,
                "{inferred:?}"
            );
        }
    }

    #[test]
    fn string_keys_are_bounded_binary_varchars() {
        let key = column("k", ColumnType::Text, true);
        assert_eq!(
            sql_type(&key, Flavor::MariaDb),
            "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_nopad_bin"
        );
        assert_eq!(
            sql_type(&key, Flavor::MySql),
            "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_0900_bin"
        );
        assert_eq!(
            sql_type(&column("v", ColumnType::Text, false), Flavor::MariaDb),
            "LONGTEXT"
        );
        assert_eq!(
            Flavor::of_version("10.11.19-MariaDB-0+deb12u1"),
            Flavor::MariaDb
        );
        assert_eq!(Flavor::of_version("8.0.36"), Flavor::MySql);
    }

    #[test]
    fn identifiers_and_literals_are_quoted() {
        assert_eq!(quote_ident("a`b"), "`a``b`");
        assert_eq!(quote_ident("Mixed Case"), "`Mixed Case`");
        assert_eq!(quote_literal("it's \\ \0"), "'it\\'s \\\\ \\0'");
    }

    #[test]
    fn infile_rows_escape_special_bytes_and_write_nulls() {
        let t = table(
            vec![
                column("k", ColumnType::Text, true),
                column("n", ColumnType::Bigint, false),
                column("j", ColumnType::Json, false),
                column("b", ColumnType::Boolean, false),
                column("flow_document", ColumnType::Json, false),
            ],
            true,
        );
        let mut rows = InfileRows::default();
        let values = [
            json!("a\tb\\c\nd\0"),
            Value::Null,
            json!({"x": "q\\"}),
            json!(true),
        ];
        rows.push(&t, &values, Some(br#"{"k":"\\"}"#)).unwrap();
        rows.push(
            &t,
            &[json!("e"), json!(3.0), json!([1]), json!(false)],
            Some(b"{}"),
        )
        .unwrap();
        assert_eq!(rows.rows(), 2);
        assert_eq!(
            String::from_utf8(rows.take()).unwrap(),
            "a\\tb\\\\c\\nd\\0\t\\N\t{\"x\":\"q\\\\\\\\\"}\t1\t{\"k\":\"\\\\\\\\\"}\n\
             e\t3\t[1]\t0\t{}\n"
        );
        assert!(rows.is_empty());
    }

    #[test]
    fn a_value_that_does_not_fit_its_column_names_the_field_and_leaves_no_row() {
        let t = table(
            vec![
                column("k", ColumnType::Text, true),
                column("n", ColumnType::Bigint, false),
            ],
            false,
        );
        let mut rows = InfileRows::default();
        for bad in [json!("seven"), json!(1.5), json!(u64::MAX)] {
            let err = rows.push(&t, &[json!("a"), bad], None).unwrap_err();
            assert!(err.to_string().contains("field \"n\""), "{err}");
            assert!(err.to_string().contains("BIGINT"), "{err}");
        }
        let long = json!("x".repeat(KEY_CHARS + 1));
        let err = rows.push(&t, &[long, json!(1)], None).unwrap_err();
        assert!(err.to_string().contains("255 characters"), "{err}");
        assert!(rows.is_empty(), "failed rows leave nothing behind");
    }

    #[test]
    fn key_lists_quote_each_key_and_cut_long_lists() {
        let one = table(vec![column("k", ColumnType::Text, true)], false);
        let mut lists = KeyLists::new(&one, "DELETE FROM `t` WHERE ".into());
        lists.push(&[json!("a'b")]).unwrap();
        lists.push(&[json!("c")]).unwrap();
        assert_eq!(
            lists.finish(),
            ["DELETE FROM `t` WHERE `k` IN ('a\\'b','c')"]
        );

        let two = table(
            vec![
                column("a", ColumnType::Text, true),
                column("b", ColumnType::Double, true),
            ],
            false,
        );
        let mut lists = KeyLists::new(&two, "SELECT 1 FROM `t` WHERE ".into());
        lists.push(&[json!("x"), json!(1.5)]).unwrap();
        lists.push(&[json!("y"), json!(2)]).unwrap();
        assert_eq!(
            lists.finish(),
            ["SELECT 1 FROM `t` WHERE (`a`, `b`) IN (('x',1.5e0),('y',2e0))"]
        );

        let mut lists = KeyLists::new(&one, String::new());
        let key = "k".repeat(200);
        let n = 2 * STATEMENT_BYTES / 200;
        for _ in 0..n {
            lists.push(&[json!(key)]).unwrap();
        }
        let statements = lists.finish();
        assert!(statements.len() >= 2, "{} statements", statements.len());
        let total: usize = statements.iter().map(|s| s.matches(&key).count()).sum();
        assert_eq!(total, n);
        assert!(statements.iter().all(|s| s.len() < STATEMENT_BYTES + 1024));
    }
}
