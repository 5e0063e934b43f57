//! The arithmetic of `sum`: JSON numbers, and numbers written as strings, which Flow adds
//! with arbitrary precision (a string too long for any float keeps every digit).
//!
//! ```text
//!  integer + integer ──▶ integer  exact; past the i64/u64 range: overflow
//!  integer | float + float ──▶ float  IEEE; not finite: overflow
//!  string + anything ──▶ string   exact decimal; wider than MAX_DIGITS: overflow
//! ```
//!
//! A numeric string is `[+-]digits[.digits][(e|E)[+-]digits]`, either side of the point
//! may be empty but not both: what Flow's decimal parser reads, less its digit separators
//! (`1_000`) and space. A string that is not one makes `sum` fail as a non-number does.
//!
//! A string total keeps the scale of its operands, as Flow's decimals do: it is written
//! plainly (no exponent) with as many fractional digits as the operand that has most
//! (`"1.50" + "2.25"` is `"3.75"`, `"1.10" + 2` is `"3.10"`, `"1.50" + "-1.5"` is
//! `"0.00"`; an integer has none, and an exponent that leaves none, as `"1e3"`, writes
//! the integer: `"1000"`). A float joins a decimal sum as Flow converts it: rounded to 16
//! significant digits, all of them kept (`86753.09` is `86753.09000000000`, `0.2` is
//! `0.2000000000000000`).
//!
//! Invariant: decimal addition is exact, and the scale of a total is the largest of its
//! operands', so sums of strings and integers are associative, digits and scale alike;
//! the two bounded classes are associative wherever no intermediate total overflows (IEEE
//! floats: where they are exact); a float's conversion depends on the float, so a float
//! summed before or after joining a decimal may leave a different scale (as in Flow).

use crate::compact::{Doc, Str};
use serde_json::{Number, Value};
use std::cmp::Ordering;

/// The most digits a string total may have, point aside (from its highest digit to its
/// lowest, zeros between included): far past any real quantity, and a bound on the work
/// one addition does, as an exponent (`"1e999999999"`) could otherwise ask for a billion.
pub(crate) const MAX_DIGITS: usize = 4096;

/// One operand of `sum`.
#[derive(Debug)]
pub(crate) enum Addend {
    Integer(i128),
    Float(f64),
    Decimal(Decimal),
}

/// What a `sum` produces.
#[derive(Debug, PartialEq)]
pub(crate) enum Total {
    Number(Number),
    /// A decimal written as a string.
    Text(String),
}

/// Why two addends have no total.
#[derive(Debug, PartialEq)]
pub(crate) enum Overflow {
    /// Past the i64/u64 range, or not a finite float.
    Bounded,
    /// A decimal wider than [`MAX_DIGITS`].
    Digits,
}

impl Overflow {
    pub(crate) fn reason(&self) -> String {
        match self {
            Overflow::Bounded => "sum overflows".to_string(),
            Overflow::Digits => format!("sum overflows (the total has over {MAX_DIGITS} digits)"),
        }
    }
}

impl Addend {
    pub(crate) fn of_number(n: &Number) -> Addend {
        match n
            .as_u64()
            .map(i128::from)
            .or_else(|| n.as_i64().map(i128::from))
        {
            Some(i) => Addend::Integer(i),
            None => Addend::Float(n.as_f64().unwrap_or_default()),
        }
    }

    /// A number, or a string that spells one (see the module docs).
    pub(crate) fn of_value(value: &Value) -> Option<Addend> {
        match value {
            Value::Number(n) => Some(Addend::of_number(n)),
            Value::String(s) => Decimal::parse(s).map(Addend::Decimal),
            _ => None,
        }
    }

    pub(crate) fn of_doc(doc: &Doc) -> Option<Addend> {
        match doc {
            Doc::PosInt(n) => Some(Addend::Integer((*n).into())),
            Doc::NegInt(n) => Some(Addend::Integer((*n).into())),
            Doc::Float(f) => Some(Addend::Float(*f)),
            Doc::String(s) => Decimal::parse(s.as_str()).map(Addend::Decimal),
            _ => None,
        }
    }

