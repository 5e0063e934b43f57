//! The combiner against its promises: a `BTreeMap` model under random spill budgets, key
//! order, the left-most loaded document, and errors that name collection, key and pointer.

use proptest::prelude::*;
use serde_json::{Value, json};
use sluice_doc::combine::{BindingSpec, CombineError, Combiner, CombinerOptions, Drained};
use sluice_doc::compact::Doc;
use sluice_doc::tuple::pack_key;
use sluice_doc::{KeyExtractor, Pointer, Schema};
use std::collections::BTreeMap;
use std::sync::Arc;

/// `n` sums, `log` appends (so the drained log shows the exact reduction order), `last` is
/// last-write-wins, `max` maximizes; `loose` has no type, so `sum` over it can fail.
fn schema() -> Arc<Schema> {
    let schema = json!({
        "type": "object",
        "required": ["k"],
        "reduce": {"strategy": "merge"},
        "properties": {
            "k": {"type": "integer"},
            "n": {"type": "integer", "reduce": {"strategy": "sum"}},
            "log": {"type": "array", "items": {"type": "integer"}, "reduce": {"strategy": "append"}},
            "last": {"type": "integer"},
            "max": {"type": "integer", "reduce": {"strategy": "maximize"}},
            "name": {"type": "string"},
            "loose": {"reduce": {"strategy": "sum"}}
        }
    });
    Arc::new(Schema::compile(&schema).expect("test schema compiles"))
}

fn binding(name: &str) -> BindingSpec {
    BindingSpec {
        schema: schema(),
        key: KeyExtractor::new(vec![Pointer::parse("/k").unwrap()], vec![None]),
        name: name.to_string(),
        full: false,
        deletions: false,
    }
}

fn new_combiner(bindings: usize, memory_budget: usize) -> Combiner {
    let bindings = (0..bindings)
        .map(|b| binding(&format!("acme/c{b}")))
        .collect();
    let opts = CombinerOptions {
        memory_budget,
        spill_dir: None,
        ..Default::default()
    };
    Combiner::new(bindings, opts)
}

fn key(k: i64) -> Vec<u8> {
    pack_key(&[json!(k)])
}

fn drain_all(combiner: Combiner) -> Vec<Drained> {
    combiner
        .drain()
        .expect("drain starts")
        .collect::<Result<Vec<_>, _>>()
        .expect("drain succeeds")
}

#[derive(Debug, Clone)]
enum Op {
    Right {
        binding: u32,
        k: i64,
        n: i64,
        route: Route,
    },
    Left {
        binding: u32,
        k: i64,
        n: i64,
    },
}

/// Which entry point a new document takes.
#[derive(Debug, Clone, Copy)]
enum Route {
    Value,
    Keyed,
    JsonText,
}

fn op() -> impl Strategy<Value = Op> {
    let route = prop_oneof![
        Just(Route::Value),
        Just(Route::Keyed),
        Just(Route::JsonText)
    ];
    prop_oneof![
        6 => (0..2u32, -20..20i64, -5..5i64, route)
            .prop_map(|(binding, k, n, route)| Op::Right { binding, k, n, route }),
        1 => (0..2u32, -20..20i64, -5..5i64).prop_map(|(binding, k, n)| Op::Left { binding, k, n }),
    ]
}

/// 0 spills after every document; `usize::MAX` never spills.
fn budget() -> impl Strategy<Value = usize> {
    prop_oneof![Just(0), 1usize..40_000, Just(usize::MAX)]
}

