//! The local shards of a materialization: the key ranges one process runs it as
//! (`runtime.workers`), and where each keeps its recovery log.
//!
//! ```text
//!  <recovery_log>/<materialization>/log               one shard over the configured range
//!  <recovery_log>/<materialization>/shards/ranges     after a split: the shards' ids, in order
//!  <recovery_log>/<materialization>/shards/<id>/log   each shard's own log
//! ```
//!
//! A split is a cluster's split done on one machine: each new shard's log starts as a
//! copy of its parent's (its last commit and its pending intent: each new shard replays
//! that intent and keeps its own keys), and its first Open recovers, from the store, the
//! narrowest checkpoint covering its range. The `ranges` file, renamed into place, is
//! the commit point: a crash before it leaves the old layout (the new logs, not listed,
//! are removed at the next start), a crash after it the new one (the parents' logs are
//! removed then). Shards never merge, their checkpoints differing: with fewer workers
//! than shards, every shard still runs.
//!
//! While the shards of a split materialization run, the process holds the lock of the
//! materialization's folder (as each shard holds its own log's), so no other process
//! splits, applies or resets under them. An unsplit shard's log is that folder's own,
//! and its lock is the log's.

use crate::blocking::replace_file;
use crate::config::ShardDef;
use crate::recovery::{self, RecoveryError, io, sync_dir};
use std::fs::File;
use std::path::{Path, PathBuf};

/// The folder of a split materialization's shard logs, inside its own folder.
const SHARDS: &str = "shards";
/// The list of a split materialization's shards, in `SHARDS`.
const RANGES: &str = "ranges";

/// The shards a materialization runs as here.
pub struct LocalShards {
    /// Each shard's range and the folder of its recovery log, in key order.
    pub shards: Vec<(ShardDef, PathBuf)>,
    /// The materialization folder's lock, held while split shards run.
    pub lock: Option<File>,
}

/// The shards of the materialization whose folder is `dir` and whose configured range
/// is `configured`: as it was split before, or split now into `wanted` shards when it
/// has fewer (a split needs its parts to allow it: `can_split`).
pub fn local_shards(
    dir: &Path,
    configured: ShardDef,
    wanted: u32,
    can_split: bool,
) -> Result<LocalShards, RecoveryError> {
    let lock = recovery::lock_dir(dir)?;
    let mut shards = local_logs_of(dir)?;
    let covered =
        crate::types::shard_label(shards[0].0.key_begin, shards[shards.len() - 1].0.key_end);
    match &mut shards[..] {
        // Unsplit: its one log is over the range as configured.
        [(range, log)] if log == dir => *range = configured,
        _ if covered != configured.id() => {
            return Err(layout_error(
                dir,
                format!(
                    "its shards cover {covered}, not the configured range {}: restore the \
                     materialization's `shard`, or reset it (`sluice apply --delete`)",
                    configured.id()
                ),
            ));
        }
        _ => {}
    }
    if can_split && shards.len() < wanted as usize {
        shards = split(dir, &shards, wanted)?;
    }
    remove_stale(dir, &shards, &lock)?;
    // Unsplit, its log is the folder's own, guarded by that log's lock.
    let split = shards[0].1 != dir;
    Ok(LocalShards {
        shards,
        lock: split.then_some(lock),
    })
}

/// Every shard log kept in the materialization folder `dir`, by shard id: its own
/// log, or its split shards' (for `sluice inspect` and `sluice status`).
pub fn local_logs(dir: &Path) -> Result<Vec<(Option<String>, PathBuf)>, RecoveryError> {
    let logs = local_logs_of(dir)?;
    Ok(logs
        .into_iter()
        .map(|(range, log)| ((log != dir).then(|| range.id()), log))
        .collect())
}

/// Removes the split shards' logs of the materialization folder `dir`, whose lock is
/// `held` (a reset).
pub fn remove_shards(dir: &Path, _held: &File) -> Result<(), RecoveryError> {
    remove_folder(dir, &dir.join(SHARDS))
}

/// Each shard's range and log folder: the split shards listed, or the folder's own log
/// over every key.
fn local_logs_of(dir: &Path) -> Result<Vec<(ShardDef, PathBuf)>, RecoveryError> {
    let shards_dir = dir.join(SHARDS);
    Ok(match read_ranges(&shards_dir)? {
        None => vec![(ShardDef::default(), dir.to_path_buf())],
        Some(ranges) => (ranges.into_iter())
            .map(|range| (range, shards_dir.join(range.id())))
            .collect(),
    })
}

