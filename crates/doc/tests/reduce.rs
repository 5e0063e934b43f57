//! Reduction strategies, specified by example and by associativity properties.

use proptest::prelude::*;
use serde_json::{Value, json};
use sluice_doc::compact::Doc;
use sluice_doc::{ReduceError, Reducer, Schema};

fn reducer(schema: Value) -> Reducer {
    Schema::compile(&schema)
        .expect("schema compiles")
        .reducer()
        .clone()
}

/// Folds `docs` left to right with the reductions of `schema`.
fn fold(schema: Value, docs: Vec<Value>) -> Result<Value, ReduceError> {
    let reducer = reducer(schema);
    let mut docs = docs.into_iter();
    let mut acc = docs.next().expect("at least one document");
    for doc in docs {
        reducer.reduce(&mut acc, doc, false)?;
    }
    Ok(acc)
}

/// The full reduction of `docs`, the first the left-most whole document, finished:
/// `None` when it deletes the document.
fn fold_full(schema: Value, docs: Vec<Value>) -> Result<Option<Value>, ReduceError> {
    let reducer = reducer(schema);
    let mut docs = docs.into_iter();
    let mut acc = Doc::from(docs.next().expect("at least one document"));
    for doc in docs {
        reducer.reduce_docs(&mut acc, Doc::from(doc), true)?;
    }
    Ok((!reducer.finish(&mut acc)).then(|| Value::from(acc)))
}

fn at(strategy: &str) -> Value {
    json!({"reduce": {"strategy": strategy}})
}

/// A root `merge` with the given property schemas.
fn merged(properties: Value) -> Value {
    json!({"type": "object", "reduce": {"strategy": "merge"}, "properties": properties})
}

#[test]
fn no_annotation_means_last_write_wins_whatever_the_type() {
    let out = fold(
        json!({}),
        vec![json!({"a": 1, "b": 2}), json!("x"), json!([1])],
    )
    .unwrap();
    assert_eq!(out, json!([1]));
    // Nested locations without annotations also take the right-hand value.
    let out = fold(
        merged(json!({})),
        vec![json!({"a": {"x": 1}}), json!({"a": {"y": 2}})],
    )
    .unwrap();
    assert_eq!(out, json!({"a": {"y": 2}}));
}

#[test]
fn first_write_wins_keeps_the_left() {
    let out = fold(
        merged(json!({"first": at("firstWriteWins")})),
        vec![json!({"first": "a"}), json!({"first": "b", "other": 1})],
    )
    .unwrap();
    assert_eq!(out, json!({"first": "a", "other": 1}));
}

#[test]
fn sum_of_integers_is_exact_beyond_float_precision() {
    let big = 9_007_199_254_740_993u64; // 2^53 + 1: not representable as f64.
    let out = fold(at("sum"), vec![json!(big), json!(1)]).unwrap();
    assert_eq!(out, json!(9_007_199_254_740_994u64));
    assert!(out.is_u64());
    let out = fold(at("sum"), vec![json!(-5), json!(3), json!(4)]).unwrap();
    assert_eq!(out, json!(2));
    let out = fold(at("sum"), vec![json!(u64::MAX), json!(-1)]).unwrap();
    assert_eq!(out, json!(u64::MAX - 1));
}

#[test]
fn sum_of_integer_and_float_is_a_float() {
    let out = fold(at("sum"), vec![json!(1), json!(0.5)]).unwrap();
    assert_eq!(out, json!(1.5));
    let out = fold(at("sum"), vec![json!(1.5), json!(1.5)]).unwrap();
    assert!(out.is_f64(), "{out}");
}

#[test]
fn sum_overflow_is_an_error() {
    let err = fold(at("sum"), vec![json!(u64::MAX), json!(1)]).unwrap_err();
    assert!(err.reason.contains("overflow"), "{err}");
    let err = fold(at("sum"), vec![json!(i64::MIN), json!(-1)]).unwrap_err();
    assert!(err.reason.contains("overflow"), "{err}");
    let err = fold(at("sum"), vec![json!(f64::MAX), json!(f64::MAX)]).unwrap_err();
    assert!(err.reason.contains("overflow"), "{err}");
}

#[test]
fn sum_over_a_string_names_the_pointer_and_both_values() {
    let schema = merged(json!({"views": at("sum")}));
    let err = fold(schema, vec![json!({"views": 3}), json!({"views": "many"})]).unwrap_err();
    assert_eq!(err.location, "/views");
    let message = err.to_string();
    assert!(message.starts_with("while reducing /views: "), "{message}");
    assert!(
        message.contains("3") && message.contains("\"many\""),
        "{message}"
    );
}

#[test]
fn errors_quote_long_values_truncated() {
    let long = "x".repeat(10_000);
    let err = fold(at("sum"), vec![json!(1), json!(long)]).unwrap_err();
    assert!(err.reason.len() < 400, "{} bytes", err.reason.len());
    assert!(err.reason.contains('…'));
}

