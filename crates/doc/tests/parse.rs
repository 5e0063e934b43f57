//! `DocParser::parse` against its promise: whatever the bytes, exactly what
//! `serde_json::from_slice::<Doc>` gives — the same document (floats to the bit, fields
//! sorted with the last of a repeated name kept), or an error with the same message, line
//! and column. One parser serves every case, so stale scratch state would show.

use proptest::prelude::*;
use serde_json::Value;
use sluice_doc::compact::{Doc, Str};
use sluice_doc::parse::DocParser;
use std::cell::RefCell;
use std::fmt::Write;

thread_local! {
    static PARSER: RefCell<DocParser> = RefCell::new(DocParser::default());
}

/// Parses `bytes` with the shared parser and with serde_json, asserts they agree, and
/// returns the result.
fn parse_agreeing(bytes: &[u8]) -> Result<Doc, serde_json::Error> {
    let ours = PARSER.with(|parser| parser.borrow_mut().parse(bytes));
    let theirs = serde_json::from_slice::<Doc>(bytes);
    let shown = String::from_utf8_lossy(bytes);
    match (&ours, &theirs) {
        (Ok(ours), Ok(theirs)) => {
            assert_eq!(ours, theirs, "text: {shown}");
            // Text shows what `==` does not: -0.0 against 0.0, 1.0 against 1.
            assert_eq!(text(ours), text(theirs), "text: {shown}");
            let value: Value = serde_json::from_slice(bytes).expect("serde_json took it as a Doc");
            assert_eq!(ours, &Doc::from(value), "text: {shown}");
        }
        (Err(ours), Err(theirs)) => {
            assert_eq!(ours.to_string(), theirs.to_string(), "text: {shown}");
            assert_eq!(ours.classify(), theirs.classify(), "text: {shown}");
        }
        _ => panic!("ours {ours:?}, serde_json's {theirs:?}, text: {shown}"),
    }
    ours
}

fn text(doc: &Doc) -> String {
    serde_json::to_string(doc).expect("a Doc serializes")
}

fn parse_ok(text: &str) -> Doc {
    parse_agreeing(text.as_bytes()).expect("valid JSON")
}

fn parse_err(text: &str) -> String {
    parse_agreeing(text.as_bytes())
        .expect_err("invalid JSON")
        .to_string()
}

