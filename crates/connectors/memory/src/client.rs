//! The driver's state and where it lives: in this process's memory, or in one JSON
//! file that separate processes share.
//!
//! ```text
//!  State ─ materialization ─┬─ shards: [key_begin, key_end] → (fence, checkpoint)
//!                           ├─ applied_version (Open must carry it)
//!                           └─ tables: name → rows (hex packed key → document JSON)
//!                                             + a log of delta-updates documents
//! ```
//!
//! What holds:
//! - Fences only grow, per materialization; [`MaterializationState::claim`] hands out
//!   the next one and writes it into every overlapping range, so an earlier instance of
//!   any of them finds a fence other than its own at commit.
//! - [`Backend::update`] keeps a change only if it succeeds: callers check everything
//!   before they change anything. With a file, it returns only after the new state is
//!   durable: written next to the file, fsync'ed, renamed over it, and the folder
//!   fsync'ed, all under an exclusive lock on `<path>.lock`; [`Backend::read`] reads
//!   under a shared lock. Processes sharing the file therefore fence each other and
//!   never see a torn state. The file is rewritten whole (cost grows with the data):
//!   this is a reference and test driver.
//!
//! Threads: with a file, the lock, the read and the rewrite (with its fsyncs) run on
//! tokio's blocking pool; the change itself (`f`, in memory) runs on the caller's task
//! between them. The lock is held from before the read until the rewrite is durable,
//! also when the caller's future is dropped in between (the lock then drops unused, or
//! the rewrite in flight completes first).

use serde::{Deserialize, Serialize};
use sluice_driver_sdk::{Error, Result};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// One row of a table as the tests read it: the packed key and the document.
pub type Row = (Vec<u8>, serde_json::Value);

/// Everything the driver stores.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct State {
    pub materializations: BTreeMap<String, MaterializationState>,
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct MaterializationState {
    /// The last fence handed out; fences only grow.
    last_fence: i64,
    shards: Vec<Shard>,
    pub tables: BTreeMap<String, Table>,
    /// The spec version ApplyUpsert applied last, which Open must carry.
    #[serde(default)]
    pub applied_version: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct Shard {
    key_begin: u32,
    key_end: u32,
    fence: i64,
    /// The runtime checkpoint committed last by this range.
    checkpoint: Vec<u8>,
}

impl MaterializationState {
    /// Claims the key range `[begin, end]` for a new instance: takes the next fence,
    /// writes it into every stored range overlapping this one (fencing their earlier
    /// instances), and records this range if new, with the checkpoint it resumes from:
    /// that of the narrowest stored range covering it (none: empty). Returns the fence
    /// and that checkpoint.
    pub fn claim(&mut self, begin: u32, end: u32) -> (i64, Vec<u8>) {
        self.last_fence += 1;
        let fence = self.last_fence;
        let recovered = (self.shards.iter())
            .filter(|s| s.key_begin <= begin && end <= s.key_end)
            .min_by_key(|s| s.key_end - s.key_begin)
            .map(|s| s.checkpoint.clone())
            .unwrap_or_default();
        for shard in (self.shards.iter_mut()).filter(|s| s.key_begin <= end && begin <= s.key_end) {
            shard.fence = fence;
        }
        if self.shard(begin, end).is_none() {
            self.shards.push(Shard {
                key_begin: begin,
                key_end: end,
                fence,
                checkpoint: recovered.clone(),
            });
        }
        (fence, recovered)
    }

    /// The fence of exactly the range `[begin, end]`; `None` if it was never claimed.
    pub fn fence(&self, begin: u32, end: u32) -> Option<i64> {
        self.shard(begin, end).map(|s| s.fence)
    }

    /// The checkpoint last committed by exactly the range `[begin, end]`.
    pub fn checkpoint(&self, begin: u32, end: u32) -> Option<&[u8]> {
        self.shard(begin, end).map(|s| s.checkpoint.as_slice())
    }

    /// Records `checkpoint` as the last committed by the range `[begin, end]`.
    pub fn set_checkpoint(&mut self, begin: u32, end: u32, checkpoint: Vec<u8>) {
        let shard = (self.shards.iter_mut()).find(|s| (s.key_begin, s.key_end) == (begin, end));
        if let Some(shard) = shard {
            shard.checkpoint = checkpoint;
        }
    }

    /// Forgets every range's fence and checkpoint (ApplyDelete): a later instance
    /// starts over, and an earlier one finds no range of its own at commit.
    pub fn forget_ranges(&mut self) {
        self.shards.clear();
    }

    fn shard(&self, begin: u32, end: u32) -> Option<&Shard> {
        (self.shards.iter()).find(|s| (s.key_begin, s.key_end) == (begin, end))
    }
}

#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Table {
    /// Hex of the packed key (same order as the bytes) → document JSON.
    pub rows: BTreeMap<String, String>,
    /// Documents of delta-updates bindings, in commit order: (hex key, document JSON).
    pub log: Vec<(String, String)>,
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .filter_map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).ok())
        .collect()
}

/// Where the state lives: this value's memory, or a file shared by processes.
#[derive(Clone)]
pub enum Backend {
    Memory(Arc<Mutex<State>>),
    File(PathBuf),
}