#[test]
fn errors_at_the_root_say_so_and_escape_pointer_tokens() {
    let err = fold(at("append"), vec![json!(1), json!(2)]).unwrap_err();
    assert_eq!(err.location, "");
    assert!(
        err.to_string()
            .starts_with("while reducing the document root: "),
        "{err}"
    );
    let schema = json!({"reduce": {"strategy": "merge"}, "additionalProperties": at("sum")});
    let err = fold(schema, vec![json!({"a/b": 1}), json!({"a/b": null})]).unwrap_err();
    assert_eq!(err.location, "/a~1b");
}

#[test]
fn minimize_and_maximize_follow_json_type_order() {
    let ordered = vec![
        json!(null),
        json!(false),
        json!(true),
        json!(-1),
        json!(2.5),
        json!(3),
        json!(""),
        json!("a"),
        json!([]),
        json!([1]),
        json!({}),
        json!({"a": 1}),
    ];
    for (i, lower) in ordered.iter().enumerate() {
        for higher in &ordered[i + 1..] {
            for (l, r) in [(lower, higher), (higher, lower)] {
                let min = fold(at("minimize"), vec![l.clone(), r.clone()]).unwrap();
                let max = fold(at("maximize"), vec![l.clone(), r.clone()]).unwrap();
                assert_eq!((&min, &max), (lower, higher), "{l} vs {r}");
            }
        }
    }
}

#[test]
fn numbers_compare_numerically_across_integer_and_float() {
    assert_eq!(
        fold(at("maximize"), vec![json!(2), json!(2.5)]).unwrap(),
        json!(2.5)
    );
    assert_eq!(
        fold(at("maximize"), vec![json!(3), json!(2.5)]).unwrap(),
        json!(3)
    );
    assert_eq!(
        fold(at("minimize"), vec![json!(-3), json!(-2.5)]).unwrap(),
        json!(-3)
    );
    assert_eq!(
        fold(at("minimize"), vec![json!(u64::MAX), json!(1e30)]).unwrap(),
        json!(u64::MAX)
    );
}

#[test]
fn min_max_ties_take_the_right_hand_value() {
    assert_eq!(
        fold(at("maximize"), vec![json!(1), json!(1.0)]).unwrap(),
        json!(1.0)
    );
    assert_eq!(
        fold(at("minimize"), vec![json!(1.0), json!(1)]).unwrap(),
        json!(1)
    );
}

#[test]
fn min_max_with_a_key_compare_by_key_and_deep_merge_ties() {
    let schema = json!({
        "reduce": {"strategy": "maximize", "key": ["/v"]},
        "properties": {"n": at("sum")},
    });
    let out = fold(
        schema.clone(),
        vec![
            json!({"v": 1, "n": 1, "a": "x"}),
            json!({"v": 1, "n": 2, "b": "y"}),
            json!({"v": 0, "n": 100}),
        ],
    )
    .unwrap();
    assert_eq!(out, json!({"v": 1, "n": 3, "a": "x", "b": "y"}));
    let out = fold(
        schema,
        vec![json!({"v": 1, "n": 1}), json!({"v": 2, "n": 5})],
    )
    .unwrap();
    assert_eq!(out, json!({"v": 2, "n": 5}));
}

#[test]
fn merge_reduces_objects_deeply_and_keeps_one_sided_properties() {
    let schema = merged(json!({
        "stats": {"reduce": {"strategy": "merge"}, "properties": {"views": at("sum"), "last": at("maximize")}},
        "name": {"type": "string"},
    }));
    let out = fold(
        schema,
        vec![
            json!({"stats": {"views": 1, "last": "2024-01-02"}, "left": true}),
            json!({"stats": {"views": 2, "last": "2024-01-01", "new": 1}, "name": "n"}),
        ],
    )
    .unwrap();
    assert_eq!(
        out,
        json!({"stats": {"views": 3, "last": "2024-01-02", "new": 1}, "left": true, "name": "n"})
    );
}

#[test]
fn merge_of_arrays_goes_index_by_index() {
    let schema = json!({"reduce": {"strategy": "merge"}, "items": at("sum")});
    let out = fold(schema, vec![json!([1, 2]), json!([10, 20, 30])]).unwrap();
    assert_eq!(out, json!([11, 22, 30]));
}

#[test]
fn merge_of_arrays_with_a_key_is_a_sorted_merge() {
    let schema = json!({
        "reduce": {"strategy": "merge", "key": ["/id"]},
        "items": {"reduce": {"strategy": "merge"}, "properties": {"n": at("sum")}},
    });
    let out = fold(
        schema,
        vec![
            json!([{"id": 1, "n": 1}, {"id": 3, "n": 1}]),
            json!([{"id": 2, "n": 5}, {"id": 3, "n": 2, "x": true}]),
        ],
    )
    .unwrap();
    assert_eq!(
        out,
        json!([{"id": 1, "n": 1}, {"id": 2, "n": 5}, {"id": 3, "n": 3, "x": true}])
    );
}

#[test]
fn merge_of_a_scalar_right_side_is_an_error() {
    for (lhs, rhs) in [
        (json!("a"), json!("text")),
        (json!(1), json!(2.5)),
        (json!({"a": 1}), json!("text")),
        (json!([1]), json!(null)),
    ] {
        let err = fold(at("merge"), vec![lhs, rhs]).unwrap_err();
        assert!(
            err.reason
                .contains("merge needs an object or an array on the right"),
            "{err}"
        );
    }
}

