//! The runtime side of the Redis driver: Spec, Validate, Apply and Open.
//!
//! - Validate requires the key locations and the document, recommends the other fields
//!   in the hash format (they become hash fields) and leaves them optional in the json
//!   format (the document holds them anyway). It refuses delta-updates bindings
//!   ([`crate::config::DELTA_REFUSED`]) and bindings whose prefixes overlap (one
//!   binding's ApplyDelete would remove the other's keys). It connects to nothing.
//! - Apply has nothing to create: ApplyUpsert connects (so `sluice check` and a first
//!   start reach the server, the latter with the run's retries) and describes each
//!   binding's keys; ApplyDelete removes every key under each binding's prefix (SCAN +
//!   UNLINK); its dry run only describes. Both describe the same lines whether run or
//!   not.
//! - Open connects and returns an empty checkpoint: the runtime's recovery log is the
//!   only record of progress, and nothing is fenced (Redis has no transactions to hold a
//!   fence in: the pattern is [`sluice_driver_sdk::CommitPattern::RecoveryLogNonTransactional`]).
//!   An Open with no driver checkpoint comes from a log that holds nothing of this
//!   materialization (the runtime sends `{}` once it holds an intent): keys under a
//!   binding's prefix then belong to a history the log lost, and reducing the input
//!   onto them again would count it twice, so Open refuses.

use crate::client;
use crate::config::{
    DOCUMENTATION_URL, ENDPOINT_SCHEMA, EndpointConfig, Format, RESOURCE_SCHEMA, ResourceConfig,
    binding_resource,
};
use crate::transactor::{Binding, RedisTransactor};
use async_trait::async_trait;
use sluice_driver_sdk::materialize::constraint::Type;
use sluice_driver_sdk::materialize::{
    self as m, transaction_request::Open, transaction_response::Opened,
};
use sluice_driver_sdk::validate::ProjectionRules;
use sluice_driver_sdk::{CommitPattern, Declared, Driver, Error, Result, Transactor, flow};

/// The Redis driver. Holds nothing: every call connects with its own configuration.
#[derive(Debug, Clone, Default)]
pub struct RedisDriver;

impl RedisDriver {
    pub fn new() -> Self {
        RedisDriver
    }
}

/// The resources of a materialization's bindings, refused as Validate would.
fn spec_resources(spec: &flow::MaterializationSpec) -> Result<Vec<ResourceConfig>> {
    let resources = (spec.bindings.iter().enumerate())
        .map(|(i, b)| binding_resource(i, &b.resource_spec_json, b.delta_updates))
        .collect::<Result<Vec<_>>>()?;
    check_prefixes(&resources)?;
    Ok(resources)
}

/// Refuses two bindings one of whose prefixes starts the other's: their keys could
/// meet (`a` + `b1…` is `ab` + `1…`), and deleting one would delete the other's.
fn check_prefixes(resources: &[ResourceConfig]) -> Result<()> {
    for (i, a) in resources.iter().enumerate() {
        for (j, b) in resources.iter().enumerate().skip(i + 1) {
            if a.prefix.starts_with(&b.prefix) || b.prefix.starts_with(&a.prefix) {
                return Err(Error::Config(format!(
                    "bindings {i} and {j}: prefixes {:?} and {:?} overlap (one starts the \
                     other), so their keys could collide; give each binding a prefix of \
                     its own, e.g. ending in \":\"",
                    a.prefix, b.prefix
                )));
            }
        }
    }
    Ok(())
}

/// One line of an Apply description.
fn describe(verb: &str, resource: &ResourceConfig) -> String {
    format!(
        "{verb}keys under prefix {:?} (format {})",
        resource.prefix,
        resource.format.name()
    )
}

#[async_trait]
impl Driver for RedisDriver {
    /// No fence and no checkpoint in Redis: the recovery log decides, and a replayed
    /// transaction writes its values again (admitted under `delivery: at_least_once`).
    fn declared(&self) -> Declared {
        Declared {
            pattern: CommitPattern::RecoveryLogNonTransactional,
            deletes: true,
            delta_updates: false,
            strict_exists: false,
            rebuilds_on_backfill: false,
        }
    }

    async fn spec(&self, _req: m::SpecRequest) -> Result<m::SpecResponse> {
        Ok(m::SpecResponse {
            endpoint_spec_schema_json: ENDPOINT_SCHEMA.to_string(),
            resource_spec_schema_json: RESOURCE_SCHEMA.to_string(),
            documentation_url: DOCUMENTATION_URL.into(),
        })
    }

