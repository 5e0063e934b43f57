//! [`OutputDriver`]: output endpoints as an in-process Flow driver of the authoritative
//! pattern, whose store is the local view (see the crate docs for the order of writes
//! that makes each transaction's batch exactly once).
//!
//! A binding's resource is its destination (the kind's keys: `topic`, `subject`,
//! `directory`) plus the encoding keys every kind shares: `format` (`json`,
//! `debezium`, `csv`, `avro`), `schema_id` / `key_schema_id` (Avro's Confluent
//! framing) and `snapshot` (the binding's first batch is its whole view).

use crate::change::{Change, Op};
use crate::encode::{self, Buffer, Encoder, Encoding, Fields};
use crate::endpoint::{BatchKind, OutputEndpoint, Target};
use crate::generation::{Generation, GenerationId};
use crate::view::{self, View};
use crate::{OutputError, Result as OutputResult};
use async_trait::async_trait;
use serde_json::{Value, json};
use sluice_driver_sdk::arena::{load_keys, store_docs};
use sluice_driver_sdk::fence::{Claim, FencedStore, PreparedCheckpoint};
use sluice_driver_sdk::flow::EndpointType;
use sluice_driver_sdk::materialize::constraint::Type;
use sluice_driver_sdk::materialize::{
    self as m,
    transaction_request::{Load, Open, Store},
    transaction_response::Opened,
};
use sluice_driver_sdk::validate::ProjectionRules;
use sluice_driver_sdk::{
    BuiltinKind, CommitPattern, Declared, Driver, Error, InvalidConfig, LoadedSink, Metric, Report,
    Result, Transactor,
};
use sluice_sink_sdk::driver::epoch_of;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Documents per chunk of a snapshot's scan of the view.
const SNAPSHOT_CHUNK: usize = 2_000;

/// An output endpoint kind, as a binary registers it.
#[derive(Clone, Copy)]
pub struct OutputKind {
    /// Its key in an endpoint of the pipeline file (`kafka`).
    pub name: &'static str,
    /// Keys of its configuration that hold paths (dotted inside an object: `tls.ca`).
    pub paths: &'static [&'static str],
    /// The JSON schema of its endpoint configuration (derived from the type it is
    /// parsed with).
    pub endpoint_schema: fn() -> String,
    /// The JSON schema of a binding's destination keys; the encoding keys are added.
    pub resource_schema: fn() -> String,
    /// Checks an endpoint configuration strictly; connects nothing.
    pub check: fn(&Value) -> OutputResult<()>,
    /// The resource path of a binding's destination (`[topic]`).
    pub resource_path: fn(&Value) -> OutputResult<Vec<String>>,
    /// The endpoint of one binding; connects nothing until its `open`.
    pub endpoint: fn(&Value, Target) -> OutputResult<Box<dyn OutputEndpoint>>,
}

impl BuiltinKind for OutputKind {
    fn name(&self) -> &'static str {
        self.name
    }

    fn endpoint_type(&self) -> EndpointType {
        EndpointType::SluiceOutput
    }

    fn paths(&self) -> &'static [&'static str] {
        self.paths
    }

    fn check(&self, config: &Value) -> std::result::Result<(), InvalidConfig> {
        (self.check)(config).map_err(|e| InvalidConfig::new("", e.to_string()))
    }

    /// Its views live in the materialization's state folder: without one, no instance.
    fn driver(&self, state_dir: Option<&Path>) -> Option<Arc<dyn Driver>> {
        let state_dir = state_dir?.to_path_buf();
        Some(Arc::new(OutputDriver::new(*self, state_dir)))
    }

    fn schemas(&self) -> Option<(String, String)> {
        Some(((self.endpoint_schema)(), resource_schema(self)))
    }

    /// The view cannot move with a cluster's shard: it is the output's authoritative
    /// store (before-images, checkpoint, fence) in a member's SQLite file, and rebuilding
    /// it from a destination works for none of them (files and streams keep changes, not
    /// last values per key). What running outputs in a cluster would take is named.
    fn pinned(&self) -> Option<&'static str> {
        Some(
            "an output keeps its view beside the local recovery log (each key's last \
             document for the changes' before-images, the checkpoint and the fence, in one \
             machine's SQLite file), where another member cannot read it; a cluster would \
             need that view in a store every member reaches that fences a former holder \
             (as the SQL stores' checkpoint tables do), and destinations that refuse a \
             former holder's late messages",
        )
    }
}

