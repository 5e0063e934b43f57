//! A compact in-memory document: what the combiner keeps for each key.
//!
//! ```text
//!  Value::Object(BTreeMap)  ──From──▶  Doc::Object(Box<[Field { name, value }]>)  (sorted by name)
//!  Value::Array(Vec)        ──From──▶  Doc::Array(Box<[Doc]>)
//!  Value::Number(n)         ──From──▶  Doc::PosInt(u64) | Doc::NegInt(i64) | Doc::Float(f64)
//!  Value::String(String)    ──From──▶  Doc::String(Str)   (≤ 24 bytes inline, else moved)
//! ```
//!
//! Why: a parsed `serde_json::Value` object is a `BTreeMap` whose every node is a ~640-byte
//! block, even for two properties, and every name and string is its own allocation, so a
//! 150-byte document costs ~1.8 KiB in 17 blocks. A `Doc` is 24 bytes and a [`Str`] keeps
//! up to 24 bytes inline (a `compact_str::CompactString`; most names, ids, timestamps, enum-like values), so
//! an object is one exact-size block of 48-byte fields and the same document takes ~450
//! bytes in 2 blocks: fewer allocations to make and free, fewer cache lines and pages.
//!
//! Invariants:
//! - An object's fields are sorted by name (byte order, as `serde_json::Map` iterates
//!   them) and names are unique, so two objects merge by walking both in tandem.
//! - A [`Str`] holds the bytes of a `str` and compares by them, inline or not.
//! - Numbers keep serde_json's own classes: `PosInt` for integers ≥ 0 that fit a `u64`,
//!   `NegInt` for negative integers that fit an `i64`, `Float` (always finite) for the
//!   rest, so `Value → Doc → Value` is the identity, numbers included.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Serialize, Serializer};
use serde_json::{Map, Number, Value};
use std::fmt;
use std::iter::Peekable;

/// Bytes a [`Str`] keeps inline: all 24 bytes of it (compact_str's representation).
const INLINE: usize = 24;

/// A string of a compact document: inline up to 24 bytes, else one heap block. Ordered
/// and compared by bytes, which is `str` order. Reading it as a `str` costs nothing,
/// which matters: names and values are read on every lookup, validation and reduction.
#[derive(Clone, PartialEq, Eq)]
pub struct Str(compact_str::CompactString);

impl Str {
    /// The compact form of `s`, inline when it fits.
    pub fn new(s: &str) -> Str {
        Str(compact_str::CompactString::new(s))
    }

    /// Like [`Str::new`], reusing the allocation of `s` when it does not fit inline.
    pub fn from_string(s: String) -> Str {
        Str(compact_str::CompactString::from(s))
    }

    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }

    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }

    pub fn into_string(self) -> String {
        self.0.into_string()
    }

    /// Bytes of the heap block a string of `len` bytes takes (0 when inline; compact_str
    /// allocates at least 32).
    pub fn heap_len(len: usize) -> usize {
        if len <= INLINE { 0 } else { len.max(32) }
    }

    /// The heap this string owns: none when inline, which one byte of it tells (cheaper
    /// than decoding its length; most strings are inline).
    #[inline]
    fn heap_size(&self) -> usize {
        if self.0.is_heap_allocated() {
            str_size(self.as_bytes().len())
        } else {
            0
        }
    }
}

impl AsRef<str> for Str {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Debug for Str {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

/// One JSON value in its compact form. See the module docs.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Doc {
    #[default]
    Null,
    Bool(bool),
    PosInt(u64),
    NegInt(i64),
    Float(f64),
    String(Str),
    Array(Box<[Doc]>),
    /// Sorted by name, names unique.
    Object(Box<[Field]>),
}

/// One property of a compact object.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    pub name: Str,
    pub value: Doc,
}

// What the memory figures above (and every estimate built on them) assume.
const _: () = assert!(size_of::<Doc>() == 24 && size_of::<Field>() == 48);

impl Field {
    /// The heap this field owns: its name's block, if any, and its value's.
    pub fn heap_size(&self) -> usize {
        self.name.heap_size() + self.value.heap_size()
    }
}

