//! [`OutputDriver`]: output endpoints as an in-process Flow driver of the authoritative
//! pattern, whose store is the view (see the crate docs for the order of writes that
//! makes each transaction's batch exactly once): Spec, Validate, Apply (a reset removes
//! the view) and Open (claims the range in the view, opens every binding's endpoint and
//! hands them to the [`crate::transactor`]).
//!
//! A binding's resource is its destination (the kind's keys: `topic`, `subject`,
//! `directory`) plus the encoding keys every kind shares: `format` (`json`,
//! `debezium`, `csv`, `avro`), `schema_id` / `key_schema_id` (Avro's Confluent
//! framing) and `snapshot` (the binding's first batch is its whole view). The
//! endpoint's `view` says where the view lives ([`crate::view::Place`]).

use crate::config::Endpoint;
use crate::encode::{self, Buffer, Fields};
use crate::endpoint::Target;
use crate::generation::{Generation, GenerationId};
use crate::kind::{LOCAL_VIEW, ONE_STREAM, OutputKind, Resource, endpoint_schema, resource_schema};
use crate::transactor::{BindingOutput, OutputTransactor};
use crate::view::{self, Place, View};
use crate::{output_error, parse_json};
use async_trait::async_trait;
use serde_json::Value;
use sluice_driver_sdk::fence::{Claim, PreparedCheckpoint};
use sluice_driver_sdk::flow::EndpointType;
use sluice_driver_sdk::materialize::constraint::Type;
use sluice_driver_sdk::materialize::{
    self as m, transaction_request::Open, transaction_response::Opened,
};
use sluice_driver_sdk::validate::ProjectionRules;
use sluice_driver_sdk::{
    BuiltinKind, CommitPattern, Declared, Driver, Error, InvalidConfig, Result, Transactor,
};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Output endpoints of kind `kind`, their views kept under `state_dir` unless the
/// endpoint's `view` names a PostgreSQL schema.
pub struct OutputDriver {
    kind: OutputKind,
    state_dir: PathBuf,
}

/// One binding's view: its key in the view (its resource path), its collection, and
/// whether its next batch is to be its snapshot.
struct BindingView {
    key: String,
    collection: String,
    snapshot: bool,
}

impl OutputDriver {
    pub fn new(kind: OutputKind, state_dir: PathBuf) -> OutputDriver {
        OutputDriver { kind, state_dir }
    }

