//! Reduction into a compact document ([`Doc`]) of a borrowed `serde_json::Value`: the
//! combiner's hot path, which keeps each key's document compact and reduces each new
//! document into it without taking it apart.
//!
//! ```text
//!  lhs: &mut Doc  ◀── rhs: &Value
//!   lastWriteWins, firstWriteWins, sum, scalar minimize/maximize,
//!   unkeyed merge of objects (both sorted by name: one walk of both sides) and arrays
//!                                                                  ── natively
//!   everything else (set, append, keyed merge/min/max, min/max of arrays or objects)
//!                                                                  ── via Value
//! ```
//!
//! The native cases are the ones whose semantics are a few lines; the others convert the
//! left side to a `Value`, run [`Cx::reduce`] (the reference implementation of every
//! strategy) and convert back, so there is one definition of what each strategy means.
//! Property tests check that this module agrees with `Reducer::reduce` on every strategy.

use super::{Cx, Loc, ReduceError, Strategy, add_numbers, compare_numbers, error, rank};
use crate::compact::{Doc, Field, Str};
use serde_json::{Map, Value};
use std::cmp::Ordering;

impl Cx<'_> {
    pub(crate) fn reduce_compact(
        &self,
        n: usize,
        lhs: &mut Doc,
        rhs: &Value,
        loc: Loc<'_>,
    ) -> Result<(), ReduceError> {
        let node = &self.nodes[n];
        match &node.strategy {
            Strategy::LastWriteWins => lhs.assign(rhs),
            Strategy::FirstWriteWins => {}
            Strategy::Sum => sum(lhs, rhs, loc)?,
            Strategy::Minimize { key } | Strategy::Maximize { key } if key.is_empty() => {
                let keep = match node.strategy {
                    Strategy::Minimize { .. } => Ordering::Less,
                    _ => Ordering::Greater,
                };
                match compare_scalars(lhs, rhs) {
                    Some(ord) if ord == keep => {}
                    Some(_) => lhs.assign(rhs),
                    None => self.via_value(n, lhs, rhs, loc)?,
                }
            }
            Strategy::Merge { key } if key.is_empty() => match (&mut *lhs, rhs) {
                (Doc::Object(l), Value::Object(r)) => self.merge_fields(n, l, r, loc)?,
                (Doc::Array(l), Value::Array(r)) => self.merge_items(n, l, r, loc)?,
                (l, r) => {
                    let l = Value::from(l.clone());
                    return Err(error(loc, "merge needs two objects or two arrays", &l, r));
                }
            },
            _ => self.via_value(n, lhs, rhs, loc)?,
        }
        Ok(())
    }

    /// The reference implementation, over a `Value` copy of the left side.
    fn via_value(
        &self,
        n: usize,
        lhs: &mut Doc,
        rhs: &Value,
        loc: Loc<'_>,
    ) -> Result<(), ReduceError> {
        let mut value = Value::from(std::mem::take(lhs));
        let result = self.reduce(n, &mut value, rhs.clone(), loc);
        *lhs = Doc::from(value);
        result
    }

    /// Union of two objects' properties, shared ones reduced with their own strategy. Both
    /// sides are sorted by name, so one forward walk pairs them.
    fn merge_fields(
        &self,
        n: usize,
        l: &mut Box<[Field]>,
        r: &Map<String, Value>,
        loc: Loc<'_>,
    ) -> Result<(), ReduceError> {
        let node = &self.nodes[n];
        let mut added = Vec::new();
        let (mut i, mut cursor) = (0, 0);
        for (name, rv) in r {
            let found = loop {
                match l.get(i).map(|field| field.name.cmp_str(name)) {
                    Some(Ordering::Less) => i += 1,
                    found => break found == Some(Ordering::Equal),
                }
            };
            if found {
                let child = node.next_property(&mut cursor, name);
                self.reduce_compact(child, &mut l[i].value, rv, Loc::Prop(&loc, name))?;
                i += 1;
            } else {
                added.push(Field {
                    name: Str::new(name),
                    value: Doc::from(rv),
                });
            }
        }
        if !added.is_empty() {
            let mut fields = std::mem::take(l).into_vec();
            fields.append(&mut added);
            fields.sort_unstable_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
            *l = fields.into_boxed_slice();
        }
        Ok(())
    }

    /// Arrays index by index; items beyond the left's end are appended.
    fn merge_items(
        &self,
        n: usize,
        l: &mut Box<[Doc]>,
        r: &[Value],
        loc: Loc<'_>,
    ) -> Result<(), ReduceError> {
        let node = &self.nodes[n];
        for (i, (lv, rv)) in l.iter_mut().zip(r).enumerate() {
            self.reduce_compact(node.item(i), lv, rv, Loc::Item(&loc, i))?;
        }
        if r.len() > l.len() {
            let mut items = std::mem::take(l).into_vec();
            items.extend(r[items.len()..].iter().map(Doc::from));
            *l = items.into_boxed_slice();
        }
        Ok(())
    }
}

fn sum(lhs: &mut Doc, rhs: &Value, loc: Loc<'_>) -> Result<(), ReduceError> {
    let (Some(l), Value::Number(r)) = (lhs.as_number(), rhs) else {
        let l = Value::from(lhs.clone());
        return Err(error(loc, "sum needs two numbers", &l, rhs));
    };
    match add_numbers(&l, r) {
        Some(total) => {
            *lhs = Doc::from_number(&total);
            Ok(())
        }
        None => Err(error(loc, "sum overflows", &Value::Number(l), rhs)),
    }
}

/// The JSON order of two values when neither is an array or object (`None` otherwise):
/// the same order as [`super::compare`].
fn compare_scalars(lhs: &Doc, rhs: &Value) -> Option<Ordering> {
    let lhs_rank = match lhs {
        Doc::Null => 0,
        Doc::Bool(_) => 1,
        Doc::PosInt(_) | Doc::NegInt(_) | Doc::Float(_) => 2,
        Doc::String(_) => 3,
        Doc::Array(_) | Doc::Object(_) => return None,
    };
    Some(match (lhs, rhs) {
        (_, Value::Array(_) | Value::Object(_)) => return None,
        (Doc::Bool(l), Value::Bool(r)) => l.cmp(r),
        (Doc::String(l), Value::String(r)) => l.cmp_str(r),
        (l, Value::Number(r)) if lhs_rank == 2 => compare_numbers(&l.as_number()?, r),
        _ => lhs_rank.cmp(&rank(rhs)),
    })
}
