//! Plan: collections compiled, and each materialization's endpoint connected, admitted
//! ([`super::admit`], before any driver is asked anything), asked for its Spec and
//! Validate, and its fields selected: the [`Planned`] pipeline every later stage takes.

use super::admit;
use super::error::{PipelineError, invalid};
use crate::admission::{self, EpochBinding, SinkGuarantee};
use crate::config::{self, Pipeline};
use crate::projections;
use crate::registry::Connect;
use crate::types::Collection;
use serde_json::Value;
use sluice_driver_sdk::Endpoint;
use sluice_driver_sdk::error::within;
use sluice_proto::flow;
use sluice_proto::materialize as m;
use std::collections::BTreeMap;
use std::sync::Arc;

pub struct PlannedMaterialization {
    pub name: String,
    pub endpoint: Arc<dyn Endpoint>,
    /// An epoch sink: it names its staging by the pipeline's deployment id.
    pub needs_deployment_id: bool,
    /// See [`SinkGuarantee::store_keeps_checkpoint`](crate::admission::SinkGuarantee::store_keeps_checkpoint).
    pub store_keeps_checkpoint: bool,
    /// See [`Connected::rebuilds_on_backfill`](crate::registry::Connected::rebuilds_on_backfill).
    pub rebuilds_on_backfill: bool,
    /// The longest one call of the endpoint may take ([`Connected::longest_call`](crate::registry::Connected::longest_call)).
    pub longest_call: Option<std::time::Duration>,
    pub spec: flow::MaterializationSpec,
    pub validated: m::ValidateResponse,
    pub shard: config::ShardDef,
}

pub struct Planned {
    pub collections: BTreeMap<String, Arc<Collection>>,
    pub materializations: Vec<PlannedMaterialization>,
}

/// Compiles collections and asks every driver for its Spec and Validate; the first
/// problem, or all of them when there are several ([`plan_all`]).
pub async fn plan(pipeline: &Pipeline, connect: &dyn Connect) -> Result<Planned, PipelineError> {
    let (planned, problems) = plan_all(pipeline, connect).await;
    match PipelineError::gathered(problems) {
        Some(err) => Err(err),
        None => Ok(planned),
    }
}

/// Plans every collection and materialization it can, and says what stops the others,
/// each problem naming its place: a materialization binding a collection that does not
/// compile is left out (the collection's problem says why).
pub async fn plan_all(pipeline: &Pipeline, connect: &dyn Connect) -> (Planned, Vec<PipelineError>) {
    let mut problems = Vec::new();
    let mut collections = BTreeMap::new();
    for (name, def) in &pipeline.collections {
        match projections::compile_collection(
            &format!("collections.{name}"),
            name,
            &def.key,
            &def.schema,
        ) {
            Ok(collection) => {
                collections.insert(name.clone(), Arc::new(collection));
            }
            Err(err) => problems.push(err.into()),
        }
    }
    let mut materializations = Vec::new();
    for (name, def) in &pipeline.materializations {
        if def
            .bindings
            .iter()
            .any(|b| !collections.contains_key(&b.source))
        {
            continue;
        }
        match plan_materialization(pipeline, connect, &collections, name, def).await {
            Ok(planned) => materializations.push(planned),
            Err(err) => problems.push(err),
        }
    }
    let planned = Planned {
        collections,
        materializations,
    };
    (planned, problems)
}