/// Per (binding, packed key): the loaded document, then the new ones in arrival order.
type Model = BTreeMap<(u32, Vec<u8>), (Option<Value>, Vec<Value>)>;

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

    /// The reference reduces, per (binding, key), the loaded document (if any) and then
    /// every new document in arrival order; the combiner must drain exactly that, in
    /// (binding, packed key) order, whatever its spills.
    #[test]
    fn combiner_matches_btreemap_model_under_random_spill_budgets(
        ops in proptest::collection::vec(op(), 0..300),
        budget in budget(),
    ) {
        let reducer_schema = schema();
        let mut combiner = new_combiner(2, budget);
        let mut model = Model::new();
        let mut combined = 0;

        for (seq, op) in ops.iter().enumerate() {
            match *op {
                Op::Right { binding, k, n, route } => {
                    let doc = json!({"k": k, "n": n, "log": [seq], "last": seq, "max": n});
                    model.entry((binding, key(k))).or_default().1.push(doc.clone());
                    match route {
                        Route::Value => combiner.combine_right(binding, doc).unwrap(),
                        Route::Keyed => combiner.combine_right_keyed(binding, &key(k), Doc::from(doc), false).unwrap(),
                        Route::JsonText => {
                            combiner.combine_right_json(binding, doc.to_string().as_bytes()).unwrap()
                        }
                    }
                }
                Op::Left { binding, k, n } => {
                    let entry = model.entry((binding, key(k))).or_default();
                    if entry.0.is_some() {
                        continue; // At most one loaded document per key.
                    }
                    let doc = json!({"k": k, "n": n * 100, "log": [-1 - seq as i64], "last": -1, "max": n});
                    entry.0 = Some(doc.clone());
                    combiner.reduce_left(binding, &key(k), Doc::from(doc)).unwrap();
                }
            }
            combined += 1;
            if budget == 0 {
                prop_assert_eq!(combiner.stats().spilled_runs, combined);
            }
        }
        prop_assert_eq!(combiner.is_empty(), ops.is_empty());

        let expected: Vec<Drained> = model
            .into_iter()
            .map(|((binding, key), (left, rights))| {
                let full = left.is_some();
                let mut docs = left.into_iter().chain(rights);
                let mut doc = docs.next().unwrap();
                for rhs in docs {
                    reducer_schema.reducer().reduce(&mut doc, rhs, full).unwrap();
                }
                Drained { binding, key, doc: Doc::from(doc), full, deleted: false, resets: false }
            })
            .collect();
        prop_assert_eq!(drain_all(combiner), expected);
    }
}

#[test]
fn drained_keys_come_in_binding_then_packed_key_order() {
    let mut combiner = new_combiner(2, 4096);
    let keys = [5, -3, 1000, 0, 70_000, -70_000, 42];
    for (i, k) in keys.iter().enumerate() {
        let binding = (i % 2) as u32;
        combiner
            .combine_right(1 - binding, json!({"k": k}))
            .unwrap();
        combiner.combine_right(binding, json!({"k": k})).unwrap();
    }
    let drained: Vec<(u32, Vec<u8>)> = drain_all(combiner)
        .into_iter()
        .map(|d| (d.binding, d.key))
        .collect();

    let mut sorted_keys = keys.to_vec();
    sorted_keys.sort();
    let expected: Vec<(u32, Vec<u8>)> = [0, 1]
        .into_iter()
        .flat_map(|b| sorted_keys.iter().map(move |&k| (b, key(k))))
        .collect();
    assert_eq!(drained, expected);
}

#[test]
fn loaded_document_is_leftmost_even_after_new_documents_were_spilled() {
    for budget in [0, usize::MAX] {
        let mut combiner = new_combiner(1, budget);
        combiner
            .combine_right(0, json!({"k": 1, "log": [1], "last": 1}))
            .unwrap();
        combiner
            .reduce_left(
                0,
                &key(1),
                Doc::from(json!({"k": 1, "log": [0], "last": 0})),
            )
            .unwrap();
        combiner
            .combine_right(0, json!({"k": 1, "log": [2], "last": 2}))
            .unwrap();
        combiner
            .combine_right(0, json!({"k": 2, "log": [3], "last": 3}))
            .unwrap();

        let drained = drain_all(combiner);
        assert_eq!(drained.len(), 2, "budget {budget}");
        assert_eq!(
            Value::from(drained[0].doc.clone()),
            json!({"k": 1, "log": [0, 1, 2], "last": 2})
        );
        assert!(drained[0].full, "key 1 was combined with a loaded document");
        assert_eq!(
            Value::from(drained[1].doc.clone()),
            json!({"k": 2, "log": [3], "last": 3})
        );
        assert!(!drained[1].full, "key 2 only had new documents");
    }
}

