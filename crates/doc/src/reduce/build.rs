//! Compiles the `reduce` annotations of a JSON Schema into a [`Reducer`] node arena.
//!
//! Each schema location becomes one node, memoized by its location (`#/properties/a`),
//! so a `$ref` cycle compiles to a cycle of node indices instead of unrolling forever.
//! A node folds together, in this order of precedence, its own keywords, its local
//! `$ref` target (`#/$defs/...`, `#/definitions/...`, any `#/...` pointer) and its
//! `allOf` members: the first `reduce` annotation found wins, and children from several
//! sources for one property are folded into a fresh node (memoized by the pair).
//! A schema that is only a `$ref` (plus keywords irrelevant to reductions) shares its
//! target's node, which is how recursive schemas compile to cycles. Folding a location
//! still being compiled contributes nothing: that happens for a `$ref` cycle mixed with
//! reduction keywords at one location (`a: {allOf: [{$ref: a}]}`, or recursion through a
//! `$ref` written beside `properties`); put such keywords in the target instead.
//! Not followed: remote and anchor `$ref`s, `anyOf`/`oneOf`/`if` branches (an
//! annotation there would depend on which branch validates).

use super::{DEFAULT_NODE, Node, Reducer, Strategy};
use crate::schema::SchemaError;
use regex::Regex;
use serde_json::Value;
use std::collections::HashMap;

/// Compiles the reduction tree of `root`, a whole collection schema.
pub(crate) fn build(root: &Value) -> Result<Reducer, SchemaError> {
    let mut builder = Builder {
        root,
        nodes: vec![Node::default()],
        done: vec![true],
        by_location: HashMap::new(),
        folded: HashMap::new(),
    };
    let top = builder.build(root, "#".to_string())?;
    Ok(Reducer::from_nodes(builder.nodes, top))
}

struct Builder<'s> {
    root: &'s Value,
    nodes: Vec<Node>,
    /// `done[i]` once `nodes[i]` holds its final contents.
    done: Vec<bool>,
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

fn invalid(location: &str, reason: impl Into<String>) -> SchemaError {
    SchemaError::Reduce {
        location: location.to_string(),
        reason: reason.into(),
    }
}

impl<'s> Builder<'s> {
    fn reserve(&mut self) -> usize {
        self.nodes.push(Node::default());
        self.done.push(false);
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
        let index = self.reserve();
        self.by_location.insert(location.clone(), index);
        let mut node = Node::default();

        if let Some(annotation) = keywords.get("reduce") {
            let at = format!("{location}/reduce");
            node.strategy =
                Strategy::from_annotation(annotation).map_err(|why| invalid(&at, why))?;
            node.annotated = true;
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
        let prefix = match (keywords.get("prefixItems"), keywords.get("items")) {
            (Some(Value::Array(prefix)), _) => Some(("prefixItems", prefix)),
            (_, Some(Value::Array(prefix))) => Some(("items", prefix)), // draft 2019 and before
            _ => None,
        };
        if let Some((word, prefix)) = prefix {
            for (i, sub) in prefix.iter().enumerate() {
                let child = self.build(sub, format!("{location}/{word}/{i}"))?;
                self.add_prefix_item(&mut node, i, child)?;
            }
        }
        let rest = match (keywords.get("items"), keywords.get("additionalItems")) {
            (Some(sub @ Value::Object(_)), _) => Some(("items", sub)),
            (Some(Value::Array(_)), Some(sub)) => Some(("additionalItems", sub)),
            _ => None,
        };
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
            self.fold(&mut node, included)?;
        }
        if let Some(Value::Array(all)) = keywords.get("allOf") {
            for (i, sub) in all.iter().enumerate() {
                let included = self.build(sub, format!("{location}/allOf/{i}"))?;
                self.fold(&mut node, included)?;
            }
        }
        Ok(self.finish(index, node))
    }

    /// The local `$ref` of a schema whose other keywords say nothing about reductions.
    fn alias_of(&self, keywords: &'s serde_json::Map<String, Value>) -> Option<&'s str> {
        const SHAPING: [&str; 8] = [
            "reduce",
            "properties",
            "patternProperties",
            "additionalProperties",
            "prefixItems",
            "items",
            "additionalItems",
            "allOf",
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
        let index = self.reserve();
        self.folded.insert((a, b), index);
        let mut node = self.nodes[a].clone();
        self.fold(&mut node, b)?;
        Ok(self.finish(index, node))
    }

    /// Folds what node `from` says into `node`, which takes precedence.
    fn fold(&mut self, node: &mut Node, from: usize) -> Result<(), SchemaError> {
        if !self.done[from] {
            return Ok(());
        }
        let from = self.nodes[from].clone();
        if !node.annotated && from.annotated {
            node.strategy = from.strategy;
            node.annotated = true;
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
