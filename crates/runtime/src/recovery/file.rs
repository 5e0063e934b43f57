//! The recovery log in a local file (the embedded default [`LogStore`]): its format,
//! checksums, fsync, the torn tail, compaction and the one-writer lock; and the other
//! local files of a log's folder (the deployment id, `sluice inspect`).
//!
//! ```text
//!  <dir>/lock   flock'ed by the one writer; holds its pid for the "in use" message
//!  <dir>/log    [b"SLUICELG"][u32 LE format version]   the file header (12 bytes)
//!               then append-only records:  [u32 LE len][u32 LE crc32(payload)][payload JSON]
//! ```
//!
//! Formats ([`FORMAT_VERSION`]): 2 is this one. 1, the previous release's, is the same
//! records with no file header; it is read as such (its first bytes, a record length
//! below [`MAX_RECORD`], can never be the magic), and [`RecoveryLog::open`] rewrites it
//! at once in format 2, as a compaction does (atomically: a crash leaves the old log or
//! the new one). A log of a newer format is refused, naming both versions: an older
//! release never guesses at what a newer one wrote.
//!
//! Invariants:
//! - One writer per directory: [`RecoveryLog::open`] fails fast while another process
//!   holds the lock (the OS drops the lock when a process dies, even by SIGKILL).
//! - Every append is one write followed by fsync, and nothing is appended before the
//!   previous append is durable, so a crash can damage only the last record. Damage
//!   that no intact frame follows (a short record, a bad checksum, zero fill) is that
//!   torn last write: it is truncated on open with a warning. Damage followed by an
//!   intact frame (one whose checksum holds) is corruption, and an error (never guess
//!   past it).
//! - A frame whose checksum holds was written whole, so if its record does not
//!   deserialize (a newer release's record: records are read with
//!   `deny_unknown_fields`), that is corruption wherever it is, never a torn tail: it
//!   may be a commit, and cutting it would lose it.
//! - Compaction rewrites the latest state (last commit, pending intent) to a new file,
//!   fsyncs it, renames it over the log and fsyncs the directory: a crash at any point
//!   leaves either the old log or the new one.

use super::{Checkpoint, Intent, Latest, LogRecord, LogStore, RecoveryError, RecoveryLog};
use serde_json::Value;
use std::fmt::Write as _;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// The log is compacted when it grows past this: large enough that compaction is rare
/// (a checkpoint is ~1 KiB, so thousands of transactions), small enough that reading
/// it all at open is instant.
const COMPACT_AT: u64 = 4 << 20;
/// Upper bound on one record, to tell a damaged length from a real one. Below
/// 0x1000_0000, so the little-endian length that starts a format 1 log never reads as
/// the magic (its fourth byte, `I`, is above 0x10).
const MAX_RECORD: u32 = 256 << 20;
/// A record's frame header: length and checksum.
const FRAME_HEADER: usize = 8;
/// The first bytes of every log of format 2 and later.
pub const MAGIC: [u8; 8] = *b"SLUICELG";
/// The format this release writes, and the newest it reads.
pub const FORMAT_VERSION: u32 = 2;
/// The previous release's format: the same records, no file header.
const FORMAT_HEADERLESS: u32 = 1;
/// The magic and the format version.
const FILE_HEADER: usize = MAGIC.len() + 4;

/// The pipeline's deployment id, kept in `<root>/deployment`: created once (by the
/// first run that needs it), then the same across restarts. Epoch sinks name their
/// staging by it.
pub fn deployment_id(root: impl AsRef<Path>) -> Result<String, RecoveryError> {
    let root = root.as_ref();
    let path = root.join("deployment");
    let io = |action, error| RecoveryError::Io {
        path: path.clone(),
        action,
        error,
    };
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => return Ok(id.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io("read the deployment id", e)),
    }
    std::fs::create_dir_all(root).map_err(|e| io("create the folder", e))?;
    let id = new_deployment_id();
    let tmp = root.join("deployment.tmp");
    let mut file = File::create(&tmp).map_err(|e| io("write the deployment id", e))?;
    file.write_all(id.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| io("write the deployment id", e))?;
    std::fs::rename(&tmp, &path).map_err(|e| io("write the deployment id", e))?;
    File::open(root)
        .and_then(|dir| dir.sync_all())
        .map_err(|e| io("sync the folder", e))?;
    Ok(id)
}

