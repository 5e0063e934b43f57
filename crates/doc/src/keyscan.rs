//! The packed key of a document read straight from its JSON text, without parsing the
//! document: how the reader routes a record to its shard (by its key's hash) at a
//! fraction of a parse.
//!
//! Only the common case is read: a top-level object whose key locations are each a
//! top-level property, present once, holding a string without escapes, an integer, a
//! boolean or null. Anything else answers `None` (a nested or repeated key location, an
//! escaped name, a float, text the scan does not follow), and the document takes the
//! full path, whose key is the authority. Where the scan answers, its bytes are the ones
//! [`KeyExtractor::pack_doc`](crate::KeyExtractor::pack_doc) gives the parsed document,
//! whenever that document parses (a property test holds the two together). Text that
//! does not parse goes to the shard its scanned key hashes to, which parses it and
//! reports the error.

use crate::Pointer;
use crate::tuple::{pack_bool, pack_int, pack_null, pack_str_bytes};

/// Key locations beyond this many are not scanned (the found spans live on the stack).
const MAX_KEYS: usize = 4;

/// The top-level property names of a key, in key order.
#[derive(Debug, Clone)]
pub struct KeyScan {
    names: Vec<Box<[u8]>>,
}

impl KeyScan {
    /// The scan of a key at `pointers`: `None` unless each is one distinct property name.
    pub fn new(pointers: &[Pointer]) -> Option<KeyScan> {
        if pointers.is_empty() || pointers.len() > MAX_KEYS {
            return None;
        }
        let mut names: Vec<Box<[u8]>> = Vec::with_capacity(pointers.len());
        for pointer in pointers {
            let mut tokens = pointer.tokens();
            let (Some(name), None) = (tokens.next(), tokens.next()) else {
                return None;
            };
            if names.iter().any(|n| **n == *name.as_bytes()) {
                return None;
            }
            names.push(name.as_bytes().into());
        }
        Some(KeyScan { names })
    }

    /// Appends the packed key of the document `text` holds to `out` and returns true,
    /// when the scan can read it; else leaves `out` as it was and returns false.
    pub fn pack(&self, text: &[u8], out: &mut Vec<u8>) -> bool {
        let mut found = [None; MAX_KEYS];
        if self.find(text, &mut found).is_none() {
            return false;
        }
        let before = out.len();
        for span in &found[..self.names.len()] {
            let Some((begin, end)) = *span else {
                out.truncate(before);
                return false;
            };
            if pack_scalar(&text[begin..end], out).is_none() {
                out.truncate(before);
                return false;
            }
        }
        true
    }

    /// Walks the top-level object of `text`, noting the value span of each key name.
    fn find(&self, text: &[u8], found: &mut [Option<(usize, usize)>; MAX_KEYS]) -> Option<()> {
        let mut at = skip_ws(text, 0);
        if text.get(at) != Some(&b'{') {
            return None;
        }
        at = skip_ws(text, at + 1);
        if text.get(at) == Some(&b'}') {
            return None;
        }
        loop {
            if text.get(at) != Some(&b'"') {
                return None;
            }
            let name_end = at + 1 + memchr::memchr2(b'"', b'\\', &text[at + 1..])?;
            if text[name_end] == b'\\' {
                return None;
            }
            let name = &text[at + 1..name_end];
            at = skip_ws(text, name_end + 1);
            if text.get(at) != Some(&b':') {
                return None;
            }
            let begin = skip_ws(text, at + 1);
            let end = skip_value(text, begin)?;
            if let Some(k) = self.names.iter().position(|n| **n == *name) {
                if found[k].is_some() {
                    return None;
                }
                found[k] = Some((begin, end));
            }
            at = skip_ws(text, end);
            match text.get(at) {
                Some(b',') => at = skip_ws(text, at + 1),
                Some(b'}') => break,
                _ => return None,
            }
        }
        (skip_ws(text, at + 1) == text.len()).then_some(())
    }
}

/// Packs a scalar's text as the parsed value packs: a string without escapes, an
/// integer that is one in `u64` or `i64`, a boolean or null; `None` for anything else.
fn pack_scalar(value: &[u8], out: &mut Vec<u8>) -> Option<()> {
    match value {
        // Bytes that are not UTF-8 fail the owner's parse, which reports them.
        [b'"', inner @ .., b'"'] if !inner.contains(&b'\\') => pack_str_bytes(inner, out),
        b"true" => pack_bool(true, out),
        b"false" => pack_bool(false, out),
        b"null" => pack_null(out),
        [b'-', digits @ ..] => {
            let magnitude = integer(digits)?;
            // `-0` parses as an unsigned zero; below i64::MIN, as a float.
            if magnitude == 0 || magnitude > 1 << 63 {
                return None;
            }
            pack_int(true, magnitude, out)
        }
        digits => pack_int(false, integer(digits)?, out),
    }
    Some(())
}

/// The value of JSON integer digits (no sign, fraction or exponent; no leading zero).
fn integer(digits: &[u8]) -> Option<u64> {
    match digits {
        [] => None,
        [b'0'] => Some(0),
        [b'0', ..] => None,
        _ => digits.iter().try_fold(0u64, |n, &d| {
            d.is_ascii_digit()
                .then(|| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))?
        }),
    }
}

