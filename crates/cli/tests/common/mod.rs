//! What the end-to-end tests share: the pageviews pipeline, its expected reduction
//! computed independently of Sluice's reducers, and running the binary.

// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Output;

pub const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// The expected row of one user: views and bytes summed, last_seen maximized.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Row {
    pub views: i64,
    pub bytes: i64,
    pub last_seen: String,
}

impl Row {
    /// Reduces one more document (or row) of this user into the row.
    pub fn add(&mut self, views: i64, bytes: i64, last_seen: &str) {
        self.views += views;
        self.bytes += bytes;
        if last_seen > self.last_seen.as_str() {
            self.last_seen = last_seen.to_string();
        }
    }
}

/// The reduction of `docs` per user, as the pipeline's schema says.
pub fn reduce_expected(docs: &[Value]) -> BTreeMap<String, Row> {
    let mut out: BTreeMap<String, Row> = BTreeMap::new();
    for doc in docs {
        out.entry(doc["user_id"].as_str().unwrap().to_string())
            .or_default()
            .add(
                doc["views"].as_i64().unwrap(),
                doc["bytes"].as_i64().unwrap(),
                doc["last_seen"].as_str().unwrap(),
            );
    }
    out
}

/// A pipeline of the pageviews collection: `source` is the YAML of the source's kind
/// (indented for the source), `endpoint` the endpoint's (indented for the endpoint).
/// Transactions hold exactly `max_docs` documents unless `max_duration` passes first
/// (they never close early otherwise), so tests know which documents each one holds.
pub fn pipeline_yaml(
    source: &str,
    endpoint: &str,
    delta_updates: bool,
    max_docs: u64,
    max_duration: &str,
) -> String {
    format!(
        r#"
collections:
  acme/pageviews:
    key: [/user_id]
    schema:
      type: object
      required: [user_id, views, bytes, last_seen]
      reduce: {{strategy: merge}}
      properties:
        user_id: {{type: string}}
        views: {{type: integer, reduce: {{strategy: sum}}}}
        bytes: {{type: integer, reduce: {{strategy: sum}}}}
        last_seen: {{type: string, reduce: {{strategy: maximize}}}}
sources:
  views-file:
    target: acme/pageviews
{source}
materializations:
  views-db:
    endpoint:
      {endpoint}
    bindings:
      - source: acme/pageviews
        resource: {{table: pageviews}}
        delta_updates: {delta_updates}
runtime:
  transactions: {{max_docs: {max_docs}, max_duration: {max_duration}, min_duration: {max_duration}}}
"#
    )
}

pub fn assert_success(out: &Output) {
    assert!(
        out.status.success(),
        "sluice run failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
}
