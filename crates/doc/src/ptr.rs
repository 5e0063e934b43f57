//! RFC 6901 JSON pointers.
//!
//! ```text
//!   "/a~1b/0/-"  ──parse──▶  [Token "a/b", Token "0" (index 0), Token "-"]
//!                 ◀─Display─
//! ```
//!
//! A [`Pointer`] is parsed once (collection keys, reduction keys, projections) and then
//! queried for every document, millions of times a second. So `parse` does all the work
//! that does not depend on the document: escapes are undone and each token's array index
//! is computed up front. `query` is then one map lookup or one bounds-checked index per
//! token, with no allocation.
//!
//! Invariants:
//! - `""` is the whole document; every other pointer starts with `/`. `"/"` is one empty
//!   token (the property named `""`).
//! - A token is an array index only when it is `0` or a decimal number without leading
//!   zeros that fits a `usize`; otherwise it matches nothing in an array. The same token
//!   always names a property of an object, whatever its spelling.
//! - `-` ("the element after the last") never matches in `query`/`query_mut`; it appends
//!   in [`Pointer::create_mut`].
//! - `Display` re-escapes (`~` → `~0`, `/` → `~1`), so `parse(p.to_string()) == p`.

use crate::compact::Doc;
use serde_json::{Map, Value};
use std::fmt;
use std::str::FromStr;

/// A parsed JSON pointer such as `/user/name` or `/a~1b/0`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Pointer {
    tokens: Vec<Token>,
}

/// One unescaped reference token, with its array index precomputed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Token {
    name: String,
    /// `Some` when `name` is a canonical decimal index (see the module invariants).
    index: Option<usize>,
}

/// A string that is not a JSON pointer: a user error in a key, schema or config.
#[derive(Debug, thiserror::Error)]
#[error("invalid JSON pointer {pointer:?}: {reason}")]
pub struct PointerError {
    pub pointer: String,
    pub reason: String,
}

impl Token {
    fn new(name: String) -> Token {
        let index = parse_index(&name);
        Token { name, index }
    }
}

