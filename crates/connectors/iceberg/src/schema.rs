//! A binding's Arrow schema as an Iceberg table schema, and what must change for an
//! existing table to take it.
//!
//! ```text
//!  binding:  key columns, value columns, document (JSON text), [_op]
//!  table:    key columns, value columns, document, _txn long (required), _op string (required)
//!            [, columns added later: always optional]
//! ```
//!
//! Evolution is additive: a binding column the table lacks is added as an optional
//! column. A column whose type differs, a required table column the binding dropped, or
//! a required table column the binding may leave null cannot be written: a
//! `SinkError::Schema` naming the field. A table without `_txn` and `_op` was not made by
//! this sink: `SinkError::Corrupt`.

use arrow_schema::{DataType, Schema as ArrowSchema};
use iceberg::spec::{NestedField, PrimitiveType, Schema, Type};
use serde::{Deserialize, Serialize};
use sluice_sink_sdk::SinkError;
use sluice_sink_sdk::arrow::OP_COLUMN;

/// The transaction (epoch) that wrote a row.
pub const TXN_COLUMN: &str = "_txn";

/// A column of the table, as the plan carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Column {
    pub name: String,
    /// `long`, `double`, `boolean` or `string`.
    pub r#type: String,
    pub required: bool,
}

/// What one table needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "action")]
pub enum TableChange {
    Create { table: String, columns: Vec<Column> },
    AddColumns { table: String, columns: Vec<Column> },
}

impl TableChange {
    pub fn table(&self) -> &str {
        match self {
            TableChange::Create { table, .. } | TableChange::AddColumns { table, .. } => table,
        }
    }

    /// One line per change, for `sluice apply --dry-run`.
    pub fn describe(&self, namespace: &str) -> Vec<String> {
        match self {
            TableChange::Create { table, columns } => vec![format!(
                "create Iceberg table {namespace}.{table} ({})",
                columns
                    .iter()
                    .map(|c| format!(
                        "{} {}{}",
                        c.name,
                        c.r#type,
                        if c.required { " not null" } else { "" }
                    ))
                    .collect::<Vec<_>>()
                    .join(", ")
            )],
            TableChange::AddColumns { table, columns } => columns
                .iter()
                .map(|c| {
                    format!(
                        "add optional column {} {} to {namespace}.{table}",
                        c.name, c.r#type
                    )
                })
                .collect(),
        }
    }
}

fn iceberg_type(name: &str) -> Option<PrimitiveType> {
    Some(match name {
        "long" => PrimitiveType::Long,
        "double" => PrimitiveType::Double,
        "boolean" => PrimitiveType::Boolean,
        "string" => PrimitiveType::String,
        _ => return None,
    })
}

fn type_name(t: &Type) -> String {
    match t {
        Type::Primitive(PrimitiveType::Long) => "long".into(),
        Type::Primitive(PrimitiveType::Double) => "double".into(),
        Type::Primitive(PrimitiveType::Boolean) => "boolean".into(),
        Type::Primitive(PrimitiveType::String) => "string".into(),
        other => other.to_string(),
    }
}

