//! Parsing JSON text straight into a compact [`Doc`] ([`DocParser`]), with no `Value` in
//! between.
//!
//! ```text
//!  bytes ──UTF-8 check (whole)──▶ fast: byte parser for the common subset ──Some──▶ Doc
//!                                        │ None (anything it does not handle)
//!                                        └──▶ serde_json::from_slice::<Doc>(bytes) ──▶ Doc or Err
//! ```
//!
//! Why: the combiner parses every source line into a `Doc`. Through serde's visitors a
//! 160-byte flat object costs ~9,700 instructions (callgrind, glibc malloc): generic
//! machinery (a UTF-8 check per string, a map visitor, a `Vec` grown per object, a sort
//! comparing whole names) that a parser knowing its output can skip. The fast path takes
//! ~4,550 for the same line. It checks UTF-8 once for the whole text; finds string ends
//! eight bytes at a time; builds [`Str`]s straight from the text when they have no escape;
//! takes short names (most are) from a table of the names met before, as the documents of
//! one collection repeat them; keeps an object's fields on one reused stack until its `}`,
//! then makes them one exact block; and sorts only objects whose names are out of order,
//! comparing names by their first 8 bytes as one number.
//!
//! Exactness: the fast path declines (`None`) whatever it is not sure to read as
//! serde_json does: any syntax error, text that is not UTF-8, control characters or lone
//! surrogates in strings, nesting deeper than `MAX_DEPTH` (64). A number that is not a
//! plain integer of a `u64` or `i64` (a float, `-0`, a huge integer) it hands to serde_json
//! as its own text, so it rounds as serde_json rounds it (whatever serde_json's features).
//! So `DocParser::parse` returns exactly what `serde_json::from_slice::<Doc>` returns: the
//! same document, or the same error (message, line, column), whatever the text.

use crate::compact::{Doc, Field, Str};

/// Nesting the fast path follows before it leaves a document to serde_json (whose own
/// limit is 128): deeper than any record we have seen, and shallow enough that the fast
/// path's recursion stays a few KiB of stack.
const MAX_DEPTH: usize = 64;

/// Slots of [`DocParser::short_name`]'s table: more than the names of most collections, and
/// a power of two (a slot is the top bits of a hash).
const NAME_SLOTS: usize = 64;

/// Parses JSON text into a [`Doc`], exactly as `serde_json::from_slice::<Doc>` does but
/// faster for the common case (see the module docs). Keep one and reuse it: it holds the
/// stacks of the objects and arrays being read and the buffer strings with escapes are
/// decoded into, which then allocate only while they grow, and the names met before.
pub struct DocParser {
    /// The fields of the objects being read, innermost object's last, each with the
    /// [`order_key`] of its name.
    fields: Vec<(u64, Field)>,
    /// Short names met before, by their bytes (see [`DocParser::short_name`]).
    names: [(u64, Str); NAME_SLOTS],
    /// The items of the arrays being read, innermost array's last.
    items: Vec<Doc>,
    /// The string with escapes being decoded.
    unescaped: String,
}

impl Default for DocParser {
    fn default() -> DocParser {
        DocParser {
            fields: Vec::new(),
            // Bytes 0 are the empty name's: a slot not yet used holds a true entry.
            names: std::array::from_fn(|_| (0, Str::new(""))),
            items: Vec::new(),
            unescaped: String::new(),
        }
    }
}

impl DocParser {
    /// Exactly `serde_json::from_slice::<Doc>(bytes)`: the same document, or on bad text
    /// serde_json's own error (message, line, column).
    pub fn parse(&mut self, bytes: &[u8]) -> Result<Doc, serde_json::Error> {
        match self.fast(bytes) {
            Some(doc) => Ok(doc),
            None => serde_json::from_slice(bytes),
        }
    }