/// Splits `parents` into `wanted` shards: each new shard's log a copy of its parent's,
/// then the list that makes them the layout.
fn split(
    dir: &Path,
    parents: &[(ShardDef, PathBuf)],
    wanted: u32,
) -> Result<Vec<(ShardDef, PathBuf)>, RecoveryError> {
    let shards_dir = dir.join(SHARDS);
    let ranges = split_ranges(&parents.iter().map(|(r, _)| *r).collect::<Vec<_>>(), wanted);
    let mut shards = Vec::with_capacity(ranges.len());
    for range in ranges {
        if let Some(kept) = parents.iter().find(|(r, _)| *r == range) {
            shards.push(kept.clone());
            continue;
        }
        let (_, parent) = (parents.iter())
            .find(|(p, _)| p.key_begin <= range.key_begin && range.key_end <= p.key_end)
            .expect("a split range lies within one parent");
        let log = shards_dir.join(range.id());
        recovery::copy(parent, &log)?;
        shards.push((range, log));
    }
    let ids: Vec<String> = shards.iter().map(|(r, _)| r.id()).collect();
    let list = serde_json::to_vec(&ids).expect("strings serialize");
    replace_file(&shards_dir, RANGES, &list).map_err(|e| RecoveryError::Io {
        path: e.path,
        action: e.action,
        error: e.error,
    })?;
    sync_dir(dir)?;
    tracing::info!(
        from = parents.len(),
        to = shards.len(),
        "split into {} key-range shards (runtime.workers)",
        shards.len()
    );
    Ok(shards)
}

/// `ranges` split until there are `wanted`: one range into `wanted` equal parts, more
/// by halving the widest until there are enough.
fn split_ranges(ranges: &[ShardDef], wanted: u32) -> Vec<ShardDef> {
    if let [one] = ranges {
        return one.split_into(wanted);
    }
    let mut ranges = ranges.to_vec();
    while ranges.len() < wanted as usize {
        let (widest, _) = (ranges.iter().enumerate())
            .max_by_key(|(i, r)| (r.key_end - r.key_begin, std::cmp::Reverse(*i)))
            .expect("at least one range");
        let Some((low, high)) = ranges[widest].halves() else {
            break;
        };
        ranges.splice(widest..=widest, [low, high]);
    }
    ranges
}

/// Removes what the layout `shards` does not use: unsplit, the folders of a split that
/// never got its list; split, the unsplit log and the folders of split parents.
fn remove_stale(
    dir: &Path,
    shards: &[(ShardDef, PathBuf)],
    held: &File,
) -> Result<(), RecoveryError> {
    let shards_dir = dir.join(SHARDS);
    if shards[0].1 == dir {
        return remove_folder(dir, &shards_dir);
    }
    if dir.join("log").exists() {
        recovery::remove(dir, held)?;
    }
    let entries = std::fs::read_dir(&shards_dir).map_err(io(&shards_dir, "list"))?;
    for entry in entries {
        let path = entry.map_err(io(&shards_dir, "list"))?.path();
        if path.is_dir() && !shards.iter().any(|(_, log)| *log == path) {
            remove_folder(&shards_dir, &path)?;
        }
    }
    Ok(())
}

/// Removes `folder` in `parent` with everything in it, durably; nothing if missing.
fn remove_folder(parent: &Path, folder: &Path) -> Result<(), RecoveryError> {
    match std::fs::remove_dir_all(folder) {
        Ok(()) => sync_dir(parent),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io(folder, "remove")(e)),
    }
}

/// The shards listed in `shards_dir`, if it was split.
fn read_ranges(shards_dir: &Path) -> Result<Option<Vec<ShardDef>>, RecoveryError> {
    let path = shards_dir.join(RANGES);
    let text = match std::fs::read(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io(&path, "read")(e)),
    };
    let ids: Vec<String> = serde_json::from_slice(&text)
        .map_err(|e| layout_error(shards_dir, format!("{RANGES} is not a list of ids: {e}")))?;
    let ranges: Vec<ShardDef> = (ids.iter())
        .map(|id| {
            ShardDef::parse(id)
                .ok_or_else(|| layout_error(shards_dir, format!("{id:?} is not a shard id")))
        })
        .collect::<Result<_, _>>()?;
    let contiguous = ranges
        .windows(2)
        .all(|w| w[0].key_end.checked_add(1) == Some(w[1].key_begin));
    if ranges.is_empty() || !contiguous {
        return Err(layout_error(
            shards_dir,
            format!("{RANGES} lists shards that do not cover one range in order: {ids:?}"),
        ));
    }
    Ok(Some(ranges))
}