    /// The endpoint configuration, checked: the kind's keys and where the view is.
    fn config(&self, endpoint_spec_json: &str) -> Result<(Value, Place)> {
        let config = parse_json(endpoint_spec_json, "the endpoint config")?;
        let Endpoint { kind, view } = self.kind.checked(&config).map_err(output_error)?;
        Ok((kind, view::place(view.as_ref(), &self.state_dir)))
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
        let (config, place) = self.config(&spec.endpoint_spec_json)?;
        let former_writers = matches!(place, Place::Shared(_));
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
                    former_writers,
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

#[async_trait]
impl Driver for OutputDriver {
    /// Authoritative over its view (fenced by generation); a change stream, so no
    /// delta updates, and a key stored as absent is an insert whatever was published.
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
            endpoint_spec_schema_json: endpoint_schema(&self.kind),
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

    /// Nothing to create ahead: a destination is created by its endpoint's first open,
    /// the view by the first Open. Each destination is looked at
    /// ([`crate::OutputEndpoint::probe`]): it can be reached.
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

    /// A reset: removes the materialization's view whole (every binding's documents,
    /// the checkpoint and fence, the snapshots sent, the generation), so the next run is
    /// a new materialization with a new generation, publishing every change again from
    /// an empty view. What the destinations hold is left as it is: the new generation's
    /// messages are told apart by their generation, and never taken for the old ones.
    async fn apply_delete(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        let spec = req
            .materialization
            .ok_or_else(|| Error::Config("ApplyDelete without a materialization".into()))?;
        let (_, place) = self.config(&spec.endpoint_spec_json)?;
        let mut actions = vec![format!(
            "remove {} (documents, checkpoint, snapshots, generation)",
            place.describe(&spec.materialization)
        )];
        for b in &spec.bindings {
            actions.push(format!(
                "start {} {} over: the next run publishes every change again, under a new \
                 generation (what it holds now stays)",
                self.kind.name,
                b.resource_path.join("/")
            ));
        }
        if !req.dry_run
            && let Some(removed) = view::remove(&place, &spec.materialization).await?
        {
            actions[0].push_str(&format!(": {removed}"));
        }
        Ok(m::ApplyResponse {
            action_description: actions.join("\n"),
            driver_checkpoint: None,
        })
    }

    /// Claims the range in the view (after which every earlier holder of it is fenced),
    /// seeds new snapshot bindings, and opens every binding's endpoint.
    async fn open(&self, open: Open) -> Result<(Box<dyn Transactor>, Opened)> {
        let spec = open
            .materialization
            .clone()
            .ok_or_else(|| Error::Config("Open without a materialization".into()))?;
        let (_, place) = self.config(&spec.endpoint_spec_json)?;
        let (key_begin, key_end) = (open.key_begin, open.key_end);
        let bindings: Vec<BindingView> = (spec.bindings.iter())
            .map(|b| {
                let (resource, path) = self.resource(&b.resource_spec_json)?;
                let collection = b.collection.as_ref().map(|c| c.collection.clone());
                Ok(BindingView {
                    key: path.join("/"),
                    collection: collection.unwrap_or_default(),
                    snapshot: resource.snapshot,
                })
            })
            .collect::<Result<_>>()?;
        let mut view = View::open(&place, &spec.materialization).await?;
        let (fence, checkpoint) = view.claim(key_begin, key_end).await?;
        let mut sent = Vec::new();
        for binding in &bindings {
            let was_sent = view.snapshot_sent(&binding.key).await?;
            if binding.snapshot && !was_sent && view.is_empty(&binding.key).await? {
                seed_from_sibling(&mut view, binding, &bindings).await?;
            }
            sent.push(was_sent);
        }
        let generation = view.generation();
        tracing::debug!(materialization = spec.materialization, generation = %generation.id,
            "opening the output endpoints");
        let mut outputs = self.outputs(&spec, generation)?;
        for (output, sent) in outputs.iter_mut().zip(sent) {
            output.snapshot &= !sent;
            output.endpoint.open().await.map_err(output_error)?;
        }
        let transactor = OutputTransactor {
            view,
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
async fn seed_from_sibling(
    view: &mut View,
    binding: &BindingView,
    bindings: &[BindingView],
) -> Result<()> {
    for sibling in bindings {
        if sibling.key != binding.key
            && sibling.collection == binding.collection
            && !view.is_empty(&sibling.key).await?
        {
            let seeded = view.seed(&binding.key, &sibling.key).await?;
            tracing::info!(binding = binding.key, from = %sibling.key, documents = seeded,
                "seeded a new snapshot binding's view from another binding of its collection");
            return Ok(());
        }
    }
    Ok(())
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
        (self.checked(config).map(drop)).map_err(|e| InvalidConfig::new("", e.to_string()))
    }

    /// Its views live in the materialization's state folder, unless `view` says
    /// otherwise: without a folder, no instance.
    fn driver(&self, state_dir: Option<&Path>) -> Option<Arc<dyn Driver>> {
        let state_dir = state_dir?.to_path_buf();
        Some(Arc::new(OutputDriver::new(*self, state_dir)))
    }

    fn schemas(&self) -> Option<(String, String)> {
        Some((endpoint_schema(self), resource_schema(self)))
    }

    /// The view is the output's authoritative store (before-images, checkpoint, fence),
    /// and rebuilding it from a destination works for none of them (files and streams
    /// keep changes, not last values per key): it must be where every member reaches
    /// it. And the move must not let the former holder's late messages land.
    fn pinned(&self, config: &Value) -> Option<&'static str> {
        match config.get("view") {
            None => Some(LOCAL_VIEW),
            Some(_) => self.late_writes,
        }
    }

    fn singleton(&self, _config: &Value) -> Option<&'static str> {
        Some(ONE_STREAM)
    }
}
