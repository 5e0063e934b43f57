//! Fixtures shared by the SQLite driver's tests: a `pageviews` collection with one
//! projection of each column type, materialization specs over it, and builders of Load
//! and Store messages (arena + slices) from JSON documents.

#![allow(dead_code)] // Each test binary uses its own subset of the fixtures.

use serde_json::{Value, json};
use sluice_doc::tuple;
use sluice_proto::flow::{self, Slice};
use sluice_proto::materialize::transaction_request::{Load, Open, Store};
use std::path::Path;

pub const MATERIALIZATION: &str = "acme/views-db";

fn projection(field: &str, ptr: &str, types: &[&str], key: bool) -> flow::Projection {
    flow::Projection {
        ptr: ptr.to_owned(),
        field: field.to_owned(),
        is_primary_key: key,
        inference: Some(flow::Inference {
            types: types.iter().map(|t| t.to_string()).collect(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `acme/pageviews`, keyed by `/user_id`, with a field of every kind.
pub fn collection() -> flow::CollectionSpec {
    flow::CollectionSpec {
        collection: "acme/pageviews".into(),
        key_ptrs: vec!["/user_id".into()],
        projections: vec![
            projection("user_id", "/user_id", &["string"], true),
            projection("day", "/day", &["integer"], false),
            projection("views", "/views", &["integer"], false),
            projection("score", "/score", &["number", "null"], false),
            projection("active", "/active", &["boolean"], false),
            projection("tags", "/tags", &["array"], false),
            projection("meta/source", "/meta/source", &["string"], false),
            projection("nothing", "/nothing", &["null"], false),
            projection("flow_document", "", &["object"], false),
        ],
        ..Default::default()
    }
}

/// The value fields selected by [`binding`], in order.
pub const VALUES: [&str; 4] = ["views", "score", "active", "tags"];

pub fn binding(table: &str, delta_updates: bool) -> flow::materialization_spec::Binding {
    binding_keyed(table, delta_updates, &["user_id"])
}

/// [`binding`] of the collection keyed by the given top-level fields instead.
pub fn binding_keyed(
    table: &str,
    delta_updates: bool,
    keys: &[&str],
) -> flow::materialization_spec::Binding {
    let mut collection = collection();
    collection.key_ptrs = keys.iter().map(|k| format!("/{k}")).collect();
    for p in &mut collection.projections {
        p.is_primary_key = keys.contains(&p.field.as_str());
    }
    flow::materialization_spec::Binding {
        resource_spec_json: json!({ "table": table }).to_string(),
        resource_path: vec![table.to_owned()],
        collection: Some(collection),
        field_selection: Some(flow::FieldSelection {
            keys: keys.iter().map(|k| k.to_string()).collect(),
            values: VALUES.iter().map(|v| v.to_string()).collect(),
            document: "flow_document".into(),
            ..Default::default()
        }),
        delta_updates,
    }
}

pub fn spec(
    db: &Path,
    bindings: Vec<flow::materialization_spec::Binding>,
) -> flow::MaterializationSpec {
    flow::MaterializationSpec {
        materialization: MATERIALIZATION.into(),
        endpoint_type: flow::EndpointType::Sqlite as i32,
        endpoint_spec_json: json!({ "path": db }).to_string(),
        bindings,
    }
}

pub fn open(spec: &flow::MaterializationSpec, key_begin: u32, key_end: u32) -> Open {
    Open {
        materialization: Some(spec.clone()),
        version: "v1".into(),
        key_begin,
        key_end,
        driver_checkpoint_json: b"{}".to_vec(),
    }
}

/// Appends `bytes` to `arena` and returns their slice.
fn push(arena: &mut Vec<u8>, bytes: &[u8]) -> Slice {
    let begin = arena.len() as u32;
    arena.extend_from_slice(bytes);
    Slice {
        begin,
        end: arena.len() as u32,
    }
}

fn pointer_value(doc: &Value, ptr: &str) -> Value {
    doc.pointer(ptr).cloned().unwrap_or(Value::Null)
}

/// A Load of `keys`, each a JSON array of key components.
pub fn load(binding: u32, keys: &[Value]) -> Load {
    let mut arena = Vec::new();
    let packed_keys = keys
        .iter()
        .map(|key| push(&mut arena, &tuple::pack_key(key.as_array().unwrap())))
        .collect();
    Load {
        binding,
        arena,
        packed_keys,
    }
}

/// A Store of `docs`, each with its `exists` flag; the key (at `key_ptrs`) and the
/// [`VALUES`] are extracted from the documents as the runtime does. A document `null`
/// is a deletion; its key is then given as `{"key": [...]}` in place of the document.
pub fn store(binding: u32, key_ptrs: &[&str], docs: &[(Value, bool)]) -> Store {
    let mut msg = Store {
        binding,
        ..Default::default()
    };
    for (doc, exists) in docs {
        let (key, values, text) = match doc.get("key") {
            Some(Value::Array(key)) => (tuple::pack_key(key), Vec::new(), "null".to_owned()),
            _ => {
                let key: Vec<Value> = key_ptrs.iter().map(|p| pointer_value(doc, p)).collect();
                let values: Vec<Value> = VALUES
                    .iter()
                    .map(|f| pointer_value(doc, &format!("/{f}")))
                    .collect();
                (
                    tuple::pack_key(&key),
                    tuple::pack_key(&values),
                    doc.to_string(),
                )
            }
        };
        msg.packed_keys.push(push(&mut msg.arena, &key));
        msg.packed_values.push(push(&mut msg.arena, &values));
        msg.docs_json.push(push(&mut msg.arena, text.as_bytes()));
        msg.exists.push(*exists);
    }
    msg
}

/// A pageview document.
pub fn view(user: &str, views: i64) -> Value {
    json!({ "user_id": user, "views": views, "score": 1.5, "active": true, "tags": ["a", "b"] })
}

/// Applies `spec` to its database.
pub async fn apply(spec: &flow::MaterializationSpec) {
    use sluice_driver::Driver;
    sluice_sqlite::SqliteDriver::new()
        .apply_upsert(sluice_proto::materialize::ApplyRequest {
            materialization: Some(spec.clone()),
            version: "v1".into(),
            dry_run: false,
        })
        .await
        .unwrap();
}

/// A runtime's side of one Transactions stream to the SQLite driver, in process.
pub struct Session {
    tx: sluice_driver::client::ClientSender,
    rx: sluice_driver::client::ClientReceiver,
}

impl Session {
    /// Opens the key range `[key_begin, key_end]`; returns the recovered checkpoint.
    pub async fn open(
        spec: &flow::MaterializationSpec,
        key_begin: u32,
        key_end: u32,
    ) -> sluice_driver::Result<(Session, Vec<u8>)> {
        use sluice_driver::Endpoint;
        let driver = std::sync::Arc::new(sluice_sqlite::SqliteDriver::new());
        let endpoint = sluice_driver::inprocess::InProcess::new("sqlite", driver);
        let stream = endpoint.transactions().await?;
        let (tx, rx, opened) =
            sluice_driver::client::open(stream, open(spec, key_begin, key_end)).await?;
        Ok((Session { tx, rx }, opened.flow_checkpoint))
    }

    /// One transaction: acknowledge the prior one, load `loads`, prepare with
    /// `checkpoint`, store `stores`, commit. Returns the loaded documents.
    pub async fn transaction(
        &mut self,
        loads: Vec<Load>,
        checkpoint: &[u8],
        stores: Vec<Store>,
    ) -> sluice_driver::Result<Vec<Value>> {
        use sluice_driver::client::Response;
        use sluice_proto::materialize::transaction_request::Prepare;
        let mut loaded = Vec::new();
        let mut collect = |response: Response| match response {
            Response::Loaded(msg) => {
                for doc in sluice_driver::arena::loaded_docs(&msg) {
                    loaded.push(serde_json::from_slice(doc.unwrap()).unwrap());
                }
                false
            }
            _ => true,
        };
        self.tx.acknowledge().await?;
        for load in loads {
            self.tx.load(load).await?;
        }
        while !collect(self.rx.recv().await?) {}
        self.tx
            .prepare(Prepare {
                flow_checkpoint: checkpoint.to_vec(),
            })
            .await?;
        while !collect(self.rx.recv().await?) {}
        for store in stores {
            self.tx.store(store).await?;
        }
        self.tx.commit().await?;
        match self.rx.recv().await? {
            sluice_driver::client::Response::DriverCommitted => Ok(loaded),
            other => panic!("expected DriverCommitted, got {other:?}"),
        }
    }
}
