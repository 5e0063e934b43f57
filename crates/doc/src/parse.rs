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
//! comparing whole names) that a parser knowing its output can skip. It checks UTF-8 once
//! for the whole text; finds string ends eight bytes at a time; builds [`Str`]s straight
//! from the text when they have no escape.
//!
//! The documents of one collection repeat the shapes of their objects, so an object is
//! first read by the [`Template`] of its place (the object opened at that place, counted
//! in text order, last time; the objects past the first [`TEMPLATES`] share one place):
//! its names' spellings are matched against the text as words and each value is put
//! straight into its field of the name-ordered block. An object that does not match is
//! read the general way, which then becomes the place's template: names of up to 16 bytes
//! come from a table of the names met before; fields stay on one reused stack until the
//! `}`, then move once into one exact block, in name order, sorted by their names' first
//! 8 bytes (as numbers).
//!
//! Cost of the combine bench's line (release binary, mimalloc, callgrind): ~3,100
//! instructions by template, ~4,600 the general way, ~9,700 through serde's visitors.
//!
//! Exactness: the fast path declines (`None`) whatever it is not sure to read as
//! serde_json does: any syntax error, text that is not UTF-8, control characters or lone
//! surrogates in strings, nesting deeper than `MAX_DEPTH` (64). It reads integers of a
//! `u64` or `i64` and decimals whose digits make at most 2^53 with a power of ten up to
//! 10^±22, which one exact multiplication or division rounds correctly, as serde_json
//! does. Any other number (`-0`, a huge integer, a longer or farther float) it hands to
//! serde_json as its own text, so it rounds as serde_json rounds it. So
//! `DocParser::parse` returns exactly what `serde_json::from_slice::<Doc>` returns: the
//! same document, or the same error (message, line, column), whatever the text.

use crate::compact::{Doc, Field, Str, same_bytes};

/// Nesting the fast path follows before it leaves a document to serde_json (whose own
/// limit is 128): deeper than any record we have seen, and shallow enough that the fast
/// path's recursion stays a few KiB of stack.
const MAX_DEPTH: usize = 64;

/// Slots of [`DocParser::name`]'s table: more than the names of most collections, and a
/// power of two (a slot is the top bits of a hash).
const NAME_SLOTS: usize = 64;

/// The longest name [`DocParser::name`] keeps in its table: its first and last 8 bytes then
/// hold all of it, and it is inline in its [`Str`], so a name found there is copied, never
/// allocated.
const CACHED_NAME_LEN: usize = 16;

/// Templates a parser keeps: one for each of the first objects a document opens, more than
/// the objects of most records; the objects opened after those share the last (as the
/// items of a long array of objects of one shape do well to).
const TEMPLATES: usize = 16;

/// The most objects a miss of a [`Template`] sends the general way (see
/// [`Template::missed`]): objects of varying shapes then pay for a miss and a learning
/// once in this many.
const MAX_BACKOFF: u32 = 64;

/// Parses JSON text into a [`Doc`], exactly as `serde_json::from_slice::<Doc>` does but
/// faster for the common case (see the module docs). Keep one and reuse it: it holds the
/// stacks of the objects and arrays being read and the buffer strings with escapes are
/// decoded into, which then allocate only while they grow, and the names met before.
pub struct DocParser {
    /// The fields of the objects being read, innermost object's last; a field is taken
    /// (`None`) when its object's block is built in name order.
    fields: Vec<Option<Field>>,
    /// For each of `fields`, the [`order_key`] of its name and its position there: what an
    /// object out of order sorts instead of its 48-byte fields.
    keys: Vec<(u64, usize)>,
    /// Names met before (see [`DocParser::name`]).
    names: [KnownName; NAME_SLOTS],
    /// The items of the arrays being read, innermost array's last.
    items: Vec<Doc>,
    /// The string with escapes being decoded.
    unescaped: String,
    /// For each of `fields`, where its name's spelling starts and ends in the text (the
    /// `"` and just past the `:`): what a [`Template`] learns.
    spellings: Vec<(usize, usize)>,
    /// What the objects opened first in a document looked like the last time, by the
    /// order in which they open (see [`DocParser::object_by_template`]).
    templates: Vec<Template>,
    /// The objects opened so far in the document being read.
    opened: usize,
    /// The text positions of the last object's fields in name order, as
    /// [`DocParser::take_fields`] built its block; empty if a name repeated.
    order: Vec<usize>,
}