impl Doc {
    /// The number this is, as serde_json's `Number` (no allocation).
    pub fn as_number(&self) -> Option<Number> {
        match *self {
            Doc::PosInt(n) => Some(n.into()),
            Doc::NegInt(n) => Some(n.into()),
            Doc::Float(f) => Number::from_f64(f),
            _ => None,
        }
    }

    /// The compact form of a number, in serde_json's classes (see the module invariants).
    pub fn from_number(n: &Number) -> Doc {
        if let Some(u) = n.as_u64() {
            Doc::PosInt(u)
        } else if let Some(i) = n.as_i64() {
            Doc::NegInt(i)
        } else {
            // Without `arbitrary_precision`, every other Number is a finite f64.
            Doc::Float(n.as_f64().unwrap_or_default())
        }
    }
}

impl From<Value> for Doc {
    /// Moves the strings and property names of `value` (a `String` of exact capacity, as
    /// serde_json parses them, becomes a `Box<str>` without copying).
    fn from(value: Value) -> Doc {
        match value {
            Value::Null => Doc::Null,
            Value::Bool(b) => Doc::Bool(b),
            Value::Number(n) => Doc::from_number(&n),
            Value::String(s) => Doc::String(Str::from_string(s)),
            Value::Array(items) => Doc::Array(items.into_iter().map(Doc::from).collect()),
            Value::Object(map) => Doc::Object(
                map.into_iter()
                    .map(|(name, value)| Field {
                        name: Str::from_string(name),
                        value: Doc::from(value),
                    })
                    .collect(),
            ),
        }
    }
}

impl From<&Value> for Doc {
    fn from(value: &Value) -> Doc {
        match value {
            Value::Null => Doc::Null,
            Value::Bool(b) => Doc::Bool(*b),
            Value::Number(n) => Doc::from_number(n),
            Value::String(s) => Doc::String(Str::new(s)),
            Value::Array(items) => Doc::Array(items.iter().map(Doc::from).collect()),
            Value::Object(map) => Doc::Object(
                map.iter()
                    .map(|(name, value)| Field {
                        name: Str::new(name),
                        value: Doc::from(value),
                    })
                    .collect(),
            ),
        }
    }
}

impl From<Doc> for Value {
    fn from(doc: Doc) -> Value {
        match doc {
            Doc::Null => Value::Null,
            Doc::Bool(b) => Value::Bool(b),
            Doc::PosInt(n) => Value::Number(n.into()),
            Doc::NegInt(n) => Value::Number(n.into()),
            Doc::Float(f) => Number::from_f64(f).map_or(Value::Null, Value::Number),
            Doc::String(s) => Value::String(s.into_string()),
            Doc::Array(items) => {
                Value::Array(items.into_vec().into_iter().map(Value::from).collect())
            }
            Doc::Object(fields) => Value::Object(
                fields
                    .into_vec()
                    .into_iter()
                    .map(|field| (field.name.into_string(), Value::from(field.value)))
                    .collect::<Map<String, Value>>(),
            ),
        }
    }
}

impl Doc {
    /// An estimate of the heap bytes this document owns (not counting its own inline 24
    /// bytes): what a combiner counts against its memory budget. The combine bench's
    /// 160-byte document (7 properties, one nested object of 2; every name and string
    /// short enough to be inline) comes to 496 bytes: its two field blocks.
    ///
    /// Inline, so the scalars most reductions replace cost a branch (containers are
    /// walked out of line; `always`, as the recursion through them makes a plain hint be
    /// ignored, costing ~30 instructions a call).
    #[inline(always)]
    pub fn heap_size(&self) -> usize {
        match self {
            Doc::Null | Doc::Bool(_) | Doc::PosInt(_) | Doc::NegInt(_) | Doc::Float(_) => 0,
            Doc::String(s) => s.heap_size(),
            Doc::Array(_) | Doc::Object(_) => self.container_heap_size(),
        }
    }

    /// Drops this and returns the heap estimate it held ([`Doc::heap_size`]), skipping
    /// the drop glue (an out-of-line call) and the estimate when there is nothing to free:
    /// a scalar or an inline string, what reductions mostly replace.
    #[inline]
    pub(crate) fn release(self) -> usize {
        let owns_heap = match &self {
            Doc::String(s) => s.0.is_heap_allocated(),
            Doc::Array(_) | Doc::Object(_) => true,
            _ => false,
        };
        if owns_heap {
            self.heap_size()
        } else {
            std::mem::forget(self);
            0
        }
    }

