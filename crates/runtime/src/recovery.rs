//! The recovery log: durable checkpoints and step intents of one pipeline shard.
//!
//! ```text
//!  <dir>/lock   flock'ed by the one writer; holds its pid for the "in use" message
//!  <dir>/log    [b"SLUICELG"][u32 LE format version]   the file header (12 bytes)
//!               then append-only records:  [u32 LE len][u32 LE crc32(payload)][payload JSON]
//!                 Intent{txn 7}  Commit{txn 7}  Intent{txn 8}  Commit{txn 8} ...
//! ```
//!
//! Per transaction `T` the runtime writes `Intent(T)` (the steps it queued, so they can
//! be replayed exactly) before any store may commit `T`, and `Commit(T)` (resume
//! positions and driver checkpoints) once the stores have committed. Both return only
//! after fsync. At startup, [`plan_recovery`] (pure) combines what the log holds with
//! what an authoritative store reports in `Opened` ([`StoreCheckpoint`]); when the store
//! says where to begin, [`RecoveryLog::adopt`] records that checkpoint as the log's last
//! commit, even when it is older (a store restored from a backup): transaction numbers
//! then go back, and the log goes on from there.
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
//! - An intent is pending only while no commit record follows it: `Intent(T+1)` is
//!   written only after `Commit(T)`, and a commit (or an adopted checkpoint) settles
//!   every intent before it.
//! - Compaction rewrites the latest state (last commit, pending intent) to a new file,
//!   fsyncs it, renames it over the log and fsyncs the directory: a crash at any point
//!   leaves either the old log or the new one.
//!
//! Threads: everything here blocks (reads, fsync, rename). The loop calls it on
//! blocking tasks: [`RecoveryLog::open_async`] opens, `txn::state` writes intents and
//! commits on `spawn_blocking`; tests and `sluice inspect` call it directly.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sluice_source_sdk::Resume;
use std::collections::BTreeMap;
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
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let id = format!(
        "{:016x}{:08x}",
        now.as_nanos() as u64 ^ u64::from(std::process::id()).rotate_left(32),
        crc32fast::hash(format!("{:?}{}", now, std::process::id()).as_bytes())
    );
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

/// What a committed transaction leaves behind: where each source resumes and each
/// driver's checkpoint. Its [`to_bytes`](Checkpoint::to_bytes) form is the opaque
/// runtime checkpoint sent to drivers in Prepare and recovered from Opened.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Checkpoint {
    /// The transaction committed; transactions are numbered from 1, 0 is "none yet".
    pub txn: u64,
    /// Source name → the resume position of its last committed step.
    pub sources: BTreeMap<String, Value>,
    /// Materialization name → the checkpoint its driver returned in Prepared.
    pub driver_checkpoints: BTreeMap<String, Value>,
    /// Binding resource → hex of the highest packed key ever stored, for bindings stored
    /// only through this checkpoint's lineage since their first transaction (`""`: none
    /// yet). A key above it cannot be in the store, so it is not loaded. A binding
    /// missing here is not tracked: all its keys are loaded.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub max_keys: BTreeMap<String, String>,
}

impl Checkpoint {
    /// Whether `other` records the same commit: the same transaction, source positions
    /// and stored keys. Driver checkpoints are not compared: a store keeps the copy the
    /// runtime sent in Prepare, before the driver returned this transaction's checkpoint,
    /// so an authoritative store's copy of the log's last commit differs from it there.
    pub fn same_commit(&self, other: &Checkpoint) -> bool {
        self.txn == other.txn && self.sources == other.sources && self.max_keys == other.max_keys
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a checkpoint serializes")
    }

    /// Reads bytes written by [`to_bytes`](Checkpoint::to_bytes); empty bytes (a store
    /// that never committed) are `None`.
    pub fn from_bytes(bytes: &[u8]) -> Result<Option<Checkpoint>, RecoveryError> {
        if bytes.is_empty() {
            return Ok(None);
        }
        serde_json::from_slice(bytes)
            .map(Some)
            .map_err(|e| RecoveryError::BadCheckpoint(e.to_string()))
    }
}

pub use sluice_driver_sdk::machine::REBUILD_SENTINEL;

/// What a store reported in `Opened.flow_checkpoint`.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreCheckpoint {
    /// Empty bytes from a store that keeps no checkpoint: use the runtime's own.
    RuntimeOwn,
    /// Empty bytes from a store that keeps the runtime checkpoint (authoritative): it
    /// holds none for this range, so it never committed one, or it lost them all.
    Absent,
    /// The rebuild sentinel: begin again from an empty checkpoint.
    Rebuild,
    /// A checkpoint: processing begins there, whatever the log holds.
    At(Checkpoint),
}

