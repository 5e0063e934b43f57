//! Reductions where Sluice follows Estuary Flow's reducer case by case (issue 36): right-hand
//! values that cannot be reduced into the left, `null` conditionals, recursive keyed merges
//! with deletion tombstones, `delete: true` below the root and RFC 7396 merge patches.
//!
//! Each case is a sequence of steps, as Flow's own reducer tests are written: a document
//! reduced into the accumulated left side, partially or fully (then finished), with the
//! expected result, deletion or error. Every step runs on both paths the runtime uses, the
//! reference `Reducer::reduce` over `Value`s and the combiner's `Reducer::reduce_docs` over
//! compact documents, which must agree value for value and error for error.

use serde_json::{Value, json};
use sluice_doc::compact::Doc;
use sluice_doc::{ReduceError, Reducer, Schema};

#[derive(Clone, Copy, Debug)]
enum Mode {
    /// A combiner's reduction of new documents with each other (tombstones kept).
    Partial,
    /// A reduction onto the stored document, then finished (deletions applied).
    Full,
}
use Mode::{Full, Partial};

#[derive(Debug)]
enum Want {
    Doc(Value),
    /// A full reduction that deletes the whole document.
    Deleted,
    /// A reduction error at this JSON pointer whose reason contains this text; the left
    /// side stays as it was (the caller discards the failed transaction).
    Fails {
        at: &'static str,
        why: &'static str,
    },
}
use Want::{Deleted, Fails};

fn doc(v: Value) -> Want {
    Want::Doc(v)
}

fn reducer(schema: &Value) -> Reducer {
    Schema::compile(schema)
        .expect("schema compiles")
        .reducer()
        .clone()
}

/// One step on the `Value` path: `None` when a full reduction deletes the document.
fn by_value(
    r: &Reducer,
    lhs: &Value,
    rhs: &Value,
    mode: Mode,
) -> Result<Option<Value>, ReduceError> {
    let mut out = lhs.clone();
    r.reduce(&mut out, rhs.clone(), matches!(mode, Full))?;
    let mut out = Doc::from(&out);
    Ok(match mode {
        Full if r.finish(&mut out) => None,
        _ => Some(Value::from(out)),
    })
}

/// One step on the compact path, with the same meaning.
fn by_doc(r: &Reducer, lhs: &Value, rhs: &Value, mode: Mode) -> Result<Option<Value>, ReduceError> {
    let mut out = Doc::from(lhs);
    r.reduce_docs(&mut out, Doc::from(rhs), matches!(mode, Full))?;
    Ok(match mode {
        Full if r.finish(&mut out) => None,
        _ => Some(Value::from(out)),
    })
}

/// Runs `steps` from no document: the first document with no left side is taken as it is.
fn run(schema: Value, steps: Vec<(Mode, Value, Want)>) {
    let r = reducer(&schema);
    let mut lhs: Option<Value> = None;
    for (i, (mode, rhs, want)) in steps.into_iter().enumerate() {
        let what = format!("step {i} ({mode:?} {rhs}) onto {lhs:?}");
        let Some(left) = &lhs else {
            lhs = Some(rhs);
            continue;
        };
        let (value, compact) = (by_value(&r, left, &rhs, mode), by_doc(&r, left, &rhs, mode));
        match (&value, &compact) {
            (Ok(v), Ok(c)) => assert_eq!(v, c, "{what}: value and compact paths differ"),
            (Err(v), Err(c)) => assert_eq!(v.to_string(), c.to_string(), "{what}"),
            _ => panic!("{what}: value path {value:?}, compact path {compact:?}"),
        }
        match (want, value) {
            (Want::Doc(want), Ok(Some(got))) => {
                assert_eq!(got, want, "{what}");
                lhs = Some(got);
            }
            (Deleted, Ok(None)) => lhs = None,
            (Fails { at, why }, Err(err)) => {
                assert_eq!(err.location, at, "{what}: {err}");
                assert!(err.reason.contains(why), "{what}: {err}");
            }
            (want, got) => panic!("{what}: wanted {want:?}, got {got:?}"),
        }
    }
}

