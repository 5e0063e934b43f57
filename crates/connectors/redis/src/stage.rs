//! A transaction's stores, staged until its commit writes them.
//!
//! ```text
//!  store ─▶ push(record) ─▶ memory buffer ──(past SPILL_BYTES)──▶ temporary file
//!  commit ─▶ drain ─▶ next_chunk (≤ CHUNK_KEYS records, ≤ CHUNK_BYTES) ─▶ MULTI/EXEC
//! ```
//!
//! What holds: the stage holds at most [`SPILL_BYTES`] in memory, whatever the size of
//! the transaction; the rest is in an anonymous temporary file (deleted when dropped),
//! written and read through `tokio::fs`, so on the blocking pool, never on an async
//! worker. Records come back in the order they were pushed.
//!
//! The file lives only as long as one transaction of one process, so its records have
//! no magic or version: `binding u32 | key len u32 | key | values len u32 | values |
//! doc len u32 | doc`, little-endian, where a doc length of `u32::MAX` is a deletion
//! (no doc bytes follow).

use sluice_driver_sdk::{Error, Result};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncSeekExt, AsyncWriteExt, BufReader};

/// Bytes of staged records kept in memory before they move to the temporary file: the
/// serve loop's bound for deferred loads too.
pub const SPILL_BYTES: usize = 16 << 20;

const DELETION: u32 = u32::MAX;

/// One staged store: its binding, packed key and values, and document (`None`: delete).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub binding: u32,
    pub key: Vec<u8>,
    pub values: Vec<u8>,
    pub doc: Option<Vec<u8>>,
}

impl Record {
    fn size(&self) -> usize {
        16 + self.key.len() + self.values.len() + self.doc.as_ref().map_or(0, Vec::len)
    }
}

#[derive(Default)]
pub struct Stage {
    memory: Vec<u8>,
    file: Option<tokio::fs::File>,
    count: usize,
}

fn spill_error(err: std::io::Error) -> Error {
    Error::store(
        "Redis driver: staging a transaction's stores in a temporary file",
        err,
        false,
    )
}

fn len32(what: &str, len: usize) -> Result<u32> {
    u32::try_from(len)
        .ok()
        .filter(|len| *len != DELETION)
        .ok_or_else(|| Error::Malformed(format!("a stored {what} of {len} bytes is too large")))
}

impl Stage {
    /// How many records are staged.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.count
    }

    pub async fn push(
        &mut self,
        binding: u32,
        key: &[u8],
        values: &[u8],
        doc: Option<&[u8]>,
    ) -> Result<()> {
        let buf = &mut self.memory;
        buf.extend_from_slice(&binding.to_le_bytes());
        buf.extend_from_slice(&len32("key", key.len())?.to_le_bytes());
        buf.extend_from_slice(key);
        buf.extend_from_slice(&len32("values tuple", values.len())?.to_le_bytes());
        buf.extend_from_slice(values);
        match doc {
            Some(doc) => {
                buf.extend_from_slice(&len32("document", doc.len())?.to_le_bytes());
                buf.extend_from_slice(doc);
            }
            None => buf.extend_from_slice(&DELETION.to_le_bytes()),
        }
        self.count += 1;
        if self.memory.len() > SPILL_BYTES {
            self.spill().await?;
        }
        Ok(())
    }

    /// Moves the memory buffer to the end of the temporary file (made on first use).
    async fn spill(&mut self) -> Result<()> {
        let file = match &mut self.file {
            Some(file) => file,
            None => {
                let file = tokio::task::spawn_blocking(tempfile::tempfile)
                    .await
                    .map_err(|err| spill_error(std::io::Error::other(err)))?
                    .map_err(spill_error)?;
                self.file.insert(tokio::fs::File::from_std(file))
            }
        };
        file.write_all(&self.memory).await.map_err(spill_error)?;
        self.memory.clear();
        Ok(())
    }

    /// Every staged record, in push order, to read in chunks; the stage is left empty.
    pub async fn drain(&mut self) -> Result<Drain> {
        let count = std::mem::take(&mut self.count);
        let reader: Box<dyn AsyncRead + Send + Unpin> = match self.file.is_some() {
            false => Box::new(std::io::Cursor::new(std::mem::take(&mut self.memory))),
            true => {
                self.spill().await?;
                let mut file = self.file.take().expect("spilled to a file");
                file.flush().await.map_err(spill_error)?;
                file.rewind().await.map_err(spill_error)?;
                Box::new(file)
            }
        };
        Ok(Drain {
            reader: BufReader::with_capacity(1 << 20, reader),
            left: count,
        })
    }

    /// Drops every staged record (a failed transaction).
    pub fn clear(&mut self) {
        *self = Stage::default();
    }
}

