//! One binding's folder of batch files: a local folder, or a prefix in an S3 bucket.
//!
//! ```text
//!            local folder                            S3 prefix
//!  open      remove unlocked .tmp files; list → tail  list → tail
//!  start     create .<name>.<token>.tmp, locked       a buffer in memory (the header)
//!  push      write to it                             append to it
//!  end       fsync; link to <name> unless it exists;  PUT <name> If-None-Match: *
//!            remove the temporary; fsync dir
//! ```
//!
//! A batch file appears under its name once, whole, and is never replaced: both ways
//! publish it only if the name is absent. A name that exists already is this
//! generation's batch of that transaction, written by another attempt (one that did not
//! live to see its write return, or a former holder of the shard still writing when
//! another member took it over and replayed the transaction): ours is discarded, as a
//! restart discards it when the listing shows the file. The runtime makes an attempt's
//! batch of a transaction the same bytes as any other's, so which one lands is moot.
//!
//! **What fences a former writer, locally.** Each batch's temporary file has a name of
//! its own (`token`: 64 random bits), so no writer ever publishes another's half-written
//! batch, and it is published by `hard_link` (which fails if the name exists, where
//! `rename` would replace it), then unlinked. The writer holds an exclusive lock on its
//! temporary (`flock`, released when the process dies) from creation until the name is
//! published, and `open` removes only the temporaries it can lock: those of writers that
//! died. A live former writer's temporary is left to it; one an `open` removed in the
//! instant between its creation and its lock fails that batch's end (retryably), never
//! publishes anything wrong. (Hard links are required of the folder's filesystem: local
//! ones and NFS have them.)
//!
//! On S3 there is no rename: the batch is written once, under its final name, by a
//! conditional put. The batch is held in memory until then (S3's single PUT takes up to
//! 5 GiB; a transaction's batch of one binding is far below that in practice).

use crate::config::{Config, Resource};
use async_trait::async_trait;
use sluice_object_store::{Created, S3Store, S3Url, StoreError};
use sluice_output_sdk::{
    BatchKind, Buffer, Format, Generation, GenerationId, OutputEndpoint, OutputError, Result,
    Target,
};
use std::fs::TryLockError;
use std::hash::{BuildHasher, RandomState};
use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use tokio::io::AsyncWriteExt;

/// What a batch file's name says: its generation (`None`: written by a release before
/// generations), its transaction and its kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchFile {
    pub generation: Option<GenerationId>,
    pub txn: u64,
    pub kind: BatchKind,
}

/// The file name of transaction `txn`'s batch of `generation`:
/// `<generation>-<txn:020>[.snapshot].<ext>`, so that a folder listed in name order
/// lists a generation's batches in transaction order, and a later generation's after.
pub fn batch_file_name(
    generation: GenerationId,
    txn: u64,
    kind: BatchKind,
    format: Format,
) -> String {
    match kind {
        BatchKind::Delta => format!("{generation}-{txn:020}.{}", format.extension()),
        BatchKind::Snapshot => format!("{generation}-{txn:020}.snapshot.{}", format.extension()),
    }
}

/// What a batch file's name says (`None`: not a batch file). Reads the names of the
/// release before generations too (`<txn:020>[.snapshot].<ext>`, no generation).
pub fn parse_batch_file_name(name: &str) -> Option<BatchFile> {
    if name.starts_with('.') {
        return None;
    }
    let (stem, rest) = name.split_once('.')?;
    let (generation, txn) = match stem.split_once('-') {
        Some((generation, txn)) => (Some(GenerationId::parse(generation).ok()?), txn),
        None => (None, stem),
    };
    let txn = txn.parse().ok().filter(|_| txn.len() == 20)?;
    let kind = if rest.starts_with("snapshot.") {
        BatchKind::Snapshot
    } else {
        BatchKind::Delta
    };
    Some(BatchFile {
        generation,
        txn,
        kind,
    })
}

/// The name a batch named `name` is written under until it is whole:
/// `.<name>.<token>.tmp`, the token 64 random bits, so that no two writers (a former
/// holder of the shard and the new one) ever share one. The leading dot keeps it out of
/// readers' listings and batch names; the `.tmp` ending is what `open` cleans up.
fn temporary_name(name: &str) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    // std's RandomState is keyed from the OS's randomness, anew for each instance.
    let token = RandomState::new().hash_one((now.as_nanos(), std::process::id()));
    format!(".{name}.{token:016x}.tmp")
}