/// Connects materialization `name`'s endpoint, admits it, and asks its driver for Spec
/// and Validate; selects each binding's fields.
async fn plan_materialization(
    pipeline: &Pipeline,
    connect: &dyn Connect,
    collections: &BTreeMap<String, Arc<Collection>>,
    name: &String,
    def: &config::MaterializationDef,
) -> Result<PlannedMaterialization, PipelineError> {
    let place = format!("materializations.{name}");
    let connected = connect
        .connect(name, &pipeline.endpoint_state_dir(name), &def.endpoint)
        .await
        .map_err(|reason| invalid(format!("{place}.endpoint"), reason))?;
    // Admission first: a part that cannot give the delivery asked for is refused
    // before any driver is asked anything.
    admit::admit(pipeline, collections, name, connected.guarantee)?;
    let driver_err = |source| PipelineError::Driver {
        materialization: name.clone(),
        source,
    };
    let timeout = pipeline.runtime.timeouts.driver;
    let endpoint_spec_json = connected.config.to_string();
    let spec = connected.endpoint.spec(m::SpecRequest {
        endpoint_type: connected.endpoint_type as i32,
        endpoint_spec_json: endpoint_spec_json.clone(),
    });
    let spec = within(timeout, || "Spec".into(), spec)
        .await
        .map_err(driver_err)?;
    let resource_schema = resource_schema(&place, &spec.resource_spec_schema_json)?;

    let mut validate = m::ValidateRequest {
        materialization: name.clone(),
        endpoint_type: connected.endpoint_type as i32,
        endpoint_spec_json: endpoint_spec_json.clone(),
        bindings: Vec::new(),
    };
    let mut collection_specs = Vec::new();
    for (i, binding) in def.bindings.iter().enumerate() {
        let binding_place = format!("{place}.bindings[{i}]");
        let collection = &collections[&binding.source];
        if let Err(err) = resource_schema.validate(&binding.resource) {
            let at = err.pointer.trim_start_matches('/').replace('/', ".");
            let at = if at.is_empty() {
                String::new()
            } else {
                format!(".{at}")
            };
            return Err(invalid(format!("{binding_place}.resource{at}"), err.reason));
        }
        let collection_spec = projections::collection_spec(collection);
        validate.bindings.push(m::validate_request::Binding {
            resource_spec_json: binding.resource.to_string(),
            collection: Some(collection_spec.clone()),
            field_config_json: Default::default(),
            backfill: binding.backfill,
        });
        collection_specs.push(collection_spec);
    }
    let validated = within(
        timeout,
        || "Validate".into(),
        connected.endpoint.validate(validate),
    )
    .await
    .map_err(driver_err)?;
    if validated.bindings.len() != def.bindings.len() {
        return Err(invalid(
            &place,
            format!(
                "driver validated {} bindings, the pipeline has {}",
                validated.bindings.len(),
                def.bindings.len()
            ),
        ));
    }
    if let SinkGuarantee::Epoch(_) = connected.guarantee {
        refuse_unloaded_standard_bindings(&place, def, &validated)?;
    }
    let mut bindings = Vec::new();
    for (i, ((binding, constraints), collection_spec)) in def
        .bindings
        .iter()
        .zip(&validated.bindings)
        .zip(collection_specs)
        .enumerate()
    {
        let fields = binding.fields.clone().unwrap_or_default();
        let selection = projections::select_fields(
            &format!("{place}.bindings[{i}]"),
            &collection_spec,
            constraints,
            &fields.include,
            &fields.exclude,
            binding.backfill,
        )?;
        bindings.push(flow::materialization_spec::Binding {
            resource_spec_json: binding.resource.to_string(),
            resource_path: constraints.resource_path.clone(),
            collection: Some(collection_spec),
            field_selection: Some(selection),
            delta_updates: binding.delta_updates || constraints.delta_updates,
            backfill: binding.backfill,
        });
    }
    Ok(PlannedMaterialization {
        name: name.clone(),
        endpoint: connected.endpoint,
        needs_deployment_id: matches!(connected.guarantee, SinkGuarantee::Epoch(_)),
        store_keeps_checkpoint: connected.guarantee.store_keeps_checkpoint(),
        rebuilds_on_backfill: connected.rebuilds_on_backfill,
        longest_call: connected.longest_call,
        spec: flow::MaterializationSpec {
            materialization: name.clone(),
            endpoint_type: connected.endpoint_type as i32,
            endpoint_spec_json,
            bindings,
        },
        validated,
        shard: def.shard,
    })
}

/// An epoch sink takes each transaction's changes; only a binding it loads (its
/// Validate answered standard) is reduced onto what the store holds. A standard binding
/// it does not load would quietly become delta updates (a `sum` counted from zero each
/// transaction), so it is refused, naming the remedy ([`admission::admit_epoch_bindings`]).
fn refuse_unloaded_standard_bindings(
    place: &str,
    def: &config::MaterializationDef,
    validated: &m::ValidateResponse,
) -> Result<(), PipelineError> {
    let bindings: Vec<EpochBinding> = (def.bindings.iter().zip(&validated.bindings))
        .enumerate()
        .map(|(i, (binding, constraints))| EpochBinding {
            place: format!("{place}.bindings[{i}]"),
            standard: !binding.delta_updates,
            loads: !constraints.delta_updates,
        })
        .collect();
    match admission::admit_epoch_bindings(&bindings)
        .into_iter()
        .next()
    {
        Some(refusal) => Err(invalid(
            refusal.place,
            format!("{}; {}", refusal.declares, refusal.remedy),
        )),
        None => Ok(()),
    }
}

fn resource_schema(place: &str, json: &str) -> Result<sluice_doc::Schema, PipelineError> {
    let value: Value = serde_json::from_str(json).map_err(|e| {
        invalid(
            place,
            format!("the driver's resource schema is not JSON: {e}"),
        )
    })?;
    sluice_doc::Schema::compile(&value).map_err(|e| {
        invalid(
            place,
            format!("the driver's resource schema does not compile: {e}"),
        )
    })
}
