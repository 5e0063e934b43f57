//! Reduction into a compact document ([`Doc`]): the combiner's hot path, which keeps each
//! key's document compact and reduces each new document into it without taking it apart.
//!
//! ```text
//!  lhs: &mut Doc  ◀── rhs: &Value (a parsed document, read in place)
//!                 ◀── rhs: Doc    (a drained or loaded one, moved)
//!   lastWriteWins, firstWriteWins, sum, scalar minimize/maximize,
//!   unkeyed merge of objects (both sorted by name: one walk of both sides) and arrays
//!                                                                  ── natively
//!   everything else (set, append, keyed merge/min/max, min/max of arrays or objects)
//!                                                                  ── via Value
//! ```
//!
//! The right side is an [`Operand`], so one walk serves both kinds. The native cases are
//! the ones whose semantics are a few lines; the others convert the left side to a
//! `Value`, run [`Cx::reduce`] (the reference implementation of every strategy) and
//! convert back, so there is one definition of what each strategy means. Property tests
//! check that this module agrees with `Reducer::reduce` on every strategy, for both kinds
//! of right side.

use super::{Cx, Loc, ReduceError, Strategy, add_numbers, compare_numbers, error};
use crate::compact::{Doc, Field, Str};
use serde_json::{Number, Value};
use std::cmp::Ordering;

/// A JSON scalar of either side, for minimize/maximize.
pub(crate) enum Scalar<'a> {
    Null,
    Bool(bool),
    Number(Number),
    String(&'a str),
    /// An array or object: compared by the reference implementation instead.
    Composite,
}

impl Scalar<'_> {
    fn rank(&self) -> u8 {
        match self {
            Scalar::Null => 0,
            Scalar::Bool(_) => 1,
            Scalar::Number(_) => 2,
            Scalar::String(_) => 3,
            Scalar::Composite => 4,
        }
    }

    fn of_doc(doc: &Doc) -> Scalar<'_> {
        match doc {
            Doc::Null => Scalar::Null,
            Doc::Bool(b) => Scalar::Bool(*b),
            Doc::String(s) => Scalar::String(s.as_str()),
            Doc::Array(_) | Doc::Object(_) => Scalar::Composite,
            number => number.as_number().map_or(Scalar::Null, Scalar::Number),
        }
    }
}

/// The right side of a compact reduction.
pub(crate) trait Operand: Sized {
    /// A property name of an object operand.
    type Name: AsRef<str>;

    fn name_into_str(name: Self::Name) -> Str;
    /// Makes `lhs` this value (lastWriteWins).
    fn assign_to(self, lhs: &mut Doc);
    fn into_doc(self) -> Doc;
    fn to_value(&self) -> Value;
    fn scalar(&self) -> Scalar<'_>;
    /// The properties, sorted by name, or the operand back if it is no object.
    fn into_fields(self) -> Result<impl Iterator<Item = (Self::Name, Self)>, Self>;
    /// The items and their count, or the operand back if it is no array.
    fn into_items(self) -> Result<(usize, impl Iterator<Item = Self>), Self>;
}

impl<'v> Operand for &'v Value {
    type Name = &'v String;

    fn name_into_str(name: &String) -> Str {
        Str::new(name)
    }

    fn assign_to(self, lhs: &mut Doc) {
        lhs.assign(self);
    }

    fn into_doc(self) -> Doc {
        Doc::from(self)
    }

    fn to_value(&self) -> Value {
        (*self).clone()
    }

    fn scalar(&self) -> Scalar<'_> {
        match self {
            Value::Null => Scalar::Null,
            Value::Bool(b) => Scalar::Bool(*b),
            Value::Number(n) => Scalar::Number(n.clone()),
            Value::String(s) => Scalar::String(s),
            Value::Array(_) | Value::Object(_) => Scalar::Composite,
        }
    }

    fn into_fields(self) -> Result<impl Iterator<Item = (&'v String, &'v Value)>, Self> {
        match self {
            Value::Object(map) => Ok(map.iter()),
            other => Err(other),
        }
    }

    fn into_items(self) -> Result<(usize, impl Iterator<Item = &'v Value>), Self> {
        match self {
            Value::Array(items) => Ok((items.len(), items.iter())),
            other => Err(other),
        }
    }
}

impl Operand for Doc {
    type Name = Str;

    fn name_into_str(name: Str) -> Str {
        name
    }

    fn assign_to(self, lhs: &mut Doc) {
        *lhs = self;
    }

    fn into_doc(self) -> Doc {
        self
    }

    fn to_value(&self) -> Value {
        Value::from(self.clone())
    }

    fn scalar(&self) -> Scalar<'_> {
        Scalar::of_doc(self)
    }

    fn into_fields(self) -> Result<impl Iterator<Item = (Str, Doc)>, Self> {
        match self {
            Doc::Object(fields) => Ok(fields.into_vec().into_iter().map(|f| (f.name, f.value))),
            other => Err(other),
        }
    }

    fn into_items(self) -> Result<(usize, impl Iterator<Item = Doc>), Self> {
        match self {
            Doc::Array(items) => Ok((items.len(), items.into_vec().into_iter())),
            other => Err(other),
        }
    }
}