fn reduce(strategy: &str) -> Value {
    json!({"strategy": strategy})
}

// ---- 1. A right-hand value that cannot be reduced into the left is an error ----

const MERGE: &str = "merge needs an object or an array on the right";

#[test]
fn a_scalar_where_a_keyed_minimize_holds_an_object_fails_naming_the_location() {
    // Flow's `test_minimize_with_deep_merge`, below the root.
    let best = |v: Value| json!({"best": v});
    run(
        json!({
            "reduce": reduce("merge"),
            "properties": {"best": {
                "reduce": {"strategy": "minimize", "key": ["/k"]},
                "properties": {"n": {"reduce": reduce("sum")}},
            }},
        }),
        vec![
            (
                Partial,
                best(json!({"k": 3, "n": 1})),
                doc(best(json!({"k": 3, "n": 1}))),
            ),
            (
                Partial,
                best(json!({"k": 4, "n": 1})),
                doc(best(json!({"k": 3, "n": 1}))),
            ),
            (
                Partial,
                best(json!({"k": 3, "n": 1, "!": true})),
                doc(best(json!({"k": 3, "n": 2, "!": true}))),
            ),
            (
                Partial,
                best(json!({"k": 2, "n": 1})),
                doc(best(json!({"k": 2, "n": 1}))),
            ),
            // null orders before an integer; a missing key before null.
            (
                Partial,
                best(json!({"k": null, "n": -1})),
                doc(best(json!({"k": null, "n": -1}))),
            ),
            (
                Partial,
                best(json!({"n": 1, "whoops": true})),
                doc(best(json!({"n": 1, "whoops": true}))),
            ),
            // Equal keys (both missing): the scalar would be deep-merged into the object.
            (
                Partial,
                best(json!(42)),
                Fails {
                    at: "/best",
                    why: MERGE,
                },
            ),
            (
                Full,
                best(json!(42)),
                Fails {
                    at: "/best",
                    why: MERGE,
                },
            ),
        ],
    );
    // A scalar that wins on the key cannot become the kept document either.
    run(
        json!({"reduce": {"strategy": "minimize", "key": ["/k"]}}),
        vec![
            (Partial, json!({"k": 3}), doc(json!({"k": 3}))),
            (Full, json!("low"), Fails { at: "", why: MERGE }),
        ],
    );
}

#[test]
fn a_keyed_maximize_keeps_its_object_over_a_losing_scalar() {
    // Flow's `test_maximize_with_deep_merge`: a right side that loses is dropped whatever it
    // is; arrays merge index by index on a tie.
    run(
        json!({
            "items": [{"reduce": reduce("sum")}, {"type": "integer"}],
            "reduce": {"strategy": "maximize", "key": ["/1"]},
        }),
        vec![
            (Partial, json!([1, 3]), doc(json!([1, 3]))),
            (Partial, json!([1, 4]), doc(json!([1, 4]))),
            (Partial, json!([1, 3]), doc(json!([1, 4]))),
            (Partial, json!([1, 4, "."]), doc(json!([2, 4, "."]))),
            (Partial, json!([1, 2, "!"]), doc(json!([2, 4, "."]))),
            (Partial, json!([1, 4, ":"]), doc(json!([3, 4, ":"]))),
            (Partial, json!([]), doc(json!([3, 4, ":"]))),
            (Partial, json!(32), doc(json!([3, 4, ":"]))),
            (Full, json!("x"), doc(json!([3, 4, ":"]))),
        ],
    );
}