/// A new deployment id, unique per process and instant: what [`deployment_id`] keeps,
/// and a cluster keeps in etcd instead (one for all its members).
pub fn new_deployment_id() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!(
        "{:016x}{:08x}",
        now.as_nanos() as u64 ^ u64::from(std::process::id()).rotate_left(32),
        crc32fast::hash(format!("{:?}{}", now, std::process::id()).as_bytes())
    )
}

pub(crate) fn io(
    path: &Path,
    action: &'static str,
) -> impl FnOnce(std::io::Error) -> RecoveryError {
    let path = path.to_path_buf();
    move |error| RecoveryError::Io {
        path,
        action,
        error,
    }
}

/// A log in a local file (see the module header).
struct FileLog {
    dir: PathBuf,
    path: PathBuf,
    file: File,
    len: u64,
    _lock: File,
}

impl RecoveryLog {
    /// Opens (creating if needed) the log in `dir`, taking its lock. Blocks (it reads
    /// the whole log and may fsync): async callers use [`open_async`](Self::open_async).
    ///
    /// After `open` returns, no other process can write this log until `self` drops, a
    /// torn last record has been truncated away, and the file is of [`FORMAT_VERSION`]
    /// (a format 1 log was rewritten in it). A log of a newer format, or a corrupt one,
    /// is refused and left as it is.
    pub fn open(dir: &Path) -> Result<RecoveryLog, RecoveryError> {
        let lock = lock_dir(dir)?;
        let path = dir.join("log");
        let existed = path.exists();
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io(&path, "open"))?;
        if !existed {
            // The new file's directory entry is durable before anything relies on it.
            sync_dir(dir)?;
        }
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io(&path, "read"))?;
        let mut contents = read_log(&path, &bytes)?;
        let (last_commit, pending_intent) = latest(std::mem::take(&mut contents.records));
        let mut store = FileLog {
            dir: dir.to_path_buf(),
            path,
            file,
            len: contents.valid_len,
            _lock: lock,
        };
        let latest = Latest {
            last_commit: last_commit.as_ref(),
            pending_intent: pending_intent.as_ref(),
        };
        if contents.version == FORMAT_HEADERLESS {
            tracing::info!(
                log = %store.path.display(),
                "rewriting a recovery log of format {FORMAT_HEADERLESS} (the previous \
                 release's) in format {FORMAT_VERSION}"
            );
            // Its latest state, with a file header; a torn tail is left behind too.
            store.compact(latest)?;
        } else {
            store.prepare(&contents, bytes.len() as u64)?;
        }
        Ok(RecoveryLog::over(
            Box::new(store),
            last_commit,
            pending_intent,
        ))
    }

    /// [`open`](Self::open) on a blocking task: what an async caller uses, so that the
    /// reads and fsyncs of opening never block an async worker.
    pub async fn open_async(dir: &Path) -> Result<RecoveryLog, RecoveryError> {
        let dir = dir.to_path_buf();
        crate::blocking::unblock(move || RecoveryLog::open(&dir)).await
    }
}

impl LogStore for FileLog {
    fn append(&mut self, record: &LogRecord, after: Latest<'_>) -> Result<(), RecoveryError> {
        let bytes = frame(record);
        self.file
            .write_all(&bytes)
            .map_err(io(&self.path, "append"))?;
        crate::failpoint::fail_point!(RECOVERY_FSYNC => io(&self.path, "fsync")(crate::failpoint::disk_full()));
        self.file.sync_data().map_err(io(&self.path, "fsync"))?;
        self.len += bytes.len() as u64;
        if self.len > COMPACT_AT {
            self.compact(after)?;
        }
        Ok(())
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }
}

impl FileLog {
    /// Readies a log just read for appends: a new file gets its header, a torn tail
    /// is cut off (see the module invariants).
    fn prepare(&mut self, contents: &Contents, read: u64) -> Result<(), RecoveryError> {
        if let Some(reason) = &contents.torn {
            tracing::warn!(
                log = %self.path.display(),
                at = contents.valid_len,
                dropped = read - contents.valid_len,
                "truncating a torn last record of the recovery log ({reason}); \
                 it was never acknowledged"
            );
        }
        let file = &mut self.file;
        if contents.valid_len < FILE_HEADER as u64 {
            // A new log, or one torn while its header was written: nothing was ever
            // appended to it.
            file.set_len(0).map_err(io(&self.path, "truncate"))?;
            file.seek(SeekFrom::Start(0))
                .map_err(io(&self.path, "seek"))?;
            file.write_all(&file_header())
                .map_err(io(&self.path, "write the file header"))?;
            file.sync_all().map_err(io(&self.path, "fsync"))?;
            self.len = FILE_HEADER as u64;
        } else if contents.torn.is_some() {
            file.set_len(contents.valid_len)
                .map_err(io(&self.path, "truncate a torn tail"))?;
            file.sync_all().map_err(io(&self.path, "fsync"))?;
        }
        file.seek(SeekFrom::Start(self.len))
            .map_err(io(&self.path, "seek"))?;
        Ok(())
    }

