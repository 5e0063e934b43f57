//! Reduction into a compact document ([`Doc`]): the combiner's hot path, which keeps each
//! key's document compact and reduces each new document into it without taking it apart.
//!
//! ```text
//!  lhs: &mut Doc  ◀── rhs: Doc (parsed, drained or loaded; moved in)
//!   lastWriteWins, firstWriteWins, sum, scalar minimize/maximize,
//!   unkeyed merge of objects (both sorted by name: one walk of both sides) and arrays
//!                                                                  ── natively
//!   everything else (set, append, keyed merge/min/max, min/max of arrays or objects)
//!                                                                  ── via Value
//! ```
//!
//! The native cases are the ones whose semantics are a few lines; the others convert
//! both sides to `Value`s, run [`Cx::reduce`] (the reference implementation of every
//! strategy) and convert back, so there is one definition of what each strategy means.
//! Property tests check that this module agrees with `Reducer::reduce` on every strategy.
//!
//! Each reduction returns how much the left side's heap estimate ([`Doc::heap_size`])
//! changed, computed from what it replaced, appended or regrew, so the combiner keeps an
//! exact estimate per key without walking the document again after every reduction.

use super::number::{self, Addend};
use super::{
    Cx, Loc, MERGE_NEEDS_COMPOSITES, NOT_NUMBERS, ReduceError, Strategy, compare_numbers, error,
};
use crate::compact::{Doc, Field, block_size, next_named};
use serde_json::{Number, Value};
use std::cmp::Ordering;

/// A JSON scalar of either side, for minimize/maximize.
enum Scalar<'a> {
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

impl Cx<'_> {
    /// Reduces `rhs` into `lhs` and returns the change of `lhs`'s heap estimate.
    ///
    /// Inline: most locations hold scalars reduced by lastWriteWins, firstWriteWins or sum,
    /// whose whole reduction is a few instructions; the other strategies go out of line.
    /// (`always`: a plain hint is ignored inside this recursion, costing a call per field.)
    #[inline(always)]
    pub(crate) fn reduce_compact(
        &self,
        n: usize,
        lhs: &mut Doc,
        rhs: Doc,
        loc: Loc<'_>,
    ) -> Result<isize, ReduceError> {
        let node = &self.nodes[n];
        let n = if node.conditional.is_some() || node.deletes {
            if self.is_tombstone(n, lhs) {
                return Ok(replace(lhs, rhs));
            }
            self.resolve(n, &rhs)
        } else {
            n
        };
        match self.nodes[n].strategy {
            Strategy::LastWriteWins => Ok(replace(lhs, rhs)),
            Strategy::FirstWriteWins => Ok(0),
            Strategy::Sum => sum(lhs, rhs, loc),
            _ => self.reduce_compound(n, lhs, rhs, loc),
        }
    }

    /// [`Cx::reduce_compact`] of the strategies that compare, merge or defer to `Value`s.
    fn reduce_compound(
        &self,
        n: usize,
        lhs: &mut Doc,
        rhs: Doc,
        loc: Loc<'_>,
    ) -> Result<isize, ReduceError> {
        let node = &self.nodes[n];
        Ok(match &node.strategy {
            Strategy::Minimize { key } | Strategy::Maximize { key } if key.is_empty() => {
                let keep = match node.strategy {
                    Strategy::Minimize { .. } => Ordering::Less,
                    _ => Ordering::Greater,
                };
                match compare_scalars(&Scalar::of_doc(lhs), &Scalar::of_doc(&rhs)) {
                    Some(ord) if ord == keep => 0,
                    Some(_) => replace(lhs, rhs),
                    None => self.via_value(n, lhs, rhs, loc)?,
                }
            }
            Strategy::Merge { key } if key.is_empty() => match (lhs, rhs) {
                (Doc::Object(l), Doc::Object(r)) => self.merge_fields(n, l, r, loc)?,
                (Doc::Array(l), Doc::Array(r)) => self.merge_items(n, l, r, loc)?,
                // An object or array of another type than the left replaces it.
                (lhs, rhs @ (Doc::Object(_) | Doc::Array(_))) => replace(lhs, rhs),
                (lhs, rhs) => return Err(merge_error(lhs, &rhs, loc)),
            },
            _ => self.via_value(n, lhs, rhs, loc)?,
        })
    }

    /// The reference implementation, over a `Value` copy of both sides.
    fn via_value(
        &self,
        n: usize,
        lhs: &mut Doc,
        rhs: Doc,
        loc: Loc<'_>,
    ) -> Result<isize, ReduceError> {
        let before = lhs.heap_size();
        let mut value = Value::from(std::mem::take(lhs));
        let result = self.reduce(n, &mut value, Value::from(rhs), loc);
        *lhs = Doc::from(value);
        result.map(|()| lhs.heap_size() as isize - before as isize)
    }

    /// Union of two objects' properties, shared ones reduced with their own strategy. Both
    /// sides are sorted by name, so one forward walk pairs them.
    fn merge_fields(
        &self,
        n: usize,
        l: &mut Box<[Field]>,
        r: Box<[Field]>,
        loc: Loc<'_>,
    ) -> Result<isize, ReduceError> {
        let node = &self.nodes[n];
        // Names only `r` has, rare once a key's document has its shape: no `Vec` until one.
        let mut added: Option<Vec<Field>> = None;
        let mut delta = 0;
        let mut left = l.iter_mut().peekable();
        // Both sorted by name as well: the schema's properties pair up in the same walk.
        let mut listed = node.properties.iter().peekable();
        for Field { name, value: rv } in r {
            // Read once (a `Str` decodes its length), for the pairing, the schema and `loc`.
            let key = name.as_str();
            if let Some(lf) = next_named(&mut left, key.as_bytes(), |f| f.name.as_bytes()) {
                let child = match next_named(&mut listed, key.as_bytes(), |(n, _)| n.as_bytes()) {
                    Some(&(_, child)) => child,
                    None => node.unlisted_property(key),
                };
                delta += self.reduce_compact(child, &mut lf.value, rv, Loc::Prop(&loc, key))?;
            } else {
                let field = Field { name, value: rv };
                delta += field.heap_size() as isize;
                added.get_or_insert_default().push(field);
            }
        }
        if let Some(mut added) = added {
            let mut fields = std::mem::take(l).into_vec();
            delta -= block_size::<Field>(fields.len()) as isize;
            fields.append(&mut added);
            fields.sort_unstable_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()));
            delta += block_size::<Field>(fields.len()) as isize;
            *l = fields.into_boxed_slice();
        }
        Ok(delta)
    }

    /// Arrays index by index; items beyond the left's end are appended.
    fn merge_items(
        &self,
        n: usize,
        l: &mut Box<[Doc]>,
        r: Box<[Doc]>,
        loc: Loc<'_>,
    ) -> Result<isize, ReduceError> {
        let node = &self.nodes[n];
        let r_len = r.len();
        let mut r = r.into_iter();
        let mut delta = 0;
        for (i, lv) in l.iter_mut().enumerate() {
            let Some(rv) = r.next() else { break };
            delta += self.reduce_compact(node.item(i), lv, rv, Loc::Item(&loc, i))?;
        }
        if r_len > l.len() {
            let mut items = std::mem::take(l).into_vec();
            delta -= block_size::<Doc>(items.len()) as isize;
            for item in r {
                delta += item.heap_size() as isize;
                items.push(item);
            }
            delta += block_size::<Doc>(items.len()) as isize;
            *l = items.into_boxed_slice();
        }
        Ok(delta)
    }
}

