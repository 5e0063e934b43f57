//! The pipeline file: what parses, what defaults apply, and that every error names
//! its place.
//!
//! Sources are the real `file` and `datagen` kinds; the driver kinds are stand-ins
//! (the memory driver) under the built-ins' names, checking the same configurations:
//! what is tested is how the pipeline file reads kinds, not the drivers.

use serde::Deserialize;
use serde_json::json;
use sluice_datagen::{DatagenConfig, DatagenKind};
use sluice_driver_sdk::Builtin;
use sluice_driver_sdk::flow::EndpointType;
use sluice_file::{FileConfig, FileFormat, FileKind};
use sluice_memory::MemoryDriver;
use sluice_runtime::config::{ConfigError, EndpointDef, OnError, Pipeline, ShardDef};
use sluice_runtime::registry::{Command, Registry};
use sluice_source_sdk::kind;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

const DESIGN_EXAMPLE: &str = r#"
collections:
  acme/pageviews:
    key: [/user_id]
    schema:
      type: object
      required: [user_id]
      reduce: {strategy: merge}
      properties:
        user_id: {type: string}
        views: {type: integer, reduce: {strategy: sum}}
        last_seen: {type: string, reduce: {strategy: maximize}}

sources:
  views-file:
    target: acme/pageviews
    file: {path: data/views.jsonl, format: json}

materializations:
  views-db:
    endpoint:
      sqlite: {path: out/views.db}
    bindings:
      - source: acme/pageviews
        resource: {table: pageviews}
"#;

/// A database file's endpoint: `{path}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[expect(dead_code, reason = "only parsed, to check the pipeline file")]
struct PathEndpoint {
    path: PathBuf,
}

/// A server's endpoint: `{url, schema?}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[expect(dead_code, reason = "only parsed, to check the pipeline file")]
struct UrlEndpoint {
    url: String,
    schema: Option<String>,
}

fn registry() -> Registry {
    let memory = || -> Arc<dyn sluice_driver_sdk::Driver> { Arc::new(MemoryDriver::new()) };
    Registry::new()
        .with_source(kind::<FileKind>())
        .with_source(kind::<DatagenKind>())
        .with_builtin(Builtin::new::<PathEndpoint>(
            "sqlite",
            EndpointType::Sqlite,
            &["path"],
            memory,
        ))
        .with_builtin(Builtin::new::<UrlEndpoint>(
            "postgres",
            EndpointType::SluicePostgres,
            &[],
            memory,
        ))
        .with_driver(Command)
}

fn parse(text: &str) -> Result<Pipeline, ConfigError> {
    Pipeline::parse(text, Path::new("/pipelines"), &registry())
}

fn file_config(p: &Pipeline) -> &FileConfig {
    p.sources["views-file"].config.get().expect("a file source")
}

fn endpoint(kind: &str, config: serde_json::Value) -> EndpointDef {
    EndpointDef {
        kind: kind.to_string(),
        config,
    }
}

fn error(text: &str) -> String {
    parse(text)
        .expect_err("the pipeline is invalid")
        .to_string()
}

#[test]
fn design_example_parses_with_defaults() {
    let p = parse(DESIGN_EXAMPLE).unwrap();
    let source = &p.sources["views-file"];
    assert_eq!(source.target, "acme/pageviews");
    assert_eq!(source.on_error, OnError::Fail);
    let file = file_config(&p);
    assert_eq!(file.path, Path::new("/pipelines/data/views.jsonl"));
    assert_eq!(file.format, FileFormat::Json);
    assert!(!file.follow);
    let m = &p.materializations["views-db"];
    assert_eq!(
        m.endpoint,
        endpoint("sqlite", json!({"path": "/pipelines/out/views.db"}))
    );
    assert_eq!(m.shard, ShardDef::default());
    assert!(!m.bindings[0].delta_updates);
    assert_eq!(m.bindings[0].resource, json!({"table": "pageviews"}));
    assert_eq!(p.runtime.transactions.max_docs, 1_000_000);
    assert_eq!(p.runtime.transactions.max_bytes, 256 << 20);
    assert_eq!(p.runtime.transactions.max_duration, Duration::from_secs(5));
    assert_eq!(p.runtime.transactions.min_duration, Duration::ZERO);
    assert_eq!(p.runtime.memory_budget, 256 << 20);
    assert_eq!(p.recovery_log(), Path::new("/pipelines/.sluice/pipeline"));
}