    async fn validate(&self, req: m::ValidateRequest) -> Result<m::ValidateResponse> {
        EndpointConfig::parse(&req.endpoint_spec_json)?;
        let resources = (req.bindings.iter().enumerate())
            .map(|(i, b)| binding_resource(i, &b.resource_spec_json, false))
            .collect::<Result<Vec<_>>>()?;
        check_prefixes(&resources)?;
        let bindings = (req.bindings.iter().zip(resources)).map(|(binding, resource)| {
            let collection = binding.collection.clone().unwrap_or_default();
            let field = match resource.format {
                Format::Hash => (
                    Type::LocationRecommended,
                    "a field of the hash beside the document",
                ),
                _ => (Type::FieldOptional, "stored inside the document anyway"),
            };
            let constraints = ProjectionRules {
                key: "part of the Redis key",
                document: (Type::FieldRequired, "the document is what each key stores"),
                top_level: field,
                nested: field,
            }
            .constraints(&collection);
            m::validate_response::Binding {
                constraints: constraints.collect(),
                resource_path: vec![resource.prefix],
                delta_updates: false,
            }
        });
        Ok(m::ValidateResponse {
            bindings: bindings.collect(),
        })
    }

    /// Nothing to create: Redis keys exist once written. Connects all the same, so that
    /// `sluice check` and a first start know the server answers.
    async fn apply_upsert(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        let spec = req.materialization.unwrap_or_default();
        let config = EndpointConfig::parse(&spec.endpoint_spec_json)?;
        client::connect(&config).await?;
        let lines: Vec<String> = (spec_resources(&spec)?.iter())
            .map(|r| describe("", r))
            .collect();
        Ok(m::ApplyResponse {
            action_description: lines.join("\n"),
            driver_checkpoint: None,
        })
    }

    async fn apply_delete(&self, req: m::ApplyRequest) -> Result<m::ApplyResponse> {
        let spec = req.materialization.unwrap_or_default();
        let config = EndpointConfig::parse(&spec.endpoint_spec_json)?;
        let resources = spec_resources(&spec)?;
        if !req.dry_run {
            let mut conn = client::connect(&config).await?;
            for resource in &resources {
                let removed = client::delete_prefix(&mut conn, &resource.prefix).await?;
                tracing::info!(prefix = %resource.prefix, removed, "deleted the keys of a binding");
            }
        }
        let lines: Vec<String> = (resources.iter()).map(|r| describe("delete ", r)).collect();
        Ok(m::ApplyResponse {
            action_description: lines.join("\n"),
            driver_checkpoint: None,
        })
    }

    async fn open(&self, open: Open) -> Result<(Box<dyn Transactor>, Opened)> {
        let spec = open.materialization.unwrap_or_default();
        let config = EndpointConfig::parse(&spec.endpoint_spec_json)?;
        let resources = spec_resources(&spec)?;
        let bindings: Vec<Binding> = (spec.bindings.iter().zip(resources))
            .map(|(binding, resource)| {
                let selection = binding.field_selection.clone().unwrap_or_default();
                let document_field = match selection.document.as_str() {
                    "" => "flow_document".to_string(),
                    field => field.to_string(),
                };
                Binding {
                    prefix: resource.prefix,
                    format: resource.format,
                    document_field,
                    fields: selection.keys.into_iter().chain(selection.values).collect(),
                }
            })
            .collect();
        let mut conn = client::connect(&config).await?;
        if open.driver_checkpoint_json.is_empty() {
            for binding in &bindings {
                refuse_unlogged_keys(&mut conn, &spec.materialization, &binding.prefix).await?;
            }
        }
        // No fence and no checkpoint of our own: the runtime's recovery log has both.
        Ok((
            Box::new(RedisTransactor::new(conn, bindings)),
            Opened {
                flow_checkpoint: Vec::new(),
            },
        ))
    }
}

/// Refuses a first Open (the recovery log holds nothing of `materialization`) over keys
/// under `prefix`: they were written by a history the log no longer has.
async fn refuse_unlogged_keys(
    conn: &mut redis::aio::MultiplexedConnection,
    materialization: &str,
    prefix: &str,
) -> Result<()> {
    match client::any_key(conn, prefix).await? {
        None => Ok(()),
        Some(key) => Err(Error::Config(format!(
            "Redis holds keys under prefix {prefix:?} (such as {key:?}), but the recovery \
             log of materialization {materialization:?} has no record of writing them (it \
             was removed or is another one): a run would reduce its whole input onto them \
             again, counting it twice. Restore the recovery log, or start over with \
             `sluice apply --delete <pipeline>`, which deletes the keys under the \
             binding's prefix"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resource(prefix: &str) -> ResourceConfig {
        ResourceConfig {
            prefix: prefix.into(),
            format: Format::Json,
            delta_updates: false,
        }
    }

    #[test]
    fn overlapping_prefixes_are_refused_naming_both_bindings() {
        assert!(check_prefixes(&[resource("a:"), resource("b:"), resource("ab:")]).is_ok());
        let err = check_prefixes(&[resource("a:"), resource("views"), resource("view")])
            .unwrap_err()
            .to_string();
        assert!(err.contains("bindings 1 and 2"), "{err}");
    }
}