/// A binding's resource: its destination and how its changes are encoded.
#[derive(Debug, Clone)]
pub struct Resource {
    pub destination: Value,
    pub encoding: Encoding,
    pub snapshot: bool,
}

impl Resource {
    /// Splits a resource configuration into the encoding keys and the destination.
    pub fn parse(resource: &Value) -> OutputResult<Resource> {
        let Value::Object(fields) = resource else {
            return Err(OutputError::Config(format!(
                "a resource is an object, not {resource}"
            )));
        };
        let (mut encoding, mut destination) = (serde_json::Map::new(), serde_json::Map::new());
        let mut snapshot = false;
        for (key, value) in fields {
            match key.as_str() {
                "format" | "schema_id" | "key_schema_id" => {
                    encoding.insert(key.clone(), value.clone());
                }
                "snapshot" => {
                    snapshot = value.as_bool().ok_or_else(|| {
                        OutputError::Config(format!(
                            "snapshot: expected true or false, not {value}"
                        ))
                    })?;
                }
                _ => {
                    destination.insert(key.clone(), value.clone());
                }
            }
        }
        let encoding = serde_json::from_value(Value::Object(encoding))
            .map_err(|e| OutputError::Config(format!("resource: {e}")))?;
        Ok(Resource {
            destination: Value::Object(destination),
            encoding,
            snapshot,
        })
    }
}

/// The JSON schema of a binding's resource of `kind`: its destination keys and the
/// encoding keys every output takes. The encoding keys are written here, not derived:
/// [`Resource::parse`] takes them out by hand before the destination is parsed.
pub fn resource_schema(kind: &OutputKind) -> String {
    let mut schema: Value =
        serde_json::from_str(&(kind.resource_schema)()).expect("a kind's resource schema is JSON");
    let common = json!({
        "format": {"enum": ["json", "debezium", "csv", "avro"], "default": "json",
                   "description": "How changes are encoded"},
        "snapshot": {"type": "boolean", "default": false,
                     "description": "The binding's first batch is its whole view"},
        "schema_id": {"type": "integer", "minimum": 0,
                      "description": "Avro: Confluent framing of values with this schema id"},
        "key_schema_id": {"type": "integer", "minimum": 0,
                          "description": "Avro: Confluent framing of keys with this schema id"},
    });
    if let Some(Value::Object(properties)) = schema.get_mut("properties") {
        properties.extend(common.as_object().expect("an object").clone());
    }
    schema.to_string()
}

/// An output error as a driver error, retryable as the output says.
pub fn output_error(err: OutputError) -> Error {
    match err {
        OutputError::Config(message) => Error::Config(message),
        other => Error::Store {
            context: "output".into(),
            retryable: other.is_retryable(),
            message: other.to_string(),
        },
    }
}

fn parse_json(text: &str, what: &str) -> Result<Value> {
    serde_json::from_str(text).map_err(|e| Error::Config(format!("{what} is not JSON: {e}")))
}

/// Output endpoints of kind `kind`, their views kept under `state_dir`.
pub struct OutputDriver {
    kind: OutputKind,
    state_dir: PathBuf,
}

impl OutputDriver {
    pub fn new(kind: OutputKind, state_dir: PathBuf) -> OutputDriver {
        OutputDriver { kind, state_dir }
    }

    fn config(&self, endpoint_spec_json: &str) -> Result<Value> {
        let config = parse_json(endpoint_spec_json, "the endpoint config")?;
        (self.kind.check)(&config).map_err(output_error)?;
        Ok(config)
    }

    fn resource(&self, resource_spec_json: &str) -> Result<(Resource, Vec<String>)> {
        let resource = Resource::parse(&parse_json(resource_spec_json, "a resource config")?)
            .map_err(output_error)?;
        let path = (self.kind.resource_path)(&resource.destination).map_err(output_error)?;
        Ok((resource, path))
    }