#[test]
fn load_resolves_paths_against_the_file_folder_and_names_the_log_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("views.yaml");
    std::fs::write(&path, DESIGN_EXAMPLE).unwrap();
    let p = Pipeline::load(&path, &registry()).unwrap();
    assert_eq!(p.recovery_log(), dir.path().join(".sluice/views"));
    assert_eq!(file_config(&p).path, dir.path().join("data/views.jsonl"));
}

#[test]
fn absolute_paths_are_kept() {
    let text = DESIGN_EXAMPLE.replace("data/views.jsonl", "/srv/views.jsonl");
    let p = parse(&text).unwrap();
    assert_eq!(file_config(&p).path, Path::new("/srv/views.jsonl"));
}

#[test]
fn unknown_key_is_an_error_naming_its_place() {
    let text = DESIGN_EXAMPLE.replace("format: json}", "format: json, folow: true}");
    let e = error(&text);
    assert!(e.starts_with("sources.views-file.file"), "{e}");
    assert!(e.contains("unknown field `folow`"), "{e}");
}

#[test]
fn a_misspelt_source_key_is_named_with_what_it_may_mean() {
    let text = DESIGN_EXAMPLE.replace("    target: acme/pageviews", "    taget: acme/pageviews");
    assert_eq!(
        error(&text),
        "sources.views-file: unknown field `taget`, did you mean `target`? (the source kinds \
         are datagen, file)"
    );
    let text = DESIGN_EXAMPLE.replace("    target: acme/pageviews\n", "");
    assert_eq!(
        error(&text),
        "sources.views-file: missing field `target`: the collection this source writes into"
    );
}

#[test]
fn missing_field_names_its_place() {
    let text = DESIGN_EXAMPLE.replace("        resource: {table: pageviews}\n", "");
    let e = error(&text);
    assert!(
        e.starts_with("materializations.views-db.bindings[0]"),
        "{e}"
    );
    assert!(e.contains("missing field `resource`"), "{e}");
}

#[test]
fn unknown_collection_names_the_defined_ones() {
    let text = DESIGN_EXAMPLE.replace("- source: acme/pageviews", "- source: acme/x");
    assert_eq!(
        error(&text),
        r#"materializations.views-db.bindings[0].source: unknown collection "acme/x" (defined: acme/pageviews)"#
    );
    let text = DESIGN_EXAMPLE.replace("target: acme/pageviews", "target: acme/y");
    assert!(error(&text).starts_with("sources.views-file.target: unknown collection \"acme/y\""));
}

#[test]
fn invalid_key_pointer_names_its_place() {
    let text = DESIGN_EXAMPLE.replace("key: [/user_id]", "key: [user_id]");
    let e = error(&text);
    assert!(e.starts_with("collections.acme/pageviews.key[0]"), "{e}");
    assert!(e.contains("user_id"), "{e}");
}

#[test]
fn schema_that_does_not_compile_names_its_collection() {
    let text = DESIGN_EXAMPLE.replace("{strategy: sum}", "{strategy: summ}");
    let e = error(&text);
    assert!(e.starts_with("collections.acme/pageviews.schema: "), "{e}");
    assert!(e.contains("summ"), "{e}");
}

#[test]
fn unknown_endpoint_lists_the_known_ones() {
    let text = DESIGN_EXAMPLE.replace("sqlite: {path", "sqlit: {path");
    let e = error(&text);
    assert!(e.starts_with("materializations.views-db.endpoint"), "{e}");
    assert!(e.contains("sqlite") && e.contains("postgres"), "{e}");
}

#[test]
fn a_source_needs_exactly_one_kind() {
    let text = DESIGN_EXAMPLE.replace(
        "file: {path: data/views.jsonl, format: json}",
        "file: {path: data/views.jsonl, format: json}\n    datagen: {keys: 3}",
    );
    let e = error(&text);
    assert!(
        e.starts_with("sources.views-file: set exactly one of"),
        "{e}"
    );
}

