//! Sorted runs in one temporary spill file, and streaming readers over them.
//!
//! ```text
//!  spill file: [ run 0 ][ run 1 ] … [ run n ]        (unnamed temp file, gone on drop)
//!  run:        record record record …               (table-key order; loaded doc first)
//!  record:     key_len u32le | table key | side u8 | doc_len u32le | doc (binary, below)
//!  side:       0 new | 1 loaded (full) | 2 new, starting its key over (resets)
//!  doc:        tag u8, then: null 0 | false 1 | true 2 | u64 3 (8 bytes le) | i64 4 (8 le)
//!              | f64 5 (8 le) | string 6 (len u32le, UTF-8) | array 7 (count u32le, docs)
//!              | object 8 (count u32le, then per field: name len u32le, name, doc)
//! ```
//!
//! The binary form is a direct walk of the table's [`Doc`]s (no number formatting, no
//! escaping) and decodes straight back into a [`Doc`]; fields are written in their sorted
//! order, so decoding checks that order instead of sorting.
//!
//! Runs are only appended (through the file's cursor) and only read after the last one
//! is written, with positional reads, so every run has its own reader and buffer over the
//! same file handle. A reader holds at most [`READ_CHUNK`] bytes (or one larger record),
//! which keeps the drain's memory at `runs × READ_CHUNK` whatever the runs' sizes.

use super::{CombineError, Record, Side};
use crate::compact::{Doc, Field, Str};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

/// 256 KiB of write buffer: a few hundred records per write system call.
const WRITE_BUFFER: usize = 256 << 10;
/// 64 KiB read per refill: ~400 records of 150 bytes per system call, and 64 runs (16 GiB
/// of estimated documents spilled under a 256 MiB budget) cost 4 MiB of buffers.
const READ_CHUNK: usize = 64 << 10;

pub(super) struct SpillFile {
    file: Arc<File>,
    dir: PathBuf,
    len: u64,
    runs: Vec<Range<u64>>,
    /// Reused to serialize one document before its length is known.
    doc_buf: Vec<u8>,
}

impl SpillFile {
    pub(super) fn create(dir: PathBuf) -> Result<SpillFile, CombineError> {
        match tempfile::tempfile_in(&dir) {
            Ok(file) => Ok(SpillFile {
                file: Arc::new(file),
                dir,
                len: 0,
                runs: Vec::new(),
                doc_buf: Vec::new(),
            }),
            Err(source) => Err(CombineError::Spill { dir, source }),
        }
    }

    pub(super) fn runs(&self) -> &[Range<u64>] {
        &self.runs
    }

    pub(super) fn len(&self) -> u64 {
        self.len
    }

    /// Appends one run of `records`, which must come in table-key order.
    pub(super) fn write_run<'a>(
        &mut self,
        records: impl Iterator<Item = (&'a [u8], Side, &'a Doc)>,
    ) -> Result<(), CombineError> {
        let start = self.len;
        let written = self
            .write_records(records)
            .map_err(|source| CombineError::Spill {
                dir: self.dir.clone(),
                source,
            })?;
        self.len += written;
        self.runs.push(start..self.len);
        Ok(())
    }

    fn write_records<'a>(
        &mut self,
        records: impl Iterator<Item = (&'a [u8], Side, &'a Doc)>,
    ) -> std::io::Result<u64> {
        let mut out = BufWriter::with_capacity(WRITE_BUFFER, &*self.file);
        let mut written = 0;
        for (key, side, doc) in records {
            self.doc_buf.clear();
            encode(doc, &mut self.doc_buf)?;
            out.write_all(&len_u32(key.len())?.to_le_bytes())?;
            out.write_all(key)?;
            out.write_all(&[side.to_byte()])?;
            out.write_all(&len_u32(self.doc_buf.len())?.to_le_bytes())?;
            out.write_all(&self.doc_buf)?;
            written += (4 + key.len() + 1 + 4 + self.doc_buf.len()) as u64;
        }
        out.flush()?;
        Ok(written)
    }

    /// One streaming reader per run, in spill order.
    pub(super) fn readers(&self) -> Vec<RunReader> {
        self.runs
            .iter()
            .map(|run| RunReader {
                file: Arc::clone(&self.file),
                dir: self.dir.clone(),
                offset: run.start,
                end: run.end,
                buf: Vec::new(),
                pos: 0,
            })
            .collect()
    }
}

