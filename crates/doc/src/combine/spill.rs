//! Sorted runs in one temporary spill file, and streaming readers over them.
//!
//! ```text
//!  spill file: [ run 0 ][ run 1 ] … [ run n ]        (unnamed temp file, gone on drop)
//!  run:        record record record …               (table-key order; loaded doc first)
//!  record:     key_len u32le | table key | full u8 | doc_len u32le | doc as JSON
//! ```
//!
//! Runs are only appended (through the file's cursor) and only read after the last one
//! is written, with positional reads, so every run has its own reader and buffer over the
//! same file handle. A reader holds at most [`READ_CHUNK`] bytes (or one larger record),
//! which keeps the drain's memory at `runs × READ_CHUNK` whatever the runs' sizes.

use super::{CombineError, Record};
use serde_json::Value;
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
        records: impl Iterator<Item = (&'a [u8], bool, &'a Value)>,
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
        records: impl Iterator<Item = (&'a [u8], bool, &'a Value)>,
    ) -> std::io::Result<u64> {
        let mut out = BufWriter::with_capacity(WRITE_BUFFER, &*self.file);
        let mut written = 0;
        for (key, full, doc) in records {
            self.doc_buf.clear();
            serde_json::to_writer(&mut self.doc_buf, doc)?;
            out.write_all(&len_u32(key.len())?.to_le_bytes())?;
            out.write_all(key)?;
            out.write_all(&[u8::from(full)])?;
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
        let full = match self.take(1)?[0] {
            0 => false,
            1 => true,
            other => return Err(corrupt(at, format!("full flag is {other}"))),
        };
        let doc_len = self.take_u32()? as usize;
        let doc = serde_json::from_slice(self.take(doc_len)?)
            .map_err(|err| corrupt(at, format!("document does not parse: {err}")))?;
        if key.len() < 4 {
            return Err(corrupt(at, format!("table key of {key_len} bytes")));
        }
        Ok(Some(Record { key, full, doc }))
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
