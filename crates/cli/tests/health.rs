//! Health and parse errors end to end, through the `sluice` binary:
//!
//! - a followed file with a line that is not JSON and a line over the source's
//!   `max_document_size`, under `on_error: skip`: `/api/status` counts both as its
//!   parse errors, `/metrics` has `sluice_source_parse_errors_total`, the source's
//!   memory and every part's health (0: healthy), and `sluice status` prints them;
//! - a line that is not JSON under `on_error: fail` (the default) ends the run: the
//!   source is fatal with the error, which `sluice status` reads from what the shard
//!   left.

use serde_json::Value;
use sluice_http::client::Client;
use std::process::{Command, Stdio};

use crate::common;

use common::{PATIENCE, SLUICE, free_address, sluice_status, user_ids_into_sqlite, wait_until};

const SHARD: &str = r#"materialization="views-db",shard="00000000-ffffffff""#;

/// The pageviews collection from a file source (`file`: the source's YAML under
/// `views-file:`) into SQLite.
fn pipeline(file: &str) -> String {
    user_ids_into_sqlite(&format!(
        "  views-file:\n    target: acme/pageviews\n{file}"
    ))
}

/// Two good lines, one that is not JSON, one over 1 KiB.
fn input() -> String {
    let long = "x".repeat(2000);
    format!(
        "{{\"user_id\": \"a\"}}\n{{\"user_id\": \"b\"\n{{\"user_id\": \"{long}\"}}\n{{\"user_id\": \"c\"}}\n"
    )
}

#[test]
fn bad_lines_count_as_parse_errors_beside_memory_and_health() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("views.jsonl"), input()).unwrap();
    let pipeline = dir.path().join("pipeline.yaml");
    let file = "    file: {path: views.jsonl, format: json, follow: true, max_document_size: 1KiB}
    on_error: skip
    dead_letter: rejected/views.jsonl";
    std::fs::write(&pipeline, self::pipeline(file)).unwrap();
    let address = free_address();
    let mut child = Command::new(SLUICE)
        .args(["run", "--follow", "--metrics", &address.to_string()])
        .arg(&pipeline)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut client = Client::new(address, "");
    let status: Value = wait_until("two documents", PATIENCE, || {
        assert!(child.try_wait().unwrap().is_none(), "sluice run exited");
        let status: Value = client.request("GET", "/api/status", &[], b"").ok()?.json();
        Some(status).filter(|s| s["shards"][0]["documents"] == 2)
    });
    let scraped = client.request("GET", "/metrics", &[], b"").unwrap();
    let text = String::from_utf8(scraped.body).unwrap();
    let printed = sluice_status(&pipeline, &["--metrics", &address.to_string()]);
    let _ = child.kill();
    let _ = child.wait();

    let shard = &status["shards"][0];
    let source = &shard["sources"]["views-file"];
    assert_eq!(source["parse_errors"], 2, "{source}");
    assert_eq!(source["dead_lettered"], 2, "{source}");
    assert_eq!(
        source["health"],
        serde_json::json!({"state": "healthy"}),
        "{source}"
    );
    assert!(source["memory"].is_u64(), "{source}");
    assert_eq!(shard["endpoint"]["health"]["state"], "healthy", "{shard}");
    assert!(shard["memory"]["read_combiner"].is_u64(), "{shard}");
    for line in [
        format!(r#"sluice_source_parse_errors_total{{{SHARD},source="views-file"}} 2"#),
        format!(r#"sluice_source_health{{{SHARD},source="views-file"}} 0"#),
        format!(r#"sluice_endpoint_health{{{SHARD}}} 0"#),
        format!(r#"sluice_source_memory_bytes{{{SHARD},source="views-file"}} "#),
    ] {
        assert!(text.contains(&line), "{line} in {text}");
    }
    assert!(
        printed.contains("2 dead-lettered, 2 parse errors"),
        "{printed}"
    );
    assert!(printed.contains("    health: healthy\n"), "{printed}");
    assert!(printed.contains("  endpoint: healthy, holds "), "{printed}");
}

#[test]
fn a_bad_line_that_ends_the_run_leaves_its_source_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let input = "{\"user_id\": \"a\"}\n{\"user_id\": \"b\"\n{\"user_id\": \"c\"}\n";
    std::fs::write(dir.path().join("views.jsonl"), input).unwrap();
    let pipeline = dir.path().join("pipeline.yaml");
    let file = "    file: {path: views.jsonl, format: json}";
    std::fs::write(&pipeline, self::pipeline(file)).unwrap();
    let run = Command::new(SLUICE)
        .arg("run")
        .arg(&pipeline)
        .output()
        .unwrap();
    assert!(!run.status.success(), "line 2 is not JSON");

    let printed = sluice_status(&pipeline, &[]);
    let fatal = printed
        .split("  source views-file: failed")
        .nth(1)
        .unwrap_or_else(|| panic!("no failed source in {printed}"));
    let health = fatal.lines().nth(1).unwrap_or_default();
    assert!(health.starts_with("    health: fatal: "), "{printed}");
    assert!(
        health.contains("views.jsonl"),
        "names the position: {printed}"
    );
    assert!(health.contains("(source views-file)"), "{printed}");
    assert!(fatal.contains("1 parse errors"), "{printed}");
    assert!(printed.contains("  endpoint: healthy, holds "), "{printed}");
}
