//! What the scenarios send: the collection, materialization specs with unique names, the
//! documents, their packed keys and values, and the Load and Store messages of them.

use crate::capability::Capabilities;
use crate::messages::{apply_request, open};
use crate::session::Session;
use serde_json::{Value, json};
use sluice_doc::tuple::pack_value;
use sluice_driver_sdk::Endpoint;
use sluice_driver_sdk::arena::{LoadBuilder, StoreBuilder, StoreDoc};
use sluice_driver_sdk::flow::{self, inference};
use sluice_driver_sdk::materialize::transaction_request::{Load, Store};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

pub use sluice_driver_sdk::machine::REBUILD_SENTINEL;

/// The resource properties the suite makes unique per scenario, the first present: a
/// SQL store's `table`, a key-value store's key `prefix`.
const NAME_PROPERTIES: [&str; 2] = ["table", "prefix"];

/// Scenarios started by this process; part of every unique suffix.
static STARTED: AtomicU32 = AtomicU32::new(0);

/// One document to store: its binding, key, JSON (`null` to delete) and whether the
/// runtime believes the key exists.
pub struct Put {
    pub binding: u32,
    pub id: i64,
    pub doc: Value,
    pub exists: bool,
}

/// One scenario's view of the driver under test, with names no other run shares.
pub struct Fixture<'a> {
    pub endpoint: &'a dyn Endpoint,
    /// What the driver claims: which scenarios apply, and how strictly errors are judged.
    pub claimed: Capabilities,
    config: Value,
    resource: serde_json::Map<String, Value>,
    /// The property of the user's resource that names where a binding's data goes
    /// (`table`, or `prefix` for a key-value store), and its value.
    name_property: &'static str,
    table: String,
    /// Unique to this process, run and scenario: `<unix nanos>x<pid>x<n>` in hex digits.
    suffix: String,
    scenario: &'static str,
    /// Materializations applied so far, dropped by [`Fixture::cleanup`].
    applied: Mutex<Vec<flow::MaterializationSpec>>,
}

impl<'a> Fixture<'a> {
    pub fn new(
        endpoint: &'a dyn Endpoint,
        claimed: Capabilities,
        config: &Value,
        resource: &Value,
        scenario: &'static str,
    ) -> Result<Self, String> {
        let Value::Object(resource) = resource else {
            return Err(format!(
                "the resource configuration must be a JSON object, not {resource}"
            ));
        };
        let named = NAME_PROPERTIES
            .iter()
            .find_map(|property| match resource.get(*property) {
                Some(Value::String(name)) => Some((*property, name)),
                _ => None,
            });
        let Some((name_property, table)) = named else {
            return Err(
                "the resource configuration needs a string `table` (or, for a key-value \
                 store, `prefix`) property (the suite suffixes it to give every scenario \
                 its own table)"
                    .into(),
            );
        };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        Ok(Fixture {
            endpoint,
            claimed,
            config: config.clone(),
            name_property,
            table: table.clone(),
            resource: resource.clone(),
            suffix: format!("{nanos:x}x{:x}x{n:x}", std::process::id()),
            scenario,
            applied: Mutex::default(),
        })
    }

    /// The endpoint configuration every request carries.
    pub fn config(&self) -> &Value {
        &self.config
    }

    /// The resource of binding `index`: the user's, with a table (or prefix) of its own.
    pub fn resource(&self, index: usize) -> Value {
        let mut resource = self.resource.clone();
        let table = format!("{}_{}_{index}", self.table, self.suffix);
        resource.insert(self.name_property.into(), Value::String(table));
        Value::Object(resource)
    }

    /// A materialization of `bindings` bindings (binding i is delta-updates if
    /// `delta(i)`), each over the fixture collection, with its own table.
    pub fn spec(
        &self,
        bindings: usize,
        delta: impl Fn(usize) -> bool,
    ) -> flow::MaterializationSpec {
        flow::MaterializationSpec {
            materialization: format!("conformance/{}/{}", self.scenario, self.suffix),
            endpoint_type: 0,
            endpoint_spec_json: self.config.to_string(),
            bindings: (0..bindings)
                .map(|i| {
                    let resource = self.resource(i);
                    let table = (resource[self.name_property].as_str())
                        .unwrap_or_default()
                        .to_string();
                    flow::materialization_spec::Binding {
                        resource_spec_json: resource.to_string(),
                        resource_path: vec![table],
                        collection: Some(collection()),
                        field_selection: Some(flow::FieldSelection {
                            keys: vec!["id".into()],
                            values: vec!["value".into()],
                            document: "flow_document".into(),
                            field_config_json: Default::default(),
                        }),
                        delta_updates: delta(i),
                        backfill: 0,
                    }
                })
                .collect(),
        }
    }

