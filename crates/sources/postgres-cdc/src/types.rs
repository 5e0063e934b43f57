//! Column values as JSON, from their PostgreSQL text form and type OID: the one decoder
//! of snapshot rows (read with the simple query protocol, in text) and of streamed
//! tuples (pgoutput sends text), so both give the same document for the same row.
//!
//! | PostgreSQL | JSON |
//! |---|---|
//! | `smallint`, `integer`, `bigint`, `oid` | number |
//! | `real`, `double precision` | number; `NaN`, `Infinity`, `-Infinity` as strings |
//! | `numeric` | number when its digits fit a double exactly (15 significant), else its text |
//! | `boolean` | `true` / `false` |
//! | `text`, `varchar`, `char`, `name`, `uuid`, enums, `interval`, others | string (the text form) |
//! | `date`, `time`, `timetz` | string (ISO) |
//! | `timestamp` | `2024-01-02T03:04:05.123456` |
//! | `timestamptz` | RFC 3339 in UTC: `2024-01-02T03:04:05.123456Z` |
//! | `json`, `jsonb` | the JSON value itself |
//! | `bytea` | base64 string |
//! | arrays (any element type, any dimensions) | JSON arrays of the element's JSON |
//! | NULL | `null` |
//!
//! The text forms are those of the session settings in [`crate::wire::SESSION`].

use base64::Engine as _;
use std::collections::HashMap;

/// Type OIDs of the built-in types decoded specially.
mod oid {
    pub const BOOL: u32 = 16;
    pub const BYTEA: u32 = 17;
    pub const INT8: u32 = 20;
    pub const INT2: u32 = 21;
    pub const INT4: u32 = 23;
    pub const OID: u32 = 26;
    pub const JSON: u32 = 114;
    pub const FLOAT4: u32 = 700;
    pub const FLOAT8: u32 = 701;
    pub const TIMESTAMP: u32 = 1114;
    pub const TIMESTAMPTZ: u32 = 1184;
    pub const NUMERIC: u32 = 1700;
    pub const JSONB: u32 = 3802;
}

/// What the catalog says of every type: the element type of each array type. Loaded
/// from `pg_type` ([`Types::from_rows`]); a type created later is a miss the caller
/// reloads on ([`Types::knows`]).
#[derive(Debug, Clone, Default)]
pub struct Types {
    /// Array type OID → element type OID.
    arrays: HashMap<u32, u32>,
    known: std::collections::HashSet<u32>,
}

impl Types {
    /// From `(oid, typelem)` rows of `pg_type` (`typelem` 0 for a non-array; only
    /// `typcategory = 'A'` rows count as arrays).
    pub fn from_rows(rows: impl IntoIterator<Item = (u32, bool, u32)>) -> Types {
        let mut types = Types::default();
        for (oid, is_array, elem) in rows {
            types.known.insert(oid);
            if is_array && elem != 0 {
                types.arrays.insert(oid, elem);
            }
        }
        types
    }

    pub fn knows(&self, oid: u32) -> bool {
        self.known.contains(&oid)
    }

    /// Appends the JSON of `text`, a value of type `oid` (None: NULL), to `out`.
    pub fn write(&self, oid: u32, text: Option<&str>, out: &mut Vec<u8>) {
        let Some(text) = text else {
            out.extend_from_slice(b"null");
            return;
        };
        match oid {
            oid::BOOL => out.extend_from_slice(if text == "t" { b"true" } else { b"false" }),
            oid::INT2 | oid::INT4 | oid::INT8 | oid::OID => out.extend_from_slice(text.as_bytes()),
            oid::FLOAT4 | oid::FLOAT8 => match text {
                "NaN" | "Infinity" | "-Infinity" => write_string(text, out),
                _ => out.extend_from_slice(text.as_bytes()),
            },
            oid::NUMERIC => write_numeric(text, out),
            oid::JSON | oid::JSONB => out.extend_from_slice(text.as_bytes()),
            oid::BYTEA => write_bytea(text, out),
            oid::TIMESTAMP => write_string(&iso_timestamp(text), out),
            oid::TIMESTAMPTZ => {
                let iso = iso_timestamp(text);
                match iso.strip_suffix("+00") {
                    Some(utc) => write_string(&format!("{utc}Z"), out),
                    None => write_string(&iso, out),
                }
            }
            _ => match self.arrays.get(&oid) {
                Some(&elem) => self.write_array(elem, text, out),
                None => write_string(text, out),
            },
        }
    }

