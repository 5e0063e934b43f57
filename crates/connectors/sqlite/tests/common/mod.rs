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
    flow::materialization_spec::Binding {
        resource_spec_json: json!({ "table": table }).to_string(),
        resource_path: vec![table.to_owned()],
        collection: Some(collection()),
        field_selection: Some(flow::FieldSelection {
            keys: vec!["user_id".into()],
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

/// A Load of the given user ids.
pub fn load(binding: u32, user_ids: &[&str]) -> Load {
    let mut arena = Vec::new();
    let packed_keys = user_ids
        .iter()
        .map(|id| push(&mut arena, &tuple::pack_key(&[json!(id)])))
        .collect();
    Load {
        binding,
        arena,
        packed_keys,
    }
}

/// A Store of `docs`, each with its `exists` flag; keys and values are extracted from
/// the documents as the runtime does.
pub fn store(binding: u32, docs: &[(Value, bool)]) -> Store {
    let mut msg = Store {
        binding,
        ..Default::default()
    };
    for (doc, exists) in docs {
        let key = tuple::pack_key(&[pointer_value(doc, "/user_id")]);
        let values: Vec<Value> = VALUES
            .iter()
            .map(|f| pointer_value(doc, &format!("/{f}")))
            .collect();
        msg.packed_keys.push(push(&mut msg.arena, &key));
        msg.packed_values
            .push(push(&mut msg.arena, &tuple::pack_key(&values)));
        msg.docs_json
            .push(push(&mut msg.arena, doc.to_string().as_bytes()));
        msg.exists.push(*exists);
    }
    msg
}

/// A pageview document.
pub fn view(user: &str, views: i64) -> Value {
    json!({ "user_id": user, "views": views, "score": 1.5, "active": true, "tags": ["a", "b"] })
}