/// Whether `name` is a temporary batch file (of this release or the one before).
fn is_temporary(name: &str) -> bool {
    name.starts_with('.') && name.ends_with(".tmp")
}

fn io_error(what: &str, path: &Path, err: std::io::Error) -> OutputError {
    OutputError::External(format!("{what} {}: {err}", path.display()))
}

/// Runs blocking file system work (creating, locking, linking, syncing) off the async
/// workers.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| OutputError::External(format!("a file system task failed: {e}")))?
}

fn store_error(e: StoreError) -> OutputError {
    match e {
        StoreError::Config(m) => OutputError::Config(m),
        StoreError::External(m) => OutputError::External(m),
    }
}

/// The non-empty `parts` joined by `/`: an object key.
fn key_of(parts: &[&str]) -> String {
    let parts: Vec<&str> = parts.iter().copied().filter(|p| !p.is_empty()).collect();
    parts.join("/")
}

/// Where a binding's files go.
enum Folder {
    Local(PathBuf),
    /// Keys `<prefix>/<name>` in the store's bucket.
    S3 {
        store: S3Store,
        prefix: String,
    },
}

/// The batch being written.
enum Open {
    Local {
        temp: PathBuf,
        path: PathBuf,
        file: tokio::io::BufWriter<tokio::fs::File>,
    },
    S3 {
        name: String,
        bytes: Vec<u8>,
    },
}

pub struct FilesEndpoint {
    folder: Folder,
    format: Format,
    header: Option<Vec<u8>>,
    max_buffer_size_bytes: usize,
    generation: Generation,
    /// The newest transaction of this generation with a batch file.
    tail: Option<u64>,
    batch: Option<Open>,
}

impl FilesEndpoint {
    pub fn new(config: &Config, resource: &Resource, target: &Target) -> Result<FilesEndpoint> {
        if !target.format.is_line_oriented() {
            return Err(OutputError::Config(format!(
                "format {:?} cannot be written to files (a file holds lines); use json, \
                 debezium or csv",
                target.format
            )));
        }
        let relative = Path::new(&resource.path);
        if relative.is_absolute()
            || relative
                .components()
                .any(|c| matches!(c, std::path::Component::ParentDir))
        {
            return Err(OutputError::Config(format!(
                "path {:?} must stay under the endpoint's directory",
                resource.path
            )));
        }
        let folder = match S3Url::is_s3(&config.directory) {
            false => Folder::Local(Path::new(&config.directory).join(relative)),
            true => {
                let url = S3Url::parse(&config.directory)
                    .map_err(|e| OutputError::Config(format!("directory: {e}")))?;
                let settings = config.s3.clone().unwrap_or_default();
                settings.check("files endpoint").map_err(store_error)?;
                let prefix = key_of(&[&url.prefix, resource.path.trim_matches('/')]);
                let store = S3Store::connect(&url.bucket, &settings).map_err(store_error)?;
                // Checked now: a key of it is a valid object path.
                store.path(&prefix).map_err(store_error)?;
                Folder::S3 { store, prefix }
            }
        };
        if config.s3.is_some() && matches!(folder, Folder::Local(_)) {
            return Err(OutputError::Config(format!(
                "files endpoint: `s3` is set, but `directory` {:?} is not an s3://bucket/prefix location",
                config.directory
            )));
        }
        Ok(FilesEndpoint {
            folder,
            format: target.format,
            header: target.header.clone(),
            max_buffer_size_bytes: config.max_buffer_size_bytes,
            generation: target.generation,
            tail: None,
            batch: None,
        })
    }
}

#[async_trait]
impl OutputEndpoint for FilesEndpoint {
    async fn open(&mut self) -> Result<()> {
        let names = match &self.folder {
            Folder::Local(folder) => local_names(folder).await?,
            Folder::S3 { store, prefix } => {
                let keys = store.list(prefix).await.map_err(store_error)?;
                // Only the prefix's own files: `<prefix>/<name>`, not deeper keys.
                keys.iter()
                    .filter_map(|k| k.strip_prefix(prefix.as_str()))
                    .map(|rest| rest.trim_start_matches('/'))
                    .filter(|name| !name.contains('/'))
                    .map(str::to_string)
                    .collect()
            }
        };
        // Another generation's files are never this one's: after a reset, the new
        // generation writes every transaction, whatever its number.
        self.tail = names
            .iter()
            .filter_map(|name| parse_batch_file_name(name))
            .filter(|file| self.generation.owns(file.generation))
            .map(|file| file.txn)
            .max();
        Ok(())
    }