#[test]
fn a_merge_whose_right_side_is_an_object_or_array_of_another_type_replaces_the_value() {
    let out = fold(at("merge"), vec![json!([1]), json!({"a": 1})]).unwrap();
    assert_eq!(out, json!({"a": 1}));
    let out = fold(at("merge"), vec![json!("text"), json!([1])]).unwrap();
    assert_eq!(out, json!([1]));
    let out = fold_full(at("merge"), vec![json!(null), json!({"a": 1})]).unwrap();
    assert_eq!(out, Some(json!({"a": 1})));
}

#[test]
fn append_concatenates_arrays_only() {
    let out = fold(at("append"), vec![json!([1]), json!([2, 3]), json!([])]).unwrap();
    assert_eq!(out, json!([1, 2, 3]));
    let err = fold(at("append"), vec![json!([1]), json!({"a": 1})]).unwrap_err();
    assert!(err.reason.contains("append needs two arrays"), "{err}");
    // Appending onto null is a no-op (Flow); onto another scalar, an error.
    assert_eq!(
        fold(at("append"), vec![json!(null), json!([1])]).unwrap(),
        json!(null)
    );
    let err = fold(at("append"), vec![json!(0), json!([1])]).unwrap_err();
    assert!(err.reason.contains("append needs two arrays"), "{err}");
}

/// One step of a set fixture: reduce `rhs` into the accumulated left side.
fn set_steps(schema: Value, steps: Vec<(bool, Value, Value)>) {
    let reducer = reducer(schema);
    let mut acc = json!({});
    for (i, (full, rhs, expect)) in steps.into_iter().enumerate() {
        reducer.reduce(&mut acc, rhs, full).unwrap();
        assert_eq!(acc, expect, "step {i}");
    }
}

#[test]
fn set_of_objects_adds_intersects_and_removes_members() {
    let schema = json!({
        "reduce": {"strategy": "set"},
        "properties": {"add": {"additionalProperties": at("sum")}},
    });
    let (partial, full) = (false, true);
    set_steps(
        schema,
        vec![
            (partial, json!({"add": {"a": 1}}), json!({"add": {"a": 1}})),
            (
                partial,
                json!({"add": {"b": 1}}),
                json!({"add": {"a": 1, "b": 1}}),
            ),
            // Removal of a member takes it out of "add" and remembers it for older sets.
            (
                partial,
                json!({"remove": {"b": 0}, "add": {"c": 1, "a": 1}}),
                json!({"remove": {"b": 0}, "add": {"a": 2, "c": 1}}),
            ),
            (
                partial,
                json!({"remove": {"a": 0}, "add": {"a": 5}}),
                json!({"remove": {"a": 0, "b": 0}, "add": {"a": 5, "c": 1}}),
            ),
            // A full left side has nothing older to remove from: removals are dropped.
            (
                full,
                json!({"remove": {"z": 0}, "add": {"d": 1}}),
                json!({"add": {"a": 5, "c": 1, "d": 1}}),
            ),
            (
                partial,
                json!({"intersect": {"a": 0, "q": 0}}),
                json!({"intersect": {"a": 0, "q": 0}, "add": {"a": 5}}),
            ),
            (
                partial,
                json!({"add": {"a": 1, "q": 1}}),
                json!({"intersect": {"a": 0, "q": 0}, "add": {"a": 6, "q": 1}}),
            ),
            (
                partial,
                json!({"intersect": {"q": 0, "w": 0}}),
                json!({"intersect": {"q": 0}, "add": {"q": 1}}),
            ),
            (
                partial,
                json!({"remove": {"q": 0}}),
                json!({"intersect": {}, "add": {}}),
            ),
            (full, json!({"add": {"x": 1}}), json!({"add": {"x": 1}})),
        ],
    );
}

#[test]
fn tuple_items_are_read_in_the_schema_dialect() {
    let tuple = |schema: Value| fold(schema, vec![json!(["a", 1]), json!(["b", 2])]).unwrap();
    let positions = || json!([at("firstWriteWins"), at("sum")]);
    // No `$schema` reads as 2019-09: array-form `items`; `prefixItems` is no keyword there.
    let merge = json!({"strategy": "merge"});
    assert_eq!(
        tuple(json!({"reduce": merge, "items": positions()})),
        json!(["a", 3])
    );
    assert_eq!(
        tuple(json!({"reduce": merge, "prefixItems": positions()})),
        json!(["b", 2])
    );
    // A declared 2020-12 reads `prefixItems`.
    let modern = "https://json-schema.org/draft/2020-12/schema";
    assert_eq!(
        tuple(json!({"$schema": modern, "reduce": merge, "prefixItems": positions()})),
        json!(["a", 3])
    );
}

