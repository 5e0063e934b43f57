//! One instance's Transactions stream, of the
//! `CommitPattern::RecoveryLogNonTransactional` pattern (declared by the driver).
//!
//! ```text
//!  load    ─▶ MGET / HGET pipelines of CHUNK_KEYS keys, Loaded pushed as they come
//!             (the serve loop runs it only after the prior transaction's acknowledge)
//!  prepare ─▶ driver checkpoint {} (merge patch): the runtime's recovery log holds it
//!  store   ─▶ staged (stage.rs: bounded memory, then a temporary file)
//!  commit  ─▶ the staged writes, MULTI/EXEC per chunk, in store order
//!  ack     ─▶ nothing
//! ```
//!
//! What holds, and what does not:
//! - **Last write wins, per key.** A standard binding's stored document is a full
//!   reduction, so a transaction replayed after a crash (between these writes and the
//!   recovery log's commit) writes the same documents again: the store ends as if it
//!   were applied once. Except where a reduction depends on what was loaded (`sum`):
//!   the replay loads the first attempt's documents and adds onto them, so that
//!   transaction's sums count twice. Hence `delivery: at_least_once`.
//! - **Not atomic across chunks.** Each chunk is one MULTI/EXEC; a failure after some
//!   chunks leaves those written. The transaction fails (the stream ends, nothing is
//!   acknowledged) and its replay rewrites every key.
//! - **No fencing.** Two instances of a range could both write; the runtime's recovery
//!   log lock keeps one process per log.
//! - **Deletions.** A `null` document deletes the key, whatever `exists` says; `exists`
//!   is otherwise not checked (no strict-exists).

use crate::client::{self, CHUNK_BYTES, CHUNK_KEYS, Write};
use crate::config::Format;
use crate::key;
use crate::stage::{Record, Stage};
use async_trait::async_trait;
use redis::aio::MultiplexedConnection;
use serde_json::Value;
use sluice_doc::tuple;
use sluice_driver_sdk::arena::{load_keys, store_docs};
use sluice_driver_sdk::flow;
use sluice_driver_sdk::materialize::transaction_request::{Load, Prepare, Store};
use sluice_driver_sdk::{Error, LoadedSink, PriorState, Result, Transactor};

/// What the transactor needs of one binding.
#[derive(Debug, Clone)]
pub struct Binding {
    pub prefix: String,
    pub format: Format,
    /// The field under which a hash holds the document (`flow_document` by default).
    pub document_field: String,
    /// The selected key fields, then the value fields: the names of the elements of a
    /// Store's packed key and values, in order (hash format).
    pub fields: Vec<String>,
}

pub struct RedisTransactor {
    conn: MultiplexedConnection,
    bindings: Vec<Binding>,
    stage: Stage,
}

impl RedisTransactor {
    pub fn new(conn: MultiplexedConnection, bindings: Vec<Binding>) -> Self {
        RedisTransactor {
            conn,
            bindings,
            stage: Stage::default(),
        }
    }

    fn binding(&self, binding: u32) -> Result<&Binding> {
        self.bindings.get(binding as usize).ok_or_else(|| {
            Error::Malformed(format!(
                "binding {binding} is not part of the opened materialization ({} bindings)",
                self.bindings.len()
            ))
        })
    }

    /// The Redis commands of one staged record.
    fn write_of(&self, record: Record) -> Result<Write> {
        let binding = self.binding(record.binding)?;
        let key = key::encode(&binding.prefix, &record.key);
        let Some(doc) = record.doc else {
            return Ok(Write::Delete { key });
        };
        match binding.format {
            Format::Json => Ok(Write::Set { key, doc }),
            Format::Hash => {
                let fields = hash_fields(binding, &record.key, &record.values, doc)?;
                Ok(Write::Hash { key, fields })
            }
        }
    }
}