/// `Some(i)` for `0` or a decimal without leading zeros that fits a `usize`.
fn parse_index(s: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    let canonical = match bytes {
        [b'0'] => true,
        [b'1'..=b'9', rest @ ..] => rest.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    if canonical { s.parse().ok() } else { None }
}

impl Pointer {
    /// The pointer `""`, which refers to the whole document.
    pub fn root() -> Pointer {
        Pointer::default()
    }

    /// Parses `""` (the whole document) or `/token/token...`, unescaping `~1` and `~0`.
    pub fn parse(s: &str) -> Result<Pointer, PointerError> {
        let error = |reason: &str| PointerError {
            pointer: s.to_string(),
            reason: reason.to_string(),
        };
        if s.is_empty() {
            return Ok(Pointer::root());
        }
        let Some(rest) = s.strip_prefix('/') else {
            return Err(error("a pointer is \"\" or starts with '/'"));
        };
        let mut tokens = Vec::new();
        for raw in rest.split('/') {
            let mut name = String::with_capacity(raw.len());
            let mut chars = raw.chars();
            while let Some(c) = chars.next() {
                if c != '~' {
                    name.push(c);
                    continue;
                }
                match chars.next() {
                    Some('0') => name.push('~'),
                    Some('1') => name.push('/'),
                    _ => return Err(error("'~' must be followed by '0' or '1'")),
                }
            }
            tokens.push(Token::new(name));
        }
        Ok(Pointer { tokens })
    }

    /// The unescaped reference tokens, outermost first (none for the whole document).
    pub fn tokens(&self) -> impl ExactSizeIterator<Item = &str> + Clone + '_ {
        self.tokens.iter().map(|t| t.name.as_str())
    }

    /// True for `""`, the whole document.
    pub fn is_root(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Appends one (unescaped) token: `/a` then `push("b/c")` is `/a/b~1c`.
    pub fn push(&mut self, token: &str) {
        self.tokens.push(Token::new(token.to_string()));
    }

    /// The value at this location, if present. Array tokens are decimal indices.
    pub fn query<'v>(&self, doc: &'v Value) -> Option<&'v Value> {
        let mut v = doc;
        for token in &self.tokens {
            v = match v {
                Value::Object(map) => map.get(token.name.as_str())?,
                Value::Array(items) => items.get(token.index?)?,
                _ => return None,
            };
        }
        Some(v)
    }

    /// [`Pointer::query`] of a compact document.
    pub fn query_doc<'d>(&self, doc: &'d Doc) -> Option<&'d Doc> {
        let mut d = doc;
        for token in &self.tokens {
            d = match d {
                Doc::Object(_) => d.get(token.name.as_str())?,
                Doc::Array(items) => items.get(token.index?)?,
                _ => return None,
            };
        }
        Some(d)
    }

    /// Like [`Pointer::query`], for changing the value in place.
    pub fn query_mut<'v>(&self, doc: &'v mut Value) -> Option<&'v mut Value> {
        let mut v = doc;
        for token in &self.tokens {
            v = match v {
                Value::Object(map) => map.get_mut(token.name.as_str())?,
                Value::Array(items) => items.get_mut(token.index?)?,
                _ => return None,
            };
        }
        Some(v)
    }

    /// The value at this location, creating what is missing on the way, as a reduction
    /// writing into a document needs. A `null` (or a missing property) along the way
    /// becomes an object, or an array when the next token is an index or `-`. An array is
    /// padded with nulls up to an index; `-` appends a null. A created location holds
    /// `null`. Returns `None` when a scalar, or an array with a non-index token, is in
    /// the way: the document is left unchanged in that case only if nothing was created
    /// before reaching it.
    pub fn create_mut<'v>(&self, doc: &'v mut Value) -> Option<&'v mut Value> {
        let mut v = doc;
        for token in &self.tokens {
            if v.is_null() {
                *v = if token.index.is_some() || token.name == "-" {
                    Value::Array(Vec::new())
                } else {
                    Value::Object(Map::new())
                };
            }
            v = match v {
                Value::Object(map) => {
                    // Not `entry`, which would allocate the key even when it is present.
                    if !map.contains_key(&token.name) {
                        map.insert(token.name.clone(), Value::Null);
                    }
                    map.get_mut(&token.name)?
                }
                Value::Array(items) => {
                    let index = match token.index {
                        Some(index) => index,
                        None if token.name == "-" => items.len(),
                        None => return None,
                    };
                    if items.len() <= index {
                        items.resize(index + 1, Value::Null);
                    }
                    &mut items[index]
                }
                _ => return None,
            };
        }
        Some(v)
    }
}

impl fmt::Display for Pointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for token in &self.tokens {
            f.write_str("/")?;
            for c in token.name.chars() {
                match c {
                    '~' => f.write_str("~0")?,
                    '/' => f.write_str("~1")?,
                    c => fmt::Write::write_char(f, c)?,
                }
            }
        }
        Ok(())
    }
}

impl FromStr for Pointer {
    type Err = PointerError;
    fn from_str(s: &str) -> Result<Pointer, PointerError> {
        Pointer::parse(s)
    }
}

