//! Wake-ups for a followed file: file-change notifications (inotify on Linux, through
//! `notify`), so an appended line is read the moment it is written rather than at the
//! next poll.
//!
//! The watch is on the file's folder, not the file: it sees the file created, replaced
//! or rotated too, and works before the file exists. Events for other files of the
//! folder (a SQLite store beside the input) are filtered out in the callback, so they
//! never wake the reader. Notifications can be missed (a network file system, a
//! watcher that failed to start, an event queue overflow), so [`FileWatch::changed`]
//! also returns after [`SAFETY_POLL`]; without a watcher it polls every
//! [`sluice_source_sdk::IDLE_POLL`].

use notify::{EventKind, RecursiveMode, Watcher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// How long a followed file waits for a notification before it looks anyway.
pub const SAFETY_POLL: Duration = Duration::from_secs(1);

/// The file-change notifications of one followed file.
pub struct FileWatch {
    changed: Arc<Notify>,
    /// Kept alive: dropping it ends the watch. `None` when it could not start.
    watcher: Option<notify::RecommendedWatcher>,
}

impl FileWatch {
    /// Watches `path` (through its folder). A watcher that cannot start (no inotify
    /// instances left, a file system without notifications) is logged and replaced by
    /// polling.
    pub fn new(name: &str, path: &Path) -> FileWatch {
        let changed = Arc::new(Notify::new());
        let watcher = start(path, changed.clone())
            .inspect_err(|e| {
                tracing::warn!(
                    source = name,
                    path = %path.display(),
                    "cannot watch the followed file for changes ({e}); polling it every {:?}",
                    sluice_source_sdk::IDLE_POLL
                );
            })
            .ok();
        FileWatch { changed, watcher }
    }

    /// Returns when the file may have changed since the last return: at once if a
    /// notification came meanwhile. Cancel-safe.
    pub async fn changed(&self) {
        let poll = match self.watcher {
            Some(_) => SAFETY_POLL,
            None => sluice_source_sdk::IDLE_POLL,
        };
        tokio::select! {
            () = self.changed.notified() => {}
            () = tokio::time::sleep(poll) => {}
        }
    }
}

fn start(path: &Path, changed: Arc<Notify>) -> notify::Result<notify::RecommendedWatcher> {
    let file = absolute(path);
    let folder = file
        .parent()
        .map_or_else(|| PathBuf::from("/"), Path::to_path_buf);
    let name = file.file_name().map(|n| n.to_os_string());
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let relevant = match event {
            // An error (a queue overflow) may hide a change: look.
            Err(_) => true,
            Ok(event) => {
                !matches!(event.kind, EventKind::Access(_))
                    && event
                        .paths
                        .iter()
                        .any(|p| p.file_name().map(|n| n.to_os_string()) == name)
            }
        };
        if relevant {
            changed.notify_one();
        }
    })?;
    watcher.watch(&folder, RecursiveMode::NonRecursive)?;
    Ok(watcher)
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}
