//! Column values as JSON, from what the server sends: the one encoder of snapshot rows
//! (read with prepared statements, the binary protocol) and of binlog row images
//! (decoded by `mysql_common`), so both give the same document for the same row.
//!
//! | MariaDB / MySQL | JSON |
//! |---|---|
//! | `TINYINT` … `BIGINT`, signed and `UNSIGNED` | number (exact, up to 2^64 - 1) |
//! | `FLOAT`, `DOUBLE` | number (the shortest text that reads back the same float) |
//! | `DECIMAL` | number when its digits fit a double exactly (15 significant), else its text |
//! | `YEAR` | number |
//! | `DATE` | `"2024-01-02"` |
//! | `DATETIME` | `"2024-01-02T03:04:05.123"` (fractions without trailing zeros) |
//! | `TIMESTAMP` | RFC 3339 in UTC: `"2024-01-02T03:04:05.123Z"` |
//! | `TIME` | `"-838:59:59.5"`: hours may pass 24 and be negative |
//! | zero dates (`0000-00-00`) | `null` |
//! | `CHAR`, `VARCHAR`, `TEXT` | string |
//! | `BINARY`, `VARBINARY`, `BLOB` | base64 string |
//! | `JSON` (MariaDB: `LONGTEXT` with `CHECK (json_valid(…))`) | the JSON value itself |
//! | `ENUM` | string (the member's name; `""` for MySQL's invalid-value 0) |
//! | `SET` | string: the members joined by `,`, as MySQL shows them |
//! | `BIT(1)` | `true` / `false` |
//! | `BIT(n)`, n > 1 | number |
//! | NULL | `null` |
//!
//! The binlog sends an integer without its signedness unless `binlog_row_metadata=FULL`,
//! so an `UNSIGNED` column's value is read back from its two's complement with the
//! column's width here ([`Kind::Int`]). It sends an `ENUM` as its index and a `SET` as
//! its bit mask, where the binary protocol sends their names: [`Origin`] says which.
//! Text columns in the binlog are their bytes in the column's character set: UTF-8
//! (utf8mb4, utf8mb3, ascii) is taken as it is, latin1 decoded as MariaDB's latin1
//! (Windows-1252); a column of another character set is refused at start, naming it.
//! The snapshot reads text converted to UTF-8 by the server.

use base64::Engine as _;
use mysql_async::Value;

/// What a column holds, from `information_schema.COLUMNS` ([`Kind::of`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    Int {
        unsigned: bool,
        bits: u32,
    },
    Float,
    Double,
    Decimal,
    Year,
    Date,
    DateTime,
    Timestamp,
    Time,
    /// `latin1`: the column's character set is latin1 (MariaDB's is Windows-1252):
    /// the binlog sends its bytes, not UTF-8.
    Text {
        latin1: bool,
    },
    /// `pad`: a `BINARY(n)`'s length; the binlog drops its trailing zero bytes.
    Binary {
        pad: Option<usize>,
    },
    Json,
    Enum(Vec<String>),
    Set(Vec<String>),
    Bit(u32),
}

/// Where a value was read: the binlog encodes `ENUM`, `SET` and `TIMESTAMP` unlike the
/// binary protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    Snapshot,
    Binlog,
}

