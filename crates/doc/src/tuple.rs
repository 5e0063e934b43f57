//! FoundationDB tuple packing of JSON key values.
//!
//! A packed key is the plain concatenation of its packed components (no outer nesting
//! byte), so comparing packed bytes compares keys component by component. Each JSON value
//! packs as one tuple element:
//!
//! ```text
//!   null           00
//!   array, object  01 <compact JSON text, properties sorted> 00     ("bytes")
//!   string         02 <UTF-8, each 00 written as 00 ff> 00
//!   integer < 0    0c..13 <one's complement of |v|, big-endian, minimal length>
//!   0              14
//!   integer > 0    15..1c <big-endian, minimal length>
//!   float          21 <IEEE bits big-endian; all bits flipped if negative, else the sign bit>
//!   false, true    26, 27
//! ```
//!
//! Invariants and reasoning:
//! - Order: within one type the byte order is the value order (integers by length code,
//!   then magnitude; doubles by the flipped bits, with `-0.0` just below `0.0`); across
//!   types it is the type-code order. JSON `3` (`15 03`) and `3.0` (`21 c0 08 ..`) are
//!   different keys on purpose: that is what Flow does, and hashes must agree with it.
//! - Arrays and objects pack as bytes of their compact JSON, never as nested tuples, with
//!   object properties ascending: `serde_json::Map` is a `BTreeMap` in this build (no
//!   `preserve_order` feature; a unit test fails if that ever changes). Compact JSON
//!   escapes every control character, so the text never holds a `00` byte to escape.
//! - JSON integers fit `i64` or `u64`, so packing uses codes `0c..=1c` only. Unpacking
//!   also reads nested tuples (`05`, as JSON arrays), and refuses the wider integer
//!   codes `0b`/`1d` and every type JSON cannot hold, naming the byte offset.
//! - [`KeyExtractor::pack`] is on the hot path: it only appends to the caller's buffer
//!   (array/object components serialize straight into it), and leaves the buffer as it
//!   was when it fails.

use crate::compact::Doc;
use crate::ptr::Pointer;
use serde_json::{Number, Value};
use std::borrow::Cow;

const NULL: u8 = 0x00;
const BYTES: u8 = 0x01;
const STRING: u8 = 0x02;
const NESTED: u8 = 0x05;
const INT_ZERO: u8 = 0x14;
const DOUBLE: u8 = 0x21;
const FALSE: u8 = 0x26;
const TRUE: u8 = 0x27;
/// Escape byte following a `00` inside bytes, strings and nested tuples.
const ESCAPE: u8 = 0xff;
/// Nested tuples deeper than this are refused, as serde_json refuses JSON nested deeper
/// than 128: reading (and dropping) them recurses, and a few KiB of `05` bytes would
/// overflow the stack (found by fuzzing, issue 34).
const MAX_NESTING: usize = 128;

/// Bytes that are not a packed tuple of JSON values.
#[derive(Debug, thiserror::Error)]
pub enum TupleError {
    #[error("malformed packed tuple at byte {offset}: {reason}")]
    Malformed { offset: usize, reason: String },
}

/// A document that cannot produce its key: a user (data) error naming the location.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("document is missing key location {pointer}, which has no default in the schema")]
    Missing { pointer: String },
}

/// Appends the tuple encoding of one JSON value to `out`.
pub fn pack_value(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.push(NULL),
        Value::Bool(b) => pack_bool(*b, out),
        Value::Number(n) => pack_number(n, out),
        Value::String(s) => pack_string(s, out),
        Value::Array(_) | Value::Object(_) => pack_json(value, out),
    }
}

/// [`pack_value`] of a compact document: the same bytes as for the `Value` it converts to.
pub fn pack_doc(doc: &Doc, out: &mut Vec<u8>) {
    match doc {
        Doc::Null => out.push(NULL),
        Doc::Bool(b) => pack_bool(*b, out),
        Doc::PosInt(n) => pack_int(false, *n, out),
        Doc::NegInt(n) => pack_int(*n < 0, n.unsigned_abs(), out),
        Doc::Float(f) => pack_double(*f, out),
        Doc::String(s) => pack_string(s.as_str(), out),
        Doc::Array(_) | Doc::Object(_) => pack_json(doc, out),
    }
}

pub(crate) fn pack_bool(b: bool, out: &mut Vec<u8>) {
    out.push(if b { TRUE } else { FALSE });
}

