//! Where tables live: a [`Warehouse`] is a local folder or `s3://bucket/prefix` on an
//! S3(-compatible) store, and [`WarehouseIo`] is one opened: iceberg's [`FileIO`] for the
//! files a table is made of, and the walks the abort cleaner, the orphan sweep and the
//! orphan check share (list under a prefix, delete a prefix, delete files), so the same
//! code runs on both.
//!
//! ```text
//!  Warehouse::Local(dir) ─▶ file:///abs/dir   FileIO: iceberg's LocalFsStorage (fsync on close)
//!                                             walks: std::fs on the blocking pool
//!  Warehouse::S3{url,s3} ─▶ s3://bucket/pfx   FileIO: S3Storage below, over sluice-object-store
//!                                             walks: LIST, batched DELETE
//! ```
//!
//! Why the sink is as safe on an object store as on a local disk, which has rename and
//! fsync where S3 has neither:
//! - Nothing is renamed. Every file is written once, under a name no other attempt
//!   uses: data files `b<binding>-<process nonce>-<n>.parquet` in the epoch's own folder
//!   (`<generation>-<epoch>`), manifests, manifest lists and metadata JSON with a fresh
//!   UUID each (iceberg's names).
//! - Every whole-object write ([`Storage::write`]: metadata JSON, manifests, manifest
//!   lists) is a conditional put (`If-None-Match: *`): were a name ever written twice, the
//!   second write fails instead of replacing what a snapshot may already reference.
//!   Data files stream through a multipart upload, visible only once completed, whole.
//! - A PUT that returned is durable, as a closed and fsynced local file is; the epoch's
//!   files are closed in `pre_commit`, before the descriptor listing them is decided.
//! - The commit point stays the catalog's compare-and-swap of the table's metadata
//!   location (`catalog.rs`): metadata written by an attempt that loses the swap, or is
//!   cut short before it, is referenced by nothing and read by no reader.
//! - Cleanup lists and deletes by prefix: an undecided epoch's folder is removed whole
//!   (its intent names it), and an orphan is removed only after every snapshot's
//!   manifests were read and none names it. S3 lists are strongly consistent after a
//!   write, so a listing sees every file an earlier call wrote.
//!
//! Threads: local walks run on tokio's blocking pool; S3 requests are async, each bounded
//! by the client's request timeout and retry budget (`sluice_object_store`).

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use iceberg::io::{
    FileIO, FileIOBuilder, FileMetadata, FileRead, FileWrite, InputFile, OutputFile, Storage,
    StorageConfig, StorageFactory,
};
use serde::{Deserialize, Serialize};
use sluice_object_store::object_store::buffered::BufWriter;
use sluice_object_store::object_store::{self, ObjectStore};
use sluice_object_store::{Created, S3Settings, S3Store, S3Url, StoreError};
use sluice_sink_sdk::{Result, SinkError};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;
use tokio::io::AsyncWriteExt;

/// Where tables live, as configured.
#[derive(Debug, Clone, PartialEq)]
pub enum Warehouse {
    /// A folder on the local filesystem (created if missing).
    Local(PathBuf),
    /// `s3://bucket/prefix` on an S3(-compatible) store.
    S3 { url: S3Url, settings: S3Settings },
}

impl From<&Path> for Warehouse {
    fn from(dir: &Path) -> Warehouse {
        Warehouse::Local(dir.to_path_buf())
    }
}

impl From<&PathBuf> for Warehouse {
    fn from(dir: &PathBuf) -> Warehouse {
        Warehouse::Local(dir.clone())
    }
}

impl From<&Warehouse> for Warehouse {
    fn from(w: &Warehouse) -> Warehouse {
        w.clone()
    }
}