impl Kind {
    /// The kind of a column of `data_type` (lower case) and `column_type` (its full
    /// text: `int(10) unsigned`, `enum('a','b')`, `bit(5)`); `json` when a MariaDB
    /// `CHECK (json_valid(col))` makes a `longtext` a JSON column. Err: the type is not
    /// supported, named.
    pub fn of(data_type: &str, column_type: &str, json: bool) -> Result<Kind, String> {
        let unsigned = column_type.contains("unsigned");
        Ok(match data_type {
            "tinyint" => Kind::Int { unsigned, bits: 8 },
            "smallint" => Kind::Int { unsigned, bits: 16 },
            "mediumint" => Kind::Int { unsigned, bits: 24 },
            "int" | "integer" => Kind::Int { unsigned, bits: 32 },
            "bigint" => Kind::Int { unsigned, bits: 64 },
            "float" => Kind::Float,
            "double" | "real" => Kind::Double,
            "decimal" | "numeric" => Kind::Decimal,
            "year" => Kind::Year,
            "date" => Kind::Date,
            "datetime" => Kind::DateTime,
            "timestamp" => Kind::Timestamp,
            // mysql_common reads a negative TIME(1) or TIME(2) with a fraction from the
            // binlog wrongly (an unsigned underflow in my_time_packed_from_binary).
            "time" if matches!(column_type, "time(1)" | "time(2)") => {
                return Err(format!(
                    "{column_type} is not supported yet (its negative values are misread \
                     from the binary log); use time, time(3) or time(6)"
                ));
            }
            "time" => Kind::Time,
            "json" => Kind::Json,
            "longtext" if json => Kind::Json,
            "char" | "varchar" | "tinytext" | "text" | "mediumtext" | "longtext" => {
                Kind::Text { latin1: false }
            }
            "binary" => Kind::Binary {
                pad: column_type
                    .trim_start_matches("binary(")
                    .trim_end_matches(')')
                    .parse()
                    .ok(),
            },
            "varbinary" | "tinyblob" | "blob" | "mediumblob" | "longblob" => {
                Kind::Binary { pad: None }
            }
            "enum" => Kind::Enum(members(column_type)),
            "set" => Kind::Set(members(column_type)),
            "bit" => Kind::Bit(
                column_type
                    .trim_start_matches("bit(")
                    .trim_end_matches(')')
                    .parse()
                    .unwrap_or(1),
            ),
            other => return Err(format!("type {other} ({column_type}) is not supported yet")),
        })
    }

    /// Whether keys of this column compare as Rust compares their numbers (else only
    /// the server can order them, `key.rs`).
    pub fn is_int(&self) -> bool {
        matches!(self, Kind::Int { .. })
    }
}

/// A captured column: its name, how its values map to JSON, its SQL type and collation.
#[derive(Debug, Clone)]
pub struct Column {
    pub name: String,
    pub kind: Kind,
    /// `COLUMN_TYPE`, lower case: `decimal(20,4) unsigned`, `varchar(10)`.
    pub sql_type: String,
    /// A text column's character set and collation.
    pub collation: Option<Collation>,
}

#[derive(Debug, Clone)]
pub struct Collation {
    pub charset: String,
    pub name: String,
}

/// The members of `enum('a','b''c')` / `set(…)`, unquoted.
fn members(column_type: &str) -> Vec<String> {
    let inner = column_type
        .split_once('(')
        .map(|(_, rest)| rest.strip_suffix(')').unwrap_or(rest))
        .unwrap_or("");
    let mut out = Vec::new();
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\'' {
            continue;
        }
        let mut member = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\'' if chars.peek() == Some(&'\'') => {
                    chars.next();
                    member.push('\'');
                }
                '\'' => break,
                '\\' => {
                    if let Some(next) = chars.next() {
                        member.push(next);
                    }
                }
                c => member.push(c),
            }
        }
        out.push(member);
    }
    out
}

