//! One binding's folder of batch files: a local folder, or a prefix in an S3 bucket.
//!
//! ```text
//!            local folder                          S3 prefix
//!  open      remove .tmp files; list → tail        list → tail
//!  start     create .<name>.tmp                    a buffer in memory (the header)
//!  push      write to it                           append to it
//!  end       fsync, rename to <name>, fsync dir    PUT <name> If-None-Match: *
//! ```
//!
//! On S3 there is no rename: the batch is written once, under its final name, by a
//! conditional put. A name that exists already is this generation's batch of that
//! transaction, written by an attempt that did not live to see its put return: the
//! replay is discarded, as a restart discards it when the listing shows the file. The
//! batch is held in memory until then (S3's single PUT takes up to 5 GiB; a
//! transaction's batch of one binding is far below that in practice).

use crate::config::{Config, Resource};
use async_trait::async_trait;
use sluice_object_store::{Created, S3Store, S3Url, StoreError};
use sluice_output_sdk::{
    BatchKind, Buffer, Format, Generation, GenerationId, OutputEndpoint, OutputError, Result,
    Target,
};
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

fn io_error(what: &str, path: &Path, err: std::io::Error) -> OutputError {
    OutputError::External(format!("{what} {}: {err}", path.display()))
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
                let temp = folder.join(format!(".{name}.tmp"));
                let file = tokio::fs::File::create(&temp)
                    .await
                    .map_err(|e| io_error("creating", &temp, e))?;
                let mut file = tokio::io::BufWriter::with_capacity(256 << 10, file);
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
                end_local(folder, temp, &path, file).await?;
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
            drop(file);
            if let Err(err) = tokio::fs::remove_file(&temp).await {
                tracing::debug!(%err, path = %temp.display(), "removing an abandoned batch file");
            }
        }
    }
}

/// The names in a local folder (created if missing), after removing the temporary files
/// of batches a crash interrupted (their transactions are replayed).
async fn local_names(folder: &Path) -> Result<Vec<String>> {
    tokio::fs::create_dir_all(folder)
        .await
        .map_err(|e| io_error("creating", folder, e))?;
    let mut entries = tokio::fs::read_dir(folder)
        .await
        .map_err(|e| io_error("listing", folder, e))?;
    let mut names = Vec::new();
    while let Some(entry) =
        (entries.next_entry().await).map_err(|e| io_error("listing", folder, e))?
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') && name.ends_with(".tmp") {
            tokio::fs::remove_file(entry.path())
                .await
                .map_err(|e| io_error("removing", &entry.path(), e))?;
        } else {
            names.push(name);
        }
    }
    Ok(names)
}

/// Makes a local batch whole under its name: flushed, fsynced, renamed from `temp` to
/// `path`, and the folder fsynced; returns only then.
async fn end_local(
    folder: &Path,
    temp: PathBuf,
    path: &Path,
    mut file: tokio::io::BufWriter<tokio::fs::File>,
) -> Result<()> {
    file.flush()
        .await
        .map_err(|e| io_error("writing", &temp, e))?;
    let file = file.into_inner();
    file.sync_all()
        .await
        .map_err(|e| io_error("syncing", &temp, e))?;
    drop(file);
    tokio::fs::rename(&temp, path)
        .await
        .map_err(|e| io_error("renaming", &temp, e))?;
    let dir = folder.to_path_buf();
    tokio::task::spawn_blocking(move || std::fs::File::open(&dir)?.sync_all())
        .await
        .map_err(|e| OutputError::External(format!("syncing a folder: {e}")))?
        .map_err(|e| io_error("syncing", folder, e))
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
