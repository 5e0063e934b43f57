//! A primary key as a bound the server compares: the snapshot's chunks and the
//! segments of a resumed snapshot are ranges of keys, and only the server knows how
//! its keys order (a collation puts `'a' < 'B' < 'c'`, where bytes put `'B'` first).
//!
//! ```text
//!  last row of a chunk ──key_of──▶ ["\"B\"", "7"] (the journal: JSON text per column)
//!        ──param──▶ [Bytes("B"), Int(7)] ──▶ WHERE k1 >= ? AND (k1, k2) > (?, ?)
//! ```
//!
//! So Rust never sorts a key: the next chunk's lower bound is the last row the server
//! returned, as the text the step journals (what a resumed snapshot starts from too),
//! read back into a typed parameter ([`param`]) that compares as the column does
//! ([`placeholder`]). The text is each column's JSON in the documents
//! ([`crate::types`]): exact for every key type (a binary key is its base64, a
//! `DECIMAL` its digits, a date its ISO text with every fraction digit), so a bound
//! read back is the value it came from. Only `JSON` keys (a `TEXT` prefix key holding
//! JSON, which its document re-serializes) are not bounds: such a table is read whole.

use crate::types::{self, Column, Kind};
use base64::Engine as _;
use mysql_async::Value;

/// Whether a key column of this kind can bound a chunk ([`param`] reads it back
/// exactly).
pub fn is_bound(kind: &Kind) -> bool {
    !matches!(kind, Kind::Json)
}

/// The SQL of a bound's parameter, so that it compares as `column` orders: in the
/// column's collation (a text; explicit, so it holds without the column beside it),
/// as a decimal of the column's precision, as bytes; an `ENUM` or `SET` by its number
/// (its order in `ORDER BY`, where its name would compare as text).
pub fn placeholder(column: &Column) -> String {
    match (&column.kind, &column.collation) {
        (Kind::Text { .. }, Some(collation)) => {
            format!(
                "CONVERT(? USING {}) COLLATE {}",
                collation.charset, collation.name
            )
        }
        // `decimal(20,4) unsigned` → `CAST(? AS decimal(20,4))`.
        (Kind::Decimal, _) => match column.sql_type.split_once(')') {
            Some((precision, _)) => format!("CAST(? AS {precision}))"),
            None => "CAST(? AS DECIMAL(65,30))".to_string(),
        },
        (Kind::Binary { .. }, _) => "CAST(? AS BINARY)".to_string(),
        _ => "?".to_string(),
    }
}

/// A key column's journaled text (its JSON) as the typed parameter of a bound; Err:
/// the text is not a value of `kind`, named.
pub fn param(kind: &Kind, text: &str) -> Result<Value, String> {
    let bad = || format!("{text} is not a key value of a {kind:?} column");
    let string = || serde_json::from_str::<String>(text).map_err(|_| bad());
    Ok(match kind {
        Kind::Int { .. } | Kind::Year => match text.parse::<i64>() {
            Ok(v) => Value::Int(v),
            Err(_) => Value::UInt(text.parse().map_err(|_| bad())?),
        },
        // A FLOAT's text is its single-precision float's shortest form.
        Kind::Float => Value::Double(f64::from(text.parse::<f32>().map_err(|_| bad())?)),
        Kind::Double => Value::Double(text.parse().map_err(|_| bad())?),
        // A number when a double held it exactly, else a string: its digits either way.
        Kind::Decimal => match text.starts_with('"') {
            true => Value::Bytes(string()?.into_bytes()),
            false => Value::Bytes(text.as_bytes().to_vec()),
        },
        // `null`: a zero date.
        Kind::Date | Kind::DateTime | Kind::Timestamp if text == "null" => {
            Value::Date(0, 0, 0, 0, 0, 0, 0)
        }
        Kind::Date | Kind::DateTime | Kind::Timestamp => {
            let text = string()?;
            types::date_value(text.trim_end_matches('Z')).ok_or_else(bad)?
        }
        Kind::Time => time(&string()?).ok_or_else(bad)?,
        Kind::Text { .. } => Value::Bytes(string()?.into_bytes()),
        Kind::Binary { .. } => Value::Bytes(
            base64::engine::general_purpose::STANDARD
                .decode(string()?)
                .map_err(|_| bad())?,
        ),
        Kind::Enum(members) => {
            let name = string()?;
            let index = match name.as_str() {
                "" => 0,
                name => 1 + members.iter().position(|m| m == name).ok_or_else(bad)?,
            };
            Value::UInt(index as u64)
        }
        Kind::Set(members) => {
            let mut mask = 0u64;
            for name in string()?.split(',').filter(|n| !n.is_empty()) {
                mask |= 1 << members.iter().position(|m| m == name).ok_or_else(bad)?;
            }
            Value::UInt(mask)
        }
        Kind::Bit(_) => match text {
            "true" => Value::UInt(1),
            "false" => Value::UInt(0),
            n => Value::UInt(n.parse().map_err(|_| bad())?),
        },
        Kind::Json => return Err(format!("{text}: a JSON column does not bound a chunk")),
    })
}