    /// The document, if the text is in the subset this parser reads itself (see the module
    /// docs); `None` says nothing about whether the text is valid.
    pub(crate) fn fast(&mut self, bytes: &[u8]) -> Option<Doc> {
        let text = std::str::from_utf8(bytes).ok()?;
        let mut reader = Reader { text, at: 0 };
        reader.skip_whitespace();
        let doc = self.value(&mut reader, 0);
        // A declined document leaves its open containers' parts behind.
        self.fields.clear();
        self.items.clear();
        reader.skip_whitespace();
        doc.filter(|_| reader.at == text.len())
    }

    /// The value starting at `r.at` (not whitespace), inside `depth` containers.
    fn value(&mut self, r: &mut Reader<'_>, depth: usize) -> Option<Doc> {
        match r.peek()? {
            b'"' => {
                r.at += 1;
                self.string(r).map(Doc::String)
            }
            b'{' if depth < MAX_DEPTH => self.object(r, depth + 1),
            b'[' if depth < MAX_DEPTH => self.array(r, depth + 1),
            b't' => r.literal(b"true", Doc::Bool(true)),
            b'f' => r.literal(b"false", Doc::Bool(false)),
            b'n' => r.literal(b"null", Doc::Null),
            b'-' | b'0'..=b'9' => r.number(),
            _ => None,
        }
    }

    /// The object whose `{` is at `r.at`.
    #[inline(never)]
    fn object(&mut self, r: &mut Reader<'_>, depth: usize) -> Option<Doc> {
        r.at += 1;
        r.skip_whitespace();
        if r.eat(b'}') {
            return Some(Doc::Object(Box::default()));
        }
        let start = self.fields.len();
        loop {
            if !r.eat(b'"') {
                return None;
            }
            let (key, name) = match self.short_name(r) {
                Some(known) => known,
                None => {
                    let name = self.string(r)?;
                    (order_key(name.as_bytes()), name)
                }
            };
            r.skip_whitespace();
            if !r.eat(b':') {
                return None;
            }
            r.skip_whitespace();
            let value = self.value(r, depth)?;
            self.fields.push((key, Field { name, value }));
            r.skip_whitespace();
            match r.next()? {
                b',' => r.skip_whitespace(),
                b'}' => return Some(Doc::Object(self.take_fields(start))),
                _ => return None,
            }
        }
    }

    /// The fields pushed since `start`, sorted by name with only the last of each name
    /// kept (as serde_json's map keeps it).
    fn take_fields(&mut self, start: usize) -> Box<[Field]> {
        let fields = &mut self.fields[start..];
        if !fields.windows(2).all(|pair| pair[0].0 < pair[1].0) {
            sort_fields(fields);
            let repeated =
                |pair: &[(u64, Field)]| pair[0].0 == pair[1].0 && pair[0].1.name == pair[1].1.name;
            if fields.windows(2).any(repeated) {
                let mut fields: Vec<Field> = self.fields.drain(start..).map(|(_, f)| f).collect();
                fields.dedup_by(|later, kept| {
                    let repeated = later.name == kept.name;
                    if repeated {
                        std::mem::swap(&mut later.value, &mut kept.value);
                    }
                    repeated
                });
                return fields.into_boxed_slice();
            }
        }
        self.fields.drain(start..).map(|(_, field)| field).collect()
    }

    /// The array whose `[` is at `r.at`.
    #[inline(never)]
    fn array(&mut self, r: &mut Reader<'_>, depth: usize) -> Option<Doc> {
        r.at += 1;
        r.skip_whitespace();
        if r.eat(b']') {
            return Some(Doc::Array(Box::default()));
        }
        let start = self.items.len();
        loop {
            let item = self.value(r, depth)?;
            self.items.push(item);
            r.skip_whitespace();
            match r.next()? {
                b',' => r.skip_whitespace(),
                b']' => return Some(Doc::Array(self.items.drain(start..).collect())),
                _ => return None,
            }
        }
    }

