//! From the pipeline file to what the loop and the drivers need: compiled collections,
//! `flow::CollectionSpec`s with projections, field selections, and materialization specs.
//!
//! Field selection is a pure function of the collection, the driver's Validate
//! constraints and the user's `fields: {include, exclude}`:
//! keys are always the collection key; values are every non-key field the driver requires
//! or recommends, plus what the user includes, minus what the user excludes; the whole
//! document goes in `flow_document` unless the driver forbids it.

use crate::types::{Binding, Collection};
use sluice_doc::{KeyExtractor, Pointer, Schema};
use sluice_proto::flow;
use sluice_proto::materialize::{self as m, constraint::Type as ConstraintType};
use std::collections::BTreeSet;
use std::sync::Arc;

/// The field name of the whole document.
pub const DOCUMENT_FIELD: &str = "flow_document";

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("{place}: {reason}")]
    Invalid { place: String, reason: String },
}

fn invalid(place: impl Into<String>, reason: impl Into<String>) -> BuildError {
    BuildError::Invalid {
        place: place.into(),
        reason: reason.into(),
    }
}

/// Compiles one collection of the pipeline file. `place` names it in errors.
pub fn compile_collection(
    place: &str,
    name: &str,
    key: &[Pointer],
    schema: &serde_json::Value,
) -> Result<Collection, BuildError> {
    let schema =
        Schema::compile(schema).map_err(|e| invalid(format!("{place}.schema"), e.to_string()))?;
    if key.is_empty() {
        return Err(invalid(
            format!("{place}.key"),
            "a collection needs at least one key pointer, e.g. [/id]",
        ));
    }
    // A key location a document lacks takes the schema's default there; without one the
    // document is an error, reported at its source position. A location the schema
    // does not know at all (a misspelt `/userid`: not a property, not required, no
    // default) would fail every document, so it is refused here, on every path.
    let properties = schema.top_level_properties();
    let mut defaults = Vec::with_capacity(key.len());
    for (i, ptr) in key.iter().enumerate() {
        let inference = schema.inference(ptr);
        let declared = (ptr.tokens().next())
            .is_some_and(|first| properties.iter().any(|(name, _)| name == first));
        if !declared && !inference.must_exist && inference.default.is_none() {
            let names: Vec<&str> = properties.iter().map(|(name, _)| name.as_str()).collect();
            return Err(invalid(
                format!("{place}.key[{i}]"),
                format!(
                    "{ptr} is not a property of the schema, nor required by it, so no \
                     document would have this key (the schema's properties are {})",
                    if names.is_empty() {
                        "none".to_string()
                    } else {
                        names.join(", ")
                    }
                ),
            ));
        }
        defaults.push(inference.default);
    }
    Ok(Collection {
        name: name.to_string(),
        key: KeyExtractor::new(key.to_vec(), defaults),
        key_ptrs: key.iter().map(ToString::to_string).collect(),
        schema: Arc::new(schema),
    })
}

/// The field name a pointer projects as: `/user_id` → `user_id`, `/a/b` → `a/b`.
pub fn field_name(ptr: &str) -> String {
    ptr.trim_start_matches('/').to_string()
}

fn projection(collection: &Collection, ptr: &str, field: &str, primary: bool) -> flow::Projection {
    let inference = if ptr.is_empty() {
        flow::Inference {
            types: vec!["object".to_string()],
            must_exist: true,
            ..Default::default()
        }
    } else {
        let parsed = Pointer::parse(ptr).expect("projection pointers are validated");
        let inf = collection.schema.inference(&parsed);
        flow::Inference {
            types: inf.types,
            must_exist: inf.must_exist,
            string: inf.format.map(|format| flow::inference::String {
                format,
                ..Default::default()
            }),
            ..Default::default()
        }
    };
    flow::Projection {
        ptr: ptr.to_string(),
        field: field.to_string(),
        is_primary_key: primary,
        inference: Some(inference),
        ..Default::default()
    }
}

