//! Protocol messages built from plain bytes, for tests that exercise a driver or the
//! SDK itself below any collection: materialization specs of bare bindings, Opens,
//! Applies, and Load and Store messages of raw keys and document texts.
//!
//! The driver SDK's own tests, the reference driver's tests and the suite's fixtures
//! build their messages here, so there is one spelling of each.

use sluice_driver_sdk::arena::{LoadBuilder, StoreBuilder, StoreDoc};
use sluice_driver_sdk::flow;
use sluice_driver_sdk::materialize::ApplyRequest;
use sluice_driver_sdk::materialize::transaction_request::{Load, Open, Store};

/// A materialization `name` into `endpoint` (its configuration, JSON text) with one
/// binding per `(table, delta_updates)`, each with resource `{"table": table}` and no
/// collection.
pub fn spec(name: &str, endpoint: &str, tables: &[(&str, bool)]) -> flow::MaterializationSpec {
    flow::MaterializationSpec {
        materialization: name.into(),
        endpoint_type: flow::EndpointType::SluiceMemory as i32,
        endpoint_spec_json: endpoint.into(),
        bindings: tables
            .iter()
            .map(|(table, delta)| flow::materialization_spec::Binding {
                resource_spec_json: serde_json::json!({ "table": table }).to_string(),
                resource_path: vec![table.to_string()],
                delta_updates: *delta,
                ..Default::default()
            })
            .collect(),
    }
}

/// An Open of `spec` over the key range `[key_begin, key_end]`.
pub fn open(spec: &flow::MaterializationSpec, key_begin: u32, key_end: u32) -> Open {
    Open {
        materialization: Some(spec.clone()),
        version: "v1".into(),
        key_begin,
        key_end,
        driver_checkpoint_json: b"{}".to_vec(),
    }
}

/// An ApplyUpsert or ApplyDelete of `spec`.
pub fn apply_request(spec: &flow::MaterializationSpec, dry_run: bool) -> ApplyRequest {
    ApplyRequest {
        materialization: Some(spec.clone()),
        version: "v1".into(),
        dry_run,
        ..Default::default()
    }
}

/// One Load of `binding` for the packed `keys`.
pub fn load(binding: u32, keys: &[&[u8]]) -> Load {
    let mut builder = LoadBuilder::new();
    for key in keys {
        builder.push(binding, key);
    }
    builder.finish().pop().unwrap_or(Load {
        binding,
        ..Default::default()
    })
}

/// One Store of `binding` for `(packed key, document JSON, exists)`, with no values.
pub fn store(binding: u32, docs: &[(&[u8], &str, bool)]) -> Store {
    let mut builder = StoreBuilder::new();
    for (key, doc, exists) in docs {
        let doc = StoreDoc {
            key,
            values: &[],
            doc: doc.as_bytes(),
            exists: *exists,
        };
        builder.push(binding, doc);
    }
    builder.finish().pop().unwrap_or(Store {
        binding,
        ..Default::default()
    })
}