    fn into_decimal(self) -> Decimal {
        match self {
            Addend::Decimal(d) => d,
            // Both spellings are well formed, so they parse.
            Addend::Integer(i) => Decimal::parse(&i.to_string()).unwrap_or_default(),
            // Flow's conversion: 16 significant digits (finite: from JSON), all kept.
            Addend::Float(f) => Decimal::parse(&format!("{f:.15e}")).unwrap_or_default(),
        }
    }
}

/// `l + r` by the rules of the module docs.
pub(crate) fn add(l: Addend, r: Addend) -> Result<Total, Overflow> {
    let float = |f: f64| {
        Number::from_f64(f)
            .map(Total::Number)
            .ok_or(Overflow::Bounded)
    };
    match (l, r) {
        (Addend::Integer(l), Addend::Integer(r)) => {
            let total = l + r;
            let number = match u64::try_from(total) {
                Ok(u) => Number::from(u),
                Err(_) => Number::from(i64::try_from(total).map_err(|_| Overflow::Bounded)?),
            };
            Ok(Total::Number(number))
        }
        (Addend::Integer(i), Addend::Float(f)) | (Addend::Float(f), Addend::Integer(i)) => {
            float(i as f64 + f)
        }
        (Addend::Float(l), Addend::Float(r)) => float(l + r),
        (l, r) => {
            let total = l.into_decimal().add(&r.into_decimal())?;
            Ok(Total::Text(total.to_string()))
        }
    }
}

impl Total {
    pub(crate) fn into_value(self) -> Value {
        match self {
            Total::Number(n) => Value::Number(n),
            Total::Text(s) => Value::String(s),
        }
    }

    pub(crate) fn into_doc(self) -> Doc {
        match self {
            Total::Number(n) => Doc::from_number(&n),
            Total::Text(s) => Doc::String(Str::from_string(s)),
        }
    }
}

/// An exact decimal: `(-1)^negative × digits × 10^exponent`, `digits` most significant
/// first, with neither leading nor trailing zeros (zero: no digits, exponent 0, not
/// negative), so each value has one form; and the scale it is written with.
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Decimal {
    negative: bool,
    digits: Vec<u8>,
    exponent: i64,
    /// How many fractional digits the spelling had (`"1.50"`: 2, `"1e3"`: -3): at least
    /// `-exponent`. Written as `max(scale, 0)` fractional digits.
    scale: i64,
}

impl Decimal {
    /// Reads a numeric string (the module docs' grammar); `None` if it is not one.
    fn parse(s: &str) -> Option<Decimal> {
        let (negative, rest) = match s.as_bytes().first()? {
            b'-' => (true, &s[1..]),
            b'+' => (false, &s[1..]),
            _ => (false, s),
        };
        let (mantissa, exponent) = match rest.find(['e', 'E']) {
            Some(at) => (&rest[..at], parse_exponent(&rest[at + 1..])?),
            None => (rest, 0),
        };
        let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        let all_digits = |part: &str| part.bytes().all(|b| b.is_ascii_digit());
        if whole.len() + fraction.len() == 0 || !all_digits(whole) || !all_digits(fraction) {
            return None;
        }
        let digits = whole.bytes().chain(fraction.bytes()).map(|b| b - b'0');
        let exponent = exponent - i64::try_from(fraction.len()).ok()?;
        Some(Decimal::normalized(negative, digits.collect(), exponent).with_scale(-exponent))
    }

    fn with_scale(mut self, scale: i64) -> Decimal {
        self.scale = scale;
        self
    }

    /// The fractional digits written: the scale, or more if the digits need them.
    fn fraction(&self) -> i64 {
        self.scale.max(-self.exponent).max(0)
    }

    fn normalized(negative: bool, mut digits: Vec<u8>, mut exponent: i64) -> Decimal {
        let trailing = digits.iter().rev().take_while(|&&d| d == 0).count();
        digits.truncate(digits.len() - trailing);
        exponent += trailing as i64;
        let leading = digits.iter().take_while(|&&d| d == 0).count();
        digits.drain(..leading);
        if digits.is_empty() {
            return Decimal::default();
        }
        Decimal {
            negative,
            digits,
            exponent,
            scale: 0,
        }
    }

    /// One past the position of the highest digit (`10^top` exceeds the magnitude).
    fn top(&self) -> i64 {
        self.exponent + self.digits.len() as i64
    }