impl StoreCheckpoint {
    /// What `Opened.flow_checkpoint` says, from a store that keeps the runtime
    /// checkpoint in its own transactions (`keeps_checkpoint`: authoritative) or not.
    pub fn from_opened(
        bytes: &[u8],
        keeps_checkpoint: bool,
    ) -> Result<StoreCheckpoint, RecoveryError> {
        if bytes == REBUILD_SENTINEL {
            return Ok(StoreCheckpoint::Rebuild);
        }
        Ok(match Checkpoint::from_bytes(bytes)? {
            None if keeps_checkpoint => StoreCheckpoint::Absent,
            None => StoreCheckpoint::RuntimeOwn,
            Some(checkpoint) => StoreCheckpoint::At(checkpoint),
        })
    }
}

/// The steps transaction `txn` queued, journaled before any store may commit it.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Intent {
    pub txn: u64,
    /// Source name → the steps (`queue` calls) it contributed, in order; replaying
    /// them in order reproduces the transaction's input.
    pub steps: BTreeMap<String, Vec<Resume>>,
    /// Materialization name → its epoch sink's artifact intent (where this
    /// transaction's staging goes), durable before the sink begins the epoch.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub artifacts: BTreeMap<String, Value>,
}

/// One record of a recovery log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogRecord {
    Commit(Checkpoint),
    Intent(Intent),
}

#[derive(Debug, thiserror::Error)]
pub enum RecoveryError {
    /// Another process is running this pipeline shard: stop it, or use another log.
    #[error("recovery log {} is in use by another sluice process ({})", dir.display(),
        pid.map_or("pid unknown".to_string(), |p| format!("pid {p}")))]
    InUse { dir: PathBuf, pid: Option<u32> },
    #[error("recovery log {}: cannot {action}: {error}", path.display())]
    Io {
        path: PathBuf,
        action: &'static str,
        #[source]
        error: std::io::Error,
    },
    /// Damage that is not a torn last write: never guessed past.
    #[error("recovery log {} (format {version}) is corrupt at byte {offset}: {reason}; \
             restore it from a backup, or remove it to start over (the store may then \
             hold data twice)",
             path.display())]
    Corrupt {
        path: PathBuf,
        /// The log's format version.
        version: u32,
        offset: u64,
        reason: String,
    },
    /// Written by a newer release: run that release (or a later one) on it.
    #[error("recovery log {} is of format version {found}, newer than the version \
             {supported} this sluice reads: run the sluice release that wrote it, or a \
             newer one", path.display())]
    NewerFormat {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error("invalid runtime checkpoint: {0}")]
    BadCheckpoint(String),
    /// The runtime wrote out of order: an internal bug.
    #[error("recovery log {log}: {reason} (internal error)")]
    OutOfOrder { log: String, reason: String },
    /// Another holder took the shard's log over (a cluster moved the shard): this
    /// holder must stop, and never write again.
    #[error("recovery log {log} is fenced: {reason}")]
    Fenced { log: String, reason: String },
    /// A record larger than the engine keeping the log takes in one write.
    #[error(
        "recovery log {log}: a record of {bytes} bytes is above the {limit} bytes \
             this log takes in one write{hint}"
    )]
    TooLarge {
        log: String,
        bytes: usize,
        limit: usize,
        hint: &'static str,
    },
    /// The shared engine keeping the log did not answer, or failed: the write may or
    /// may not have landed, so the loop reopens and recovers from what the log holds.
    #[error("recovery log {log}: cannot {action}: {reason}")]
    Unavailable {
        log: String,
        action: &'static str,
        reason: String,
    },
}

fn io(path: &Path, action: &'static str) -> impl FnOnce(std::io::Error) -> RecoveryError {
    let path = path.to_path_buf();
    move |error| RecoveryError::Io {
        path,
        action,
        error,
    }
}

/// The latest state of a log: its last commit and the intent pending after it. What a
/// compaction keeps, and all a shared engine stores.
#[derive(Clone, Copy)]
pub struct Latest<'a> {
    pub last_commit: Option<&'a Checkpoint>,
    pub pending_intent: Option<&'a Intent>,
}

