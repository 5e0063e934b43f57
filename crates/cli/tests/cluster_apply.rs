//! `sluice apply` of a pipeline file with `cluster:` works on the cluster's etcd, where
//! its members keep the applied spec and the shards' recovery logs:
//! - `--delete` is refused while a member runs, naming it; once the members are stopped
//!   it drops the store's table and removes every etcd key of the materialization, so
//!   the members' next run is a first start that reads its (changed) input from the
//!   beginning, each document once;
//! - a changed pipeline file (a raised backfill counter) is refused by `sluice run`
//!   naming `sluice apply`; applied, it runs, and the binding is rebuilt from the whole
//!   input;
//! - `--dry-run` says what it would do and changes nothing in etcd.
//!
//! Members of a private etcd write a table of the shared PostgreSQL server.

use crate::common;

use common::cluster::Members;
use common::{PATIENCE, Row, SLUICE, Schema, block_on, generate, pipeline_yaml, postgres};
use common::{POSTGRES_URL, append_lines, postgres_table, reduce_expected, write_lines};
use serde_json::Value;
use sluice_cluster::etcd::Etcd;
use sluice_cluster::keys::Keys;
use sluice_testkit::etcd::PrivateEtcd;
use std::collections::BTreeMap;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const PREFIX: &str = "/sluice/apply";

/// One test's etcd, schema, folder and members of the pageviews pipeline (two shards).
struct Fixture {
    etcd: PrivateEtcd,
    schema: Schema,
    dir: tempfile::TempDir,
    members: Members,
}

impl Fixture {
    fn new(tag: &str) -> Fixture {
        let etcd = PrivateEtcd::start();
        let schema = Schema::new(&format!("cluster_apply_{tag}"));
        let dir = tempfile::tempdir().unwrap();
        let pipeline = dir.path().join("cluster.yaml");
        let members = Members::new(dir.path(), &pipeline);
        let fx = Fixture {
            etcd,
            schema,
            dir,
            members,
        };
        fx.write_pipeline(0);
        fx
    }

    /// The pipeline file, its binding's backfill counter at `backfill`.
    fn write_pipeline(&self, backfill: u32) {
        let endpoint = format!(
            "postgres: {{url: \"{POSTGRES_URL}\", schema: {}}}",
            self.schema.0
        );
        let yaml = pipeline_yaml(
            "    file: {path: views.jsonl, format: json}",
            &endpoint,
            false,
            500,
            "200ms",
        )
        .replace(
            "resource: {table: pageviews}",
            &format!("resource: {{table: pageviews}}\n        backfill: {backfill}"),
        );
        let yaml = format!(
            "{yaml}cluster:\n  etcd: [\"{}\"]\n  member: ${{MEMBER}}\n  prefix: {PREFIX}\n  \
             lease_ttl: 3s\n  shards: 2\n",
            self.etcd.url()
        );
        std::fs::write(&self.members.pipeline, yaml).unwrap();
    }

    fn input(&self) -> std::path::PathBuf {
        self.dir.path().join("views.jsonl")
    }

    /// `sluice apply <args> <pipeline>`.
    fn apply(&self, args: &[&str]) -> Output {
        Command::new(SLUICE)
            .arg("apply")
            .args(args)
            .arg(&self.members.pipeline)
            .env("MEMBER", "cli")
            .output()
            .unwrap()
    }

