//! The loop's shared types: what a shard is ([`Shard`], its [`Binding`]s and their
//! [`Collection`]s), where it writes ([`EndpointDef`]), what a run did ([`Summary`]) and
//! why it ended ([`RunError`]).
//!
//! They sit below every part of the runtime that names them (the pipeline file, the
//! registry, projections, intake, metrics, the loop), so none of those
//! needs another for its types: the module graph stays acyclic. This module uses no
//! other module of the crate but the recovery log and the dead-letter files, whose
//! errors a [`RunError`] carries.

mod error;

pub use error::RunError;

use serde_json::Value;
use sluice_doc::combine::CombineError;
use sluice_doc::compact::Doc;
use sluice_doc::{KeyExtractor, Pointer, Schema};
use sluice_proto::materialize::transaction_request::Open;
use std::sync::Arc;
use std::time::Duration;

/// A compiled collection, shared by every binding that reads it.
pub struct Collection {
    pub name: String,
    pub schema: Arc<Schema>,
    pub key: KeyExtractor,
    /// The key's JSON pointers, as written in the pipeline file.
    pub key_ptrs: Vec<String>,
}

impl Collection {
    /// Why the combiner would reject the new document `doc` of this collection, if it
    /// would: invalid against the schema (a deletion needs only its key), or without
    /// its key; the combiner's check, in its order and with its errors. `key` is a
    /// scratch buffer (its packed key, when it has one).
    pub fn check(&self, doc: &Doc, key: &mut Vec<u8>) -> Result<(), CombineError> {
        key.clear();
        let keyed = self.key.pack_doc(doc, key);
        let valid = || self.schema.validate_doc(doc);
        self.verdict(doc.is_deletion(), keyed, valid, key)
    }

    /// [`Collection::check`] of a document a source handed over parsed, without
    /// converting it.
    pub fn check_value(&self, doc: &Value, key: &mut Vec<u8>) -> Result<(), CombineError> {
        key.clear();
        let keyed = self.key.pack(doc, key);
        let deletion = doc.pointer("/_meta/op").and_then(Value::as_str) == Some("d");
        self.verdict(deletion, keyed, || self.schema.validate(doc), key)
    }

    fn verdict(
        &self,
        deletion: bool,
        keyed: Result<(), sluice_doc::tuple::KeyError>,
        valid: impl FnOnce() -> Result<(), sluice_doc::schema::ValidationError>,
        key: &[u8],
    ) -> Result<(), CombineError> {
        if !deletion && let Err(source) = valid() {
            return Err(CombineError::Invalid {
                collection: self.name.clone(),
                key: match keyed {
                    Ok(()) => sluice_doc::tuple::unpack_json_array(key)
                        .map_or_else(|_| "(unreadable)".to_string(), |k| k.to_string()),
                    Err(_) => "(none)".to_string(),
                },
                source,
            });
        }
        keyed.map_err(|source| CombineError::Key {
            collection: self.name.clone(),
            source,
        })
    }
}

/// One binding of the materialization, as the loop needs it.
#[derive(Clone)]
pub struct Binding {
    pub collection: Arc<Collection>,
    /// The resource path, joined with `.` (e.g. the table): names the binding in
    /// checkpoints.
    pub resource: String,
    pub delta_updates: bool,
    /// Pointers of the selected value fields, in field-selection order.
    pub values: Vec<Pointer>,
}

/// The shard a loop runs for.
#[derive(Clone)]
pub struct Shard {
    pub open: Open,
    pub bindings: Vec<Binding>,
}

/// Where a materialization writes: a driver kind (`sqlite`, `command`, ...) and its
/// configuration as that kind parsed it (complete, paths resolved).
#[derive(Debug, Clone, PartialEq)]
pub struct EndpointDef {
    pub kind: String,
    pub config: Value,
}

/// What a finished run did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    pub transactions: u64,
    pub docs: u64,
    pub bytes: u64,
    pub loaded: u64,
    pub stored: u64,
    /// The transaction number of the last commit.
    pub last_txn: u64,
    /// Times the loop was reopened after a retryable failure.
    pub restarts: u64,
    /// Documents rejected by `on_error: skip` sources (in committed transactions).
    pub rejected: u64,
    /// How long the reader waited for input with nothing read (a `--follow` run caught
    /// up): what a rate over the run's time leaves out.
    pub idle: Duration,
}

impl Summary {
    /// Adds what another run of the same shard, or another shard of the same
    /// materialization, did (counts add up; the last transaction and the idle time are
    /// the larger).
    pub fn merge(&mut self, other: &Summary) {
        self.transactions += other.transactions;
        self.docs += other.docs;
        self.bytes += other.bytes;
        self.loaded += other.loaded;
        self.stored += other.stored;
        self.last_txn = self.last_txn.max(other.last_txn);
        self.restarts += other.restarts;
        self.rejected += other.rejected;
        self.idle = self.idle.max(other.idle);
    }
}

/// The name of the materialization a shard's Open is for.
pub(crate) fn materialization_name(open: &Open) -> String {
    open.materialization
        .as_ref()
        .map(|m| m.materialization.clone())
        .unwrap_or_default()
}

/// The `shard` label and id: the key-hash range, inclusive, as 8 hex digits each.
pub fn shard_label(key_begin: u32, key_end: u32) -> String {
    format!("{key_begin:08x}-{key_end:08x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shard_is_named_by_its_key_range_in_hex() {
        assert_eq!(shard_label(0, u32::MAX), "00000000-ffffffff");
        assert_eq!(shard_label(0x8000_0000, 0xbfff_ffff), "80000000-bfffffff");
        assert_eq!(shard_label(17, 255), "00000011-000000ff");
    }
}
