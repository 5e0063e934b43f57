//! The runtime side of the reference driver: Spec, Validate, Apply and Open.
//!
//! Validate requires the key locations and the document (the table stores the whole
//! document by key) and leaves every other field optional. Apply creates (or drops)
//! one table per binding; its dry run describes exactly what the real one does.
//! ApplyUpsert records the spec version, and Open refuses another one
//! ([`check_version`]); ApplyDelete also forgets the ranges' fences and checkpoints.
//! Open claims the key range (`client::MaterializationState::claim`): after `open` returns,
//! every earlier instance of an overlapping range is fenced and can no longer commit.
//! Tables are also created, leniently, by the first commit that writes them.

use crate::client::{Backend, MaterializationState, Row, State, Table, read_shared, rows_of};
use crate::config::{
    ENDPOINT_SCHEMA, EndpointConfig, RESOURCE_SCHEMA, ResourceConfig, binding_tables, parse,
};
use crate::transactor::MemoryTransactor;
use async_trait::async_trait;
use sluice_driver_sdk::fence::{Claim, check_version};
use sluice_driver_sdk::materialize::constraint::Type;
use sluice_driver_sdk::materialize::{
    self as m, transaction_request::Open, transaction_response::Opened,
};
use sluice_driver_sdk::validate::ProjectionRules;
use sluice_driver_sdk::{Declared, Driver, Result, Transactor};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// The reference driver. Clones share one state, so two Opens on it fence each other.
#[derive(Clone, Default)]
pub struct MemoryDriver {
    state: Arc<Mutex<State>>,
}

impl MemoryDriver {
    pub fn new() -> Self {
        Self::default()
    }

    fn backend(&self, endpoint_spec_json: &str) -> Result<Backend> {
        let config: EndpointConfig = parse("endpoint config", endpoint_spec_json)?;
        Ok(match config.path {
            Some(path) => Backend::File(path),
            None => Backend::Memory(self.state.clone()),
        })
    }

    /// The rows of `table` in key order, then its delta-updates log, from this value's
    /// memory. For a driver configured with `path`, use [`MemoryDriver::rows_in_file`].
    pub fn rows(&self, materialization: &str, table: &str) -> Vec<Row> {
        rows_of(
            &self.state.lock().unwrap_or_else(|p| p.into_inner()),
            materialization,
            table,
        )
    }

    /// Like [`MemoryDriver::rows`], from the state file at `path`. Blocks (it locks and
    /// reads the file): for tests and tools, not async workers.
    pub fn rows_in_file(path: &Path, materialization: &str, table: &str) -> Result<Vec<Row>> {
        Ok(rows_of(&read_shared(path)?, materialization, table))
    }

    /// The runtime checkpoint last committed by exactly the range `[key_begin, key_end]`.
    pub fn checkpoint(
        &self,
        materialization: &str,
        key_begin: u32,
        key_end: u32,
    ) -> Option<Vec<u8>> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let mat = state.materializations.get(materialization)?;
        mat.checkpoint(key_begin, key_end).map(<[u8]>::to_vec)
    }
}

#[async_trait]
impl Driver for MemoryDriver {
    fn declared(&self) -> Declared {
        // Apply keeps a table whose binding's backfill rose.
        Declared {
            rebuilds_on_backfill: false,
            ..Declared::AUTHORITATIVE_TABLE
        }
    }

    async fn spec(&self, _req: m::SpecRequest) -> Result<m::SpecResponse> {
        Ok(m::SpecResponse {
            endpoint_spec_schema_json: ENDPOINT_SCHEMA.to_string(),
            resource_spec_schema_json: RESOURCE_SCHEMA.to_string(),
            documentation_url: "https://docs.rs/sluice-memory/latest/sluice_memory/".into(),
        })
    }