/// Writes `value` of a column of `kind` as JSON.
pub fn write(kind: &Kind, value: &Value, origin: Origin, out: &mut Vec<u8>) {
    if matches!(value, Value::NULL) {
        return out.extend_from_slice(b"null");
    }
    match kind {
        Kind::Int { unsigned, bits } => match value {
            Value::Int(v) if *unsigned && *v < 0 => {
                let mask = if *bits >= 64 {
                    u64::MAX
                } else {
                    (1u64 << bits) - 1
                };
                write_display(&((*v as u64) & mask), out)
            }
            // A signed value read as unsigned (mysql_common's MEDIUMINT): sign-extended.
            Value::Int(v) if !*unsigned && *bits < 64 && *v >= 1 << (bits - 1) => {
                write_display(&(v - (1 << bits)), out)
            }
            Value::Int(v) => write_display(v, out),
            Value::UInt(v) => write_display(v, out),
            other => write_number_text(other, out),
        },
        Kind::Float => match value {
            Value::Float(f) => write_float(*f as f64, Some(*f), out),
            Value::Double(f) => write_float(*f, Some(*f as f32), out),
            other => match text(other).parse::<f32>() {
                Ok(f) => write_float(f as f64, Some(f), out),
                Err(_) => write_string(&text(other), out),
            },
        },
        Kind::Double => match value {
            Value::Double(f) => write_float(*f, None, out),
            Value::Float(f) => write_float(*f as f64, None, out),
            other => match text(other).parse::<f64>() {
                Ok(f) => write_float(f, None, out),
                Err(_) => write_string(&text(other), out),
            },
        },
        Kind::Decimal => write_decimal(&text(value), out),
        Kind::Year => match value {
            Value::Int(v) => write_display(v, out),
            Value::UInt(v) => write_display(v, out),
            other => write_number_text(other, out),
        },
        Kind::Date => match civil(value) {
            Some(c) if c.is_zero() => out.extend_from_slice(b"null"),
            Some(c) => write_string(&c.date(), out),
            None => write_string(&text(value), out),
        },
        Kind::DateTime => match civil(value) {
            Some(c) if c.is_zero() => out.extend_from_slice(b"null"),
            Some(c) => write_string(&c.date_time(), out),
            None => write_string(&text(value), out),
        },
        Kind::Timestamp => {
            let civil = match (origin, value) {
                (Origin::Binlog, Value::Bytes(b)) => epoch(&String::from_utf8_lossy(b)),
                (Origin::Binlog, Value::Int(secs)) => epoch(&secs.to_string()),
                _ => civil(value),
            };
            match civil {
                Some(c) if c.is_zero() => out.extend_from_slice(b"null"),
                Some(c) => write_string(&format!("{}Z", c.date_time()), out),
                None => write_string(&text(value), out),
            }
        }
        Kind::Time => match value {
            Value::Time(negative, days, h, m, s, us) => {
                let hours = *days as u64 * 24 + *h as u64;
                let sign = if *negative { "-" } else { "" };
                write_string(
                    &format!("{sign}{hours:02}:{m:02}:{s:02}{}", fraction(*us)),
                    out,
                )
            }
            other => write_string(&time_text(&text(other)), out),
        },
        Kind::Text { latin1: true } if origin == Origin::Binlog => match value {
            Value::Bytes(b) => write_string(&b.iter().map(|&b| cp1252(b)).collect::<String>(), out),
            other => write_string(&text(other), out),
        },
        Kind::Text { .. } => write_string(&text(value), out),
        Kind::Binary { pad } => {
            let mut raw = bytes(value);
            if let Some(pad) = pad {
                raw.resize(raw.len().max(*pad), 0);
            }
            write_string(&base64::engine::general_purpose::STANDARD.encode(raw), out)
        }
        Kind::Json => {
            let raw = bytes(value);
            match serde_json::from_slice::<serde_json::Value>(&raw) {
                Ok(json) => serde_json::to_writer(&mut *out, &json).expect("writes to a Vec"),
                Err(_) => write_string(&String::from_utf8_lossy(&raw), out),
            }
        }
        Kind::Enum(members) => match (origin, value) {
            (Origin::Binlog, Value::Int(i)) => {
                let name = usize::try_from(*i)
                    .ok()
                    .and_then(|i| i.checked_sub(1))
                    .and_then(|i| members.get(i))
                    .map_or("", String::as_str);
                write_string(name, out)
            }
            _ => write_string(&text(value), out),
        },
        Kind::Set(members) => match (origin, value) {
            (Origin::Binlog, Value::Bytes(mask)) => {
                let mut bits = 0u64;
                for (i, b) in mask.iter().enumerate().take(8) {
                    bits |= (*b as u64) << (8 * i);
                }
                let names: Vec<&str> = members
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| bits & (1 << i) != 0)
                    .map(|(_, m)| m.as_str())
                    .collect();
                write_string(&names.join(","), out)
            }
            _ => write_string(&text(value), out),
        },
        Kind::Bit(width) => {
            let n = match value {
                Value::Int(v) => *v as u64,
                Value::UInt(v) => *v,
                other => bytes(other)
                    .iter()
                    .fold(0u64, |n, b| (n << 8) | u64::from(*b)),
            };
            match width {
                1 => out.extend_from_slice(if n != 0 { b"true" } else { b"false" }),
                _ => write_display(&n, out),
            }
        }
    }
}

