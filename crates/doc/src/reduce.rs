//! Reduction strategies: how two documents with the same key combine into one.
//!
//! A [`Reducer`] is a tree of strategies mirroring the document's shape, compiled from the
//! `reduce` annotations of a collection schema (see [`build`]). Nodes live in one shared
//! arena and refer to their children by index, which lets recursive schemas (`$ref` cycles)
//! compile to a finite, cyclic tree:
//!
//! ```text
//!  node ─┬─ properties (sorted, exact names)   ─▶ node
//!        ├─ patternProperties (regex, in order) ─▶ node
//!        ├─ additionalProperties               ─▶ node
//!        ├─ prefixItems[i]                     ─▶ node
//!        └─ items                              ─▶ node      (absent ⇒ node 0: lastWriteWins)
//! ```
//!
//! `reduce(lhs, rhs)` folds `rhs` (which came later) into `lhs` in place. The node that
//! applies at a location is picked by `rhs`'s value there when the schema has conditional
//! subschemas (`if`/`then`/`else`, `anyOf`, `oneOf`; see [`build`] for precedence):
//!
//! - `lastWriteWins` (default) takes `rhs` whatever its type; `firstWriteWins` keeps `lhs`.
//! - `sum` adds numbers: integers with exact `i64`/`u64` arithmetic (overflow is an error),
//!   any float makes a float, and numbers written as strings add exactly into a string
//!   (Flow's arbitrary precision; see [`number`]).
//! - `minimize` / `maximize` keep the lesser / greater in JSON order
//!   (null < bool < numbers < strings < arrays < objects, numbers compared numerically
//!   across integer and float); ties take `rhs`. With a `key` (a missing key sorts before
//!   `null`), ties are deep-merged and a winning `rhs` must be an object or array, as
//!   Flow merges it onto nothing: a scalar there is an error.
//! - `merge` reduces objects property by property with each child's own strategy and
//!   arrays index by index, or with a `key` as a sorted merge of two key-sorted arrays. An
//!   object or array onto a value of another type replaces it; a scalar right side is an
//!   error (Flow's: it cannot be merged into anything).
//! - `append` concatenates arrays; onto `null` it is a no-op (the left stays `null`), and
//!   any other pair is an error. `set` is described in [`set`].
//!
//! Every error names the location (a JSON pointer) and quotes both sides; the combiner
//! reports it as `CombineError::Reduce` and the transaction fails.
//! - `delete: true` (lastWriteWins, firstWriteWins, merge) marks the reduced value as a
//!   deletion: kept as a tombstone by partial reductions, removed from its parent (or the
//!   whole document, at the root) by the finish of a full one ([`Reducer::finish`]). A
//!   reduction onto a tombstone takes the right-hand value as it is.
//! - `associative: false` (lastWriteWins, firstWriteWins): the combiner never combines
//!   the binding's new documents with each other (see `combine`).
//!
//! [`Reducer::reduce_docs`] is the combiner's path: both sides are compact [`Doc`]s, the
//! right one moved into the left; `reduce/compact.rs` says which strategies it runs
//! natively and how the others defer to [`Reducer::reduce`]'s definitions.
//!
//! Invariants: every strategy is associative (`(a·b)·c == a·(b·c)`), which the combiner
//! relies on to reduce in any grouping, except where a location changes type between
//! documents (a merge replaced, or a tombstone recreated, by an object or array of
//! another type; Flow refuses such a partial reduction and keeps both documents for the
//! full one, Sluice replaces the value in both); properties present on one side only are
//! kept. Locations without
//! conditionals or deletions cost one branch more than before. Reducing scalars never
//! allocates (the sum of two integers is computed in an `i128` and
//! stored back into `lhs`); the location of an error is tracked as a stack-allocated
//! linked list and only rendered into a string when an error is returned. After an error
//! `lhs` is unspecified: the caller must discard it (the transaction fails).

pub(crate) mod build;
mod compact;
mod finish;
mod idempotent;
mod number;
mod set;

