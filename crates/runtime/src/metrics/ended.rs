//! What a shard's loop left when it ended, kept beside its recovery log, so that
//! `sluice status` can tell it once the process is gone: the state it ended in (failed or
//! stopped), its last error, and its sources' states and errors, as the status served
//! them at the end.
//!
//! ```text
//!  <recovery_log>/<materialization>/ended-<shard>.json
//!      {"format": 1, "ended_at": <unix ms>, "version": "0.1.0", "shard": {<ShardView, no history>}}
//! ```
//!
//! Written at every end of a shard's loop, well or not, replaced atomically (written
//! beside, fsync'ed, renamed over): it always tells the last end, never an older one's
//! error after a run that ended well. A process killed outright writes nothing, so the
//! file's `ended_at` says which run it tells of. `sluice apply --delete` removes it with
//! the log. Its file work runs on the blocking pool ([`record`], [`forget`]), or in the
//! CLI ([`read`]).

use super::status::ShardView;
use crate::blocking::FileError;
use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};

const FORMAT: u32 = 1;
const PREFIX: &str = "ended-";
const SUFFIX: &str = ".json";

/// One shard's end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ended {
    pub format: u32,
    /// Unix milliseconds.
    pub ended_at: u64,
    /// The version of the binary that ran it.
    pub version: String,
    /// Its status at the end, without the history of transactions.
    pub shard: ShardView,
}

#[derive(Debug, thiserror::Error)]
pub enum EndedError {
    #[error("cannot read {}: {error}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        error: std::io::Error,
    },
    #[error("{} is unreadable: {reason}", path.display())]
    Unreadable { path: PathBuf, reason: String },
}

/// Records `shard`'s end in its recovery log's folder `dir`; durable on return.
pub(crate) async fn record(dir: &Path, mut shard: ShardView) -> Result<(), FileError> {
    shard.history = VecDeque::new();
    let ended = Ended {
        format: FORMAT,
        ended_at: super::status::unix_ms(std::time::SystemTime::now()),
        version: env!("CARGO_PKG_VERSION").to_string(),
        shard,
    };
    let name = format!("{PREFIX}{}{SUFFIX}", ended.shard.shard);
    let json = serde_json::to_vec_pretty(&ended).expect("a status serializes");
    let dir = dir.to_path_buf();
    crate::blocking::unblock(move || crate::blocking::replace_file(&dir, &name, &json)).await
}

/// The ends recorded in `dir`, by shard. Blocking.
pub fn read(dir: &Path) -> Result<Vec<Ended>, EndedError> {
    let paths = list(dir).map_err(|error| EndedError::Io {
        path: dir.to_path_buf(),
        error,
    })?;
    let mut ended = Vec::new();
    for path in paths {
        let bytes = std::fs::read(&path).map_err(|error| EndedError::Io {
            path: path.clone(),
            error,
        })?;
        let unreadable = |reason: String| EndedError::Unreadable {
            path: path.clone(),
            reason,
        };
        #[derive(Deserialize)]
        struct Header {
            format: u32,
        }
        let header: Header =
            serde_json::from_slice(&bytes).map_err(|e| unreadable(e.to_string()))?;
        if header.format > FORMAT {
            return Err(unreadable(format!(
                "its format {} is newer than this binary's ({FORMAT})",
                header.format
            )));
        }
        ended.push(serde_json::from_slice(&bytes).map_err(|e| unreadable(e.to_string()))?);
    }
    ended.sort_by(|a: &Ended, b| a.shard.shard.cmp(&b.shard.shard));
    Ok(ended)
}

/// Forgets the ends recorded in `dir` (a deleted materialization starts over).
pub(crate) async fn forget(dir: &Path) -> std::io::Result<()> {
    let dir = dir.to_path_buf();
    crate::blocking::unblock(move || {
        for path in list(&dir)? {
            std::fs::remove_file(path)?;
        }
        Ok(())
    })
    .await
}

/// The files of recorded ends in `dir` (none when it does not exist).
fn list(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut files = Vec::new();
    for entry in entries {
        let path = entry?.path();
        let name = path.file_name().and_then(|name| name.to_str());
        if name.is_some_and(|name| name.starts_with(PREFIX) && name.ends_with(SUFFIX)) {
            files.push(path);
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::status::{Part, State, Status};

    #[tokio::test]
    async fn an_end_reads_back_by_shard_and_is_forgotten_with_the_log() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), Vec::new(), "never ended");
        let status = Status::default();
        for range in ["80000000-ffffffff", "00000000-7fffffff"] {
            let shard = status.shard("m".into(), range.into(), vec!["a".into()], vec![]);
            shard.failed("source", "source a: gone".into(), false, Part::Source("a"));
            record(dir.path(), shard.view()).await.unwrap();
        }
        std::fs::write(dir.path().join("applied"), "kept").unwrap();
        let ended = read(dir.path()).unwrap();
        let shards: Vec<&str> = ended.iter().map(|e| e.shard.shard.as_str()).collect();
        assert_eq!(shards, ["00000000-7fffffff", "80000000-ffffffff"]);
        assert_eq!(ended[0].shard.state, State::Failed);
        assert_eq!(
            ended[0].shard.sources["a"]
                .last_error
                .as_ref()
                .unwrap()
                .message,
            "source a: gone"
        );
        assert_eq!(ended[0].version, env!("CARGO_PKG_VERSION"));

        forget(dir.path()).await.unwrap();
        assert_eq!(read(dir.path()).unwrap(), Vec::new());
        assert!(
            dir.path().join("applied").exists(),
            "only ends are forgotten"
        );
    }

    #[test]
    fn a_newer_format_is_refused_not_guessed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ended-00000000-ffffffff.json");
        std::fs::write(&path, r#"{"format": 2}"#).unwrap();
        let err = read(dir.path()).unwrap_err().to_string();
        assert!(err.contains("ended-00000000-ffffffff.json"), "{err}");
        assert!(err.contains("format 2 is newer"), "{err}");
    }
}