    /// Rewrites the log as its latest state (see the module invariants).
    fn compact(&mut self, latest: Latest<'_>) -> Result<(), RecoveryError> {
        let (file, len) = rewrite(&self.dir, &self.path, latest)?;
        self.file = file;
        self.len = len;
        tracing::debug!(log = %self.path.display(), bytes = self.len, "compacted the recovery log");
        Ok(())
    }
}

/// Takes the lock of the recovery log directory `dir` (creating it), as
/// [`RecoveryLog::open`] does, for changes beside the log (the applied spec) that must
/// not happen while a pipeline runs. Held until the file drops.
pub fn lock_dir(dir: &Path) -> Result<File, RecoveryError> {
    std::fs::create_dir_all(dir).map_err(io(dir, "create the directory"))?;
    let path = dir.join("lock");
    let mut lock = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io(&path, "open the lock file"))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut text = String::new();
            let _ = lock.read_to_string(&mut text);
            return Err(RecoveryError::InUse {
                dir: dir.to_path_buf(),
                pid: text.trim().parse().ok(),
            });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(io(&path, "lock")(e)),
    }
    lock.set_len(0).map_err(io(&path, "write the lock file"))?;
    write!(lock, "{}", std::process::id()).map_err(io(&path, "write the lock file"))?;
    Ok(lock)
}

pub(crate) fn sync_dir(dir: &Path) -> Result<(), RecoveryError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir, "fsync the directory"))
}

fn file_header() -> [u8; FILE_HEADER] {
    let mut header = [0; FILE_HEADER];
    header[..MAGIC.len()].copy_from_slice(&MAGIC);
    header[MAGIC.len()..].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    header
}

fn frame(record: &LogRecord) -> Vec<u8> {
    let payload = serde_json::to_vec(record).expect("a log record serializes");
    let mut out = Vec::with_capacity(FRAME_HEADER + payload.len());
    out.extend((payload.len() as u32).to_le_bytes());
    out.extend(crc32fast::hash(&payload).to_le_bytes());
    out.extend(payload);
    out
}

/// What a log file holds.
struct Contents {
    /// Its format version: [`FORMAT_VERSION`], or [`FORMAT_HEADERLESS`].
    version: u32,
    records: Vec<LogRecord>,
    /// Bytes up to the end of the last intact record (or of the file header): 0 for an
    /// empty file, or one whose header was torn.
    valid_len: u64,
    /// Why the bytes after `valid_len` are a torn last write, if there are any.
    torn: Option<String>,
}

/// Reads the log file `path` whose bytes are `bytes` (pure): its format, then every
/// record (see the module invariants for what is torn and what is corrupt).
fn read_log(path: &Path, bytes: &[u8]) -> Result<Contents, RecoveryError> {
    let (version, start) = match bytes.split_first_chunk::<FILE_HEADER>() {
        Some((header, _)) if header.starts_with(&MAGIC) => {
            let version = u32::from_le_bytes(header[MAGIC.len()..].try_into().expect("4 bytes"));
            if version > FORMAT_VERSION {
                return Err(RecoveryError::NewerFormat {
                    path: path.to_path_buf(),
                    found: version,
                    supported: FORMAT_VERSION,
                });
            }
            if version <= FORMAT_HEADERLESS {
                return Err(RecoveryError::Corrupt {
                    path: path.to_path_buf(),
                    version,
                    offset: MAGIC.len() as u64,
                    reason: format!("a file header of format {version}, which has none"),
                });
            }
            (version, FILE_HEADER)
        }
        // The start of a header whose write was torn (a crash as the log was created),
        // or an empty file: a log with nothing in it yet.
        None if MAGIC.starts_with(&bytes[..bytes.len().min(MAGIC.len())]) => {
            return Ok(Contents {
                version: FORMAT_VERSION,
                records: Vec::new(),
                valid_len: 0,
                torn: (!bytes.is_empty()).then(|| "a torn file header".to_string()),
            });
        }
        _ => (FORMAT_HEADERLESS, 0),
    };
    let corrupt = |(offset, reason)| RecoveryError::Corrupt {
        path: path.to_path_buf(),
        version,
        offset,
        reason,
    };
    let mut records = Vec::new();
    let mut at = start;
    while at < bytes.len() {
        match read_frame(&bytes[at..]) {
            Ok(payload) => {
                let record = serde_json::from_slice(payload).map_err(|e| {
                    corrupt((
                        at as u64,
                        format!(
                            "a record whose checksum holds does not deserialize ({e}): \
                             written by a newer sluice release?"
                        ),
                    ))
                })?;
                records.push(record);
                at += FRAME_HEADER + payload.len();
            }
            // Only the last append can be torn, so damage is a torn tail exactly when
            // no intact frame follows it (whatever the damaged header claims).
            Err(reason) if !(at + 1..bytes.len()).any(|i| read_frame(&bytes[i..]).is_ok()) => {
                return Ok(Contents {
                    version,
                    records,
                    valid_len: at as u64,
                    torn: Some(reason),
                });
            }
            Err(reason) => return Err(corrupt((at as u64, reason))),
        }
    }
    Ok(Contents {
        version,
        records,
        valid_len: at as u64,
        torn: None,
    })
}