#[test]
fn set_of_arrays_keeps_members_sorted_by_key() {
    let schema = json!({
        "reduce": {"strategy": "set", "key": ["/0"]},
        "properties": {"add": {"items": {
            "reduce": {"strategy": "merge"},
            "items": [{"type": "integer"}, at("sum")],
        }}},
    });
    let (partial, full) = (false, true);
    set_steps(
        schema,
        vec![
            (
                partial,
                json!({"add": [[55, 1]]}),
                json!({"add": [[55, 1]]}),
            ),
            (
                partial,
                json!({"add": [[22, 1], [99, 1]]}),
                json!({"add": [[22, 1], [55, 1], [99, 1]]}),
            ),
            (
                partial,
                json!({"remove": [[99]], "add": [[55, 1]]}),
                json!({"remove": [[99]], "add": [[22, 1], [55, 2]]}),
            ),
            (full, json!({"remove": [[22]]}), json!({"add": [[55, 2]]})),
            (
                partial,
                json!({"intersect": [[11], [55]], "add": [[11, 1]]}),
                json!({"intersect": [[11], [55]], "add": [[11, 1], [55, 2]]}),
            ),
        ],
    );
}

#[test]
fn malformed_sets_are_errors() {
    let set = at("set");
    for (lhs, rhs) in [
        (json!({"add": {}}), json!({"intersect": {}, "remove": {}})),
        (json!({"add": {}}), json!({"add": []})),
        (json!({"add": {}}), json!({"other": {}})),
        (json!({"add": {}}), json!({"add": 1})),
        (json!({"add": {}}), json!([])),
    ] {
        let err = fold(set.clone(), vec![lhs.clone(), rhs.clone()]).unwrap_err();
        assert!(err.to_string().contains("set"), "{lhs} · {rhs}: {err}");
    }
}

#[test]
fn annotations_are_found_through_every_applicator() {
    let schema = json!({
        "$defs": {"counter": at("sum")},
        "definitions": {"tags": at("append")},
        "reduce": {"strategy": "merge"},
        "properties": {
            "byRef": {"$ref": "#/$defs/counter"},
            "byDefinitions": {"$ref": "#/definitions/tags"},
            "byAllOf": {"allOf": [{"type": "integer"}, at("maximize")]},
            "map": {"reduce": {"strategy": "merge"}, "additionalProperties": at("sum")},
            "patterned": {"reduce": {"strategy": "merge"}, "patternProperties": {"^n_": at("sum")}},
            "list": {"reduce": {"strategy": "merge"}, "items": at("sum")},
            "tuple": {"reduce": {"strategy": "merge"}, "items": [at("firstWriteWins"), at("sum")]},
        },
    });
    let out = fold(schema, vec![
        json!({"byRef": 1, "byDefinitions": [1], "byAllOf": 5, "map": {"k": 1}, "patterned": {"n_a": 1, "s": 1},
               "list": [1], "tuple": ["a", 1]}),
        json!({"byRef": 2, "byDefinitions": [2], "byAllOf": 3, "map": {"k": 2}, "patterned": {"n_a": 2, "s": 9},
               "list": [2], "tuple": ["b", 2]}),
    ])
    .unwrap();
    assert_eq!(
        out,
        json!({"byRef": 3, "byDefinitions": [1, 2], "byAllOf": 5, "map": {"k": 3}, "patterned": {"n_a": 3, "s": 9},
               "list": [3], "tuple": ["a", 3]})
    );
}

#[test]
fn recursive_schemas_reduce_at_every_depth() {
    let schema = json!({
        "$defs": {"tree": {
            "reduce": {"strategy": "merge"},
            "properties": {
                "count": at("sum"),
                "children": {"reduce": {"strategy": "merge"}, "additionalProperties": {"$ref": "#/$defs/tree"}},
            },
        }},
        "$ref": "#/$defs/tree",
    });
    let doc = json!({"count": 1, "children": {"a": {"count": 1, "children": {"b": {"count": 1, "children": {}}}}}});
    let out = fold(schema, vec![doc.clone(), doc]).unwrap();
    assert_eq!(
        out,
        json!({"count": 2, "children": {"a": {"count": 2, "children": {"b": {"count": 2, "children": {}}}}}})
    );
}

#[test]
fn annotations_apply_in_order_own_ref_all_of_and_the_last_one_wins() {
    let schema = json!({
        "$defs": {"n": at("sum")},
        "reduce": {"strategy": "merge"},
        "properties": {"n": {"$ref": "#/$defs/n", "allOf": [at("maximize")], "reduce": {"strategy": "append"}}},
    });
    let out = fold(schema, vec![json!({"n": 2}), json!({"n": 1})]).unwrap();
    assert_eq!(out, json!({"n": 2}));
}

// ---- Conditional annotations, deletions, full reductions (Flow's documented examples) ----

/// Flow's "reset-able counter" (reduction-strategies/composing-with-conditionals): a
/// `oneOf` over `action`; a branch's `reduce` overrides the root's own `merge`.
fn resettable_counter() -> Value {
    json!({
        "type": "object",
        "properties": {"key": {"type": "string"}, "value": {"type": "number"}},
        "required": ["key"],
        "oneOf": [
            {"required": ["action"], "properties": {"action": {"const": "reset"}}, "reduce": {"strategy": "lastWriteWins"}},
            {"required": ["action"], "properties": {
                "action": {"const": "sum", "reduce": {"strategy": "firstWriteWins"}},
                "value": {"reduce": {"strategy": "sum"}},
            }},
        ],
        "reduce": {"strategy": "merge"},
    })
}