/// The hash of a document: each selected field (key fields, then values; a string as
/// its text, anything else as JSON), then the document under the document field.
fn hash_fields(
    binding: &Binding,
    packed_key: &[u8],
    packed_values: &[u8],
    doc: Vec<u8>,
) -> Result<Vec<(String, Vec<u8>)>> {
    let unpack = |what: &str, packed: &[u8]| {
        tuple::unpack(packed).map_err(|err| {
            Error::Malformed(format!("a Store's {what} is not a packed tuple: {err}"))
        })
    };
    let mut values = unpack("key", packed_key)?;
    values.extend(unpack("values", packed_values)?);
    if values.len() != binding.fields.len() {
        return Err(Error::Malformed(format!(
            "a Store of prefix {:?} has {} key and value elements, the field selection {} ({})",
            binding.prefix,
            values.len(),
            binding.fields.len(),
            binding.fields.join(", ")
        )));
    }
    let mut fields: Vec<(String, Vec<u8>)> = (binding.fields.iter().cloned())
        .zip(values)
        .map(|(field, value)| match value {
            Value::String(text) => (field, text.into_bytes()),
            other => (field, other.to_string().into_bytes()),
        })
        .collect();
    fields.push((binding.document_field.clone(), doc));
    Ok(fields)
}

#[async_trait]
impl Transactor for RedisTransactor {
    /// Runs after the prior transaction's acknowledge (the serve loop defers it), so it
    /// reads what that transaction's commit wrote.
    async fn load(
        &mut self,
        load: Load,
        _prior: PriorState,
        loaded: &mut dyn LoadedSink,
    ) -> Result<()> {
        let binding = self.binding(load.binding)?.clone();
        let mut keys = Vec::with_capacity(CHUNK_KEYS);
        let mut packed = load_keys(&load).peekable();
        while packed.peek().is_some() {
            keys.clear();
            for k in packed.by_ref().take(CHUNK_KEYS) {
                keys.push(key::encode(&binding.prefix, k?));
            }
            let docs = client::load_chunk(
                &mut self.conn,
                binding.format,
                &binding.document_field,
                &keys,
            )
            .await?;
            for doc in docs.into_iter().flatten() {
                loaded.push(load.binding, &doc);
            }
            // Bounded memory: what was found so far goes out before the next chunk.
            loaded.send_full().await?;
        }
        Ok(())
    }

    /// The runtime's recovery log records the checkpoint; the driver adds nothing.
    async fn prepare(&mut self, _prepare: Prepare) -> Result<flow::DriverCheckpoint> {
        Ok(flow::DriverCheckpoint {
            driver_checkpoint_json: b"{}".to_vec(),
            rfc7396_merge_patch: true,
        })
    }

    async fn store(&mut self, store: Store) -> Result<()> {
        self.binding(store.binding)?;
        for doc in store_docs(&store) {
            let doc = doc?;
            let text = doc.json(store.binding)?;
            let deletion = text.trim() == "null";
            let body = (!deletion).then_some(doc.doc);
            (self.stage)
                .push(store.binding, doc.key, doc.values, body)
                .await?;
        }
        Ok(())
    }

    /// Writes every staged store. Returns only after Redis answered every EXEC; a
    /// failure leaves the chunks before it written and fails the transaction.
    async fn commit(&mut self) -> Result<()> {
        let mut drain = self.stage.drain().await?;
        loop {
            let records = drain.next_chunk(CHUNK_KEYS, CHUNK_BYTES).await?;
            if records.is_empty() {
                return Ok(());
            }
            let writes = (records.into_iter())
                .map(|record| self.write_of(record))
                .collect::<Result<Vec<_>>>()?;
            client::write_chunk(&mut self.conn, &writes).await?;
        }
    }

    /// Nothing to do: the writes were made at commit.
    async fn acknowledge(&mut self) -> Result<()> {
        Ok(())
    }

    async fn destroy(mut self: Box<Self>) {
        self.stage.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use sluice_doc::tuple::pack_key;

    #[test]
    fn a_hash_holds_the_selected_fields_then_the_document() {
        let binding = Binding {
            prefix: "v:".into(),
            format: Format::Hash,
            document_field: "flow_document".into(),
            fields: vec!["id".into(), "name".into(), "n".into()],
        };
        let doc = br#"{"id":7,"name":"x","n":1.5}"#.to_vec();
        let fields = hash_fields(
            &binding,
            &pack_key(&[json!(7)]),
            &pack_key(&[json!("x"), json!(1.5)]),
            doc.clone(),
        )
        .unwrap();
        let expected: Vec<(String, Vec<u8>)> = vec![
            ("id".into(), b"7".to_vec()),
            ("name".into(), b"x".to_vec()),
            ("n".into(), b"1.5".to_vec()),
            ("flow_document".into(), doc.clone()),
        ];
        assert_eq!(fields, expected);
        let short = hash_fields(&binding, &pack_key(&[json!(7)]), &[], doc).unwrap_err();
        assert!(matches!(short, Error::Malformed(_)), "{short}");
    }
}