#[test]
fn yaml_syntax_error_reports_line_and_column() {
    let text = "collections:\n  a:\n    key: [/id\n    schema: {}\n";
    match parse(text) {
        Err(ConfigError::Syntax { line, column, .. }) => {
            assert!(line >= 3, "line {line}");
            assert!(column > 0);
        }
        other => panic!("expected a syntax error, got {other:?}"),
    }
    assert!(error(text).starts_with("invalid YAML at line"));
}

#[test]
fn environment_variables_expand_in_every_string() {
    let home = std::env::var("HOME").expect("HOME is set");
    let text = DESIGN_EXAMPLE
        .replace(
            "{table: pageviews}",
            "{table: \"t_${HOME}\", note: \"$${HOME}\"}",
        )
        .replace("path: out/views.db", "path: \"${HOME}/views.db\"");
    let p = parse(&text).unwrap();
    let m = &p.materializations["views-db"];
    assert_eq!(
        m.bindings[0].resource,
        json!({"table": format!("t_{home}"), "note": "${HOME}"})
    );
    assert_eq!(
        m.endpoint,
        endpoint("sqlite", json!({"path": Path::new(&home).join("views.db")}))
    );
}

#[test]
fn a_secret_file_expands_to_its_content_relative_to_the_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("table-name"), "from_a_file\n").unwrap();
    let text = DESIGN_EXAMPLE.replace(
        "{table: pageviews}",
        "{table: \"t_${file:table-name}\", other: \"${file:missing:-fallback}\"}",
    );
    let p = Pipeline::parse(&text, dir.path(), &registry()).unwrap();
    assert_eq!(
        p.materializations["views-db"].bindings[0].resource,
        json!({"table": "t_from_a_file", "other": "fallback"})
    );
    let text = DESIGN_EXAMPLE.replace("{table: pageviews}", "{table: \"${file:nope}\"}");
    let e = Pipeline::parse(&text, dir.path(), &registry())
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("materializations.views-db.bindings[0].resource.table: cannot read the file")
            && e.contains("nope of ${file:…}"),
        "{e}"
    );
}

#[test]
fn unset_environment_variable_is_named_with_its_place() {
    let text = DESIGN_EXAMPLE.replace(
        "path: out/views.db",
        "path: \"${SLUICE_TEST_SURELY_UNSET}/views.db\"",
    );
    let e = error(&text);
    assert!(
        e.starts_with("materializations.views-db.endpoint.sqlite.path: environment variable ${SLUICE_TEST_SURELY_UNSET} is not set"),
        "{e}"
    );
}

#[test]
fn a_default_stands_for_an_unset_or_empty_variable_and_only_then() {
    let home = std::env::var("HOME").expect("HOME is set");
    let text = DESIGN_EXAMPLE
        .replace(
            "{table: pageviews}",
            "{table: \"${SLUICE_TEST_SURELY_UNSET:-views}\", schema: \"${HOME:-nowhere}\"}",
        )
        .replace(
            "path: out/views.db",
            "path: \"${SLUICE_TEST_SURELY_UNSET:-/srv/db}/${SLUICE_TEST_SURELY_UNSET:-}views.db\"",
        );
    let p = parse(&text).unwrap();
    let m = &p.materializations["views-db"];
    assert_eq!(
        m.bindings[0].resource,
        json!({"table": "views", "schema": home})
    );
    assert_eq!(
        m.endpoint,
        endpoint("sqlite", json!({"path": "/srv/db/views.db"}))
    );
    // Each default taken is recorded with its place; a set variable's is not.
    let mut defaulted: Vec<(&str, &str, &str, bool)> = (p.defaulted.iter())
        .map(|d| {
            (
                d.place.as_str(),
                d.var.as_str(),
                d.default.as_str(),
                d.empty,
            )
        })
        .collect();
    defaulted.sort();
    let unset = "SLUICE_TEST_SURELY_UNSET";
    let (table, path) = (
        "materializations.views-db.bindings[0].resource.table",
        "materializations.views-db.endpoint.sqlite.path",
    );
    assert_eq!(
        defaulted,
        [
            (table, unset, "views", false),
            (path, unset, "", false),
            (path, unset, "/srv/db", false),
        ]
    );
    let srv = p.defaulted.iter().find(|d| d.default == "/srv/db").unwrap();
    assert_eq!(
        srv.explain(),
        "the default of ${SLUICE_TEST_SURELY_UNSET:-/srv/db}: SLUICE_TEST_SURELY_UNSET is not set"
    );
    assert!(srv.within("materializations.views-db.endpoint"));
    assert!(srv.within(path));
    assert!(!srv.within("materializations.views-db.endpoint.sqlite.pa"));
    assert!(!srv.within("materializations.views-db.bindings[0]"));
}