    /// The name whose opening `"` is just before `r.at`, with its order key, if it is
    /// short (up to 7 bytes, its closing quote in the next 8) and plain (no escape).
    ///
    /// The documents of one collection repeat the same names, so these are kept in a small
    /// table by their bytes: a name met before is one load, a lookup and a copy of its
    /// `Str` (inline at that length), where reading it anew builds the `Str` from its
    /// text. A slot holds one name's bytes exactly (zero above its length: no byte of a
    /// plain name is 0), so a hit is always that name.
    fn short_name(&mut self, r: &mut Reader<'_>) -> Option<(u64, Str)> {
        let chunk = r.text.as_bytes().get(r.at..r.at + 8)?;
        let word = u64::from_le_bytes(chunk.try_into().expect("a slice of 8 bytes"));
        let special = special_bytes(word);
        if special == 0 {
            return None;
        }
        let len = special.trailing_zeros() as usize / 8;
        if r.byte(r.at + len) != b'"' {
            return None;
        }
        let bytes = word & ((1 << (8 * len)) - 1);
        // Fibonacci hashing: the top bits of the product mix in every byte of the name.
        let slot =
            (bytes.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - NAME_SLOTS.ilog2())) as usize;
        let (known, name) = &mut self.names[slot];
        if *known != bytes {
            *known = bytes;
            *name = Str::new(&r.text[r.at..r.at + len]);
        }
        r.at += len + 1;
        // The bytes in text order, most significant first: the name's [`order_key`].
        Some((bytes.swap_bytes(), name.clone()))
    }

    /// The string whose opening `"` is just before `r.at`.
    fn string(&mut self, r: &mut Reader<'_>) -> Option<Str> {
        let start = r.at;
        let end = r.find_special(start)?;
        if r.byte(end) != b'"' {
            return self.escaped_string(r, start, end);
        }
        r.at = end + 1;
        // Both ends are next to an ASCII quote: char boundaries of the checked text.
        Some(Str::new(&r.text[start..end]))
    }

    /// The rest of a string whose first escape (or control character) is at `special`.
    #[inline(never)]
    fn escaped_string(&mut self, r: &mut Reader<'_>, start: usize, special: usize) -> Option<Str> {
        let decoded = &mut self.unescaped;
        decoded.clear();
        let (mut plain, mut special) = (start, special);
        loop {
            decoded.push_str(&r.text[plain..special]);
            r.at = special + 1;
            match r.byte(special) {
                b'"' => return Some(Str::new(decoded)),
                b'\\' => decoded.push(r.escape()?),
                // A control character, which JSON strings may not hold as they are.
                _ => return None,
            }
            plain = r.at;
            special = r.find_special(plain)?;
        }
    }
}

/// Sorts `fields` by name, stably (of two equal names the later one stays later): an
/// insertion sort whose comparisons are mostly of keys and which moves each field that is
/// out of order once, with the ones it passes, in one `memmove`.
fn sort_fields(fields: &mut [(u64, Field)]) {
    for unsorted in 1..fields.len() {
        let (sorted, rest) = fields.split_at(unsorted);
        let (key, next) = &rest[0];
        let at = sorted.partition_point(|(sorted_key, field)| {
            sorted_key < key || (sorted_key == key && field.name.as_bytes() <= next.name.as_bytes())
        });
        fields[at..=unsorted].rotate_right(1);
    }
}

/// A name's first 8 bytes (zero-padded) as a big-endian number: names whose keys differ
/// are in the order of their keys, so sorting fields mostly compares numbers.
fn order_key(name: &[u8]) -> u64 {
    match name.first_chunk() {
        Some(first) => u64::from_be_bytes(*first),
        None => (name.iter().enumerate())
            .fold(0, |key, (i, &byte)| key | u64::from(byte) << (56 - 8 * i)),
    }
}

/// The high bit of each byte of `word` (little-endian) that is a `"`, a `\` or a control
/// character, and maybe of bytes above such a byte (a borrow runs upwards), never below:
/// the lowest bit set marks the first such byte. Each mask is the classic "has a zero
/// byte" (`x - 0x01..01 & !x & 0x80..80`), of `word` xor the byte, or "has a byte below
/// 0x20" for control characters; bytes of 0x80 and above (UTF-8) never match.
fn special_bytes(word: u64) -> u64 {
    let quote = word ^ (ONES * u64::from(b'"'));
    let backslash = word ^ (ONES * u64::from(b'\\'));
    let zero_byte = |x: u64| x.wrapping_sub(ONES) & !x;
    let below_space = word.wrapping_sub(ONES * 0x20) & !word;
    (zero_byte(quote) | zero_byte(backslash) | below_space) & HIGH_BITS
}