/// Where a recovery log's records become durable: a local file ([`RecoveryLog::open`],
/// the embedded default) or a shared engine (a cluster shard's log, which moves with the
/// shard). Called on blocking threads.
pub trait LogStore: Send {
    /// Makes `record` durable; `after` is the log's state once it is. Returns only once
    /// a crash can no longer lose it. A store that knows a holder fails with
    /// [`RecoveryError::Fenced`] once another holder has taken the log over.
    fn append(&mut self, record: &LogRecord, after: Latest<'_>) -> Result<(), RecoveryError>;
    /// Names the log in messages (a path, a key prefix).
    fn describe(&self) -> String;
}

/// The open recovery log of one shard: its latest state, over the store that keeps it
/// (a file holds its lock until dropped; a shared engine fences older holders).
pub struct RecoveryLog {
    store: Box<dyn LogStore>,
    last_commit: Option<Checkpoint>,
    pending_intent: Option<Box<Intent>>,
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

    /// A log whose latest state `store` holds, as read back from it.
    pub fn over(
        store: Box<dyn LogStore>,
        last_commit: Option<Checkpoint>,
        pending_intent: Option<Intent>,
    ) -> RecoveryLog {
        RecoveryLog {
            store,
            last_commit,
            pending_intent: pending_intent.map(Box::new),
        }
    }

    /// [`open`](Self::open) on a blocking task: what an async caller uses, so that the
    /// reads and fsyncs of opening never block an async worker.
    pub async fn open_async(dir: &Path) -> Result<RecoveryLog, RecoveryError> {
        let dir = dir.to_path_buf();
        crate::blocking::unblock(move || RecoveryLog::open(&dir)).await
    }

    /// The checkpoint of the last transaction committed to this log.
    pub fn last_commit(&self) -> Option<&Checkpoint> {
        self.last_commit.as_ref()
    }

    /// An intent for a transaction newer than the last commit, if any.
    pub fn pending_intent(&self) -> Option<&Intent> {
        self.pending_intent.as_deref()
    }

    /// Journals the steps of transaction `intent.txn`.
    pub fn write_intent(&mut self, intent: &Intent) -> Result<(), RecoveryError> {
        self.check_newer(intent.txn, "intent")?;
        // Returns only once durable: the steps can be replayed after any later crash.
        let after = Latest {
            last_commit: self.last_commit.as_ref(),
            pending_intent: Some(intent),
        };
        self.store
            .append(&LogRecord::Intent(intent.clone()), after)?;
        self.pending_intent = Some(Box::new(intent.clone()));
        Ok(())
    }

    /// Records that transaction `checkpoint.txn` committed.
    pub fn commit(&mut self, checkpoint: &Checkpoint) -> Result<(), RecoveryError> {
        self.check_newer(checkpoint.txn, "commit")?;
        // A commit settles every intent up to its transaction.
        let settles = |i: &Intent| i.txn <= checkpoint.txn;
        let after = Latest {
            last_commit: Some(checkpoint),
            pending_intent: self.pending_intent.as_deref().filter(|i| !settles(i)),
        };
        // Returns only once durable: a restart resumes after this transaction.
        self.store
            .append(&LogRecord::Commit(checkpoint.clone()), after)?;
        self.last_commit = Some(checkpoint.clone());
        if self.pending_intent.as_deref().is_some_and(settles) {
            self.pending_intent = None;
        }
        Ok(())
    }

    /// Makes `from`, the checkpoint recovery begins at, the log's last commit: appends
    /// it as a commit record unless it is that already (or the log is empty and `from`
    /// is the empty checkpoint). Its transaction number may be lower than the last
    /// commit's: a store restored from a backup, or rebuilding, is caught up from there.
    /// Any pending intent is dropped (the plan replays one only when `from` is the
    /// commit it follows, and then this appends nothing). Returns only once durable, so
    /// the next intent follows `from` in the log too.
    pub fn adopt(&mut self, from: &Checkpoint) -> Result<(), RecoveryError> {
        let current = match &self.last_commit {
            Some(last) => last.same_commit(from),
            None => from.txn == 0,
        };
        if current {
            return Ok(());
        }
        if let Some(last) = &self.last_commit {
            tracing::info!(
                log = %self.store.describe(),
                "the store's checkpoint (transaction {}) replaces the recovery log's \
                 (transaction {}): processing begins there",
                from.txn,
                last.txn
            );
        }
        let after = Latest {
            last_commit: Some(from),
            pending_intent: None,
        };
        self.store.append(&LogRecord::Commit(from.clone()), after)?;
        self.last_commit = Some(from.clone());
        self.pending_intent = None;
        Ok(())
    }