    #[inline(never)]
    fn container_heap_size(&self) -> usize {
        match self {
            Doc::Array(items) => {
                block_size::<Doc>(items.len()) + items.iter().map(Doc::heap_size).sum::<usize>()
            }
            Doc::Object(fields) => {
                block_size::<Field>(fields.len())
                    + fields.iter().map(Field::heap_size).sum::<usize>()
            }
            _ => 0,
        }
    }

    /// The property `name` of an object (see [`field_named`]).
    pub fn get(&self, name: &str) -> Option<&Doc> {
        let Doc::Object(fields) = self else {
            return None;
        };
        field_named(fields, name).map(|field| &field.value)
    }

    /// Whether this is a deletion of its key: its `/_meta/op` is `"d"` (Estuary Flow's
    /// convention, which change-data sources and envelopes produce).
    pub fn is_deletion(&self) -> bool {
        matches!(
            self.get("_meta").and_then(|meta| meta.get("op")),
            Some(Doc::String(op)) if op.as_str() == "d"
        )
    }

    /// The unsigned integer this is, if it is one.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Doc::PosInt(n) => Some(n),
            _ => None,
        }
    }
}

/// Serializes like the `Value` the document converts to (same text from `serde_json`).
impl Serialize for Doc {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Doc::Null => serializer.serialize_unit(),
            Doc::Bool(b) => serializer.serialize_bool(*b),
            Doc::PosInt(n) => serializer.serialize_u64(*n),
            Doc::NegInt(n) => serializer.serialize_i64(*n),
            Doc::Float(f) => serializer.serialize_f64(*f),
            Doc::String(s) => serializer.serialize_str(s.as_str()),
            Doc::Array(items) => serializer.collect_seq(items.iter()),
            Doc::Object(fields) => serializer.collect_map(
                fields
                    .iter()
                    .map(|field| (field.name.as_str(), &field.value)),
            ),
        }
    }
}

/// Deserializes what a `Value` would hold, straight into the compact form: an object's
/// properties are sorted by name and a repeated name keeps its last value (as
/// `serde_json::Map` does).
impl<'de> Deserialize<'de> for Doc {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Doc, D::Error> {
        deserializer.deserialize_any(DocVisitor)
    }
}

struct DocVisitor;