#[test]
fn a_string_where_merge_holds_an_object_or_an_array_fails_naming_the_location() {
    let schema = json!({
        "reduce": reduce("merge"),
        "properties": {
            "attrs": {"reduce": reduce("merge")},
            "list": {"reduce": reduce("merge"), "items": {"reduce": reduce("maximize")}},
        },
    });
    run(
        schema.clone(),
        vec![
            (
                Partial,
                json!({"attrs": {"a": 1}, "list": [0, 1]}),
                doc(json!({"attrs": {"a": 1}, "list": [0, 1]})),
            ),
            (
                Partial,
                json!({"attrs": {"b": 2}}),
                doc(json!({"attrs": {"a": 1, "b": 2}, "list": [0, 1]})),
            ),
            (
                Partial,
                json!({"attrs": "whoops"}),
                Fails {
                    at: "/attrs",
                    why: MERGE,
                },
            ),
            (
                Full,
                json!({"list": "whoops"}),
                Fails {
                    at: "/list",
                    why: MERGE,
                },
            ),
            (
                Full,
                json!({"list": [3, 0, 2]}),
                doc(json!({"attrs": {"a": 1, "b": 2}, "list": [3, 1, 2]})),
            ),
            (
                Full,
                json!({"list": [1, {"x": 1}]}),
                doc(json!({"attrs": {"a": 1, "b": 2}, "list": [3, {"x": 1}, 2]})),
            ),
            (
                Full,
                json!({"list": [null]}),
                doc(json!({"attrs": {"a": 1, "b": 2}, "list": [3, {"x": 1}, 2]})),
            ),
            (Partial, json!(7), Fails { at: "", why: MERGE }),
            (Partial, json!(null), Fails { at: "", why: MERGE }),
        ],
    );
    // The error names the location and quotes both sides.
    let err = by_doc(
        &reducer(&schema),
        &json!({"attrs": {"a": 1}}),
        &json!({"attrs": "whoops"}),
        Full,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "while reducing /attrs: merge needs an object or an array on the right (a scalar \
         cannot be merged into the left) (left: {\"a\":1}, right: \"whoops\")"
    );
}

#[test]
fn append_sum_and_set_refuse_values_of_the_wrong_type() {
    let schema = json!({
        "reduce": reduce("merge"),
        "properties": {
            "log": {"reduce": reduce("append")},
            "n": {"reduce": reduce("sum")},
            "tags": {"reduce": reduce("set")},
        },
    });
    run(
        schema,
        vec![
            (
                Partial,
                json!({"log": [1], "n": 1, "tags": {"add": {"a": 1}}}),
                doc(json!({"log": [1], "n": 1, "tags": {"add": {"a": 1}}})),
            ),
            (
                Partial,
                json!({"log": {"a": 1}}),
                Fails {
                    at: "/log",
                    why: "append needs two arrays",
                },
            ),
            (
                Full,
                json!({"log": "x"}),
                Fails {
                    at: "/log",
                    why: "append needs two arrays",
                },
            ),
            (
                Partial,
                json!({"n": true}),
                Fails {
                    at: "/n",
                    why: "sum needs two numbers",
                },
            ),
            (
                Full,
                json!({"n": "ten"}),
                Fails {
                    at: "/n",
                    why: "sum needs two numbers",
                },
            ),
            (
                Partial,
                json!({"tags": ["a"]}),
                Fails {
                    at: "/tags",
                    why: "set",
                },
            ),
        ],
    );
}

// ---- 2. Conditionals keyed on `null` ----

#[test]
fn a_null_conditional_takes_null_and_append_onto_null_is_a_no_op() {
    // Flow's `test_append_array`.
    run(
        json!({
            "if": {"type": "null"},
            "then": {"reduce": reduce("lastWriteWins")},
            "else": {"reduce": reduce("append")},
        }),
        vec![
            (Partial, json!([]), doc(json!([]))),
            (
                Partial,
                json!("whoops"),
                Fails {
                    at: "",
                    why: "append needs two arrays",
                },
            ),
            (Partial, json!([0, 1]), doc(json!([0, 1]))),
            (Partial, json!([2, 3, 4]), doc(json!([0, 1, 2, 3, 4]))),
            (
                Partial,
                json!([-1, "a"]),
                doc(json!([0, 1, 2, 3, 4, -1, "a"])),
            ),
            (
                Partial,
                json!({}),
                Fails {
                    at: "",
                    why: "append needs two arrays",
                },
            ),
            (Partial, json!(null), doc(json!(null))),
            // Appending onto null leaves null, partially and fully.
            (Partial, json!([5, 6, 4]), doc(json!(null))),
            (Full, json!([5]), doc(json!(null))),
        ],
    );
}

