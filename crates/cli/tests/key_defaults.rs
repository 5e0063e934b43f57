//! End-to-end through `sluice run` into SQLite, with a collection schema written as for
//! Flow: a key location a document lacks takes the schema's `default` (and a document
//! lacking one with no default stops the run at its file and line), numbers written as
//! strings sum exactly into strings, and the schema, having no `$schema`, is read in draft
//! 2019-09 (its tuple `items` would not compile in 2020-12).

use rusqlite::Connection;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use crate::common;

use common::{SLUICE, assert_success};

const PIPELINE: &str = r#"
collections:
  acme/orders:
    key: [/region, /id]
    schema:
      type: object
      reduce: {strategy: merge}
      properties:
        region: {type: string, default: eu}
        id: {type: integer}
        amount: {type: [string, integer, number], reduce: {strategy: sum}}
        pair:
          type: array
          items: [{type: string}, {type: integer}]
          additionalItems: false
sources:
  orders-file:
    target: acme/orders
    file: {path: orders.jsonl, format: json}
materializations:
  orders-db:
    endpoint:
      sqlite: {path: out/orders.db}
    bindings:
      - source: acme/orders
        resource: {table: orders}
"#;

/// Writes the pipeline and `lines` as its input, and runs it.
fn run(dir: &Path, lines: &[Value]) -> Output {
    std::fs::write(dir.join("pipeline.yaml"), PIPELINE).unwrap();
    let text: String = lines.iter().map(|doc| format!("{doc}\n")).collect();
    std::fs::write(dir.join("orders.jsonl"), text).unwrap();
    Command::new(SLUICE)
        .arg("run")
        .arg(dir.join("pipeline.yaml"))
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

/// The table as (region, id) → the stored document.
fn table(dir: &Path) -> BTreeMap<(String, i64), Value> {
    let conn = Connection::open(dir.join("out/orders.db")).unwrap();
    let mut stmt = conn
        .prepare(r#"SELECT "region", "id", "flow_document" FROM "orders""#)
        .unwrap();
    stmt.query_map([], |r| {
        let doc: String = r.get(2)?;
        Ok(((r.get(0)?, r.get(1)?), serde_json::from_str(&doc).unwrap()))
    })
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

#[test]
fn documents_lacking_a_key_location_land_under_its_default() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        dir.path(),
        &[
            json!({"id": 1, "amount": "1.5", "pair": ["a", 1]}),
            json!({"region": "eu", "id": 1, "amount": 2}),
            json!({"region": "us", "id": 1, "amount": "0.25"}),
            json!({"id": 2, "amount": "99999999999999999999"}),
            json!({"id": 2, "amount": 1}),
        ],
    );
    assert_success(&out);
    let rows = table(dir.path());
    let keys: Vec<_> = rows.keys().cloned().collect();
    assert_eq!(
        keys,
        [("eu".into(), 1), ("eu".into(), 2), ("us".into(), 1)],
        "the documents without a region are keyed by the default"
    );
    assert_eq!(rows[&("eu".into(), 1)]["amount"], json!("3.5"));
    assert_eq!(rows[&("eu".into(), 1)]["pair"], json!(["a", 1]));
    assert_eq!(
        rows[&("eu".into(), 2)]["amount"],
        json!("100000000000000000000")
    );
    assert_eq!(rows[&("us".into(), 1)]["amount"], json!("0.25"));
}

#[test]
fn a_document_lacking_a_key_location_without_default_stops_at_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        dir.path(),
        &[
            json!({"id": 1, "amount": 1}),
            json!({"region": "us", "amount": 1}),
        ],
    );
    assert!(!out.status.success(), "the run must stop");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("orders.jsonl:2"),
        "names file and line: {stderr}"
    );
    assert!(
        stderr.contains("missing key location /id, which has no default"),
        "says what is missing: {stderr}"
    );
}

/// The tuple form is read as 2019-09 reads it: an item of the wrong type, or one past
/// the tuple (`additionalItems: false`), is invalid.
#[test]
fn tuple_items_are_validated_as_draft_2019_09_reads_them() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        dir.path(),
        &[
            json!({"id": 1, "pair": ["a", 1]}),
            json!({"id": 2, "pair": ["a", 1, true]}),
        ],
    );
    assert!(!out.status.success(), "the run must stop");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("orders.jsonl:2"),
        "names file and line: {stderr}"
    );
    assert!(stderr.contains("/pair"), "names the location: {stderr}");
}