#[test]
fn repeated_names_keep_the_last_value_and_fields_come_sorted() {
    let doc = parse_ok(r#"{"b":1,"a":{"y":1,"x":2,"y":3},"b":2,"b":{"c":[]}}"#);
    assert_eq!(text(&doc), r#"{"a":{"x":2,"y":3},"b":{"c":[]}}"#);
}

#[test]
fn negative_zero_is_the_float_negative_zero() {
    let Doc::Float(zero) = parse_ok("-0") else {
        panic!("-0 is a float in serde_json")
    };
    assert!(zero == 0.0 && zero.is_sign_negative());
    assert_eq!(parse_ok("0"), Doc::PosInt(0));
}

#[test]
fn integers_past_u64_become_floats() {
    assert_eq!(parse_ok("18446744073709551615"), Doc::PosInt(u64::MAX));
    assert_eq!(
        parse_ok("18446744073709551616"),
        Doc::Float(18446744073709551616.0)
    );
}

#[test]
fn integers_below_i64_min_become_floats() {
    assert_eq!(parse_ok("-9223372036854775808"), Doc::NegInt(i64::MIN));
    assert_eq!(
        parse_ok("-9223372036854775809"),
        Doc::Float(-9223372036854775809.0)
    );
}

#[test]
fn float_out_of_range_is_serde_jsons_error() {
    assert_eq!(
        parse_err(r#"{"x": 1e400}"#),
        "number out of range at line 1 column 11"
    );
}

#[test]
fn lone_surrogate_is_serde_jsons_error() {
    assert_eq!(
        parse_err(r#"["\ud800"]"#),
        "unexpected end of hex escape at line 1 column 9"
    );
    assert_eq!(
        parse_err(r#""\udc00""#),
        "lone leading surrogate in hex escape at line 1 column 7"
    );
    assert_eq!(parse_ok(r#""\ud83d\ude00""#), Doc::String(Str::new("😀")));
}

#[test]
fn bad_escapes_are_serde_jsons_errors() {
    for text in [
        r#""\a""#,
        r#""\u12g4""#,
        r#""\u12""#,
        r#""\ud800\u0041""#,
        r#""\ud800\n""#,
    ] {
        parse_err(text);
    }
    assert_eq!(
        parse_err(r#"{"a": "\x"}"#),
        "invalid escape at line 1 column 9"
    );
}

#[test]
fn nesting_past_serde_jsons_limit_is_its_error() {
    let arrays = |n: usize| "[".repeat(n) + &"]".repeat(n);
    let objects = |n: usize| r#"{"a":"#.repeat(n) + "1" + &"}".repeat(n);
    // Deeper than the fast path goes, within serde_json's limit: still read.
    assert!(matches!(parse_ok(&arrays(100)), Doc::Array(_)));
    assert!(matches!(parse_ok(&objects(100)), Doc::Object(_)));
    assert_eq!(
        parse_err(&arrays(200)),
        "recursion limit exceeded at line 1 column 128"
    );
    assert_eq!(
        parse_err(&objects(200)),
        "recursion limit exceeded at line 1 column 636"
    );
}

#[test]
fn trailing_garbage_is_an_error_and_trailing_whitespace_is_not() {
    assert_eq!(
        parse_err(r#"{"a":1} x"#),
        "trailing characters at line 1 column 9"
    );
    assert_eq!(text(&parse_ok(" {\"a\":1}\r\n\t ")), r#"{"a":1}"#);
}

#[test]
fn empty_input_is_an_error() {
    assert_eq!(
        parse_err(""),
        "EOF while parsing a value at line 1 column 0"
    );
    assert_eq!(
        parse_err(" \n"),
        "EOF while parsing a value at line 2 column 0"
    );
}

/// Both sides of the length up to which a `Str` keeps its bytes inline.
#[test]
fn strings_around_the_inline_limit_parse_whole() {
    let lengths = 18..=30;
    assert!(Str::heap_len(*lengths.start()) == 0 && Str::heap_len(*lengths.end()) > 0);
    for len in lengths {
        let text = "x".repeat(len);
        let doc = parse_ok(&format!(r#"{{"{text}":"{text}"}}"#));
        assert_eq!(doc.get(&text), Some(&Doc::String(Str::new(&text))));
    }
}

/// A JSON value as text is written: objects may repeat and disorder names, numbers are
/// their literal text (which may be out of range).
#[derive(Debug, Clone)]
enum Json {
    Null,
    Bool(bool),
    Number(String),
    String(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

fn number_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<u64>().prop_map(|n| n.to_string()),
        (u64::MAX - 3..=u64::MAX).prop_map(|n| n.to_string()),
        any::<i64>().prop_map(|n| n.to_string()),
        (i64::MIN..i64::MIN + 3).prop_map(|n| n.to_string()),
        Just("-0".to_string()),
        Just("18446744073709551616".to_string()),
        Just("-9223372036854775809".to_string()),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| f.to_string()),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| format!("{f:e}")),
        "-?(0|[1-9][0-9]{0,24})(\\.[0-9]{1,20})?([eE][+-]?[0-9]{1,3})?",
    ]
}

fn string() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z_]{0,8}",
        "[a-z]{20,25}",
        any::<String>(),
        "[\\x00-\\x1f\"\\\\/a-z]{0,12}",
        "[é€😀\u{ffff}\u{10ffff}a]{0,8}",
    ]
}

/// Names from a small set, so objects repeat them.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![3 => "[a-d]{1,2}", 1 => string()]
}

fn json() -> impl Strategy<Value = Json> {
    let leaf = prop_oneof![
        Just(Json::Null),
        any::<bool>().prop_map(Json::Bool),
        number_text().prop_map(Json::Number),
        string().prop_map(Json::String),
    ];
    leaf.prop_recursive(5, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Json::Array),
            prop::collection::vec((name(), inner), 0..8).prop_map(Json::Object),
        ]
    })
}

/// How to write the text: indented or not, which characters to escape that need not be,
/// and what whitespace to put between tokens, both from a seed.
#[derive(Debug, Clone)]
struct Style {
    pretty: bool,
    escapes: bool,
    spaces: bool,
    seed: u64,
}

fn style() -> impl Strategy<Value = Style> {
    (any::<bool>(), any::<bool>(), any::<bool>(), any::<u64>()).prop_map(
        |(pretty, escapes, spaces, seed)| Style {
            pretty,
            escapes,
            spaces,
            seed: seed | 1,
        },
    )
}

struct Writer {
    style: Style,
    state: u64,
    out: String,
}

impl Writer {
    fn random(&mut self, below: u64) -> u64 {
        // xorshift64: deterministic per seed, so a failing case replays.
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state % below
    }

    fn space(&mut self, depth: usize) {
        if self.style.pretty {
            self.out.push('\n');
            self.out.push_str(&"  ".repeat(depth));
        }
        if self.style.spaces {
            for _ in 0..self.random(3) {
                let white = [' ', '\n', '\t', '\r'][self.random(4) as usize];
                self.out.push(white);
            }
        }
    }

    fn value(&mut self, json: &Json, depth: usize) {
        match json {
            Json::Null => self.out.push_str("null"),
            Json::Bool(b) => self.out.push_str(if *b { "true" } else { "false" }),
            Json::Number(text) => self.out.push_str(text),
            Json::String(s) => self.string(s),
            Json::Array(items) => {
                self.out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        self.out.push(',');
                    }
                    self.space(depth + 1);
                    self.value(item, depth + 1);
                }
                self.space(depth);
                self.out.push(']');
            }
            Json::Object(fields) => {
                self.out.push('{');
                for (i, (name, value)) in fields.iter().enumerate() {
                    if i > 0 {
                        self.out.push(',');
                    }
                    self.space(depth + 1);
                    self.string(name);
                    self.space(depth + 1);
                    self.out.push(':');
                    self.space(depth + 1);
                    self.value(value, depth + 1);
                }
                self.space(depth);
                self.out.push('}');
            }
        }
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            let must = c == '"' || c == '\\' || c < ' ';
            let chosen = self.style.escapes && self.random(3) == 0;
            if !(must || chosen) {
                self.out.push(c);
                continue;
            }
            let short = match c {
                '"' => Some('"'),
                '\\' => Some('\\'),
                '/' => Some('/'),
                '\u{8}' => Some('b'),
                '\u{c}' => Some('f'),
                '\n' => Some('n'),
                '\r' => Some('r'),
                '\t' => Some('t'),
                _ => None,
            };
            match short {
                Some(short) if self.random(2) == 0 => {
                    self.out.push('\\');
                    self.out.push(short);
                }
                _ => {
                    let upper = self.random(2) == 0;
                    for unit in c.encode_utf16(&mut [0; 2]) {
                        if upper {
                            write!(self.out, "\\u{unit:04X}").unwrap();
                        } else {
                            write!(self.out, "\\u{unit:04x}").unwrap();
                        }
                    }
                }
            }
        }
        self.out.push('"');
    }
}