fn layout_error(dir: &Path, reason: String) -> RecoveryError {
    RecoveryError::Layout {
        dir: dir.to_path_buf(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(begin: u32, end: u32) -> ShardDef {
        ShardDef {
            key_begin: begin,
            key_end: end,
        }
    }

    #[test]
    fn one_range_splits_evenly_and_more_by_halving_the_widest() {
        let all = ShardDef::default();
        assert_eq!(split_ranges(&[all], 1), vec![all]);
        assert_eq!(split_ranges(&[all], 2), ShardDef::split_evenly(2));
        assert_eq!(split_ranges(&[all], 3), ShardDef::split_evenly(3));
        let halves = ShardDef::split_evenly(2);
        let four = split_ranges(&halves, 4);
        assert_eq!(four, ShardDef::split_evenly(4));
        let three = split_ranges(&halves, 3);
        assert_eq!(three.len(), 3);
        assert_eq!(
            three[0],
            halves[0].halves().unwrap().0,
            "the first of equals"
        );
        assert_eq!(
            split_ranges(&[range(7, 7)], 4),
            vec![range(7, 7)],
            "one hash"
        );
        assert_eq!(range(0, 2).split_into(8).len(), 3, "at most one per hash");
    }

    /// A folder's log splits into copies; a second start keeps the layout; more
    /// workers split further; fewer keep every shard; a reset removes them.
    #[test]
    fn a_split_copies_the_parent_log_and_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("m");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("log"), b"parent").unwrap();
        let all = ShardDef::default();

        let unsplit = local_shards(&root, all, 2, false).unwrap();
        assert_eq!(unsplit.shards, vec![(all, root.clone())]);
        assert!(unsplit.lock.is_none());
        drop(unsplit);

        let two = local_shards(&root, all, 2, true).unwrap();
        assert_eq!(two.shards.len(), 2);
        for (range, log) in &two.shards {
            assert_eq!(log, &root.join("shards").join(range.id()));
            assert_eq!(std::fs::read(log.join("log")).unwrap(), b"parent");
        }
        assert!(!root.join("log").exists(), "the parent's log is gone");
        assert!(
            matches!(
                local_shards(&root, all, 2, true),
                Err(RecoveryError::InUse { .. })
            ),
            "a second process is refused while they run"
        );
        std::fs::write(two.shards[0].1.join("log"), b"low").unwrap();
        drop(two);

        let again = local_shards(&root, all, 1, true).unwrap();
        assert_eq!(again.shards.len(), 2, "shards never merge");
        drop(again);

        let four = local_shards(&root, all, 4, true).unwrap();
        let logs: Vec<Vec<u8>> = (four.shards.iter())
            .map(|(_, log)| std::fs::read(log.join("log")).unwrap())
            .collect();
        assert_eq!(logs, [&b"low"[..], b"low", b"parent", b"parent"]);
        let listed = local_logs(&root).unwrap();
        assert_eq!(listed.len(), 4);
        let folders = std::fs::read_dir(root.join("shards")).unwrap().count();
        assert_eq!(folders, 5, "four shard folders and the list");

        remove_shards(&root, four.lock.as_ref().unwrap()).unwrap();
        drop(four);
        assert_eq!(local_logs(&root).unwrap(), vec![(None, root.clone())]);
    }

    /// A split that crashed before its list was renamed into place left new shard
    /// folders: the next start keeps the old layout and removes them.
    #[test]
    fn an_unfinished_split_is_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("m");
        std::fs::create_dir_all(root.join("shards").join("00000000-7fffffff")).unwrap();
        std::fs::write(root.join("log"), b"parent").unwrap();
        let shards = local_shards(&root, ShardDef::default(), 1, true).unwrap();
        assert_eq!(shards.shards, vec![(ShardDef::default(), root.clone())]);
        assert!(!root.join("shards").exists());
        assert_eq!(std::fs::read(root.join("log")).unwrap(), b"parent");
    }

    /// A materialization configured as part of the key space (`shard:`) runs its own
    /// log over that part, and splits that part.
    #[test]
    fn a_configured_part_of_the_key_space_splits_within_itself() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("m");
        let part = range(0, 99);
        let unsplit = local_shards(&root, part, 2, false).unwrap();
        assert_eq!(unsplit.shards, vec![(part, root.clone())]);
        drop(unsplit);
        let split = local_shards(&root, part, 2, true).unwrap();
        let ranges: Vec<ShardDef> = split.shards.iter().map(|(r, _)| *r).collect();
        assert_eq!(ranges, vec![range(0, 49), range(50, 99)]);
    }

    #[test]
    fn a_layout_of_another_range_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("m");
        std::fs::create_dir_all(&root).unwrap();
        drop(local_shards(&root, ShardDef::default(), 2, true).unwrap());
        let err = local_shards(&root, range(0, 99), 2, true).err().unwrap();
        assert!(
            err.to_string()
                .contains("not the configured range 00000000-00000063"),
            "{err}"
        );
    }
}