/// A byte of MariaDB's latin1 (Windows-1252) as a character; its five undefined bytes
/// as the C1 controls of the same value, as MariaDB converts them.
fn cp1252(b: u8) -> char {
    const HIGH: [char; 32] = [
        '€', '\u{81}', '‚', 'ƒ', '„', '…', '†', '‡', 'ˆ', '‰', 'Š', '‹', 'Œ', '\u{8d}', 'Ž',
        '\u{8f}', '\u{90}', '‘', '’', '“', '”', '•', '–', '—', '˜', '™', 'š', '›', 'œ', '\u{9d}',
        'ž', 'Ÿ',
    ];
    match b {
        0x80..=0x9f => HIGH[(b - 0x80) as usize],
        b => b as char,
    }
}

fn bytes(value: &Value) -> Vec<u8> {
    match value {
        Value::Bytes(b) => b.clone(),
        other => text(other).into_bytes(),
    }
}

/// A value's text form (`Value::as_sql` without quotes for bytes).
fn text(value: &Value) -> String {
    match value {
        Value::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
        Value::Int(v) => v.to_string(),
        Value::UInt(v) => v.to_string(),
        Value::Float(v) => v.to_string(),
        Value::Double(v) => v.to_string(),
        other => other.as_sql(true).trim_matches('\'').to_string(),
    }
}

fn write_display(v: &impl std::fmt::Display, out: &mut Vec<u8>) {
    out.extend_from_slice(v.to_string().as_bytes());
}

/// An integer sent as text: a number when it reads as one, else a string.
fn write_number_text(value: &Value, out: &mut Vec<u8>) {
    let text = text(value);
    match text.parse::<i128>() {
        Ok(n) => write_display(&n, out),
        Err(_) => write_string(&text, out),
    }
}

/// A float as the shortest text that reads back the same value; a `FLOAT` column's
/// value (`as_f32`) as the shortest text of the single-precision float, so that
/// `1.1` stays `1.1`.
fn write_float(f: f64, as_f32: Option<f32>, out: &mut Vec<u8>) {
    let json = match as_f32 {
        Some(f) => serde_json::to_vec(&f),
        None => serde_json::to_vec(&f),
    };
    out.extend_from_slice(&json.expect("a finite float serializes"));
}

pub(crate) fn write_string(s: &str, out: &mut Vec<u8>) {
    serde_json::to_writer(&mut *out, s).expect("writes to a Vec");
}

/// The digits of a decimal that a double holds exactly: at most 15 significant.
const DOUBLE_DIGITS: usize = 15;

/// A decimal as a JSON number when a double holds it exactly (trailing zeros of its
/// fraction dropped), else as its text, so no digit is ever lost.
fn write_decimal(text: &str, out: &mut Vec<u8>) {
    let unsigned = text.strip_prefix('-').unwrap_or(text);
    let plain = !unsigned.is_empty()
        && unsigned.bytes().all(|b| b.is_ascii_digit() || b == b'.')
        && unsigned.bytes().filter(|&b| b == b'.').count() <= 1;
    if !plain {
        return write_string(text, out);
    }
    let trimmed = match unsigned.contains('.') {
        true => unsigned.trim_end_matches('0').trim_end_matches('.'),
        false => unsigned,
    };
    let trimmed = trimmed.trim_start_matches('0');
    let significant = trimmed
        .bytes()
        .filter(u8::is_ascii_digit)
        .skip_while(|&b| b == b'0')
        .count();
    if significant > DOUBLE_DIGITS {
        return write_string(text, out);
    }
    let trimmed = match trimmed {
        "" => "0".to_string(),
        t if t.starts_with('.') => format!("0{t}"),
        t => t.to_string(),
    };
    if text.starts_with('-') && trimmed != "0" {
        out.push(b'-');
    }
    out.extend_from_slice(trimmed.as_bytes());
}

/// A date and time of day, as the server sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Civil {
    y: u16,
    mo: u8,
    d: u8,
    h: u8,
    mi: u8,
    s: u8,
    us: u32,
}

impl Civil {
    fn is_zero(&self) -> bool {
        self.y == 0 && self.mo == 0 && self.d == 0
    }

