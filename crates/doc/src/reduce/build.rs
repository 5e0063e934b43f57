//! Compiles the `reduce` annotations of a JSON Schema into a [`Reducer`] node arena.
//!
//! Each schema location becomes one node, memoized by its location (`#/properties/a`),
//! so a `$ref` cycle compiles to a cycle of node indices instead of unrolling forever.
//!
//! Precedence, Flow's rule: every subschema that the right-hand (later) value validates
//! against contributes its annotation, in this order, and the last one wins: the
//! location's own keywords, its local `$ref` target (`#/$defs/...`, any `#/...`
//! pointer), its `allOf` members in order, then the conditional ones the value
//! validates against: `anyOf` and `oneOf` branches in order, then `if` with `then`
//! (or `else` when `if` does not validate). Children from several sources for one
//! property are folded the same way into a fresh node (memoized by the pair). So a
//! `oneOf` branch's `reduce` overrides its parent's own (Flow's resettable counter).
//!
//! Conditionals cost nothing where there are none. A location with conditional
//! subschemas gets a [`Conditional`]: its tests (compiled subschemas, see
//! `schema/condition.rs`) and, precomputed here, the folded node for every combination
//! of verdicts, so a reduction runs the tests and indexes. A picked node may have
//! conditionals of its own (an `if` inside a `then`); that nesting is bounded by
//! [`MAX_NESTING`] and the tests of one location by [`MAX_TESTS`], each a
//! [`SchemaError`] naming the location beyond it.
//!
//! A schema that is only a `$ref` (plus keywords irrelevant to reductions) shares its
//! target's node, which is how recursive schemas compile to cycles. Folding a location
//! still being compiled contributes nothing: that happens for a `$ref` cycle mixed with
//! reduction keywords at one location (`a: {allOf: [{$ref: a}]}`, or recursion through a
//! `$ref` written beside `properties`); put such keywords in the target instead.
//! Not followed: remote and anchor `$ref`s.

use super::{Annotation, Conditional, DEFAULT_NODE, Node, Reducer, Strategy};
use crate::schema::{SchemaError, condition};
use regex::Regex;
use serde_json::Value;
use std::collections::HashMap;

/// Conditional subschemas (tests) one location may have: their verdicts index a table of
/// `2^MAX_TESTS` precomputed nodes, so more would cost memory exponentially.
pub(crate) const MAX_TESTS: usize = 8;

/// How deep conditionals may nest within one location (`then: {if: ...}`), which also
/// bounds resolving a node at reduction time.
pub(crate) const MAX_NESTING: usize = 8;

/// Compiles the reduction tree of `root`, a whole collection schema.
pub(crate) fn build(root: &Value) -> Result<Reducer, SchemaError> {
    let mut builder = Builder {
        root,
        prefix_items: crate::schema::dialect(root) == jsonschema::Draft::Draft202012,
        nodes: vec![Node::default()],
        done: vec![true],
        conds: vec![Vec::new()],
        origin: vec!["#".to_string()],
        nesting: vec![0],
        tests: Vec::new(),
        test_index: HashMap::new(),
        by_location: HashMap::new(),
        folded: HashMap::new(),
    };
    let top = builder.build(root, "#".to_string())?;
    builder.precompute_outcomes()?;
    builder.mark_deleting_and_finishing();
    Ok(Reducer::from_nodes(builder.nodes, top))
}

/// One conditional of a location, before its outcomes are precomputed: when test
/// `test` admits the right-hand value, node `valid` applies, else node `invalid`.
#[derive(Clone, Copy)]
struct Cond {
    test: usize,
    valid: usize,
    invalid: usize,
}

struct Builder<'s> {
    root: &'s Value,
    /// The dialect spells tuple items `prefixItems` (2020-12), not array-form `items`.
    prefix_items: bool,
    nodes: Vec<Node>,
    /// `done[i]` once `nodes[i]` holds its final contents.
    done: Vec<bool>,
    /// The conditionals of each node, in precedence order (later wins).
    conds: Vec<Vec<Cond>>,
    /// Where each node came from, for errors.
    origin: Vec<String>,
    /// How many conditionals were resolved to reach each node.
    nesting: Vec<usize>,
    /// Locations of the tests, compiled once every node is built.
    tests: Vec<String>,
    test_index: HashMap<String, usize>,
    by_location: HashMap<String, usize>,
    folded: HashMap<(usize, usize), usize>,
}

fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// A `$ref` to a JSON pointer within this schema (`#` or `#/...`).
fn is_local(reference: &str) -> bool {
    reference == "#" || reference.starts_with("#/")
}

/// Gives `node` the strategy and options of `annotation`.
fn annotate(node: &mut Node, annotation: Annotation) {
    node.strategy = annotation.strategy;
    node.annotated = true;
    node.delete = annotation.delete;
    node.non_associative = !annotation.associative;
}

