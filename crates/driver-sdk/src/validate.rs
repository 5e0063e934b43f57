//! The constraint a driver puts on each projection of a binding at Validate, chosen
//! once: every location of the collection key is required (the store is keyed by it),
//! and the driver says what it asks of the whole document, of a top-level field and of
//! a nested one, with the reason each gives. (Table stores, whose columns decide more,
//! choose through `sluice-sqlkit`'s `validate`, on the same key rule.)

use crate::flow;
use crate::materialize::{self as m, constraint::Type};

/// What a driver asks of each kind of projection, and why.
#[derive(Debug, Clone, Copy)]
pub struct ProjectionRules {
    /// Why the key locations are required (`"part of the Redis key"`).
    pub key: &'static str,
    pub document: (Type, &'static str),
    /// A field one level down (`/a`).
    pub top_level: (Type, &'static str),
    /// A field deeper down (`/a/b`).
    pub nested: (Type, &'static str),
}

impl ProjectionRules {
    /// The constraint on each projection of `collection`, by field name.
    pub fn constraints(
        self,
        collection: &flow::CollectionSpec,
    ) -> impl Iterator<Item = (String, m::Constraint)> + '_ {
        collection.projections.iter().map(move |p| {
            let (kind, reason) = if p.is_primary_key || collection.key_ptrs.contains(&p.ptr) {
                (Type::LocationRequired, self.key)
            } else if p.ptr.is_empty() {
                self.document
            } else if p.ptr.matches('/').count() == 1 {
                self.top_level
            } else {
                self.nested
            };
            let constraint = m::Constraint {
                r#type: kind as i32,
                reason: reason.into(),
            };
            (p.field.clone(), constraint)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn projection(field: &str, ptr: &str, key: bool) -> flow::Projection {
        flow::Projection {
            field: field.into(),
            ptr: ptr.into(),
            is_primary_key: key,
            ..Default::default()
        }
    }

    #[test]
    fn each_projection_gets_the_rule_of_its_kind() {
        let collection = flow::CollectionSpec {
            key_ptrs: vec!["/id".into()],
            projections: vec![
                projection("id", "/id", true),
                projection("flow_document", "", false),
                projection("a", "/a", false),
                projection("a/b", "/a/b", false),
            ],
            ..Default::default()
        };
        let rules = ProjectionRules {
            key: "the key",
            document: (Type::FieldRequired, "the document"),
            top_level: (Type::LocationRecommended, "a top-level field"),
            nested: (Type::FieldOptional, "a nested field"),
        };
        let got: Vec<(String, i32, String)> = rules
            .constraints(&collection)
            .map(|(field, c)| (field, c.r#type, c.reason))
            .collect();
        let want = [
            ("id", Type::LocationRequired, "the key"),
            ("flow_document", Type::FieldRequired, "the document"),
            ("a", Type::LocationRecommended, "a top-level field"),
            ("a/b", Type::FieldOptional, "a nested field"),
        ];
        let want: Vec<(String, i32, String)> = want
            .into_iter()
            .map(|(f, t, r)| (f.to_owned(), t as i32, r.to_owned()))
            .collect();
        assert_eq!(got, want);
    }
}