    /// `self + other`, exact; `Overflow::Digits` when the total (or the alignment of the two)
    /// spans more than [`MAX_DIGITS`] positions.
    fn add(&self, other: &Decimal) -> Result<Decimal, Overflow> {
        let scale = self.scale.max(other.scale);
        if self.digits.is_empty() || other.digits.is_empty() {
            let total = if self.digits.is_empty() { other } else { self };
            return fits(total.clone().with_scale(scale));
        }
        let low = self.exponent.min(other.exponent);
        let high = self.top().max(other.top()) + 1; // room for a carry
        if high - low > MAX_DIGITS as i64 + 1 {
            return Err(Overflow::Digits);
        }
        let width = (high - low) as usize;
        // Both magnitudes on one grid of `width` positions, least significant first.
        let spread = |d: &Decimal| {
            let mut grid = vec![0u8; width];
            let shift = (d.exponent - low) as usize;
            for (i, digit) in d.digits.iter().rev().enumerate() {
                grid[shift + i] = *digit;
            }
            grid
        };
        let (a, b) = (spread(self), spread(other));
        let (negative, grid) = if self.negative == other.negative {
            (self.negative, add_grids(&a, &b))
        } else {
            match compare_grids(&a, &b) {
                Ordering::Equal => return fits(Decimal::default().with_scale(scale)),
                Ordering::Greater => (self.negative, subtract_grids(&a, &b)),
                Ordering::Less => (other.negative, subtract_grids(&b, &a)),
            }
        };
        let digits = grid.into_iter().rev().collect();
        fits(Decimal::normalized(negative, digits, low).with_scale(scale))
    }
}

/// Keeps a total only if it fits [`MAX_DIGITS`], counting the zeros its plain form
/// writes between the point and its digits, and after them to its scale.
fn fits(d: Decimal) -> Result<Decimal, Overflow> {
    let width = d.top().max(0) + d.fraction();
    if width > MAX_DIGITS as i64 {
        return Err(Overflow::Digits);
    }
    Ok(d)
}

/// Exponents are held within ±2^40: past that any non-zero total is wider than
/// [`MAX_DIGITS`] whatever the digits, so a clamped exponent overflows as the exact one
/// would, and position arithmetic stays far inside `i64`.
const EXPONENT_LIMIT: i64 = 1 << 40;

/// An exponent's digits, signed, clamped to [`EXPONENT_LIMIT`].
fn parse_exponent(s: &str) -> Option<i64> {
    let (negative, digits) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let magnitude = digits
        .parse::<i64>()
        .map_or(EXPONENT_LIMIT, |e| e.min(EXPONENT_LIMIT));
    Some(if negative { -magnitude } else { magnitude })
}

/// Least significant first, equal lengths; the last position takes the carry.
fn add_grids(a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut carry = 0;
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            let s = x + y + carry;
            carry = s / 10;
            s % 10
        })
        .collect()
}

/// `a - b` for `a > b`, least significant first.
fn subtract_grids(a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut borrow = 0;
    a.iter()
        .zip(b)
        .map(|(&x, &y)| {
            let (d, next) = if x >= y + borrow {
                (x - y - borrow, 0)
            } else {
                (x + 10 - y - borrow, 1)
            };
            borrow = next;
            d
        })
        .collect()
}

fn compare_grids(a: &[u8], b: &[u8]) -> Ordering {
    a.iter().rev().cmp(b.iter().rev())
}

