//! Idempotency keys: which request each key named, and whether it committed, kept
//! durably in `keys.jsonl` in the source's state folder, or, for a cluster's shard, in
//! the source's resume positions ([`KeyPlace`]).
//!
//! ```text
//!  POST with Idempotency-Key ──▶ Record {key, seq, docs, at} ──▶ writer thread: append,
//!                                   fsync (one for every record it was handed meanwhile)
//!                                   └──▶ the body becomes queueable
//!  committed(txn, {"seq": S}) ──▶ Marker {committed: txn, seq: S} ──▶ writer: append
//!                                   └──▶ the clients of that transaction are answered
//! ```
//!
//! A key must be durable no later than the transaction that commits its body: were it
//! written after, a crash between that commit and the write would let a retry apply the
//! body twice. So a keyed body becomes queueable (can reach a transaction) only once its
//! record is fsync'ed. The marker of a commit needs no fsync: it only says which
//! transaction a key committed in, and a key with no marker takes the recovered one.
//!
//! On start, with the recovered checkpoint's `(T, S)` and the bodies replayed from the
//! interrupted transaction's intent ([`recover`], pure):
//! - a key of seq ≤ S committed: in the transaction of the first marker covering it,
//!   else in T;
//! - a key of a replayed body is pending: its transaction commits it again;
//! - any other key (seq > S) never committed, and is forgotten: a retry applies it.
//!
//! The file is then rewritten with what is live (new file, fsync, rename, fsync of the
//! folder), so the sequence numbers the forgotten keys had can be used again. It is
//! rewritten likewise whenever it has grown to twice what is live; committed keys
//! older than the window are dropped then (and forgotten in memory as they expire).
//!
//! Format: JSON lines, the first `{"format": "sluice-http-keys", "version": 1}`. A last
//! line without its newline is a torn write (its fsync never returned, so its body was
//! never queued) and is ignored; any other line that does not read is corruption.
//!
//! Threads: the file belongs to one writer thread per source instance
//! ([`Writer::spawn`]), fed over a channel; its fsyncs never run on an async worker.
//!
//! **In a cluster** ([`KeyPlace::Positions`]) the shard moves between machines and the
//! keys file would stay behind, so the keys travel in the recovery log instead: every
//! step's position carries the keys of the window whose bodies are in that step or
//! earlier ones (`{"seq": S, "keys": {key: [seq, docs, dead_lettered, at, txn]}}`,
//! [`KeyTable::carried`]; `txn` null while that commit is not yet known). A position
//! commits with its transaction, in the same record (and the store's copy of it), so
//! whatever commits a body commits its key: there is no write between the two for a
//! kill to fall in, and no file. A keyed body is queueable at once; its key is durable
//! with the intent that journals the body (its framing names the key), and a new holder
//! learns every key from the position it resumes from and the bodies it replays, by the
//! same [`recover`]. What a record can carry bounds the window's keys
//! ([`CARRIED_BUDGET`]): past it a keyed request is refused (429) until keys expire.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

pub const FILE: &str = "keys.jsonl";

/// Where a source keeps its keys (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyPlace {
    /// The keys file in the state folder (one process).
    File,
    /// The resume positions, so the recovery log holds them (a cluster's shard).
    Positions,
}

/// The most the keys carried in a position may take (JSON): the shard's etcd records
/// hold at most 1 MiB (a commit carries the keys once; an intent carries them once and
/// the step's journaled bodies beside them), so 384 KiB leaves the bodies of a
/// transaction about 450 KiB. About 6,000 keys of 36 characters (UUIDs).
pub const CARRIED_BUDGET: usize = 384 << 10;

/// A key as a position carries it: `[seq, docs, dead_lettered, at, txn]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Carried(u64, u64, u64, u64, Option<u64>);

/// The keys a position carries, by key.
pub type CarriedKeys = BTreeMap<String, Carried>;

/// What one carried key costs in a position, about: its key, quotes, and five numbers.
fn carried_size(entry: &KeyEntry) -> usize {
    entry.key.len() + 48
}
const FORMAT: &str = "sluice-http-keys";
const VERSION: u32 = 1;