impl<'de> Visitor<'de> for DocVisitor {
    type Value = Doc;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Doc, E> {
        Ok(Doc::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Doc, E> {
        Ok(Doc::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Doc, D::Error> {
        Doc::deserialize(deserializer)
    }

    fn visit_bool<E: de::Error>(self, b: bool) -> Result<Doc, E> {
        Ok(Doc::Bool(b))
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<Doc, E> {
        Ok(Doc::PosInt(n))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<Doc, E> {
        Ok(Doc::from_number(&n.into()))
    }

    fn visit_f64<E: de::Error>(self, f: f64) -> Result<Doc, E> {
        // As `Value`: a float that is not finite has no JSON number.
        Ok(if f.is_finite() {
            Doc::Float(f)
        } else {
            Doc::Null
        })
    }

    fn visit_str<E: de::Error>(self, s: &str) -> Result<Doc, E> {
        Ok(Doc::String(Str::new(s)))
    }

    fn visit_string<E: de::Error>(self, s: String) -> Result<Doc, E> {
        Ok(Doc::String(Str::from_string(s)))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Doc, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Doc::Array(items.into_boxed_slice()))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Doc, A::Error> {
        let mut fields: Vec<Field> = Vec::with_capacity(map.size_hint().unwrap_or(0).min(4096));
        while let Some(name) = map.next_key::<StrSeed>()? {
            fields.push(Field {
                name: name.0,
                value: map.next_value()?,
            });
        }
        // Stable, so of two equal names the later one comes last; its value is kept.
        fields.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
        fields.dedup_by(|later, kept| {
            let repeated = later.name == kept.name;
            if repeated {
                std::mem::swap(&mut later.value, &mut kept.value);
            }
            repeated
        });
        Ok(Doc::Object(fields.into_boxed_slice()))
    }
}

/// A property name, deserialized without an intermediate `String` when it fits inline.
struct StrSeed(Str);

impl<'de> Deserialize<'de> for StrSeed {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<StrSeed, D::Error> {
        struct NameVisitor;
        impl Visitor<'_> for NameVisitor {
            type Value = StrSeed;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a property name")
            }

            fn visit_str<E: de::Error>(self, s: &str) -> Result<StrSeed, E> {
                Ok(StrSeed(Str::new(s)))
            }

            fn visit_string<E: de::Error>(self, s: String) -> Result<StrSeed, E> {
                Ok(StrSeed(Str::from_string(s)))
            }
        }
        deserializer.deserialize_str(NameVisitor)
    }
}

/// Objects of up to this many fields are scanned by [`field_named`], larger ones searched.
const SCANNED_FIELDS: usize = 12;

/// The field named `name` among `fields` (sorted by name, as an object's). A small object
/// is scanned with [`same_bytes`], where a binary search makes log2(n) ordered compares,
/// each a `memcmp` call (a third of the cost, measured on the combine bench's objects).
pub(crate) fn field_named<'f>(fields: &'f [Field], name: &str) -> Option<&'f Field> {
    let name = name.as_bytes();
    if fields.len() <= SCANNED_FIELDS {
        return (fields.iter()).find(|field| same_bytes(field.name.as_bytes(), name));
    }
    let at = (fields.binary_search_by(|field| field.name.as_bytes().cmp(name))).ok()?;
    Some(&fields[at])
}

/// The next of `sorted` (in name order, as an object's fields) named `name`, passing over
/// the ones before it. Equality is tried first: same-shaped objects pair up at once.
#[inline]
pub(crate) fn next_named<I: Iterator>(
    sorted: &mut Peekable<I>,
    name: &[u8],
    name_of: impl Fn(&I::Item) -> &[u8],
) -> Option<I::Item> {
    if let Some(item) = sorted.next_if(|item| same_bytes(name_of(item), name)) {
        return Some(item);
    }
    while sorted.next_if(|item| name_of(item) < name).is_some() {}
    sorted.next_if(|item| same_bytes(name_of(item), name))
}

/// Whether `a` and `b` are the same bytes: for up to 16 of them, a length compare and two
/// overlapping loads a side instead of a call into `memcmp` (names and short strings,
/// which the parser and the reductions compare all the time).
#[inline(always)]
pub(crate) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let len = a.len();
    if len != b.len() {
        return false;
    }
    let word = |s: &[u8], at: usize| u64::from_le_bytes(s[at..at + 8].try_into().expect("8"));
    let half = |s: &[u8], at: usize| u32::from_le_bytes(s[at..at + 4].try_into().expect("4"));
    match len {
        0 => true,
        1..=3 => a[0] == b[0] && a[len / 2] == b[len / 2] && a[len - 1] == b[len - 1],
        4..=8 => half(a, 0) == half(b, 0) && half(a, len - 4) == half(b, len - 4),
        9..=16 => word(a, 0) == word(b, 0) && word(a, len - 8) == word(b, len - 8),
        _ => a == b,
    }
}

/// Bytes a heap block of `bytes` really takes, the larger of what the two allocators we
/// run under give it: glibc (an 8-byte header, 16-byte granules, 32 bytes at least) and
/// mimalloc (the `sluice` binary's: 8-byte size classes up to 64 bytes, then four classes
/// per power of two, e.g. a 336-byte block of 7 fields takes 384).
fn alloc_size(bytes: usize) -> usize {
    if bytes == 0 {
        return 0;
    }
    let glibc = (bytes + 8).next_multiple_of(16).max(32);
    let words = bytes.div_ceil(8);
    let mimalloc_words = if words <= 8 {
        words
    } else {
        words.next_multiple_of(1 << ((words - 1).ilog2() - 2))
    };
    glibc.max(mimalloc_words * 8)
}

/// Bytes the heap block of `len` items of `T` takes (a boxed slice of fields or items).
pub(crate) fn block_size<T>(len: usize) -> usize {
    alloc_size(len * size_of::<T>())
}

/// Heap bytes of a [`Str`] of `len` bytes.
#[inline]
fn str_size(len: usize) -> usize {
    alloc_size(Str::heap_len(len))
}

#[cfg(test)]
mod tests {
    use super::{Doc, Field, SCANNED_FIELDS, Str, alloc_size, field_named, same_bytes, str_size};