    /// Every binding's encoder and endpoint, built (nothing connected), writing
    /// `generation`.
    fn outputs(
        &self,
        spec: &sluice_driver_sdk::flow::MaterializationSpec,
        generation: Generation,
    ) -> Result<Vec<BindingOutput>> {
        let config = self.config(&spec.endpoint_spec_json)?;
        spec.bindings
            .iter()
            .map(|binding| {
                let (resource, path) = self.resource(&binding.resource_spec_json)?;
                let fields = Fields::of(&spec.materialization, binding).map_err(output_error)?;
                let encoder = encode::encoder(&resource.encoding, fields).map_err(output_error)?;
                let target = Target {
                    materialization: spec.materialization.clone(),
                    resource: resource.destination.clone(),
                    format: resource.encoding.format,
                    header: encoder.header(),
                    generation,
                };
                let endpoint = (self.kind.endpoint)(&config, target).map_err(output_error)?;
                Ok(BindingOutput {
                    view_key: path.join("/"),
                    max_bytes: endpoint.max_buffer_size_bytes(),
                    endpoint,
                    encoder: Some(encoder),
                    buffer: Some(Buffer::default()),
                    snapshot: resource.snapshot,
                    in_batch: false,
                    published: 0,
                })
            })
            .collect()
    }
}

/// Runs blocking work on the blocking pool.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> OutputResult<T> + Send + 'static,
) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::store("output view", format!("its task failed: {e}"), false))?
        .map_err(output_error)
}

#[async_trait]
impl Driver for OutputDriver {
    /// Authoritative over its local view (fenced by generation); a change stream, so
    /// no delta updates, and a key stored as absent is an insert whatever was published.
    fn declared(&self) -> Declared {
        Declared {
            pattern: CommitPattern::RemoteAuthoritative,
            deletes: true,
            delta_updates: false,
            strict_exists: false,
            rebuilds_on_backfill: false,
        }
    }

    async fn spec(&self, _req: m::SpecRequest) -> Result<m::SpecResponse> {
        Ok(m::SpecResponse {
            endpoint_spec_schema_json: (self.kind.endpoint_schema)(),
            resource_spec_schema_json: resource_schema(&self.kind),
            documentation_url: String::new(),
        })
    }

    /// Keys and the document are required (a change carries the documents before and
    /// after); top-level fields are recommended (CSV and Avro columns), nested ones
    /// optional. Never delta updates: a change needs the document before it.
    async fn validate(&self, req: m::ValidateRequest) -> Result<m::ValidateResponse> {
        self.config(&req.endpoint_spec_json)?;
        let bindings = req.bindings.iter().map(|binding| {
            let (_, resource_path) = self.resource(&binding.resource_spec_json)?;
            let collection = binding.collection.clone().unwrap_or_default();
            let constraints = ProjectionRules {
                key: "part of the key",
                document: (
                    Type::LocationRequired,
                    "the document, before and after each change",
                ),
                top_level: (Type::LocationRecommended, "a top-level field"),
                nested: (Type::FieldOptional, "a nested field"),
            }
            .constraints(&collection);
            Ok(m::validate_response::Binding {
                constraints: constraints.collect(),
                resource_path,
                delta_updates: false,
            })
        });
        Ok(m::ValidateResponse {
            bindings: bindings.collect::<Result<_>>()?,
        })
    }

    /// Nothing to create ahead: a destination is created by its endpoint's first open.
    /// Each destination is looked at ([`OutputEndpoint::probe`]): it can be reached.
    async fn apply_upsert(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        let spec = req
            .materialization
            .ok_or_else(|| Error::Config("Apply without a materialization".into()))?;
        // Built only to check the configuration: nothing is written under this id.
        let checking = Generation {
            id: GenerationId::mint(),
            adopts_unstamped: false,
        };
        let outputs = self.outputs(&spec, checking)?;
        let mut actions = Vec::new();
        for (b, mut output) in spec.bindings.iter().zip(outputs) {
            let collection = b.collection.as_ref().map(|c| c.collection.as_str());
            let (resource, path) = self.resource(&b.resource_spec_json)?;
            actions.push(format!(
                "publish the changes of {} to {} {} as {:?}",
                collection.unwrap_or("?"),
                self.kind.name,
                path.join("/"),
                resource.encoding.format,
            ));
            let found = output.endpoint.probe().await.map_err(output_error)?;
            if !found.is_empty() {
                actions.push(format!("  {found}"));
            }
            output.endpoint.close().await;
            // What a consumer of Avro needs to decode (or to register).
            if resource.encoding.format == encode::Format::Avro {
                let fields = Fields::of(&spec.materialization, b).map_err(output_error)?;
                let (value, key) = encode::avro_schemas(&fields).map_err(output_error)?;
                actions.push(format!("  value schema: {value}\n  key schema: {key}"));
            }
        }
        Ok(m::ApplyResponse {
            action_description: actions.join("\n"),
            driver_checkpoint: None,
        })
    }

