//! One binding's folder of batch files.

use crate::config::{Config, Resource};
use async_trait::async_trait;
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

/// The batch being written.
struct Open {
    temp: PathBuf,
    path: PathBuf,
    file: tokio::io::BufWriter<tokio::fs::File>,
}

pub struct FilesEndpoint {
    folder: PathBuf,
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
        Ok(FilesEndpoint {
            folder: config.directory.join(relative),
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
        let folder = self.folder.clone();
        tokio::fs::create_dir_all(&folder)
            .await
            .map_err(|e| io_error("creating", &folder, e))?;
        let mut entries = tokio::fs::read_dir(&folder)
            .await
            .map_err(|e| io_error("listing", &folder, e))?;
        let mut tail = None;
        while let Some(entry) =
            (entries.next_entry().await).map_err(|e| io_error("listing", &folder, e))?
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') && name.ends_with(".tmp") {
                // A batch a crash interrupted: its transaction is replayed.
                tokio::fs::remove_file(entry.path())
                    .await
                    .map_err(|e| io_error("removing", &entry.path(), e))?;
            } else if let Some(file) = parse_batch_file_name(&name)
                && self.generation.owns(file.generation)
            {
                // Another generation's files are never this one's: after a reset, the
                // new generation writes every transaction, whatever its number.
                tail = tail.max(Some(file.txn));
            }
        }
        self.tail = tail;
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
        let temp = self.folder.join(format!(".{name}.tmp"));
        let file = tokio::fs::File::create(&temp)
            .await
            .map_err(|e| io_error("creating", &temp, e))?;
        let mut file = tokio::io::BufWriter::with_capacity(256 << 10, file);
        if let Some(header) = &self.header {
            file.write_all(header)
                .await
                .map_err(|e| io_error("writing", &temp, e))?;
        }
        self.batch = Some(Open {
            temp,
            path: self.folder.join(name),
            file,
        });
        Ok(())
    }

    async fn push(&mut self, buffer: &Buffer) -> Result<()> {
        let Some(batch) = &mut self.batch else {
            return Ok(());
        };
        for message in buffer.messages() {
            batch
                .file
                .write_all(message.value)
                .await
                .map_err(|e| io_error("writing", &batch.temp, e))?;
        }
        Ok(())
    }

    async fn batch_end(&mut self) -> Result<()> {
        let Some(mut batch) = self.batch.take() else {
            return Ok(());
        };
        let temp = batch.temp.clone();
        batch
            .file
            .flush()
            .await
            .map_err(|e| io_error("writing", &temp, e))?;
        let file = batch.file.into_inner();
        file.sync_all()
            .await
            .map_err(|e| io_error("syncing", &temp, e))?;
        drop(file);
        tokio::fs::rename(&temp, &batch.path)
            .await
            .map_err(|e| io_error("renaming", &temp, e))?;
        let folder = self.folder.clone();
        tokio::task::spawn_blocking(move || std::fs::File::open(&folder)?.sync_all())
            .await
            .map_err(|e| OutputError::External(format!("syncing a folder: {e}")))?
            .map_err(|e| io_error("syncing", &self.folder, e))?;
        let txn =
            parse_batch_file_name(&batch.path.file_name().unwrap_or_default().to_string_lossy())
                .map(|file| file.txn);
        self.tail = self.tail.max(txn);
        Ok(())
    }

    async fn abort(&mut self) {
        if let Some(batch) = self.batch.take() {
            drop(batch.file);
            if let Err(err) = tokio::fs::remove_file(&batch.temp).await {
                tracing::debug!(%err, path = %batch.temp.display(), "removing an abandoned batch file");
            }
        }
    }
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