use crate::Pointer;
use crate::compact::Doc;
use crate::schema::condition::Test;
use number::Addend;
use regex::Regex;
use serde_json::{Map, Number, Value};
use std::cmp::Ordering;
use std::fmt;
use std::sync::Arc;

/// How two documents (or two values at one location) combine.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Strategy {
    #[default]
    LastWriteWins,
    FirstWriteWins,
    Sum,
    Minimize {
        key: Vec<crate::Pointer>,
    },
    Maximize {
        key: Vec<crate::Pointer>,
    },
    Merge {
        key: Vec<crate::Pointer>,
    },
    Append,
    Set {
        key: Vec<crate::Pointer>,
    },
}

/// A parsed `reduce` annotation: a strategy and its options.
///
/// | strategy | options |
/// |---|---|
/// | `lastWriteWins`, `firstWriteWins` | `delete`, `associative` |
/// | `merge` | `key`, `delete` |
/// | `minimize`, `maximize`, `set` | `key` |
/// | `sum`, `append` | none |
#[derive(Debug, Clone, PartialEq)]
pub struct Annotation {
    pub strategy: Strategy,
    /// `delete: true`: a location whose reduced value is reduced by this annotation is
    /// deleted by a full reduction (see [`Reducer::finish`]).
    pub delete: bool,
    /// `associative: false`: documents of one key must not be combined with each other
    /// before a full reduction onto the key's left-most document.
    pub associative: bool,
}

impl Annotation {
    /// Parses a `reduce` annotation such as `{"strategy": "merge", "key": ["/id"]}`.
    /// The error says what is wrong; the caller adds where.
    pub fn parse(annotation: &Value) -> Result<Annotation, String> {
        let Value::Object(fields) = annotation else {
            return Err(format!(
                "expected an object {{strategy, ...options}}, got {annotation}"
            ));
        };
        let name = match fields.get("strategy") {
            Some(Value::String(name)) => name.as_str(),
            Some(other) => return Err(format!("strategy must be a string, got {other}")),
            None => return Err("missing \"strategy\"".to_string()),
        };
        let options: &[&str] = match name {
            "lastWriteWins" | "firstWriteWins" => &["delete", "associative"],
            "merge" => &["key", "delete"],
            "minimize" | "maximize" | "set" => &["key"],
            "sum" | "append" => &[],
            other => {
                return Err(format!(
                    "unknown strategy {other:?} (expected one of lastWriteWins, firstWriteWins, \
                     sum, minimize, maximize, merge, append, set)"
                ));
            }
        };
        if let Some(unknown) = fields
            .keys()
            .find(|k| *k != "strategy" && !options.contains(&k.as_str()))
        {
            let expected = match options {
                [] => "none".to_string(),
                _ => options.join(", "),
            };
            return Err(format!(
                "strategy {name:?} has no option {unknown:?} (its options: {expected})"
            ));
        }
        let flag = |option: &str, default: bool| match fields.get(option) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(format!("{option} must be true or false, got {other}")),
        };
        let key = match fields.get("key") {
            None => Vec::new(),
            Some(Value::Array(items)) => parse_key(items)?,
            Some(other) => {
                return Err(format!(
                    "key must be an array of JSON pointers, got {other}"
                ));
            }
        };
        let strategy = match name {
            "minimize" => Strategy::Minimize { key },
            "maximize" => Strategy::Maximize { key },
            "merge" => Strategy::Merge { key },
            "set" => Strategy::Set { key },
            "lastWriteWins" => Strategy::LastWriteWins,
            "firstWriteWins" => Strategy::FirstWriteWins,
            "sum" => Strategy::Sum,
            _ => Strategy::Append,
        };
        Ok(Annotation {
            strategy,
            delete: flag("delete", false)?,
            associative: flag("associative", true)?,
        })
    }
}

fn parse_key(items: &[Value]) -> Result<Vec<Pointer>, String> {
    items
        .iter()
        .map(|item| match item {
            Value::String(s) => Pointer::parse(s).map_err(|err| err.to_string()),
            other => Err(format!(
                "key must be an array of JSON pointers, got item {other}"
            )),
        })
        .collect()
}