/// What a key names: the request that carried it first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyEntry {
    pub key: String,
    /// The body's sequence number.
    pub seq: u64,
    /// Its documents, as the answer counts them: those stored.
    pub docs: u64,
    /// Its documents the runtime dead-letters instead (`on_error: skip`); absent when
    /// none (and in files of earlier releases).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub dead_lettered: u64,
    /// When it was accepted (unix ms): its window starts there.
    pub at: u64,
    /// The transaction that committed it; `None` while pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub txn: Option<u64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One line of the file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Line {
    Header { format: String, version: u32 },
    Key(KeyEntry),
    Marker { committed: u64, seq: u64 },
}

/// The keys of one source: pending ones by sequence number, committed ones until their
/// window passes.
#[derive(Debug, Clone)]
pub struct KeyTable {
    live: HashMap<String, KeyEntry>,
    /// Pending keys by their body's sequence number.
    pending: BTreeMap<u64, String>,
    /// Committed keys in the order they committed: (accepted at, seq, key).
    committed: VecDeque<(u64, u64, String)>,
    window_ms: u64,
}

impl KeyTable {
    pub fn new(window: Duration) -> KeyTable {
        KeyTable {
            live: HashMap::new(),
            pending: BTreeMap::new(),
            committed: VecDeque::new(),
            window_ms: window.as_millis() as u64,
        }
    }

    /// The entry of `key`, unless it committed longer than the window ago.
    pub fn get(&self, key: &str, now: u64) -> Option<&KeyEntry> {
        self.live
            .get(key)
            .filter(|e| e.txn.is_none() || !self.expired(e.at, now))
    }

    fn expired(&self, at: u64, now: u64) -> bool {
        at.saturating_add(self.window_ms) < now
    }

    /// Remembers `entry` (pending, or committed when it has a transaction).
    pub fn insert(&mut self, entry: KeyEntry) {
        if let Some(old) = self.live.remove(&entry.key)
            && old.txn.is_none()
        {
            self.pending.remove(&old.seq);
        }
        match entry.txn {
            None => {
                self.pending.insert(entry.seq, entry.key.clone());
            }
            Some(_) => self
                .committed
                .push_back((entry.at, entry.seq, entry.key.clone())),
        }
        self.live.insert(entry.key.clone(), entry);
    }

    /// Every pending key of a body up to `seq` committed in `txn`; returns how many.
    pub fn commit(&mut self, txn: u64, seq: u64) -> usize {
        let rest = self.pending.split_off(&(seq + 1));
        let done = std::mem::replace(&mut self.pending, rest);
        for (seq, key) in &done {
            let entry = self.live.get_mut(key).expect("a pending key is live");
            entry.txn = Some(txn);
            self.committed.push_back((entry.at, *seq, key.clone()));
        }
        done.len()
    }

    /// Forgets committed keys whose window passed (they commit in about the order they
    /// were accepted, so the oldest are at the front).
    pub fn expire(&mut self, now: u64) {
        while let Some((at, seq, key)) = self.committed.front()
            && self.expired(*at, now)
        {
            if self.live.get(key).is_some_and(|e| e.seq == *seq) {
                self.live.remove(key);
            }
            self.committed.pop_front();
        }
    }

    /// Forgets every pending key of a body after `seq` but those `keep` says to keep.
    fn forget_pending_after(&mut self, seq: u64, keep: impl Fn(u64, &str) -> bool) {
        let after = self.pending.split_off(&(seq + 1));
        for (seq, key) in after {
            if keep(seq, &key) {
                self.pending.insert(seq, key);
            } else {
                self.live.remove(&key);
            }
        }
        // Committed entries past `seq` belong to a history the store no longer holds
        // (it was restored from a backup): their bodies are gone, a retry applies them.
        self.live.retain(|_, e| e.txn.is_none() || e.seq <= seq);
    }

    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// Every live entry, pending ones included.
    pub fn entries(&self) -> impl Iterator<Item = &KeyEntry> {
        self.live.values()
    }

    /// The keys a position after body `upto` carries: those of bodies up to it, pending
    /// or committed within the window.
    pub fn carried(&self, upto: u64, now: u64) -> CarriedKeys {
        (self.live.values())
            .filter(|e| e.seq <= upto && (e.txn.is_none() || !self.expired(e.at, now)))
            .map(|e| {
                let carried = Carried(e.seq, e.docs, e.dead_lettered, e.at, e.txn);
                (e.key.clone(), carried)
            })
            .collect()
    }

    /// What the live keys take in a position, about ([`CARRIED_BUDGET`]).
    pub fn carried_bytes(&self) -> usize {
        self.live.values().map(carried_size).sum()
    }
}