/// The collection as drivers see it: key pointers and a projection per key, per
/// top-level property, and of the whole document.
pub fn collection_spec(collection: &Collection) -> flow::CollectionSpec {
    let mut projections = Vec::new();
    let mut seen = BTreeSet::new();
    for ptr in &collection.key_ptrs {
        let field = field_name(ptr);
        seen.insert(field.clone());
        projections.push(projection(collection, ptr, &field, true));
    }
    for (name, ptr) in collection.schema.top_level_properties() {
        if seen.insert(name.clone()) {
            projections.push(projection(collection, &ptr.to_string(), &name, false));
        }
    }
    projections.push(projection(collection, "", DOCUMENT_FIELD, false));
    flow::CollectionSpec {
        collection: collection.name.clone(),
        key_ptrs: collection.key_ptrs.clone(),
        projections,
        ..Default::default()
    }
}

/// Chooses the fields of one binding under the driver's constraints.
pub fn select_fields(
    place: &str,
    spec: &flow::CollectionSpec,
    constraints: &m::validate_response::Binding,
    include: &[String],
    exclude: &[String],
    backfill: u32,
) -> Result<flow::FieldSelection, BuildError> {
    let known: BTreeSet<&str> = spec.projections.iter().map(|p| p.field.as_str()).collect();
    for field in include.iter().chain(exclude) {
        if !known.contains(field.as_str()) {
            return Err(invalid(
                format!("{place}.fields"),
                format!(
                    "unknown field {field:?} (fields: {})",
                    known.iter().cloned().collect::<Vec<_>>().join(", ")
                ),
            ));
        }
    }
    let keys: Vec<String> = spec.key_ptrs.iter().map(|p| field_name(p)).collect();
    let mut values = Vec::new();
    let mut document = String::new();
    for projection in &spec.projections {
        let field = &projection.field;
        let constraint = constraints.constraints.get(field);
        let kind = constraint
            .map(|c| ConstraintType::try_from(c.r#type).unwrap_or(ConstraintType::Unsatisfiable))
            .unwrap_or(ConstraintType::FieldForbidden);
        let reason = constraint
            .map(|c| c.reason.as_str())
            .unwrap_or("no constraint given");
        // INCOMPATIBLE (the seed's UNSATISFIABLE): the resource as it exists cannot
        // take the field. Left out when the user excludes a non-key field; otherwise the
        // fix is a backfill, which rebuilds the resource.
        if kind == ConstraintType::Unsatisfiable {
            if exclude.contains(field) && !keys.contains(field) {
                continue;
            }
            return Err(invalid(
                place.to_string(),
                incompatible(place, field, reason, backfill),
            ));
        }
        if keys.contains(field) {
            if kind == ConstraintType::FieldForbidden {
                return Err(invalid(
                    place,
                    format!("the driver forbids key field {field:?}: {reason}"),
                ));
            }
            continue;
        }
        let wanted = match kind {
            ConstraintType::FieldRequired => {
                if exclude.contains(field) {
                    return Err(invalid(
                        format!("{place}.fields.exclude"),
                        format!("field {field:?} is required by the driver: {reason}"),
                    ));
                }
                true
            }
            ConstraintType::LocationRequired | ConstraintType::LocationRecommended => {
                !exclude.contains(field)
            }
            ConstraintType::FieldOptional => include.contains(field),
            ConstraintType::FieldForbidden => {
                if include.contains(field) {
                    return Err(invalid(
                        format!("{place}.fields.include"),
                        format!("the driver forbids field {field:?}: {reason}"),
                    ));
                }
                false
            }
            ConstraintType::Unsatisfiable => unreachable!("handled above"),
        };
        if !wanted {
            continue;
        }
        if projection.ptr.is_empty() {
            document = field.clone();
        } else {
            values.push(field.clone());
        }
    }
    Ok(flow::FieldSelection {
        keys,
        values,
        document,
        ..Default::default()
    })
}

/// What an INCOMPATIBLE field says: the binding (`place`), the field, the driver's
/// reason, and the fix: raise the binding's `backfill` (now `backfill`) and apply.
fn incompatible(place: &str, field: &str, reason: &str, backfill: u32) -> String {
    format!(
        "field {field:?} is incompatible with the binding's existing resource: {reason}; \
         to rebuild the resource, raise {place}.backfill (now {backfill}) to {} and run \
         `sluice apply` (its table is dropped and recreated and its sources read again \
         from the beginning), or exclude the field if the binding can do without it",
        backfill + 1
    )
}

/// The loop's view of a binding: its collection and the pointers of its value fields.
pub fn loop_binding(
    collection: Arc<Collection>,
    spec: &flow::MaterializationSpec,
    index: usize,
) -> Binding {
    let binding = &spec.bindings[index];
    let collection_spec = binding
        .collection
        .as_ref()
        .expect("bindings carry their collection");
    let selection = binding.field_selection.clone().unwrap_or_default();
    let values = selection
        .values
        .iter()
        .map(|field| {
            let ptr = collection_spec
                .projections
                .iter()
                .find(|p| &p.field == field)
                .map(|p| p.ptr.as_str())
                .expect("selected fields are projections");
            Pointer::parse(ptr).expect("projection pointers are validated")
        })
        .collect();
    Binding {
        collection,
        resource: binding.resource_path.join("."),
        delta_updates: binding.delta_updates,
        values,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn compile(key: &str, schema: serde_json::Value) -> Result<(), String> {
        compile_collection("collections.c", "c", &[key.parse().unwrap()], &schema)
            .map(drop)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn a_key_location_the_schema_does_not_know_is_refused() {
        let schema = |required: serde_json::Value| {
            json!({
                "type": "object",
                "required": required,
                "properties": {
                    "user_id": {"type": "string"},
                    "region": {"type": "string", "default": "eu"},
                },
            })
        };
        assert!(compile("/user_id", schema(json!(["user_id"]))).is_ok());
        assert!(compile("/region", schema(json!([]))).is_ok(), "a default");
        // Declared but optional: a document lacking it stops at its line.
        assert!(compile("/user_id", schema(json!([]))).is_ok());
        // Required without being declared.
        assert!(compile("/tenant", schema(json!(["tenant"]))).is_ok());
        let misspelt = compile("/userid", schema(json!(["user_id"]))).unwrap_err();
        assert_eq!(
            misspelt,
            "collections.c.key[0]: /userid is not a property of the schema, nor required by \
             it, so no document would have this key (the schema's properties are region, \
             user_id)"
        );
    }

    #[test]
    fn an_incompatible_field_names_the_binding_the_reason_and_the_backfill_fix() {
        let collection = compile_collection(
            "collections.c",
            "c",
            &["/id".parse().unwrap()],
            &json!({"type": "object", "required": ["id"],
                    "properties": {"id": {"type": "string"}, "n": {"type": "integer"}}}),
        )
        .unwrap();
        let spec = collection_spec(&collection);
        let constraint = |t: ConstraintType, reason: &str| m::Constraint {
            r#type: t as i32,
            reason: reason.to_string(),
        };
        let mut constraints = m::validate_response::Binding::default();
        for p in &spec.projections {
            let c = match p.field.as_str() {
                "n" => constraint(ConstraintType::Unsatisfiable, "column n is TEXT"),
                "id" => constraint(ConstraintType::LocationRequired, "the key"),
                _ => constraint(ConstraintType::LocationRecommended, "the document"),
            };
            constraints.constraints.insert(p.field.clone(), c);
        }
        let place = "materializations.m.bindings[0]";
        let err = select_fields(place, &spec, &constraints, &[], &[], 2)
            .unwrap_err()
            .to_string();
        for part in [
            place,
            "field \"n\"",
            "column n is TEXT",
            "raise materializations.m.bindings[0].backfill (now 2) to 3",
            "`sluice apply`",
        ] {
            assert!(err.contains(part), "{part:?} missing from: {err}");
        }
        // Excluded, the binding goes on without it.
        let excluded = select_fields(place, &spec, &constraints, &[], &["n".to_string()], 2);
        assert!(!excluded.unwrap().values.contains(&"n".to_string()));
    }
}