#[test]
fn a_change_whose_place_took_a_default_names_the_variable() {
    use sluice_runtime::applied::{Change, Written, describe};
    let text = DESIGN_EXAMPLE
        .replace(
            "{table: pageviews}",
            "{table: \"${SLUICE_TEST_SURELY_UNSET:-views}\"}",
        )
        .replace(
            "path: out/views.db",
            "path: \"${SLUICE_TEST_SURELY_UNSET:-/srv/views.db}\"",
        );
    let p = parse(&text).unwrap();
    let change = |what: &str, written: Option<Written>| Change {
        what: what.to_string(),
        written,
    };
    let changes = [
        change(
            r#"endpoint.path "/a.db" → "/srv/views.db""#,
            Some(Written::Endpoint("path".into())),
        ),
        change(
            "endpoint.wal unset → true",
            Some(Written::Endpoint("wal".into())),
        ),
        change("binding views was added", Some(Written::Binding(0))),
        change(
            "binding views: the spec of collection acme/pageviews (schema, key or projections)",
            Some(Written::Collection("acme/pageviews".into())),
        ),
        change("binding pageviews was removed", None),
    ];
    let unset = "SLUICE_TEST_SURELY_UNSET is not set";
    assert_eq!(
        describe(&changes, &p, "views-db"),
        [
            format!(
                r#"endpoint.path "/a.db" → "/srv/views.db" (the default of ${{SLUICE_TEST_SURELY_UNSET:-/srv/views.db}}: {unset})"#
            ),
            "endpoint.wal unset → true".to_string(),
            format!(
                "binding views was added (the default of ${{SLUICE_TEST_SURELY_UNSET:-views}}: {unset})"
            ),
            changes[3].what.clone(),
            changes[4].what.clone(),
        ]
        .join("; ")
    );
}

#[test]
fn runtime_bounds_accept_durations_and_sizes() {
    let text = format!(
        "{DESIGN_EXAMPLE}runtime:\n  recovery_log: /var/lib/sluice/views\n  memory_budget: 1GiB\n  transactions: {{max_docs: 10, max_bytes: 512KiB, max_duration: 250ms, min_duration: 1m}}\n"
    );
    let p = parse(&text).unwrap();
    let t = p.runtime.transactions;
    assert_eq!(t.max_docs, 10);
    assert_eq!(t.max_bytes, 512 << 10);
    assert_eq!(t.max_duration, Duration::from_millis(250));
    assert_eq!(t.min_duration, Duration::from_secs(60));
    assert_eq!(p.runtime.memory_budget, 1 << 30);
    assert_eq!(p.recovery_log(), Path::new("/var/lib/sluice/views"));
}

#[test]
fn timeouts_default_generously_and_read_as_durations() {
    let defaults = parse(DESIGN_EXAMPLE).unwrap().runtime.timeouts;
    assert_eq!(defaults.driver, Duration::from_secs(300));
    assert_eq!(defaults.source, Duration::from_secs(60));
    let text = format!("{DESIGN_EXAMPLE}runtime:\n  timeouts: {{driver: 2s, source: 1.5s}}\n");
    let timeouts = parse(&text).unwrap().runtime.timeouts;
    assert_eq!(timeouts.driver, Duration::from_secs(2));
    assert_eq!(timeouts.source, Duration::from_millis(1500));
}

