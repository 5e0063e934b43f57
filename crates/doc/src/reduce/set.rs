//! The `set` strategy: a location holding an update to a set, with Flow's semantics.
//!
//! An instance is an object with the terms `add`, and at most one of `intersect` or
//! `remove`. Each term is either an object (members keyed by property name) or an array
//! kept sorted by the strategy's `key` (the whole item when no key is given); all terms
//! of both sides use the same form. A side means "apply `intersect` (or `remove`) to the
//! base set, then union `add`". Reducing left `L` with right `R` gives (`∩`/`∪` reduce
//! matched members with the term's own child strategy, `−` and `⋒` only filter):
//!
//! | left \ right      | R has intersect                    | R has remove (or neither)          |
//! |-------------------|------------------------------------|------------------------------------|
//! | L has intersect   | add (LA ⋒ RI) ∪ RA, intersect LI ∩ RI | add (LA − RR) ∪ RA, intersect LI − RR |
//! | L has remove / —  | add (LA ⋒ RI) ∪ RA, intersect RI − LR | add (LA − RR) ∪ RA, remove LR ∪ RR  |
//!
//! where `X ⋒ Y` keeps the members of X that are also in Y. When the left side is a full
//! document (`full`), there is no base set left to apply `intersect`/`remove` to, so they
//! are applied to `add` and dropped from the result.

use super::{Cx, Join, Loc, ReduceError, compare_by_key, error};
use crate::Pointer;
use serde_json::{Map, Value};

/// One term (`add`, `intersect` or `remove`) of a set.
enum Term {
    Object(Map<String, Value>),
    Array(Vec<Value>),
}

#[derive(Default)]
struct Terms {
    add: Option<Term>,
    intersect: Option<Term>,
    remove: Option<Term>,
}

/// Checks that `v` is a well-formed set instance and returns whether its terms are
/// arrays (`Some(true)`), objects (`Some(false)`) or it has none (`None`).
fn form_of(v: &Value) -> Result<Option<bool>, String> {
    let Value::Object(terms) = v else {
        return Err("a set must be an object of add, intersect and remove".to_string());
    };
    if terms.contains_key("intersect") && terms.contains_key("remove") {
        return Err("a set cannot have both intersect and remove".to_string());
    }
    let mut form = None;
    for (name, term) in terms {
        if !matches!(name.as_str(), "add" | "intersect" | "remove") {
            return Err(format!(
                "unexpected set term {name:?} (expected add, intersect or remove)"
            ));
        }
        let is_array = match term {
            Value::Array(_) => true,
            Value::Object(_) => false,
            _ => return Err(format!("set term {name:?} must be an object or an array")),
        };
        if form.is_some_and(|f| f != is_array) {
            return Err("set terms mix objects and arrays".to_string());
        }
        form = Some(is_array);
    }
    Ok(form)
}

fn destructure(v: Value) -> Terms {
    let mut terms = Terms::default();
    if let Value::Object(fields) = v {
        for (name, term) in fields {
            let term = match term {
                Value::Array(items) => Term::Array(items),
                Value::Object(members) => Term::Object(members),
                _ => continue, // Excluded by `form_of`.
            };
            match name.as_str() {
                "add" => terms.add = Some(term),
                "intersect" => terms.intersect = Some(term),
                _ => terms.remove = Some(term),
            }
        }
    }
    terms
}

