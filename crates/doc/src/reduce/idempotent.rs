//! Which reductions survive a replay: what admission asks of a binding whose source
//! may read input again or whose store may apply a transaction again.

use super::{Reducer, Strategy};

impl Reducer {
    /// The first location whose reduction is not idempotent under replay, and its
    /// strategy (`("/total", "sum")`; `""` is the document root, `*` any property or
    /// item, a pattern its regex); `None` when every reduction is. A store that reduced
    /// a suffix of its input twice (an at-least-once source read it again, a
    /// non-transactional store applied a transaction again) holds what one reading
    /// would have left, except where `sum` or `append` count it twice: lastWriteWins,
    /// firstWriteWins, minimize, maximize, and merge and set of those are idempotent.
    /// Conditional subschemas' strategies count wherever they may apply.
    pub fn not_idempotent(&self) -> Option<(String, &'static str)> {
        let mut seen = vec![false; self.nodes.len()];
        let mut stack = vec![(self.root, String::new())];
        while let Some((at, path)) = stack.pop() {
            if std::mem::replace(&mut seen[at], true) {
                continue;
            }
            let node = &self.nodes[at];
            match node.strategy {
                Strategy::Sum => return Some((path, "sum")),
                Strategy::Append => return Some((path, "append")),
                _ => {}
            }
            let child =
                |name: &str| format!("{path}/{}", name.replace('~', "~0").replace('/', "~1"));
            let mut children: Vec<(usize, String)> = Vec::new();
            children.extend(node.properties.iter().map(|(name, c)| (*c, child(name))));
            children.extend(node.patterns.iter().map(|(re, c)| (*c, child(re.as_str()))));
            children.extend(node.additional.map(|c| (c, child("*"))));
            children.extend(
                node.prefix_items
                    .iter()
                    .enumerate()
                    .map(|(i, c)| (*c, child(&i.to_string()))),
            );
            children.extend(node.items.map(|c| (c, child("*"))));
            if let Some(conditional) = &node.conditional {
                children.extend(conditional.outcomes.iter().map(|c| (*c, path.clone())));
            }
            // Reversed onto the stack: the first location in the schema's order is
            // named first.
            stack.extend(children.into_iter().rev());
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use crate::Schema;
    use serde_json::{Value, json};

    fn blocker(schema: Value) -> Option<(String, &'static str)> {
        Schema::compile(&schema).unwrap().reducer().not_idempotent()
    }

    fn at(strategy: &str) -> Value {
        json!({"reduce": {"strategy": strategy}})
    }

    #[test]
    fn overwriting_and_extreme_strategies_and_merges_of_them_are_idempotent() {
        assert_eq!(
            blocker(json!({"type": "object"})),
            None,
            "lastWriteWins by default"
        );
        for strategy in [
            "lastWriteWins",
            "firstWriteWins",
            "minimize",
            "maximize",
            "merge",
        ] {
            let schema = json!({"type": "object", "reduce": {"strategy": "merge"},
                                "properties": {"a": at(strategy)}});
            assert_eq!(blocker(schema), None, "{strategy}");
        }
        let set = json!({"type": "object", "properties": {"tags": {
            "type": "object", "reduce": {"strategy": "set"},
            "properties": {"add": {"type": "array"}}}}});
        assert_eq!(blocker(set), None);
    }

    #[test]
    fn a_sum_or_an_append_is_named_by_its_location() {
        let schema = json!({"type": "object", "reduce": {"strategy": "merge"}, "properties": {
            "name": at("lastWriteWins"),
            "totals": {"type": "object", "reduce": {"strategy": "merge"},
                       "additionalProperties": at("sum")},
            "a/b": at("append")}});
        assert_eq!(blocker(schema), Some(("/a~1b".to_string(), "append")));
        let schema = json!({"type": "object", "reduce": {"strategy": "merge"},
            "properties": {"totals": {"type": "object", "reduce": {"strategy": "merge"},
                                       "additionalProperties": at("sum")}}});
        assert_eq!(blocker(schema), Some(("/totals/*".to_string(), "sum")));
        assert_eq!(blocker(at("sum")), Some((String::new(), "sum")));
        let items =
            json!({"type": "array", "reduce": {"strategy": "merge"}, "items": at("append")});
        assert_eq!(blocker(items), Some(("/*".to_string(), "append")));
    }

    #[test]
    fn a_conditional_strategy_counts_wherever_it_may_apply() {
        let schema = json!({"type": "object", "reduce": {"strategy": "merge"}, "properties": {
            "n": {"if": {"type": "integer"}, "then": at("sum"), "else": at("maximize")}}});
        assert_eq!(blocker(schema), Some(("/n".to_string(), "sum")));
    }
}
