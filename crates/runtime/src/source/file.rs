//! The file source: JSON lines or CSV with a header row, optionally followed as it grows.
//!
//! ```text
//!  file ──1 MiB reads (blocking pool)──▶ buf ──split records──▶ parse ──▶ Record / InputError
//!        cursor = {offset, line} of the first byte not yet consumed
//! ```
//!
//! Positions are byte offsets (with the line number, for messages): a step's resume is
//! the [`Span`] of cursors before and after it, and its hash covers exactly the bytes in
//! between, so `replay` re-reads that byte range and checks it is unchanged.
//!
//! Record boundaries:
//! - JSON: one document per `\n`-terminated line (a trailing `\r` is ignored). Blank
//!   lines are skipped.
//! - CSV (RFC 4180): a record ends at a `\n` outside double quotes, so a quoted cell
//!   may span lines. The record at byte 0 is the header naming the properties. A cell
//!   becomes a JSON integer, float or boolean when it is exactly such an unquoted
//!   literal (`42`, `-1.5e3`, `true`; not `007` or `+1`), is omitted when it is empty
//!   and unquoted, and is a string otherwise (so `"42"`, quoted, stays a string).
//! - Only complete records (ending in `\n`) are consumed, except the last record of a
//!   file that is not followed, at its end. A followed file never ends: a partial last
//!   line waits for its `\n`.
//!
//! Bad records (malformed JSON, invalid UTF-8, a CSV row with the wrong number of
//! cells) become [`InputError`]s naming `file:line`; they are consumed (and hashed) but
//! not emitted. Truncating or replacing a followed file is not detected (a later replay
//! of a changed range fails with a hash mismatch).

use super::{
    FaultTolerance, InputError, Position, QueueLimits, Record, Resume, Source, SourceError, Span,
    Step, StepHasher, check_replay, replay_target,
};
use crate::config::{FileDef, FileFormat};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;
use std::sync::Arc;

/// Read size: large enough that a blocking-pool hop per read costs nothing measurable,
/// small enough to keep memory flat.
const CHUNK: usize = 1 << 20;

/// A place in the file: the byte offset and 1-based line of the next record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cursor {
    pub offset: u64,
    pub line: u64,
}

impl Cursor {
    const START: Cursor = Cursor { offset: 0, line: 1 };
}

pub struct FileSource {
    name: String,
    path: PathBuf,
    /// The path as shown in positions and errors.
    display: Arc<str>,
    format: FileFormat,
    follow: bool,
    /// Open at `cursor.offset + (buf.len() - start)`; `None` after a seek.
    file: Option<File>,
    /// Read but not consumed: `buf[start..]` begins at `cursor`.
    buf: Vec<u8>,
    start: usize,
    cursor: Cursor,
    /// A non-followed file was read to its end.
    eof: bool,
    /// CSV: the header's property names, once read.
    header: Option<Vec<String>>,
}

/// What one step consumed so far.
struct Acc {
    records: usize,
    bytes: u64,
    errors: Vec<InputError>,
    hasher: StepHasher,
}

impl FileSource {
    pub fn new(name: &str, def: &FileDef) -> FileSource {
        FileSource {
            name: name.to_string(),
            path: def.path.clone(),
            display: def.path.display().to_string().into(),
            format: def.format,
            follow: def.follow,
            file: None,
            buf: Vec::new(),
            start: 0,
            cursor: Cursor::START,
            eof: false,
            header: None,
        }
    }

    fn io_error(&self, error: std::io::Error) -> SourceError {
        SourceError::Io {
            name: self.name.clone(),
            path: self.display.to_string(),
            error,
        }
    }

    fn reposition(&mut self, cursor: Cursor) {
        self.cursor = cursor;
        self.file = None;
        self.buf.clear();
        self.start = 0;
        self.eof = false;
    }

    /// Reads up to [`CHUNK`] more bytes; 0 at the (current) end of the file.
    async fn fill(&mut self) -> Result<usize, SourceError> {
        self.buf.drain(..self.start);
        self.start = 0;
        let file = match self.file.take() {
            Some(file) => file,
            None => {
                let mut file = File::open(&self.path).map_err(|e| self.io_error(e))?;
                let at = self.cursor.offset + self.buf.len() as u64;
                file.seek(SeekFrom::Start(at))
                    .map_err(|e| self.io_error(e))?;
                file
            }
        };
        let buf = std::mem::take(&mut self.buf);
        let (file, buf, read) = tokio::task::spawn_blocking(move || {
            let (mut file, mut buf) = (file, buf);
            let old = buf.len();
            buf.resize(old + CHUNK, 0);
            let read = file.read(&mut buf[old..]);
            buf.truncate(old + *read.as_ref().unwrap_or(&0));
            (file, buf, read)
        })
        .await
        .expect("a file read does not panic");
        self.file = Some(file);
        self.buf = buf;
        read.map_err(|e| self.io_error(e))
    }