/// One location of the strategy tree. Children are indices into the arena; index
/// [`DEFAULT_NODE`] is the lastWriteWins leaf used wherever the schema says nothing.
#[derive(Debug, Clone, Default)]
pub(crate) struct Node {
    pub(crate) strategy: Strategy,
    /// The strategy came from an annotation (not the default).
    pub(crate) annotated: bool,
    /// The annotation says `delete: true`.
    pub(crate) delete: bool,
    /// The annotation says `associative: false`.
    pub(crate) non_associative: bool,
    /// Sorted by name.
    pub(crate) properties: Vec<(String, usize)>,
    pub(crate) patterns: Vec<(Regex, usize)>,
    pub(crate) additional: Option<usize>,
    pub(crate) prefix_items: Vec<usize>,
    pub(crate) items: Option<usize>,
    /// Subschemas whose verdict on the right-hand value picks the node that applies here
    /// instead of this one (`None` for most locations: no test on the hot path).
    pub(crate) conditional: Option<Box<Conditional>>,
    /// This node or one it may resolve to says `delete: true`: a value here may be a
    /// tombstone, which a reduction replaces (a deleted value is no value).
    pub(crate) deletes: bool,
    /// This node, a node below it or one it may resolve to deletes or is a `set`: the
    /// finish of a full reduction must look here ([`Reducer::finish`]).
    pub(crate) finishes: bool,
}

/// The conditional subschemas of one location, compiled (see `reduce/build.rs`).
#[derive(Debug, Clone)]
pub(crate) struct Conditional {
    pub(crate) tests: Vec<Test>,
    /// The node that applies for each combination of verdicts: index bit `i` is set when
    /// `tests[i]` admits the value. Precomputed, so a reduction only runs the tests.
    pub(crate) outcomes: Vec<usize>,
}

impl Conditional {
    fn pick(&self, value: &Doc) -> usize {
        let mask = (self.tests.iter().enumerate())
            .filter(|(_, test)| test.admits(value))
            .fold(0, |mask, (i, _)| mask | 1 << i);
        self.outcomes[mask]
    }
}

pub(crate) const DEFAULT_NODE: usize = 0;

impl Node {
    fn property(&self, name: &str) -> usize {
        if let Ok(i) = self
            .properties
            .binary_search_by(|(p, _)| p.as_str().cmp(name))
        {
            return self.properties[i].1;
        }
        self.unlisted_property(name)
    }

    /// The child of a property not named in `properties`.
    fn unlisted_property(&self, name: &str) -> usize {
        if let Some((_, child)) = self.patterns.iter().find(|(re, _)| re.is_match(name)) {
            return *child;
        }
        self.additional.unwrap_or(DEFAULT_NODE)
    }

    fn item(&self, index: usize) -> usize {
        match self.prefix_items.get(index) {
            Some(child) => *child,
            None => self.items.unwrap_or(DEFAULT_NODE),
        }
    }
}

/// The tree of strategies located in a schema, mirroring the document's shape.
#[derive(Debug, Clone)]
pub struct Reducer {
    nodes: Arc<[Node]>,
    root: usize,
    /// No location says `associative: false`.
    associative: bool,
}

#[derive(Debug, thiserror::Error)]
#[error("while reducing {}: {reason}", if .location.is_empty() { "the document root" } else { .location.as_str() })]
pub struct ReduceError {
    /// JSON pointer of the location being reduced (`""` for the whole document).
    pub location: String,
    pub reason: String,
}

impl Default for Reducer {
    /// lastWriteWins for the whole document: what a schema without annotations means.
    fn default() -> Self {
        Reducer::new(Strategy::LastWriteWins)
    }
}

impl Reducer {
    /// A reducer applying `strategy` at the root, with lastWriteWins everywhere below.
    pub fn new(strategy: Strategy) -> Self {
        let root = Node {
            strategy,
            annotated: true,
            ..Node::default()
        };
        Reducer::from_nodes(vec![Node::default(), root], 1)
    }