fn write(json: &Json, style: Style) -> String {
    let state = style.seed;
    let mut writer = Writer {
        style,
        state,
        out: String::new(),
    };
    writer.space(0);
    writer.value(json, 0);
    writer.space(0);
    writer.out
}

/// A change that makes text likely invalid, or valid in another way.
#[derive(Debug, Clone)]
enum Mutation {
    Set(prop::sample::Index, u8),
    Insert(prop::sample::Index, u8),
    Remove(prop::sample::Index),
    Truncate(prop::sample::Index),
    Splice(prop::sample::Index, &'static [u8]),
}

/// Pieces of text that parsers get wrong: escapes good and bad, halves of surrogate pairs,
/// numbers at the edges, bytes that are not UTF-8.
const SNIPPETS: &[&[u8]] = &[
    b"\\",
    b"\\u",
    b"\\ud800",
    b"\\udc00",
    b"\\ud83d\\ude00",
    b"\\u00e9",
    b"\\uD83D",
    b"\\a",
    b"\\'",
    b"\\u12g4",
    b"-0",
    b"-",
    b"1e400",
    b"0.",
    b".5",
    b"1E+2",
    b"00",
    b"18446744073709551616",
    b"\x00",
    b"\xff",
    b"\xc3\xa9",
    b"\xc3",
    b"\xed\xa0\x80",
    b"\xf0\x9f\x98",
    b"[",
    b"{",
    b"]",
    b"}",
    b",",
    b"\"",
    b":",
    b"true",
    b"nul",
];

/// Bytes that matter to a JSON parser, plus invalid UTF-8 and control bytes.
fn interesting_byte() -> impl Strategy<Value = u8> {
    prop_oneof![
        prop::sample::select(b"{}[]\":,\\u0123456789-+.eEtrufalsn \t\n\r/".to_vec()),
        prop::sample::select(vec![0x00, 0x1f, 0x7f, 0x80, 0xbf, 0xc3, 0xed, 0xf0, 0xff]),
        any::<u8>(),
    ]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<prop::sample::Index>(), interesting_byte()).prop_map(|(i, b)| Mutation::Set(i, b)),
        (any::<prop::sample::Index>(), interesting_byte())
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        any::<prop::sample::Index>().prop_map(Mutation::Remove),
        any::<prop::sample::Index>().prop_map(Mutation::Truncate),
        (any::<prop::sample::Index>(), prop::sample::select(SNIPPETS))
            .prop_map(|(i, snippet)| Mutation::Splice(i, snippet)),
    ]
}

