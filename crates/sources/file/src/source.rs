//! The file source: JSON lines or CSV with a header row, optionally followed as it grows.
//!
//! ```text
//!  file ──1 MiB reads (blocking pool)──▶ buf ──split records──┬─ JSON: the line's text ──▶ Records
//!        cursor = {offset, line} of          CSV: parse the row ──┴─ a Value / InputError
//!        the first byte not yet consumed
//! ```
//!
//! Positions are byte offsets (with the line number, for messages): a step's resume is
//! the [`Span`] of cursors before and after it, and its hash covers exactly the bytes in
//! between, so `replay` re-reads that byte range and checks it is unchanged.
//!
//! Record boundaries:
//! - JSON: one document per `\n`-terminated line (a trailing `\r` is ignored). Blank
//!   lines are skipped. A line is handed over as its text, not parsed here: the
//!   combiner parses it, and a line that is not JSON (or not UTF-8) is reported at its
//!   `file:line (byte)` position by the reader (see [`sluice_source_sdk::bad_json`]).
//! - CSV (RFC 4180): a record ends at a `\n` outside double quotes, so a quoted cell
//!   may span lines. The record at byte 0 is the header naming the properties. A cell
//!   becomes a JSON integer, float or boolean when it is exactly such an unquoted
//!   literal (`42`, `-1.5e3`, `true`; not `007` or `+1`), is omitted when it is empty
//!   and unquoted, and is a string otherwise (so `"42"`, quoted, stays a string).
//! - Only complete records (ending in `\n`) are consumed, except the last record of a
//!   file that is not followed, at its end. A followed file never ends: a partial last
//!   line waits for its `\n`.
//!
//! Bad records this source finds (a CSV row that is not UTF-8, does not split into
//! cells or has the wrong number of them; a record above `max_document_size`) become
//! [`InputError`]s naming `file:line`; they are consumed (and hashed) but not emitted.
//!
//! Memory stays bounded by `max_document_size` plus one read: a record found to be
//! larger is streamed past (hashed, never held whole), keeping its first bytes for the
//! error. A step never ends inside one: when a followed file ends mid-record, the step
//! ends before it, and the next `queue` scans it again from its start. `replay` reads
//! its byte range the same way, in chunks, never past the step's end. Truncating or
//! replacing a followed file is not detected (a later replay of a changed range fails
//! with a hash mismatch), except that `seek` refuses a position past the file's end
//! ([`SourceError::Unavailable`]): what lay before it is gone.

use crate::config::{FileConfig, FileFormat};
use crate::watch::FileWatch;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use sluice_source_sdk::{
    FaultTolerance, InputError, Lag, Position, QueueLimits, Records, Resume, Source, SourceError,
    Span, Step, StepHasher, Unit, check_replay, replay_target,
};
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
    /// Records above this many bytes are bad input.
    max_document: u64,
    /// `replay`: reads stop at this offset, the end of the step replayed.
    limit: Option<u64>,
    /// The record being streamed past for being above `max_document`.
    oversized: Option<Oversized>,
    /// Followed: its change notifications, from the first wait on.
    watch: Option<FileWatch>,
    /// The file's size at the last read: how far behind the cursor is ([`Source::lag`]).
    size: u64,
}

/// A record above the size limit, consumed so far up to the cursor.
struct Oversized {
    position: Position,
    /// Its first bytes, for the error.
    raw: Vec<u8>,
    /// Where it begins, and the step's hash and bytes there (to end the step before it).
    begin: Cursor,
    hasher: StepHasher,
    step_bytes: u64,
    /// Bytes and newlines consumed; CSV: inside a quoted cell.
    len: u64,
    newlines: u64,
    quoted: bool,
}

/// What one step consumed so far.
struct Acc {
    records: usize,
    bytes: u64,
    errors: Vec<InputError>,
    hasher: StepHasher,
}

impl FileSource {
    pub fn new(name: &str, def: &FileConfig) -> FileSource {
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
            max_document: def.max_document_size,
            limit: None,
            oversized: None,
            watch: None,
            size: 0,
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
        self.oversized = None;
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
        let at = self.cursor.offset + self.buf.len() as u64;
        let want = self
            .limit
            .map_or(CHUNK, |limit| CHUNK.min(limit.saturating_sub(at) as usize));
        if want == 0 {
            self.file = Some(file);
            return Ok(0);
        }
        let buf = std::mem::take(&mut self.buf);
        let (file, buf, read, size) = tokio::task::spawn_blocking(move || {
            let (mut file, mut buf) = (file, buf);
            let old = buf.len();
            buf.resize(old + want, 0);
            let read = file.read(&mut buf[old..]);
            buf.truncate(old + *read.as_ref().unwrap_or(&0));
            let size = file.metadata().map(|m| m.len());
            (file, buf, read, size)
        })
        .await
        .expect("a file read does not panic");
        self.file = Some(file);
        self.buf = buf;
        if let Ok(size) = size {
            self.size = size;
        }
        read.map_err(|e| self.io_error(e))
    }