    /// `nodes[DEFAULT_NODE]` must be the default leaf and every child index in bounds.
    pub(crate) fn from_nodes(nodes: Vec<Node>, root: usize) -> Self {
        debug_assert!(nodes[DEFAULT_NODE].strategy == Strategy::LastWriteWins);
        Reducer {
            associative: !nodes.iter().any(|node| node.non_associative),
            nodes: nodes.into(),
            root,
        }
    }

    /// The strategy at the document root (before any conditional applies).
    pub fn strategy(&self) -> &Strategy {
        &self.nodes[self.root].strategy
    }

    /// Whether documents of one key may be combined with each other in any grouping: no
    /// location says `associative: false`.
    pub fn associative(&self) -> bool {
        self.associative
    }

    /// The last step of a full reduction, on its result: drops the `intersect` and
    /// `remove` terms of sets (applied already, or to nothing) and removes every location
    /// whose value a `delete: true` annotation applies to from its parent object or array.
    /// Returns whether the root itself is deleted (then `doc` is unspecified). A partial
    /// reduction skips this step, so that its deletions stay as tombstones.
    pub fn finish(&self, doc: &mut Doc) -> bool {
        let cx = Cx {
            nodes: &self.nodes,
            full: true,
        };
        cx.finish(self.root, doc)
    }

    /// Reduces `rhs` into `lhs` in place (`lhs` came first). `full` says `lhs` is a complete
    /// document (e.g. loaded from the store), which lets `set` apply and drop removals.
    pub fn reduce(&self, lhs: &mut Value, rhs: Value, full: bool) -> Result<(), ReduceError> {
        let cx = Cx {
            nodes: &self.nodes,
            full,
        };
        cx.reduce(self.root, lhs, rhs, Loc::Root)
    }

    /// [`Reducer::reduce`] of compact documents, the right one moved into the left: the
    /// combiner's hot path (see [`compact`]). Same results and errors as `reduce`. Returns
    /// how many bytes `lhs`'s [`Doc::heap_size`] grew by (negative: shrank).
    pub fn reduce_docs(&self, lhs: &mut Doc, rhs: Doc, full: bool) -> Result<isize, ReduceError> {
        let cx = Cx {
            nodes: &self.nodes,
            full,
        };
        cx.reduce_compact(self.root, lhs, rhs, Loc::Root)
    }
}

/// A location in the document being reduced, rendered only for errors.
#[derive(Clone, Copy)]
pub(crate) enum Loc<'a> {
    Root,
    Prop(&'a Loc<'a>, &'a str),
    Item(&'a Loc<'a>, usize),
}

impl fmt::Display for Loc<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Loc::Root => Ok(()),
            Loc::Prop(parent, name) => {
                write!(f, "{parent}/")?;
                for c in name.chars() {
                    match c {
                        '~' => f.write_str("~0")?,
                        '/' => f.write_str("~1")?,
                        c => write!(f, "{c}")?,
                    }
                }
                Ok(())
            }
            Loc::Item(parent, index) => write!(f, "{parent}/{index}"),
        }
    }
}

/// Values quoted in errors are cut to this many characters: enough to recognise a value,
/// short enough that a large document does not flood the log.
const QUOTE_LIMIT: usize = 120;

fn quote(value: &Value) -> String {
    let mut s = value.to_string();
    if let Some((cut, _)) = s.char_indices().nth(QUOTE_LIMIT) {
        s.truncate(cut);
        s.push('…');
    }
    s
}

pub(crate) fn error(loc: Loc<'_>, what: &str, lhs: &Value, rhs: &Value) -> ReduceError {
    ReduceError {
        location: loc.to_string(),
        reason: format!("{what} (left: {}, right: {})", quote(lhs), quote(rhs)),
    }
}

/// Which outcomes of a sorted join to keep.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Join {
    /// Everything: one-sided items as they are, matched pairs reduced.
    Union,
    /// Only matched pairs, reduced.
    Intersection,
}

/// The reduction context: the node arena and whether the left side is a full document.
pub(crate) struct Cx<'n> {
    nodes: &'n [Node],
    pub(crate) full: bool,
}