    /// Waits until the table holds exactly the reduction of `docs`.
    fn wait_for_table(&self, docs: &[Value]) {
        let expected = reduce_expected(docs);
        let started = Instant::now();
        while table(&self.schema.0).as_ref() != Some(&expected) {
            assert!(
                started.elapsed() < PATIENCE,
                "the table is not the reduction of the input: {} rows of {}\n{}",
                table(&self.schema.0).map_or(0, |t| t.len()),
                expected.len(),
                self.members.logs()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Stops member `name` as an operator does (SIGTERM): it leaves the cluster.
    fn stop(&mut self, name: &str) {
        let running = &mut self.members.running;
        let at = (running.iter().position(|(m, _)| m == name)).expect("a running member");
        let (_, mut child) = running.swap_remove(at);
        common::signal(&child, "TERM");
        assert!(
            child.wait().unwrap().success(),
            "{name} did not leave cleanly"
        );
    }

    /// Every key under the cluster's prefix, with its value and revision.
    fn etcd_keys(&self) -> BTreeMap<String, (Vec<u8>, i64)> {
        block_on(async {
            let client = Etcd::connect(&[self.etcd.url()], Duration::from_secs(5), None).unwrap();
            let (kvs, _) = client.get_prefix(&format!("{PREFIX}/")).await.unwrap();
            (kvs.into_iter())
                .map(|kv| {
                    let key = String::from_utf8(kv.key).unwrap();
                    (key, (kv.value, kv.mod_revision))
                })
                .collect()
        })
    }
}

/// The `pageviews` table of `schema` per user, `None` while it does not exist.
fn table(schema: &str) -> Option<BTreeMap<String, Row>> {
    let exists = format!(
        "SELECT count(*) FROM information_schema.tables \
         WHERE table_schema = '{schema}' AND table_name = 'pageviews'"
    );
    let count: i64 = postgres(async |c| c.query_one(&exists, &[]).await.unwrap().get(0));
    (count == 1).then(|| postgres_table(schema))
}

fn said(out: &Output) -> (String, String) {
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (text(&out.stdout), text(&out.stderr))
}

/// The keys of `etcd` that belong to materialization `views-db` (assignments included).
fn of_views(keys: &BTreeMap<String, (Vec<u8>, i64)>) -> Vec<String> {
    let layout = Keys::new(PREFIX);
    let mut owned = layout.of_materialization("views-db");
    owned.push(layout.of(&layout.assignments(), "views-db"));
    (keys.keys())
        .filter(|k| {
            (owned.iter()).any(|o| *k == o || (o.ends_with('/') && k.starts_with(o.as_str())))
        })
        .cloned()
        .collect()
}

#[test]
fn apply_delete_under_cluster_is_refused_while_a_member_runs_then_resets_the_cluster() {
    let mut fx = Fixture::new("delete");
    let first = generate(2_000, 200, 61);
    write_lines(&fx.input(), &first);
    for m in ["a", "b"] {
        fx.members.start(m, &[]);
    }
    fx.wait_for_table(&first);
    fx.stop("b");

    let (out, err) = said(&fx.apply(&["--delete"]));
    assert!(
        err.contains("materializations.views-db: the cluster runs it")
            && err.contains("member(s) a are registered"),
        "not refused naming member a: {out}{err}"
    );
    assert_eq!(table(&fx.schema.0), Some(reduce_expected(&first)));
    fx.stop("a");

    let before = fx.etcd_keys();
    let owned = of_views(&before);
    assert!(
        owned.iter().any(|k| k.ends_with("/commit")),
        "the shards' logs are in etcd: {owned:?}"
    );
    let dry = fx.apply(&["--delete", "--dry-run"]);
    let (out, err) = said(&dry);
    assert!(dry.status.success(), "{out}{err}");
    assert!(out.contains("-- views-db: would delete"), "{out}");
    assert!(out.contains(r#"DROP TABLE IF EXISTS"#), "{out}");
    assert!(
        out.contains(&format!(
            "would remove {} key(s) of the cluster's etcd: {PREFIX}/shards/views-db/* (2)",
            owned.len()
        )),
        "{out}"
    );
    assert_eq!(fx.etcd_keys(), before, "a dry run changed etcd");
    assert_eq!(table(&fx.schema.0), Some(reduce_expected(&first)));

    let deleted = fx.apply(&["--delete"]);
    let (out, err) = said(&deleted);
    assert!(deleted.status.success(), "{out}{err}");
    assert!(out.contains("-- views-db: deleted"), "{out}");
    assert!(
        out.contains(&format!(
            "removed {} key(s) of the cluster's etcd",
            owned.len()
        )),
        "{out}"
    );
    assert_eq!(table(&fx.schema.0), None, "the table is dropped");
    let after = fx.etcd_keys();
    assert_eq!(
        of_views(&after),
        Vec::<String>::new(),
        "keys of views-db left"
    );

    // Another input, longer than the first: read from its beginning, not from the
    // first input's checkpoints.
    let second = generate(3_000, 250, 62);
    write_lines(&fx.input(), &second);
    for m in ["a", "b"] {
        fx.members.start(m, &[]);
    }
    fx.wait_for_table(&second);
}

#[test]
fn a_changed_spec_is_refused_by_run_until_applied_on_the_cluster_then_live() {
    let mut fx = Fixture::new("upsert");
    let first = generate(1_500, 150, 71);
    write_lines(&fx.input(), &first);
    fx.members.start("a", &[]);
    fx.wait_for_table(&first);
    fx.stop("a");

    // More input, and the binding's backfill counter raised: the table is to be rebuilt
    // from the whole input.
    let more = generate(1_000, 150, 72);
    append_lines(&fx.input(), &more);
    fx.write_pipeline(1);
    fx.members.start("a", &[]);
    let (_, mut child) = fx.members.running.pop().unwrap();
    let exited = child.wait().unwrap();
    let log = std::fs::read_to_string(fx.dir.path().join("a.log")).unwrap();
    assert!(!exited.success(), "a changed spec ran:\n{log}");
    assert!(
        log.contains("the pipeline file differs") && log.contains("run `sluice apply`"),
        "{log}"
    );

    let before = fx.etcd_keys();
    let applied_key = format!("{PREFIX}/applied/views-db");
    let dry = fx.apply(&["--dry-run"]);
    let (out, err) = said(&dry);
    assert!(dry.status.success(), "{out}{err}");
    assert!(out.contains("-- views-db: would apply"), "{out}");
    assert!(
        out.contains(&format!("would amend the cluster's etcd: {applied_key}")),
        "{out}"
    );
    assert_eq!(fx.etcd_keys(), before, "a dry run changed etcd");

    let applied = fx.apply(&[]);
    let (out, err) = said(&applied);
    assert!(applied.status.success(), "{out}{err}");
    assert!(out.contains("-- views-db: applied"), "{out}");
    assert!(
        out.contains(&format!("amended the cluster's etcd: {applied_key}")),
        "{out}"
    );
    let after = fx.etcd_keys();
    assert_ne!(after.get(&applied_key), before.get(&applied_key));
    assert!(
        !after.contains_key(&format!("{PREFIX}/lock/apply/views-db")),
        "the apply lock is released"
    );

    let all: Vec<Value> = first.iter().chain(&more).cloned().collect();
    for m in ["a", "b"] {
        fx.members.start(m, &[]);
    }
    fx.wait_for_table(&all);
}