impl Warehouse {
    /// Opens it: a local folder is created and made absolute; an S3 client is built
    /// (connecting nothing yet).
    pub fn open(&self) -> Result<WarehouseIo> {
        match self {
            Warehouse::Local(dir) => {
                let io = |e: std::io::Error| {
                    SinkError::External(format!(
                        "cannot create the warehouse {}: {e}",
                        dir.display()
                    ))
                };
                std::fs::create_dir_all(dir).map_err(io)?;
                let abs = std::fs::canonicalize(dir).map_err(io)?;
                Ok(WarehouseIo {
                    root: format!("file://{}", abs.display()),
                    file_io: FileIO::new_with_fs(),
                    s3: None,
                })
            }
            Warehouse::S3 { url, settings } => {
                let store = S3Store::connect(&url.bucket, settings).map_err(store_error)?;
                let storage = S3Storage {
                    bucket: url.bucket.clone(),
                    settings: settings.clone(),
                    store: OnceLock::from(store.clone()),
                };
                Ok(WarehouseIo {
                    root: url.to_string(),
                    file_io: FileIOBuilder::new(Arc::new(S3StorageFactory(storage))).build(),
                    s3: Some(store),
                })
            }
        }
    }
}

fn store_error(e: StoreError) -> SinkError {
    match e {
        StoreError::Config(m) => SinkError::Config(m),
        StoreError::External(m) => SinkError::External(m),
    }
}

/// An opened warehouse. Cheap to clone.
#[derive(Debug, Clone)]
pub struct WarehouseIo {
    /// `file:///abs/dir` or `s3://bucket[/prefix]`, no trailing `/`.
    root: String,
    file_io: FileIO,
    /// The bucket's client (S3 only).
    s3: Option<S3Store>,
}

impl WarehouseIo {
    /// `file:///abs/dir` or `s3://bucket[/prefix]`: every table's default location is
    /// under it.
    pub fn root(&self) -> &str {
        &self.root
    }

    pub fn file_io(&self) -> &FileIO {
        &self.file_io
    }

    /// Every file under `prefix` (a location under the warehouse), as locations, sorted
    /// (none when nothing is there).
    pub async fn list(&self, prefix: &str) -> Result<Vec<String>> {
        match &self.s3 {
            Some(store) => {
                let keys = store.list(store.key(prefix).map_err(store_error)?).await;
                Ok(keys
                    .map_err(store_error)?
                    .iter()
                    .map(|k| store.url(k))
                    .collect())
            }
            None => {
                let dir = local_path(prefix);
                let files = unblock(move || list_files(&dir))
                    .await
                    .map_err(|e| SinkError::External(format!("cannot list {prefix}: {e}")))?;
                Ok(files
                    .into_iter()
                    .map(|p| format!("file://{}", p.display()))
                    .collect())
            }
        }
    }

    /// Every file under `prefix`, as [`list`](Self::list) gives them, with the time it
    /// was last written (for maintenance's orphan age).
    pub async fn list_modified(&self, prefix: &str) -> Result<Vec<(String, SystemTime)>> {
        match &self.s3 {
            Some(store) => {
                let key = store.key(prefix).map_err(store_error)?;
                let path = store.path(key).map_err(store_error)?;
                let inner = store.inner();
                let mut listed = inner.list(Some(&path));
                let mut out = Vec::new();
                while let Some(meta) = listed.next().await {
                    let meta = meta
                        .map_err(|e| SinkError::External(format!("cannot list {prefix}: {e}")))?;
                    let millis = meta.last_modified.timestamp_millis().max(0) as u64;
                    out.push((
                        store.url(meta.location.as_ref()),
                        SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(millis),
                    ));
                }
                out.sort();
                Ok(out)
            }
            None => {
                let dir = local_path(prefix);
                let files = unblock(move || {
                    let mut out = Vec::new();
                    for path in list_files(&dir)? {
                        // A file removed since it was listed (a writer cleaning up
                        // beside maintenance) is not there to judge.
                        match path.metadata().and_then(|m| m.modified()) {
                            Ok(modified) => out.push((modified, path)),
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                            Err(e) => return Err(e),
                        }
                    }
                    Ok(out)
                })
                .await
                .map_err(|e| SinkError::External(format!("cannot list {prefix}: {e}")))?;
                let mut out: Vec<(String, SystemTime)> = files
                    .into_iter()
                    .map(|(t, p)| (format!("file://{}", p.display()), t))
                    .collect();
                out.sort();
                Ok(out)
            }
        }
    }