impl Cx<'_> {
    pub(crate) fn reduce(
        &self,
        n: usize,
        lhs: &mut Value,
        rhs: Value,
        loc: Loc<'_>,
    ) -> Result<(), ReduceError> {
        let node = &self.nodes[n];
        let n = if node.conditional.is_some() || node.deletes {
            // `Doc::from` copies the subtree: only where a tombstone is possible.
            if node.deletes && self.is_tombstone(n, &Doc::from(&*lhs)) {
                *lhs = rhs;
                return Ok(());
            }
            self.resolve(n, &Doc::from(&rhs))
        } else {
            n
        };
        let node = &self.nodes[n];
        match &node.strategy {
            Strategy::LastWriteWins => *lhs = rhs,
            Strategy::FirstWriteWins => {}
            Strategy::Sum => sum(lhs, &rhs, loc)?,
            Strategy::Append => match (&mut *lhs, rhs) {
                (Value::Array(l), Value::Array(r)) => l.extend(r),
                // A null left side stays null: appending onto it is a no-op (Flow).
                (Value::Null, Value::Array(_)) => {}
                (l, r) => return Err(error(loc, APPEND_NEEDS_ARRAYS, l, &r)),
            },
            Strategy::Minimize { key } => self.min_max(n, key, lhs, rhs, loc, Ordering::Less)?,
            Strategy::Maximize { key } => self.min_max(n, key, lhs, rhs, loc, Ordering::Greater)?,
            Strategy::Merge { key } => self.merge(n, key, lhs, rhs, loc)?,
            Strategy::Set { key } => set::reduce(self, n, key, lhs, rhs, loc)?,
        }
        Ok(())
    }

    /// Keeps `lhs` when it compares as `keep` against `rhs`; takes `rhs` when it compares
    /// the other way or ties with no key; deep-merges a tie on the key.
    fn min_max(
        &self,
        n: usize,
        key: &[Pointer],
        lhs: &mut Value,
        rhs: Value,
        loc: Loc<'_>,
        keep: Ordering,
    ) -> Result<(), ReduceError> {
        match compare_by_key(key, lhs, &rhs) {
            ord if ord == keep => Ok(()),
            _ if key.is_empty() => {
                *lhs = rhs;
                Ok(())
            }
            Ordering::Equal => self.merge(n, &[], lhs, rhs, loc),
            // With a key the kept value is a document to merge into: a right side that
            // wins must be one (Flow merges it onto nothing).
            _ if !is_composite(&rhs) => Err(error(loc, MERGE_NEEDS_COMPOSITES, lhs, &rhs)),
            _ => {
                *lhs = rhs;
                Ok(())
            }
        }
    }

    fn merge(
        &self,
        n: usize,
        key: &[Pointer],
        lhs: &mut Value,
        rhs: Value,
        loc: Loc<'_>,
    ) -> Result<(), ReduceError> {
        match (&mut *lhs, rhs) {
            (Value::Object(l), Value::Object(r)) => self.join_objects(n, l, r, Join::Union, loc),
            (Value::Array(l), Value::Array(r)) if key.is_empty() => {
                let node = &self.nodes[n];
                for (i, rv) in r.into_iter().enumerate() {
                    match l.get_mut(i) {
                        Some(lv) => self.reduce(node.item(i), lv, rv, Loc::Item(&loc, i))?,
                        None => l.push(rv),
                    }
                }
                Ok(())
            }
            (Value::Array(l), Value::Array(r)) => {
                let left = std::mem::take(l);
                *l = self.join_sorted(n, key, left, r, Join::Union, loc)?;
                Ok(())
            }
            // An object or array onto a value of another type replaces it (Flow: in a full
            // reduction; a partial one is not associative there, see the module docs).
            (l, r) if is_composite(&r) => {
                *l = r;
                Ok(())
            }
            (l, r) => Err(error(loc, MERGE_NEEDS_COMPOSITES, l, &r)),
        }
    }

    /// Joins the properties of two objects, reducing each shared property with its own
    /// child strategy.
    pub(crate) fn join_objects(
        &self,
        n: usize,
        l: &mut Map<String, Value>,
        r: Map<String, Value>,
        join: Join,
        loc: Loc<'_>,
    ) -> Result<(), ReduceError> {
        let node = &self.nodes[n];
        if join == Join::Intersection {
            l.retain(|k, _| r.contains_key(k));
        }
        for (k, rv) in r {
            match l.get_mut(&k) {
                Some(lv) => self.reduce(node.property(&k), lv, rv, Loc::Prop(&loc, &k))?,
                None if join == Join::Union => {
                    l.insert(k, rv);
                }
                None => {}
            }
        }
        Ok(())
    }

    /// Joins two arrays sorted by `key` into one sorted array, reducing items whose keys
    /// are equal with the item strategy.
    pub(crate) fn join_sorted(
        &self,
        n: usize,
        key: &[Pointer],
        l: Vec<Value>,
        r: Vec<Value>,
        join: Join,
        loc: Loc<'_>,
    ) -> Result<Vec<Value>, ReduceError> {
        let node = &self.nodes[n];
        let mut out = Vec::with_capacity(match join {
            Join::Union => l.len() + r.len(),
            Join::Intersection => l.len().min(r.len()),
        });
        let (mut l, mut r) = (l.into_iter().peekable(), r.into_iter().peekable());
        let union = join == Join::Union;
        loop {
            let ord = match (l.peek(), r.peek()) {
                (Some(lv), Some(rv)) => compare_by_key(key, lv, rv),
                (Some(_), None) if union => Ordering::Less,
                (None, Some(_)) if union => Ordering::Greater,
                _ => break,
            };
            match ord {
                Ordering::Less => out.extend(l.next().filter(|_| union)),
                Ordering::Greater => out.extend(r.next().filter(|_| union)),
                Ordering::Equal => {
                    let (mut lv, rv) = (l.next().unwrap_or_default(), r.next().unwrap_or_default());
                    let index = out.len();
                    self.reduce(node.item(index), &mut lv, rv, Loc::Item(&loc, index))?;
                    out.push(lv);
                }
            }
        }
        Ok(out)
    }

    pub(crate) fn node(&self, n: usize) -> &Node {
        &self.nodes[n]
    }

    /// The node that applies at `n` to the right-hand value `rhs`: `n` itself, or what its
    /// conditional subschemas pick (which may be conditional in turn, to a depth bounded
    /// when the schema compiled).
    /// Whether `value` at node `n` is deleted (a tombstone of a partial reduction): a
    /// reduction onto it takes the right-hand value as it is, as onto no value.
    pub(crate) fn is_tombstone(&self, n: usize, value: &Doc) -> bool {
        self.nodes[n].deletes && self.nodes[self.resolve(n, value)].delete
    }

    #[inline(never)]
    pub(crate) fn resolve(&self, mut n: usize, rhs: &Doc) -> usize {
        while let Some(conditional) = &self.nodes[n].conditional {
            n = conditional.pick(rhs);
        }
        n
    }
}