#[test]
fn a_null_conditional_over_merge_takes_null_and_a_full_reduction_replaces_it() {
    // Flow's `test_merge_objects` and `test_merge_ordered_scalars`.
    run(
        json!({
            "if": {"type": "null"},
            "then": {"reduce": reduce("lastWriteWins")},
            "else": {"reduce": reduce("merge")},
        }),
        vec![
            (
                Partial,
                json!({"5": 5, "9": 9}),
                doc(json!({"5": 5, "9": 9})),
            ),
            (
                Partial,
                json!({"7": 7}),
                doc(json!({"5": 5, "7": 7, "9": 9})),
            ),
            (
                Partial,
                json!({"2": 2, "5": 55}),
                doc(json!({"2": 2, "5": 55, "7": 7, "9": 9})),
            ),
            (Partial, json!("whoops"), Fails { at: "", why: MERGE }),
            (Partial, json!(null), doc(json!(null))),
            (Full, json!({"9": 9}), doc(json!({"9": 9}))),
        ],
    );
    run(
        json!({
            "if": {"type": "null"},
            "then": {"reduce": reduce("lastWriteWins")},
            "else": {"reduce": {"strategy": "merge", "key": [""]}},
        }),
        vec![
            (Partial, json!([5, 9]), doc(json!([5, 9]))),
            (Partial, json!([7]), doc(json!([5, 7, 9]))),
            (Partial, json!([2, 4, 5]), doc(json!([2, 4, 5, 7, 9]))),
            (
                Partial,
                json!([1, 2, 7, 10]),
                doc(json!([1, 2, 4, 5, 7, 9, 10])),
            ),
            (Partial, json!(null), doc(json!(null))),
            (Full, json!([1, 2]), doc(json!([1, 2]))),
        ],
    );
}

// ---- 3. Recursive keyed merges through `$ref`, with deletion tombstones ----

/// A tree whose `children` merge by `/id`, recursively through `$ref`; a node whose
/// `_meta/op` is `"d"` is a deletion of that node (Flow's `_meta/op: d`, below the root).
fn tree() -> Value {
    json!({
        "$defs": {"node": {
            "type": "object",
            "reduce": reduce("merge"),
            "properties": {
                "n": {"reduce": reduce("sum")},
                "children": {
                    "type": "array",
                    "reduce": {"strategy": "merge", "key": ["/id"]},
                    "items": {"$ref": "#/$defs/node"},
                },
            },
            "if": {
                "required": ["_meta"],
                "properties": {"_meta": {"required": ["op"], "properties": {"op": {"const": "d"}}}},
            },
            "then": {"reduce": {"strategy": "merge", "delete": true}},
        }},
        "$ref": "#/$defs/node",
    })
}

fn deleted(id: u32) -> Value {
    json!({"id": id, "_meta": {"op": "d"}})
}