/// RFC 7396 merge patch as a reduction: objects merge, `null` deletes, anything else
/// replaces (Flow's documented form, reduction-strategies/merge).
fn merge_patch() -> Value {
    json!({
        "$defs": {"mergePatch": {
            "if": {"type": "object"},
            "then": {"reduce": {"strategy": "merge"}, "additionalProperties": {"$ref": "#/$defs/mergePatch"}},
            "else": {
                "if": {"type": "null"},
                "then": {"reduce": {"strategy": "lastWriteWins", "delete": true}},
                "else": {"reduce": {"strategy": "lastWriteWins"}},
            },
        }},
        "$ref": "#/$defs/mergePatch",
    })
}

#[test]
fn a_resettable_counter_sums_until_a_reset_document() {
    let docs = vec![
        json!({"key": "k", "action": "sum", "value": 5}),
        json!({"key": "k", "action": "sum", "value": -1.25}),
    ];
    assert_eq!(
        fold(resettable_counter(), docs).unwrap(),
        json!({"key": "k", "action": "sum", "value": 3.75})
    );
    let docs = vec![
        json!({"key": "k", "action": "sum", "value": 5}),
        json!({"key": "k", "action": "reset", "value": 0}),
        json!({"key": "k", "action": "sum", "value": 1.5}),
    ];
    // The reset takes the whole document; the sum after it keeps its "reset" action.
    assert_eq!(
        fold(resettable_counter(), docs).unwrap(),
        json!({"key": "k", "action": "reset", "value": 1.5})
    );
}

#[test]
fn a_merge_patch_deletes_nulls_in_a_full_reduction_and_keeps_them_as_tombstones_in_a_partial_one() {
    let docs = || {
        vec![
            json!({"key": "k", "a": 1, "b": {"c": 1, "e": [1]}}),
            json!({"key": "k", "a": null, "b": {"c": null, "d": 2, "e": [2]}}),
        ]
    };
    assert_eq!(
        fold_full(merge_patch(), docs()).unwrap(),
        Some(json!({"key": "k", "b": {"d": 2, "e": [2]}}))
    );
    assert_eq!(
        fold(merge_patch(), docs()).unwrap(),
        json!({"key": "k", "a": null, "b": {"c": null, "d": 2, "e": [2]}})
    );
    // A tombstone of a partial reduction still deletes when a full one finishes.
    let partial = fold(
        merge_patch(),
        vec![json!({"b": {"c": null}}), json!({"a": null})],
    )
    .unwrap();
    let full = fold_full(
        merge_patch(),
        vec![json!({"key": "k", "a": 1, "b": {"c": 1}}), partial],
    )
    .unwrap();
    assert_eq!(full, Some(json!({"key": "k", "b": {}})));
    // The key's first document, left-most with nothing stored, is finished too.
    assert_eq!(
        fold_full(merge_patch(), vec![json!({"key": "k", "a": null})]).unwrap(),
        Some(json!({"key": "k"}))
    );
}

#[test]
fn a_root_that_reduces_to_deleted_deletes_the_document() {
    let schema = json!({
        "type": "object",
        "reduce": {"strategy": "merge"},
        "properties": {"n": at("sum")},
        "if": {"required": ["deleted"], "properties": {"deleted": {"const": true}}},
        "then": {"reduce": {"strategy": "lastWriteWins", "delete": true}},
    });
    let deleted = vec![json!({"k": 1, "n": 1}), json!({"k": 1, "deleted": true})];
    assert_eq!(fold_full(schema.clone(), deleted.clone()).unwrap(), None);
    // A partial reduction keeps the tombstone; a later document recreates it from nothing.
    assert_eq!(
        fold(schema.clone(), deleted).unwrap(),
        json!({"k": 1, "deleted": true})
    );
    let recreated = vec![
        json!({"k": 1, "n": 1}),
        json!({"k": 1, "deleted": true}),
        json!({"k": 1, "n": 2}),
    ];
    assert_eq!(
        fold_full(schema.clone(), recreated.clone()).unwrap(),
        Some(json!({"k": 1, "n": 2}))
    );
    assert_eq!(
        fold(schema, recreated[1..].to_vec()).unwrap(),
        json!({"k": 1, "n": 2})
    );
}

#[test]
fn delete_removes_array_items_and_first_write_wins_deletes_too() {
    let schema = json!({
        "reduce": {"strategy": "merge"},
        "items": {"if": {"type": "null"}, "then": {"reduce": {"strategy": "firstWriteWins", "delete": true}}},
    });
    assert_eq!(
        fold_full(schema, vec![json!([1, 2, 3]), json!([null, 5, null, null])]).unwrap(),
        Some(json!([1, 5, 3]))
    );
}