    /// A session of `spec` over the whole key range.
    pub async fn session(
        &self,
        spec: &flow::MaterializationSpec,
    ) -> sluice_driver_sdk::Result<Session> {
        self.session_of(spec, 0, u32::MAX).await
    }

    /// A session of `spec` over the key range `[key_begin, key_end]`.
    pub async fn session_of(
        &self,
        spec: &flow::MaterializationSpec,
        key_begin: u32,
        key_end: u32,
    ) -> sluice_driver_sdk::Result<Session> {
        Session::open(self.endpoint, open(spec, key_begin, key_end)).await
    }

    /// Creates (or, with `dry_run`, describes) the resources of `spec`; returns the
    /// driver's description of its actions.
    pub async fn apply(
        &self,
        spec: &flow::MaterializationSpec,
        dry_run: bool,
    ) -> sluice_driver_sdk::Result<String> {
        if !dry_run {
            let mut applied = self.applied.lock().unwrap_or_else(|p| p.into_inner());
            if !applied.contains(spec) {
                applied.push(spec.clone());
            }
        }
        let response = self
            .endpoint
            .apply_upsert(apply_request(spec, dry_run))
            .await?;
        Ok(response.action_description)
    }

    /// A materialization of `bindings` standard-updates bindings, applied.
    pub async fn setup(
        &self,
        bindings: usize,
    ) -> sluice_driver_sdk::Result<flow::MaterializationSpec> {
        let spec = self.spec(bindings, |_| false);
        self.apply(&spec, false).await?;
        Ok(spec)
    }

    /// Drops every materialization this scenario applied, best effort: a scenario's
    /// verdict never depends on its cleanup.
    pub async fn cleanup(&self) {
        let applied = std::mem::take(&mut *self.applied.lock().unwrap_or_else(|p| p.into_inner()));
        for spec in applied {
            if let Err(err) = self
                .endpoint
                .apply_delete(apply_request(&spec, false))
                .await
            {
                tracing::warn!(scenario = self.scenario, error = %err, "conformance cleanup failed");
            }
        }
    }

    /// A runtime checkpoint unique to this scenario and `n`.
    pub fn checkpoint(&self, n: u32) -> Vec<u8> {
        format!("conformance checkpoint {n} of {}", self.suffix).into_bytes()
    }
}

/// The collection every binding reads: `{"id": integer, "value"?: string}` keyed by `/id`.
pub fn collection() -> flow::CollectionSpec {
    let projection = |ptr: &str, field: &str, types: &[&str], key: bool| flow::Projection {
        ptr: ptr.into(),
        field: field.into(),
        user_provided: false,
        is_partition_key: false,
        is_primary_key: key,
        inference: Some(flow::Inference {
            types: types.iter().map(|t| t.to_string()).collect(),
            must_exist: key || ptr.is_empty(),
            string: types.contains(&"string").then(inference::String::default),
            title: String::new(),
            description: String::new(),
        }),
    };
    let schema = json!({
        "type": "object",
        "properties": {"id": {"type": "integer"}, "value": {"type": "string"}},
        "required": ["id"],
    });
    flow::CollectionSpec {
        collection: "conformance/documents".into(),
        schema_uri: "conformance.schema.json".into(),
        key_ptrs: vec!["/id".into()],
        uuid_ptr: String::new(),
        partition_fields: Vec::new(),
        projections: vec![
            projection("/id", "id", &["integer"], true),
            projection("/value", "value", &["string"], false),
            projection("", "flow_document", &["object"], false),
        ],
        ack_json_template: Vec::new(),
        schema_json: schema.to_string(),
    }
}

/// The document of key `id` with `value`.
pub fn doc(id: i64, value: &str) -> Value {
    json!({"id": id, "value": value})
}

/// The packed key of `id`.
pub fn key(id: i64) -> Vec<u8> {
    packed(&json!(id))
}

/// The packed values of a document (its `value`, or null).
pub fn values(doc: &Value) -> Vec<u8> {
    packed(doc.get("value").unwrap_or(&Value::Null))
}

/// The Loads of `(binding, id)` keys.
pub fn loads(keys: &[(u32, i64)]) -> Vec<Load> {
    let mut loads = LoadBuilder::new();
    for (binding, id) in keys {
        loads.push(*binding, &key(*id));
    }
    loads.finish()
}

/// The Stores of `puts`, keyed and valued as the runtime would.
pub fn stores(puts: &[Put]) -> Vec<Store> {
    let mut stores = StoreBuilder::new();
    for put in puts {
        let json = serde_json::to_vec(&put.doc).expect("a JSON value serializes");
        let doc = StoreDoc {
            key: &key(put.id),
            values: &values(&put.doc),
            doc: &json,
            exists: put.exists,
        };
        stores.push(put.binding, doc);
    }
    stores.finish()
}

fn packed(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    pack_value(value, &mut out);
    out
}