    /// A reset: removes the view whole (every binding's documents, the checkpoint and
    /// fence, the snapshots sent, the generation), so the next run is a new
    /// materialization with a new generation, publishing every change again from an
    /// empty view. What the destinations hold is left as it is: the new generation's
    /// messages are told apart by their generation, and never taken for the old ones.
    async fn apply_delete(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        let spec = req
            .materialization
            .ok_or_else(|| Error::Config("ApplyDelete without a materialization".into()))?;
        let path = self.state_dir.join("view.db");
        let mut actions = vec![format!(
            "remove the output view {} (documents, checkpoint, snapshots, generation)",
            path.display()
        )];
        for b in &spec.bindings {
            actions.push(format!(
                "start {} {} over: the next run publishes every change again, under a new \
                 generation (what it holds now stays)",
                self.kind.name,
                b.resource_path.join("/")
            ));
        }
        if !req.dry_run {
            let dir = self.state_dir.clone();
            if let Some(ended) = blocking(move || view::remove(&dir)).await? {
                actions[0].push_str(&format!(": generation {ended} ended"));
            }
        }
        Ok(m::ApplyResponse {
            action_description: actions.join("\n"),
            driver_checkpoint: None,
        })
    }

    async fn open(&self, open: Open) -> Result<(Box<dyn Transactor>, Opened)> {
        let spec = open
            .materialization
            .clone()
            .ok_or_else(|| Error::Config("Open without a materialization".into()))?;
        self.config(&spec.endpoint_spec_json)?;
        let (key_begin, key_end) = (open.key_begin, open.key_end);
        let dir = self.state_dir.clone();
        let views: Vec<(String, String, bool)> = (spec.bindings.iter())
            .map(|b| {
                let (resource, path) = self.resource(&b.resource_spec_json)?;
                let collection = b.collection.as_ref().map(|c| c.collection.clone());
                Ok((
                    path.join("/"),
                    collection.unwrap_or_default(),
                    resource.snapshot,
                ))
            })
            .collect::<Result<_>>()?;
        let (view, fence, checkpoint, sent) = blocking(move || {
            let mut view = View::open(&dir)?;
            let (fence, checkpoint) = view.claim(key_begin, key_end)?;
            let mut sent = Vec::new();
            for (key, collection, snapshot) in &views {
                let was_sent = view.snapshot_sent(key)?;
                if *snapshot && !was_sent && view.is_empty(key)? {
                    seed_from_sibling(&mut view, key, collection, &views)?;
                }
                sent.push(was_sent);
            }
            Ok((view, fence, checkpoint, sent))
        })
        .await?;
        let generation = view.generation();
        tracing::debug!(materialization = spec.materialization, generation = %generation.id,
            "opening the output endpoints");
        let mut outputs = self.outputs(&spec, generation)?;
        for (output, sent) in outputs.iter_mut().zip(sent) {
            output.snapshot &= !sent;
            output.endpoint.open().await.map_err(output_error)?;
        }
        let transactor = OutputTransactor {
            view: Arc::new(Mutex::new(view)),
            claim: Claim::new(&spec.materialization, key_begin, key_end, fence),
            checkpoint: PreparedCheckpoint::default(),
            outputs,
        };
        let opened = Opened {
            flow_checkpoint: checkpoint,
        };
        Ok((Box::new(transactor), opened))
    }
}

/// Seeds a new snapshot binding's empty view from another binding of the same
/// collection, so that its snapshot is the whole current view, not only what it sees
/// from now on (a new binding is fed from the materialization's positions onward).
fn seed_from_sibling(
    view: &mut View,
    key: &str,
    collection: &str,
    views: &[(String, String, bool)],
) -> OutputResult<()> {
    for (sibling, other, _) in views {
        if sibling != key && other == collection && !view.is_empty(sibling)? {
            let seeded = view.seed(key, sibling)?;
            tracing::info!(binding = key, from = %sibling, documents = seeded,
                "seeded a new snapshot binding's view from another binding of its collection");
            return Ok(());
        }
    }
    Ok(())
}