impl std::fmt::Display for Decimal {
    /// Plain notation with [`Decimal::fraction`] fractional digits: `-12.50`, `1000`,
    /// `0.005`, `0.00`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let zeros = |f: &mut std::fmt::Formatter<'_>, n: i64| -> std::fmt::Result {
            (0..n).try_for_each(|_| f.write_str("0"))
        };
        let write = |f: &mut std::fmt::Formatter<'_>, digits: &[u8]| -> std::fmt::Result {
            digits
                .iter()
                .try_for_each(|d| write!(f, "{}", char::from(b'0' + d)))
        };
        let fraction = self.fraction();
        if self.negative && !self.digits.is_empty() {
            f.write_str("-")?;
        }
        // Digits left of the point: those at positions 0 and up.
        let whole = self.top().clamp(0, self.digits.len() as i64) as usize;
        match whole {
            0 => f.write_str("0")?,
            _ => {
                write(f, &self.digits[..whole])?;
                zeros(f, self.exponent.max(0))?;
            }
        }
        if fraction == 0 {
            return Ok(());
        }
        f.write_str(".")?;
        // Zeros between the point and the first fractional digit, then those digits, then
        // zeros to the scale.
        let gap = (-self.top()).max(0).min(fraction);
        zeros(f, gap)?;
        let part = &self.digits[whole..];
        write(f, part)?;
        zeros(f, fraction - gap - part.len() as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Addend {
        Addend::Decimal(Decimal::parse(s).unwrap_or_else(|| panic!("{s:?} parses")))
    }

    /// The numeric-string grammar: what parses, and how it is written back.
    #[test]
    fn numeric_strings_parse_and_write_plainly() {
        for (input, written) in [
            ("0", Some("0")),
            ("-0", Some("0")),
            ("+7", Some("7")),
            ("007.50", Some("7.50")),
            ("0.000", Some("0.000")),
            ("-1.10", Some("-1.10")),
            ("1.50e1", Some("15.0")),
            ("1.", Some("1")),
            (".5", Some("0.5")),
            ("-.05", Some("-0.05")),
            ("1e3", Some("1000")),
            ("1.5E-3", Some("0.0015")),
            ("12e+1", Some("120")),
            (
                "123456789012345678901234567890",
                Some("123456789012345678901234567890"),
            ),
            ("", None),
            ("-", None),
            (".", None),
            ("1_000", None),
            (" 1", None),
            ("1 ", None),
            ("1e", None),
            ("e3", None),
            ("1.2.3", None),
            ("NaN", None),
            ("Infinity", None),
            ("0x10", None),
            ("0e99999999999999999999", Some("0")),
        ] {
            let got = Decimal::parse(input).map(|d| d.to_string());
            assert_eq!(got.as_deref(), written, "{input:?}");
        }
    }

    /// Flow's result classes: integers stay integers, a float makes a float, a string
    /// makes a string; each class overflows where its representation ends.
    #[test]
    fn result_classes_and_overflow_follow_the_operands() {
        let int = |i: i128| Addend::Integer(i);
        let n = |v: Value| Ok(Total::Number(v.as_number().cloned().unwrap()));
        let s = |t: &str| Ok(Total::Text(t.to_string()));
        let cases: Vec<(Addend, Addend, Result<Total, Overflow>)> = vec![
            (int(1), int(2), n(3.into())),
            (int(-5), int(3), n((-2).into())),
            (int(u64::MAX.into()), int(-1), n((u64::MAX - 1).into())),
            (int(i64::MIN.into()), int(1), n((i64::MIN + 1).into())),
            (int(u64::MAX.into()), int(1), Err(Overflow::Bounded)),
            (int(i64::MIN.into()), int(-1), Err(Overflow::Bounded)),
            (int(1), Addend::Float(0.5), n(serde_json::json!(1.5))),
            (
                Addend::Float(f64::MAX),
                Addend::Float(f64::MAX),
                Err(Overflow::Bounded),
            ),
            (text("1"), int(2), s("3")),
            (int(u64::MAX.into()), text("1"), s("18446744073709551616")),
            (text("0.1"), Addend::Float(0.2), s("0.3000000000000000")),
            (
                Addend::Float(86753.09),
                text("19000000000000000001"),
                s("19000000000000086754.09000000000"),
            ),
            (text("1.50"), text("2.25"), s("3.75")),
            (text("1.10"), int(2), s("3.10")),
            (text("1.50"), text("-1.5"), s("0.00")),
            (text("-10"), text("0.001"), s("-9.999")),
            (text("99.99"), text("0.01"), s("100.00")),
            (text("1e3"), text("0.5"), s("1000.5")),
            (
                text("1e4095"),
                text("0"),
                Ok(Total::Text(format!("1{}", "0".repeat(4095)))),
            ),
            (text("1e4096"), text("0"), Err(Overflow::Digits)),
            (text("1e4000"), text("1e-200"), Err(Overflow::Digits)),
            (text("1e999999999999"), text("1"), Err(Overflow::Digits)),
            (
                text("1e99999999999999999999"),
                text("-1e-99999999999999999999"),
                Err(Overflow::Digits),
            ),
        ];
        for (l, r, want) in cases {
            let what = format!("{l:?} + {r:?}");
            assert_eq!(add(l, r), want, "{what}");
        }
    }
}