    /// Consumes buffered records while under `limits`; true when a limit stopped it.
    /// With `at_end`, the buffered bytes end with the last record even without `\n`.
    fn consume(
        &mut self,
        limits: QueueLimits,
        at_end: bool,
        out: &mut Vec<Record>,
        acc: &mut Acc,
    ) -> bool {
        loop {
            if acc.records >= limits.max_records || acc.bytes >= limits.max_bytes {
                return true;
            }
            let data = &self.buf[self.start..];
            let Some((len, newlines)) = record_len(self.format, data, at_end) else {
                return false;
            };
            let raw = &data[..len];
            acc.hasher.append(raw);
            acc.bytes += len as u64;
            let position = Position {
                source: self.display.clone(),
                line: self.cursor.line,
                byte_offset: self.cursor.offset,
            };
            match parse(self.format, &mut self.header, raw, self.cursor.offset == 0) {
                Ok(Some(doc)) => {
                    acc.records += 1;
                    out.push(Record {
                        doc,
                        position,
                        bytes: len,
                    });
                }
                Ok(None) => {}
                Err(reason) => acc.errors.push(InputError::new(position, raw, reason)),
            }
            self.start += len;
            self.cursor.offset += len as u64;
            self.cursor.line += newlines;
        }
    }

    /// CSV: reads the header row from the start of the file when resuming past it.
    async fn ensure_header(&mut self) -> Result<(), SourceError> {
        if self.format != FileFormat::Csv || self.header.is_some() || self.cursor.offset == 0 {
            return Ok(());
        }
        let resume = self.cursor;
        self.reposition(Cursor::START);
        let limits = QueueLimits {
            max_records: usize::MAX,
            max_bytes: 1,
        };
        let mut acc = Acc::new();
        while acc.bytes == 0 {
            let at_end = self.fill().await? == 0;
            self.consume(limits, at_end, &mut Vec::new(), &mut acc);
            if at_end {
                break;
            }
        }
        self.reposition(resume);
        Ok(())
    }
}

impl Acc {
    fn new() -> Acc {
        Acc {
            records: 0,
            bytes: 0,
            errors: Vec::new(),
            hasher: StepHasher::new(),
        }
    }

    fn into_step(self, begin: Cursor, end: Cursor, end_of_input: bool) -> Step {
        Step {
            records: self.records,
            bytes: self.bytes,
            errors: self.errors,
            end_of_input,
            resume: Span { begin, end }.replay(self.hasher.finish()),
        }
    }
}

#[async_trait::async_trait]
impl Source for FileSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn fault_tolerance(&self) -> FaultTolerance {
        FaultTolerance::ExactlyOnce
    }

    async fn seek(&mut self, position: &Value) -> Result<(), SourceError> {
        let span = Span::<Cursor>::from_value(&self.name, "seek to", position)?;
        self.reposition(span.end);
        self.ensure_header().await
    }

    async fn replay(&mut self, step: &Resume, out: &mut Vec<Record>) -> Result<Step, SourceError> {
        let span = replay_target::<Cursor>(&self.name, step)?;
        let len = span.end.offset.saturating_sub(span.begin.offset);
        self.reposition(span.begin);
        self.ensure_header().await?;
        while ((self.buf.len() - self.start) as u64) < len && self.fill().await? > 0 {}
        // Exactly the journaled bytes, ending where the step ended.
        self.buf
            .truncate(self.start + (len as usize).min(self.buf.len() - self.start));
        let first = out.len();
        let mut acc = Acc::new();
        let unbounded = QueueLimits {
            max_records: usize::MAX,
            max_bytes: u64::MAX,
        };
        self.consume(unbounded, true, out, &mut acc);
        let replayed = acc.into_step(span.begin, self.cursor, false);
        if let Err(e) = check_replay(&self.name, step, replayed.resume.hash()) {
            out.truncate(first);
            return Err(e);
        }
        self.reposition(span.end);
        Ok(replayed)
    }

    async fn queue(
        &mut self,
        limits: QueueLimits,
        out: &mut Vec<Record>,
    ) -> Result<Step, SourceError> {
        let begin = self.cursor;
        let mut acc = Acc::new();
        loop {
            if self.consume(limits, self.eof, out, &mut acc) || self.eof {
                break;
            }
            if self.fill().await? == 0 {
                if self.follow {
                    break;
                }
                self.eof = true;
            }
        }
        let end_of_input = self.eof && self.start == self.buf.len();
        Ok(acc.into_step(begin, self.cursor, end_of_input))
    }
}

