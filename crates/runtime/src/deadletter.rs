//! Dead letters: the documents a source with `on_error: skip` rejected, each with its
//! reason and position, as JSON lines.
//!
//! ```text
//!  reader ──batch of T──▶ rejected? ──records {txn: T, ..}──▶ writer thread: append + fsync
//!         ◀──────────────────────────── durable ───────────┘   ──▶ send T to the committer
//!  start  ──recovered checkpoint (txn C)──▶ writer thread: drop every record of a txn > C,
//!                                           and a torn tail
//! ```
//!
//! One line per rejected document:
//! `{"txn": 7, "source": "views-file", "position": "views.jsonl:551 (byte 30190)",
//! "reason": "invalid JSON: ...", "raw": "{\"user_id\": ..."}`, with either
//! `document` (the document, when it is JSON of at most [`DOCUMENT_LIMIT`] bytes) or
//! `raw` (lossy UTF-8 text, `truncated: true` when cut): the text of a document that is
//! not JSON or is larger (cut to [`DOCUMENT_LIMIT`] bytes), or the start of a record its
//! source could not read ([`sluice_source_sdk::InputError::raw`]). A document the reader
//! has as JSON text is parsed here, once rejected: reading never builds its `Value`.
//!
//! Invariants:
//! - A transaction's records are durable (fsync'ed) before its batch reaches the
//!   committer, so before it can commit: a crash never loses the record of a skip.
//! - After [`DeadLetterFile::open`] with the recovered checkpoint's transaction `C`, the
//!   file holds exactly the records of transactions `1..=C` that committed. Records of
//!   an attempt that did not commit (a replayed or abandoned transaction) are removed
//!   before it is read again, so a replay never duplicates a record.
//! - Records are appended in transaction order (one writer: the materialization's
//!   reader, through its writer thread), which is what lets `open` cut at the first
//!   newer one.
//! - One writer per file, also across the attempts of a run that restarts in-process:
//!   the files are owned by one thread per attempt ([`DeadLetterWriter::spawn`]), which
//!   ends only once the reader has dropped its [`DeadLetterWriter`] and the write in
//!   hand (if any) is done; the run awaits [`DeadLetterThread::join`] before it returns,
//!   so the next attempt's open (which cuts the files back) never meets a write of the
//!   last. (A write on `spawn_blocking` would not do: aborting the task that awaits it
//!   does not stop it.)
//! - `open` reads the whole file once; keep dead-letter files small by moving them away
//!   once handled (a missing file is simply created again).
//!
//! Threads: opening, cutting, appending and fsync'ing run on the writer thread
//! (`sluice-dead-letters`), never on an async worker; the reader's task sends it each
//! transaction's records and awaits their durability.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use tokio::sync::oneshot;

/// The largest parsed document written whole; a larger one is cut to its first bytes.
pub const DOCUMENT_LIMIT: usize = 64 << 10;

/// One rejected document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The transaction that skipped it.
    pub txn: u64,
    /// The source's name in the pipeline file.
    pub source: String,
    /// `file:line (byte offset)` or the source's own position.
    pub position: String,
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub document: Option<Value>,
    /// The text (lossy UTF-8) when there is no parsed document, or it was too large.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub raw: Option<String>,
    /// `raw` is only the start of the record.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

impl DeadLetter {
    /// A record whose raw text is all there is (it did not parse).
    pub fn raw(source: &str, position: String, reason: String, raw: &[u8], cut: bool) -> Self {
        DeadLetter {
            txn: 0,
            source: source.to_string(),
            position,
            reason,
            document: None,
            raw: Some(String::from_utf8_lossy(raw).into_owned()),
            truncated: cut,
        }
    }

    /// A record of a document its source built, written as text cut to
    /// [`DOCUMENT_LIMIT`] bytes if larger.
    pub fn document(source: &str, position: String, reason: String, doc: Value) -> Self {
        let text = doc.to_string();
        if text.len() <= DOCUMENT_LIMIT {
            return DeadLetter::parsed(source, position, reason, doc);
        }
        DeadLetter::text_cut(source, position, reason, text.as_bytes())
    }

    /// A record of a document given as JSON text: parsed if it is JSON and fits in
    /// [`DOCUMENT_LIMIT`] bytes, else its text (cut to that many bytes).
    pub fn json(source: &str, position: String, reason: String, text: &[u8]) -> Self {
        let parsed = (text.len() <= DOCUMENT_LIMIT)
            .then(|| serde_json::from_slice(text).ok())
            .flatten();
        match parsed {
            Some(doc) => DeadLetter::parsed(source, position, reason, doc),
            None => DeadLetter::text_cut(source, position, reason, text),
        }
    }

    fn parsed(source: &str, position: String, reason: String, doc: Value) -> Self {
        DeadLetter {
            txn: 0,
            source: source.to_string(),
            position,
            reason,
            document: Some(doc),
            raw: None,
            truncated: false,
        }
    }