    /// An array literal (`{1,2,NULL}`, `{{"a b",c},{d,e}}`, `[0:1]={1,2}`) as nested
    /// JSON arrays of its elements' JSON.
    fn write_array(&self, elem: u32, text: &str, out: &mut Vec<u8>) {
        // Explicit bounds (`[0:1]={…}`) do not change the elements.
        let body = match text.find("={") {
            Some(at) if text.starts_with('[') => &text[at + 1..],
            _ => text,
        };
        // `box` is the only built-in type whose delimiter is not a comma.
        let delim = if elem == 603 { b';' } else { b',' };
        let bytes = body.as_bytes();
        let mut i = 0;
        self.write_array_level(elem, delim, bytes, &mut i, out);
    }

    fn write_array_level(&self, elem: u32, delim: u8, s: &[u8], i: &mut usize, out: &mut Vec<u8>) {
        // s[*i] == b'{'
        *i += 1;
        out.push(b'[');
        let mut first = true;
        while *i < s.len() {
            match s[*i] {
                b'}' => {
                    *i += 1;
                    break;
                }
                c if c == delim => {
                    *i += 1;
                    continue;
                }
                _ => {}
            }
            if !first {
                out.push(b',');
            }
            first = false;
            match s[*i] {
                b'{' => self.write_array_level(elem, delim, s, i, out),
                b'"' => {
                    *i += 1;
                    let mut value = Vec::new();
                    while *i < s.len() && s[*i] != b'"' {
                        if s[*i] == b'\\' {
                            *i += 1;
                        }
                        if *i < s.len() {
                            value.push(s[*i]);
                        }
                        *i += 1;
                    }
                    *i += 1; // the closing quote
                    self.write(elem, Some(&String::from_utf8_lossy(&value)), out);
                }
                _ => {
                    let start = *i;
                    while *i < s.len() && s[*i] != delim && s[*i] != b'}' {
                        *i += 1;
                    }
                    let raw = String::from_utf8_lossy(&s[start..*i]);
                    let raw = raw.trim();
                    let value = (!raw.eq_ignore_ascii_case("NULL")).then_some(raw);
                    self.write(elem, value, out);
                }
            }
        }
        out.push(b']');
    }
}

/// `2024-01-02 03:04:05.1` → `2024-01-02T03:04:05.1` (infinity and BC dates unchanged).
fn iso_timestamp(text: &str) -> String {
    if text.len() > 10 && text.as_bytes()[10] == b' ' && !text.ends_with(" BC") {
        format!("{}T{}", &text[..10], &text[11..])
    } else {
        text.to_string()
    }
}

/// The digits of a numeric that a double holds exactly: at most 15 significant.
const DOUBLE_DIGITS: usize = 15;

/// A numeric as a JSON number when a double holds it exactly, else as its text.
fn write_numeric(text: &str, out: &mut Vec<u8>) {
    let unsigned = text.strip_prefix('-').unwrap_or(text);
    let plain = !unsigned.is_empty()
        && unsigned.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && unsigned.bytes().filter(|&b| b == b'.').count() <= 1;
    if !plain {
        return write_string(text, out); // NaN, Infinity
    }
    let trimmed = match unsigned.contains('.') {
        true => unsigned.trim_end_matches('0').trim_end_matches('.'),
        false => unsigned,
    };
    let significant = trimmed
        .bytes()
        .filter(u8::is_ascii_digit)
        .skip_while(|&b| b == b'0')
        .count();
    if significant > DOUBLE_DIGITS {
        return write_string(text, out);
    }
    let trimmed = if trimmed.is_empty() { "0" } else { trimmed };
    if text.starts_with('-') && trimmed != "0" {
        out.push(b'-');
    }
    out.extend_from_slice(trimmed.as_bytes());
}

