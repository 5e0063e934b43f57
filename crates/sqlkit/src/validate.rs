//! Validate for table-shaped stores: which projections a binding must, should, may or
//! must not materialize, and why.
//!
//! The rules are the same for every SQL driver; only whether a field's inferred types
//! fit a column, and the store's name in the reasons, differ:
//!
//! ```text
//!   key location, no column type fits     → Unsatisfiable
//!   key location                          → LocationRequired
//!   whole document, delta updates         → LocationRecommended
//!   whole document                        → FieldRequired (loads and reductions need it)
//!   no column type fits (null, untyped)   → FieldForbidden
//!   top-level field (`/a`)                → LocationRecommended
//!   nested field (`/a/b`)                 → FieldOptional
//! ```

use crate::ColumnKind;
use sluice_driver_sdk::flow;
use sluice_driver_sdk::materialize::{
    self as m, Constraint, constraint::Type as ConstraintType, validate_response,
};
use sluice_driver_sdk::{Error, Result};

/// The store a driver validates against.
pub struct Store<'a> {
    /// Named in reasons, e.g. "PostgreSQL".
    pub name: &'a str,
    /// Whether a column can hold the projection's values.
    pub storable: &'a dyn Fn(&flow::Projection) -> bool,
}

impl Store<'static> {
    /// The store whose columns are of type `C`: a projection is storable if `C` has a
    /// column type for it.
    pub fn of<C: ColumnKind>() -> Self {
        Store {
            name: C::STORE,
            storable: &|p| C::of_projection(p).is_some(),
        }
    }
}

/// A binding's resource as Validate reports it.
pub struct Resource {
    /// Where the binding writes, outermost first; the last element is the table.
    pub path: Vec<String>,
    pub delta_updates: bool,
}

/// The constraint on projection `p` of `collection`, for a binding that is
/// delta-updated if `delta`.
pub fn constraint(
    store: &Store<'_>,
    collection: &flow::CollectionSpec,
    p: &flow::Projection,
    delta: bool,
) -> Constraint {
    let storable = (store.storable)(p);
    let is_key = p.is_primary_key || collection.key_ptrs.contains(&p.ptr);
    let (ty, reason) = if is_key && !storable {
        (
            ConstraintType::Unsatisfiable,
            format!("this key location has no type {} can hold", store.name),
        )
    } else if is_key {
        (
            ConstraintType::LocationRequired,
            "every location of the collection key is required".to_owned(),
        )
    } else if p.ptr.is_empty() && delta {
        (
            ConstraintType::LocationRecommended,
            "the whole document is recommended".to_owned(),
        )
    } else if p.ptr.is_empty() {
        (
            ConstraintType::FieldRequired,
            "the whole document is required to load and reduce it".to_owned(),
        )
    } else if !storable {
        (
            ConstraintType::FieldForbidden,
            "a field that is always null or has no type cannot be a column".to_owned(),
        )
    } else if p.ptr.matches('/').count() == 1 {
        (
            ConstraintType::LocationRecommended,
            "top-level fields are recommended".to_owned(),
        )
    } else {
        (
            ConstraintType::FieldOptional,
            "nested fields may be materialized".to_owned(),
        )
    };
    Constraint {
        r#type: ty as i32,
        reason,
    }
}

/// Answers a Validate request: each binding's resource comes from `resource` (its
/// parsed resource config), its constraints from [`constraint`]. An error names the
/// binding by index.
pub fn validate(
    store: &Store<'_>,
    req: &m::ValidateRequest,
    resource: impl Fn(&str) -> Result<Resource>,
) -> Result<m::ValidateResponse> {
    let mut bindings = Vec::with_capacity(req.bindings.len());
    for (i, binding) in req.bindings.iter().enumerate() {
        let resource = resource(&binding.resource_spec_json)
            .map_err(|err| Error::Config(format!("bindings[{i}]: {err}")))?;
        let collection = binding.collection.as_ref().ok_or_else(|| {
            Error::Config(format!(
                "bindings[{i}] of table {:?} has no collection",
                resource.path.last().map_or("", String::as_str)
            ))
        })?;
        bindings.push(validate_response::Binding {
            constraints: (collection.projections.iter())
                .map(|p| {
                    let constraint = constraint(store, collection, p, resource.delta_updates);
                    (p.field.clone(), constraint)
                })
                .collect(),
            resource_path: resource.path,
            delta_updates: resource.delta_updates,
        });
    }
    Ok(m::ValidateResponse { bindings })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn projection(ptr: &str, types: &[&str], key: bool) -> flow::Projection {
        flow::Projection {
            ptr: ptr.into(),
            field: ptr.trim_start_matches('/').into(),
            is_primary_key: key,
            inference: Some(flow::Inference {
                types: types.iter().map(|t| t.to_string()).collect(),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    const STORE: Store<'static> = Store {
        name: "TestDB",
        storable: &|p| {
            p.inference
                .as_ref()
                .is_some_and(|i| i.types.iter().any(|t| t != "null"))
        },
    };

    #[test]
    fn each_kind_of_projection_gets_its_constraint() {
        let collection = flow::CollectionSpec {
            key_ptrs: vec!["/id".into()],
            ..Default::default()
        };
        let cases = [
            (
                projection("/id", &["integer"], true),
                false,
                ConstraintType::LocationRequired,
            ),
            (
                projection("/id", &["null"], true),
                false,
                ConstraintType::Unsatisfiable,
            ),
            (
                projection("", &["object"], false),
                false,
                ConstraintType::FieldRequired,
            ),
            (
                projection("", &["object"], false),
                true,
                ConstraintType::LocationRecommended,
            ),
            (
                projection("/gone", &["null"], false),
                false,
                ConstraintType::FieldForbidden,
            ),
            (
                projection("/a", &["string"], false),
                false,
                ConstraintType::LocationRecommended,
            ),
            (
                projection("/a/b", &["string"], false),
                false,
                ConstraintType::FieldOptional,
            ),
        ];
        for (p, delta, want) in cases {
            let got = constraint(&STORE, &collection, &p, delta);
            assert_eq!(
                got.r#type, want as i32,
                "{} (delta {delta}): {}",
                p.ptr, got.reason
            );
        }
        let unsatisfiable = constraint(&STORE, &collection, &projection("/id", &[], true), false);
        assert!(
            unsatisfiable.reason.contains("TestDB"),
            "{}",
            unsatisfiable.reason
        );
    }

    #[test]
    fn a_bad_resource_or_a_missing_collection_names_the_binding() {
        let binding = |collection| m::validate_request::Binding {
            resource_spec_json: "{}".into(),
            collection,
            ..Default::default()
        };
        let req = |b| m::ValidateRequest {
            bindings: vec![binding(Some(Default::default())), b],
            ..Default::default()
        };
        let ok = |_: &str| {
            Ok(Resource {
                path: vec!["db".into(), "t".into()],
                delta_updates: false,
            })
        };
        let err = validate(&STORE, &req(binding(None)), ok).unwrap_err();
        assert!(
            err.to_string()
                .contains("bindings[1] of table \"t\" has no collection"),
            "{err}"
        );
        let bad = |_: &str| Err(Error::Config("table: invalid type".into()));
        let err = validate(&STORE, &req(binding(None)), bad).unwrap_err();
        assert!(
            err.to_string()
                .contains("bindings[0]: invalid configuration: table"),
            "{err}"
        );
        let response = validate(&STORE, &req(binding(Some(Default::default()))), ok).unwrap();
        assert_eq!(response.bindings[1].resource_path, ["db", "t"]);
    }
}
