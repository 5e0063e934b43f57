//! End-to-end into the real Redis at 127.0.0.1:6379: `sluice run` of the pageviews
//! pipeline under `delivery: at_least_once` stores every user's reduced document under
//! the binding's prefix, and `sluice check` of the same pipeline under the default
//! `exactly_once` is refused, naming the driver's non-transactional pattern. The test's
//! keys have a prefix of their own and are deleted afterwards (never FLUSHDB).

use serde_json::Value;
use std::collections::BTreeMap;
use std::process::{Command, Output};

use crate::common;

use common::{
    REDIS_URL as URL, Row, SLUICE, assert_success, generate, pipeline_yaml, redis, redis_keys,
    reduce_expected, serve_driver, write_lines,
};

/// The test's key prefix; every key under it is deleted when dropped (SCAN + UNLINK
/// over a one-off connection).
struct Keys {
    prefix: String,
}

impl Keys {
    fn new(test: &str) -> Keys {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        Keys {
            prefix: format!("sluice-test:{test}:{nanos:x}:{}:", std::process::id()),
        }
    }

    /// Every key under the prefix and its document.
    fn documents(&self) -> BTreeMap<String, Value> {
        redis(async |conn| {
            let mut docs = BTreeMap::new();
            for key in redis_keys(conn, &self.prefix).await {
                let text: String = redis::cmd("GET").arg(&key).query_async(conn).await.unwrap();
                docs.insert(key, serde_json::from_str(&text).unwrap());
            }
            docs
        })
    }
}

impl Drop for Keys {
    fn drop(&mut self) {
        let prefix = self.prefix.clone();
        redis(async |conn| {
            sluice_redis::client::delete_prefix(conn, &prefix)
                .await
                .unwrap();
        });
    }
}

fn sluice(dir: &std::path::Path, args: &[&str]) -> Output {
    Command::new(SLUICE)
        .args(args)
        .current_dir(dir)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

/// The pageviews pipeline into Redis under `prefix`; `delivery` at the top if given.
fn pipeline(prefix: &str, delivery: Option<&str>) -> String {
    let yaml = pipeline_yaml(
        "    file: {path: views.jsonl, format: json}",
        &format!("redis: {{url: \"{URL}\"}}"),
        false,
        500,
        "1s",
    )
    .replace(
        "resource: {table: pageviews}",
        &format!("resource: {{prefix: \"{prefix}\"}}"),
    );
    match delivery {
        Some(delivery) => format!("delivery: {delivery}\n{yaml}"),
        None => yaml,
    }
}

#[test]
fn sluice_run_stores_every_reduced_document_under_the_prefix_at_least_once() {
    let keys = Keys::new("e2e");
    let dir = tempfile::tempdir().unwrap();
    let docs = generate(3_000, 200, 61);
    write_lines(&dir.path().join("views.jsonl"), &docs);

    std::fs::write(
        dir.path().join("pipeline.yaml"),
        pipeline(&keys.prefix, None),
    )
    .unwrap();
    let refused = sluice(dir.path(), &["check", "pipeline.yaml"]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success(),
        "exactly_once admitted a non-transactional driver"
    );
    assert!(stderr.contains("non-transactional"), "{stderr}");

    let yaml = pipeline(&keys.prefix, Some("at_least_once"));
    std::fs::write(dir.path().join("pipeline.yaml"), yaml).unwrap();
    assert_success(&sluice(dir.path(), &["check", "pipeline.yaml"]));
    assert_success(&sluice(dir.path(), &["run", "pipeline.yaml"]));

    let expected = reduce_expected(&docs);
    let stored: BTreeMap<String, Row> = (keys.documents().into_iter())
        .map(|(key, doc)| {
            // The key is the prefix and the hex of the packed collection key.
            let packed = sluice_doc::tuple::pack_key(std::slice::from_ref(&doc["user_id"]));
            assert_eq!(key, sluice_redis::key::encode(&keys.prefix, &packed));
            (doc["user_id"].as_str().unwrap().to_string(), Row::of(&doc))
        })
        .collect();
    assert_eq!(stored.len(), expected.len(), "one key per user");
    assert_eq!(stored, expected);
}

/// The same pipeline through the Redis driver served by another process in Flow's
/// current protocol, over gRPC: every reduced document stored once per user.
#[test]
fn a_pipeline_runs_through_the_redis_driver_served_in_the_current_protocol() {
    let keys = Keys::new("current");
    let dir = tempfile::tempdir().unwrap();
    let docs = generate(2_000, 150, 62);
    write_lines(&dir.path().join("views.jsonl"), &docs);
    let (_served, address) = serve_driver("redis", "127.0.0.1:0", "current");
    let endpoint = format!(
        "grpc: {{address: \"{address}\", protocol: current, pattern: non_transactional, \
         config: {{url: \"{URL}\"}}}}"
    );
    let yaml = pipeline(&keys.prefix, Some("at_least_once"))
        .replace(&format!("redis: {{url: \"{URL}\"}}"), &endpoint);
    std::fs::write(dir.path().join("pipeline.yaml"), yaml).unwrap();
    assert_success(&sluice(dir.path(), &["run", "pipeline.yaml"]));
    let stored: BTreeMap<String, Row> = (keys.documents().into_values())
        .map(|doc| (doc["user_id"].as_str().unwrap().to_string(), Row::of(&doc)))
        .collect();
    assert_eq!(stored, reduce_expected(&docs));
}