fn skip_ws(text: &[u8], mut at: usize) -> usize {
    while let Some(b' ' | b'\t' | b'\n' | b'\r') = text.get(at) {
        at += 1;
    }
    at
}

/// The end of the value starting at `at`: past its closing quote or bracket, or at the
/// first delimiter after a number or literal. Follows strings and nesting only.
fn skip_value(text: &[u8], at: usize) -> Option<usize> {
    match text.get(at)? {
        b'"' => skip_string(text, at),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut i = at;
            loop {
                match text.get(i)? {
                    b'"' => {
                        i = skip_string(text, i)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(i + 1);
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        _ => {
            let len = text[at..]
                .iter()
                .position(|b| matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
                .unwrap_or(text.len() - at);
            (len > 0).then_some(at + len)
        }
    }
}

/// Past the closing quote of the string opening at `at`.
fn skip_string(text: &[u8], at: usize) -> Option<usize> {
    let mut i = at + 1;
    loop {
        i += memchr::memchr2(b'"', b'\\', text.get(i..)?)?;
        match text[i] {
            b'"' => return Some(i + 1),
            _ => i += 2,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::KeyExtractor;
    use crate::parse::DocParser;
    use proptest::prelude::*;
    use serde_json::{Value, json};

    fn scan(pointers: &[&str]) -> (KeyScan, KeyExtractor) {
        let pointers: Vec<Pointer> = pointers
            .iter()
            .map(|p| Pointer::parse(p).unwrap())
            .collect();
        let extractor = KeyExtractor::new(pointers.clone(), vec![None; pointers.len()]);
        (KeyScan::new(&pointers).unwrap(), extractor)
    }

    /// What the scan packs of `text`, and what the parsed document packs.
    fn both(pointers: &[&str], text: &str) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
        let (scan, extractor) = scan(pointers);
        let mut scanned = Vec::new();
        let scanned = scan.pack(text.as_bytes(), &mut scanned).then_some(scanned);
        let parsed = DocParser::default()
            .parse(text.as_bytes())
            .ok()
            .and_then(|doc| {
                let mut out = Vec::new();
                extractor.pack_doc(&doc, &mut out).ok().map(|()| out)
            });
        (scanned, parsed)
    }

    #[test]
    fn the_common_keys_are_read_as_the_parsed_document_packs_them() {
        for text in [
            r#"{"id": "a", "n": 1}"#,
            r#" { "n" : {"x": [1, "}", {"y": "\""}]}, "id":"user-0001" } "#,
            r#"{"id": 18446744073709551615}"#,
            r#"{"id": -9223372036854775808}"#,
            r#"{"id": 0, "other": 1.5e3}"#,
            r#"{"id": true}"#,
            r#"{"id": null}"#,
            r#"{"id": "ünïcödé"}"#,
        ] {
            let (scanned, parsed) = both(&["/id"], text);
            assert!(scanned.is_some(), "{text}");
            assert_eq!(scanned, parsed, "{text}");
        }
        let (scanned, parsed) = both(&["/b", "/a"], r#"{"a": 1, "b": "x"}"#);
        assert_eq!(scanned, parsed);
    }

    #[test]
    fn anything_else_takes_the_full_path() {
        for text in [
            r#"{"id": "a\"b"}"#,
            r#"{"id": 1.0}"#,
            r#"{"id": 1e3}"#,
            r#"{"id": -0}"#,
            r#"{"id": 01}"#,
            r#"{"id": 18446744073709551616}"#,
            r#"{"id": -9223372036854775809}"#,
            r#"{"id": [1]}"#,
            r#"{"id": {"a": 1}}"#,
            r#"{"id": "a", "id": "b"}"#,
            r#"{"i\u0064": "a", "id": "b"}"#,
            r#"{"other": 1}"#,
            r#"{}"#,
            r#"[1]"#,
            r#"{"id": "a"} trailing"#,
            r#"{"id": "a""#,
            r#"{"id" "a"}"#,
        ] {
            let (scanned, _) = both(&["/id"], text);
            assert_eq!(scanned, None, "{text}");
        }
        assert!(KeyScan::new(&[Pointer::parse("/a/b").unwrap()]).is_none());
        let id = Pointer::parse("/id").unwrap();
        assert!(KeyScan::new(&[id.clone(), id]).is_none());
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<u64>().prop_map(|n| json!(n)),
            (-1e6f64..1e6).prop_map(|f| json!(f)),
            "[a-z\"\\\\ü{}\\[\\],:]{0,6}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Value::Array),
                prop::collection::btree_map("[a-z]{1,3}", inner, 0..3)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        /// Wherever the scan answers, it answers what the parsed document packs.
        #[test]
        fn a_scanned_key_is_the_parsed_documents_key(
            fields in prop::collection::btree_map("[a-e]{1,2}", arb_json(), 1..6),
            pretty in any::<bool>(),
        ) {
            let doc = Value::Object(fields.into_iter().collect());
            let text = if pretty {
                serde_json::to_string_pretty(&doc).unwrap()
            } else {
                serde_json::to_string(&doc).unwrap()
            };
            for pointers in [&["/a"][..], &["/b", "/a"], &["/e"]] {
                let (scanned, parsed) = both(pointers, &text);
                if scanned.is_some() {
                    prop_assert_eq!(scanned, parsed, "{}", text);
                }
            }
        }
    }
}