/// One binding's side of a stream.
struct BindingOutput {
    /// The binding's view in the view file (its resource path).
    view_key: String,
    endpoint: Box<dyn OutputEndpoint>,
    max_bytes: usize,
    /// `None` only while a blocking task holds it.
    encoder: Option<Box<dyn Encoder>>,
    buffer: Option<Buffer>,
    /// Its next batch is a snapshot: asked for and not yet sent.
    snapshot: bool,
    /// Its endpoint has begun the transaction's batch.
    in_batch: bool,
    /// Messages this stream pushed to its endpoint ([`Transactor::report`]).
    published: u64,
}

fn taken() -> Error {
    Error::store(
        "output",
        "an earlier failure left the binding unusable",
        false,
    )
}

impl BindingOutput {
    /// Pushes the buffered messages.
    async fn push(&mut self) -> Result<()> {
        let buffer = self.buffer.as_mut().ok_or_else(taken)?;
        if !buffer.is_empty() {
            self.endpoint.push(buffer).await.map_err(output_error)?;
            self.published += buffer.len() as u64;
            buffer.pushed();
            crate::fail_point!(crate::AFTER_PUSH);
        }
        Ok(())
    }
}

struct OutputTransactor {
    view: Arc<Mutex<View>>,
    claim: Claim,
    checkpoint: PreparedCheckpoint,
    outputs: Vec<BindingOutput>,
}

/// Runs `work` on the view, on the blocking pool.
async fn on_view<T: Send + 'static>(
    view: &Arc<Mutex<View>>,
    work: impl FnOnce(&mut View) -> OutputResult<T> + Send + 'static,
) -> Result<T> {
    let view = view.clone();
    blocking(move || work(&mut view.lock().expect("not poisoned"))).await
}

impl OutputTransactor {
    /// The transaction being stored (from Prepare's runtime checkpoint).
    fn txn(&self) -> Result<u64> {
        let checkpoint = (self.checkpoint.peek())
            .ok_or_else(|| Error::Malformed("Store before Prepare".into()))?;
        epoch_of(checkpoint)
    }

    fn output(&mut self, binding: u32) -> Result<&mut BindingOutput> {
        self.outputs.get_mut(binding as usize).ok_or_else(|| {
            Error::Malformed(format!(
                "binding {binding} is not part of the opened materialization"
            ))
        })
    }

    /// Sends a snapshot binding's whole view (as this transaction leaves it).
    async fn send_snapshot(&mut self, binding: usize, txn: u64) -> Result<()> {
        let mut after: Option<Vec<u8>> = None;
        loop {
            let output = &mut self.outputs[binding];
            let (key, from) = (output.view_key.clone(), after.take());
            let mut encoder = output.encoder.take().ok_or_else(taken)?;
            let mut buffer = output.buffer.take().ok_or_else(taken)?;
            let (encoder, buffer, scanned) = {
                let view = self.view.clone();
                tokio::task::spawn_blocking(move || {
                    let scanned = (|| {
                        let rows = view.lock().expect("not poisoned").scan(
                            &key,
                            from.as_deref(),
                            SNAPSHOT_CHUNK,
                        )?;
                        for (packed_key, doc) in &rows {
                            let doc = serde_json::from_str::<Value>(doc).map_err(|e| {
                                OutputError::Corrupt(format!(
                                    "the view of {key} holds non-JSON: {e}"
                                ))
                            })?;
                            let change = Change {
                                txn,
                                op: Op::Read,
                                before: None,
                                after: Some(&doc),
                            };
                            buffer.begin_change(packed_key);
                            encoder.encode(&change, &mut buffer)?;
                        }
                        Ok((rows.len(), rows.last().map(|(k, _)| k.clone())))
                    })();
                    (encoder, buffer, scanned)
                })
                .await
                .map_err(|e| Error::store("output snapshot", e.to_string(), false))?
            };
            output.encoder = Some(encoder);
            output.buffer = Some(buffer);
            let (count, last) = scanned.map_err(output_error)?;
            if output
                .buffer
                .as_ref()
                .is_some_and(|b| b.bytes() >= output.max_bytes)
            {
                output.push().await?;
            }
            if count < SNAPSHOT_CHUNK {
                return Ok(());
            }
            after = last;
        }
    }
}