/// `\x0aff` → base64 of its bytes.
fn write_bytea(text: &str, out: &mut Vec<u8>) {
    let hex = text.strip_prefix("\\x").unwrap_or(text).as_bytes();
    let bytes: Vec<u8> = hex
        .chunks(2)
        .map(|pair| {
            let digit = |c: u8| (c as char).to_digit(16).unwrap_or(0) as u8;
            (digit(pair[0]) << 4) | pair.get(1).map_or(0, |&c| digit(c))
        })
        .collect();
    write_string(
        &base64::engine::general_purpose::STANDARD.encode(bytes),
        out,
    );
}

fn write_string(text: &str, out: &mut Vec<u8>) {
    serde_json::to_writer(out, text).expect("a string serializes");
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn json_of(types: &Types, oid: u32, text: Option<&str>) -> Value {
        let mut out = Vec::new();
        types.write(oid, text, &mut out);
        serde_json::from_slice(&out)
            .unwrap_or_else(|e| panic!("{}: {e}", String::from_utf8_lossy(&out)))
    }

    #[test]
    fn numerics_are_numbers_only_when_a_double_holds_them() {
        let t = Types::default();
        assert_eq!(json_of(&t, oid::NUMERIC, Some("123.4500")), json!(123.45));
        assert_eq!(json_of(&t, oid::NUMERIC, Some("-0.50")), json!(-0.5));
        assert_eq!(json_of(&t, oid::NUMERIC, Some("0.000")), json!(0));
        assert_eq!(json_of(&t, oid::NUMERIC, Some("42")), json!(42));
        assert_eq!(
            json_of(&t, oid::NUMERIC, Some("12345678901234567890.5")),
            json!("12345678901234567890.5")
        );
        assert_eq!(json_of(&t, oid::NUMERIC, Some("NaN")), json!("NaN"));
    }

    #[test]
    fn arrays_nest_and_decode_their_elements() {
        let t = Types::from_rows([(1007, true, 23), (1009, true, 25), (23, false, 0)]);
        assert_eq!(json_of(&t, 1007, Some("{1,2,NULL}")), json!([1, 2, null]));
        assert_eq!(
            json_of(&t, 1007, Some("{{1,2},{3,4}}")),
            json!([[1, 2], [3, 4]])
        );
        assert_eq!(json_of(&t, 1007, Some("[0:1]={5,6}")), json!([5, 6]));
        assert_eq!(json_of(&t, 1007, Some("{}")), json!([]));
        assert_eq!(
            json_of(&t, 1009, Some(r#"{"a b","say \"hi\"",NULL,"NULL",c}"#)),
            json!(["a b", "say \"hi\"", null, "NULL", "c"])
        );
    }

    #[test]
    fn times_are_iso_and_utc_is_z() {
        let t = Types::default();
        assert_eq!(
            json_of(&t, oid::TIMESTAMPTZ, Some("2024-01-02 03:04:05.5+00")),
            json!("2024-01-02T03:04:05.5Z")
        );
        assert_eq!(
            json_of(&t, oid::TIMESTAMP, Some("2024-01-02 03:04:05")),
            json!("2024-01-02T03:04:05")
        );
        assert_eq!(
            json_of(&t, oid::TIMESTAMP, Some("infinity")),
            json!("infinity")
        );
        assert_eq!(json_of(&t, oid::BYTEA, Some("\\x00ff")), json!("AP8="));
    }
}