#[test]
fn loaded_document_alone_drains_unchanged_and_full() {
    let mut combiner = new_combiner(1, usize::MAX);
    let doc = json!({"k": 9, "n": 4, "name": "loaded"});
    combiner.reduce_left(0, &key(9), Doc::from(&doc)).unwrap();
    let drained = drain_all(combiner);
    assert_eq!(
        drained,
        vec![Drained {
            binding: 0,
            key: key(9),
            doc: Doc::from(doc),
            full: true,
            deleted: false,
            resets: false,
        }]
    );
}

#[test]
fn second_loaded_document_for_a_key_is_an_error_naming_collection_and_key() {
    // In memory, the second load is refused at once.
    let mut combiner = new_combiner(1, usize::MAX);
    combiner
        .reduce_left(0, &key(7), Doc::from(json!({"k": 7})))
        .unwrap();
    let err = combiner
        .reduce_left(0, &key(7), Doc::from(json!({"k": 7})))
        .unwrap_err();
    assert!(matches!(err, CombineError::DuplicateLoad { .. }), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("acme/c0") && message.contains("[7]"),
        "{message}"
    );

    // Across spilled runs, the drain finds it.
    let mut combiner = new_combiner(1, 0 /* spill after every document */);
    combiner
        .reduce_left(0, &key(7), Doc::from(json!({"k": 7})))
        .unwrap();
    combiner
        .reduce_left(0, &key(7), Doc::from(json!({"k": 7})))
        .unwrap();
    let results: Vec<_> = combiner.drain().unwrap().collect();
    assert_eq!(results.len(), 1, "the drain stops at its first error");
    let message = results[0].as_ref().unwrap_err().to_string();
    assert!(
        message.contains("acme/c0") && message.contains("[7]"),
        "{message}"
    );
}

#[test]
fn reduction_error_names_collection_key_and_pointer_and_poisons_the_combiner() {
    let mut combiner = new_combiner(1, usize::MAX);
    combiner
        .combine_right(0, json!({"k": 3, "loose": 1}))
        .unwrap();
    let err = combiner
        .combine_right(0, json!({"k": 3, "loose": "one"}))
        .unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, CombineError::Reduce { .. }), "{message}");
    for part in ["acme/c0", "[3]", "/loose"] {
        assert!(message.contains(part), "{part:?} missing from {message:?}");
    }

    let later = combiner.combine_right(0, json!({"k": 4})).unwrap_err();
    assert!(matches!(later, CombineError::Poisoned { .. }), "{later}");
    assert!(
        combiner.drain().is_err(),
        "a poisoned combiner cannot drain"
    );
}

#[test]
fn reduction_error_across_spilled_runs_surfaces_from_the_drain() {
    let mut combiner = new_combiner(1, 0 /* spill after every document */);
    combiner
        .combine_right(0, json!({"k": 3, "loose": 1}))
        .unwrap();
    combiner
        .combine_right(0, json!({"k": 3, "loose": "one"}))
        .unwrap();
    let results: Vec<_> = combiner.drain().unwrap().collect();
    assert_eq!(results.len(), 1, "the drain stops at its first error");
    let message = results[0].as_ref().unwrap_err().to_string();
    for part in ["acme/c0", "[3]", "/loose"] {
        assert!(message.contains(part), "{part:?} missing from {message:?}");
    }
}

#[test]
fn invalid_document_error_names_collection_key_and_pointer_and_is_not_combined() {
    let mut combiner = new_combiner(1, usize::MAX);
    let err = combiner
        .combine_right(0, json!({"k": 5, "name": 12}))
        .unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, CombineError::Invalid { .. }), "{message}");
    for part in ["acme/c0", "[5]", "/name"] {
        assert!(message.contains(part), "{part:?} missing from {message:?}");
    }

    combiner.combine_right(0, json!({"k": 6, "n": 1})).unwrap();
    let drained = drain_all(combiner);
    assert_eq!(drained.len(), 1, "the invalid document was not combined");
    assert_eq!(Value::from(drained[0].doc.clone()), json!({"k": 6, "n": 1}));
}

