//! Fixtures for the tests of table-writing drivers (the connectors' dev-dependency):
//! the `acme/pageviews` collection with one projection of
//! each column kind, bindings and specs over it, Load and Store messages built from
//! JSON documents as the runtime builds them, and the suite's [`Session`] driving a
//! driver through the in-process endpoint and the checked client.
//!
//! ```text
//!   TestDriver { name, driver }  ──apply──▶  Driver::apply_upsert
//!                                ──session─▶ InProcess ─▶ Session::open ─▶ Session::transaction
//! ```
//!
//! The scenarios every driver passes (recovery, fencing, split ranges, deletes, delta
//! updates, atomic commits, as seen through the protocol) are the suite's
//! ([`sluice_conformance::run_suite`]); [`scenarios`] holds what only a table-writing store can be
//! asked: what its tables hold afterwards. What is store-specific (a private database
//! or schema per test, queries of the result) stays in each connector's `tests/common`;
//! [`tls`] makes the certificates of their TLS tests.

use serde_json::{Value, json};
pub use sluice_conformance::Session;
pub use sluice_conformance::messages::{apply_request, open};
use sluice_doc::tuple;
use sluice_driver_sdk::flow::{self, Slice};
use sluice_driver_sdk::inprocess::InProcess;
use sluice_driver_sdk::materialize::transaction_request::{Load, Store};
use sluice_driver_sdk::{Driver, Result};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

pub const MATERIALIZATION: &str = "acme/views-db";

/// The whole key range.
pub const ALL: u32 = u32::MAX;

/// The value fields selected by [`binding`], in order.
pub const VALUES: [&str; 5] = ["views", "score", "active", "tags", "seen_at"];

/// A projection of `ptr` as `field`, of the inferred `types`.
pub fn projection(field: &str, ptr: &str, types: &[&str], key: bool) -> flow::Projection {
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

/// `acme/pageviews`, keyed by `/user_id`, with a field of every kind: integers, a
/// nullable number, a boolean, an array, a `date-time` string, a nested field, a field
/// that is always null, and the whole document.
pub fn collection() -> flow::CollectionSpec {
    let mut seen_at = projection("seen_at", "/seen_at", &["string"], false);
    if let Some(inference) = seen_at.inference.as_mut() {
        inference.string = Some(flow::inference::String {
            format: "date-time".into(),
            ..Default::default()
        });
    }
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
            seen_at,
            projection("meta/source", "/meta/source", &["string"], false),
            projection("nothing", "/nothing", &["null"], false),
            projection("flow_document", "", &["object"], false),
        ],
        ..Default::default()
    }
}

/// A binding of [`collection`] into `table`, keyed by `user_id`, selecting [`VALUES`]
/// and the document.
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
        backfill: 0,
    }
}

/// [`binding`] into the reserved word `select`, with `views` renamed `Mixed Case` and
/// `score` renamed `quoted` (a name holding the store's quote character): the only
/// values selected.
pub fn odd_names_binding(quoted: &str) -> flow::materialization_spec::Binding {
    let mut odd = binding("select", false);
    let collection = odd.collection.as_mut().expect("a collection");
    for p in &mut collection.projections {
        if p.field == "views" {
            p.field = "Mixed Case".into();
        }
        if p.field == "score" {
            p.field = quoted.into();
        }
    }
    let selection = odd.field_selection.as_mut().expect("a field selection");
    selection.values = vec!["Mixed Case".into(), quoted.into()];
    odd
}