impl Cx<'_> {
    pub(crate) fn reduce_compact<R: Operand>(
        &self,
        n: usize,
        lhs: &mut Doc,
        rhs: R,
        loc: Loc<'_>,
    ) -> Result<(), ReduceError> {
        let node = &self.nodes[n];
        match &node.strategy {
            Strategy::LastWriteWins => rhs.assign_to(lhs),
            Strategy::FirstWriteWins => {}
            Strategy::Sum => sum(lhs, rhs, loc)?,
            Strategy::Minimize { key } | Strategy::Maximize { key } if key.is_empty() => {
                let keep = match node.strategy {
                    Strategy::Minimize { .. } => Ordering::Less,
                    _ => Ordering::Greater,
                };
                match compare_scalars(&Scalar::of_doc(lhs), &rhs.scalar()) {
                    Some(ord) if ord == keep => {}
                    Some(_) => rhs.assign_to(lhs),
                    None => self.via_value(n, lhs, rhs, loc)?,
                }
            }
            Strategy::Merge { key } if key.is_empty() => match lhs {
                Doc::Object(l) => match rhs.into_fields() {
                    Ok(r) => self.merge_fields(n, l, r, loc)?,
                    Err(rhs) => return Err(merge_error(lhs, &rhs, loc)),
                },
                Doc::Array(l) => match rhs.into_items() {
                    Ok((len, r)) => self.merge_items(n, l, len, r, loc)?,
                    Err(rhs) => return Err(merge_error(lhs, &rhs, loc)),
                },
                _ => return Err(merge_error(lhs, &rhs, loc)),
            },
            _ => self.via_value(n, lhs, rhs, loc)?,
        }
        Ok(())
    }

    /// The reference implementation, over a `Value` copy of both sides.
    fn via_value<R: Operand>(
        &self,
        n: usize,
        lhs: &mut Doc,
        rhs: R,
        loc: Loc<'_>,
    ) -> Result<(), ReduceError> {
        let mut value = Value::from(std::mem::take(lhs));
        let result = self.reduce(n, &mut value, rhs.to_value(), loc);
        *lhs = Doc::from(value);
        result
    }

    /// Union of two objects' properties, shared ones reduced with their own strategy. Both
    /// sides are sorted by name, so one forward walk pairs them.
    fn merge_fields<R: Operand>(
        &self,
        n: usize,
        l: &mut Box<[Field]>,
        r: impl Iterator<Item = (R::Name, R)>,
        loc: Loc<'_>,
    ) -> Result<(), ReduceError> {
        let node = &self.nodes[n];
        let mut added = Vec::new();
        let (mut i, mut cursor) = (0, 0);
        for (name, rv) in r {
            let found = loop {
                match l.get(i).map(|field| field.name.cmp_str(name.as_ref())) {
                    Some(Ordering::Less) => i += 1,
                    found => break found == Some(Ordering::Equal),
                }
            };
            if found {
                let child = node.next_property(&mut cursor, name.as_ref());
                self.reduce_compact(child, &mut l[i].value, rv, Loc::Prop(&loc, name.as_ref()))?;
                i += 1;
            } else {
                added.push(Field {
                    name: R::name_into_str(name),
                    value: rv.into_doc(),
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
    fn merge_items<R: Operand>(
        &self,
        n: usize,
        l: &mut Box<[Doc]>,
        r_len: usize,
        mut r: impl Iterator<Item = R>,
        loc: Loc<'_>,
    ) -> Result<(), ReduceError> {
        let node = &self.nodes[n];
        for (i, lv) in l.iter_mut().enumerate() {
            let Some(rv) = r.next() else { break };
            self.reduce_compact(node.item(i), lv, rv, Loc::Item(&loc, i))?;
        }
        if r_len > l.len() {
            let mut items = std::mem::take(l).into_vec();
            items.extend(r.map(R::into_doc));
            *l = items.into_boxed_slice();
        }
        Ok(())
    }
}

fn merge_error(lhs: &Doc, rhs: &impl Operand, loc: Loc<'_>) -> ReduceError {
    let l = Value::from(lhs.clone());
    error(
        loc,
        "merge needs two objects or two arrays",
        &l,
        &rhs.to_value(),
    )
}

fn sum(lhs: &mut Doc, rhs: impl Operand, loc: Loc<'_>) -> Result<(), ReduceError> {
    let (Some(l), Scalar::Number(r)) = (lhs.as_number(), rhs.scalar()) else {
        let l = Value::from(lhs.clone());
        return Err(error(loc, "sum needs two numbers", &l, &rhs.to_value()));
    };
    match add_numbers(&l, &r) {
        Some(total) => {
            *lhs = Doc::from_number(&total);
            Ok(())
        }
        None => Err(error(
            loc,
            "sum overflows",
            &Value::Number(l),
            &rhs.to_value(),
        )),
    }
}

/// The JSON order of two values when neither is an array or object (`None` otherwise):
/// the same order as [`super::compare`].
fn compare_scalars(lhs: &Scalar<'_>, rhs: &Scalar<'_>) -> Option<Ordering> {
    Some(match (lhs, rhs) {
        (Scalar::Composite, _) | (_, Scalar::Composite) => return None,
        (Scalar::Bool(l), Scalar::Bool(r)) => l.cmp(r),
        (Scalar::String(l), Scalar::String(r)) => l.cmp(r),
        (Scalar::Number(l), Scalar::Number(r)) => compare_numbers(l, r),
        _ => lhs.rank().cmp(&rhs.rank()),
    })
}