    /// Consumes buffered records while under `limits`; true when a limit stopped it.
    /// With `at_end`, the buffered bytes end with the last record even without `\n`.
    fn consume(
        &mut self,
        limits: QueueLimits,
        at_end: bool,
        out: &mut Records,
        acc: &mut Acc,
    ) -> bool {
        loop {
            if self.oversized.is_some() {
                if !self.skip_oversized(at_end, acc) {
                    return false;
                }
                continue;
            }
            if acc.records >= limits.max_records || acc.bytes >= limits.max_bytes {
                return true;
            }
            let data = &self.buf[self.start..];
            let position = Position {
                source: self.display.clone(),
                line: self.cursor.line,
                byte_offset: self.cursor.offset,
                unit: Unit::Line,
            };
            let Some((len, newlines)) = record_len(self.format, data, at_end) else {
                if data.len() as u64 > self.max_document {
                    self.oversized = Some(Oversized {
                        raw: data[..data.len().min(InputError::RAW_LIMIT)].to_vec(),
                        position,
                        begin: self.cursor,
                        hasher: acc.hasher.clone(),
                        step_bytes: acc.bytes,
                        len: 0,
                        newlines: 0,
                        quoted: false,
                    });
                    continue;
                }
                return false;
            };
            let raw = &data[..len];
            acc.hasher.append(raw);
            acc.bytes += len as u64;
            let parsed = if len as u64 > self.max_document {
                Err(self.too_large(len as u64))
            } else {
                parse(self.format, &mut self.header, raw, self.cursor.offset == 0)
            };
            match parsed {
                Ok(Some(Document::Json(text))) => {
                    acc.records += 1;
                    out.push_json(text, position, len);
                }
                Ok(Some(Document::Row(doc))) => {
                    acc.records += 1;
                    out.push_value(doc, position, len);
                }
                Ok(None) => {}
                Err(reason) => acc.errors.push(InputError::new(position, raw, reason)),
            }
            self.start += len;
            self.cursor.offset += len as u64;
            self.cursor.line += newlines;
        }
    }

    /// Streams the buffered bytes of the oversized record through the step; true when
    /// its end (or, `at_end`, the file's) was reached and its error recorded.
    fn skip_oversized(&mut self, at_end: bool, acc: &mut Acc) -> bool {
        let skip = self
            .oversized
            .as_mut()
            .expect("skipping an oversized record");
        let data = &self.buf[self.start..];
        let (end, newlines) = scan_record(self.format, data, &mut skip.quoted);
        let len = end.unwrap_or(data.len());
        acc.hasher.append(&data[..len]);
        acc.bytes += len as u64;
        skip.len += len as u64;
        skip.newlines += newlines;
        self.start += len;
        self.cursor.offset += len as u64;
        if end.is_none() && !at_end {
            return false;
        }
        let skip = self.oversized.take().expect("skipping an oversized record");
        self.cursor.line += skip.newlines;
        let reason = self.too_large(skip.len);
        acc.errors.push(InputError {
            position: skip.position,
            raw: skip.raw,
            reason,
        });
        true
    }

    /// Ends the step before the oversized record being skipped, if any: a followed
    /// file ended inside it, and a step must not end mid-record.
    fn unskip(&mut self, acc: &mut Acc) {
        if let Some(skip) = self.oversized.take() {
            acc.hasher = skip.hasher;
            acc.bytes = skip.step_bytes;
            self.reposition(skip.begin);
        }
    }

    fn too_large(&self, len: u64) -> String {
        format!(
            "the record is {len} bytes, above max_document_size ({} bytes); raise \
             sources.{}.file.max_document_size, or split the document",
            self.max_document, self.name
        )
    }