/// `*lhs = rhs`, returning the change of the heap estimate.
#[inline(always)]
fn replace(lhs: &mut Doc, rhs: Doc) -> isize {
    let old = std::mem::replace(lhs, rhs);
    lhs.heap_size() as isize - old.release() as isize
}

fn merge_error(lhs: &Doc, rhs: &Doc, loc: Loc<'_>) -> ReduceError {
    let (l, r) = (Value::from(lhs.clone()), Value::from(rhs.clone()));
    error(loc, MERGE_NEEDS_COMPOSITES, &l, &r)
}

/// Inline for what counters mostly are, two non-negative integers: one checked addition.
/// Returns the change of `lhs`'s heap estimate (a string total may own a block).
#[inline(always)]
fn sum(lhs: &mut Doc, rhs: Doc, loc: Loc<'_>) -> Result<isize, ReduceError> {
    if let (Doc::PosInt(l), Doc::PosInt(r)) = (&mut *lhs, &rhs)
        && let Some(total) = l.checked_add(*r)
    {
        *l = total;
        rhs.release();
        return Ok(0);
    }
    sum_numbers(lhs, rhs, loc)
}

/// [`sum`] of any two numbers or numeric strings ([`number`]).
fn sum_numbers(lhs: &mut Doc, rhs: Doc, loc: Loc<'_>) -> Result<isize, ReduceError> {
    let (Some(l), Some(r)) = (Addend::of_doc(lhs), Addend::of_doc(&rhs)) else {
        let l = Value::from(lhs.clone());
        return Err(error(loc, NOT_NUMBERS, &l, &Value::from(rhs)));
    };
    match number::add(l, r) {
        Ok(total) => Ok(replace(lhs, total.into_doc())),
        Err(overflow) => {
            let l = Value::from(lhs.clone());
            Err(error(loc, &overflow.reason(), &l, &Value::from(rhs)))
        }
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