/// [`MATERIALIZATION`] of `bindings` into the store of `endpoint` (its configuration).
pub fn spec(
    endpoint: &Value,
    bindings: Vec<flow::materialization_spec::Binding>,
) -> flow::MaterializationSpec {
    flow::MaterializationSpec {
        materialization: MATERIALIZATION.into(),
        endpoint_type: flow::EndpointType::Invalid as i32,
        endpoint_spec_json: endpoint.to_string(),
        bindings,
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
        .map(|key| {
            let components = key.as_array().expect("a key is a JSON array");
            push(&mut arena, &tuple::pack_key(components))
        })
        .collect();
    Load {
        binding,
        arena,
        packed_keys,
    }
}

/// A Store of `docs`, each with its `exists` flag; the key (at `key_ptrs`) and the
/// [`VALUES`] are extracted from the documents as the runtime does. A document
/// `{"key": [...]}` stands for a deletion of that key (document `null`).
pub fn store(binding: u32, key_ptrs: &[&str], docs: &[(Value, bool)]) -> Store {
    let value_ptrs: Vec<String> = VALUES.iter().map(|f| format!("/{f}")).collect();
    let value_ptrs: Vec<&str> = value_ptrs.iter().map(String::as_str).collect();
    store_values(binding, key_ptrs, &value_ptrs, docs)
}

/// [`store`] with the values at `value_ptrs` instead of the [`VALUES`] fields.
pub fn store_values(
    binding: u32,
    key_ptrs: &[&str],
    value_ptrs: &[&str],
    docs: &[(Value, bool)],
) -> Store {
    let mut msg = Store {
        binding,
        ..Default::default()
    };
    for (doc, exists) in docs {
        let (key, values, text) = match doc.get("key") {
            Some(Value::Array(key)) => (tuple::pack_key(key), Vec::new(), "null".to_owned()),
            _ => {
                let key: Vec<Value> = key_ptrs.iter().map(|p| pointer_value(doc, p)).collect();
                let values: Vec<Value> = value_ptrs.iter().map(|p| pointer_value(doc, p)).collect();
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

/// A pageview document of `user` with `views`.
pub fn view(user: &str, views: i64) -> Value {
    json!({
        "user_id": user, "views": views, "score": 1.5, "active": true, "tags": ["a", "b"],
        "seen_at": "2024-05-01T12:00:00Z"
    })
}

/// The columns of the checkpoints table every SQL connector creates, in order.
pub const CHECKPOINT_COLUMNS: [&str; 5] = [
    "materialization",
    "key_begin",
    "key_end",
    "fence",
    "checkpoint",
];

/// A name no other test uses, `sluice_t_<pid>_<counter>_<nanos>`, for a private
/// database or schema: parallel tests and reruns never collide.
pub fn unique_name() -> String {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    format!(
        "sluice_t_{}_{}_{nanos:x}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// The test server's URL: the environment variable `var`, else `default`.
pub fn server_url(var: &str, default: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| default.to_owned())
}

/// Runs `cleanup` to completion on a thread and runtime of its own, for a `Drop` that
/// may run on the test's runtime (which must not block).
pub fn run_detached(cleanup: impl Future<Output = ()> + Send + 'static) {
    let thread = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a cleanup runtime")
            .block_on(cleanup);
    });
    let _ = thread.join();
}

/// The driver under test: a fresh instance per use, named as in a pipeline.
#[derive(Clone, Copy)]
pub struct TestDriver {
    pub name: &'static str,
    pub driver: fn() -> Arc<dyn Driver>,
}

impl TestDriver {
    /// Applies `spec`; returns the action description.
    pub async fn apply(&self, spec: &flow::MaterializationSpec) -> String {
        (self.driver)()
            .apply_upsert(apply_request(spec, false))
            .await
            .unwrap_or_else(|err| panic!("applying {}: {err}", spec.materialization))
            .action_description
    }

    /// Opens the key range `[key_begin, key_end]` of `spec` in process; returns the
    /// session and the recovered runtime checkpoint.
    pub async fn session(
        &self,
        spec: &flow::MaterializationSpec,
        key_begin: u32,
        key_end: u32,
    ) -> Result<(Session, Vec<u8>)> {
        let endpoint = InProcess::new(self.name, (self.driver)());
        let session = Session::open(&endpoint, open(spec, key_begin, key_end)).await?;
        let recovered = session.recovered().to_vec();
        Ok((session, recovered))
    }
}

pub mod current;
pub mod scenarios;
pub mod tls;