#[test]
fn if_then_else_any_of_and_nested_locations_pick_their_strategy_by_the_right_hand_value() {
    let schema = merged(json!({
        "n": {
            "if": {"type": "integer"}, "then": at("sum"), "else": at("lastWriteWins"),
        },
        "deep": {"reduce": {"strategy": "merge"}, "properties": {"m": {
            "anyOf": [{"type": "string", "reduce": {"strategy": "firstWriteWins"}}, {"type": "number", "reduce": {"strategy": "maximize"}}],
        }}},
    }));
    let docs = vec![
        json!({"n": 1, "deep": {"m": 3}}),
        json!({"n": 2, "deep": {"m": 1}}),
        json!({"n": 1.5, "deep": {"m": "x"}}),
        json!({"deep": {"m": "y"}}),
    ];
    // 1 + 2 by sum, then 1.5 by lastWriteWins; 3 kept by maximize of 1, then by
    // firstWriteWins of the strings.
    assert_eq!(
        fold(schema.clone(), docs).unwrap(),
        json!({"n": 1.5, "deep": {"m": 3}})
    );
    let docs = vec![
        json!({"deep": {"m": 1}}),
        json!({"deep": {"m": 3}}),
        json!({"deep": {"m": "x"}}),
    ];
    assert_eq!(fold(schema, docs).unwrap(), json!({"deep": {"m": 3}}));
}

#[test]
fn a_conditional_ref_resolves_against_the_root() {
    let schema = json!({
        "$defs": {"small": {"type": "integer", "maximum": 9}},
        "reduce": {"strategy": "merge"},
        "properties": {"n": {"if": {"$ref": "#/$defs/small"}, "then": at("sum")}},
    });
    assert_eq!(
        fold(schema.clone(), vec![json!({"n": 1}), json!({"n": 2})]).unwrap(),
        json!({"n": 3})
    );
    assert_eq!(
        fold(schema, vec![json!({"n": 1}), json!({"n": 20})]).unwrap(),
        json!({"n": 20})
    );
}

#[test]
fn too_many_conditionals_at_one_location_are_a_schema_error_naming_it() {
    let branches: Vec<Value> = (0..9)
        .map(|i| json!({"const": i, "reduce": {"strategy": "sum"}}))
        .collect();
    let err = Schema::compile(&json!({"properties": {"n": {"anyOf": branches}}})).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("#/properties/n") && text.contains("more than 8"),
        "{text}"
    );
}

#[test]
fn strategy_options_are_accepted_with_their_meaning_and_unknown_ones_name_the_location() {
    for annotation in [
        json!({"strategy": "lastWriteWins", "delete": true, "associative": false}),
        json!({"strategy": "firstWriteWins", "associative": true}),
        json!({"strategy": "merge", "key": ["/id"], "delete": false}),
        json!({"strategy": "set", "key": ["/id"]}),
    ] {
        Schema::compile(&json!({"reduce": annotation}))
            .unwrap_or_else(|e| panic!("{annotation}: {e}"));
    }
    assert!(
        !reducer(json!({"reduce": {"strategy": "lastWriteWins", "associative": false}}))
            .associative()
    );
    assert!(reducer(merged(json!({"a": at("sum")}))).associative());
    for (annotation, says) in [
        (
            json!({"strategy": "sum", "delete": true}),
            "strategy \"sum\" has no option \"delete\"",
        ),
        (
            json!({"strategy": "merge", "associative": false}),
            "no option \"associative\"",
        ),
        (
            json!({"strategy": "lastWriteWins", "delete": "yes"}),
            "delete must be true or false",
        ),
    ] {
        let err = Schema::compile(&json!({"properties": {"a": {"reduce": annotation}}}))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("#/properties/a/reduce") && err.contains(says),
            "{err}"
        );
    }
}

#[test]
fn set_removals_of_the_left_most_document_are_applied_to_nothing_and_dropped() {
    let schema = json!({"reduce": {"strategy": "merge"}, "properties": {"s": at("set")}});
    let lone = vec![json!({"s": {"add": [1, 2], "remove": [3]}})];
    assert_eq!(
        fold_full(schema.clone(), lone).unwrap(),
        Some(json!({"s": {"add": [1, 2]}}))
    );
    let two = vec![
        json!({"s": {"intersect": [1]}}),
        json!({"s": {"add": [4], "remove": [4, 5]}}),
    ];
    assert_eq!(
        fold_full(schema, two).unwrap(),
        Some(json!({"s": {"add": [4]}}))
    );
}

// ---- Associativity: reduce(reduce(a, b), c) == reduce(a, reduce(b, c)) ----

fn assert_associative(
    reducer: &Reducer,
    a: Value,
    b: Value,
    c: Value,
) -> Result<(), TestCaseError> {
    let mut left = a.clone();
    let left = reducer
        .reduce(&mut left, b.clone(), false)
        .and_then(|()| reducer.reduce(&mut left, c.clone(), false))
        .map(|()| left);
    assert_compact_agrees(reducer, &a, &b, &c, &left)?;
    let mut bc = b;
    let mut right = a;
    let right = reducer
        .reduce(&mut bc, c, false)
        .and_then(|()| reducer.reduce(&mut right, bc, false))
        .map(|()| right);
    match (left, right) {
        (Ok(l), Ok(r)) => prop_assert_eq!(l, r),
        (l, r) => prop_assert_eq!(
            l.is_err(),
            r.is_err(),
            "one grouping failed: {:?} vs {:?}",
            l,
            r
        ),
    }
    Ok(())
}