impl serde::Serialize for Pointer {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Pointer {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Pointer, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Pointer::parse(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ptr(s: &str) -> Pointer {
        Pointer::parse(s).unwrap()
    }

    #[test]
    fn rfc6901_examples_resolve() {
        // The examples of RFC 6901 section 5.
        let doc = json!({
            "foo": ["bar", "baz"], "": 0, "a/b": 1, "c%d": 2, "e^f": 3,
            "g|h": 4, "i\\j": 5, "k\"l": 6, " ": 7, "m~n": 8
        });
        assert_eq!(ptr("").query(&doc), Some(&doc));
        assert_eq!(ptr("/foo").query(&doc), Some(&json!(["bar", "baz"])));
        assert_eq!(ptr("/foo/0").query(&doc), Some(&json!("bar")));
        let cases = [
            ("/", 0),
            ("/a~1b", 1),
            ("/c%d", 2),
            ("/e^f", 3),
            ("/g|h", 4),
            ("/i\\j", 5),
            ("/k\"l", 6),
            ("/ ", 7),
            ("/m~0n", 8),
        ];
        for (p, want) in cases {
            assert_eq!(ptr(p).query(&doc), Some(&json!(want)), "{p}");
        }
    }

    #[test]
    fn tilde_escapes_are_undone_in_order() {
        // "~01" is "~1" literally, not "/".
        assert_eq!(ptr("/~01").tokens().collect::<Vec<_>>(), ["~1"]);
        assert_eq!(ptr("/a~1b/~0").tokens().collect::<Vec<_>>(), ["a/b", "~"]);
    }

    #[test]
    fn malformed_pointers_are_rejected_with_the_pointer_named() {
        for bad in ["a", "a/b", "/~", "/~2", "/a~"] {
            let err = Pointer::parse(bad).unwrap_err();
            assert_eq!(err.pointer, bad);
            assert!(err.to_string().contains(&format!("{bad:?}")), "{err}");
        }
    }

    #[test]
    fn display_round_trips_escapes() {
        for s in ["", "/", "/a~1b/~0/0", "/~01", "//x"] {
            assert_eq!(ptr(s).to_string(), s);
        }
        let mut p = ptr("/a");
        p.push("b/c~");
        assert_eq!(p.to_string(), "/a/b~1c~0");
    }

    #[test]
    fn array_tokens_are_canonical_indices_only() {
        let doc = json!([10, 11]);
        assert_eq!(ptr("/1").query(&doc), Some(&json!(11)));
        assert_eq!(ptr("/01").query(&doc), None);
        assert_eq!(ptr("/-").query(&doc), None);
        assert_eq!(ptr("/+1").query(&doc), None);
        assert_eq!(ptr("/2").query(&doc), None);
        assert_eq!(ptr("/99999999999999999999999").query(&doc), None);
        // The same spellings are plain property names in an object.
        let obj = json!({"01": "a", "-": "b"});
        assert_eq!(ptr("/01").query(&obj), Some(&json!("a")));
        assert_eq!(ptr("/-").query(&obj), Some(&json!("b")));
    }

    #[test]
    fn missing_and_scalar_locations_query_as_none() {
        let doc = json!({"a": {"b": 1}, "s": "text"});
        assert_eq!(ptr("/a/c").query(&doc), None);
        assert_eq!(ptr("/s/0").query(&doc), None);
        assert_eq!(ptr("/a/b/c").query(&doc), None);
    }

    #[test]
    fn query_mut_changes_the_located_value() {
        let mut doc = json!({"a": [1, {"b": 2}]});
        *ptr("/a/1/b").query_mut(&mut doc).unwrap() = json!("x");
        assert_eq!(doc, json!({"a": [1, {"b": "x"}]}));
        assert!(ptr("/a/5").query_mut(&mut doc).is_none());
    }

    #[test]
    fn create_mut_builds_missing_objects_and_arrays() {
        let mut doc = json!({});
        *ptr("/a/b/c").create_mut(&mut doc).unwrap() = json!(1);
        assert_eq!(doc, json!({"a": {"b": {"c": 1}}}));

        *ptr("/list/2").create_mut(&mut doc).unwrap() = json!("z");
        *ptr("/list/-").create_mut(&mut doc).unwrap() = json!("end");
        assert_eq!(doc["list"], json!([null, null, "z", "end"]));

        // Existing values are returned, not replaced.
        assert_eq!(ptr("/a/b/c").create_mut(&mut doc), Some(&mut json!(1)));
    }

    #[test]
    fn create_mut_refuses_to_go_through_a_scalar() {
        let mut doc = json!({"a": 5, "arr": [1]});
        assert!(ptr("/a/b").create_mut(&mut doc).is_none());
        assert!(ptr("/arr/x").create_mut(&mut doc).is_none());
        assert_eq!(doc, json!({"a": 5, "arr": [1]}));
    }

    #[test]
    fn serde_uses_the_escaped_string_form() {
        let p: Pointer = serde_json::from_value(json!("/a~1b")).unwrap();
        assert_eq!(p.tokens().collect::<Vec<_>>(), ["a/b"]);
        assert_eq!(serde_json::to_value(&p).unwrap(), json!("/a~1b"));
        assert!(serde_json::from_value::<Pointer>(json!("nope")).is_err());
    }
}