pub(crate) fn pack_null(out: &mut Vec<u8>) {
    out.push(NULL);
}

pub(crate) fn pack_string(s: &str, out: &mut Vec<u8>) {
    pack_str_bytes(s.as_bytes(), out);
}

/// A string given as its UTF-8 bytes.
pub(crate) fn pack_str_bytes(s: &[u8], out: &mut Vec<u8>) {
    out.push(STRING);
    push_escaped(s, out);
    out.push(NULL);
}

/// An array or object: its JSON text as a byte string.
fn pack_json(value: &impl serde::Serialize, out: &mut Vec<u8>) {
    out.push(BYTES);
    // JSON values always serialize (their map keys are strings) and a `Vec` never fails
    // to grow, so this cannot fail. The text holds no 00 (see module docs).
    serde_json::to_writer(&mut *out, value).expect("a JSON value serializes to memory");
    out.push(NULL);
}

/// Packs a whole key (the concatenation of its components).
pub fn pack_key(values: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    for value in values {
        pack_value(value, &mut out);
    }
    out
}

fn pack_number(n: &Number, out: &mut Vec<u8>) {
    if let Some(u) = n.as_u64() {
        pack_int(false, u, out);
    } else if let Some(i) = n.as_i64() {
        pack_int(true, i.unsigned_abs(), out);
    } else {
        // Neither integer form: serde_json holds a finite f64.
        pack_double(
            n.as_f64().expect("a JSON number is an integer or a float"),
            out,
        );
    }
}

/// A double: its bits, sign flipped (positive) or all flipped (negative), big-endian.
fn pack_double(f: f64, out: &mut Vec<u8>) {
    let bits = f.to_bits();
    let flipped = if bits >> 63 == 1 {
        !bits
    } else {
        bits ^ (1 << 63)
    };
    out.push(DOUBLE);
    out.extend_from_slice(&flipped.to_be_bytes());
}

/// Integer element of magnitude `m`: length code around 0x14, then `len` big-endian bytes
/// of `m` (positive) or of its one's complement (negative).
pub(crate) fn pack_int(negative: bool, m: u64, out: &mut Vec<u8>) {
    let len = (64 - m.leading_zeros() as usize).div_ceil(8);
    let (code, body) = if negative {
        (INT_ZERO - len as u8, !m)
    } else {
        (INT_ZERO + len as u8, m)
    };
    out.push(code);
    out.extend_from_slice(&body.to_be_bytes()[8 - len..]);
}

fn push_escaped(bytes: &[u8], out: &mut Vec<u8>) {
    let mut rest = bytes;
    while let Some(at) = rest.iter().position(|&b| b == NULL) {
        out.extend_from_slice(&rest[..=at]);
        out.push(ESCAPE);
        rest = &rest[at + 1..];
    }
    out.extend_from_slice(rest);
}

/// Decodes a packed tuple (concatenated elements) back into JSON values.
pub fn unpack(packed: &[u8]) -> Result<Vec<Value>, TupleError> {
    let mut reader = Reader {
        buf: packed,
        at: 0,
        depth: 0,
    };
    let mut values = Vec::new();
    while reader.at < packed.len() {
        values.push(reader.element(false)?);
    }
    Ok(values)
}

/// [`unpack`] as one JSON array, e.g. to show a key to a person.
pub fn unpack_json_array(packed: &[u8]) -> Result<Value, TupleError> {
    unpack(packed).map(Value::Array)
}