impl Column {
    pub fn iceberg_type(&self) -> Result<Type, SinkError> {
        iceberg_type(&self.r#type)
            .map(Type::Primitive)
            .ok_or_else(|| {
                SinkError::Corrupt(format!("a schema plan names type {:?}", self.r#type))
            })
    }
}

/// The table's columns for a binding: its own (less `_op`), then `_txn` and `_op`.
pub fn table_columns(binding: &ArrowSchema) -> Result<Vec<Column>, SinkError> {
    let mut columns = Vec::new();
    for field in binding.fields() {
        if field.name() == OP_COLUMN {
            continue;
        }
        if field.name() == TXN_COLUMN {
            return Err(SinkError::Schema(format!(
                "field {TXN_COLUMN:?} is reserved by the Iceberg sink (the transaction of each row)"
            )));
        }
        let t = match field.data_type() {
            DataType::Int64 => "long",
            DataType::Float64 => "double",
            DataType::Boolean => "boolean",
            DataType::Utf8 | DataType::LargeUtf8 => "string",
            other => {
                return Err(SinkError::Schema(format!(
                    "field {:?} has Arrow type {other}, which the Iceberg sink does not map",
                    field.name()
                )));
            }
        };
        columns.push(Column {
            name: field.name().clone(),
            r#type: t.into(),
            required: !field.is_nullable(),
        });
    }
    columns.push(Column {
        name: TXN_COLUMN.into(),
        r#type: "long".into(),
        required: true,
    });
    columns.push(Column {
        name: OP_COLUMN.into(),
        r#type: "string".into(),
        required: true,
    });
    Ok(columns)
}

/// The Iceberg schema of a new table.
pub fn create_schema(columns: &[Column]) -> Result<Schema, SinkError> {
    let mut fields = Vec::new();
    for (i, c) in columns.iter().enumerate() {
        let id = i as i32 + 1;
        let t = c.iceberg_type()?;
        fields.push(if c.required {
            NestedField::required(id, &c.name, t).into()
        } else {
            NestedField::optional(id, &c.name, t).into()
        });
    }
    Schema::builder()
        .with_fields(fields)
        .build()
        .map_err(|e| SinkError::Schema(format!("cannot build the table schema: {e}")))
}

/// The optional columns to add so that `table` takes `binding`'s columns; an error when
/// it cannot take them at all. `name` is the table's, for messages.
pub fn columns_to_add(
    name: &str,
    table: &Schema,
    wanted: &[Column],
) -> Result<Vec<Column>, SinkError> {
    for reserved in [TXN_COLUMN, OP_COLUMN] {
        if table.field_by_name(reserved).is_none() {
            return Err(SinkError::Corrupt(format!(
                "Iceberg table {name} has no {reserved:?} column: it was not created by this sink"
            )));
        }
    }
    let mut add = Vec::new();
    for c in wanted {
        match table.field_by_name(&c.name) {
            None => add.push(Column {
                required: false,
                ..c.clone()
            }),
            Some(f) => {
                let have = type_name(&f.field_type);
                if have != c.r#type {
                    return Err(SinkError::Schema(format!(
                        "field {:?} of Iceberg table {name} is {have}, but the binding's is {}: \
                         a type change needs a new table",
                        c.name, c.r#type
                    )));
                }
                if f.required && !c.required {
                    return Err(SinkError::Schema(format!(
                        "field {:?} of Iceberg table {name} is required, but the binding may \
                         leave it null (a deletion's row carries only its key; a table made \
                         by a release before that has required value columns): recreate the \
                         table, or make the column optional with another Iceberg tool",
                        c.name
                    )));
                }
            }
        }
    }
    for f in table.as_struct().fields() {
        if f.required && !wanted.iter().any(|c| c.name == f.name) {
            return Err(SinkError::Schema(format!(
                "required field {:?} of Iceberg table {name} is no longer in the binding",
                f.name
            )));
        }
    }
    Ok(add)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_schema::Field;

    fn binding(fields: Vec<Field>) -> ArrowSchema {
        ArrowSchema::new(fields)
    }

    #[test]
    fn a_binding_maps_to_its_columns_then_txn_and_op() {
        let b = binding(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("v", DataType::Float64, true),
            Field::new("flow_document", DataType::Utf8, false),
            Field::new(OP_COLUMN, DataType::Utf8, false),
        ]);
        let cols = table_columns(&b).unwrap();
        let names: Vec<_> = cols.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["id", "v", "flow_document", "_txn", "_op"]);
        assert!(cols[0].required && !cols[1].required);
        let schema = create_schema(&cols).unwrap();
        assert!(columns_to_add("t", &schema, &cols).unwrap().is_empty());
    }

    #[test]
    fn a_new_column_is_added_optional_and_a_type_change_is_refused() {
        let old = table_columns(&binding(vec![Field::new("id", DataType::Int64, false)])).unwrap();
        let table = create_schema(&old).unwrap();
        let wider = table_columns(&binding(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("n", DataType::Boolean, false),
        ]))
        .unwrap();
        let add = columns_to_add("t", &table, &wider).unwrap();
        assert_eq!(add.len(), 1);
        assert!(!add[0].required && add[0].name == "n");

        let changed =
            table_columns(&binding(vec![Field::new("id", DataType::Utf8, false)])).unwrap();
        let err = columns_to_add("t", &table, &changed).unwrap_err();
        assert!(
            matches!(&err, SinkError::Schema(m) if m.contains("\"id\"")),
            "{err}"
        );

        let dropped = table_columns(&binding(vec![Field::new("x", DataType::Utf8, true)])).unwrap();
        let err = columns_to_add("t", &table, &dropped).unwrap_err();
        assert!(
            matches!(&err, SinkError::Schema(m) if m.contains("\"id\"")),
            "{err}"
        );
    }
}