#[test]
fn the_metrics_address_is_off_by_default_and_an_ip_and_port() {
    assert_eq!(parse(DESIGN_EXAMPLE).unwrap().runtime.metrics, None);
    let text = format!("{DESIGN_EXAMPLE}runtime:\n  metrics: 127.0.0.1:9464\n");
    let server = parse(&text).unwrap().runtime.metrics.unwrap();
    assert_eq!(server.listen.to_string(), "127.0.0.1:9464");
    assert_eq!((server.tls, server.token), (None, None));
    let e = error(&format!("{DESIGN_EXAMPLE}runtime:\n  metrics: 9464\n"));
    assert!(e.starts_with("runtime.metrics: "), "{e}");
}

#[test]
fn the_metrics_server_takes_tls_and_a_token_and_names_what_is_wrong() {
    let with = |metrics: &str| format!("{DESIGN_EXAMPLE}runtime:\n  metrics: {metrics}\n");
    let server = parse(&with("{listen: \"0.0.0.0:9464\", token: t0k}")).unwrap();
    let server = server.runtime.metrics.unwrap();
    assert_eq!(server.listen.to_string(), "0.0.0.0:9464");
    assert_eq!(server.token.as_deref(), Some("t0k"));
    // `--metrics ADDR` replaces the address only.
    let moved = parse(&with("{listen: \"0.0.0.0:9464\", token: t0k}")).unwrap();
    let moved = moved
        .runtime
        .metrics_server(Some("127.0.0.1:1".parse().unwrap()));
    assert_eq!(
        moved.as_ref().map(|m| m.listen.to_string()).as_deref(),
        Some("127.0.0.1:1")
    );
    assert_eq!(moved.and_then(|m| m.token).as_deref(), Some("t0k"));
    for (metrics, needle) in [
        (
            "{listen: \"127.0.0.1:9464\", port: 1}",
            "unknown field `port`",
        ),
        (
            "{listen: \"127.0.0.1:9464\", token: \"\"}",
            "an empty token would let anyone in",
        ),
        (
            "{listen: \"127.0.0.1:9464\", tls: {certificate: s.crt, key: s.key}}",
            "runtime.metrics.tls.certificate: cannot read the certificate file /pipelines/s.crt",
        ),
    ] {
        let e = error(&with(metrics));
        assert!(e.starts_with("runtime.metrics"), "{metrics}: {e}");
        assert!(e.contains(needle), "{metrics}: {e}");
    }
}

#[test]
fn etcd_tls_files_are_read_when_the_pipeline_is() {
    let text = format!(
        "{DESIGN_EXAMPLE}cluster:\n  etcd: [\"https://localhost:2379\"]\n  member: m1\n  \
         tls: {{ca: certs/ca.crt}}\n"
    );
    let e = error(&text);
    assert!(
        e.starts_with("cluster.tls.ca: cannot read the certificate file /pipelines/certs/ca.crt"),
        "{e}"
    );
}

#[test]
fn a_zero_timeout_names_its_place() {
    let text = format!("{DESIGN_EXAMPLE}runtime:\n  timeouts: {{source: 0s}}\n");
    let e = error(&text);
    assert!(e.starts_with("runtime.timeouts.source: "), "{e}");
}

#[test]
fn invalid_duration_names_its_place_and_the_expected_form() {
    let text = format!("{DESIGN_EXAMPLE}runtime:\n  transactions: {{max_duration: 5 seconds}}\n");
    let e = error(&text);
    assert!(e.starts_with("runtime.transactions.max_duration"), "{e}");
    assert!(e.contains("\"250ms\""), "{e}");
}

#[test]
fn datagen_source_and_external_endpoints_parse() {
    let text = DESIGN_EXAMPLE
        .replace(
            "file: {path: data/views.jsonl, format: json}",
            "datagen: {seed: 7, documents: 1000, keys: 50, rate: 200.5}\n    on_error: skip",
        )
        .replace(
            "sqlite: {path: out/views.db}",
            "command: {program: ./bin/driver, args: [serve], config: {level: 3}}",
        );
    let p = parse(&text).unwrap();
    let d: &DatagenConfig = p.sources["views-file"]
        .config
        .get()
        .expect("a datagen source");
    assert_eq!(
        (d.seed, d.documents, d.keys, d.rate),
        (7, Some(1000), 50, Some(200.5))
    );
    assert_eq!(p.sources["views-file"].on_error, OnError::Skip);
    assert_eq!(
        p.materializations["views-db"].endpoint,
        endpoint(
            "command",
            json!({
                "program": "/pipelines/./bin/driver",
                "args": ["serve"],
                "config": {"level": 3},
            })
        )
    );
}