/// One element of a packed tuple, its text borrowed from the packed bytes where it holds
/// no escape: how a store reads a value without building a [`Value`].
#[derive(Debug, Clone, PartialEq)]
pub enum Element<'b> {
    Null,
    Bool(bool),
    /// An integer that fits `i64`.
    Int(i64),
    /// An integer above `i64::MAX`.
    UInt(u64),
    Float(f64),
    Str(Cow<'b, str>),
    /// An array or object: its compact JSON text.
    Json(Cow<'b, [u8]>),
    /// A nested tuple (written by other packers; read as a JSON array).
    Tuple(Vec<Element<'b>>),
}

impl Element<'_> {
    fn into_value(self) -> Result<Value, String> {
        Ok(match self {
            Element::Null => Value::Null,
            Element::Bool(b) => Value::Bool(b),
            Element::Int(i) => Value::from(i),
            Element::UInt(u) => Value::from(u),
            Element::Float(f) => Value::Number(
                Number::from_f64(f).ok_or_else(|| format!("double {f} is not a JSON number"))?,
            ),
            Element::Str(s) => Value::String(s.into_owned()),
            Element::Json(text) => serde_json::from_slice(&text)
                .map_err(|err| format!("bytes element is not JSON text: {err}"))?,
            Element::Tuple(items) => Value::Array(
                items
                    .into_iter()
                    .map(Element::into_value)
                    .collect::<Result<_, _>>()?,
            ),
        })
    }
}

/// Decodes a packed tuple element by element, borrowing text from `packed`.
pub fn elements(packed: &[u8]) -> impl Iterator<Item = Result<Element<'_>, TupleError>> {
    let mut reader = Reader {
        buf: packed,
        at: 0,
        depth: 0,
    };
    std::iter::from_fn(move || {
        (reader.at < reader.buf.len()).then(|| {
            let element = reader.borrowed(false);
            if element.is_err() {
                reader.at = reader.buf.len();
            }
            element
        })
    })
}

struct Reader<'b> {
    buf: &'b [u8],
    at: usize,
    /// How many nested tuples the element being read is in.
    depth: usize,
}

impl<'b> Reader<'b> {
    fn malformed(&self, offset: usize, reason: impl Into<String>) -> TupleError {
        TupleError::Malformed {
            offset,
            reason: reason.into(),
        }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&[u8], TupleError> {
        let end = self.at + n;
        if end > self.buf.len() {
            let have = self.buf.len() - self.at;
            return Err(self.malformed(self.at, format!("{what} needs {n} bytes, {have} left")));
        }
        let bytes = &self.buf[self.at..end];
        self.at = end;
        Ok(bytes)
    }

    /// Reads one element whose type code starts at `self.at`, as JSON.
    fn element(&mut self, nested: bool) -> Result<Value, TupleError> {
        let start = self.at;
        Ok(match self.borrowed(nested)? {
            Element::Null => Value::Null,
            Element::Bool(b) => Value::Bool(b),
            Element::Int(i) => Value::from(i),
            Element::UInt(u) => Value::from(u),
            Element::Float(f) => Value::Number(Number::from_f64(f).ok_or_else(|| {
                self.malformed(start, format!("double {f} is not a JSON number"))
            })?),
            Element::Str(s) => Value::String(s.into_owned()),
            Element::Json(text) => serde_json::from_slice(&text).map_err(|err| {
                self.malformed(start, format!("bytes element is not JSON text: {err}"))
            })?,
            Element::Tuple(items) => Value::Array(
                items
                    .into_iter()
                    .map(|item| item.into_value().map_err(|r| self.malformed(start, r)))
                    .collect::<Result<_, _>>()?,
            ),
        })
    }

    /// Reads one element whose type code starts at `self.at`, borrowing its text. Inside
    /// a nested tuple a null is `00 ff`.
    fn borrowed(&mut self, nested: bool) -> Result<Element<'b>, TupleError> {
        let start = self.at;
        let code = self.take(1, "a type code")?[0];
        Ok(match code {
            NULL => {
                if nested {
                    self.take(1, "a nested null")?;
                }
                Element::Null
            }
            FALSE => Element::Bool(false),
            TRUE => Element::Bool(true),
            BYTES => Element::Json(self.unescape()?),
            STRING => Element::Str(match self.unescape()? {
                Cow::Borrowed(bytes) => {
                    Cow::Borrowed(std::str::from_utf8(bytes).map_err(|err| {
                        self.malformed(start, format!("string element is not UTF-8: {err}"))
                    })?)
                }
                Cow::Owned(bytes) => Cow::Owned(String::from_utf8(bytes).map_err(|err| {
                    self.malformed(start, format!("string element is not UTF-8: {err}"))
                })?),
            }),
            NESTED => {
                if self.depth == MAX_NESTING {
                    return Err(
                        self.malformed(start, format!("nested tuples deeper than {MAX_NESTING}"))
                    );
                }
                self.depth += 1;
                let mut items = Vec::new();
                loop {
                    match self.buf.get(self.at..self.at + 2) {
                        Some([NULL, ESCAPE]) => {}
                        _ if self.buf.get(self.at) == Some(&NULL) => break,
                        _ if self.at >= self.buf.len() => {
                            return Err(self.malformed(start, "nested tuple has no terminator"));
                        }
                        _ => {}
                    }
                    items.push(self.borrowed(true)?);
                }
                self.at += 1;
                self.depth -= 1;
                Element::Tuple(items)
            }
            0x0c..=0x13 => {
                let len = (INT_ZERO - code) as usize;
                let body = self.be_u64(len, "a negative integer")?;
                // Undo the one's complement within `len` bytes.
                let m = !body & (u64::MAX >> (64 - 8 * len));
                Element::Int(0i64.checked_sub_unsigned(m).ok_or_else(|| {
                    self.malformed(start, format!("-{m} is below the JSON integer range"))
                })?)
            }
            INT_ZERO => Element::Int(0),
            0x15..=0x1c => {
                let len = (code - INT_ZERO) as usize;
                let u = self.be_u64(len, "a positive integer")?;
                i64::try_from(u).map_or(Element::UInt(u), Element::Int)
            }
            DOUBLE => {
                let bits = self.be_u64(8, "a double")?;
                let bits = if bits >> 63 == 1 {
                    bits ^ (1 << 63)
                } else {
                    !bits
                };
                Element::Float(f64::from_bits(bits))
            }
            0x0b | 0x1d => {
                return Err(self.malformed(start, "integers wider than 8 bytes are not JSON"));
            }
            other => {
                return Err(self.malformed(start, format!("unknown type code {other:#04x}")));
            }
        })
    }

