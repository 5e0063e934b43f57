//! A request body's documents, checked before the body is accepted, and the framing of
//! a step's bodies as the journaled data of its intent.
//!
//! A body is JSON lines (one document a line; blank lines are skipped) or one JSON
//! array of documents, told apart by its first character (`[`). Every document must be
//! a JSON object: the first that is not (or does not parse) refuses the whole body,
//! naming its line (JSON lines) or element (array), 1-based; so does the first that the
//! collection it feeds would not take (invalid against its schema, or without its
//! key: the runtime's [`Intake`] check), unless the source dead-letters those
//! (`on_error: skip`), which are then counted. An accepted body keeps the
//! documents' texts as the client wrote them, back to back ([`Batch`]): they are parsed
//! again only by the reader's combiner.
//!
//! A step's journaled data (`Resume::Replay::data`) is its bodies, framed:
//!
//! ```text
//!  "SLH1" │ per body: seq u64 │ key length u16, key │ accepted at (unix ms) u64 │
//!         │           documents u32 │ per document: length u32, text
//! ```
//!
//! (integers little-endian). The data carries all a replay needs: the documents, and the
//! sequence number and idempotency key that make a replayed body's clients answerable.
//! The step hash is the [`StepHasher`] hash of the framed data.

use serde_json::value::RawValue;
use sluice_source_sdk::{Intake, StepHasher, bad_json};

/// The documents of one accepted body: their texts back to back.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    text: Vec<u8>,
    /// Where each document's text ends in `text`.
    ends: Vec<u32>,
}

/// Why a body was refused (a 400): where, and what is wrong there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadBody {
    /// `line 3`, `element 2`, or the place in the body where the array is broken.
    pub place: String,
    pub reason: String,
}

impl std::fmt::Display for BadBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.place.is_empty() {
            write!(f, "{}", self.reason)
        } else {
            write!(f, "{}: {}", self.place, self.reason)
        }
    }
}

/// An accepted body: its documents, and how many of them the runtime will dead-letter
/// rather than store (`on_error: skip`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub batch: Batch,
    pub dead_lettered: u64,
}

impl Batch {
    /// Checks `body` and keeps its documents; refuses it at its first bad document.
    pub fn parse(body: &[u8]) -> Result<Batch, BadBody> {
        Batch::parse_with(body, &mut |_| Ok(()))
    }

    /// [`Batch::parse`], and each document checked against the collection it feeds
    /// (`intake`): one the collection would not take refuses the body, naming its line
    /// or element and why (the schema location, or the missing key), unless the runtime
    /// dead-letters such documents (`on_error: skip`): then the body is accepted and
    /// they are counted. Without an intake (a source run outside a pipeline), as
    /// [`Batch::parse`].
    pub fn parse_checked(body: &[u8], intake: Option<&Intake>) -> Result<Checked, BadBody> {
        let mut dead_lettered = 0;
        let batch = match intake {
            None => Batch::parse(body)?,
            Some(intake) => Batch::parse_with(body, &mut |doc| match intake.check(doc) {
                Err(_) if intake.dead_letters() => {
                    dead_lettered += 1;
                    Ok(())
                }
                checked => checked,
            })?,
        };
        Ok(Checked {
            batch,
            dead_lettered,
        })
    }

    /// How many documents of `batch` the runtime will dead-letter (the count
    /// [`Batch::parse_checked`] makes of an accepted body, for one replayed).
    pub fn dead_lettered(&self, intake: Option<&Intake>) -> u64 {
        let Some(intake) = intake.filter(|i| i.dead_letters()) else {
            return 0;
        };
        self.docs()
            .filter(|(_, doc)| intake.check(doc).is_err())
            .count() as u64
    }

