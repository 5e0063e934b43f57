//! End-to-end, into SQLite: the applied spec is the contract between a pipeline file
//! and its store. `sluice run` applies a first start and runs only what was applied;
//! a changed pipeline file is refused until `sluice apply`; a store applied at another
//! version refuses the Open; `sluice apply --delete` drops the table and forgets the
//! recovery log, so a later run starts over. A spec changed by a variable forgotten (its
//! `${VAR:-default}` fell back to the default) names the variable.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common;

use common::{
    SLUICE, assert_success, generate, pipeline_yaml, reduce_expected, sqlite_table, write_lines,
};

struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Fixture {
        let fx = Fixture {
            dir: tempfile::tempdir().unwrap(),
        };
        fx.write_pipeline("pipeline.yaml", "");
        fx
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes the pageviews pipeline as `name`, with `extra` properties in its schema.
    fn write_pipeline(&self, name: &str, extra: &str) {
        let yaml = pipeline_yaml(
            "    file: {path: views.jsonl, format: json}",
            "sqlite: {path: out/views.db}",
            false,
            1000,
            "10s",
        )
        .replace(
            "      properties:\n",
            &format!("      properties:\n{extra}"),
        );
        std::fs::write(self.path(name), yaml).unwrap();
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(SLUICE);
        cmd.args(args)
            .current_dir(self.dir.path())
            .env("RUST_LOG", "warn");
        cmd
    }

    fn sluice(&self, args: &[&str]) -> Output {
        self.command(args).output().unwrap()
    }

    fn db(&self) -> PathBuf {
        self.path("out/views.db")
    }

    fn input(&self, docs: &[Value]) {
        write_lines(&self.path("views.jsonl"), docs);
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

const TITLE: &str = "        title: {type: string}\n";

fn tables(db: &Path) -> Vec<String> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut stmt = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap();
    stmt.query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

#[test]
fn run_applies_a_first_start_and_refuses_a_changed_pipeline_until_it_is_applied() {
    let fx = Fixture::new();
    let first = generate(2_000, 300, 31);
    fx.input(&first);
    assert_success(&fx.sluice(&["run", "pipeline.yaml"]));
    assert_eq!(sqlite_table(&fx.db()), reduce_expected(&first));
    // The quickstart's second run: nothing changed, nothing to do.
    assert_success(&fx.sluice(&["run", "pipeline.yaml"]));
    assert_eq!(sqlite_table(&fx.db()), reduce_expected(&first));

    // A new property is a new value field: refused until applied, and nothing is written.
    fx.write_pipeline("pipeline.yaml", TITLE);
    let all: Vec<Value> = first
        .iter()
        .chain(&generate(1_000, 300, 32))
        .cloned()
        .collect();
    fx.input(&all);
    let out = fx.sluice(&["run", "pipeline.yaml"]);
    assert!(!out.status.success(), "a changed pipeline must not run");
    let err = stderr(&out);
    assert!(
        err.contains("materialization views-db: the pipeline file differs"),
        "{err}"
    );
    assert!(
        err.contains(
            "binding pageviews: values [bytes, last_seen, views] → [bytes, last_seen, title, views]"
        ),
        "{err}"
    );
    assert!(err.contains("run `sluice apply`"), "{err}");
    assert_eq!(sqlite_table(&fx.db()), reduce_expected(&first));

    let dry = fx.sluice(&["apply", "--dry-run", "pipeline.yaml"]);
    assert_success(&dry);
    assert!(
        stdout(&dry).contains(r#"ADD COLUMN "title""#),
        "{}",
        stdout(&dry)
    );
    assert!(
        fx.sluice(&["run", "pipeline.yaml"]).status.code() == Some(1),
        "still refused"
    );
    assert_success(&fx.sluice(&["apply", "pipeline.yaml"]));
    assert_success(&fx.sluice(&["run", "pipeline.yaml"]));
    assert_eq!(sqlite_table(&fx.db()), reduce_expected(&all));
}

#[test]
fn a_store_applied_at_another_version_refuses_the_open_naming_both_versions() {
    let fx = Fixture::new();
    let docs = generate(500, 50, 41);
    fx.input(&docs);
    assert_success(&fx.sluice(&["run", "pipeline.yaml"]));
    // Another pipeline file (its own recovery log) applies a wider spec to the same store.
    fx.write_pipeline("other.yaml", TITLE);
    assert_success(&fx.sluice(&["apply", "other.yaml"]));

    let out = fx.sluice(&["run", "pipeline.yaml"]);
    assert!(
        !out.status.success(),
        "the store was applied at another version"
    );
    let err = stderr(&out);
    let versions: Vec<&str> = err
        .split("version ")
        .skip(1)
        .map(|rest| rest.split(|c: char| !c.is_ascii_hexdigit()).next().unwrap())
        .collect();
    assert!(
        err.contains("was applied at version") && err.contains("but Open is for version"),
        "{err}"
    );
    assert_eq!(versions.len(), 2, "{err}");
    assert_ne!(versions[0], versions[1], "{err}");
    assert!(err.contains("sluice apply"), "{err}");
    assert_eq!(sqlite_table(&fx.db()), reduce_expected(&docs));
}

#[test]
fn apply_delete_drops_the_table_and_forgets_the_log_so_a_run_starts_over() {
    let fx = Fixture::new();
    let docs = generate(1_500, 200, 51);
    fx.input(&docs);
    assert_success(&fx.sluice(&["run", "pipeline.yaml"]));

    let dry = fx.sluice(&["apply", "--delete", "--dry-run", "pipeline.yaml"]);
    assert_success(&dry);
    let said = stdout(&dry);
    assert!(said.contains("-- views-db: would delete"), "{said}");
    assert!(
        said.contains(r#"DROP TABLE IF EXISTS "pageviews""#),
        "{said}"
    );
    assert!(said.contains("would remove the recovery log"), "{said}");
    assert!(
        tables(&fx.db()).contains(&"pageviews".to_string()),
        "a dry run drops nothing"
    );
    assert_eq!(sqlite_table(&fx.db()), reduce_expected(&docs));

    let deleted = fx.sluice(&["apply", "--delete", "pipeline.yaml"]);
    assert_success(&deleted);
    assert!(
        stdout(&deleted).contains("-- views-db: deleted"),
        "{}",
        stdout(&deleted)
    );
    assert!(!tables(&fx.db()).contains(&"pageviews".to_string()));
    let inspect = fx.sluice(&["inspect", "checkpoint", "pipeline.yaml"]);
    assert!(
        stdout(&inspect).contains("(empty: never run)"),
        "{}",
        stdout(&inspect)
    );

    // A run after the delete is a first start: applied again, all the input read again.
    assert_success(&fx.sluice(&["run", "pipeline.yaml"]));
    assert_eq!(sqlite_table(&fx.db()), reduce_expected(&docs));
}

#[test]
fn a_spec_changed_by_an_unset_variable_names_it_and_the_default_used() {
    let fx = Fixture::new();
    let yaml = pipeline_yaml(
        "    file: {path: views.jsonl, format: json}",
        "sqlite: {path: \"${SLUICE_TEST_VIEWS_DB:-out/default.db}\"}",
        false,
        1000,
        "10s",
    );
    std::fs::write(fx.path("pipeline.yaml"), yaml).unwrap();
    let docs = generate(300, 30, 61);
    fx.input(&docs);
    let run = |db: Option<&str>| {
        let mut cmd = fx.command(&["run", "pipeline.yaml"]);
        match db {
            Some(db) => cmd.env("SLUICE_TEST_VIEWS_DB", db),
            None => cmd.env_remove("SLUICE_TEST_VIEWS_DB"),
        };
        cmd.output().unwrap()
    };
    assert_success(&run(Some("out/views.db")));
    assert_eq!(sqlite_table(&fx.db()), reduce_expected(&docs));

    // Run again with the variable forgotten: the default would be another store.
    let out = run(None);
    assert!(!out.status.success(), "a forgotten variable must not run");
    let err = stderr(&out);
    // The paths as the spec holds them (resolved against the pipeline file's folder).
    let changed = "views.db\" → \"";
    let explained = "default.db\" (the default of ${SLUICE_TEST_VIEWS_DB:-out/default.db}: \
                     SLUICE_TEST_VIEWS_DB is not set)";
    assert!(
        err.contains("endpoint.path \"") && err.contains(changed) && err.contains(explained),
        "{err}"
    );
    assert!(
        !fx.path("out/default.db").exists(),
        "nothing was written to the default's store"
    );
    // Set as when applied, it runs.
    assert_success(&run(Some("out/views.db")));
}