/// The payload of the frame at the start of `bytes` if its checksum holds (so it was
/// written whole), or why it does not.
fn read_frame(bytes: &[u8]) -> Result<&[u8], String> {
    let Some((header, rest)) = bytes.split_first_chunk::<FRAME_HEADER>() else {
        return Err(format!("{} bytes of a record header", bytes.len()));
    };
    let len = u32::from_le_bytes(header[..4].try_into().expect("4 bytes"));
    let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
    // No record is empty JSON: a zero length is zero fill (whose checksum, of nothing,
    // would hold).
    if len == 0 || len > MAX_RECORD {
        return Err(format!("record length {len} is implausible"));
    }
    let Some(payload) = rest.get(..len as usize) else {
        return Err(format!(
            "record of {len} bytes, only {} present",
            rest.len()
        ));
    };
    if crc32fast::hash(payload) != crc {
        return Err("checksum mismatch".to_string());
    }
    Ok(payload)
}

/// The last commit, and the last intent if no commit follows it and it is newer than
/// that commit.
fn latest(records: Vec<LogRecord>) -> (Option<Checkpoint>, Option<Intent>) {
    let (mut commit, mut intent) = (None::<Checkpoint>, None::<Intent>);
    for record in records {
        match record {
            LogRecord::Commit(c) => {
                commit = Some(c);
                intent = None;
            }
            LogRecord::Intent(i) => intent = Some(i),
        }
    }
    let committed = commit.as_ref().map_or(0, |c| c.txn);
    (commit, intent.filter(|i| i.txn > committed))
}

/// The latest state of the log in `dir` (last commit, pending intent), read without
/// taking its lock (the caller holds it, or a lock that keeps its writer away: the
/// materialization folder's); none of either for a log that does not exist.
pub fn read_latest(dir: &Path) -> Result<(Option<Checkpoint>, Option<Intent>), RecoveryError> {
    let path = dir.join("log");
    let bytes = match std::fs::read(&path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((None, None)),
        Err(e) => return Err(io(&path, "read")(e)),
    };
    let contents = read_log(&path, &bytes)?;
    Ok(latest(contents.records))
}

/// Changes the last commit of the log in `dir` (whose writers `_held` keeps away: the
/// lock of the log's folder, or of the materialization folder of its split shards)
/// with `change`, keeping its pending intent; a log with no commit gets one of
/// transaction 0 (what `change` made of the empty checkpoint). The log is rewritten as
/// its latest state the way a compaction rewrites it: written beside, fsync'ed, renamed
/// over, the folder fsync'ed, so a crash leaves the old log or the new one, never part
/// of the change.
pub fn amend_last_commit(
    dir: &Path,
    _held: &File,
    change: impl FnOnce(&mut Checkpoint) -> Result<(), RecoveryError>,
) -> Result<Checkpoint, RecoveryError> {
    let (last_commit, pending_intent) = read_latest(dir)?;
    let mut commit = last_commit.unwrap_or_default();
    change(&mut commit)?;
    let latest = Latest {
        last_commit: Some(&commit),
        pending_intent: pending_intent.as_ref(),
    };
    rewrite(dir, &dir.join("log"), latest)?;
    Ok(commit)
}