    /// `text`, cut to [`DOCUMENT_LIMIT`] bytes (before a UTF-8 sequence) if longer.
    fn text_cut(source: &str, position: String, reason: String, text: &[u8]) -> Self {
        if text.len() <= DOCUMENT_LIMIT {
            return DeadLetter::raw(source, position, reason, text, false);
        }
        let mut end = DOCUMENT_LIMIT;
        // Back up over continuation bytes (0b10xx_xxxx) to the start of a character.
        while end > 0 && text[end] & 0xc0 == 0x80 {
            end -= 1;
        }
        DeadLetter::raw(source, position, reason, &text[..end], true)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DeadLetterError {
    /// The file system failed; a retry may help once it is fixed (e.g. space freed).
    #[error("dead-letter file {}: {error}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        error: std::io::Error,
    },
    /// Someone else's text in the file: refuse to cut or append to it.
    #[error(
        "dead-letter file {} line {line} is not a dead-letter record ({reason}); \
         move the file away and run again",
        path.display()
    )]
    Corrupt {
        path: PathBuf,
        line: u64,
        reason: String,
    },
    /// The writer thread could not start (resources exhausted) or panicked.
    #[error("dead-letter writer thread: {0}")]
    Thread(String),
}

/// An open dead-letter file: one writer, appending whole transactions.
#[derive(Debug)]
pub struct DeadLetterFile {
    path: PathBuf,
    file: File,
}