fn mutate(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for mutation in mutations {
        let len = bytes.len();
        match mutation {
            Mutation::Insert(at, byte) => bytes.insert(at.index(len + 1), *byte),
            Mutation::Splice(at, snippet) => {
                let at = at.index(len + 1);
                bytes.splice(at..at, snippet.iter().copied());
            }
            _ if len == 0 => {}
            Mutation::Set(at, byte) => bytes[at.index(len)] = *byte,
            Mutation::Remove(at) => {
                bytes.remove(at.index(len));
            }
            Mutation::Truncate(at) => bytes.truncate(at.index(len)),
        }
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, failure_persistence: None, ..ProptestConfig::default() })]

    /// Valid text in every writing style: the same document as serde_json's.
    #[test]
    fn any_json_text_parses_as_serde_json_parses_it(json in json(), style in style()) {
        parse_agreeing(write(&json, style).as_bytes()).ok();
    }

    /// Broken text: the same error as serde_json's (or the same document, when the change
    /// left it valid).
    #[test]
    fn mutated_json_text_fails_as_serde_json_fails(
        json in json(),
        style in style(),
        mutations in prop::collection::vec(mutation(), 1..4),
    ) {
        parse_agreeing(&mutate(write(&json, style).into_bytes(), &mutations)).ok();
    }

    /// Broken variants of one document, each read after the document itself, so the parser
    /// holds templates of its objects that match the broken text up to the break: the same
    /// results as serde_json's.
    #[test]
    fn variants_of_a_document_read_after_it_parse_as_serde_json_parses_them(
        json in json(),
        style in style(),
        variants in prop::collection::vec(prop::collection::vec(mutation(), 1..3), 1..4),
    ) {
        let text = write(&json, style).into_bytes();
        for mutations in &variants {
            parse_agreeing(&text).ok();
            parse_agreeing(&mutate(text.clone(), mutations)).ok();
        }
    }

    /// Decimals in and around the range the parser reads without serde_json (significands
    /// up to 2^53, powers of ten up to 10^±22), the point anywhere: the same float as
    /// serde_json's, to the bit.
    #[test]
    fn short_decimals_round_as_serde_json_rounds(
        significand in prop_oneof![
            0..=1_u64 << 53,
            (1_u64 << 53) - 2..=(1_u64 << 53) + 2,
            0..1_000_u64,
            any::<u64>(),
        ],
        point in any::<prop::sample::Index>(),
        exponent in prop::option::of(-30..=30_i32),
        negative in any::<bool>(),
    ) {
        let digits = significand.to_string();
        let point = 1 + point.index(digits.len());
        let (int, fraction) = digits.split_at(point);
        let mut text = format!("{}{int}", if negative { "-" } else { "" });
        if !fraction.is_empty() {
            write!(text, ".{fraction}").unwrap();
        }
        if let Some(exponent) = exponent {
            write!(text, "e{exponent}").unwrap();
        }
        parse_agreeing(text.as_bytes()).expect("a valid number");
    }

    #[test]
    fn random_bytes_fail_as_serde_json_fails(
        bytes in prop_oneof![
            prop::collection::vec(any::<u8>(), 0..64),
            prop::collection::vec(interesting_byte(), 0..64),
        ],
    ) {
        parse_agreeing(&bytes).ok();
    }
}