#[test]
fn recursive_keyed_merges_keep_tombstones_partially_and_drop_them_fully() {
    let base = json!({"id": 0, "children": [
        {"id": 1, "n": 1, "children": [{"id": 11, "n": 1}, {"id": 12}]},
        {"id": 2, "n": 1},
    ]});
    let update = json!({"children": [
        {"id": 1, "n": 2, "children": [deleted(12), {"id": 13}]},
        deleted(2),
        {"id": 3},
    ]});
    // Partially, the deleted nodes stay, merged into tombstones at their sorted places.
    let partial = json!({"id": 0, "children": [
        {"id": 1, "n": 3, "children": [{"id": 11, "n": 1}, {"id": 12, "_meta": {"op": "d"}}, {"id": 13}]},
        {"id": 2, "n": 1, "_meta": {"op": "d"}},
        {"id": 3},
    ]});
    run(
        tree(),
        vec![
            (Partial, base.clone(), doc(base.clone())),
            (Partial, update.clone(), doc(partial)),
        ],
    );
    // Fully, they go, at every depth.
    let full = json!({"id": 0, "children": [
        {"id": 1, "n": 3, "children": [{"id": 11, "n": 1}, {"id": 13}]},
        {"id": 3},
    ]});
    run(
        tree(),
        vec![
            (Full, base.clone(), doc(base.clone())),
            (Full, update.clone(), doc(full.clone())),
        ],
    );
    // A partial reduction of two updates keeps both tombstones, and still deletes when
    // reduced fully onto the stored document.
    let later = json!({"children": [{"id": 1, "children": [deleted(11)]}]});
    let mut combined = update;
    reducer(&tree())
        .reduce(&mut combined, later, false)
        .unwrap();
    run(
        tree(),
        vec![
            (Full, base.clone(), doc(base)),
            (
                Full,
                combined,
                doc(json!({"id": 0, "children": [
                    {"id": 1, "n": 3, "children": [{"id": 13}]},
                    {"id": 3},
                ]})),
            ),
        ],
    );
}

#[test]
fn keyed_array_items_marked_deleted_go_only_in_a_full_reduction() {
    // Flow's `test_merge_array_deletion`.
    run(
        json!({
            "items": {
                "properties": {"k": {"type": "integer"}},
                "if": {"required": ["del"]},
                "then": {"reduce": {"strategy": "lastWriteWins", "delete": true}},
            },
            "reduce": {"strategy": "merge", "key": ["/k"]},
        }),
        vec![
            (
                Partial,
                json!([{"k": 5}, {"k": 9}]),
                doc(json!([{"k": 5}, {"k": 9}])),
            ),
            (
                Partial,
                json!([{"k": 5, "del": 1}, {"k": 6}]),
                doc(json!([{"k": 5, "del": 1}, {"k": 6}, {"k": 9}])),
            ),
            (
                Partial,
                json!([{"k": 5, "del": 1}]),
                doc(json!([{"k": 5, "del": 1}, {"k": 6}, {"k": 9}])),
            ),
            (
                Full,
                json!([{"k": 5, "del": 1}, {"k": 7}]),
                doc(json!([{"k": 6}, {"k": 7}, {"k": 9}])),
            ),
            (
                Full,
                json!([{"k": 6, "del": 1}, {"k": 8}, {"k": 9, "del": 1}]),
                doc(json!([{"k": 7}, {"k": 8}])),
            ),
        ],
    );
}

// ---- 4. `delete: true` below the root ----

#[test]
fn delete_below_the_root_on_last_write_wins_removes_properties_only_when_full() {
    // Flow's `test_merge_object_deletion`.
    run(
        json!({
            "additionalProperties": {
                "if": {"const": "del"},
                "then": {"reduce": {"strategy": "lastWriteWins", "delete": true}},
            },
            "reduce": reduce("merge"),
        }),
        vec![
            (
                Partial,
                json!({"5": 5, "9": 9}),
                doc(json!({"5": 5, "9": 9})),
            ),
            (
                Partial,
                json!({"5": "del", "6": 6}),
                doc(json!({"5": "del", "6": 6, "9": 9})),
            ),
            (
                Partial,
                json!({"5": "del"}),
                doc(json!({"5": "del", "6": 6, "9": 9})),
            ),
            (
                Full,
                json!({"5": "del", "7": 7}),
                doc(json!({"6": 6, "7": 7, "9": 9})),
            ),
            (
                Full,
                json!({"6": "del", "8": 8, "9": "del"}),
                doc(json!({"7": 7, "8": 8})),
            ),
        ],
    );
}

