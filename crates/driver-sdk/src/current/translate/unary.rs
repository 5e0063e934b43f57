//! The unary calls (Spec, Validate, Apply), each one request and one response on a
//! stream of its own: the driver side's [`unary_request`] and answers, the runtime
//! side's requests and the answers it reads.

use super::*;

/// A current request that is not part of a transaction, as the seed's unary call.
#[derive(Debug, Clone, PartialEq)]
pub enum Unary {
    Spec(m::SpecRequest),
    Validate(m::ValidateRequest),
    Apply(m::ApplyRequest),
    /// An Apply whose materialization has no bindings while `last_materialization` has
    /// some: the deletion of the last one (Sluice's convention for `apply --delete`
    /// over the current protocol, which has no deletion of its own). Its
    /// `materialization` is the last one, at `last_version`.
    ApplyDelete(m::ApplyRequest),
}

/// The seed unary call of a current Spec, Validate or Apply; anything else is the
/// runtime's violation.
pub fn unary_request(req: cm::Request) -> Result<Unary, ProtocolError> {
    Ok(match Req::of(req)? {
        Req::Spec(s) => Unary::Spec(m::SpecRequest {
            endpoint_type: flow::EndpointType::Invalid as i32,
            endpoint_spec_json: text(s.config_json),
        }),
        Req::Validate(v) => Unary::Validate(m::ValidateRequest {
            materialization: v.name,
            endpoint_type: flow::EndpointType::Invalid as i32,
            endpoint_spec_json: text(v.config_json),
            bindings: v
                .bindings
                .into_iter()
                .map(|b| m::validate_request::Binding {
                    resource_spec_json: text(b.resource_config_json),
                    collection: b.collection.map(collection_from_current),
                    field_config_json: json_map_from_current(b.field_config_json_map),
                    backfill: b.backfill,
                })
                .collect(),
        }),
        Req::Apply(a) => {
            let deletes = a
                .materialization
                .as_ref()
                .is_none_or(|s| s.bindings.is_empty())
                && a.last_materialization
                    .as_ref()
                    .is_some_and(|s| !s.bindings.is_empty());
            if deletes {
                Unary::ApplyDelete(m::ApplyRequest {
                    materialization: a.last_materialization.map(spec_from_current),
                    version: a.last_version,
                    driver_checkpoint_json: a.state_json,
                    ..Default::default()
                })
            } else {
                Unary::Apply(m::ApplyRequest {
                    materialization: a.materialization.map(spec_from_current),
                    version: a.version,
                    dry_run: false,
                    last_materialization: a.last_materialization.map(spec_from_current),
                    last_version: a.last_version,
                    driver_checkpoint_json: a.state_json,
                })
            }
        }
        other => {
            return Err(violation(
                Peer::Runtime,
                "Spec, Validate or Apply",
                other.name(),
            ));
        }
    })
}

/// The current Spec response of a seed one, at protocol [`PROTOCOL`].
pub fn spec_response(s: m::SpecResponse) -> cm::Response {
    response_of(|r| {
        r.spec = Some(cm::response::Spec {
            protocol: PROTOCOL,
            config_schema_json: s.endpoint_spec_schema_json.into_bytes(),
            resource_config_schema_json: s.resource_spec_schema_json.into_bytes(),
            documentation_url: s.documentation_url,
            oauth2: None,
        })
    })
}

/// Seed constraint types are the current ones less one (FIELD_REQUIRED = 0 is 1, ...,
/// seed UNSATISFIABLE = 5 is current INCOMPATIBLE = 6); a seed value out of range is
/// current INVALID, which a runtime refuses.
fn constraint_to_current(t: i32) -> i32 {
    if (0..=5).contains(&t) { t + 1 } else { 0 }
}

pub fn validated_response(v: m::ValidateResponse) -> cm::Response {
    response_of(|r| {
        r.validated = Some(cm::response::Validated {
            bindings: v
                .bindings
                .into_iter()
                .map(|b| cm::response::validated::Binding {
                    constraints: b
                        .constraints
                        .into_iter()
                        .map(|(field, c)| {
                            let c = cm::response::validated::Constraint {
                                r#type: constraint_to_current(c.r#type),
                                reason: c.reason,
                            };
                            (field, c)
                        })
                        .collect(),
                    resource_path: b.resource_path,
                    delta_updates: b.delta_updates,
                })
                .collect(),
        })
    })
}

pub fn applied_response(a: m::ApplyResponse) -> cm::Response {
    response_of(|r| {
        r.applied = Some(cm::response::Applied {
            action_description: a.action_description,
            state: a.driver_checkpoint.and_then(state_of),
        })
    })
}