pub(super) fn reduce(
    cx: &Cx<'_>,
    n: usize,
    key: &[Pointer],
    lhs: &mut Value,
    rhs: Value,
    loc: Loc<'_>,
) -> Result<(), ReduceError> {
    let forms = form_of(lhs).and_then(|l| form_of(&rhs).map(|r| (l, r)));
    match forms {
        Ok((Some(l), Some(r))) if l != r => {
            return Err(error(loc, "set terms mix objects and arrays", lhs, &rhs));
        }
        Err(why) => return Err(error(loc, &why, lhs, &rhs)),
        Ok(_) => {}
    }
    let ops = Ops {
        cx,
        node: cx.node(n),
        key,
        loc,
    };
    let l = destructure(std::mem::take(lhs));
    let r = destructure(rhs);
    let full = cx.full;

    let mut out = Map::new();
    let (add, second) = match (l.intersect, r.intersect) {
        (Some(li), Some(ri)) => {
            let add = ops.union("add", ops.filter(l.add, &ri, true), r.add)?;
            let intersect = (!full)
                .then(|| ops.intersect("intersect", li, ri))
                .transpose()?;
            (add, intersect.map(|t| ("intersect", t)))
        }
        (Some(li), None) => {
            let add = ops.union("add", ops.filter_opt(l.add, r.remove.as_ref()), r.add)?;
            let intersect = ops
                .filter_opt(Some(li), r.remove.as_ref())
                .filter(|_| !full);
            (add, intersect.map(|t| ("intersect", t)))
        }
        (None, Some(ri)) => {
            let add = ops.union("add", ops.filter(l.add, &ri, true), r.add)?;
            let intersect = ops
                .filter_opt(Some(ri), l.remove.as_ref())
                .filter(|_| !full);
            (add, intersect.map(|t| ("intersect", t)))
        }
        (None, None) => {
            let add = ops.union("add", ops.filter_opt(l.add, r.remove.as_ref()), r.add)?;
            let remove = if full {
                None
            } else {
                ops.union("remove", l.remove, r.remove)?
            };
            (add, remove.map(|t| ("remove", t)))
        }
    };
    for (name, term) in add.map(|t| ("add", t)).into_iter().chain(second) {
        let value = match term {
            Term::Object(members) => Value::Object(members),
            Term::Array(items) => Value::Array(items),
        };
        out.insert(name.to_string(), value);
    }
    *lhs = Value::Object(out);
    Ok(())
}

/// Set algebra over terms, for one set location.
struct Ops<'a, 'n> {
    cx: &'a Cx<'n>,
    node: &'a super::Node,
    key: &'a [Pointer],
    loc: Loc<'a>,
}

impl Ops<'_, '_> {
    /// The members of `term` that are (`keep_present`) or are not in `by`; no reduction.
    fn filter(&self, term: Option<Term>, by: &Term, keep_present: bool) -> Option<Term> {
        Some(match (term?, by) {
            (Term::Object(mut members), Term::Object(by)) => {
                members.retain(|k, _| by.contains_key(k) == keep_present);
                Term::Object(members)
            }
            (Term::Array(mut items), Term::Array(by)) => {
                items.retain(|item| {
                    by.binary_search_by(|b| compare_by_key(self.key, b, item))
                        .is_ok()
                        == keep_present
                });
                Term::Array(items)
            }
            (term, _) => term, // Forms were checked to agree.
        })
    }

    /// `term − by` when `by` is given.
    fn filter_opt(&self, term: Option<Term>, by: Option<&Term>) -> Option<Term> {
        match by {
            Some(by) => self.filter(term, by, false),
            None => term,
        }
    }

    fn union(
        &self,
        name: &str,
        l: Option<Term>,
        r: Option<Term>,
    ) -> Result<Option<Term>, ReduceError> {
        match (l, r) {
            (Some(l), Some(r)) => self.join(name, l, r, Join::Union).map(Some),
            (l, r) => Ok(l.or(r)),
        }
    }

    fn intersect(&self, name: &str, l: Term, r: Term) -> Result<Term, ReduceError> {
        self.join(name, l, r, Join::Intersection)
    }

    fn join(&self, name: &str, l: Term, r: Term, join: Join) -> Result<Term, ReduceError> {
        let child = self.node.property(name);
        let loc = Loc::Prop(&self.loc, name);
        match (l, r) {
            (Term::Object(mut l), Term::Object(r)) => {
                self.cx.join_objects(child, &mut l, r, join, loc)?;
                Ok(Term::Object(l))
            }
            (Term::Array(l), Term::Array(r)) => self
                .cx
                .join_sorted(child, self.key, l, r, join, loc)
                .map(Term::Array),
            (l, _) => Ok(l), // Forms were checked to agree.
        }
    }
}