#[test]
fn delete_below_the_root_on_merge_removes_the_merged_object_only_when_full() {
    let schema = json!({
        "reduce": reduce("merge"),
        "properties": {"session": {
            "reduce": reduce("merge"),
            "properties": {"clicks": {"reduce": reduce("sum")}},
            "if": {"required": ["closed"]},
            "then": {"reduce": {"strategy": "merge", "delete": true}},
        }},
    });
    let open = json!({"user": "u", "session": {"id": 1, "clicks": 2}});
    let close = json!({"session": {"clicks": 1, "closed": true}});
    run(
        schema.clone(),
        vec![
            (Partial, open.clone(), doc(open.clone())),
            // Merged, not replaced: the tombstone carries the reduced session.
            (
                Partial,
                close.clone(),
                doc(json!({"user": "u", "session": {"id": 1, "clicks": 3, "closed": true}})),
            ),
            (Full, json!({"user": "v"}), doc(json!({"user": "v"}))),
        ],
    );
    run(
        schema.clone(),
        vec![
            (Full, open.clone(), doc(open.clone())),
            (Full, close, doc(json!({"user": "u"}))),
            // A session after the deletion starts from nothing.
            (
                Full,
                json!({"session": {"id": 2, "clicks": 1}}),
                doc(json!({"user": "u", "session": {"id": 2, "clicks": 1}})),
            ),
        ],
    );
}

// ---- 5. RFC 7396 merge patches through nested objects ----

/// Flow's `merge_patch_schema`, with the recursion through `#`.
fn merge_patch() -> Value {
    json!({
        "oneOf": [
            {"type": "object", "reduce": reduce("merge"), "additionalProperties": {"$ref": "#"}},
            {"type": "null", "reduce": {"strategy": "lastWriteWins", "delete": true}},
            {"type": ["array", "boolean", "number", "string"]},
        ],
    })
}

#[test]
fn merge_patches_keep_siblings_and_null_removes_a_property_at_any_depth() {
    // Flow's `test_merge_patch_examples`.
    let f1 = json!({"a": 32.6, "c": {"d": [42], "f": "g"}});
    run(
        merge_patch(),
        vec![
            (Partial, f1.clone(), doc(f1)),
            (
                Partial,
                json!({"c": {"d": "e"}}),
                doc(json!({"a": 32.6, "c": {"d": "e", "f": "g"}})),
            ),
            (
                Full,
                json!({"a": "z", "c": {"f": null}}),
                doc(json!({"a": "z", "c": {"d": "e"}})),
            ),
            (
                Full,
                json!({"a": {"1": 1}}),
                doc(json!({"a": {"1": 1}, "c": {"d": "e"}})),
            ),
            (Full, json!([1, 2]), doc(json!([1, 2]))),
            (
                Full,
                json!({"a": {"bb": {"ccc": null}}}),
                doc(json!({"a": {"bb": {}}})),
            ),
            (Full, json!(null), Deleted),
            (Full, json!("fin"), doc(json!("fin"))),
        ],
    );
    // Partially, nulls are tombstones that still delete when reduced fully later.
    let mut patch = json!({"c": {"x": {"y": 1, "z": 2}}});
    let r = reducer(&merge_patch());
    r.reduce(
        &mut patch,
        json!({"c": {"x": {"y": null}, "f": null}}),
        false,
    )
    .unwrap();
    assert_eq!(patch, json!({"c": {"x": {"y": null, "z": 2}, "f": null}}));
    run(
        merge_patch(),
        vec![
            (
                Full,
                json!({"a": 1, "c": {"d": 1, "f": 2, "x": {"y": 0, "w": 0}}}),
                doc(json!({"a": 1, "c": {"d": 1, "f": 2, "x": {"y": 0, "w": 0}}})),
            ),
            (
                Full,
                patch,
                doc(json!({"a": 1, "c": {"d": 1, "x": {"w": 0, "z": 2}}})),
            ),
        ],
    );
}