fn sum(lhs: &mut Value, rhs: &Value, loc: Loc<'_>) -> Result<(), ReduceError> {
    let (Some(l), Some(r)) = (Addend::of_value(lhs), Addend::of_value(rhs)) else {
        return Err(error(loc, NOT_NUMBERS, lhs, rhs));
    };
    match number::add(l, r) {
        Ok(total) => {
            *lhs = total.into_value();
            Ok(())
        }
        Err(overflow) => Err(error(loc, &overflow.reason(), lhs, rhs)),
    }
}

/// Why `sum` refuses two values, one of them no number.
const NOT_NUMBERS: &str = "sum needs two numbers (or numeric strings)";

/// Why `merge` (or a keyed minimize/maximize, which merges) refuses a right-hand value.
pub(crate) const MERGE_NEEDS_COMPOSITES: &str =
    "merge needs an object or an array on the right (a scalar cannot be merged into the left)";

/// Why `append` refuses two values.
const APPEND_NEEDS_ARRAYS: &str = "append needs two arrays (or a null left side)";

/// An object or an array: what `merge` reduces into.
fn is_composite(v: &Value) -> bool {
    matches!(v, Value::Object(_) | Value::Array(_))
}

fn as_integer(n: &Number) -> Option<i128> {
    n.as_u64()
        .map(i128::from)
        .or_else(|| n.as_i64().map(i128::from))
}