/// The commit a source starts from: its recovered checkpoint's transaction, and the
/// last sequence number that transaction (or an earlier one) held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartCommit {
    pub txn: u64,
    pub seq: u64,
}

/// A keyed body replayed from the interrupted transaction's intent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replayed {
    pub key: String,
    pub seq: u64,
    pub docs: u64,
    pub dead_lettered: u64,
    pub at: u64,
}

/// Why the file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{path}: {error}")]
    Io {
        path: PathBuf,
        #[source]
        error: io::Error,
    },
    #[error(
        "{path}:{line}: {reason}: the idempotency keys file is corrupt; move it aside to \
         start again (keys remembered in it are then forgotten, and their retries apply)"
    )]
    Corrupt {
        path: PathBuf,
        line: usize,
        reason: String,
    },
}

/// The lines of the file at `path` (none if it does not exist), its torn tail cut.
fn read_lines(path: &Path) -> Result<Vec<Line>, ReadError> {
    let text = match std::fs::read(path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => {
            return Err(ReadError::Io {
                path: path.to_path_buf(),
                error,
            });
        }
    };
    let corrupt = |line: usize, reason: String| ReadError::Corrupt {
        path: path.to_path_buf(),
        line,
        reason,
    };
    let whole = match text.iter().rposition(|&b| b == b'\n') {
        Some(last) => &text[..=last],
        None => &[][..],
    };
    let mut lines = Vec::new();
    for (index, raw) in whole.split_inclusive(|&b| b == b'\n').enumerate() {
        let line: Line = serde_json::from_slice(raw)
            .map_err(|e| corrupt(index + 1, format!("not a line of this file ({e})")))?;
        match (&line, index) {
            (Line::Header { format, version }, 0) if format == FORMAT && *version == VERSION => {}
            (Line::Header { format, version }, 0) if format == FORMAT => {
                return Err(corrupt(
                    1,
                    format!("format version {version}, newer than this release's {VERSION}"),
                ));
            }
            (_, 0) => return Err(corrupt(1, format!("not a {FORMAT} file"))),
            (Line::Header { .. }, _) => {
                return Err(corrupt(index + 1, "a second header".to_string()));
            }
            _ => lines.push(line),
        }
    }
    Ok(lines)
}

/// What a source starting from `start`, having replayed `replayed`, remembers of the
/// keys in `lines` and those its position carried (see the module docs): pure, so every
/// case is a table test.
pub fn recover(
    lines: Vec<Line>,
    carried: &CarriedKeys,
    start: Option<StartCommit>,
    replayed: &[Replayed],
    now: u64,
    window: Duration,
) -> KeyTable {
    let mut table = KeyTable::new(window);
    for (key, &Carried(seq, docs, dead_lettered, at, txn)) in carried {
        table.insert(KeyEntry {
            key: key.clone(),
            seq,
            docs,
            dead_lettered,
            at,
            txn,
        });
    }
    for line in lines {
        match line {
            Line::Key(entry) => table.insert(entry),
            Line::Marker { committed, seq } => {
                table.commit(committed, seq);
            }
            Line::Header { .. } => {}
        }
    }
    let start = start.unwrap_or(StartCommit { txn: 0, seq: 0 });
    table.commit(start.txn, start.seq);
    table.forget_pending_after(start.seq, |seq, key| {
        replayed.iter().any(|r| r.seq == seq && r.key == key)
    });
    for r in replayed {
        if table.live.get(&r.key).is_none_or(|e| e.seq != r.seq) {
            table.insert(KeyEntry {
                key: r.key.clone(),
                seq: r.seq,
                docs: r.docs,
                dead_lettered: r.dead_lettered,
                at: r.at,
                txn: None,
            });
        }
    }
    table.expire(now);
    table
}

/// Writes `table` as the whole file at `path`: a new file, fsync'ed, renamed over the
/// old one, the folder fsync'ed. Returns the file, open for appending.
fn rewrite(path: &Path, table: &KeyTable) -> io::Result<File> {
    let dir = path.parent().expect("the file is in the state folder");
    let fresh = path.with_extension("jsonl.new");
    let mut out = io::BufWriter::new(File::create(&fresh)?);
    let header = Line::Header {
        format: FORMAT.to_string(),
        version: VERSION,
    };
    serde_json::to_writer(&mut out, &header)?;
    out.write_all(b"\n")?;
    let mut entries: Vec<&KeyEntry> = table.entries().collect();
    entries.sort_by_key(|e| e.seq);
    for entry in entries {
        serde_json::to_writer(&mut out, entry)?;
        out.write_all(b"\n")?;
    }
    let file = out.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&fresh, path)?;
    File::open(dir)?.sync_all()?;
    std::fs::OpenOptions::new().append(true).open(path)
}