/// Applies a Store's documents from the `from`-th on to the view, encoding each change
/// (`encoder`: none in a snapshot's transaction, whose batch is the view itself).
/// Stops early once the buffer holds `max_bytes`, returning where to go on.
fn apply_store(
    view: &mut View,
    key: &str,
    store: &Store,
    from: usize,
    txn: u64,
    encoder: Option<&mut dyn Encoder>,
    (buffer, max_bytes): (&mut Buffer, usize),
) -> Result<Option<usize>> {
    let viewed = |e: OutputError| output_error(e);
    view.begin().map_err(viewed)?;
    let mut encoder = encoder;
    for (i, doc) in store_docs(store).enumerate().skip(from) {
        let doc = doc?;
        let text = doc.json(store.binding)?;
        let after_text = (text.trim() != "null").then_some(text);
        let before_text = view.get(key, doc.key).map_err(viewed)?;
        if after_text.is_some() && doc.exists != before_text.is_some() {
            return Err(Error::store(
                format!("output view of {key}"),
                format!(
                    "a document was stored with exists={} but the view {} its key: the \
                     runtime's view of the store is wrong",
                    doc.exists,
                    if before_text.is_some() {
                        "holds"
                    } else {
                        "lacks"
                    }
                ),
                false,
            ));
        }
        view.put(key, doc.key, after_text).map_err(viewed)?;
        let Some(encoder) = encoder.as_deref_mut() else {
            continue;
        };
        let before = before_text
            .as_deref()
            .map(|t| parse_json(t, "a document of the view"))
            .transpose()?;
        let after = after_text
            .map(|t| parse_json(t, "a stored document"))
            .transpose()?;
        if let Some(op) = Op::between(before.as_ref(), after.as_ref()) {
            let change = Change {
                txn,
                op,
                before: before.as_ref(),
                after: after.as_ref(),
            };
            buffer.begin_change(doc.key);
            encoder.encode(&change, buffer).map_err(output_error)?;
            if buffer.bytes() >= max_bytes {
                return Ok(Some(i + 1));
            }
        }
    }
    Ok(None)
}

#[async_trait]
impl FencedStore for OutputTransactor {
    fn checkpoint(&mut self) -> &mut PreparedCheckpoint {
        &mut self.checkpoint
    }

    async fn load_keys(&mut self, load: Load, loaded: &mut dyn LoadedSink) -> Result<()> {
        let key = self.output(load.binding)?.view_key.clone();
        let keys: Vec<Vec<u8>> = load_keys(&load)
            .map(|k| k.map(<[u8]>::to_vec))
            .collect::<Result<_>>()?;
        let found = on_view(&self.view, move |view| {
            let mut found = Vec::new();
            for k in &keys {
                if let Some(doc) = view.get(&key, k)? {
                    found.push(doc);
                }
            }
            Ok(found)
        })
        .await?;
        for doc in found {
            loaded.push(load.binding, doc.as_bytes());
        }
        Ok(())
    }

    async fn start_writes(&mut self, store: Store) -> Result<()> {
        let txn = self.txn()?;
        let view = self.view.clone();
        let output = self.output(store.binding)?;
        if !output.in_batch {
            let kind = if output.snapshot {
                BatchKind::Snapshot
            } else {
                BatchKind::Delta
            };
            output.buffer.as_mut().ok_or_else(taken)?.start(txn);
            output.in_batch = true;
            output
                .endpoint
                .batch_start(txn, kind)
                .await
                .map_err(output_error)?;
            crate::fail_point!(crate::AFTER_BATCH_START);
        }
        // The Store's documents in runs that each fill the buffer at most, each run
        // pushed before the next is encoded: a slow endpoint slows the loop, and what
        // is buffered stays within max_buffer_size_bytes (and one change's messages).
        let (key, encode, max_bytes) =
            (output.view_key.clone(), !output.snapshot, output.max_bytes);
        let store = Arc::new(store);
        let mut from = Some(0);
        while let Some(start) = from {
            let mut encoder = output.encoder.take().ok_or_else(taken)?;
            let mut buffer = output.buffer.take().ok_or_else(taken)?;
            let (view, key, store) = (view.clone(), key.clone(), store.clone());
            let (encoder, buffer, applied) = tokio::task::spawn_blocking(move || {
                let applied = apply_store(
                    &mut view.lock().expect("not poisoned"),
                    &key,
                    &store,
                    start,
                    txn,
                    encode.then_some(&mut *encoder),
                    (&mut buffer, max_bytes),
                );
                (encoder, buffer, applied)
            })
            .await
            .map_err(|e| Error::store("output store", e.to_string(), false))?;
            output.encoder = Some(encoder);
            output.buffer = Some(buffer);
            from = applied?;
            if output
                .buffer
                .as_ref()
                .is_some_and(|b| b.bytes() >= max_bytes)
            {
                output.push().await?;
            }
        }
        Ok(())
    }