impl DeadLetterFile {
    /// Opens (or creates, with its folder) the file at `path`, keeping only the records
    /// of transactions up to `committed` (see the module docs). Returns after the cut,
    /// if any, is fsync'ed.
    pub fn open(path: &Path, committed: u64) -> Result<DeadLetterFile, DeadLetterError> {
        let io = |error| DeadLetterError::Io {
            path: path.to_path_buf(),
            error,
        };
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        if let Some(dir) = dir {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let existed = path.exists();
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .open(path)
            .map_err(io)?;
        if !existed {
            // The new file's name is durable once its folder is.
            if let Some(dir) = dir {
                File::open(dir).and_then(|d| d.sync_all()).map_err(io)?;
            }
        }
        let keep = committed_prefix(path, &file, committed)?;
        if keep < file.metadata().map_err(io)?.len() {
            file.set_len(keep).map_err(io)?;
            file.sync_all().map_err(io)?;
        }
        Ok(DeadLetterFile {
            path: path.to_path_buf(),
            file,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `letters` as records of transaction `txn` (setting their `txn`); returns
    /// only after they are fsync'ed.
    pub fn append<'a>(
        &mut self,
        txn: u64,
        letters: impl IntoIterator<Item = &'a mut DeadLetter>,
    ) -> Result<(), DeadLetterError> {
        let mut text = Vec::new();
        for letter in letters {
            letter.txn = txn;
            serde_json::to_writer(&mut text, &*letter).expect("a dead letter serializes");
            text.push(b'\n');
        }
        let io = |error| DeadLetterError::Io {
            path: self.path.clone(),
            error,
        };
        self.file.write_all(&text).map_err(io)?;
        self.file.sync_data().map_err(io)
    }
}

/// A record's identity within a batch: (source index, line, byte offset).
pub type RecordId = (usize, u64, u64);

/// The dead-letter files of one materialization's sources.
#[derive(Debug)]
pub struct DeadLetters {
    files: Vec<DeadLetterFile>,
    /// Per source (by index): its file, if it skips bad input.
    of_source: Vec<Option<usize>>,
}

impl DeadLetters {
    /// Opens the files of sources given as their dead-letter paths (`None`: the source
    /// fails on bad input), each cut to transaction `committed` (see
    /// [`DeadLetterFile::open`]). An error names the source index.
    pub fn open<'a>(
        sources: impl IntoIterator<Item = Option<&'a Path>>,
        committed: u64,
    ) -> Result<DeadLetters, (usize, DeadLetterError)> {
        let mut out = DeadLetters {
            files: Vec::new(),
            of_source: Vec::new(),
        };
        for (source, path) in sources.into_iter().enumerate() {
            let index = match path {
                None => None,
                Some(path) => Some(match out.files.iter().position(|f| f.path == path) {
                    Some(i) => i,
                    None => {
                        let file =
                            DeadLetterFile::open(path, committed).map_err(|e| (source, e))?;
                        out.files.push(file);
                        out.files.len() - 1
                    }
                }),
            };
            out.of_source.push(index);
        }
        Ok(out)
    }

    /// Appends transaction `txn`'s records, sorted by source and position, each to its
    /// source's file; returns once all are fsync'ed. An error names the source index.
    ///
    /// # Panics
    /// If a record's source does not skip bad input (a caller bug).
    pub fn write(
        &mut self,
        txn: u64,
        letters: &mut [(RecordId, DeadLetter)],
    ) -> Result<(), (usize, DeadLetterError)> {
        crate::failpoint::fail_point!(DEAD_LETTER_WRITE);
        letters.sort_by_key(|(id, _)| *id);
        let of_source = &self.of_source;
        for group in letters.chunk_by_mut(|a, b| of_source[a.0.0] == of_source[b.0.0]) {
            let source = group[0].0.0;
            let file = of_source[source].expect("only skipping sources reject");
            self.files[file]
                .append(txn, group.iter_mut().map(|(_, l)| l))
                .map_err(|e| (source, e))?;
        }
        Ok(())
    }
}

/// A source's failure to open or write its file: the source index and the error.
pub type SourceFailure = (usize, DeadLetterError);

/// One transaction's records for the writer thread, and where it answers.
struct WriteRequest {
    txn: u64,
    letters: Vec<(RecordId, DeadLetter)>,
    durable: oneshot::Sender<Result<(), SourceFailure>>,
}

/// The reader's end of the dead-letter writer thread (see the module invariants).
/// Dropping it lets the thread end once the write in hand is done.
pub struct DeadLetterWriter {
    /// `None` when no source skips bad input: no thread, nothing to write.
    requests: Option<mpsc::Sender<WriteRequest>>,
    /// The result of opening the files, until [`opened`](Self::opened) takes it.
    opened: Option<oneshot::Receiver<Result<(), SourceFailure>>>,
    /// The first skipping source: named by failures of the thread itself.
    first: usize,
}

/// The dead-letter writer thread of one attempt, for the run to join.
pub struct DeadLetterThread {
    /// Closed (its sender dropped) by the thread as its last act, after its files are.
    ended: Option<oneshot::Receiver<()>>,
}

impl DeadLetterWriter {
    /// Starts the thread that opens the files of sources given as their dead-letter
    /// paths (as [`DeadLetters::open`], cut to transaction `committed`) and then writes
    /// what [`write`](Self::write) sends, until the writer drops. No source skipping:
    /// no thread.
    pub fn spawn(
        paths: Vec<Option<PathBuf>>,
        committed: u64,
    ) -> (DeadLetterWriter, DeadLetterThread) {
        if paths.iter().all(Option::is_none) {
            let none = DeadLetterWriter {
                requests: None,
                opened: None,
                first: 0,
            };
            return (none, DeadLetterThread { ended: None });
        }
        let first = paths.iter().position(Option::is_some).unwrap_or_default();
        let (requests, received) = mpsc::channel::<WriteRequest>();
        let (opened_tx, opened) = oneshot::channel();
        let (ended_tx, ended) = oneshot::channel::<()>();
        let spawned = std::thread::Builder::new()
            .name("sluice-dead-letters".into())
            .spawn(move || {
                let files = DeadLetters::open(paths.iter().map(Option::as_deref), committed);
                let mut files = match files {
                    Ok(files) => {
                        let _ = opened_tx.send(Ok(()));
                        files
                    }
                    Err(err) => {
                        let _ = opened_tx.send(Err(err));
                        return;
                    }
                };
                while let Ok(request) = received.recv() {
                    let mut letters = request.letters;
                    let _ = request.durable.send(files.write(request.txn, &mut letters));
                }
                drop(files);
                drop(ended_tx);
            });
        let opened = match spawned {
            // Detached: `ended` is how the run joins it.
            Ok(_) => opened,
            // The closure, with the senders it owns, is gone: answer in its place.
            Err(err) => {
                let (report, failed) = oneshot::channel();
                let reason = format!("cannot start it: {err}");
                let _ = report.send(Err((first, DeadLetterError::Thread(reason))));
                failed
            }
        };
        let writer = DeadLetterWriter {
            requests: Some(requests),
            opened: Some(opened),
            first,
        };
        (writer, DeadLetterThread { ended: Some(ended) })
    }

    /// Whether every file opened (and was cut back); an error names the source index.
    /// Call once, before the first write.
    pub async fn opened(&mut self) -> Result<(), SourceFailure> {
        match self.opened.take() {
            None => Ok(()),
            Some(opened) => (opened.await).unwrap_or_else(|_| Err(self.thread_gone())),
        }
    }

    /// Appends transaction `txn`'s records (see [`DeadLetters::write`]) on the writer
    /// thread; returns once all are fsync'ed.
    pub async fn write(
        &self,
        txn: u64,
        letters: Vec<(RecordId, DeadLetter)>,
    ) -> Result<(), SourceFailure> {
        let Some(requests) = self.requests.as_ref().filter(|_| !letters.is_empty()) else {
            return Ok(());
        };
        let (durable, answer) = oneshot::channel();
        let request = WriteRequest {
            txn,
            letters,
            durable,
        };
        requests.send(request).map_err(|_| self.thread_gone())?;
        (answer.await).unwrap_or_else(|_| Err(self.thread_gone()))
    }

    /// The writer thread ended without answering: it panicked.
    fn thread_gone(&self) -> SourceFailure {
        let reason = "it ended without answering (a panic)".to_string();
        (self.first, DeadLetterError::Thread(reason))
    }
}

impl DeadLetterThread {
    /// Returns once the writer thread has ended (its writer dropped first): no write of
    /// it lands after this returns.
    pub async fn join(self) {
        if let Some(ended) = self.ended {
            let _ = ended.await;
        }
    }
}

/// The length of the file's prefix holding whole records of transactions up to
/// `committed`.
fn committed_prefix(path: &Path, file: &File, committed: u64) -> Result<u64, DeadLetterError> {
    #[derive(Deserialize)]
    struct Txn {
        txn: u64,
    }
    let mut reader = BufReader::new(file);
    let (mut keep, mut line_no, mut line) = (0u64, 0u64, Vec::new());
    loop {
        line.clear();
        let read = reader
            .read_until(b'\n', &mut line)
            .map_err(|error| DeadLetterError::Io {
                path: path.to_path_buf(),
                error,
            })?;
        line_no += 1;
        // The end, or a torn last line (a crash mid-append): cut it.
        if read == 0 || line.last() != Some(&b'\n') {
            return Ok(keep);
        }
        match serde_json::from_slice::<Txn>(&line) {
            Ok(Txn { txn }) if txn > committed => return Ok(keep),
            Ok(_) => keep += read as u64,
            Err(e) => {
                return Err(DeadLetterError::Corrupt {
                    path: path.to_path_buf(),
                    line: line_no,
                    reason: e.to_string(),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn letter(n: u64) -> DeadLetter {
        DeadLetter::raw("s", format!("f:{n}"), "bad".into(), b"{", false)
    }

    fn txns(path: &Path) -> Vec<u64> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str::<DeadLetter>(l).unwrap().txn)
            .collect()
    }

    #[test]
    fn reopening_drops_records_of_transactions_after_the_committed_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a/dead-letters.jsonl");
        let mut file = DeadLetterFile::open(&path, 0).unwrap();
        file.append(1, &mut [letter(1), letter(2)]).unwrap();
        file.append(3, &mut [letter(3)]).unwrap();
        file.append(4, &mut [letter(4)]).unwrap();
        drop(file);
        let mut file = DeadLetterFile::open(&path, 3).unwrap();
        assert_eq!(txns(&path), [1, 1, 3]);
        file.append(4, &mut [letter(5)]).unwrap();
        assert_eq!(txns(&path), [1, 1, 3, 4]);
    }

    #[test]
    fn a_torn_last_line_is_cut_and_a_foreign_line_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dead-letters.jsonl");
        DeadLetterFile::open(&path, 0)
            .unwrap()
            .append(1, &mut [letter(1)])
            .unwrap();
        let mut text = std::fs::read(&path).unwrap();
        text.extend_from_slice(b"{\"txn\": 2, \"sou");
        std::fs::write(&path, &text).unwrap();
        DeadLetterFile::open(&path, 5).unwrap();
        assert_eq!(txns(&path), [1]);

        std::fs::write(&path, b"hello\n").unwrap();
        let err = DeadLetterFile::open(&path, 5).unwrap_err().to_string();
        assert!(err.contains("line 1 is not a dead-letter record"), "{err}");
    }

    #[test]
    fn a_large_document_is_written_as_the_start_of_its_text() {
        let doc = serde_json::json!({ "big": "é".repeat(DOCUMENT_LIMIT) });
        let text = doc.to_string();
        let built = DeadLetter::document("s", "f:1".into(), "bad".into(), doc);
        let given = DeadLetter::json("s", "f:1".into(), "bad".into(), text.as_bytes());
        assert_eq!(built, given);
        assert!(built.truncated && built.document.is_none());
        let raw = built.raw.unwrap();
        assert!(
            raw.len() <= DOCUMENT_LIMIT && text.starts_with(&raw),
            "cut at a character"
        );
    }

    #[test]
    fn json_text_is_written_as_its_document_or_as_text_when_it_does_not_parse() {
        let letter = DeadLetter::json("s", "f:1".into(), "bad".into(), br#"{"a": 1}"#);
        assert_eq!(letter.document, Some(serde_json::json!({"a": 1})));
        assert_eq!(letter.raw, None);

        let letter = DeadLetter::json("s", "f:2".into(), "bad".into(), b"{\"a\": \xff");
        assert_eq!((letter.document, letter.truncated), (None, false));
        assert_eq!(letter.raw.as_deref(), Some("{\"a\": \u{fffd}"));
    }
}
