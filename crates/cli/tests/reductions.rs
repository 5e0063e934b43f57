//! End-to-end: Flow's reduction semantics through `sluice run` into SQLite: conditional
//! annotations (the merge-patch schema, the resettable counter), deletions of locations
//! and of whole documents, full reductions of standard bindings, partial ones (with
//! tombstones) of delta-updates bindings, and `associative: false`.

use serde_json::{Value, json};
use std::io::Write;
use std::process::Command;

use crate::common;

use common::{SLUICE, assert_success};

/// RFC 7396 merge patch as a reduction (objects merge, `null` deletes, anything else
/// replaces), plus a root deletion: a document with `deleted` deletes its key.
const MERGE_PATCH: &str = r##"
      $defs:
        mergePatch:
          if: {type: object}
          then:
            reduce: {strategy: merge}
            additionalProperties: {$ref: "#/$defs/mergePatch"}
          else:
            if: {type: "null"}
            then: {reduce: {strategy: lastWriteWins, delete: true}}
            else: {reduce: {strategy: lastWriteWins}}
      type: object
      required: [k]
      properties: {k: {type: string}}
      $ref: "#/$defs/mergePatch"
      if: {required: [deleted]}
      then: {reduce: {strategy: lastWriteWins, delete: true}}
"##;

/// Flow's resettable counter (reduction-strategies/composing-with-conditionals).
const RESETTABLE_COUNTER: &str = r#"
      type: object
      required: [k]
      properties: {k: {type: string}, value: {type: number}}
      oneOf:
        - required: [action]
          properties: {action: {const: reset}}
          reduce: {strategy: lastWriteWins}
        - required: [action]
          properties:
            action: {const: sum, reduce: {strategy: firstWriteWins}}
            value: {reduce: {strategy: sum}}
      reduce: {strategy: merge}
"#;

/// Runs `docs` (transactions of `per_txn` documents) through a pipeline whose collection
/// has `schema` (YAML indented for it), and returns the table's documents by key order.
fn run(schema: &str, delta_updates: bool, per_txn: usize, docs: &[Value]) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = format!(
        r#"
collections:
  acme/things:
    key: [/k]
    schema:
{schema}
sources:
  things-file:
    target: acme/things
    file: {{path: things.jsonl, format: json}}
materializations:
  things-db:
    endpoint:
      sqlite: {{path: out/things.db}}
    bindings:
      - source: acme/things
        resource: {{table: things}}
        delta_updates: {delta_updates}
runtime:
  transactions: {{max_docs: {per_txn}, max_duration: 30s, min_duration: 30s}}
"#
    );
    std::fs::write(dir.path().join("pipeline.yaml"), pipeline).unwrap();
    let mut input = std::fs::File::create(dir.path().join("things.jsonl")).unwrap();
    for doc in docs {
        writeln!(input, "{doc}").unwrap();
    }
    let out = Command::new(SLUICE)
        .arg("run")
        .arg(dir.path().join("pipeline.yaml"))
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert_success(&out);
    common::sqlite_things(&dir.path().join("out/things.db"))
        .iter()
        .map(|text| serde_json::from_str(text).unwrap())
        .collect()
}

#[test]
fn a_merge_patch_deletes_locations_and_documents_and_a_later_document_recreates_them() {
    let docs = [
        // 1: stored.
        json!({"k": "a", "x": 1, "y": {"z": 1}}),
        json!({"k": "b", "x": 1}),
        // 2: reduced onto what 1 stored: nulls delete, `deleted` deletes b's row.
        json!({"k": "a", "x": null, "y": {"z": null, "w": 2}}),
        json!({"k": "b", "deleted": true}),
        // 3: c is created and deleted within one transaction: never stored.
        json!({"k": "c", "x": 1}),
        json!({"k": "c", "deleted": true}),
        // 4: b and c come back from nothing.
        json!({"k": "b", "y": {"v": null, "u": 3}}),
        json!({"k": "c", "x": 7}),
    ];
    assert_eq!(
        run(MERGE_PATCH, false, 2, &docs),
        vec![
            json!({"k": "a", "y": {"w": 2}}),
            json!({"k": "b", "y": {"u": 3}}),
            json!({"k": "c", "x": 7}),
        ]
    );
}

#[test]
fn a_deleted_key_that_was_never_stored_leaves_no_row() {
    let docs = [
        json!({"k": "a", "x": 1}),
        json!({"k": "a", "deleted": true}),
    ];
    assert_eq!(run(MERGE_PATCH, false, 2, &docs), Vec::<Value>::new());
}

#[test]
fn a_delta_updates_binding_reduces_partially_and_keeps_tombstones() {
    let docs = [
        json!({"k": "a", "x": 1, "y": {"z": 1}}),
        json!({"k": "a", "x": null, "y": {"z": null}}),
    ];
    assert_eq!(
        run(MERGE_PATCH, true, 2, &docs),
        vec![json!({"k": "a", "x": null, "y": {"z": null}})]
    );
}

#[test]
fn a_resettable_counter_sums_and_resets_across_transactions() {
    let docs = [
        json!({"k": "a", "action": "sum", "value": 5}),
        json!({"k": "a", "action": "sum", "value": -1.25}),
        json!({"k": "a", "action": "reset", "value": 0}),
        json!({"k": "a", "action": "sum", "value": 1.5}),
        json!({"k": "b", "action": "sum", "value": 2}),
    ];
    assert_eq!(
        run(RESETTABLE_COUNTER, false, 2, &docs),
        vec![
            json!({"k": "a", "action": "reset", "value": 1.5}),
            json!({"k": "b", "action": "sum", "value": 2}),
        ]
    );
}

#[test]
fn set_removals_are_applied_and_dropped_by_a_full_reduction() {
    let schema = r#"
      type: object
      required: [k]
      reduce: {strategy: merge}
      properties:
        k: {type: string}
        tags: {reduce: {strategy: set}}
"#;
    let docs = [
        json!({"k": "a", "tags": {"add": ["x", "y"], "remove": ["q"]}}),
        json!({"k": "a", "tags": {"remove": ["x"]}}),
        json!({"k": "a", "tags": {"add": ["z"]}}),
    ];
    assert_eq!(
        run(schema, false, 1, &docs),
        vec![json!({"k": "a", "tags": {"add": ["y", "z"]}})]
    );
}

#[test]
fn non_associative_documents_are_never_combined_in_a_delta_binding() {
    let schema = r#"
      type: object
      required: [k]
      reduce: {strategy: lastWriteWins, associative: false}
      properties: {k: {type: string}}
"#;
    let docs = [
        json!({"k": "a", "n": 1}),
        json!({"k": "a", "n": 2}),
        json!({"k": "a", "n": 3}),
    ];
    assert_eq!(run(schema, true, 3, &docs), docs.to_vec());
    // A standard binding reduces them in order onto the left-most: one row.
    assert_eq!(run(schema, false, 3, &docs), vec![docs[2].clone()]);
}