/// Writes `latest` as the whole log at `path` (see [`amend_last_commit`]); returns the
/// new file, open at its end.
fn rewrite(dir: &Path, path: &Path, latest: Latest<'_>) -> Result<(File, u64), RecoveryError> {
    let tmp = dir.join("log.compact");
    let mut bytes = file_header().to_vec();
    if let Some(commit) = latest.last_commit {
        bytes.extend(frame(&LogRecord::Commit(commit.clone())));
    }
    if let Some(intent) = latest.pending_intent {
        bytes.extend(frame(&LogRecord::Intent(intent.clone())));
    }
    let mut file = File::create(&tmp).map_err(io(&tmp, "create"))?;
    file.write_all(&bytes).map_err(io(&tmp, "write"))?;
    file.sync_all().map_err(io(&tmp, "fsync"))?;
    std::fs::rename(&tmp, path).map_err(io(path, "replace"))?;
    sync_dir(dir)?;
    file.seek(SeekFrom::End(0)).map_err(io(path, "seek"))?;
    Ok((file, bytes.len() as u64))
}

/// Forgets the log in `dir` (a deleted materialization starts over); `_held` is its
/// lock ([`lock_dir`]), so no pipeline runs on it. Returns once the removal is durable.
pub fn remove(dir: &Path, _held: &File) -> Result<(), RecoveryError> {
    for name in ["log", "log.compact"] {
        let path = dir.join(name);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&path, "remove")(e)),
        }
    }
    sync_dir(dir)
}

/// Makes the log in `to` a durable copy of the log in `from` (a split shard's first
/// state: its parent's last commit and pending intent), or none when `from` has none.
/// Both logs' locks are the caller's to hold.
pub fn copy(from: &Path, to: &Path) -> Result<(), RecoveryError> {
    std::fs::create_dir_all(to).map_err(io(to, "create the directory"))?;
    let (source, copy) = (from.join("log"), to.join("log"));
    match std::fs::read(&source) {
        Ok(bytes) => {
            let mut out = File::create(&copy).map_err(io(&copy, "create"))?;
            out.write_all(&bytes).map_err(io(&copy, "write"))?;
            out.sync_all().map_err(io(&copy, "fsync"))?;
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => match std::fs::remove_file(&copy) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&copy, "remove")(e)),
        },
        Err(e) => return Err(io(&source, "read")(e)),
    }
    sync_dir(to)
}

/// Renders what the log in `dir` holds, for `sluice inspect checkpoint`. Reads without
/// taking the lock and changes nothing, so it works while a pipeline runs.
pub fn inspect(dir: &Path) -> Result<String, RecoveryError> {
    let path = dir.join("log");
    let bytes = std::fs::read(&path).map_err(io(&path, "read"))?;
    let contents = read_log(&path, &bytes)?;
    let count = contents.records.len();
    let mut out = format!(
        "recovery log {} (format {}, {} bytes, {count} records)\n",
        path.display(),
        contents.version,
        bytes.len()
    );
    if contents.version == FORMAT_HEADERLESS {
        let _ = writeln!(
            out,
            "written by the previous release: rewritten in format {FORMAT_VERSION} at next open"
        );
    }
    if let Some(reason) = &contents.torn {
        let _ = writeln!(out, "torn last record ({reason}): dropped at next open");
    }
    let (commit, intent) = latest(contents.records);
    let json = |v: &Value| serde_json::to_string(v).expect("JSON serializes");
    match &commit {
        None => out.push_str("last commit: none\n"),
        Some(c) => {
            let _ = writeln!(out, "last commit: transaction {}", c.txn);
            for (name, position) in &c.sources {
                let _ = writeln!(out, "  source {name}: {}", json(position));
            }
            for (name, checkpoint) in &c.driver_checkpoints {
                let _ = writeln!(out, "  materialization {name}: {}", json(checkpoint));
            }
        }
    }
    match &intent {
        None => out.push_str("pending intent: none\n"),
        Some(i) => {
            let _ = writeln!(
                out,
                "pending intent: transaction {} (replayed at next start)",
                i.txn
            );
            for (name, steps) in &i.steps {
                for step in steps {
                    let step = serde_json::to_value(step).expect("a resume serializes");
                    let _ = writeln!(out, "  source {name}: {}", json(&step));
                }
            }
        }
    }
    Ok(out)
}

/// [`read_log`] for the fuzz target (crates/fuzz, issue 34): the valid length of
/// `bytes` read as a log file, or why they are not one.
#[doc(hidden)]
pub fn read_log_valid_len(bytes: &[u8]) -> Result<u64, RecoveryError> {
    read_log(Path::new("fuzz.log"), bytes).map(|contents| contents.valid_len)
}