fn len_u32(len: usize) -> std::io::Result<u32> {
    u32::try_from(len).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("a spilled record part of {len} bytes exceeds 4 GiB"),
        )
    })
}

const NULL: u8 = 0;
const FALSE: u8 = 1;
const TRUE: u8 = 2;
const POS_INT: u8 = 3;
const NEG_INT: u8 = 4;
const FLOAT: u8 = 5;
const STRING: u8 = 6;
const ARRAY: u8 = 7;
const OBJECT: u8 = 8;

/// Appends the binary form of `doc` (see the module docs) to `out`.
fn encode(doc: &Doc, out: &mut Vec<u8>) -> std::io::Result<()> {
    match doc {
        Doc::Null => out.push(NULL),
        Doc::Bool(false) => out.push(FALSE),
        Doc::Bool(true) => out.push(TRUE),
        Doc::PosInt(n) => {
            out.push(POS_INT);
            out.extend_from_slice(&n.to_le_bytes());
        }
        Doc::NegInt(n) => {
            out.push(NEG_INT);
            out.extend_from_slice(&n.to_le_bytes());
        }
        Doc::Float(f) => {
            out.push(FLOAT);
            out.extend_from_slice(&f.to_le_bytes());
        }
        Doc::String(s) => {
            out.push(STRING);
            encode_str(s.as_bytes(), out)?;
        }
        Doc::Array(items) => {
            out.push(ARRAY);
            out.extend_from_slice(&len_u32(items.len())?.to_le_bytes());
            for item in items {
                encode(item, out)?;
            }
        }
        Doc::Object(fields) => {
            out.push(OBJECT);
            out.extend_from_slice(&len_u32(fields.len())?.to_le_bytes());
            for field in fields {
                encode_str(field.name.as_bytes(), out)?;
                encode(&field.value, out)?;
            }
        }
    }
    Ok(())
}

fn encode_str(s: &[u8], out: &mut Vec<u8>) -> std::io::Result<()> {
    out.extend_from_slice(&len_u32(s.len())?.to_le_bytes());
    out.extend_from_slice(s);
    Ok(())
}

/// Decodes one document from the front of `bytes`, advancing it. An object's names must
/// come strictly increasing, as [`encode`] writes them (the [`Doc`] invariant).
fn decode(bytes: &mut &[u8]) -> Result<Doc, String> {
    Ok(match take(bytes, 1)?[0] {
        NULL => Doc::Null,
        FALSE => Doc::Bool(false),
        TRUE => Doc::Bool(true),
        POS_INT => Doc::PosInt(u64::from_le_bytes(take_8(bytes)?)),
        NEG_INT => Doc::from_number(&i64::from_le_bytes(take_8(bytes)?).into()),
        FLOAT => match f64::from_le_bytes(take_8(bytes)?) {
            f if f.is_finite() => Doc::Float(f),
            _ => return Err("a float that is not finite".to_string()),
        },
        STRING => Doc::String(Str::new(decode_str(bytes)?)),
        ARRAY => {
            let count = take_len(bytes)?;
            // Every item takes at least one byte: a corrupt count cannot over-allocate.
            let mut items = Vec::with_capacity(count.min(bytes.len()));
            for _ in 0..count {
                items.push(decode(bytes)?);
            }
            Doc::Array(items.into_boxed_slice())
        }
        OBJECT => {
            let count = take_len(bytes)?;
            let mut fields: Vec<Field> = Vec::with_capacity(count.min(bytes.len()));
            for _ in 0..count {
                let name = Str::new(decode_str(bytes)?);
                if fields
                    .last()
                    .is_some_and(|last| last.name.as_bytes() >= name.as_bytes())
                {
                    return Err(format!("property {:?} out of order", name.as_str()));
                }
                let value = decode(bytes)?;
                fields.push(Field { name, value });
            }
            Doc::Object(fields.into_boxed_slice())
        }
        tag => return Err(format!("unknown tag {tag}")),
    })
}