    fn date(&self) -> String {
        format!("{:04}-{:02}-{:02}", self.y, self.mo, self.d)
    }

    fn date_time(&self) -> String {
        format!(
            "{}T{:02}:{:02}:{:02}{}",
            self.date(),
            self.h,
            self.mi,
            self.s,
            fraction(self.us)
        )
    }
}

/// `.123` for 123000 µs; empty for 0.
fn fraction(us: u32) -> String {
    if us == 0 {
        return String::new();
    }
    let digits = format!("{us:06}");
    format!(".{}", digits.trim_end_matches('0'))
}

fn civil(value: &Value) -> Option<Civil> {
    match value {
        Value::Date(y, mo, d, h, mi, s, us) => Some(Civil {
            y: *y,
            mo: *mo,
            d: *d,
            h: *h,
            mi: *mi,
            s: *s,
            us: *us,
        }),
        Value::Bytes(b) => parse_civil(&String::from_utf8_lossy(b)),
        _ => None,
    }
}

/// `2024-01-02[T03:04:05[.123]]` as the value the server sends for it.
pub(crate) fn date_value(text: &str) -> Option<Value> {
    let c = parse_civil(text)?;
    Some(Value::Date(c.y, c.mo, c.d, c.h, c.mi, c.s, c.us))
}