    /// Removes everything under `prefix` (nothing there is no error).
    pub async fn delete_prefix(&self, prefix: &str) -> Result<()> {
        let failed = |e: String| SinkError::External(format!("cannot remove {prefix}: {e}"));
        match &self.s3 {
            Some(store) => {
                let key = store.key(prefix).map_err(store_error)?;
                store.delete_prefix(key).await.map_err(store_error)?;
                Ok(())
            }
            None => {
                let dir = local_path(prefix);
                unblock(move || match std::fs::remove_dir_all(&dir) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                    _ => Ok(()),
                })
                .await
                .map_err(|e| failed(e.to_string()))
            }
        }
    }

    /// Removes the files at `locations` (those already gone are no error).
    pub async fn delete(&self, locations: &[String]) -> Result<()> {
        match &self.s3 {
            Some(store) => {
                let keys: Vec<String> = (locations.iter())
                    .map(|l| store.key(l).map(str::to_string))
                    .collect::<Result<_, _>>()
                    .map_err(store_error)?;
                store.delete(&keys).await.map_err(store_error)
            }
            None => {
                for l in locations {
                    self.file_io
                        .delete(l)
                        .await
                        .map_err(|e| SinkError::External(format!("cannot remove {l}: {e}")))?;
                }
                Ok(())
            }
        }
    }

    /// Removes the empty folders under `prefix`, best effort (a leftover folder is
    /// harmless); an object store has no folders.
    pub async fn remove_empty_dirs(&self, prefix: &str) {
        if self.s3.is_none() {
            let dir = local_path(prefix);
            let _ = unblock(move || {
                remove_empty_dirs(&dir);
                Ok(())
            })
            .await;
        }
    }
}

/// `f` on tokio's blocking pool.
async fn unblock<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(std::io::Error::other)?
}

/// `/path` of a `file://` location.
fn local_path(location: &str) -> PathBuf {
    PathBuf::from(location.strip_prefix("file://").unwrap_or(location))
}

/// Every regular file under `dir` (none when it does not exist).
fn list_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            if entry.file_type()?.is_dir() {
                stack.push(entry.path());
            } else {
                out.push(entry.path());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Removes the empty folders under `dir`.
fn remove_empty_dirs(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                remove_empty_dirs(&entry.path());
                let _ = std::fs::remove_dir(entry.path());
            }
        }
    }
}

/// Iceberg's [`Storage`] over one bucket: what iceberg reads and writes of a table on S3.
/// Serializable as iceberg asks of a storage (its settings; the client is rebuilt).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct S3Storage {
    bucket: String,
    settings: S3Settings,
    #[serde(skip)]
    store: OnceLock<S3Store>,
}

/// The multipart part size of a streamed data file: 10 MiB (object_store's default; S3
/// allows 10 000 parts, so files up to ~100 GB), at most two parts in flight, so a writer
/// holds at most ~30 MiB.
const PART_SIZE: usize = 10 << 20;

fn ice(e: impl std::fmt::Display) -> iceberg::Error {
    iceberg::Error::new(iceberg::ErrorKind::Unexpected, e.to_string())
}

impl S3Storage {
    fn store(&self) -> iceberg::Result<&S3Store> {
        if let Some(s) = self.store.get() {
            return Ok(s);
        }
        let s = S3Store::connect(&self.bucket, &self.settings).map_err(ice)?;
        Ok(self.store.get_or_init(|| s))
    }

    /// The client and the path of `location`.
    fn at(
        &self,
        location: &str,
    ) -> iceberg::Result<(Arc<dyn ObjectStore>, object_store::path::Path)> {
        let store = self.store()?;
        let path = store.path(store.key(location).map_err(ice)?).map_err(ice)?;
        Ok((store.inner(), path))
    }
}

#[async_trait]
#[typetag::serde(name = "SluiceS3Storage")]
impl Storage for S3Storage {
    async fn exists(&self, path: &str) -> iceberg::Result<bool> {
        let (store, p) = self.at(path)?;
        match store.head(&p).await {
            Ok(_) => Ok(true),
            Err(object_store::Error::NotFound { .. }) => Ok(false),
            Err(e) => Err(ice(e)),
        }
    }