/// The names of an object, as the text spelled them, and their order: the documents of
/// one collection mostly repeat the shapes of their objects, so the next object opened at
/// the same place is read by matching its spellings, with no name to find, hash, copy out
/// of the text or sort: each value goes straight to its field in the block.
/// Empty when there is none to match.
#[derive(Default)]
struct Template {
    /// Each field's name as the text spells it, from its `"` to just past its `:`, in
    /// text order and back to back.
    spellings: Vec<u8>,
    /// Where each field's spelling ends in `spellings`.
    ends: Vec<usize>,
    /// For each field in text order, its position in name order (names are unique).
    slots: Vec<usize>,
    /// The names, in name order.
    names: Vec<Str>,
    /// Objects at this place still to read the general way before the last of them is
    /// learned (see [`Template::missed`]).
    rest: u32,
    /// How many objects the last miss sent the general way (0 after a hit).
    backoff: u32,
}

impl Template {
    /// After the template did not match: this object and the next ones at its place, twice
    /// as many as after the miss before when no hit came between (up to [`MAX_BACKOFF`]),
    /// are read the general way, and the last of them becomes the template. A shape that
    /// changed for good is learned at once, while objects whose shapes vary (optional
    /// fields, several kinds of record) mostly skip the template and its learning, which
    /// would cost them more than they save. Whether this object is to be learned.
    fn missed(&mut self) -> bool {
        self.backoff = (self.backoff * 2).clamp(1, MAX_BACKOFF);
        self.rest = self.backoff - 1;
        self.rest == 0
    }
}

/// A slot of [`DocParser::name`]'s table.
struct KnownName {
    /// The name's [`order_key`]: its first 8 bytes.
    key: u64,
    /// Its last 8 bytes if it is longer than 8, else 0.
    tail: u64,
    len: usize,
    name: Str,
}