    async fn validate(&self, req: m::ValidateRequest) -> Result<m::ValidateResponse> {
        self.backend(&req.endpoint_spec_json)?;
        let bindings = req.bindings.iter().map(|binding| {
            let resource: ResourceConfig = parse("resource config", &binding.resource_spec_json)?;
            let collection = binding.collection.clone().unwrap_or_default();
            let constraints = ProjectionRules {
                key: "part of the table's key",
                document: (Type::FieldRequired, "the document is what the table stores"),
                top_level: (Type::FieldOptional, "stored inside the document anyway"),
                nested: (Type::FieldOptional, "stored inside the document anyway"),
            }
            .constraints(&collection);
            Ok(m::validate_response::Binding {
                constraints: constraints.collect(),
                resource_path: vec![resource.table],
                delta_updates: resource.delta_updates,
            })
        });
        Ok(m::ValidateResponse {
            bindings: bindings.collect::<Result<_>>()?,
        })
    }

    async fn apply_upsert(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        apply(
            self,
            req,
            "create",
            |tables, name| !tables.contains_key(name),
            |tables, name| {
                tables.insert(name.to_string(), Table::default());
            },
            |mat, version| mat.applied_version = Some(version.to_string()),
        )
        .await
    }

    async fn apply_delete(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        apply(
            self,
            req,
            "drop",
            |tables, name| tables.contains_key(name),
            |tables, name| {
                tables.remove(name);
            },
            |mat, _| {
                mat.forget_ranges();
                mat.applied_version = None;
            },
        )
        .await
    }

    async fn open(&self, open: Open) -> Result<(Box<dyn Transactor>, Opened)> {
        let spec = open.materialization.unwrap_or_default();
        let backend = self.backend(&spec.endpoint_spec_json)?;
        let bindings = binding_tables(&spec)?;
        let (begin, end) = (open.key_begin, open.key_end);
        let (fence, checkpoint) = backend
            .update(|state| {
                let mat = state
                    .materializations
                    .entry(spec.materialization.clone())
                    .or_default();
                check_version(
                    &spec.materialization,
                    mat.applied_version.as_deref(),
                    &open.version,
                )?;
                Ok(mat.claim(begin, end))
            })
            .await?;
        // After this point every earlier instance of an overlapping range is fenced.
        let claim = Claim::new(&spec.materialization, begin, end, fence);
        let transactor = MemoryTransactor::new(backend, claim, bindings);
        Ok((
            Box::new(transactor),
            Opened {
                flow_checkpoint: checkpoint,
            },
        ))
    }
}

/// Shared body of ApplyUpsert and ApplyDelete: `verb` each table of the materialization
/// for which `needed` holds, then `settle` the materialization with the request's
/// version (record it, or forget its ranges); describe only when `dry_run`.
async fn apply(
    driver: &MemoryDriver,
    req: m::ApplyRequest,
    verb: &str,
    needed: fn(&BTreeMap<String, Table>, &str) -> bool,
    act: fn(&mut BTreeMap<String, Table>, &str),
    settle: fn(&mut MaterializationState, &str),
) -> Result<m::ApplyResponse> {
    let spec = req.materialization.unwrap_or_default();
    let backend = driver.backend(&spec.endpoint_spec_json)?;
    let tables: BTreeSet<String> = binding_tables(&spec)?.into_iter().map(|(t, _)| t).collect();
    let describe = |state: &State| {
        let current = state
            .materializations
            .get(&spec.materialization)
            .map(|m| &m.tables);
        let empty = BTreeMap::new();
        let current = current.unwrap_or(&empty);
        let todo: Vec<String> = tables
            .iter()
            .filter(|t| needed(current, t))
            .cloned()
            .collect();
        todo
    };
    let todo = if req.dry_run {
        backend.read(describe).await?
    } else {
        backend
            .update(|state| {
                let todo = describe(state);
                let mat = state
                    .materializations
                    .entry(spec.materialization.clone())
                    .or_default();
                for table in &todo {
                    act(&mut mat.tables, table);
                }
                settle(mat, &req.version);
                Ok(todo)
            })
            .await?
    };
    let lines: Vec<String> = todo.iter().map(|t| format!("{verb} table {t}")).collect();
    Ok(m::ApplyResponse {
        action_description: lines.join("\n"),
        driver_checkpoint: None,
    })
}