    fn be_u64(&mut self, len: usize, what: &str) -> Result<u64, TupleError> {
        let bytes = self.take(len, what)?;
        Ok(bytes.iter().fold(0u64, |acc, &b| acc << 8 | u64::from(b)))
    }

    /// Reads escaped content up to its `00` terminator (consumed), undoing `00 ff`;
    /// borrowed when it holds no escape.
    fn unescape(&mut self) -> Result<Cow<'b, [u8]>, TupleError> {
        let start = self.at - 1;
        let buf: &'b [u8] = self.buf;
        let mut owned: Option<Vec<u8>> = None;
        loop {
            let Some(at) = buf[self.at..].iter().position(|&b| b == NULL) else {
                return Err(self.malformed(start, "element has no 00 terminator"));
            };
            let piece = &buf[self.at..self.at + at];
            self.at += at + 1;
            let escaped = buf.get(self.at) == Some(&ESCAPE);
            if escaped {
                self.at += 1;
            }
            match (owned.as_mut(), escaped) {
                (None, false) => return Ok(Cow::Borrowed(piece)),
                (None, true) => owned = Some([piece, &[NULL]].concat()),
                (Some(out), true) => {
                    out.extend_from_slice(piece);
                    out.push(NULL);
                }
                (Some(out), false) => {
                    out.extend_from_slice(piece);
                    return Ok(Cow::Owned(std::mem::take(out)));
                }
            }
        }
    }
}

/// Extracts and packs a collection key (a list of pointers) from documents.
///
/// A key location a document lacks takes its default, as Flow's key extraction does (the
/// schema's `default` there, [`crate::schema::Inference::default`]); one without a default
/// makes the document an error. Defaults are packed once, here, so a missing location
/// costs one copy on either document form.
#[derive(Debug, Clone)]
pub struct KeyExtractor {
    pointers: Vec<Pointer>,
    /// The packed default of each pointer (`None`: a missing location is an error).
    defaults: Vec<Option<Vec<u8>>>,
}

impl KeyExtractor {
    /// `defaults[i]` is what a missing `pointers[i]` packs as (`None`: an error).
    ///
    /// Panics if the two lists differ in length (a bug in the caller).
    pub fn new(pointers: Vec<Pointer>, defaults: Vec<Option<Value>>) -> Self {
        assert_eq!(
            pointers.len(),
            defaults.len(),
            "one default (or `None`) per key pointer"
        );
        let defaults = defaults
            .iter()
            .map(|default| default.as_ref().map(|v| pack_key(std::slice::from_ref(v))))
            .collect();
        KeyExtractor { pointers, defaults }
    }

    /// The key's locations, in key order.
    pub fn pointers(&self) -> &[Pointer] {
        &self.pointers
    }

    /// Appends the packed key of `doc` to `out`. On error `out` is left as it was.
    pub fn pack(&self, doc: &Value, out: &mut Vec<u8>) -> Result<(), KeyError> {
        self.pack_with(doc, Pointer::query, pack_value, out)
    }