impl Backend {
    /// Runs `f` over the state and keeps its changes only if it succeeds. With a file,
    /// returns only after the new state is durable (fsync of file and folder).
    pub async fn update<R: Send>(
        &self,
        f: impl FnOnce(&mut State) -> Result<R> + Send,
    ) -> Result<R> {
        match self {
            Backend::Memory(state) => f(&mut state.lock().unwrap_or_else(|p| p.into_inner())),
            Backend::File(path) => {
                let at = path.clone();
                let (lock, mut state) = unblock(move || {
                    let lock = lock_file(&at, true)?;
                    Ok((lock, read_file(&at)?))
                })
                .await?;
                let out = f(&mut state)?;
                let at = path.clone();
                unblock(move || {
                    write_file(&at, &state)?;
                    // Unlocked only once the new state is durable.
                    drop(lock);
                    Ok(())
                })
                .await?;
                Ok(out)
            }
        }
    }

    pub async fn read<R>(&self, f: impl FnOnce(&State) -> R + Send) -> Result<R> {
        match self {
            Backend::Memory(state) => Ok(f(&state.lock().unwrap_or_else(|p| p.into_inner()))),
            Backend::File(path) => {
                let at = path.clone();
                Ok(f(&unblock(move || read_shared(&at)).await?))
            }
        }
    }
}

/// Runs blocking file work on tokio's blocking pool.
async fn unblock<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    match tokio::task::spawn_blocking(work).await {
        Ok(out) => out,
        Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
        // Only a runtime shutting down cancels a blocking task, and it drops this
        // future first.
        Err(err) => unreachable!("a blocking task was cancelled: {err}"),
    }
}

/// The state in the file at `path`, read under a shared lock. Blocks.
pub(crate) fn read_shared(path: &Path) -> Result<State> {
    let _lock = lock_file(path, false)?;
    read_file(path)
}

fn io_error(path: &Path, what: &str, err: std::io::Error) -> Error {
    Error::store(
        format!("memory driver: {what} {}", path.display()),
        err,
        true,
    )
}

/// Locks `<path>.lock` (never renamed, unlike the state file). Unlocks on drop.
fn lock_file(path: &Path, exclusive: bool) -> Result<File> {
    let lock_path = path.with_extension("lock");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| io_error(&lock_path, "opening", e))?;
    let locked = if exclusive {
        file.lock()
    } else {
        file.lock_shared()
    };
    locked.map_err(|e| io_error(&lock_path, "locking", e))?;
    Ok(file)
}

fn read_file(path: &Path) -> Result<State> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| {
            Error::store(
                format!("memory driver: parsing {}", path.display()),
                e,
                false,
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State::default()),
        Err(e) => Err(io_error(path, "reading", e)),
    }
}

/// Writes the state next to `path`, fsyncs it, renames it over `path`, fsyncs the folder.
fn write_file(path: &Path, state: &State) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let bytes =
        serde_json::to_vec(state).map_err(|e| Error::store("memory driver: encoding", e, false))?;
    let mut file = File::create(&tmp).map_err(|e| io_error(&tmp, "creating", e))?;
    file.write_all(&bytes)
        .map_err(|e| io_error(&tmp, "writing", e))?;
    file.sync_all().map_err(|e| io_error(&tmp, "syncing", e))?;
    std::fs::rename(&tmp, path).map_err(|e| io_error(path, "renaming over", e))?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_error(dir, "syncing folder", e))
}

/// The rows of `table` in key order, then its delta-updates log.
pub fn rows_of(state: &State, materialization: &str, table: &str) -> Vec<Row> {
    let Some(table) = state
        .materializations
        .get(materialization)
        .and_then(|m| m.tables.get(table))
    else {
        return Vec::new();
    };
    let rows = table
        .rows
        .iter()
        .chain(table.log.iter().map(|(k, v)| (k, v)));
    // Keys were written by `hex` and documents checked to be JSON at Store.
    rows.map(|(key, doc)| {
        (
            unhex(key),
            serde_json::from_str(doc).unwrap_or(serde_json::Value::Null),
        )
    })
    .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MID: u32 = 0x8000_0000;

    #[test]
    fn a_claim_fences_every_overlapping_range_and_resumes_from_the_narrowest_covering_one() {
        let mut mat = MaterializationState::default();
        // (range claimed, checkpoint it then commits, expected fence and recovered
        // checkpoint, expected fences of [whole, left, left quarter, right] after it)
        type Case = (
            (u32, u32),
            &'static [u8],
            (i64, &'static [u8]),
            [Option<i64>; 4],
        );
        let cases: [Case; 5] = [
            (
                (0, u32::MAX),
                b"whole",
                (1, b""),
                [Some(1), None, None, None],
            ),
            (
                (0, MID - 1),
                b"left",
                (2, b"whole"),
                [Some(2), Some(2), None, None],
            ),
            (
                (0, MID / 2),
                b"",
                (3, b"left"),
                [Some(3), Some(3), Some(3), None],
            ),
            (
                (MID, u32::MAX),
                b"right",
                (4, b"whole"),
                [Some(4), Some(3), Some(3), Some(4)],
            ),
            (
                (0, u32::MAX),
                b"",
                (5, b"whole"),
                [Some(5), Some(5), Some(5), Some(5)],
            ),
        ];
        let ranges = [(0, u32::MAX), (0, MID - 1), (0, MID / 2), (MID, u32::MAX)];
        for ((begin, end), commits, (fence, recovered), fences) in cases {
            let claimed = mat.claim(begin, end);
            assert_eq!(
                claimed,
                (fence, recovered.to_vec()),
                "claim of [{begin}, {end}]"
            );
            let now = ranges.map(|(b, e)| mat.fence(b, e));
            assert_eq!(now, fences, "fences after the claim of [{begin}, {end}]");
            if !commits.is_empty() {
                mat.set_checkpoint(begin, end, commits.to_vec());
            }
        }
    }
}