fn invalid(location: &str, reason: impl Into<String>) -> SchemaError {
    SchemaError::Reduce {
        location: location.to_string(),
        reason: reason.into(),
    }
}

impl<'s> Builder<'s> {
    fn reserve(&mut self, origin: &str, nesting: usize) -> usize {
        self.nodes.push(Node::default());
        self.done.push(false);
        self.conds.push(Vec::new());
        self.origin.push(origin.to_string());
        self.nesting.push(nesting);
        self.nodes.len() - 1
    }

    fn finish(&mut self, index: usize, node: Node) -> usize {
        self.nodes[index] = node;
        self.done[index] = true;
        index
    }

    fn build(&mut self, schema: &'s Value, location: String) -> Result<usize, SchemaError> {
        if let Some(index) = self.by_location.get(&location) {
            return Ok(*index);
        }
        let Value::Object(keywords) = schema else {
            return Ok(DEFAULT_NODE); // `true` / `false` schemas say nothing about reductions.
        };
        if let Some(reference) = self.alias_of(keywords) {
            // A plain `$ref` is its target: share its node, even while it is being built.
            let (target, at) = self.resolve(reference, &location)?;
            let index = self.build(target, at)?;
            self.by_location.insert(location, index);
            return Ok(index);
        }
        let index = self.reserve(&location, 0);
        self.by_location.insert(location.clone(), index);
        let mut node = Node::default();
        let mut conds = Vec::new();

        if let Some(annotation) = keywords.get("reduce") {
            let at = format!("{location}/reduce");
            let annotation = Annotation::parse(annotation).map_err(|why| invalid(&at, why))?;
            annotate(&mut node, annotation);
        }
        if let Some(Value::Object(properties)) = keywords.get("properties") {
            for (name, sub) in properties {
                let child = self.build(sub, format!("{location}/properties/{}", escape(name)))?;
                self.add_property(&mut node, name.clone(), child)?;
            }
        }
        if let Some(Value::Object(patterns)) = keywords.get("patternProperties") {
            for (pattern, sub) in patterns {
                let at = format!("{location}/patternProperties/{}", escape(pattern));
                let re = Regex::new(pattern)
                    .map_err(|err| invalid(&at, format!("pattern not supported: {err}")))?;
                let child = self.build(sub, at)?;
                self.add_pattern(&mut node, re, child)?;
            }
        }
        if let Some(sub) = keywords.get("additionalProperties") {
            let child = self.build(sub, format!("{location}/additionalProperties"))?;
            node.additional = self.union_opt(node.additional, child)?;
        }
        // Tuple items as the schema's dialect spells them (`schema::dialect`, as the
        // validator reads them): 2020-12 `prefixItems` then `items`; 2019-09 and before,
        // array-form `items` then `additionalItems`.
        let (prefix, rest) = if self.prefix_items {
            let prefix = match keywords.get("prefixItems") {
                Some(Value::Array(prefix)) => Some(("prefixItems", prefix)),
                _ => None,
            };
            (prefix, keywords.get("items").map(|sub| ("items", sub)))
        } else {
            match keywords.get("items") {
                Some(Value::Array(prefix)) => (
                    Some(("items", prefix)),
                    keywords
                        .get("additionalItems")
                        .map(|sub| ("additionalItems", sub)),
                ),
                Some(sub) => (None, Some(("items", sub))),
                None => (None, None),
            }
        };
        if let Some((word, prefix)) = prefix {
            for (i, sub) in prefix.iter().enumerate() {
                let child = self.build(sub, format!("{location}/{word}/{i}"))?;
                self.add_prefix_item(&mut node, i, child)?;
            }
        }
        if let Some((word, sub)) = rest {
            let child = self.build(sub, format!("{location}/{word}"))?;
            node.items = self.union_opt(node.items, child)?;
        }
        if let Some(reference) = keywords
            .get("$ref")
            .and_then(Value::as_str)
            .filter(|r| is_local(r))
        {
            let (target, at) = self.resolve(reference, &location)?;
            let included = self.build(target, at)?;
            self.fold(&mut node, &mut conds, included)?;
        }
        if let Some(Value::Array(all)) = keywords.get("allOf") {
            for (i, sub) in all.iter().enumerate() {
                let included = self.build(sub, format!("{location}/allOf/{i}"))?;
                self.fold(&mut node, &mut conds, included)?;
            }
        }
        for word in ["anyOf", "oneOf"] {
            if let Some(Value::Array(branches)) = keywords.get(word) {
                for (i, sub) in branches.iter().enumerate() {
                    let at = format!("{location}/{word}/{i}");
                    let branch = self.build(sub, at.clone())?;
                    self.add_cond(&mut conds, at, branch, DEFAULT_NODE);
                }
            }
        }
        if let Some(test) = keywords.get("if") {
            let at = format!("{location}/if");
            let mut valid = self.build(test, at.clone())?;
            if let Some(then) = keywords.get("then") {
                let then = self.build(then, format!("{location}/then"))?;
                valid = self.union(valid, then)?;
            }
            let invalid = match keywords.get("else") {
                Some(other) => self.build(other, format!("{location}/else"))?,
                None => DEFAULT_NODE,
            };
            self.add_cond(&mut conds, at, valid, invalid);
        }
        self.conds[index] = conds;
        Ok(self.finish(index, node))
    }