/// A 1 in every byte of a word.
const ONES: u64 = u64::from_le_bytes([1; 8]);
/// The high bit of every byte of a word.
const HIGH_BITS: u64 = ONES * 0x80;

/// A position in text already checked to be UTF-8.
struct Reader<'t> {
    text: &'t str,
    at: usize,
}

impl Reader<'_> {
    fn byte(&self, at: usize) -> u8 {
        self.text.as_bytes()[at]
    }

    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.at).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let byte = self.peek()?;
        self.at += 1;
        Some(byte)
    }

    /// Steps over `byte` if it is the next one.
    fn eat(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        self.at += usize::from(found);
        found
    }

    /// JSON's whitespace, as serde_json skips it.
    fn skip_whitespace(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    fn literal(&mut self, word: &[u8], doc: Doc) -> Option<Doc> {
        let found = self.text.as_bytes()[self.at..].starts_with(word);
        if found {
            self.at += word.len();
        }
        found.then_some(doc)
    }

    /// Where the first `"`, `\` or control character at or after `from` is: what ends the
    /// plain run of a string, eight bytes at a time ([`special_bytes`]).
    fn find_special(&self, from: usize) -> Option<usize> {
        let bytes = self.text.as_bytes();
        let mut at = from;
        while let Some(chunk) = bytes.get(at..at + 8) {
            let word = u64::from_le_bytes(chunk.try_into().expect("a slice of 8 bytes"));
            let found = special_bytes(word);
            if found != 0 {
                return Some(at + found.trailing_zeros() as usize / 8);
            }
            at += 8;
        }
        let rest = bytes[at..]
            .iter()
            .position(|&b| b == b'"' || b == b'\\' || b < 0x20);
        rest.map(|offset| at + offset)
    }

    /// The character of the escape whose `\` is just before `self.at`.
    fn escape(&mut self) -> Option<char> {
        Some(match self.next()? {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => return self.unicode_escape(),
            _ => return None,
        })
    }

    /// The character of a `\uXXXX` escape (after its `u`), a surrogate pair taking two.
    fn unicode_escape(&mut self) -> Option<char> {
        let code = match self.hex4()? {
            high @ 0xD800..=0xDBFF => {
                if !self.text.as_bytes()[self.at..].starts_with(b"\\u") {
                    return None;
                }
                self.at += 2;
                let low = self.hex4()?;
                if !(0xDC00..=0xDFFF).contains(&low) {
                    return None;
                }
                0x10000 + ((high - 0xD800) << 10) + (low - 0xDC00)
            }
            // A lone low surrogate is an error; `from_u32` declines it.
            code => code,
        };
        char::from_u32(code)
    }

    fn hex4(&mut self) -> Option<u32> {
        let digits = self.text.as_bytes().get(self.at..self.at + 4)?;
        let mut code = 0;
        for &digit in digits {
            code = code * 16 + char::from(digit).to_digit(16)?;
        }
        self.at += 4;
        Some(code)
    }

    /// The number starting at `self.at`. A plain integer of at most 19 digits (so it fits
    /// a `u64`) is read here; every other number is handed to serde_json as its own text,
    /// so that floats round and big integers turn into floats exactly as serde_json does.
    fn number(&mut self) -> Option<Doc> {
        let bytes = self.text.as_bytes();
        let start = self.at;
        let negative = bytes[start] == b'-';
        let digits_start = start + usize::from(negative);
        let mut end = digits_start;
        let mut magnitude: u64 = 0;
        while let Some(&digit) = bytes.get(end)
            && digit.is_ascii_digit()
        {
            magnitude = magnitude
                .wrapping_mul(10)
                .wrapping_add(u64::from(digit - b'0'));
            end += 1;
        }
        let digits = end - digits_start;
        let plain = match digits {
            1 => true,
            2..=19 => bytes[digits_start] != b'0',
            _ => false,
        } && !matches!(bytes.get(end), Some(b'.' | b'e' | b'E'));
        if plain {
            self.at = end;
            if !negative {
                return Some(Doc::PosInt(magnitude));
            }
            // `-0` is serde_json's float -0.0 and below `i64::MIN` a float too.
            if let Some(n) = 0_i64.checked_sub_unsigned(magnitude)
                && n != 0
            {
                return Some(Doc::NegInt(n));
            }
        }
        self.number_by_serde_json(start)
    }

    /// The number starting at `start` that is not a plain integer, as serde_json reads it.
    #[inline(never)]
    fn number_by_serde_json(&mut self, start: usize) -> Option<Doc> {
        let rest = &self.text.as_bytes()[start..];
        let len = (rest.iter())
            .position(|b| !matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
            .unwrap_or(rest.len());
        self.at = start + len;
        // Ok only if all of it is one number, which is then all serde_json reads of it.
        serde_json::from_str::<Doc>(&self.text[start..self.at]).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::{DocParser, NAME_SLOTS};
    use crate::compact::Doc;

    /// Documents like the combiner's source lines, which the fast path must read itself.
    const COMMON: &[&str] = &[
        r#"{"user":"u-00012345","views":3,"bytes":1234,"last_seen":"2026-11-29T10:11:12Z","page":"/docs/page-12","tags":{"browser":"firefox","os":"linux"},"country":"de"}"#,
        r#"{"a":1,"b":-2,"c":2.5,"d":-1.25e-3,"e":true,"f":false,"g":null}"#,
        r#"{"text":"line\nbreak \"quoted\" back\\slash tab\t \u00e9 \ud83d\ude00 \/","k":"é😀"}"#,
        r#"{"nested":{"deeper":{"deepest":[1,[2,[3,{}]],[]]}},"list":[{"b":1,"a":2},"x",0.5]}"#,
        "  {\n  \"pretty\": [ 1 , 2 ],\r\n\t\"z\" : \"\" }  \n",
        r#"{"dup":1,"dup":2,"a":0}"#,
        r#"[18446744073709551615, 18446744073709551616, -9223372036854775808, -0, 1.5e300]"#,
        r#""a string of more than twenty-two bytes""#,
        "12",
        "null",
    ];

    #[test]
    fn fast_path_reads_common_documents_itself() {
        let mut parser = DocParser::default();
        for text in COMMON {
            let expected: Doc = serde_json::from_str(text).unwrap();
            assert_eq!(parser.fast(text.as_bytes()), Some(expected), "{text}");
        }
    }

    /// More short names than the table has slots, twice over: each slot is overwritten
    /// many times, and a name found in it is always the name in the text.
    #[test]
    fn short_names_stay_exact_past_the_tables_size() {
        let mut parser = DocParser::default();
        for round in 0..2 {
            for n in 0..4 * NAME_SLOTS {
                let text = format!(r#"{{"n{n}":{round},"{n}x":[{{"n{n}":"n{n}"}}],"a":1}}"#);
                let expected: Doc = serde_json::from_str(&text).unwrap();
                assert_eq!(parser.fast(text.as_bytes()), Some(expected), "{text}");
            }
        }
    }

    #[test]
    fn fast_path_declines_what_serde_json_rejects() {
        let deep = "[".repeat(65) + &"]".repeat(65);
        let rejected: &[&[u8]] = &[
            b"",
            b"1e400",
            br#""\ud800""#,
            br#""\udc00""#,
            b"\"tab\tinside\"",
            b"{\"a\":1} x",
            b"{\"a\":1,}",
            b"[1,]",
            b"01",
            b"\"\xff\"",
            b"tru",
            deep.as_bytes(),
        ];
        let mut parser = DocParser::default();
        for text in rejected {
            assert_eq!(parser.fast(text), None, "{}", String::from_utf8_lossy(text));
        }
    }
}