    /// Parses `body`, each object then handed to `check`; `Err` refuses the body there.
    fn parse_with(
        body: &[u8],
        check: &mut dyn FnMut(&[u8]) -> Result<(), String>,
    ) -> Result<Batch, BadBody> {
        let batch = if body.trim_ascii_start().starts_with(b"[") {
            Batch::parse_array(body, check)?
        } else {
            Batch::parse_lines(body, check)?
        };
        if batch.is_empty() {
            return Err(BadBody {
                place: String::new(),
                reason: "the body holds no documents: post JSON lines, or a JSON array, of \
                         objects"
                    .to_string(),
            });
        }
        Ok(batch)
    }

    fn parse_lines(
        body: &[u8],
        check: &mut dyn FnMut(&[u8]) -> Result<(), String>,
    ) -> Result<Batch, BadBody> {
        let mut batch = Batch::default();
        for (index, line) in body.split(|&b| b == b'\n').enumerate() {
            let line = line.trim_ascii();
            if line.is_empty() {
                continue;
            }
            let place = || format!("line {}", index + 1);
            let raw: &RawValue = serde_json::from_slice(line).map_err(|e| BadBody {
                place: place(),
                reason: bad_json(line, &e),
            })?;
            check_object(raw)
                .and_then(|()| check(raw.get().as_bytes()))
                .map_err(|reason| BadBody {
                    place: place(),
                    reason,
                })?;
            batch.push(raw.get().as_bytes());
        }
        Ok(batch)
    }

    fn parse_array(
        body: &[u8],
        check: &mut dyn FnMut(&[u8]) -> Result<(), String>,
    ) -> Result<Batch, BadBody> {
        let elements: Vec<&RawValue> = serde_json::from_slice(body).map_err(|e| BadBody {
            place: "the body".to_string(),
            reason: bad_json(body, &e),
        })?;
        let mut batch = Batch::default();
        for (index, raw) in elements.into_iter().enumerate() {
            check_object(raw)
                .and_then(|()| check(raw.get().as_bytes()))
                .map_err(|reason| BadBody {
                    place: format!("element {}", index + 1),
                    reason,
                })?;
            batch.push(raw.get().as_bytes());
        }
        Ok(batch)
    }

    pub fn push(&mut self, doc: &[u8]) {
        self.text.extend_from_slice(doc);
        self.ends.push(self.text.len() as u32);
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// The documents' bytes.
    pub fn bytes(&self) -> u64 {
        self.text.len() as u64
    }

    /// Each document's text, in order, with its byte offset in the batch.
    pub fn docs(&self) -> impl Iterator<Item = (u64, &[u8])> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(&self.ends)
            .map(|(start, &end)| (u64::from(start), &self.text[start as usize..end as usize]))
    }
}

fn check_object(raw: &RawValue) -> Result<(), String> {
    let kind = match raw.get().as_bytes().first() {
        Some(b'{') => return Ok(()),
        Some(b'[') => "an array",
        Some(b'"') => "a string",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    };
    Err(format!(
        "{kind}, not a JSON object: every document is an object"
    ))
}

/// One body of a step, as journaled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Framed {
    pub seq: u64,
    pub key: Option<String>,
    /// When the body was accepted (unix ms): where its idempotency key's window starts.
    pub at: u64,
    pub batch: Batch,
}

const MAGIC: &[u8; 4] = b"SLH1";

/// Appends the framing of the step's first body to `data` (empty: starts it).
pub fn frame(data: &mut Vec<u8>, seq: u64, key: Option<&str>, at: u64, batch: &Batch) {
    if data.is_empty() {
        data.extend_from_slice(MAGIC);
    }
    data.extend_from_slice(&seq.to_le_bytes());
    let key = key.unwrap_or_default().as_bytes();
    data.extend_from_slice(&(key.len() as u16).to_le_bytes());
    data.extend_from_slice(key);
    data.extend_from_slice(&at.to_le_bytes());
    data.extend_from_slice(&(batch.len() as u32).to_le_bytes());
    for (_, doc) in batch.docs() {
        data.extend_from_slice(&(doc.len() as u32).to_le_bytes());
        data.extend_from_slice(doc);
    }
}