pub fn spec_request(s: m::SpecRequest) -> cm::Request {
    request_of(|r| {
        r.spec = Some(cm::request::Spec {
            connector_type: cf::materialization_spec::ConnectorType::Local as i32,
            config_json: s.endpoint_spec_json.into_bytes(),
        })
    })
}

pub fn validate_request(v: m::ValidateRequest) -> cm::Request {
    request_of(|r| {
        r.validate = Some(cm::request::Validate {
            name: v.materialization,
            connector_type: cf::materialization_spec::ConnectorType::Local as i32,
            config_json: v.endpoint_spec_json.into_bytes(),
            bindings: v
                .bindings
                .into_iter()
                .map(|b| cm::request::validate::Binding {
                    resource_config_json: b.resource_spec_json.into_bytes(),
                    collection: b.collection.map(collection_to_current),
                    field_config_json_map: json_map_to_current(b.field_config_json)
                        .into_iter()
                        .collect(),
                    backfill: b.backfill,
                })
                .collect(),
            last_materialization: None,
            last_version: String::new(),
        })
    })
}

/// The current Apply of a seed ApplyUpsert. The current protocol has no dry run: the
/// caller answers a seed `dry_run` itself and never sends it (it would apply).
pub fn apply_request(a: m::ApplyRequest) -> cm::Request {
    request_of(|r| {
        r.apply = Some(cm::request::Apply {
            materialization: a.materialization.map(spec_to_current),
            version: a.version,
            last_materialization: a.last_materialization.map(spec_to_current),
            last_version: a.last_version,
            state_json: state_or_empty(a.driver_checkpoint_json),
        })
    })
}

/// The current Apply of a seed ApplyDelete of `a.materialization` ([`Unary::ApplyDelete`]):
/// the same materialization with no bindings, after the given one.
pub fn apply_delete_request(a: m::ApplyRequest) -> cm::Request {
    let last = a.materialization.map(spec_to_current);
    let empty = last.as_ref().map(|l| cf::MaterializationSpec {
        name: l.name.clone(),
        connector_type: l.connector_type,
        config_json: l.config_json.clone(),
        ..Default::default()
    });
    request_of(|r| {
        r.apply = Some(cm::request::Apply {
            materialization: empty,
            version: a.version.clone(),
            last_materialization: last,
            last_version: a.version,
            state_json: state_or_empty(a.driver_checkpoint_json),
        })
    })
}

fn unexpected_response(expected: &str, got: Resp) -> ProtocolError {
    violation(Peer::Driver, expected, got.name())
}

/// The seed Spec response of a current one; a protocol other than [`PROTOCOL`] is the
/// connector's violation.
pub fn spec_from(r: cm::Response) -> Result<m::SpecResponse, ProtocolError> {
    match Resp::of(r)? {
        Resp::Spec(s) if s.protocol == PROTOCOL => Ok(m::SpecResponse {
            endpoint_spec_schema_json: text(s.config_schema_json),
            resource_spec_schema_json: text(s.resource_config_schema_json),
            documentation_url: s.documentation_url,
        }),
        Resp::Spec(s) => Err(violation(
            Peer::Driver,
            format!("Spec of protocol {PROTOCOL}"),
            format!("Spec of protocol {}", s.protocol),
        )),
        other => Err(unexpected_response("Spec", other)),
    }
}

pub fn validated_from(r: cm::Response) -> Result<m::ValidateResponse, ProtocolError> {
    let v = match Resp::of(r)? {
        Resp::Validated(v) => v,
        other => return Err(unexpected_response("Validated", other)),
    };
    let mut bindings = Vec::with_capacity(v.bindings.len());
    for b in v.bindings {
        let mut constraints = std::collections::HashMap::with_capacity(b.constraints.len());
        for (field, c) in b.constraints {
            if !(1..=6).contains(&c.r#type) {
                return Err(violation(
                    Peer::Driver,
                    "Validated with constraint types FIELD_REQUIRED..INCOMPATIBLE",
                    format!("Validated with constraint type {} for {field:?}", c.r#type),
                ));
            }
            let c = m::Constraint {
                r#type: c.r#type - 1,
                reason: c.reason,
            };
            constraints.insert(field, c);
        }
        bindings.push(m::validate_response::Binding {
            constraints,
            resource_path: b.resource_path,
            delta_updates: b.delta_updates,
        });
    }
    Ok(m::ValidateResponse { bindings })
}

pub fn applied_from(r: cm::Response) -> Result<m::ApplyResponse, ProtocolError> {
    match Resp::of(r)? {
        Resp::Applied(a) => Ok(m::ApplyResponse {
            action_description: a.action_description,
            driver_checkpoint: a.state.map(|s| driver_checkpoint_of(Some(s))),
        }),
        other => Err(unexpected_response("Applied", other)),
    }
}