#[test]
fn unknown_binding_is_an_error() {
    let mut combiner = new_combiner(1, usize::MAX);
    let err = combiner.combine_right(1, json!({"k": 1})).unwrap_err();
    assert!(
        matches!(
            err,
            CombineError::UnknownBinding {
                binding: 1,
                count: 1
            }
        ),
        "{err}"
    );
}

#[test]
fn table_memory_stays_within_the_budget_by_spilling() {
    let budget = 64 << 10;
    let mut combiner = new_combiner(1, budget);
    for i in 0..5_000 {
        let doc = json!({"k": i % 1_000, "n": 1, "name": format!("document number {i}")});
        combiner.combine_right(0, doc).unwrap();
        let stats = combiner.stats();
        assert!(stats.memory_bytes <= budget, "{stats:?}");
    }
    let stats = combiner.stats();
    assert!(stats.spilled_runs > 1, "{stats:?}");
    assert!(stats.spilled_bytes > 0, "{stats:?}");

    let drained = drain_all(combiner);
    assert_eq!(drained.len(), 1_000);
    assert!(
        drained
            .iter()
            .all(|d| d.doc.get("n") == Some(&Doc::PosInt(5))),
        "each key summed 5 times"
    );
}

#[test]
fn spill_failure_names_the_directory_and_poisons_the_combiner() {
    let missing = std::env::temp_dir().join("sluice-combine-test-no-such-dir/nested");
    let opts = CombinerOptions {
        memory_budget: 0,
        spill_dir: Some(missing.clone()),
        ..Default::default()
    };
    let mut combiner = Combiner::new(vec![binding("acme/c0")], opts);
    let err = combiner.combine_right(0, json!({"k": 1})).unwrap_err();
    assert!(matches!(err, CombineError::Spill { .. }), "{err}");
    assert!(
        err.to_string().contains(&*missing.to_string_lossy()),
        "{err}"
    );

    let later = combiner.combine_right(0, json!({"k": 2})).unwrap_err();
    assert!(matches!(later, CombineError::Poisoned { .. }), "{later}");
}

#[test]
fn json_text_that_does_not_parse_is_an_error_naming_the_collection_and_is_not_combined() {
    let mut combiner = new_combiner(1, usize::MAX);
    let err = combiner
        .combine_right_json(0, br#"{"k": 1, "n": }"#)
        .unwrap_err();
    assert!(matches!(err, CombineError::Parse { .. }), "{err}");
    assert!(err.to_string().contains("acme/c0"), "{err}");
    assert!(combiner.is_empty());
    let err = combiner
        .combine_right_json(0, b"{\"k\": \"\xff\"}")
        .unwrap_err();
    assert!(matches!(err, CombineError::Parse { .. }), "{err}");
    // The combiner stays usable: the next line is combined as usual.
    combiner
        .combine_right_json(0, br#"{"k": 1, "n": 2}"#)
        .unwrap();
    assert_eq!(
        Value::from(drain_all(combiner).remove(0).doc),
        json!({"k": 1, "n": 2})
    );
}

/// Any JSON value, with numbers across u64, i64 and f64 and strings beyond ASCII.
fn wide_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        Just(json!(-0.0)),
        "\\PC{0,6}".prop_map(Value::from),
        "[aé\u{1F600}\\\\\"\u{0}]{0,30}".prop_map(Value::from),
    ];
    leaf.prop_recursive(4, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::from),
            prop::collection::btree_map("\\PC{0,4}", inner, 0..20)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn compact_documents_convert_back_to_the_same_value(value in wide_json()) {
        prop_assert_eq!(Value::from(Doc::from(&value)), value.clone());
        prop_assert_eq!(Value::from(Doc::from(value.clone())), value);
    }

    /// Spilled runs hold any document exactly: numbers of every class, unicode, nesting.
    #[test]
    fn documents_of_any_shape_drain_unchanged_after_spilling(docs in prop::collection::vec(wide_json(), 1..8)) {
        let mut combiner = new_combiner(1, 0);
        for (k, doc) in docs.iter().enumerate() {
            combiner.combine_right_keyed(0, &key(k as i64), Doc::from(doc), false).unwrap();
        }
        prop_assert_eq!(combiner.stats().spilled_runs, docs.len());
        let drained: Vec<Value> = (drain_all(combiner).into_iter()).map(|d| Value::from(d.doc)).collect();
        prop_assert_eq!(drained, docs);
    }
}