/// `(a·b)·c` reduced as compact documents (`Reducer::reduce_docs`) gives what
/// `Reducer::reduce` gave (`expected`), value or error message alike, and each step
/// reports the exact change of the document's heap estimate.
fn assert_compact_agrees(
    reducer: &Reducer,
    a: &Value,
    b: &Value,
    c: &Value,
    expected: &Result<Value, ReduceError>,
) -> Result<(), TestCaseError> {
    // Each reduction reports how the left side's heap estimate changed: exactly.
    let mut doc = Doc::from(a);
    let mut estimate = doc.heap_size() as isize;
    let mut reduce = |rhs: &Value| -> Result<(), ReduceError> {
        estimate += reducer.reduce_docs(&mut doc, Doc::from(rhs), false)?;
        assert_eq!(estimate, doc.heap_size() as isize, "reported heap change");
        Ok(())
    };
    let got = reduce(b)
        .and_then(|()| reduce(c))
        .map(|()| Value::from(doc));
    match (got, expected) {
        (Ok(got), Ok(want)) => prop_assert_eq!(&got, want),
        (Err(got), Err(want)) => prop_assert_eq!(got.to_string(), want.to_string()),
        (got, want) => prop_assert!(false, "compact {:?} vs value {:?}", got, want),
    }
    Ok(())
}