fn take<'b>(bytes: &mut &'b [u8], n: usize) -> Result<&'b [u8], String> {
    if bytes.len() < n {
        return Err("truncated document".to_string());
    }
    let (head, rest) = bytes.split_at(n);
    *bytes = rest;
    Ok(head)
}

fn take_8(bytes: &mut &[u8]) -> Result<[u8; 8], String> {
    let mut out = [0; 8];
    out.copy_from_slice(take(bytes, 8)?);
    Ok(out)
}

fn take_len(bytes: &mut &[u8]) -> Result<usize, String> {
    let mut len = [0; 4];
    len.copy_from_slice(take(bytes, 4)?);
    Ok(u32::from_le_bytes(len) as usize)
}

fn decode_str<'b>(bytes: &mut &'b [u8]) -> Result<&'b str, String> {
    let len = take_len(bytes)?;
    let raw = take(bytes, len)?;
    std::str::from_utf8(raw).map_err(|err| format!("a string that is not UTF-8: {err}"))
}

/// Reads one run's records in order, `READ_CHUNK` bytes at a time.
pub(super) struct RunReader {
    file: Arc<File>,
    dir: PathBuf,
    /// File offset of the first byte not yet in `buf`.
    offset: u64,
    end: u64,
    buf: Vec<u8>,
    /// The first unconsumed byte of `buf`.
    pos: usize,
}

impl RunReader {
    pub(super) fn next_record(&mut self) -> Result<Option<Record>, CombineError> {
        if self.pos == self.buf.len() && self.offset == self.end {
            return Ok(None);
        }
        let at = self.offset - (self.buf.len() - self.pos) as u64;
        let key_len = self.take_u32()? as usize;
        let key = self.take(key_len)?.to_vec();
        let byte = self.take(1)?[0];
        let side =
            Side::from_byte(byte).ok_or_else(|| corrupt(at, format!("side byte is {byte}")))?;
        let doc_len = self.take_u32()? as usize;
        let mut bytes = self.take(doc_len)?;
        let doc = decode(&mut bytes)
            .and_then(|doc| match bytes.len() {
                0 => Ok(doc),
                n => Err(format!("{n} bytes after the document")),
            })
            .map_err(|reason| corrupt(at, format!("document does not decode: {reason}")))?;
        if key.len() < 4 {
            return Err(corrupt(at, format!("table key of {key_len} bytes")));
        }
        Ok(Some(Record { key, side, doc }))
    }

    fn take_u32(&mut self) -> Result<u32, CombineError> {
        let bytes = self.take(4)?;
        Ok(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    /// The next `n` bytes of the run, reading more of the file if needed.
    fn take(&mut self, n: usize) -> Result<&[u8], CombineError> {
        if self.buf.len() - self.pos < n {
            self.refill(n)?;
        }
        let bytes = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(bytes)
    }

    fn refill(&mut self, n: usize) -> Result<(), CombineError> {
        self.buf.drain(..self.pos);
        self.pos = 0;
        let remaining = self.end - self.offset;
        let missing = (n - self.buf.len()) as u64;
        if missing > remaining {
            return Err(corrupt(
                self.offset,
                "record runs past the end of its run".into(),
            ));
        }
        let want = remaining.min(missing.max(READ_CHUNK as u64)) as usize;
        let filled = self.buf.len();
        self.buf.resize(filled + want, 0);
        read_exact_at(&self.file, &mut self.buf[filled..], self.offset).map_err(|source| {
            CombineError::Spill {
                dir: self.dir.clone(),
                source,
            }
        })?;
        self.offset += want as u64;
        Ok(())
    }
}

fn corrupt(offset: u64, reason: String) -> CombineError {
    CombineError::CorruptSpill { offset, reason }
}

#[cfg(unix)]
fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    std::os::unix::fs::FileExt::read_exact_at(file, buf, offset)
}

#[cfg(windows)]
fn read_exact_at(file: &File, mut buf: &mut [u8], mut offset: u64) -> std::io::Result<()> {
    while !buf.is_empty() {
        match std::os::windows::fs::FileExt::seek_read(file, buf, offset)? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => {
                buf = &mut buf[n..];
                offset += n as u64;
            }
        }
    }
    Ok(())
}