#[test]
fn kind_errors_name_their_place_under_the_kind_key() {
    let file = "file: {path: data/views.jsonl, format: json}";
    let sqlite = "sqlite: {path: out/views.db}";
    for (from, to, expected) in [
        (
            file,
            "file: {format: json}",
            "sources.views-file.file: missing field `path`",
        ),
        (
            file,
            "datagen: {keys: 0}",
            "sources.views-file.datagen.keys: must be at least 1",
        ),
        (
            file,
            "datagen: {rate: -1}",
            "sources.views-file.datagen.rate: must be a positive",
        ),
        (
            file,
            "file: {path: v.jsonl, format: json, max_document_size: 16 MB}",
            "sources.views-file.file.max_document_size: invalid size \"16 MB\"",
        ),
        (
            file,
            "kafka: {topic: views}",
            "sources.views-file: unknown field `kafka` (the source kinds are datagen, file)",
        ),
        (
            file,
            "on_error: fail",
            "sources.views-file: set exactly one of the source kinds",
        ),
        (
            sqlite,
            "sqlite: {path: out/views.db, pth: x}",
            "materializations.views-db.endpoint.sqlite.pth: unknown field `pth`",
        ),
        (
            sqlite,
            "command: {args: [serve]}",
            "materializations.views-db.endpoint.command: missing field `program`",
        ),
        (
            sqlite,
            "{}",
            "materializations.views-db.endpoint: set exactly one of the driver kinds command, postgres, sqlite",
        ),
    ] {
        let text = DESIGN_EXAMPLE.replace(from, to);
        assert_ne!(text, DESIGN_EXAMPLE, "{to}");
        let e = error(&text);
        assert!(e.starts_with(expected), "{to}: {e}");
    }
}

#[test]
fn kind_defaults_and_sizes_apply() {
    let text = DESIGN_EXAMPLE.replace(
        "format: json}",
        "format: csv, follow: true, max_document_size: 1MiB}",
    );
    let p = parse(&text).unwrap();
    let file = file_config(&p);
    assert_eq!(file.format, FileFormat::Csv);
    assert!(file.follow);
    assert_eq!(file.max_document_size, 1 << 20);
    let p = parse(DESIGN_EXAMPLE).unwrap();
    assert_eq!(
        file_config(&p).max_document_size,
        sluice_file::config::DEFAULT_MAX_DOCUMENT_SIZE
    );
    let text = DESIGN_EXAMPLE.replace(
        "file: {path: data/views.jsonl, format: json}",
        "datagen: {}",
    );
    let p = parse(&text).unwrap();
    let d: &DatagenConfig = p.sources["views-file"].config.get().unwrap();
    assert_eq!((d.seed, d.documents, d.keys, d.rate), (0, None, 1000, None));
    assert_eq!(p.sources["views-file"].config.kind(), "datagen");
}

#[test]
fn a_bare_command_is_looked_up_in_path_and_an_absolute_one_kept() {
    for (program, expected) in [
        ("sluice", "sluice"),
        ("bin/driver", "/pipelines/bin/driver"),
        ("/usr/bin/driver", "/usr/bin/driver"),
    ] {
        let text = DESIGN_EXAMPLE.replace(
            "sqlite: {path: out/views.db}",
            &format!("command: {{program: {program}}}"),
        );
        let p = parse(&text).unwrap();
        assert_eq!(
            p.materializations["views-db"].endpoint,
            endpoint(
                "command",
                json!({"program": expected, "args": [], "config": {}})
            ),
            "{program}"
        );
    }
}