/// Any JSON value with exactly-comparable numbers. Some strings and names are longer
/// than a compact document keeps inline, so they take heap blocks of their own.
fn any_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        (-4i64..4).prop_map(Value::from),
        (-8i32..8).prop_map(|k| json!(f64::from(k) / 4.0)),
        "[ab]{0,2}|[ab]{25}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 12, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..3).prop_map(Value::from),
            prop::collection::btree_map("[abc]|c{25}", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Integers and dyadic floats small enough that every sum is exact.
fn summable() -> impl Strategy<Value = Value> {
    prop_oneof![
        (-(1i64 << 40)..(1i64 << 40)).prop_map(Value::from),
        (-(1i32 << 20)..(1 << 20)).prop_map(|k| json!(f64::from(k) / 8.0)),
    ]
}

/// Objects with a counter, a maximum, a list, a free-form field and a nested merge.
fn mergeable() -> impl Strategy<Value = Value> {
    let fields = (
        prop::option::of(-1000i64..1000),
        prop::option::of(any_json()),
        prop::option::of(prop::collection::vec(0i64..9, 0..3)),
        prop::option::of(any_json()),
        prop::option::of(prop::collection::btree_map("[xyz]|z{25}", -9i64..9, 0..3)),
    );
    fields.prop_map(|(count, max, list, other, nested)| {
        let mut doc = serde_json::Map::new();
        let mut put = |k: &str, v: Option<Value>| {
            if let Some(v) = v {
                doc.insert(k.to_string(), v);
            }
        };
        put("count", count.map(Value::from));
        put("max", max);
        put("list", list.map(Value::from));
        put("other", other);
        put("nested", nested.map(|m| json!(m)));
        Value::Object(doc)
    })
}

fn mergeable_schema() -> Value {
    merged(json!({
        "count": at("sum"),
        "max": at("maximize"),
        "list": at("append"),
        "nested": {"reduce": {"strategy": "merge"}, "additionalProperties": at("sum")},
    }))
}

/// Arrays of `{id, n}` sorted by a unique `id`.
fn keyed_array() -> impl Strategy<Value = Value> {
    prop::collection::btree_map(0i64..8, -9i64..9, 0..5).prop_map(|m| {
        Value::from(
            m.into_iter()
                .map(|(id, n)| json!({"id": id, "n": n}))
                .collect::<Vec<_>>(),
        )
    })
}

fn members() -> impl Strategy<Value = std::collections::BTreeMap<String, i64>> {
    prop::collection::btree_map("[a-e]", -9i64..9, 0..4)
}

/// Set instances of object form: `add` and at most one of `intersect` / `remove`.
fn object_set() -> impl Strategy<Value = Value> {
    (prop::option::of(members()), 0..3u8, members()).prop_map(|(add, which, other)| {
        let mut doc = serde_json::Map::new();
        if let Some(add) = add {
            doc.insert("add".into(), json!(add));
        }
        match which {
            1 => {
                doc.insert("intersect".into(), json!(other));
            }
            2 => {
                doc.insert("remove".into(), json!(other));
            }
            _ => {}
        }
        Value::Object(doc)
    })
}

/// Set instances of array form: sorted unique integers.
fn array_set() -> impl Strategy<Value = Value> {
    let sorted = || {
        prop::collection::btree_set(0i64..8, 0..4)
            .prop_map(|s| json!(s.into_iter().collect::<Vec<_>>()))
    };
    (prop::option::of(sorted()), 0..3u8, sorted()).prop_map(|(add, which, other)| {
        let mut doc = serde_json::Map::new();
        if let Some(add) = add {
            doc.insert("add".into(), add);
        }
        match which {
            1 => {
                doc.insert("intersect".into(), other);
            }
            2 => {
                doc.insert("remove".into(), other);
            }
            _ => {}
        }
        Value::Object(doc)
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn write_wins_strategies_associate(a in any_json(), b in any_json(), c in any_json()) {
        for strategy in ["lastWriteWins", "firstWriteWins"] {
            assert_associative(&reducer(at(strategy)), a.clone(), b.clone(), c.clone())?;
        }
    }

    #[test]
    fn sum_associates(a in summable(), b in summable(), c in summable()) {
        assert_associative(&reducer(at("sum")), a, b, c)?;
    }

    #[test]
    fn integer_sums_near_the_limits_associate(
        a in any::<i64>().prop_map(|n| json!(n / 2)),
        b in any::<u64>().prop_map(|n| json!(n / 2)),
        c in any::<i64>().prop_map(|n| json!(n / 2)),
    ) {
        assert_associative(&reducer(at("sum")), a, b, c)?;
    }

    #[test]
    fn sum_errors_associate(a in prop_oneof![summable(), any_json()], b in any_json(), c in summable()) {
        assert_associative(&reducer(at("sum")), a, b, c)?;
    }

    #[test]
    fn min_max_associate(a in any_json(), b in any_json(), c in any_json()) {
        for strategy in ["minimize", "maximize"] {
            assert_associative(&reducer(at(strategy)), a.clone(), b.clone(), c.clone())?;
        }
    }

    #[test]
    fn keyed_min_max_associate(a in mergeable(), b in mergeable(), c in mergeable()) {
        for strategy in ["minimize", "maximize"] {
            let schema = json!({"reduce": {"strategy": strategy, "key": ["/count"]}, "properties": {"nested": at("merge")}});
            assert_associative(&reducer(schema), a.clone(), b.clone(), c.clone())?;
        }
    }

    #[test]
    fn merge_associates(a in mergeable(), b in mergeable(), c in mergeable()) {
        assert_associative(&reducer(mergeable_schema()), a, b, c)?;
    }

    #[test]
    fn keyed_array_merge_associates(a in keyed_array(), b in keyed_array(), c in keyed_array()) {
        let schema = json!({
            "reduce": {"strategy": "merge", "key": ["/id"]},
            "items": {"reduce": {"strategy": "merge"}, "properties": {"n": at("sum")}},
        });
        assert_associative(&reducer(schema), a, b, c)?;
    }

    #[test]
    fn append_associates(a in prop::collection::vec(any_json(), 0..3), b in prop::collection::vec(any_json(), 0..3), c in prop::collection::vec(any_json(), 0..3)) {
        assert_associative(&reducer(at("append")), a.into(), b.into(), c.into())?;
    }

    #[test]
    fn object_sets_associate(a in object_set(), b in object_set(), c in object_set()) {
        let schema = json!({"reduce": {"strategy": "set"}, "properties": {"add": {"additionalProperties": at("sum")}}});
        assert_associative(&reducer(schema), a, b, c)?;
    }

    #[test]
    fn array_sets_associate(a in array_set(), b in array_set(), c in array_set()) {
        assert_associative(&reducer(at("set")), a, b, c)?;
    }

    #[test]
    fn conditional_annotations_associate(a in counter_doc(), b in counter_doc(), c in counter_doc()) {
        assert_associative(&reducer(resettable_counter()), a, b, c)?;
    }

    #[test]
    fn merge_patches_with_tombstones_associate(a in patch(), b in patch(), c in patch()) {
        assert_associative(&reducer(merge_patch()), a, b, c)?;
    }

    #[test]
    fn a_full_reduction_onto_a_partial_one_equals_one_transaction_after_another(a in patch(), b in patch(), c in patch()) {
        // Store a·b, then a later transaction reduces c onto what was stored...
        let stored = fold_full(merge_patch(), vec![a.clone(), b.clone()]).unwrap();
        let sequential = fold_full(merge_patch(), stored.into_iter().chain([c.clone()]).collect()).unwrap();
        // ...or b and c combine first (partially, tombstones kept) and reduce onto a.
        let bc = fold(merge_patch(), vec![b, c]).unwrap();
        prop_assert_eq!(fold_full(merge_patch(), vec![a, bc]).unwrap(), sequential);
    }
}

/// Documents of the resettable counter: a sum or a reset, always with a value.
fn counter_doc() -> impl Strategy<Value = Value> {
    (prop::bool::ANY, -50i64..50)
        .prop_map(|(reset, value)| json!({"key": "k", "action": if reset { "reset" } else { "sum" }, "value": value}))
}

/// Merge patches whose locations keep one type: objects `a`..`c` of leaves that are an
/// integer or `null` (a deletion). (A location that is an object in one patch and a
/// scalar in another does not reduce associatively, in Flow either.)
fn patch() -> impl Strategy<Value = Value> {
    let leaf = prop::option::of(-9i64..9).prop_map(|n| n.map_or(Value::Null, Value::from));
    let inner = prop::collection::btree_map("[xyz]", leaf, 0..3)
        .prop_map(|m| Value::Object(m.into_iter().collect()));
    prop::collection::btree_map("[abc]", inner, 0..3)
        .prop_map(|m| Value::Object(m.into_iter().collect()))
}