    /// Adds a conditional tested by the subschema at `location`, unless neither outcome
    /// says anything about reductions.
    fn add_cond(&mut self, conds: &mut Vec<Cond>, location: String, valid: usize, invalid: usize) {
        if self.is_silent(valid) && self.is_silent(invalid) {
            return;
        }
        let next = self.tests.len();
        let test = *self.test_index.entry(location.clone()).or_insert(next);
        if test == next {
            self.tests.push(location);
        }
        conds.push(Cond {
            test,
            valid,
            invalid,
        });
    }

    /// Node `i` is complete and says nothing: folding it changes nothing.
    fn is_silent(&self, i: usize) -> bool {
        let node = &self.nodes[i];
        self.done[i]
            && !node.annotated
            && node.properties.is_empty()
            && node.patterns.is_empty()
            && node.additional.is_none()
            && node.prefix_items.is_empty()
            && node.items.is_none()
            && self.conds[i].is_empty()
    }

    /// Gives every node with conditionals its [`Conditional`]: for each combination of
    /// verdicts, the node folding its unconditional part with the picked outcomes (whose
    /// own conditionals it inherits, resolved in turn: nodes added here are visited too).
    fn precompute_outcomes(&mut self) -> Result<(), SchemaError> {
        let mut pending = Vec::new();
        let mut i = 0;
        while i < self.nodes.len() {
            let conds = self.conds[i].clone();
            if !conds.is_empty() {
                let at = self.origin[i].clone();
                if conds.len() > MAX_TESTS {
                    return Err(invalid(
                        &at,
                        format!(
                            "{} conditional subschemas (anyOf/oneOf branches, if) with reduce \
                             annotations at one location, more than {MAX_TESTS}: nest some \
                             of them in a subschema",
                            conds.len()
                        ),
                    ));
                }
                if self.nesting[i] >= MAX_NESTING {
                    return Err(invalid(
                        &at,
                        format!(
                            "conditionals with reduce annotations nest deeper than {MAX_NESTING}"
                        ),
                    ));
                }
                let mut outcomes = Vec::with_capacity(1 << conds.len());
                for mask in 0..1usize << conds.len() {
                    let mut node = self.nodes[i].clone();
                    let mut inherited = Vec::new();
                    for (bit, cond) in conds.iter().enumerate() {
                        let picked = match mask >> bit & 1 {
                            1 => cond.valid,
                            _ => cond.invalid,
                        };
                        self.fold(&mut node, &mut inherited, picked)?;
                    }
                    let outcome = self.reserve(&at, self.nesting[i] + 1);
                    self.conds[outcome] = inherited;
                    outcomes.push(self.finish(outcome, node));
                }
                pending.push((
                    i,
                    conds.iter().map(|c| c.test).collect::<Vec<_>>(),
                    outcomes,
                ));
            }
            i += 1;
        }
        let tests = condition::compile(self.root, &self.tests)?;
        for (i, test_ids, outcomes) in pending {
            self.nodes[i].conditional = Some(Box::new(Conditional {
                tests: test_ids.into_iter().map(|t| tests[t].clone()).collect(),
                outcomes,
            }));
        }
        Ok(())
    }

    /// Sets [`Node::deletes`] and [`Node::finishes`] where they hold: a fixpoint, since
    /// the arena may be cyclic.
    fn mark_deleting_and_finishing(&mut self) {
        loop {
            let mut changed = false;
            for i in 0..self.nodes.len() {
                let node = &self.nodes[i];
                let outcomes = || node.conditional.iter().flat_map(|c| c.outcomes.iter());
                let deletes = node.delete || outcomes().any(|o| self.nodes[*o].deletes);
                let reaches = |j: &usize| self.nodes[*j].finishes;
                let finishes = node.delete
                    || matches!(node.strategy, Strategy::Set { .. })
                    || node.properties.iter().map(|(_, c)| c).any(reaches)
                    || node.patterns.iter().map(|(_, c)| c).any(reaches)
                    || node.additional.iter().any(reaches)
                    || node.prefix_items.iter().any(reaches)
                    || node.items.iter().any(reaches)
                    || outcomes().any(reaches);
                if (deletes, finishes) != (node.deletes, node.finishes) {
                    self.nodes[i].deletes = deletes;
                    self.nodes[i].finishes = finishes;
                    changed = true;
                }
            }
            if !changed {
                return;
            }
        }
    }