    fn check_newer(&self, txn: u64, what: &str) -> Result<(), RecoveryError> {
        match &self.last_commit {
            Some(last) if txn <= last.txn => Err(RecoveryError::OutOfOrder {
                log: self.store.describe(),
                reason: format!("{what} for transaction {txn} after commit of {}", last.txn),
            }),
            _ => Ok(()),
        }
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
        let tmp = self.dir.join("log.compact");
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
        std::fs::rename(&tmp, &self.path).map_err(io(&self.path, "replace"))?;
        sync_dir(&self.dir)?;
        file.seek(SeekFrom::End(0))
            .map_err(io(&self.path, "seek"))?;
        self.file = file;
        self.len = bytes.len() as u64;
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

fn sync_dir(dir: &Path) -> Result<(), RecoveryError> {
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

/// What to do at startup.
#[derive(Debug, Clone, PartialEq)]
pub enum RecoveryPlan {
    /// Nothing was ever committed: start every source from the beginning.
    Fresh,
    /// The store asked to rebuild (the sentinel) although the log committed: start every
    /// source from the beginning, from the empty checkpoint.
    Rebuild,
    /// Seek every source to the checkpoint's positions and go on.
    ResumeFrom(Checkpoint),
    /// Seek to `from`, then replay the intent's steps as transaction `replay.txn`
    /// (verifying their hashes), then go on.
    ReplayThenResume { from: Checkpoint, replay: Intent },
    /// A store that keeps the runtime checkpoint holds none, but the log committed
    /// through `log_txn`: the store was recreated, emptied, or is another one. Resuming
    /// would fill it from the middle of its input, so the run is refused.
    StoreLost { log_txn: u64 },
}

/// Decides recovery from observed facts: the log's last commit, what the store reported
/// in Opened, and the log's pending intent.
///
/// - A store checkpoint is where processing begins (the protocol's rule), whether it is
///   newer than the log's (the log's record of a transaction the store committed was
///   lost in a crash), the same, or older (a store restored from a backup asks to be
///   caught up). The sentinel begins from the empty checkpoint. Only a store that keeps
///   no checkpoint leaves the choice to the log. A store that keeps checkpoints but has
///   none, while the log committed, lost what the log's commits stand for: refused.
/// - The intent is replayed only when it was written right after the chosen
///   checkpoint: the pending intent follows the log's last commit (or nothing, for
///   transaction 1), so it is replayed only when that commit is the chosen checkpoint
///   and the intent is for the next transaction. Any other intent was committed
///   already, or belongs to a history the store does not have: it is not replayed.
pub fn plan_recovery(
    log_commit: Option<&Checkpoint>,
    store: &StoreCheckpoint,
    intent: Option<&Intent>,
) -> RecoveryPlan {
    let empty = Checkpoint::default();
    if let (StoreCheckpoint::Absent, Some(log)) = (store, log_commit)
        && log.txn > 0
    {
        return RecoveryPlan::StoreLost { log_txn: log.txn };
    }
    let chosen = match store {
        // The store's copy of the log's last commit: the log's, which also holds the
        // driver checkpoint that the store's copy predates.
        StoreCheckpoint::At(checkpoint) => match log_commit {
            Some(log) if log.same_commit(checkpoint) => Some(log),
            _ => Some(checkpoint),
        },
        StoreCheckpoint::Rebuild | StoreCheckpoint::Absent => Some(&empty),
        StoreCheckpoint::RuntimeOwn => log_commit,
    };
    let follows = |intent: &Intent| match (log_commit, chosen) {
        (Some(log), Some(chosen)) => log.same_commit(chosen) && intent.txn == log.txn + 1,
        (None, chosen) => chosen.is_none_or(|c| c.txn == 0) && intent.txn == 1,
        (Some(_), None) => false,
    };
    if let Some(intent) = intent.filter(|i| follows(i)) {
        return RecoveryPlan::ReplayThenResume {
            from: chosen.cloned().unwrap_or_default(),
            replay: intent.clone(),
        };
    }
    match (store, log_commit, chosen) {
        (StoreCheckpoint::Rebuild, Some(_), _) => RecoveryPlan::Rebuild,
        (StoreCheckpoint::Rebuild | StoreCheckpoint::Absent, None, _) | (_, _, None) => {
            RecoveryPlan::Fresh
        }
        (_, _, Some(c)) => RecoveryPlan::ResumeFrom(c.clone()),
    }
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