    async fn commit_writes(&mut self) -> Result<()> {
        let txn = self.txn()?;
        let mut snapshots = Vec::new();
        for binding in 0..self.outputs.len() {
            if !self.outputs[binding].in_batch {
                continue;
            }
            if self.outputs[binding].snapshot {
                self.send_snapshot(binding, txn).await?;
                snapshots.push((self.outputs[binding].view_key.clone(), txn));
            }
            let output = &mut self.outputs[binding];
            output.push().await?;
            crate::fail_point!(crate::BEFORE_BATCH_END);
            output.endpoint.batch_end().await.map_err(output_error)?;
            output.in_batch = false;
        }
        crate::fail_point!(crate::BEFORE_VIEW_COMMIT);
        let checkpoint = self.checkpoint.take()?;
        let claim = self.claim.clone();
        let sent = snapshots.clone();
        let now = on_view(&self.view, move |view| {
            view.commit(
                claim.key_begin,
                claim.key_end,
                claim.fence,
                &checkpoint,
                &sent,
            )
        })
        .await?;
        if now != Some(self.claim.fence) {
            return Err(self.claim.range_fence().fenced(None));
        }
        for output in &mut self.outputs {
            if snapshots.iter().any(|(k, _)| *k == output.view_key) {
                output.snapshot = false;
            }
        }
        Ok(())
    }

    fn claim(&self) -> &Claim {
        &self.claim
    }

    async fn rollback(&mut self) {
        let rolled = on_view(&self.view, |view| {
            view.rollback();
            Ok(())
        })
        .await;
        if let Err(err) = rolled {
            tracing::warn!(%err, "rolling back the output view");
        }
        for output in &mut self.outputs {
            if output.in_batch {
                output.endpoint.abort().await;
                output.in_batch = false;
            }
        }
    }

    async fn current_fence(&mut self) -> Result<Option<i64>> {
        let (begin, end) = (self.claim.key_begin, self.claim.key_end);
        on_view(&self.view, move |view| view.fence(begin, end)).await
    }

    async fn release(self: Box<Self>) {
        for output in self.outputs {
            output.endpoint.close().await;
        }
    }

    /// The bytes its encode buffers hold (none right after a commit, which pushes them
    /// all), and the messages it published.
    fn report(&self) -> Report {
        let buffered = (self.outputs.iter())
            .filter_map(|o| o.buffer.as_ref())
            .map(|b| b.bytes() as u64)
            .sum();
        let published = self.outputs.iter().map(|o| o.published).sum();
        Report {
            memory: buffered,
            metrics: vec![Metric::counter(
                "messages_published",
                "Messages this stream of the output pushed to its destinations (those of \
                 batches later aborted included).",
                published,
            )],
            health: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resource_splits_into_its_destination_and_its_encoding() {
        let r = Resource::parse(&json!({"topic": "t", "format": "avro", "schema_id": 7,
                                        "snapshot": true}))
        .unwrap();
        assert_eq!(r.destination, json!({"topic": "t"}));
        assert_eq!(r.encoding.format, encode::Format::Avro);
        assert_eq!(r.encoding.schema_id, Some(7));
        assert!(r.snapshot);
        let err = Resource::parse(&json!({"topic": "t", "format": "xml"})).unwrap_err();
        assert!(err.to_string().contains("xml"), "{err}");
        let err = Resource::parse(&json!({"snapshot": "yes"})).unwrap_err();
        assert!(err.to_string().contains("snapshot"), "{err}");
    }
}
