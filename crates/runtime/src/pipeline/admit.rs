//! Admit: a materialization runs only if each of its parts (its sources, its endpoint)
//! declares at least the `delivery` the pipeline asks for ([`crate::admission`] decides);
//! sources are opened only to be looked at, which connects nothing.

use super::error::{PipelineError, invalid};
use crate::admission::{self, BindingReplay, Delivery, SinkGuarantee};
use crate::config::{self, Pipeline};
use crate::types::Collection;
use sluice_source_sdk::{Health, Source, SourceError};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Admission of materialization `name`: its sources, as each declares itself once
/// opened (which connects nothing), its endpoint's `guarantee`, and whether its
/// bindings' reductions survive a replay (`collections`: the compiled ones). Refuses
/// ([`PipelineError::Refused`]) when a part cannot give the pipeline's `delivery`.
pub(super) fn admit(
    pipeline: &Pipeline,
    collections: &BTreeMap<String, Arc<Collection>>,
    name: &str,
    guarantee: SinkGuarantee,
) -> Result<(), PipelineError> {
    let mut sources = Vec::new();
    for (source, def) in pipeline.sources_of(name) {
        let opened = open_to_look(pipeline, name, source, def)
            .map_err(|e| invalid(format!("sources.{source}"), e.to_string()))?;
        sources.push((source.clone(), opened.fault_tolerance()));
    }
    let bindings: Vec<BindingReplay> = (pipeline.materializations[name].bindings.iter())
        .enumerate()
        .filter_map(|(i, binding)| {
            let collection = collections.get(&binding.source)?;
            Some(BindingReplay::of(
                format!("materializations.{name}.bindings[{i}]"),
                binding.delta_updates,
                collection.schema.reducer(),
            ))
        })
        .collect();
    let place = format!("materializations.{name}.endpoint");
    let refusals =
        admission::admit_bindings(pipeline.delivery, &sources, (&place, guarantee), &bindings);
    if refusals.is_empty() {
        return Ok(());
    }
    Err(PipelineError::Refused {
        delivery: match pipeline.delivery {
            Delivery::ExactlyOnce => "exactly-once",
            Delivery::AtLeastOnce => "at-least-once",
        },
        refusals,
    })
}

/// Source `source` (`def`) of materialization `materialization`, opened only to be
/// looked at (its fault tolerance, a probe): it serves nothing, so it checks no
/// documents and reports no health.
pub(super) fn open_to_look(
    pipeline: &Pipeline,
    materialization: &str,
    source: &str,
    def: &config::SourceDef,
) -> Result<Box<dyn Source>, SourceError> {
    def.config.open(&sluice_source_sdk::Opening {
        name: source,
        materialization,
        state_dir: &pipeline.source_state_dir(materialization, source),
        shard_moves: pipeline.cluster.is_some(),
        follow: false,
        intake: None,
        health: Health::none(),
        shard_keys: None,
    })
}