/// Orders `lhs` and `rhs` by the values at `key` (a missing value sorts first), or
/// as whole values when `key` is empty.
pub(crate) fn compare_by_key(key: &[Pointer], lhs: &Value, rhs: &Value) -> Ordering {
    if key.is_empty() {
        return compare(lhs, rhs);
    }
    for ptr in key {
        let ord = match (ptr.query(lhs), ptr.query(rhs)) {
            (Some(l), Some(r)) => compare(l, r),
            (l, r) => l.is_some().cmp(&r.is_some()),
        };
        if ord != Ordering::Equal {
            return ord;
        }
    }
    Ordering::Equal
}

/// The JSON total order: null < booleans < numbers < strings < arrays < objects.
/// Numbers compare numerically (exactly, across integers and floats); strings by bytes;
/// arrays element-wise; objects by their properties in name order, then their values.
pub fn compare(lhs: &Value, rhs: &Value) -> Ordering {
    match (lhs, rhs) {
        (Value::Bool(l), Value::Bool(r)) => l.cmp(r),
        (Value::Number(l), Value::Number(r)) => compare_numbers(l, r),
        (Value::String(l), Value::String(r)) => l.cmp(r),
        (Value::Array(l), Value::Array(r)) => l
            .iter()
            .zip(r)
            .map(|(l, r)| compare(l, r))
            .find(|o| o.is_ne())
            .unwrap_or_else(|| l.len().cmp(&r.len())),
        (Value::Object(l), Value::Object(r)) => {
            let (l, r) = (sorted_fields(l), sorted_fields(r));
            l.iter()
                .zip(&r)
                .map(|((lk, lv), (rk, rv))| lk.cmp(rk).then_with(|| compare(lv, rv)))
                .find(|o| o.is_ne())
                .unwrap_or_else(|| l.len().cmp(&r.len()))
        }
        _ => rank(lhs).cmp(&rank(rhs)),
    }
}

/// The position of a value's type in the JSON total order of [`compare`].
fn rank(v: &Value) -> u8 {
    match v {
        Value::Null => 0,
        Value::Bool(_) => 1,
        Value::Number(_) => 2,
        Value::String(_) => 3,
        Value::Array(_) => 4,
        Value::Object(_) => 5,
    }
}

fn sorted_fields(m: &Map<String, Value>) -> Vec<(&String, &Value)> {
    let mut fields: Vec<(&String, &Value)> = m.iter().collect();
    fields.sort_unstable_by(|a, b| a.0.cmp(b.0));
    fields
}

fn compare_numbers(l: &Number, r: &Number) -> Ordering {
    match (as_integer(l), as_integer(r)) {
        (Some(l), Some(r)) => l.cmp(&r),
        (Some(i), None) => compare_integer_float(i, r.as_f64().unwrap_or_default()),
        (None, Some(i)) => compare_integer_float(i, l.as_f64().unwrap_or_default()).reverse(),
        (None, None) => l
            .as_f64()
            .partial_cmp(&r.as_f64())
            .unwrap_or(Ordering::Equal),
    }
}

/// Exact comparison of an integer (within ±2^64) with a finite float.
fn compare_integer_float(i: i128, f: f64) -> Ordering {
    const LIMIT: f64 = 1.8446744073709552e19; // 2^64, beyond every i64 and u64.
    if f >= LIMIT {
        return Ordering::Less;
    }
    if f <= -LIMIT {
        return Ordering::Greater;
    }
    let whole = f.trunc();
    // `whole` is an integer of magnitude below 2^64, so the cast is exact.
    i.cmp(&(whole as i128))
        .then_with(|| 0.0.partial_cmp(&(f - whole)).unwrap_or(Ordering::Equal))
}