/// `2024-01-02[ 03:04:05[.123]]`.
fn parse_civil(text: &str) -> Option<Civil> {
    let (date, time) = text.split_once([' ', 'T']).unwrap_or((text, "00:00:00"));
    let mut d = date.split('-').map(|p| p.parse::<u32>().ok());
    let (y, mo, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.split(':').map(|p| p.parse::<u32>().ok());
    let (h, mi, s) = (t.next()??, t.next()??, t.next()??);
    let us = format!("{frac:0<6}").get(..6)?.parse().ok()?;
    Some(Civil {
        y: y as u16,
        mo: mo as u8,
        d: day as u8,
        h: h as u8,
        mi: mi as u8,
        s: s as u8,
        us,
    })
}

/// `-838:59:59.500000` → `-838:59:59.5`.
fn time_text(text: &str) -> String {
    match text.split_once('.') {
        Some((hms, frac)) => {
            let frac = frac.trim_end_matches('0');
            match frac.is_empty() {
                true => hms.to_string(),
                false => format!("{hms}.{frac}"),
            }
        }
        None => text.to_string(),
    }
}

/// A binlog `TIMESTAMP` (`seconds[.micros]` since the epoch) in UTC; `0`: the zero
/// timestamp.
fn epoch(text: &str) -> Option<Civil> {
    let (secs, frac) = text.split_once('.').unwrap_or((text, ""));
    let secs: i64 = secs.parse().ok()?;
    let us: u32 = match frac {
        "" => 0,
        f => format!("{f:0<6}").get(..6)?.parse().ok()?,
    };
    if secs == 0 && us == 0 {
        return Some(Civil {
            y: 0,
            mo: 0,
            d: 0,
            h: 0,
            mi: 0,
            s: 0,
            us: 0,
        });
    }
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, mo, d) = civil_from_days(days);
    Some(Civil {
        y: y as u16,
        mo,
        d,
        h: (rem / 3600) as u8,
        mi: (rem % 3600 / 60) as u8,
        s: (rem % 60) as u8,
        us,
    })
}

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u8, u8) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u8;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u8;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(kind: &Kind, value: Value, origin: Origin) -> String {
        let mut out = Vec::new();
        write(kind, &value, origin, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn unsigned_integers_are_read_back_from_the_binlog_twos_complement() {
        let tiny = Kind::Int {
            unsigned: true,
            bits: 8,
        };
        assert_eq!(json(&tiny, Value::Int(-1), Origin::Binlog), "255");
        let medium = Kind::Int {
            unsigned: true,
            bits: 24,
        };
        assert_eq!(json(&medium, Value::Int(-1), Origin::Binlog), "16777215");
        let big = Kind::Int {
            unsigned: true,
            bits: 64,
        };
        assert_eq!(
            json(&big, Value::Int(-1), Origin::Binlog),
            "18446744073709551615"
        );
        assert_eq!(
            json(&big, Value::UInt(u64::MAX), Origin::Snapshot),
            "18446744073709551615"
        );
        let signed = Kind::Int {
            unsigned: false,
            bits: 8,
        };
        assert_eq!(json(&signed, Value::Int(-128), Origin::Binlog), "-128");
        let medium = Kind::Int {
            unsigned: false,
            bits: 24,
        };
        assert_eq!(
            json(&medium, Value::Int(8388608), Origin::Binlog),
            "-8388608"
        );
        assert_eq!(
            json(&medium, Value::Int(8388607), Origin::Binlog),
            "8388607"
        );
    }

    #[test]
    fn decimals_stay_exact() {
        for (text, expected) in [
            ("12.50", "12.5"),
            ("-0.000", "0"),
            ("0.10", "0.1"),
            ("00012", "12"),
            ("12345678901234567890.5", "\"12345678901234567890.5\""),
            ("-1.25", "-1.25"),
        ] {
            assert_eq!(
                json(&Kind::Decimal, Value::Bytes(text.into()), Origin::Binlog),
                expected
            );
        }
    }

    #[test]
    fn times_and_dates_are_iso_and_timestamps_utc() {
        let dt = Value::Date(2024, 1, 2, 3, 4, 5, 120_000);
        assert_eq!(
            json(&Kind::DateTime, dt.clone(), Origin::Binlog),
            "\"2024-01-02T03:04:05.12\""
        );
        assert_eq!(
            json(&Kind::Timestamp, dt, Origin::Snapshot),
            "\"2024-01-02T03:04:05.12Z\""
        );
        assert_eq!(
            json(
                &Kind::Timestamp,
                Value::Bytes(b"1704164645.120000".to_vec()),
                Origin::Binlog
            ),
            "\"2024-01-02T03:04:05.12Z\""
        );
        assert_eq!(
            json(
                &Kind::Timestamp,
                Value::Bytes(b"0".to_vec()),
                Origin::Binlog
            ),
            "null"
        );
        assert_eq!(
            json(
                &Kind::Date,
                Value::Date(0, 0, 0, 0, 0, 0, 0),
                Origin::Snapshot
            ),
            "null"
        );
        assert_eq!(
            json(
                &Kind::Time,
                Value::Time(true, 34, 22, 59, 59, 500_000),
                Origin::Binlog
            ),
            "\"-838:59:59.5\""
        );
    }

    #[test]
    fn enums_sets_and_bits() {
        let e = Kind::of("enum", "enum('a','b''c')", false).unwrap();
        assert_eq!(e, Kind::Enum(vec!["a".into(), "b'c".into()]));
        assert_eq!(json(&e, Value::Int(2), Origin::Binlog), "\"b'c\"");
        let s = Kind::of("set", "set('x','y','z')", false).unwrap();
        assert_eq!(json(&s, Value::Bytes(vec![5]), Origin::Binlog), "\"x,z\"");
        assert_eq!(
            json(&s, Value::Bytes(b"x,z".to_vec()), Origin::Snapshot),
            "\"x,z\""
        );
        let bit = Kind::of("bit", "bit(10)", false).unwrap();
        assert_eq!(json(&bit, Value::Bytes(vec![2, 1]), Origin::Binlog), "513");
        let flag = Kind::of("bit", "bit(1)", false).unwrap();
        assert_eq!(json(&flag, Value::Bytes(vec![1]), Origin::Snapshot), "true");
    }

    #[test]
    fn latin1_text_from_the_binlog_is_windows_1252() {
        let latin1 = Kind::Text { latin1: true };
        let raw = Value::Bytes(vec![b'h', 0xe9, 0x80, b'!']);
        assert_eq!(json(&latin1, raw, Origin::Binlog), "\"hé€!\"");
        let converted = Value::Bytes("hé€!".as_bytes().to_vec());
        assert_eq!(json(&latin1, converted, Origin::Snapshot), "\"hé€!\"");
    }

    #[test]
    fn floats_keep_their_shortest_text() {
        assert_eq!(json(&Kind::Float, Value::Float(1.1), Origin::Binlog), "1.1");
        assert_eq!(
            json(&Kind::Double, Value::Double(0.1), Origin::Binlog),
            "0.1"
        );
    }
}