    /// The local `$ref` of a schema whose other keywords say nothing about reductions.
    fn alias_of(&self, keywords: &'s serde_json::Map<String, Value>) -> Option<&'s str> {
        const SHAPING: [&str; 13] = [
            "reduce",
            "properties",
            "patternProperties",
            "additionalProperties",
            "prefixItems",
            "items",
            "additionalItems",
            "allOf",
            "anyOf",
            "oneOf",
            "if",
            "then",
            "else",
        ];
        let reference = keywords.get("$ref")?.as_str().filter(|r| is_local(r))?;
        (!SHAPING.iter().any(|k| keywords.contains_key(*k))).then_some(reference)
    }

    /// The schema a local `$ref` found at `location` points to, and its location.
    fn resolve(&self, reference: &str, location: &str) -> Result<(&'s Value, String), SchemaError> {
        match self.root.pointer(&reference[1..]) {
            Some(target) => Ok((target, reference.to_string())),
            None => Err(invalid(
                &format!("{location}/$ref"),
                format!("$ref {reference:?} points nowhere"),
            )),
        }
    }

    fn add_property(
        &mut self,
        node: &mut Node,
        name: String,
        child: usize,
    ) -> Result<(), SchemaError> {
        match node.properties.binary_search_by(|(p, _)| p.cmp(&name)) {
            Ok(i) => node.properties[i].1 = self.union(node.properties[i].1, child)?,
            Err(i) => node.properties.insert(i, (name, child)),
        }
        Ok(())
    }

    fn add_pattern(&mut self, node: &mut Node, re: Regex, child: usize) -> Result<(), SchemaError> {
        match node
            .patterns
            .iter()
            .position(|(p, _)| p.as_str() == re.as_str())
        {
            Some(i) => node.patterns[i].1 = self.union(node.patterns[i].1, child)?,
            None => node.patterns.push((re, child)),
        }
        Ok(())
    }

    fn add_prefix_item(
        &mut self,
        node: &mut Node,
        i: usize,
        child: usize,
    ) -> Result<(), SchemaError> {
        match node.prefix_items.get(i) {
            Some(existing) => node.prefix_items[i] = self.union(*existing, child)?,
            None => node.prefix_items.push(child),
        }
        Ok(())
    }

    fn union_opt(
        &mut self,
        existing: Option<usize>,
        child: usize,
    ) -> Result<Option<usize>, SchemaError> {
        Ok(Some(match existing {
            Some(existing) => self.union(existing, child)?,
            None => child,
        }))
    }

    /// A node saying everything `a` says, then whatever `b` adds.
    fn union(&mut self, a: usize, b: usize) -> Result<usize, SchemaError> {
        if a == b || b == DEFAULT_NODE {
            return Ok(a);
        }
        if a == DEFAULT_NODE {
            return Ok(b);
        }
        if let Some(index) = self.folded.get(&(a, b)) {
            return Ok(*index);
        }
        let origin = self.origin[a].clone();
        let index = self.reserve(&origin, self.nesting[a].max(self.nesting[b]));
        self.folded.insert((a, b), index);
        let mut node = self.nodes[a].clone();
        let mut conds = self.conds[a].clone();
        self.fold(&mut node, &mut conds, b)?;
        self.conds[index] = conds;
        Ok(self.finish(index, node))
    }

    /// Folds what node `from` says into `node` (whose conditionals are `conds`): `from`'s
    /// annotation wins, and its conditionals come after `node`'s.
    fn fold(
        &mut self,
        node: &mut Node,
        conds: &mut Vec<Cond>,
        from: usize,
    ) -> Result<(), SchemaError> {
        if !self.done[from] {
            return Ok(());
        }
        conds.extend_from_slice(&self.conds[from]);
        let from = self.nodes[from].clone();
        if from.annotated {
            node.strategy = from.strategy;
            node.annotated = true;
            node.delete = from.delete;
            node.non_associative = from.non_associative;
        }
        for (name, child) in from.properties {
            self.add_property(node, name, child)?;
        }
        for (re, child) in from.patterns {
            self.add_pattern(node, re, child)?;
        }
        if let Some(child) = from.additional {
            node.additional = self.union_opt(node.additional, child)?;
        }
        for (i, child) in from.prefix_items.into_iter().enumerate() {
            self.add_prefix_item(node, i, child)?;
        }
        if let Some(child) = from.items {
            node.items = self.union_opt(node.items, child)?;
        }
        Ok(())
    }
}
