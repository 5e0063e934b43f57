//! Blocking file work (reads, fsync, renames, locks) run off the async workers: an
//! async caller awaits [`unblock`], and the work runs on tokio's blocking pool.
//!
//! An awaiting future that is dropped does not stop the work (a blocking closure runs to
//! its end): callers whose work must never overlap a later generation of the same
//! writer own their files on a thread they join instead (see [`crate::deadletter`]).
//! [`replace_file`] is the one atomic replacement of a small file beside a recovery log
//! (the applied spec, what a shard's loop left), for such work.

use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Runs `work` on the blocking pool and returns its result; a panic in it resumes here.
pub(crate) async fn unblock<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    match spawn(work).await {
        Ok(out) => out,
        Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
        // Only a runtime shutting down cancels a blocking task, and it drops this
        // future first.
        Err(err) => unreachable!("a blocking task was cancelled: {err}"),
    }
}

/// `tokio::task::spawn_blocking` in the caller's span, so that what `work` logs names
/// its materialization and transaction.
pub(crate) fn spawn<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> tokio::task::JoinHandle<T> {
    let span = tracing::Span::current();
    tokio::task::spawn_blocking(move || span.in_scope(work))
}

/// A file operation that failed: on which path, doing what.
#[derive(Debug, thiserror::Error)]
#[error("cannot {action} {}: {error}", path.display())]
pub(crate) struct FileError {
    pub path: PathBuf,
    pub action: &'static str,
    pub error: std::io::Error,
}

/// Replaces `dir/name` with `bytes` atomically: written beside it (`name.new`),
/// fsync'ed, renamed over it, the folder fsync'ed (created first if missing). A crash
/// leaves the old file or the new one; returns only once the new one is durable.
/// Blocking: async callers run it through [`unblock`].
pub(crate) fn replace_file(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), FileError> {
    let failed = |path: &Path, action| {
        let path = path.to_path_buf();
        move |error| FileError {
            path,
            action,
            error,
        }
    };
    std::fs::create_dir_all(dir).map_err(failed(dir, "create the directory"))?;
    let (path, tmp) = (dir.join(name), dir.join(format!("{name}.new")));
    let mut out = std::fs::File::create(&tmp).map_err(failed(&tmp, "create"))?;
    out.write_all(bytes).map_err(failed(&tmp, "write"))?;
    out.sync_all().map_err(failed(&tmp, "fsync"))?;
    std::fs::rename(&tmp, &path).map_err(failed(&path, "replace"))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(failed(dir, "fsync the directory"))
}