#[test]
fn a_cluster_section_reads_with_defaults_and_gives_each_member_its_own_folder() {
    let text =
        format!("{DESIGN_EXAMPLE}cluster:\n  etcd: [\"http://127.0.0.1:2379\"]\n  member: m-1\n");
    let p = Pipeline::parse(&text, Path::new("/pipelines"), &registry()).unwrap();
    let cluster = p.cluster.as_ref().unwrap();
    assert_eq!(cluster.prefix.as_deref(), Some("/sluice/pipeline"));
    assert_eq!(cluster.lease_ttl, Duration::from_secs(10));
    assert_eq!(cluster.shards, 1);
    assert_eq!(
        p.recovery_log(),
        Path::new("/pipelines/.sluice/pipeline/members/m-1")
    );
}

#[test]
fn a_cluster_refuses_fixed_shards_and_bad_member_ids_naming_the_key() {
    let cluster = "cluster:\n  etcd: [\"127.0.0.1:2379\"]\n  member: m\n";
    let with_shard = DESIGN_EXAMPLE.replace(
        "  views-db:\n",
        "  views-db:\n    shard: {key_begin: 0, key_end: 7}\n",
    );
    let err = error(&format!("{with_shard}{cluster}"));
    assert!(err.contains("materializations.views-db.shard"), "{err}");
    assert!(err.contains("sluice shards split"), "{err}");
    let err = error(&format!(
        "{DESIGN_EXAMPLE}{}",
        cluster.replace("member: m", "member: a/b")
    ));
    assert!(err.contains("cluster.member"), "{err}");
    let err = error(&format!(
        "{DESIGN_EXAMPLE}{}",
        cluster.replace("[\"127.0.0.1:2379\"]", "[]")
    ));
    assert!(err.contains("cluster.etcd"), "{err}");
}

#[test]
fn shard_ranges_split_evenly_halve_and_read_back_from_their_ids() {
    for n in [1, 2, 3, 7, 1024] {
        let ranges = ShardDef::split_evenly(n);
        assert_eq!(ranges.len(), n as usize);
        assert_eq!(ranges[0].key_begin, 0);
        assert_eq!(ranges.last().unwrap().key_end, u32::MAX);
        for pair in ranges.windows(2) {
            assert_eq!(pair[0].key_end + 1, pair[1].key_begin);
        }
    }
    let (low, high) = ShardDef::default().halves().unwrap();
    assert_eq!((low.key_begin, low.key_end), (0, 0x7fff_ffff));
    assert_eq!((high.key_begin, high.key_end), (0x8000_0000, u32::MAX));
    let (a, b) = high.halves().unwrap();
    assert_eq!(a.key_end + 1, b.key_begin);
    let one = ShardDef {
        key_begin: 5,
        key_end: 5,
    };
    assert_eq!(one.halves(), None);
    assert_eq!(high.id(), "80000000-ffffffff");
    assert_eq!(ShardDef::parse(&a.id()), Some(a));
    assert_eq!(ShardDef::parse("0000-ffff"), None);
    assert_eq!(ShardDef::parse("ffffffff-00000000"), None);
}

#[test]
fn workers_are_a_count_or_auto_and_refused_otherwise_naming_the_key() {
    let with = |workers: &str| format!("{DESIGN_EXAMPLE}runtime:\n  workers: {workers}\n");
    assert_eq!(
        parse(DESIGN_EXAMPLE).unwrap().runtime.workers(),
        1,
        "one by default"
    );
    assert_eq!(parse(&with("3")).unwrap().runtime.workers(), 3);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    assert_eq!(parse(&with("auto")).unwrap().runtime.workers(), cores);
    for (workers, says) in [
        ("0", "between 1 and 256"),
        ("257", "between 1 and 256"),
        ("many", "expected a number of workers or `auto`"),
        ("-1", "is not a number of workers"),
    ] {
        let err = error(&with(workers));
        assert!(
            err.contains("runtime.workers") && err.contains(says),
            "{workers}: {err}"
        );
    }
    let cluster = "cluster:\n  etcd: [\"127.0.0.1:2379\"]\n  member: m\n";
    let err = error(&format!("{}{cluster}", with("2")));
    assert!(
        err.contains("runtime.workers") && err.contains("cluster"),
        "{err}"
    );
}