    /// Consumes records into `acc` until a limit, or the end of the input (for now:
    /// with `follow`, a partial last record waits).
    async fn read_into(
        &mut self,
        limits: QueueLimits,
        follow: bool,
        out: &mut Records,
        acc: &mut Acc,
    ) -> Result<(), SourceError> {
        loop {
            if self.consume(limits, self.eof, out, acc) || self.eof {
                return Ok(());
            }
            if self.fill().await? == 0 {
                if follow {
                    self.unskip(acc);
                    return Ok(());
                }
                self.eof = true;
            }
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
            max_journaled: u64::MAX,
        };
        let mut acc = Acc::new();
        while acc.bytes == 0 {
            let at_end = self.fill().await? == 0;
            self.consume(limits, at_end, &mut Records::default(), &mut acc);
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
            advances: false,
            unit_continues: false,
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

    async fn probe(&mut self) -> Result<(), SourceError> {
        let path = self.path.clone();
        let opened = tokio::task::spawn_blocking(move || {
            let file = File::open(&path)?;
            if file.metadata()?.is_dir() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "is a folder, not a file",
                ));
            }
            Ok(())
        });
        match opened.await {
            Ok(result) => result.map_err(|e| self.io_error(e)),
            Err(joined) => Err(self.io_error(std::io::Error::other(joined))),
        }
    }

    async fn seek(&mut self, position: &Value) -> Result<(), SourceError> {
        let span = Span::<Cursor>::from_value(&self.name, "seek to", position)?;
        if span.end.offset > 0 {
            // Reading on from a shorter file would silently skip what lay in between.
            let unavailable = |reason: String| SourceError::Unavailable {
                name: self.name.clone(),
                position: position.clone(),
                reason,
            };
            let (offset, line) = (span.end.offset, span.end.line);
            match tokio::fs::metadata(&self.path).await {
                Ok(meta) if meta.len() < offset => {
                    return Err(unavailable(format!(
                        "{} now has {} bytes, and this position is byte {offset} (line \
                         {line}): it was truncated or replaced, so bytes {}..{offset} \
                         cannot be read again",
                        self.display,
                        meta.len(),
                        meta.len()
                    )));
                }
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(unavailable(format!(
                        "{} no longer exists, and this position is byte {offset} (line \
                         {line})",
                        self.display
                    )));
                }
                Err(e) => return Err(self.io_error(e)),
            }
        }
        self.reposition(span.end);
        self.ensure_header().await
    }

    async fn replay(&mut self, step: &Resume, out: &mut Records) -> Result<Step, SourceError> {
        let span = replay_target::<Cursor>(&self.name, step)?;
        self.reposition(span.begin);
        self.ensure_header().await?;
        let first = out.len();
        let mut acc = Acc::new();
        let unbounded = QueueLimits {
            max_records: usize::MAX,
            max_bytes: u64::MAX,
            max_journaled: u64::MAX,
        };
        // Exactly the journaled bytes, ending where the step ended.
        self.limit = Some(span.end.offset);
        let read = self.read_into(unbounded, false, out, &mut acc).await;
        self.limit = None;
        if let Err(e) = read {
            out.truncate(first);
            return Err(e);
        }
        let replayed = acc.into_step(span.begin, self.cursor, false);
        if let Err(e) = check_replay(&self.name, step, replayed.resume.hash()) {
            out.truncate(first);
            return Err(e);
        }
        self.reposition(span.end);
        Ok(replayed)
    }

    /// A followed file waits for a change notification ([`FileWatch`]); the watch
    /// starts at the first wait, which returns at once (a line written before the watch
    /// began sends no notification). An unfollowed file reads on demand, and once read
    /// to its end nothing more comes.
    async fn ready(&mut self) {
        if !self.follow {
            if self.eof {
                std::future::pending::<()>().await;
            }
            return;
        }
        match &self.watch {
            Some(watch) => watch.changed().await,
            None => self.watch = Some(FileWatch::new(&self.name, &self.path)),
        }
    }

    async fn queue(&mut self, limits: QueueLimits, out: &mut Records) -> Result<Step, SourceError> {
        let begin = self.cursor;
        let mut acc = Acc::new();
        self.read_into(limits, self.follow, out, &mut acc).await?;
        let end_of_input = self.eof && self.start == self.buf.len();
        Ok(acc.into_step(begin, self.cursor, end_of_input))
    }

    /// The bytes after the cursor, as of the last read (a followed file's growth since
    /// shows at the next).
    fn lag(&self) -> Option<Lag> {
        Some(Lag::Bytes(self.size.saturating_sub(self.cursor.offset)))
    }
}

/// The length of the next record in `data` and the newlines in it, if it is complete.
fn record_len(format: FileFormat, data: &[u8], at_end: bool) -> Option<(usize, u64)> {
    match scan_record(format, data, &mut false) {
        (Some(len), newlines) => Some((len, newlines)),
        (None, newlines) if at_end && !data.is_empty() => Some((data.len(), newlines)),
        (None, _) => None,
    }
}

/// Scans `data`, which continues a record (CSV: inside a quoted cell if `quoted`), for
/// the record's end: its length in `data` if found, and the newlines scanned (up to
/// and including the end). Updates `quoted` for the next call.
fn scan_record(format: FileFormat, data: &[u8], quoted: &mut bool) -> (Option<usize>, u64) {
    match format {
        FileFormat::Json => match data.iter().position(|&b| b == b'\n') {
            Some(i) => (Some(i + 1), 1),
            None => (None, 0),
        },
        FileFormat::Csv => {
            let mut newlines = 0;
            for (i, &b) in data.iter().enumerate() {
                match b {
                    b'"' => *quoted = !*quoted,
                    b'\n' if !*quoted => return (Some(i + 1), newlines + 1),
                    b'\n' => newlines += 1,
                    _ => {}
                }
            }
            (None, newlines)
        }
    }
}

/// The document of one raw record.
enum Document<'a> {
    /// A JSON line's text, unparsed.
    Json(&'a [u8]),
    /// A CSV row's properties.
    Row(Value),
}

/// Reads one raw record; `None` for blank lines and the CSV header.
fn parse<'a>(
    format: FileFormat,
    header: &mut Option<Vec<String>>,
    raw: &'a [u8],
    first: bool,
) -> Result<Option<Document<'a>>, String> {
    let line = trim_eol(raw);
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    match format {
        FileFormat::Json => Ok(Some(Document::Json(line))),
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
            Ok(Some(Document::Row(Value::Object(doc))))
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