    fn max_buffer_size_bytes(&self) -> usize {
        self.max_buffer_size_bytes
    }

    async fn batch_start(&mut self, txn: u64, kind: BatchKind) -> Result<()> {
        self.abort().await;
        if self.tail.is_some_and(|tail| txn <= tail) {
            // Written before a crash: this replay is discarded.
            return Ok(());
        }
        let name = batch_file_name(self.generation.id, txn, kind, self.format);
        let header = self.header.clone().unwrap_or_default();
        self.batch = Some(match &self.folder {
            Folder::Local(folder) => {
                let temp = folder.join(temporary_name(&name));
                let file = blocking({
                    let temp = temp.clone();
                    move || create_locked(&temp)
                })
                .await?;
                let mut file =
                    tokio::io::BufWriter::with_capacity(256 << 10, tokio::fs::File::from_std(file));
                file.write_all(&header)
                    .await
                    .map_err(|e| io_error("writing", &temp, e))?;
                Open::Local {
                    temp,
                    path: folder.join(name),
                    file,
                }
            }
            Folder::S3 { .. } => Open::S3 {
                name,
                bytes: header,
            },
        });
        Ok(())
    }

    async fn push(&mut self, buffer: &Buffer) -> Result<()> {
        match &mut self.batch {
            None => {}
            Some(Open::Local { temp, file, .. }) => {
                for message in buffer.messages() {
                    file.write_all(message.value)
                        .await
                        .map_err(|e| io_error("writing", temp, e))?;
                }
            }
            Some(Open::S3 { bytes, .. }) => {
                for message in buffer.messages() {
                    bytes.extend_from_slice(message.value);
                }
            }
        }
        Ok(())
    }

    async fn batch_end(&mut self) -> Result<()> {
        let name = match self.batch.take() {
            None => return Ok(()),
            Some(Open::Local { temp, path, file }) => {
                let Folder::Local(folder) = &self.folder else {
                    unreachable!("a local batch of a local folder")
                };
                if !end_local(folder, temp, &path, file).await? {
                    tracing::info!(
                        path = %path.display(),
                        "this transaction's batch was written by another attempt: ours is discarded"
                    );
                }
                path.file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .into_owned()
            }
            Some(Open::S3 { name, bytes }) => {
                let Folder::S3 { store, prefix } = &self.folder else {
                    unreachable!("an S3 batch of an S3 folder")
                };
                let key = key_of(&[prefix, &name]);
                // Returns once the object is durable, or was there already.
                match store
                    .put_new(&key, bytes.into())
                    .await
                    .map_err(store_error)?
                {
                    Created::Yes => {}
                    Created::AlreadyThere => tracing::info!(
                        key = %store.url(&key),
                        "this transaction's batch was written before: the replay is discarded"
                    ),
                }
                name
            }
        };
        self.tail = self
            .tail
            .max(parse_batch_file_name(&name).map(|file| file.txn));
        Ok(())
    }

    async fn abort(&mut self) {
        if let Some(Open::Local { temp, file, .. }) = self.batch.take() {
            if let Err(err) = tokio::fs::remove_file(&temp).await {
                tracing::debug!(%err, path = %temp.display(), "removing an abandoned batch file");
            }
            drop(file);
        }
    }
}

/// The names in a local folder (created if missing), after removing the temporary files
/// of batches whose writers died (their transactions are replayed). A temporary whose
/// writer lives (it holds its lock: a former holder of the shard, still writing) is
/// left to it.
async fn local_names(folder: &Path) -> Result<Vec<String>> {
    let folder = folder.to_path_buf();
    blocking(move || {
        std::fs::create_dir_all(&folder).map_err(|e| io_error("creating", &folder, e))?;
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&folder).map_err(|e| io_error("listing", &folder, e))? {
            let entry = entry.map_err(|e| io_error("listing", &folder, e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if is_temporary(&name) {
                remove_if_abandoned(&entry.path())?;
            } else {
                names.push(name);
            }
        }
        Ok(names)
    })
    .await
}

/// Removes the temporary file at `path` unless its writer holds its lock.
fn remove_if_abandoned(path: &Path) -> Result<()> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        // Its writer published or abandoned it meanwhile.
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io_error("opening", path, e)),
    };
    match file.try_lock() {
        Ok(()) => match std::fs::remove_file(path) {
            Err(e) if e.kind() != ErrorKind::NotFound => Err(io_error("removing", path, e)),
            _ => Ok(()),
        },
        Err(TryLockError::WouldBlock) => {
            tracing::info!(path = %path.display(), "a batch another writer is still writing is left to it");
            Ok(())
        }
        Err(TryLockError::Error(e)) => Err(io_error("locking", path, e)),
    }
}