/// `-838:59:59.5` (hours past 24, maybe negative).
fn time(text: &str) -> Option<Value> {
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (hms, frac) = text.split_once('.').unwrap_or((text, ""));
    let mut parts = hms.split(':').map(|p| p.parse::<u32>().ok());
    let (hours, m, s) = (parts.next()??, parts.next()??, parts.next()??);
    let us = format!("{frac:0<6}").get(..6)?.parse().ok()?;
    Some(Value::Time(
        negative,
        hours / 24,
        (hours % 24) as u8,
        m as u8,
        s as u8,
        us,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Origin;

    fn text(kind: &Kind, value: &Value, origin: Origin) -> String {
        let mut out = Vec::new();
        types::write(kind, value, origin, &mut out);
        String::from_utf8(out).unwrap()
    }

    /// A key value as the snapshot reads it, journaled as its text, reads back as the
    /// same value (what the server is sent as the next chunk's bound); the text goes
    /// through the position's JSON unchanged.
    #[test]
    fn every_bound_reads_back_as_the_value_it_came_from() {
        let int = |unsigned, bits| Kind::Int { unsigned, bits };
        let enums = Kind::Enum(vec!["z".into(), "a".into()]);
        let sets = Kind::Set(vec!["x".into(), "y".into(), "z".into()]);
        let bytes = |b: &[u8]| Value::Bytes(b.to_vec());
        let date = |y, mo, d, h, mi, s, us| Value::Date(y, mo, d, h, mi, s, us);
        let same = |kind: Kind, value: Value| (kind, value.clone(), value);
        for (kind, read, sent) in [
            same(int(false, 64), Value::Int(i64::MIN)),
            same(int(true, 64), Value::UInt(u64::MAX)),
            same(Kind::Year, Value::Int(2024)),
            (
                Kind::Float,
                Value::Float(1.1),
                Value::Double(f64::from(1.1f32)),
            ),
            same(Kind::Double, Value::Double(0.1)),
            (Kind::Decimal, bytes(b"12.50"), bytes(b"12.5")),
            same(Kind::Decimal, bytes(b"-0.001")),
            same(Kind::Decimal, bytes(b"12345678901234567890.123456789")),
            same(Kind::Date, date(2024, 2, 29, 0, 0, 0, 0)),
            same(Kind::Date, date(0, 0, 0, 0, 0, 0, 0)),
            same(Kind::DateTime, date(2024, 1, 2, 3, 4, 5, 1)),
            same(Kind::Timestamp, date(2024, 1, 2, 3, 4, 5, 120_000)),
            same(Kind::Time, Value::Time(true, 34, 22, 59, 59, 500_000)),
            same(Kind::Text { latin1: false }, bytes("é \"q\"\\".as_bytes())),
            same(Kind::Binary { pad: None }, bytes(&[0, 0xff, b'"', 0x80])),
            same(Kind::Binary { pad: Some(3) }, bytes(&[1, 0, 0])),
            (enums.clone(), bytes(b"a"), Value::UInt(2)),
            (enums, bytes(b""), Value::UInt(0)),
            (sets, bytes(b"x,z"), Value::UInt(5)),
            (Kind::Bit(1), bytes(&[1]), Value::UInt(1)),
            (Kind::Bit(10), bytes(&[2, 1]), Value::UInt(513)),
        ] {
            let journaled = text(&kind, &read, Origin::Snapshot);
            let through_json: String =
                serde_json::from_str(&serde_json::to_string(&journaled).unwrap()).unwrap();
            assert_eq!(
                param(&kind, &through_json),
                Ok(sent),
                "{kind:?} {read:?} as {journaled}"
            );
        }
    }

    #[test]
    fn a_text_that_is_no_value_of_the_column_is_refused_naming_it() {
        let enums = Kind::Enum(vec!["a".into()]);
        for (kind, text) in [
            (
                Kind::Int {
                    unsigned: false,
                    bits: 32,
                },
                "\"1\"",
            ),
            (enums, "\"b\""),
            (Kind::Binary { pad: None }, "\"!!\""),
            (Kind::DateTime, "\"yesterday\""),
            (Kind::Json, "{}"),
        ] {
            let error = param(&kind, text).unwrap_err();
            assert!(error.contains(text), "{error}");
        }
    }
}