    async fn metadata(&self, path: &str) -> iceberg::Result<FileMetadata> {
        let (store, p) = self.at(path)?;
        let meta = store.head(&p).await.map_err(ice)?;
        Ok(FileMetadata { size: meta.size })
    }

    async fn read(&self, path: &str) -> iceberg::Result<Bytes> {
        let (store, p) = self.at(path)?;
        store.get(&p).await.map_err(ice)?.bytes().await.map_err(ice)
    }

    async fn reader(&self, path: &str) -> iceberg::Result<Box<dyn FileRead>> {
        let (store, path) = self.at(path)?;
        Ok(Box::new(S3Read { store, path }))
    }

    /// A conditional put: a name already written is an error, never overwritten.
    async fn write(&self, path: &str, bs: Bytes) -> iceberg::Result<()> {
        let store = self.store()?;
        match store.put_new(store.key(path).map_err(ice)?, bs).await {
            Ok(Created::Yes) => Ok(()),
            Ok(Created::AlreadyThere) => Err(ice(format!(
                "{path} exists already: an object is never overwritten"
            ))),
            Err(e) => Err(ice(e)),
        }
    }

    async fn writer(&self, path: &str) -> iceberg::Result<Box<dyn FileWrite>> {
        let (store, path) = self.at(path)?;
        Ok(Box::new(S3Write(
            BufWriter::with_capacity(store, path, PART_SIZE).with_max_concurrency(2),
        )))
    }

    async fn delete(&self, path: &str) -> iceberg::Result<()> {
        let store = self.store()?;
        store
            .delete(&[store.key(path).map_err(ice)?.to_string()])
            .await
            .map_err(ice)
    }

    async fn delete_prefix(&self, path: &str) -> iceberg::Result<()> {
        let store = self.store()?;
        let key = store.key(path).map_err(ice)?.trim_end_matches('/');
        store.delete_prefix(key).await.map(drop).map_err(ice)
    }

    async fn delete_stream(&self, mut paths: BoxStream<'static, String>) -> iceberg::Result<()> {
        let store = self.store()?;
        let mut keys = Vec::new();
        while let Some(p) = paths.next().await {
            keys.push(store.key(&p).map_err(ice)?.to_string());
        }
        store.delete(&keys).await.map_err(ice)
    }

    fn new_input(&self, path: &str) -> iceberg::Result<InputFile> {
        Ok(InputFile::new(Arc::new(self.clone()), path.to_string()))
    }

    fn new_output(&self, path: &str) -> iceberg::Result<OutputFile> {
        Ok(OutputFile::new(Arc::new(self.clone()), path.to_string()))
    }
}

/// Builds the one [`S3Storage`] a warehouse's [`FileIO`] holds.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct S3StorageFactory(S3Storage);

#[typetag::serde(name = "SluiceS3StorageFactory")]
impl StorageFactory for S3StorageFactory {
    fn build(&self, _config: &StorageConfig) -> iceberg::Result<Arc<dyn Storage>> {
        Ok(Arc::new(self.0.clone()))
    }
}

struct S3Read {
    store: Arc<dyn ObjectStore>,
    path: object_store::path::Path,
}

#[async_trait]
impl FileRead for S3Read {
    async fn read(&self, range: Range<u64>) -> iceberg::Result<Bytes> {
        self.store.get_range(&self.path, range).await.map_err(ice)
    }
}

/// A data file streamed as a multipart upload: nothing is visible until `close`
/// completes it (a file smaller than a part is one PUT at `close`).
struct S3Write(BufWriter);

#[async_trait]
impl FileWrite for S3Write {
    async fn write(&mut self, bs: Bytes) -> iceberg::Result<()> {
        self.0.put(bs).await.map_err(ice)
    }

    async fn close(&mut self) -> iceberg::Result<()> {
        self.0.shutdown().await.map_err(ice)
    }
}