/// Creates the temporary file of a batch, new, and locks it for as long as it is open.
fn create_locked(temp: &Path) -> Result<std::fs::File> {
    let file = std::fs::File::create_new(temp).map_err(|e| io_error("creating", temp, e))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        // An `open` of another writer is looking at it: it will remove it.
        Err(TryLockError::WouldBlock) => Err(OutputError::External(format!(
            "locking {}: another writer's start is removing it",
            temp.display()
        ))),
        Err(TryLockError::Error(e)) => Err(io_error("locking", temp, e)),
    }
}

/// Makes a local batch whole under its name, if the name is free: flushed, fsynced,
/// linked from `temp` to `path` (never replacing a file), `temp` removed, and the folder
/// fsynced; returns only then, whether the batch took the name (false: another attempt's
/// batch of the transaction holds it, and ours is dropped). The lock is held throughout.
async fn end_local(
    folder: &Path,
    temp: PathBuf,
    path: &Path,
    mut file: tokio::io::BufWriter<tokio::fs::File>,
) -> Result<bool> {
    file.flush()
        .await
        .map_err(|e| io_error("writing", &temp, e))?;
    let file = file.into_inner().into_std().await;
    let (folder, path) = (folder.to_path_buf(), path.to_path_buf());
    blocking(move || {
        file.sync_all().map_err(|e| io_error("syncing", &temp, e))?;
        let created = match std::fs::hard_link(&temp, &path) {
            Ok(()) => true,
            Err(e) if e.kind() == ErrorKind::AlreadyExists => false,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(OutputError::External(format!(
                    "publishing {} as {}: the temporary file was removed (by another \
                     writer's start) before it was published",
                    temp.display(),
                    path.display()
                )));
            }
            Err(e) => {
                return Err(io_error(
                    &format!("linking {} to", temp.display()),
                    &path,
                    e,
                ));
            }
        };
        std::fs::remove_file(&temp).map_err(|e| io_error("removing", &temp, e))?;
        drop(file);
        std::fs::File::open(&folder)
            .and_then(|dir| dir.sync_all())
            .map_err(|e| io_error("syncing", &folder, e))?;
        Ok(created)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_file_names_sort_by_generation_then_transaction_and_parse_back() {
        let (old, new) = (
            GenerationId::parse("0000000000000001").unwrap(),
            GenerationId::mint(),
        );
        let a = batch_file_name(old, 9, BatchKind::Delta, Format::Json);
        let b = batch_file_name(old, 10, BatchKind::Snapshot, Format::Csv);
        let c = batch_file_name(new, 1, BatchKind::Delta, Format::Json);
        assert!(a < b && b < c, "{a} {b} {c}");
        let file = |generation, txn, kind| {
            Some(BatchFile {
                generation: Some(generation),
                txn,
                kind,
            })
        };
        assert_eq!(parse_batch_file_name(&a), file(old, 9, BatchKind::Delta));
        assert_eq!(
            parse_batch_file_name(&b),
            file(old, 10, BatchKind::Snapshot)
        );
        assert_eq!(parse_batch_file_name(&c), file(new, 1, BatchKind::Delta));
        assert_eq!(parse_batch_file_name(&format!(".{a}.tmp")), None);
        assert_eq!(parse_batch_file_name("notes.txt"), None);
        assert_eq!(
            parse_batch_file_name("nothex0000000001-00000000000000000001.jsonl"),
            None
        );
    }

    #[test]
    fn names_without_a_generation_are_the_previous_releases_and_sort_first() {
        // Frozen: what the release before generations wrote.
        let legacy = "00000000000000000042.snapshot.jsonl";
        assert_eq!(
            parse_batch_file_name(legacy),
            Some(BatchFile {
                generation: None,
                txn: 42,
                kind: BatchKind::Snapshot
            })
        );
        let now = batch_file_name(GenerationId::mint(), 1, BatchKind::Delta, Format::Json);
        assert!(legacy < now.as_str(), "{legacy} {now}");
    }
}