    /// Objects scanned and objects searched find every name they hold, and no other: names
    /// that share a length and a first byte, or are prefixes of one another, included.
    #[test]
    fn fields_are_found_by_name_in_objects_of_every_size() {
        let pool = [
            "", "a", "b", "ab", "aa", "ba", "abc", "abd", "b\0", "user", "page", "tags",
        ];
        for len in 0..=pool.len() {
            let mut names: Vec<&str> = pool[..len].to_vec();
            names.sort_unstable();
            let fields: Vec<Field> = (names.iter().enumerate())
                .map(|(i, name)| Field {
                    name: Str::new(name),
                    value: Doc::PosInt(i as u64),
                })
                .collect();
            for (i, name) in names.iter().enumerate() {
                let found = field_named(&fields, name).map(|field| &field.value);
                assert_eq!(
                    found,
                    Some(&Doc::PosInt(i as u64)),
                    "{name} among {names:?}"
                );
            }
            for absent in pool[len..].iter().chain(&["c", "abcd", "usex", "uses"]) {
                assert!(
                    field_named(&fields, absent).is_none(),
                    "{absent} among {names:?}"
                );
            }
        }
        assert!(pool.len() == SCANNED_FIELDS, "both ways are tested");
        let many: Vec<Field> = (0..40)
            .map(|i| Field {
                name: Str::new(&format!("name{i:02}")),
                value: Doc::PosInt(i),
            })
            .collect();
        assert_eq!(
            field_named(&many, "name17").map(|f| &f.value),
            Some(&Doc::PosInt(17))
        );
        assert!(field_named(&many, "name40").is_none());
    }

    /// Every length (each load width and the `memcmp` past 16 bytes): equal bytes are
    /// equal, and a single byte changed anywhere, or one more byte, is not.
    #[test]
    fn same_bytes_tells_every_difference() {
        let text: Vec<u8> = (0..40u8).map(|i| b'a' + i % 26).collect();
        for len in 0..=text.len() {
            let a = &text[..len];
            let mut b = a.to_vec();
            assert!(same_bytes(a, &b), "{len}");
            for at in 0..len {
                b[at] ^= 0x80;
                assert!(!same_bytes(a, &b), "length {len}, byte {at}");
                b[at] ^= 0x80;
            }
            b.push(b'a');
            assert!(!same_bytes(a, &b), "{len} and one more");
        }
    }

    /// `release` frees what a document owns and tells its estimate: it skips the drop only
    /// where the estimate is 0 because nothing is owned (a string past 24 bytes, say,
    /// would be leaked if it were taken for inline).
    #[test]
    fn released_documents_give_back_their_estimate() {
        let long = "x".repeat(25);
        let docs = [
            Doc::Null,
            Doc::Bool(true),
            Doc::PosInt(7),
            Doc::NegInt(-7),
            Doc::Float(0.5),
            Doc::String(Str::new("inline")),
            Doc::String(Str::new(&long)),
            Doc::String(Str::from_string(long.clone())),
            Doc::Array(Box::default()),
            Doc::Array(vec![Doc::String(Str::new(&long))].into_boxed_slice()),
            Doc::Object(
                vec![Field {
                    name: Str::new(&long),
                    value: Doc::Null,
                }]
                .into_boxed_slice(),
            ),
        ];
        for doc in docs {
            assert_eq!(doc.clone().release(), doc.heap_size(), "{doc:?}");
        }
    }

    #[test]
    fn string_estimates_follow_their_length() {
        for len in 0..80 {
            let s = "x".repeat(len);
            for doc in [Doc::String(Str::new(&s)), Doc::String(Str::from_string(s))] {
                assert_eq!(doc.heap_size(), str_size(len), "{len} bytes");
            }
        }
    }

    #[test]
    fn block_estimates_cover_both_allocators_size_classes() {
        assert_eq!(alloc_size(0), 0);
        assert_eq!(alloc_size(1), 32); // glibc's minimum chunk
        assert_eq!(alloc_size(96), 112); // glibc: header and 16-byte granule
        assert_eq!(alloc_size(336), 384); // mimalloc: the 320..384 class
        assert_eq!(alloc_size(4000), 4096); // mimalloc: the 3584..4096 class
    }
}