/// Reads the keys file of `dir` and rewrites it with what a source starting from
/// `start` remembers (see the module docs); blocking. Returns that and the file.
pub fn open(
    dir: &Path,
    carried: &CarriedKeys,
    start: Option<StartCommit>,
    replayed: &[Replayed],
    now: u64,
    window: Duration,
) -> Result<(KeyTable, File), ReadError> {
    let path = dir.join(FILE);
    let io_error = |error| ReadError::Io {
        path: path.clone(),
        error,
    };
    std::fs::create_dir_all(dir).map_err(io_error)?;
    let table = recover(read_lines(&path)?, carried, start, replayed, now, window);
    let file = rewrite(&path, &table).map_err(io_error)?;
    Ok((table, file))
}

/// What the writer thread is handed.
pub enum Command {
    /// Make this key durable, then report its seq durable.
    Record(KeyEntry),
    /// A transaction committed every body up to `seq`: append its marker, then run
    /// `then` (which answers that transaction's clients).
    Committed {
        txn: u64,
        seq: u64,
        then: Box<dyn FnOnce() + Send>,
    },
}

/// What the writer reports after each group of writes: the sequence numbers now
/// durable, or the error that stopped it.
pub type OnDurable = Box<dyn Fn(Result<Vec<u64>, String>) + Send>;

/// The channel to a source instance's writer thread; the thread ends once it is dropped.
pub struct Writer {
    tx: mpsc::Sender<Command>,
    thread: std::thread::JoinHandle<()>,
}

impl Writer {
    /// Starts the thread that owns the file (`table` is what it holds now).
    pub fn spawn(path: PathBuf, file: File, table: KeyTable, on_durable: OnDurable) -> Writer {
        let (tx, rx) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("sluice-http-keys".into())
            .spawn(move || {
                let mut thread = WriterThread {
                    path,
                    file,
                    table,
                    lines: 0,
                };
                thread.run(rx, on_durable);
            })
            .expect("spawning the idempotency keys writer");
        Writer { tx, thread }
    }

    /// Hands `command` to the thread; `false` if it stopped (after an error).
    pub fn send(&self, command: Command) -> bool {
        self.tx.send(command).is_ok()
    }

    /// Ends the thread after what it was handed, and waits for it (blocking).
    pub fn join(self) {
        drop(self.tx);
        let _ = self.thread.join();
    }
}

struct WriterThread {
    path: PathBuf,
    file: File,
    /// What the file holds (its mirror: what a rewrite writes).
    table: KeyTable,
    /// Lines appended since the file was last rewritten.
    lines: usize,
}

impl WriterThread {
    fn run(&mut self, rx: mpsc::Receiver<Command>, on_durable: OnDurable) {
        while let Ok(first) = rx.recv() {
            // Group commit: everything handed over while the last fsync ran.
            let mut commands = vec![first];
            commands.extend(rx.try_iter());
            match self.write(commands) {
                Ok((durable, then)) => {
                    if !durable.is_empty() {
                        on_durable(Ok(durable));
                    }
                    then.into_iter().for_each(|f| f());
                }
                Err(e) => {
                    on_durable(Err(format!("{}: {e}", self.path.display())));
                    return;
                }
            }
        }
    }

    /// Appends the commands' lines (fsync'ed if any is a key record); returns the
    /// sequence numbers made durable and what to run after.
    #[allow(clippy::type_complexity)]
    fn write(
        &mut self,
        commands: Vec<Command>,
    ) -> io::Result<(Vec<u64>, Vec<Box<dyn FnOnce() + Send>>)> {
        let mut text = Vec::new();
        let (mut durable, mut then) = (Vec::new(), Vec::new());
        for command in commands {
            match command {
                Command::Record(entry) => {
                    serde_json::to_writer(&mut text, &Line::Key(entry.clone()))?;
                    durable.push(entry.seq);
                    self.table.insert(entry);
                }
                Command::Committed {
                    txn,
                    seq,
                    then: answer,
                } => {
                    serde_json::to_writer(
                        &mut text,
                        &Line::Marker {
                            committed: txn,
                            seq,
                        },
                    )?;
                    self.table.commit(txn, seq);
                    then.push(answer);
                }
            }
            text.push(b'\n');
            self.lines += 1;
        }
        // One write: a process killed during it leaves whole lines and at most a torn
        // last one.
        self.file.write_all(&text)?;
        if !durable.is_empty() {
            // Returns only after fsync: the bodies of these keys may now be queued.
            self.file.sync_data()?;
        }
        if self.lines > 4096.max(2 * self.table.len()) {
            self.table.expire(now_ms());
            self.file = rewrite(&self.path, &self.table)?;
            self.lines = 0;
        }
        Ok((durable, then))
    }
}