/// The staged records, read back in chunks.
pub struct Drain {
    reader: BufReader<Box<dyn AsyncRead + Send + Unpin>>,
    left: usize,
}

impl Drain {
    /// The next records, at most `max_records` and, past the first, at most `max_bytes`
    /// in all; empty when every record has been read.
    pub async fn next_chunk(
        &mut self,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<Record>> {
        let mut chunk = Vec::new();
        let mut bytes = 0;
        while self.left > 0 && chunk.len() < max_records && (chunk.is_empty() || bytes < max_bytes)
        {
            let record = self.read_record().await.map_err(spill_error)?;
            bytes += record.size();
            chunk.push(record);
            self.left -= 1;
        }
        Ok(chunk)
    }

    async fn read_record(&mut self) -> std::io::Result<Record> {
        let binding = self.reader.read_u32_le().await?;
        let key = self.read_bytes().await?;
        let values = self.read_bytes().await?;
        let doc = match self.reader.read_u32_le().await? {
            DELETION => None,
            len => Some(self.read_exact(len).await?),
        };
        Ok(Record {
            binding,
            key,
            values,
            doc,
        })
    }

    async fn read_bytes(&mut self) -> std::io::Result<Vec<u8>> {
        let len = self.reader.read_u32_le().await?;
        self.read_exact(len).await
    }

    async fn read_exact(&mut self, len: u32) -> std::io::Result<Vec<u8>> {
        let mut buf = vec![0; len as usize];
        self.reader.read_exact(&mut buf).await?;
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(i: u32, size: usize) -> Record {
        Record {
            binding: i % 3,
            key: i.to_be_bytes().to_vec(),
            values: vec![b'v'; i as usize % 5],
            doc: (!i.is_multiple_of(7)).then(|| vec![b'd'; size]),
        }
    }

    async fn round_trip(
        records: &[Record],
        max_records: usize,
        max_bytes: usize,
    ) -> Vec<Vec<Record>> {
        let mut stage = Stage::default();
        for r in records {
            stage
                .push(r.binding, &r.key, &r.values, r.doc.as_deref())
                .await
                .unwrap();
        }
        assert_eq!(stage.len(), records.len());
        let mut drain = stage.drain().await.unwrap();
        assert_eq!(stage.len(), 0, "the stage is left empty");
        let mut chunks = Vec::new();
        loop {
            let chunk = drain.next_chunk(max_records, max_bytes).await.unwrap();
            if chunk.is_empty() {
                return chunks;
            }
            chunks.push(chunk);
        }
    }

    #[tokio::test]
    async fn records_come_back_in_order_in_bounded_chunks_from_memory() {
        let records: Vec<Record> = (0..25).map(|i| record(i, 10)).collect();
        let chunks = round_trip(&records, 10, usize::MAX).await;
        assert_eq!(chunks.iter().map(Vec::len).collect::<Vec<_>>(), [10, 10, 5]);
        assert_eq!(chunks.concat(), records);
    }

    #[tokio::test]
    async fn a_transaction_larger_than_the_memory_bound_spills_and_comes_back_whole() {
        // 40 documents of 1 MiB: 40 MiB staged, more than twice SPILL_BYTES.
        let records: Vec<Record> = (0..40).map(|i| record(i, 1 << 20)).collect();
        let mut stage = Stage::default();
        for r in &records {
            stage
                .push(r.binding, &r.key, &r.values, r.doc.as_deref())
                .await
                .unwrap();
            assert!(stage.memory.len() <= SPILL_BYTES, "memory stays bounded");
        }
        assert!(stage.file.is_some());
        let chunks = round_trip(&records, 1000, 4 << 20).await;
        for chunk in &chunks {
            // A chunk stops at the first record that takes it to 4 MiB or more.
            let before_last: usize = chunk[..chunk.len() - 1].iter().map(Record::size).sum();
            assert!(before_last < 4 << 20, "cut at 4 MiB of documents");
        }
        assert!(chunks.len() >= 8, "{} chunks", chunks.len());
        assert_eq!(chunks.concat(), records);
    }
}