/// The hash of a step's framed data (the step hash checked on replay).
pub fn hash(data: &[u8]) -> u64 {
    let mut hasher = StepHasher::new();
    hasher.append(data);
    hasher.finish()
}

/// Reads a step's framed bodies back; `Err` says why the data is not a step of this
/// source.
pub fn unframe(data: &[u8]) -> Result<Vec<Framed>, String> {
    if data.is_empty() {
        return Ok(Vec::new());
    }
    let mut rest = data
        .strip_prefix(MAGIC)
        .ok_or("the data does not start with this source's framing (SLH1)")?;
    let mut bodies = Vec::new();
    while !rest.is_empty() {
        let mut cut = |n: usize| -> Result<&[u8], String> {
            if rest.len() < n {
                return Err(format!("the data ends inside body {}", bodies.len() + 1));
            }
            let (head, tail) = rest.split_at(n);
            rest = tail;
            Ok(head)
        };
        let seq = u64::from_le_bytes(cut(8)?.try_into().expect("8 bytes"));
        let key_len = u16::from_le_bytes(cut(2)?.try_into().expect("2 bytes"));
        let key = cut(key_len as usize)?;
        let key = match key {
            [] => None,
            key => Some(
                String::from_utf8(key.to_vec())
                    .map_err(|_| format!("the key of request {seq} is not UTF-8"))?,
            ),
        };
        let at = u64::from_le_bytes(cut(8)?.try_into().expect("8 bytes"));
        let docs = u32::from_le_bytes(cut(4)?.try_into().expect("4 bytes"));
        let mut batch = Batch::default();
        for _ in 0..docs {
            let len = u32::from_le_bytes(cut(4)?.try_into().expect("4 bytes"));
            batch.push(cut(len as usize)?);
        }
        bodies.push(Framed {
            seq,
            key,
            at,
            batch,
        });
    }
    Ok(bodies)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn texts(batch: &Batch) -> Vec<String> {
        batch
            .docs()
            .map(|(_, d)| String::from_utf8(d.to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn json_lines_and_arrays_keep_each_documents_text() {
        let lines = Batch::parse(b"{\"a\": 1}\r\n\n  {\"b\":[1,2]}  \n").unwrap();
        assert_eq!(texts(&lines), ["{\"a\": 1}", "{\"b\":[1,2]}"]);
        let array = Batch::parse(b" [ {\"a\": 1},\n {\"b\": {\"c\": null}} ] ").unwrap();
        assert_eq!(texts(&array), ["{\"a\": 1}", "{\"b\": {\"c\": null}}"]);
        let offsets: Vec<u64> = array.docs().map(|(at, _)| at).collect();
        assert_eq!(offsets, [0, 8]);
        assert_eq!(array.bytes(), 8 + 18);
    }

    #[test]
    fn the_first_bad_document_is_named_by_line_or_element() {
        for (body, expected) in [
            (
                &b"{\"a\":1}\n{\"a\":\n{\"a\":3}"[..],
                "line 2: invalid JSON at column 5: EOF while parsing a value",
            ),
            (b"{\"a\":1}\n\n[1]\n", "line 3: an array, not a JSON object"),
            (
                b"{\"a\":1} {\"b\":2}",
                "line 1: invalid JSON at column 9: trailing characters",
            ),
            (b"{\"a\":1}\n42", "line 2: a number, not a JSON object"),
            (
                b"[{\"a\":1}, \"x\"]",
                "element 2: a string, not a JSON object",
            ),
            (
                b"[{\"a\":1},\n {\"a\" 2}]",
                "the body: invalid JSON at line 2 column 7: expected `:`",
            ),
            (b"\xff", "line 1: invalid UTF-8 at byte 0"),
            (b"", "the body holds no documents"),
            (b" \n\n", "the body holds no documents"),
            (b"[]", "the body holds no documents"),
        ] {
            let error = Batch::parse(body).unwrap_err().to_string();
            assert!(
                error.starts_with(expected),
                "{}: {error}",
                String::from_utf8_lossy(body)
            );
        }
    }

    /// A check as the runtime's: here, a document needs its `id`.
    fn intake(dead_letters: bool) -> Intake {
        Intake::new(dead_letters, |doc| {
            let doc: serde_json::Value = serde_json::from_slice(doc).unwrap();
            match doc.get("id") {
                Some(_) => Ok(()),
                None => Err("document is missing key location /id".to_string()),
            }
        })
    }

    #[test]
    fn a_document_the_collection_would_not_take_refuses_the_body_at_its_place() {
        for (body, expected) in [
            (
                &b"{\"id\":1}\n\n{\"x\":2}\n{\"id\":3}"[..],
                "line 3: document is missing key location /id",
            ),
            (
                b"[{\"id\":1}, {\"x\":2}]",
                "element 2: document is missing key location /id",
            ),
        ] {
            let refused = Batch::parse_checked(body, Some(&intake(false))).unwrap_err();
            assert_eq!(refused.to_string(), expected);
        }
    }

    #[test]
    fn dead_lettered_documents_are_accepted_and_counted() {
        let body = b"{\"id\":1}\n{\"x\":2}\n{\"id\":3}\n{\"y\":4}";
        let checked = Batch::parse_checked(body, Some(&intake(true))).unwrap();
        assert_eq!(checked.batch.len(), 4);
        assert_eq!(checked.dead_lettered, 2);
        // A replayed body is counted the same way.
        assert_eq!(checked.batch.dead_lettered(Some(&intake(true))), 2);
        assert_eq!(checked.batch.dead_lettered(Some(&intake(false))), 0);
        assert_eq!(checked.batch.dead_lettered(None), 0);
        // Without an intake nothing is checked but the JSON.
        let unchecked = Batch::parse_checked(body, None).unwrap();
        assert_eq!((unchecked.batch.len(), unchecked.dead_lettered), (4, 0));
        // Bad JSON refuses the body whatever the intake.
        let bad = Batch::parse_checked(b"{\"id\":1}\n[2]", Some(&intake(true)));
        assert!(bad.unwrap_err().to_string().starts_with("line 2: an array"));
    }

    #[test]
    fn framed_bodies_come_back_as_they_were() {
        let one = Batch::parse(b"{\"a\":1}\n{\"b\":2}").unwrap();
        let two = Batch::parse(b"[{\"c\":\"\xc3\xa9\"}]").unwrap();
        let mut data = Vec::new();
        frame(&mut data, 7, Some("key-1"), 1_700_000_000_000, &one);
        frame(&mut data, 8, None, 1_700_000_000_001, &two);
        let bodies = unframe(&data).unwrap();
        assert_eq!(
            bodies,
            [
                Framed {
                    seq: 7,
                    key: Some("key-1".into()),
                    at: 1_700_000_000_000,
                    batch: one
                },
                Framed {
                    seq: 8,
                    key: None,
                    at: 1_700_000_000_001,
                    batch: two
                },
            ]
        );
        assert_eq!(unframe(&[]).unwrap(), []);
        assert!(unframe(b"XXXX").unwrap_err().contains("SLH1"));
        assert!(
            unframe(&data[..data.len() - 1])
                .unwrap_err()
                .contains("body 2")
        );
    }

    /// The step hash is over the framed data, fixed across releases: a change of the
    /// framing or the hash would fail every journaled step's replay.
    #[test]
    fn the_step_hash_of_a_frozen_step_is_stable() {
        let mut data = Vec::new();
        frame(
            &mut data,
            1,
            Some("k"),
            2,
            &Batch::parse(b"{\"a\":1}").unwrap(),
        );
        assert_eq!(
            data,
            b"SLH1\x01\0\0\0\0\0\0\0\x01\0k\x02\0\0\0\0\0\0\0\x01\0\0\0\x07\0\0\0{\"a\":1}"
        );
        assert_eq!(hash(&data), 0xfb8d_5a2c_460e_9c3c);
        assert_ne!(hash(&data), hash(&data[..data.len() - 1]));
    }
}