/// Now, in unix milliseconds (the keys' clock).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(600);
    const NOW: u64 = 1_000_000_000;

    fn key(key: &str, seq: u64, txn: Option<u64>) -> Line {
        Line::Key(KeyEntry {
            key: key.into(),
            seq,
            docs: seq * 10,
            dead_lettered: 0,
            at: NOW - 1000,
            txn,
        })
    }

    fn marker(committed: u64, seq: u64) -> Line {
        Line::Marker { committed, seq }
    }

    /// (key, seq, txn) of every live entry, sorted by seq.
    fn state(table: &KeyTable) -> Vec<(String, u64, Option<u64>)> {
        let mut out: Vec<_> = table
            .entries()
            .map(|e| (e.key.clone(), e.seq, e.txn))
            .collect();
        out.sort_by_key(|e| e.1);
        out
    }

    fn at(txn: u64, seq: u64) -> Option<StartCommit> {
        Some(StartCommit { txn, seq })
    }

    #[test]
    fn recovery_commits_forgets_or_keeps_each_key_by_its_sequence() {
        let replayed = |key: &str, seq| Replayed {
            key: key.into(),
            seq,
            docs: 1,
            dead_lettered: 0,
            at: NOW,
        };
        let lines = || {
            vec![
                key("a", 1, None),
                key("b", 2, None),
                marker(4, 2),
                key("c", 3, None),
                key("d", 5, None),
                key("e", 6, None),
            ]
        };
        for (name, start, replay, expected) in [
            (
                // Committed up to 3 in transaction 5 (no marker for c: it takes 5);
                // d and e were never journaled: forgotten.
                "resumed",
                at(5, 3),
                vec![],
                vec![("a", 1, Some(4)), ("b", 2, Some(4)), ("c", 3, Some(5))],
            ),
            (
                // d's body is in the interrupted transaction: pending again; e is not.
                "replayed",
                at(5, 3),
                vec![replayed("d", 5)],
                vec![
                    ("a", 1, Some(4)),
                    ("b", 2, Some(4)),
                    ("c", 3, Some(5)),
                    ("d", 5, None),
                ],
            ),
            (
                // Nothing ever committed: every pending key is forgotten.
                "fresh",
                None,
                vec![],
                vec![],
            ),
            (
                // A store restored from a backup, back at seq 1: b is gone from it, so
                // its retry must apply again, marker or not.
                "restored",
                at(2, 1),
                vec![],
                vec![("a", 1, Some(4))],
            ),
        ] {
            let table = recover(lines(), &CarriedKeys::new(), start, &replay, NOW, WINDOW);
            let expected: Vec<_> = expected
                .into_iter()
                .map(|(k, s, t)| (k.to_string(), s, t))
                .collect();
            assert_eq!(state(&table), expected, "{name}");
        }
    }

    #[test]
    fn a_replayed_key_missing_from_the_file_is_pending_and_windows_expire() {
        // The key's record was cut by a rewrite racing an old instance: the journaled
        // body still names it.
        let replay = [Replayed {
            key: "z".into(),
            seq: 9,
            docs: 3,
            dead_lettered: 0,
            at: NOW,
        }];
        let mut old = KeyEntry {
            key: "old".into(),
            seq: 1,
            docs: 1,
            dead_lettered: 0,
            at: NOW - WINDOW.as_millis() as u64 - 1,
            txn: Some(1),
        };
        let table = recover(
            vec![Line::Key(old.clone())],
            &CarriedKeys::new(),
            at(3, 8),
            &replay,
            NOW,
            WINDOW,
        );
        assert_eq!(state(&table), [("z".to_string(), 9, None)]);
        old.at = NOW - 5;
        let table = recover(
            vec![Line::Key(old.clone())],
            &CarriedKeys::new(),
            at(3, 8),
            &[],
            NOW,
            WINDOW,
        );
        assert_eq!(table.get("old", NOW).unwrap().txn, Some(1));
        assert_eq!(table.get("old", NOW + WINDOW.as_millis() as u64), None);
    }

    /// `dead_lettered` is written only when some were, and a line of an earlier
    /// release (without it) reads as none.
    #[test]
    fn a_key_line_keeps_its_dead_lettered_count() {
        let line = |dead_lettered| {
            Line::Key(KeyEntry {
                key: "k".into(),
                seq: 1,
                docs: 2,
                dead_lettered,
                at: 3,
                txn: None,
            })
        };
        let old = r#"{"key":"k","seq":1,"docs":2,"at":3}"#;
        assert_eq!(serde_json::to_string(&line(0)).unwrap(), old);
        assert_eq!(serde_json::from_str::<Line>(old).unwrap(), line(0));
        let text = serde_json::to_string(&line(5)).unwrap();
        assert_eq!(
            text,
            r#"{"key":"k","seq":1,"docs":2,"dead_lettered":5,"at":3}"#
        );
        assert_eq!(serde_json::from_str::<Line>(&text).unwrap(), line(5));
    }

    #[test]
    fn the_file_survives_a_torn_tail_and_refuses_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let (mut table, _) = open(dir.path(), &CarriedKeys::new(), None, &[], NOW, WINDOW).unwrap();
        assert_eq!(table.len(), 0);
        let path = dir.path().join(FILE);
        let entry = KeyEntry {
            key: "k".into(),
            seq: 1,
            docs: 2,
            dead_lettered: 0,
            at: NOW,
            txn: None,
        };
        table.insert(entry.clone());
        let file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        let writer = Writer::spawn(path.clone(), file, table, Box::new(|_| {}));
        assert!(writer.send(Command::Record(entry)));
        writer.join();
        // A torn record after it (killed mid-write): ignored.
        let mut text = std::fs::read(&path).unwrap();
        text.extend_from_slice(b"{\"key\":\"torn\",\"se");
        std::fs::write(&path, &text).unwrap();
        let (table, _) = open(dir.path(), &CarriedKeys::new(), at(7, 1), &[], NOW, WINDOW).unwrap();
        assert_eq!(state(&table), [("k".to_string(), 1, Some(7))]);
        // Rewritten: the commit is in the file itself now.
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.ends_with("\"txn\":7}\n"), "{text}");
        // A whole line that does not read is corruption, named by line.
        std::fs::write(&path, format!("{text}{{\"nonsense\":1}}\n")).unwrap();
        let error = open(dir.path(), &CarriedKeys::new(), at(7, 1), &[], NOW, WINDOW).unwrap_err();
        assert!(
            error.to_string().contains("keys.jsonl:3: not a line"),
            "{error}"
        );
        std::fs::write(&path, "{\"format\":\"sluice-http-keys\",\"version\":2}\n").unwrap();
        let error = open(dir.path(), &CarriedKeys::new(), None, &[], NOW, WINDOW).unwrap_err();
        assert!(error.to_string().contains("newer than"), "{error}");
    }

    #[test]
    fn the_writer_reports_records_durable_and_answers_after_the_marker() {
        let dir = tempfile::tempdir().unwrap();
        let (table, file) = open(dir.path(), &CarriedKeys::new(), None, &[], NOW, WINDOW).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let writer = Writer::spawn(
            dir.path().join(FILE),
            file,
            table,
            Box::new(move |r| tx.send(r).unwrap()),
        );
        for seq in 1..=3 {
            writer.send(Command::Record(KeyEntry {
                key: format!("k{seq}"),
                seq,
                docs: 1,
                dead_lettered: 0,
                at: NOW,
                txn: None,
            }));
        }
        let mut durable = Vec::new();
        while durable.len() < 3 {
            durable.extend(rx.recv().unwrap().unwrap());
        }
        assert_eq!(durable, [1, 2, 3]);
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        writer.send(Command::Committed {
            txn: 4,
            seq: 2,
            then: Box::new(move || done_tx.send(()).unwrap()),
        });
        done_rx.recv().unwrap();
        writer.join();
        let (table, _) = open(dir.path(), &CarriedKeys::new(), at(5, 3), &[], NOW, WINDOW).unwrap();
        assert_eq!(
            state(&table),
            [
                ("k1".to_string(), 1, Some(4)),
                ("k2".to_string(), 2, Some(4)),
                ("k3".to_string(), 3, Some(5)),
            ]
        );
    }
}