impl Default for DocParser {
    fn default() -> DocParser {
        DocParser {
            fields: Vec::new(),
            keys: Vec::new(),
            // A slot not yet used holds the empty name, truly.
            names: std::array::from_fn(|_| KnownName {
                key: 0,
                tail: 0,
                len: 0,
                name: Str::new(""),
            }),
            items: Vec::new(),
            unescaped: String::new(),
            spellings: Vec::new(),
            templates: Vec::new(),
            opened: 0,
            order: Vec::new(),
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
        self.opened = 0;
        let doc = self.value(&mut reader, 0);
        // A declined document leaves its open containers' parts behind.
        self.fields.clear();
        self.keys.clear();
        self.spellings.clear();
        self.items.clear();
        reader.skip_whitespace();
        doc.filter(|_| reader.at == text.len())
    }

    /// The value starting at `r.at` (not whitespace), inside `depth` containers. Inline in
    /// every caller (objects and arrays are out of line, which ends the recursion): most
    /// values are strings and numbers, read where their field is.
    #[inline(always)]
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

    /// The object whose `{` is at `r.at`: by its place's [`Template`] if it matches, else
    /// read the general way, and then maybe learned as the template of its place.
    #[inline(never)]
    fn object(&mut self, r: &mut Reader<'_>, depth: usize) -> Option<Doc> {
        let (open, opened) = (r.at, self.opened);
        let place = opened.min(TEMPLATES - 1);
        let learn = match self.templates.get_mut(place) {
            None => true,
            Some(template) if template.rest > 0 => {
                template.rest -= 1;
                template.rest == 0
            }
            Some(_) => match self.object_by_template(r, depth, place) {
                Some(doc) => return Some(doc),
                None => self.templates[place].missed(),
            },
        };
        // Read again past the `{`, its inner objects at the same places as before.
        (r.at, self.opened) = (open + 1, opened + 1);
        r.skip_whitespace();
        if r.eat(b'}') {
            return Some(Doc::Object(Box::default()));
        }
        let start = self.fields.len();
        loop {
            let spelling_start = r.at;
            if !r.eat(b'"') {
                return None;
            }
            let (key, name) = self.name(r)?;
            r.skip_whitespace();
            if !r.eat(b':') {
                return None;
            }
            let spelling = (spelling_start, r.at);
            r.skip_whitespace();
            let value = self.value(r, depth)?;
            self.spellings.push(spelling);
            self.keys.push((key, self.fields.len()));
            self.fields.push(Some(Field { name, value }));
            r.skip_whitespace();
            match r.next()? {
                b',' => r.skip_whitespace(),
                b'}' => {
                    let block = self.take_fields(start);
                    if learn {
                        self.learn_template(place, r.text, start, &block);
                    }
                    self.spellings.truncate(start);
                    return Some(Doc::Object(block));
                }
                _ => return None,
            }
        }
    }

    /// The object whose `{` is at `r.at`, if the [`Template`] of its `place` (the objects
    /// opened before it in the document) spells its names: the same names in the same
    /// order, each as the same text, and no others. `None` otherwise, having read part of
    /// it.
    fn object_by_template(
        &mut self,
        r: &mut Reader<'_>,
        depth: usize,
        place: usize,
    ) -> Option<Doc> {
        let mut template = std::mem::take(self.templates.get_mut(place)?);
        self.opened += 1;
        let doc = self.read_by_template(r, depth, &template);
        if doc.is_some() {
            template.backoff = 0;
        }
        self.templates[place] = template;
        doc
    }

    fn read_by_template(
        &mut self,
        r: &mut Reader<'_>,
        depth: usize,
        template: &Template,
    ) -> Option<Doc> {
        let &last = template.ends.last()?;
        r.at += 1;
        r.skip_whitespace();
        // An object of another shape mostly differs in its first name: no block for it.
        if !r.spells(&template.spellings[..template.ends[0]]) {
            return None;
        }
        let mut block: Box<[Field]> = (template.names.iter())
            .map(|name| Field {
                name: name.clone(),
                value: Doc::Null,
            })
            .collect();
        let mut from = 0;
        for (&end, &slot) in template.ends.iter().zip(&template.slots) {
            let spelling = &template.spellings[from..end];
            if !r.spells(spelling) {
                return None;
            }
            r.at += spelling.len();
            r.skip_whitespace();
            let value = self.value(r, depth)?;
            // The null put there above owns nothing: not dropping it saves a call per field.
            std::mem::forget(std::mem::replace(&mut block[slot].value, value));
            r.skip_whitespace();
            let closing = if end == last { b'}' } else { b',' };
            if r.next()? != closing {
                return None;
            }
            r.skip_whitespace();
            from = end;
        }
        Some(Doc::Object(block))
    }

    /// Makes the object just read from `text` (its spellings pushed since `start`, its
    /// `block` built in [`DocParser::order`]) the [`Template`] of `place`; or leaves
    /// `place` with none if a name repeated (the template path would not keep only the
    /// last).
    #[inline(never)]
    fn learn_template(&mut self, place: usize, text: &str, start: usize, block: &[Field]) {
        if self.templates.len() <= place {
            self.templates.resize_with(place + 1, Template::default);
        }
        let template = &mut self.templates[place];
        template.spellings.clear();
        template.ends.clear();
        template.slots.clear();
        template.names.clear();
        if self.order.is_empty() {
            return;
        }
        for &(from, to) in &self.spellings[start..] {
            template
                .spellings
                .extend_from_slice(&text.as_bytes()[from..to]);
            template.ends.push(template.spellings.len());
        }
        template.slots.resize(block.len(), 0);
        for (slot, &at) in self.order.iter().enumerate() {
            template.slots[at] = slot;
        }
        (template.names).extend(block.iter().map(|field| field.name.clone()));
    }

    /// The fields pushed since `start`, sorted by name with only the last of each name
    /// kept (as serde_json's map keeps it), in one exact block. Sorting compares their
    /// names' first 8 bytes as numbers ([`order_key`]), and whole names only where those
    /// tie. Leaves the text positions of the block's fields in [`DocParser::order`].
    fn take_fields(&mut self, start: usize) -> Box<[Field]> {
        let keys = &mut self.keys[start..];
        self.order.clear();
        if !keys.windows(2).all(|pair| pair[0].0 < pair[1].0) {
            keys.sort_unstable();
            if keys.windows(2).any(|pair| pair[0].0 == pair[1].0) {
                return self.take_fields_by_name(start);
            }
        }
        (self.order).extend(keys.iter().map(|&(_, at)| at - start));
        let fields = &mut self.fields[start..];
        let block = (self.order.iter())
            .map(|&at| fields[at].take().expect("each field is taken once"))
            .collect();
        self.keys.truncate(start);
        self.fields.truncate(start);
        block
    }

    /// [`DocParser::take_fields`] when some names share their first 8 bytes (so their keys
    /// are equal), their fields sorted by key and position.
    #[inline(never)]
    fn take_fields_by_name(&mut self, start: usize) -> Box<[Field]> {
        let (keys, fields) = (&mut self.keys[start..], &mut self.fields);
        // Stable: fields of the same name stay in text order.
        keys.sort_by(|&(key, at), &(other_key, other_at)| {
            (key.cmp(&other_key))
                .then_with(|| field_name(fields, at).cmp(field_name(fields, other_at)))
        });
        let repeats = |fields: &[Option<Field>], pair: &[(u64, usize)]| {
            pair[0].0 == pair[1].0 && field_name(fields, pair[0].1) == field_name(fields, pair[1].1)
        };
        // Of repeated names, the last in text order is kept.
        let mut kept = Vec::with_capacity(keys.len());
        for (i, &(_, at)) in keys.iter().enumerate() {
            let superseded = keys.get(i..i + 2).is_some_and(|pair| repeats(fields, pair));
            let field = fields[at].take().expect("each field is taken once");
            if !superseded {
                kept.push(field);
                self.order.push(at - start);
            }
        }
        if kept.len() < keys.len() {
            self.order.clear();
        }
        self.keys.truncate(start);
        self.fields.truncate(start);
        kept.into_boxed_slice()
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

    /// The name whose opening `"` is just before `r.at`, with its [`order_key`].
    ///
    /// The documents of one collection repeat the same names, so plain ones (no escape) of
    /// up to [`CACHED_NAME_LEN`] bytes are kept in a small table: a name met before is
    /// three word comparisons and a copy of its inline `Str`, where reading it anew builds
    /// the `Str` from its text. Its first and last 8 bytes and its length tell such a name
    /// from every other (a plain name holds no byte 0), so a hit is always the name in the
    /// text.
    fn name(&mut self, r: &mut Reader<'_>) -> Option<(u64, Str)> {
        let start = r.at;
        let end = r.find_special(start)?;
        if r.byte(end) != b'"' {
            let name = self.escaped_string(r, start, end)?;
            return Some((order_key(name.as_bytes()), name));
        }
        r.at = end + 1;
        // Both ends are next to an ASCII quote: char boundaries of the checked text.
        let text = &r.text[start..end];
        let len = text.len();
        let key = r.order_key_at(start, len);
        if len > CACHED_NAME_LEN {
            return Some((key, Str::new(text)));
        }
        let tail = match len.checked_sub(8) {
            Some(from) => r.word_at(start + from),
            None => 0,
        };
        let hash = key ^ tail ^ len as u64;
        // Fibonacci hashing: the top bits of the product mix in every bit of the hash.
        let slot = (hash.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - NAME_SLOTS.ilog2())) as usize;
        let known = &mut self.names[slot];
        if (known.key, known.tail, known.len) != (key, tail, len) {
            *known = KnownName {
                key,
                tail,
                len,
                name: Str::new(text),
            };
        }
        Some((key, known.name.clone()))
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

/// The name of the field at `at` on the stack, which is there until its object is built.
fn field_name(fields: &[Option<Field>], at: usize) -> &[u8] {
    fields[at]
        .as_ref()
        .map_or(&[], |field| field.name.as_bytes())
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

/// The digits from `at` on, accumulated onto `value` (wrapping past `u64`), and where they
/// end.
fn digits(bytes: &[u8], at: usize, value: u64) -> (u64, usize) {
    let (mut value, mut end) = (value, at);
    while let Some(&digit) = bytes.get(end)
        && digit.is_ascii_digit()
    {
        value = value.wrapping_mul(10).wrapping_add(u64::from(digit - b'0'));
        end += 1;
    }
    (value, end)
}

/// `significand × 10^exponent` when both are exact as `f64`s (the significand up to 2^53,
/// the power of ten up to 10^22): one IEEE multiplication or division of exact operands is
/// correctly rounded, so it is the float serde_json's correctly rounding parser reads from
/// the same text (Clinger's fast path). `None` for every other decimal.
fn exact_float(significand: u64, exponent: i64) -> Option<f64> {
    const EXACT_SIGNIFICAND: u64 = 1 << f64::MANTISSA_DIGITS;
    const POWERS_OF_TEN: [f64; 23] = [
        1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
        1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
    ];
    if significand > EXACT_SIGNIFICAND {
        return None;
    }
    // Exact: the significand has at most 53 significant bits.
    let significand = significand as f64;
    let power = *POWERS_OF_TEN.get(usize::try_from(exponent.unsigned_abs()).ok()?)?;
    Some(if exponent < 0 {
        significand / power
    } else {
        significand * power
    })
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

    /// The 8 bytes at `at` (which has 8 bytes of text after it) as a little-endian number.
    fn word_at(&self, at: usize) -> u64 {
        let chunk = &self.text.as_bytes()[at..at + 8];
        u64::from_le_bytes(chunk.try_into().expect("a slice of 8 bytes"))
    }

    /// The [`order_key`] of the `len` bytes at `at`: one load when 8 bytes of text follow.
    fn order_key_at(&self, at: usize, len: usize) -> u64 {
        let bytes = self.text.as_bytes();
        match bytes.get(at..at + 8) {
            Some(chunk) => {
                let word = u64::from_be_bytes(chunk.try_into().expect("a slice of 8 bytes"));
                // Keeps the name's bytes, the most significant ones.
                word & !(u64::MAX.checked_shr(8 * len.min(8) as u32).unwrap_or(0))
            }
            None => order_key(&bytes[at..at + len]),
        }
    }

    /// Whether the text at `self.at` starts with `spelling` ([`same_bytes`]: no call into
    /// `memcmp` for the usual names).
    fn spells(&self, spelling: &[u8]) -> bool {
        let text = self.text.as_bytes().get(self.at..self.at + spelling.len());
        text.is_some_and(|text| same_bytes(text, spelling))
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

    /// The number starting at `self.at`: read here if it is a [`Reader::short_number`],
    /// else handed to serde_json as its own text, so that floats round and big integers
    /// turn into floats exactly as serde_json does.
    fn number(&mut self) -> Option<Doc> {
        let start = self.at;
        match self.short_number() {
            Some(doc) => Some(doc),
            None => self.number_by_serde_json(start),
        }
    }

    /// The number starting at `self.at`, if it is an integer of at most 19 digits (so it
    /// fits a `u64`) other than `-0`, or a decimal [`exact_float`] reads; moves past it
    /// then. `None` says nothing about whether the number is valid.
    fn short_number(&mut self) -> Option<Doc> {
        let bytes = self.text.as_bytes();
        let start = self.at;
        let negative = bytes[start] == b'-';
        let int_start = start + usize::from(negative);
        let (magnitude, int_end) = digits(bytes, int_start, 0);
        let int_digits = int_end - int_start;
        let canonical = match int_digits {
            1 => true,
            2..=19 => bytes[int_start] != b'0',
            _ => false,
        };
        if !canonical {
            return None;
        }
        if let Some(b'.' | b'e' | b'E') = bytes.get(int_end) {
            let float = self.short_decimal(magnitude, int_digits, int_end)?;
            return Some(Doc::Float(if negative { -float } else { float }));
        }
        let doc = if negative {
            // `-0` is serde_json's float -0.0 and below `i64::MIN` a float too.
            Doc::NegInt(0_i64.checked_sub_unsigned(magnitude).filter(|&n| n != 0)?)
        } else {
            Doc::PosInt(magnitude)
        };
        self.at = int_end;
        Some(doc)
    }

    /// The magnitude of a decimal whose integer part (`int_digits` digits, `int` in value)
    /// ends at `at`, where its fraction or exponent starts, if [`exact_float`] gives it;
    /// moves past it then.
    fn short_decimal(&mut self, int: u64, int_digits: usize, at: usize) -> Option<f64> {
        let bytes = self.text.as_bytes();
        let (mut significand, mut end, mut fraction_digits) = (int, at, 0);
        if bytes[end] == b'.' {
            (significand, end) = digits(bytes, at + 1, int);
            fraction_digits = end - at - 1;
            // A fraction needs a digit; past 19 digits the significand may have wrapped.
            if fraction_digits == 0 || int_digits + fraction_digits > 19 {
                return None;
            }
        }
        let mut exponent = 0;
        if let Some(b'e' | b'E') = bytes.get(end) {
            let negative = bytes.get(end + 1) == Some(&b'-');
            let exponent_start =
                end + 1 + usize::from(matches!(bytes.get(end + 1), Some(b'+' | b'-')));
            let (magnitude, exponent_end) = digits(bytes, exponent_start, 0);
            // Beyond 3 digits the exponent is far out of the exact range, or has zeros ahead.
            if !(1..=3).contains(&(exponent_end - exponent_start)) {
                return None;
            }
            let magnitude = i64::try_from(magnitude).ok()?;
            exponent = if negative { -magnitude } else { magnitude };
            end = exponent_end;
        }
        let fraction_digits = i64::try_from(fraction_digits).ok()?;
        let float = exact_float(significand, exponent - fraction_digits)?;
        self.at = end;
        Some(float)
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
    use super::{CACHED_NAME_LEN, DocParser, NAME_SLOTS, Reader, TEMPLATES};
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

    /// More names than the table has slots, twice over, of every length up to past the
    /// longest kept, many sharing their first 8 bytes: each slot is overwritten many
    /// times, and a name found in it is always the name in the text.
    #[test]
    fn names_stay_exact_past_the_tables_size() {
        let mut parser = DocParser::default();
        for round in 0..2 {
            for n in 0..4 * NAME_SLOTS {
                let pad = "x".repeat(n % (CACHED_NAME_LEN + 2));
                let text = format!(
                    r#"{{"n{n}{pad}":{round},"{pad}{n}":[{{"n{n}{pad}":"n{n}"}}],"a":1,"{pad}":2}}"#
                );
                let expected: Doc = serde_json::from_str(&text).unwrap();
                assert_eq!(parser.fast(text.as_bytes()), Some(expected), "{text}");
            }
        }
    }

    /// Objects in and out of order, of the same names or others, with a name repeated or
    /// names sharing their first 8 bytes, one after another at the same places: all come
    /// out sorted, the last of a repeated name kept, as serde_json's.
    #[test]
    fn objects_of_any_names_come_out_sorted_at_every_place() {
        let texts = [
            r#"{"b":1,"a":2,"c":3}"#,
            r#"{"b":"x","a":[],"c":{"z":1,"y":2}}"#,
            r#"{"b":1,"c":2,"a":3}"#,
            r#"{"b":1,"a":2}"#,
            r#"{"b":1,"a":2,"b":3}"#,
            r#"{"b":1,"a":2,"c":3}"#,
            r#"{"b":1,"a":2,"d":3}"#,
            r#"{"name_of_9":1,"name_of_8":2}"#,
            r#"{"name_of_9":1,"name_of_9":2,"name_of_8":3}"#,
            r#"{"b":1,"a":{"b":1,"a":{"b":1,"a":2}}}"#,
        ];
        let mut parser = DocParser::default();
        for text in texts.iter().chain(&texts) {
            let expected: Doc = serde_json::from_str(text).unwrap();
            assert_eq!(parser.fast(text.as_bytes()), Some(expected), "{text}");
        }
    }

    /// An object read before at the same place of a document is read by its template when
    /// its names are spelled the same; any other object (a name more or less, renamed,
    /// reordered, respelled, repeated, or a value the fast path declines) is read the
    /// general way, and all agree with serde_json.
    #[test]
    fn objects_at_a_place_seen_before_read_by_template_and_others_the_general_way() {
        let base = r#"{"b":1,"a":{"y":"x","x":[{"q":1,"p":2}]},"c":"z"}"#;
        let variants = [
            base,
            r#"{"b":2,"a":{"y":"w","x":[{"q":3,"p":4},{"q":5,"p":6}]},"c":"v"}"#,
            r#"{"b":1,"a":{"y":"x","x":[]},"c":"z","d":0}"#,
            r#"{"b":1,"a":{"y":"x","x":[]}}"#,
            r#"{"b":1,"c":"z","a":{"y":"x","x":[]}}"#,
            r#"{"b":1,"a2":{"y":"x","x":[]},"c":"z"}"#,
            r#"{"b" :1,"a": {"y":"x","x":[]} ,"c":"z"}"#,
            r#"{"b":1,"a":{"y":"x","x":[]},"c":"z"}"#,
            r#"{"b":1,"b":{"y":"x","x":[]},"c":"z"}"#,
            r#"{"b":1,"a":{"y":"x","x":[]},"c":"z""#,
            r#"{"b":1,"a":{"y":"x","x":[]},"c":"z"}}"#,
            r#"{"b":1e400,"a":{"y":"x","x":[]},"c":"z"}"#,
            r#"{"b":1,"a":{"y":"x","y":"x"},"c":"z"}"#,
            r#"{"b":{},"a":{},"c":{}}"#,
        ];
        let mut parser = DocParser::default();
        for text in variants.iter().chain(&variants) {
            let expected = serde_json::from_str::<Doc>(text).ok();
            let ours = parser
                .fast(text.as_bytes())
                .or_else(|| parser.parse(text.as_bytes()).ok());
            assert_eq!(ours, expected, "{text}");
        }
        // The outer object of the base document is read by its template.
        let expected: Doc = serde_json::from_str(base).unwrap();
        assert_eq!(parser.fast(base.as_bytes()), Some(expected.clone()));
        parser.opened = 0;
        let mut reader = Reader { text: base, at: 0 };
        assert_eq!(parser.object_by_template(&mut reader, 1, 0), Some(expected));
        assert_eq!(reader.at, base.len());
        // Names sharing their first 8 bytes (sorted by whole names) make a template too.
        let long = r#"{"customer_name":"x","customer_id":1}"#;
        let expected: Doc = serde_json::from_str(long).unwrap();
        assert_eq!(parser.fast(long.as_bytes()), Some(expected.clone()));
        parser.opened = 0;
        let mut reader = Reader { text: long, at: 0 };
        assert_eq!(parser.object_by_template(&mut reader, 1, 0), Some(expected));
        // The objects past the first places share the last, as the items of a long array.
        let items = vec![r#"{"b":1,"a":2}"#; 3 * TEMPLATES].join(",");
        let array = format!("[{items}]");
        for _ in 0..2 {
            let expected: Doc = serde_json::from_str(&array).unwrap();
            assert_eq!(parser.fast(array.as_bytes()), Some(expected));
        }
        assert_eq!(parser.templates.len(), TEMPLATES);
        assert_eq!(parser.templates[TEMPLATES - 1].backoff, 0, "no miss");
        // An object far past the first places is matched against the shared template.
        let other = r#"{"c":3}"#;
        parser.opened = 2 * TEMPLATES;
        let mut reader = Reader { text: other, at: 0 };
        let expected: Doc = serde_json::from_str(other).unwrap();
        assert_eq!(parser.object(&mut reader, 1), Some(expected));
        assert_eq!(parser.templates[TEMPLATES - 1].backoff, 1, "one miss");
        // Spellings of every length the word comparison distinguishes.
        for len in 0..40 {
            let name = "n".repeat(len);
            let text = format!(r#"{{"{name}":1,"{name}x":2}}"#);
            let other = format!(r#"{{"{name}":1,"{name}y":2}}"#);
            for text in [&text, &text, &other, &text] {
                let expected: Doc = serde_json::from_str(text).unwrap();
                assert_eq!(parser.fast(text.as_bytes()), Some(expected), "{text}");
            }
        }
    }

    /// Decimals at the edges of the range read without serde_json (significands up to
    /// 2^53, powers of ten up to 10^±22): read here inside it, to serde_json's bit, and
    /// left to serde_json outside it.
    #[test]
    fn short_decimals_are_read_here_exactly_inside_the_exact_range_only() {
        let inside = [
            "0.1",
            "0.2",
            "0.3",
            "0.7",
            "2.675",
            "-0.0",
            "0.0",
            "0e0",
            "1E+2",
            "2.5e-0",
            "-1.25e-3",
            "123456789012.345",
            "999999999999999e-22",
            "9007199254740.992",
            "9007199254740992e0",
            "0.000000000000000001",
            "1e22",
            "10e22",
            "-1e-22",
            "4.5e+21",
        ];
        for text in inside {
            let Ok(Doc::Float(theirs)) = serde_json::from_str::<Doc>(text) else {
                panic!("{text} is a float to serde_json");
            };
            let mut reader = Reader { text, at: 0 };
            let Some(Doc::Float(ours)) = reader.short_number() else {
                panic!("{text} is read here");
            };
            assert_eq!(ours.to_bits(), theirs.to_bits(), "{text}");
            assert_eq!(reader.at, text.len(), "{text}");
        }
        let outside = [
            "1e23",
            "1e-23",
            "9007199254740993e0",
            "9007199254740.993",
            "0.30000000000000004",
            "0.0000000000000000001",
            "4.9e-324",
            "2.2250738585072014e-308",
            "1.7976931348623157e308",
            "1e0001",
            "01.5",
            "1.",
            "1.e5",
            "1e",
            "1e+",
            "-",
            "-0",
            "-9223372036854775809",
        ];
        for text in outside {
            let mut reader = Reader { text, at: 0 };
            assert_eq!(reader.short_number(), None, "{text}");
            assert_eq!(reader.at, 0, "{text}");
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