/// The length of the next record in `data` and the newlines in it, if it is complete.
fn record_len(format: FileFormat, data: &[u8], at_end: bool) -> Option<(usize, u64)> {
    let complete = match format {
        FileFormat::Json => data.iter().position(|&b| b == b'\n').map(|i| (i + 1, 1)),
        FileFormat::Csv => {
            let (mut quoted, mut newlines) = (false, 0);
            let mut end = None;
            for (i, &b) in data.iter().enumerate() {
                match b {
                    b'"' => quoted = !quoted,
                    b'\n' if !quoted => {
                        end = Some((i + 1, newlines + 1));
                        break;
                    }
                    b'\n' => newlines += 1,
                    _ => {}
                }
            }
            end
        }
    };
    match complete {
        None if at_end && !data.is_empty() => {
            let newlines = data.iter().filter(|&&b| b == b'\n').count() as u64;
            Some((data.len(), newlines))
        }
        other => other,
    }
}

/// Parses one raw record; `None` for blank lines and the CSV header.
fn parse(
    format: FileFormat,
    header: &mut Option<Vec<String>>,
    raw: &[u8],
    first: bool,
) -> Result<Option<Value>, String> {
    let line = trim_eol(raw);
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    match format {
        FileFormat::Json => {
            serde_json::from_slice(line)
                .map(Some)
                .map_err(|e| match std::str::from_utf8(line) {
                    Err(u) => format!("invalid UTF-8 at byte {} of the line", u.valid_up_to()),
                    Ok(_) => format!("invalid JSON: {e}"),
                })
        }
        FileFormat::Csv if first => {
            let cells = split_csv(line)?;
            *header = Some(cells.into_iter().map(|c| c.text).collect());
            Ok(None)
        }
        FileFormat::Csv => {
            let header = header.as_ref().ok_or("CSV data before the header row")?;
            let cells = split_csv(line)?;
            if cells.len() != header.len() {
                return Err(format!(
                    "row has {} columns, the header has {}",
                    cells.len(),
                    header.len()
                ));
            }
            let doc: Map<String, Value> = header
                .iter()
                .zip(cells)
                .filter_map(|(name, cell)| Some((name.clone(), cell.into_value()?)))
                .collect();
            Ok(Some(Value::Object(doc)))
        }
    }
}

fn trim_eol(raw: &[u8]) -> &[u8] {
    let raw = raw.strip_suffix(b"\n").unwrap_or(raw);
    raw.strip_suffix(b"\r").unwrap_or(raw)
}

/// One CSV cell.
struct Cell {
    text: String,
    quoted: bool,
}

impl Cell {
    /// The JSON value of a cell (see the module docs); `None` when empty and unquoted.
    fn into_value(self) -> Option<Value> {
        if self.quoted {
            return Some(Value::String(self.text));
        }
        let t = self.text.as_bytes();
        match (t.first(), t.last()) {
            (None, _) => None,
            (Some(b'0'..=b'9' | b'-'), Some(b'0'..=b'9')) => Some(
                serde_json::from_str::<serde_json::Number>(&self.text)
                    .map_or(Value::String(self.text), Value::Number),
            ),
            _ if self.text == "true" => Some(Value::Bool(true)),
            _ if self.text == "false" => Some(Value::Bool(false)),
            _ => Some(Value::String(self.text)),
        }
    }
}

/// Splits one CSV record (without its line ending) into cells.
fn split_csv(line: &[u8]) -> Result<Vec<Cell>, String> {
    let line = std::str::from_utf8(line)
        .map_err(|u| format!("invalid UTF-8 at byte {} of the record", u.valid_up_to()))?;
    let mut cells = Vec::new();
    let mut rest = line;
    loop {
        if let Some(quoted) = rest.strip_prefix('"') {
            let mut text = String::new();
            let mut body = quoted;
            loop {
                let Some(q) = body.find('"') else {
                    return Err("unterminated quoted cell".to_string());
                };
                text.push_str(&body[..q]);
                body = &body[q + 1..];
                match body.strip_prefix('"') {
                    Some(after) => {
                        text.push('"');
                        body = after;
                    }
                    None => break,
                }
            }
            cells.push(Cell { text, quoted: true });
            match body.strip_prefix(',') {
                Some(after) => rest = after,
                None if body.is_empty() => return Ok(cells),
                None => {
                    return Err(format!("unexpected {body:?} after a closing quote"));
                }
            }
        } else {
            let end = rest.find(',').unwrap_or(rest.len());
            cells.push(Cell {
                text: rest[..end].to_string(),
                quoted: false,
            });
            if end == rest.len() {
                return Ok(cells);
            }
            rest = &rest[end + 1..];
        }
    }
}