/// Keys longer than what an entry keeps inline, and equal in it, must still be told
/// apart, reduced separately and drained in order (in both bindings).
#[test]
fn long_keys_sharing_their_first_bytes_stay_distinct_and_ordered() {
    let mut combiner = new_combiner(2, usize::MAX);
    let long_key = |i: u32| {
        pack_key(&[json!(format!(
            "a-shared-prefix-longer-than-16-bytes/{i:04}"
        ))])
    };
    let mut expected = BTreeMap::new();
    for round in 1..=3u64 {
        // Thousands of keys, so that some collide in the hash table's probing.
        for i in (0..3000u32).map(|i| i * 7919 % 3000) {
            for binding in [1u32, 0] {
                let doc = json!({"k": i, "n": round * u64::from(i + binding)});
                combiner
                    .combine_right_keyed(binding, &long_key(i), Doc::from(doc), false)
                    .unwrap();
                *expected.entry((binding, long_key(i))).or_insert(0) +=
                    round * u64::from(i + binding);
            }
        }
    }
    let drained: Vec<_> = drain_all(combiner)
        .into_iter()
        .map(|d| {
            (
                (d.binding, d.key),
                d.doc.get("n").and_then(Doc::as_u64).unwrap(),
            )
        })
        .collect();
    assert_eq!(drained, expected.into_iter().collect::<Vec<_>>());
}

// ---- Full reductions and non-associative bindings ----

fn spec_of(schema: Value, full: bool) -> BindingSpec {
    BindingSpec {
        schema: Arc::new(Schema::compile(&schema).expect("test schema compiles")),
        key: KeyExtractor::new(vec![Pointer::parse("/k").unwrap()], vec![None]),
        name: "acme/c".to_string(),
        full,
        deletions: full,
    }
}

/// Drains `docs` (the first loaded when `loaded`), reduced under `schema`, as JSON.
fn drain_docs(
    schema: Value,
    full: bool,
    loaded: Option<Value>,
    docs: &[Value],
    memory_budget: usize,
) -> Vec<(Value, bool)> {
    let opts = CombinerOptions {
        memory_budget,
        spill_dir: None,
        ..Default::default()
    };
    let mut combiner = Combiner::new(vec![spec_of(schema, full)], opts);
    if let Some(doc) = loaded {
        combiner.reduce_left(0, &key(1), Doc::from(doc)).unwrap();
    }
    for doc in docs {
        combiner.combine_right(0, doc.clone()).unwrap();
    }
    drain_all(combiner)
        .into_iter()
        .map(|d| (Value::from(d.doc), d.deleted))
        .collect()
}

fn deletable() -> Value {
    json!({
        "type": "object",
        "reduce": {"strategy": "merge"},
        "properties": {"n": {"reduce": {"strategy": "sum"}}, "gone": {"reduce": {"strategy": "lastWriteWins", "delete": true}}},
        "if": {"required": ["deleted"]},
        "then": {"reduce": {"strategy": "lastWriteWins", "delete": true}},
    })
}

#[test]
fn a_full_binding_drains_deleted_keys_as_deleted_and_finishes_the_rest() {
    for budget in [usize::MAX, 1] {
        let docs = [json!({"k": 1, "n": 1}), json!({"k": 1, "deleted": true})];
        assert_eq!(
            drain_docs(deletable(), true, None, &docs, budget),
            vec![(Value::Null, true)]
        );
        // Without `full` the tombstone drains as a document.
        assert_eq!(
            drain_docs(deletable(), false, None, &docs, budget),
            vec![(json!({"k": 1, "deleted": true}), false)]
        );
        let docs = [json!({"k": 1, "gone": 1, "n": 1}), json!({"k": 1, "n": 2})];
        assert_eq!(
            drain_docs(deletable(), true, None, &docs, budget),
            vec![(json!({"k": 1, "n": 3}), false)]
        );
        let loaded = json!({"k": 1, "n": 5});
        assert_eq!(
            drain_docs(deletable(), true, Some(loaded), &docs[1..], budget),
            vec![(json!({"k": 1, "n": 7}), false)]
        );
    }
}