    /// [`KeyExtractor::pack`] of a compact document (e.g. one loaded from a store).
    pub fn pack_doc(&self, doc: &Doc, out: &mut Vec<u8>) -> Result<(), KeyError> {
        self.pack_with(doc, Pointer::query_doc, pack_doc, out)
    }

    fn pack_with<D>(
        &self,
        doc: &D,
        query: impl for<'d> Fn(&Pointer, &'d D) -> Option<&'d D>,
        pack: impl Fn(&D, &mut Vec<u8>),
        out: &mut Vec<u8>,
    ) -> Result<(), KeyError> {
        let len_before = out.len();
        for (pointer, default) in self.pointers.iter().zip(&self.defaults) {
            match (query(pointer, doc), default) {
                (Some(value), _) => pack(value, out),
                (None, Some(default)) => out.extend_from_slice(default),
                (None, None) => {
                    out.truncate(len_before);
                    return Err(KeyError::Missing {
                        pointer: pointer.to_string(),
                    });
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn elements_borrow_text_without_escapes_and_agree_with_unpack() {
        let values = [
            json!("plain"),
            json!("nul\u{0}in\u{0}side"),
            json!(""),
            json!(-7),
            json!(0),
            json!(u64::MAX),
            json!(1.5),
            json!(null),
            json!(true),
            json!({"a": [1, 2]}),
        ];
        let packed = pack_key(&values);
        let elements: Vec<Element<'_>> = elements(&packed).collect::<Result<_, _>>().unwrap();
        assert!(matches!(&elements[0], Element::Str(Cow::Borrowed("plain"))));
        assert_eq!(
            elements[1],
            Element::Str(Cow::Owned("nul\u{0}in\u{0}side".into()))
        );
        assert_eq!(elements[3], Element::Int(-7));
        assert_eq!(elements[5], Element::UInt(u64::MAX));
        let again: Vec<Value> = elements
            .into_iter()
            .map(|e| e.into_value().unwrap())
            .collect();
        assert_eq!(again, unpack(&packed).unwrap());
        assert_eq!(again, values);
        assert!(super::elements(b"\x02abc").next().unwrap().is_err());
    }

    #[test]
    fn object_properties_pack_in_ascending_order() {
        // Fails if serde_json's `preserve_order` feature gets enabled in the build.
        let doc: Value = serde_json::from_str(r#"{"b":1,"a":{"d":2,"c":3}}"#).unwrap();
        let mut want = vec![BYTES];
        want.extend_from_slice(br#"{"a":{"c":3,"d":2},"b":1}"#);
        want.push(NULL);
        assert_eq!(pack_key(&[doc]), want);
    }

    #[test]
    fn json_text_in_bytes_never_needs_escaping() {
        let packed = pack_key(&[json!(["a\u{0}b"])]);
        assert_eq!(packed, b"\x01[\"a\\u0000b\"]\x00");
    }

    #[test]
    fn nested_tuples_unpack_as_arrays() {
        // (nested (null, 1, "x")) then true
        let packed = b"\x05\x00\xff\x15\x01\x02x\x00\x00\x27";
        assert_eq!(
            unpack(packed).unwrap(),
            vec![json!([null, 1, "x"]), json!(true)]
        );
    }

    #[test]
    fn tuples_nested_too_deep_are_malformed() {
        let nested = |depth: usize| {
            let mut packed = vec![NESTED; depth];
            packed.extend(std::iter::repeat_n(NULL, depth));
            packed
        };
        assert_eq!(unpack(&nested(MAX_NESTING)).unwrap().len(), 1);
        let err = unpack(&nested(MAX_NESTING + 1)).unwrap_err().to_string();
        assert!(err.contains("nested tuples deeper than 128"), "{err}");
        let err = unpack(&[NESTED; 4096]).unwrap_err().to_string();
        assert!(err.contains("nested tuples deeper than 128"), "{err}");
    }

    #[test]
    fn unterminated_nested_tuple_is_malformed() {
        let err = unpack(b"\x05\x15\x01").unwrap_err();
        assert!(err.to_string().contains("at byte 0"), "{err}");
    }

    #[test]
    fn failed_extraction_leaves_the_buffer_unchanged() {
        let x = KeyExtractor::new(
            vec![Pointer::parse("/a").unwrap(), Pointer::parse("/b").unwrap()],
            vec![None, None],
        );
        let mut out = vec![9];
        assert!(x.pack(&json!({"a": 1}), &mut out).is_err());
        assert_eq!(out, [9]);
    }
}