fn non_associative() -> Value {
    json!({
        "type": "object",
        "reduce": {"strategy": "merge"},
        "properties": {"n": {"reduce": {"strategy": "sum"}}, "at": {"reduce": {"strategy": "lastWriteWins", "associative": false}}},
    })
}

#[test]
fn a_non_associative_binding_never_combines_new_documents_with_each_other() {
    let docs = [
        json!({"k": 1, "n": 1, "at": "a"}),
        json!({"k": 1, "n": 2, "at": "b"}),
        json!({"k": 1, "n": 3}),
    ];
    for budget in [usize::MAX, 1] {
        // A partial drain (delta updates, or into the next combiner) yields each one.
        let each: Vec<_> = docs.iter().map(|d| (d.clone(), false)).collect();
        assert_eq!(
            drain_docs(non_associative(), false, None, &docs, budget),
            each
        );
        // A full drain reduces them in order onto the left-most: the loaded one.
        let loaded = json!({"k": 1, "n": 10, "at": "z"});
        assert_eq!(
            drain_docs(non_associative(), true, Some(loaded), &docs, budget),
            vec![(json!({"k": 1, "n": 16, "at": "b"}), false)]
        );
    }
}

// ---- Deletions (`/_meta/op` = "d") in standard bindings ----

#[derive(Debug, Clone)]
enum Change {
    Upsert { k: i64, n: i64 },
    Delete { k: i64 },
    Load { k: i64, n: i64 },
}

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        5 => (0..8i64, -5..5i64).prop_map(|(k, n)| Change::Upsert { k, n }),
        2 => (0..8i64).prop_map(|k| Change::Delete { k }),
        1 => (0..8i64, -5..5i64).prop_map(|(k, n)| Change::Load { k, n }),
    ]
}

fn standard(full: bool) -> BindingSpec {
    BindingSpec {
        schema: schema(),
        key: KeyExtractor::new(vec![Pointer::parse("/k").unwrap()], vec![None]),
        name: "acme/c".to_string(),
        full,
        deletions: true,
    }
}

fn combiner_of(spec: BindingSpec, memory_budget: usize) -> Combiner {
    Combiner::new(
        vec![spec],
        CombinerOptions {
            memory_budget,
            spill_dir: None,
            ..Default::default()
        },
    )
}

fn deletion(k: i64) -> Value {
    json!({"k": k, "_meta": {"op": "d"}})
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, failure_persistence: None, ..ProptestConfig::default() })]

    /// A deletion starts its key over: the reference keeps, per key, only the documents
    /// after the last deletion, reduced from nothing (the loaded document counts only if
    /// no deletion came), and a key whose last document is a deletion drains deleted. The
    /// combiner must drain exactly that whatever its spills, both directly and through a
    /// partial combiner first (the reader's C1 into the committer's C2).
    #[test]
    fn a_deletion_starts_its_key_over_under_random_spills(
        changes in proptest::collection::vec(change(), 0..200),
        budget in budget(),
        through_partial in any::<bool>(),
    ) {
        let reducer_schema = schema();
        let mut model: BTreeMap<i64, (Option<Value>, Vec<Value>)> = BTreeMap::new();
        let mut full = combiner_of(standard(true), budget);
        let mut partial = combiner_of(standard(false), budget);
        let mut loads = Vec::new();
        for (seq, change) in changes.iter().enumerate() {
            let (k, doc) = match *change {
                Change::Upsert { k, n } => (k, json!({"k": k, "n": n, "log": [seq], "last": seq})),
                Change::Delete { k } => (k, deletion(k)),
                Change::Load { k, n } => {
                    let entry = model.entry(k).or_default();
                    if entry.0.is_none() {
                        let doc = json!({"k": k, "n": n * 100, "log": [-1], "last": -1});
                        entry.0 = Some(doc.clone());
                        loads.push((k, doc));
                    }
                    continue;
                }
            };
            model.entry(k).or_default().1.push(doc.clone());
            let into = if through_partial { &mut partial } else { &mut full };
            into.combine_right_json(0, doc.to_string().as_bytes()).unwrap();
        }
        // The committer loads while it moves C1's documents in, in any order.
        for (k, doc) in &loads {
            full.reduce_left(0, &key(*k), Doc::from(doc.clone())).unwrap();
        }
        if through_partial {
            for drained in drain_all(partial) {
                full.combine_right_keyed(0, &drained.key, drained.doc, drained.resets).unwrap();
            }
        }

        let expected: Vec<Drained> = model
            .into_iter()
            .filter(|(_, (left, rights))| left.is_some() || !rights.is_empty())
            .map(|(k, (left, rights))| {
                let loaded = left.is_some();
                let last_delete = rights.iter().rposition(|d| d.get("_meta").is_some());
                let docs: Vec<Value> = match last_delete {
                    Some(at) => rights[at + 1..].to_vec(),
                    None => left.into_iter().chain(rights).collect(),
                };
                let mut docs = docs.into_iter();
                let (doc, deleted) = match docs.next() {
                    None => (Value::Null, true),
                    Some(mut doc) => {
                        for rhs in docs {
                            reducer_schema.reducer().reduce(&mut doc, rhs, true).unwrap();
                        }
                        (doc, false)
                    }
                };
                Drained { binding: 0, key: key(k), doc: Doc::from(doc), full: loaded, deleted, resets: false }
            })
            .collect();
        prop_assert_eq!(drain_all(full), expected);
    }
}

/// A deletion is checked for its key only: the schema's required fields need not be
/// there. A delta-updates binding (no `deletions`) takes it as a document like any other.
#[test]
fn a_deletion_needs_only_its_key() {
    let schema = json!({
        "type": "object",
        "required": ["k", "n"],
        "properties": {"k": {"type": "integer"}, "n": {"type": "integer"}}
    });
    let mut standard = combiner_of(spec_with(schema.clone(), true), usize::MAX);
    standard.combine_right(0, deletion(1)).unwrap();
    let err = standard
        .combine_right(0, json!({"_meta": {"op": "d"}}))
        .unwrap_err();
    assert!(matches!(err, CombineError::Key { .. }), "{err}");
    let drained = drain_all(standard);
    assert!(drained[0].deleted, "{drained:?}");

    let mut delta = combiner_of(spec_with(schema, false), usize::MAX);
    delta.combine_right(0, json!({"k": 1, "n": 2})).unwrap();
    delta.combine_right(0, deletion(1)).unwrap();
    let drained = drain_all(delta);
    assert_eq!(
        Value::from(drained[0].doc.clone()),
        deletion(1),
        "the schema's last-write-wins reduction, as for any document"
    );
    assert!(!drained[0].deleted && !drained[0].resets, "{drained:?}");
}

fn spec_with(schema: Value, deletions: bool) -> BindingSpec {
    BindingSpec {
        schema: Arc::new(Schema::compile(&schema).expect("test schema compiles")),
        key: KeyExtractor::new(vec![Pointer::parse("/k").unwrap()], vec![None]),
        name: "acme/c".to_string(),
        full: deletions,
        deletions,
    }
}

/// A shard's combiner takes the new documents it is given (the reader routes them), and
/// refuses a loaded document whose key hashes outside its range: a driver bug.
#[test]
fn a_loaded_document_outside_the_key_range_fails() {
    use sluice_doc::{KeyRange, key_hash};
    let half = KeyRange {
        begin: 0,
        end: 0x7fff_ffff,
    };
    let mut low = Combiner::new(
        vec![binding("acme/c0")],
        CombinerOptions {
            key_range: half,
            ..Default::default()
        },
    );
    let outside = (0..97)
        .map(key)
        .find(|k| key_hash(k) > half.end)
        .expect("a key of the high half");
    let err = low
        .reduce_left(0, &outside, Doc::from(json!({"k": 1})))
        .unwrap_err();
    assert!(
        matches!(err, CombineError::OutsideRange { .. })
            && err
                .to_string()
                .contains("outside the shard's key range 00000000-7fffffff"),
        "{err}"
    );
}
