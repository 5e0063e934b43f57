//! What a new user meets first: `sluice check` connects to every store (an Apply as a
//! dry run) and opens every source far enough to know it can be read, reporting every
//! problem at once, each with its place in the file and its cause; `--offline` checks
//! the file only. `sluice run` creates nothing (schema, tables, recovery log) before
//! its sources can be read, and `apply --delete` removes what `apply` created: the
//! tables, the checkpoints, then the schema once nothing else is in it.
//!
//! Against the shared PostgreSQL server, with unique schema names.

use crate::common;

use common::{POSTGRES_URL, SLUICE, assert_success, free_address, pipeline_yaml, postgres_execute};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const FILE_SOURCE: &str = "    file: {path: views.jsonl, format: json}";

fn sluice(args: &[&str], pipeline: &Path) -> Output {
    Command::new(SLUICE)
        .args(args)
        .arg(pipeline)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A pipeline file in `dir` of the file source into `endpoint`; writes the input file
/// unless `with_input` is false.
fn pipeline_in(dir: &Path, source: &str, endpoint: &str, with_input: bool) -> PathBuf {
    if with_input {
        common::write_lines(&dir.join("views.jsonl"), &common::generate(50, 10, 3));
    }
    let path = dir.join("pipeline.yaml");
    std::fs::write(&path, pipeline_yaml(source, endpoint, false, 1000, "10m")).unwrap();
    path
}

/// A schema name of the shared server that no test creates: dropped (with what is in
/// it) when dropped.
struct Unmade(String);

impl Unmade {
    fn new(tag: &str) -> Unmade {
        let name = format!("sluice_{tag}_{}", std::process::id());
        postgres_execute(
            POSTGRES_URL,
            &format!(r#"DROP SCHEMA IF EXISTS "{name}" CASCADE"#),
        );
        Unmade(name)
    }

    fn exists(&self) -> bool {
        common::postgres(async |c| {
            let sql = "SELECT count(*) FROM pg_namespace WHERE nspname = $1";
            c.query_one(sql, &[&self.0]).await.unwrap().get::<_, i64>(0) == 1
        })
    }

    /// The tables in the schema, by name.
    fn tables(&self) -> Vec<String> {
        common::postgres(async |c| {
            let sql = "SELECT tablename::text FROM pg_tables WHERE schemaname = $1 ORDER BY 1";
            let rows = c.query(sql, &[&self.0]).await.unwrap();
            rows.iter().map(|r| r.get(0)).collect()
        })
    }
}

impl Drop for Unmade {
    fn drop(&mut self) {
        let sql = format!(r#"DROP SCHEMA IF EXISTS "{}" CASCADE"#, self.0);
        postgres_execute(POSTGRES_URL, &sql);
    }
}

/// Each way a store cannot be reached fails the check with the endpoint's place and
/// the cause, where the file-only check passes.
#[test]
fn check_connects_to_the_store_and_names_the_cause() {
    let closed = free_address();
    let postgres = |url: &str| format!("postgres: {{url: '{url}', schema: sluice_check_unused}}");
    let cases = [
        (
            "a wrong port",
            postgres(&format!("postgres://postgres@{closed}/test")),
            vec!["refused"],
        ),
        (
            "a host that does not resolve",
            postgres("postgres://postgres@no-such-host.invalid:5432/test"),
            vec!["no-such-host.invalid"],
        ),
        (
            "a wrong user",
            postgres("postgres://sluice_no_such_user@127.0.0.1:5432/test"),
            vec!["sluice_no_such_user", "does not exist"],
        ),
        (
            "a missing database",
            postgres("postgres://postgres@127.0.0.1:5432/sluice_no_such_db"),
            vec!["sluice_no_such_db", "does not exist"],
        ),
        (
            "a wrong MariaDB port",
            format!("mysql: {{url: 'mysql://root@{closed}/test'}}"),
            vec!["Connection refused (os error 111); retrying may succeed"],
        ),
        (
            "an unreachable Redis",
            format!("redis: {{url: 'redis://{closed}/0'}}"),
            vec!["refused"],
        ),
    ];
    for (case, endpoint, causes) in cases {
        let dir = tempfile::tempdir().unwrap();
        let path = pipeline_in(dir.path(), FILE_SOURCE, &endpoint, true);
        if endpoint.starts_with("redis:") {
            // Keys under a prefix, admitted at least once only.
            let yaml = std::fs::read_to_string(&path).unwrap();
            let yaml = yaml.replace("{table: pageviews}", "{prefix: \"views:\"}");
            std::fs::write(&path, yaml + "delivery: at_least_once\n").unwrap();
        }
        let out = sluice(&["check"], &path);
        let said = text(&out);
        assert!(!out.status.success(), "{case}: the check passed: {said}");
        assert!(
            said.contains("materializations.views-db.endpoint"),
            "{case}: no place: {said}"
        );
        for cause in causes {
            assert!(said.contains(cause), "{case}: no `{cause}`: {said}");
        }
        assert!(
            !said.contains("Input/output error: Input/output error"),
            "{case}: the cause said twice: {said}"
        );
        let offline = sluice(&["check", "--offline"], &path);
        assert_success(&offline);
        assert!(text(&offline).contains("offline"), "{}", text(&offline));
    }
}

/// Every problem at once: a missing source file, an unreachable broker, an unreachable
/// store and a key pointer the schema does not know, each with its place.
#[test]
fn check_reports_every_problem_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let closed = free_address();
    let sources = format!(
        "{FILE_SOURCE}\n  views-kafka:\n    target: acme/pageviews\n    kafka: {{brokers: '{}', topic: views, format: json}}",
        free_address()
    );
    let endpoint = format!("postgres: {{url: 'postgres://postgres@{closed}/test'}}");
    let path = pipeline_in(dir.path(), &sources, &endpoint, false);
    let mut yaml = std::fs::read_to_string(&path).unwrap();
    // A second collection keyed by a property its schema lacks, bound by a second
    // materialization.
    yaml = yaml.replace(
        "sources:\n",
        "  acme/users:\n    key: [/userid]\n    schema: {type: object, properties: {user_id: {type: string}}}\nsources:\n",
    );
    yaml = yaml.replace(
        "runtime:\n",
        "  users-db:\n    endpoint: {sqlite: {path: users.db}}\n    bindings:\n      - source: acme/users\n        resource: {table: users}\nruntime:\n",
    );
    std::fs::write(&path, yaml).unwrap();

    let out = sluice(&["check"], &path);
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("4 problems"), "{said}");
    for (place, cause) in [
        ("source views-file", "views.jsonl"),
        ("source views-kafka", "brokers"),
        ("materializations.views-db.endpoint", "refused"),
        ("collections.acme/users", "/userid"),
    ] {
        let line = said.lines().find(|l| l.contains(place));
        let line = line.unwrap_or_else(|| panic!("nothing about {place}: {said}"));
        assert!(line.contains(cause), "{place} without `{cause}`: {said}");
    }
}

/// A pipeline whose parts can all be reached: the check says what it reached.
#[test]
fn check_says_what_it_reached() {
    let dir = tempfile::tempdir().unwrap();
    let path = pipeline_in(dir.path(), FILE_SOURCE, "sqlite: {path: views.db}", true);
    let out = sluice(&["check"], &path);
    assert_success(&out);
    let said = text(&out);
    assert!(said.contains("store: connected"), "{said}");
    assert!(
        said.contains("source views-file (file): can be read"),
        "{said}"
    );
    assert!(said.contains("is valid"), "{said}");
    assert!(
        !dir.path().join("views.db").exists(),
        "the check created the store"
    );
}

/// A run whose source file is missing fails before it creates anything: no schema, no
/// table, no recovery log.
#[test]
fn run_creates_nothing_before_its_sources_can_be_read() {
    let dir = tempfile::tempdir().unwrap();
    let schema = Unmade::new("runfirst");
    let endpoint = format!("postgres: {{url: '{POSTGRES_URL}', schema: {}}}", schema.0);
    let path = pipeline_in(dir.path(), FILE_SOURCE, &endpoint, false);
    let out = sluice(&["run"], &path);
    let said = text(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("views.jsonl"), "{said}");
    assert!(!schema.exists(), "the run created the schema: {said}");
    let log = dir.path().join(".sluice");
    assert!(
        !log.exists(),
        "the run created the recovery log {}",
        log.display()
    );
}

/// `apply --delete` removes what apply created: beside another materialization only its
/// own table and checkpoint rows; as the schema's last one, the checkpoints table and
/// the schema too.
#[test]
fn apply_delete_removes_what_apply_created() {
    let schema = Unmade::new("delete");
    let endpoint = format!("postgres: {{url: '{POSTGRES_URL}', schema: {}}}", schema.0);
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first = pipeline_in(a.path(), FILE_SOURCE, &endpoint, true);
    let second = pipeline_in(b.path(), FILE_SOURCE, &endpoint, true);
    let yaml = std::fs::read_to_string(&second).unwrap();
    let yaml = yaml
        .replace("views-db:", "views-other:")
        .replace("{table: pageviews}", "{table: pageviews_other}");
    std::fs::write(&second, yaml).unwrap();
    assert_success(&sluice(&["run"], &first));
    assert_success(&sluice(&["run"], &second));
    assert_eq!(
        schema.tables(),
        ["pageviews", "pageviews_other", "sluice_checkpoints"]
    );

    // Every run leaves how it ended beside its log, for `sluice status`.
    let ended = |dir: &Path| -> Vec<String> {
        let log = dir.join(".sluice/pipeline");
        let files = std::fs::read_dir(&log)
            .into_iter()
            .flatten()
            .flat_map(|m| std::fs::read_dir(m.unwrap().path()).into_iter().flatten());
        (files.map(|f| f.unwrap().file_name().to_string_lossy().into_owned()))
            .filter(|name| name.starts_with("ended-"))
            .collect()
    };
    assert_eq!(ended(a.path()).len(), 1, "{:?}", ended(a.path()));

    let deleted = sluice(&["apply", "--delete"], &first);
    assert_success(&deleted);
    assert_eq!(schema.tables(), ["pageviews_other", "sluice_checkpoints"]);
    assert!(
        ended(a.path()).is_empty(),
        "a reset leaves how the old run ended for `sluice status` to show"
    );
    let rows = common::postgres(async |c| {
        let sql = format!(
            r#"SELECT DISTINCT materialization FROM "{}".sluice_checkpoints"#,
            schema.0
        );
        let rows = c.query(&sql, &[]).await.unwrap();
        rows.iter().map(|r| r.get(0)).collect::<Vec<String>>()
    });
    assert_eq!(rows, ["views-other"]);

    let deleted = sluice(&["apply", "--delete"], &second);
    assert_success(&deleted);
    assert!(text(&deleted).contains("DROP SCHEMA"), "{}", text(&deleted));
    assert!(!schema.exists(), "the schema stayed: {:?}", schema.tables());

    // A reset starts over: the next run makes the schema again and reduces the whole
    // input anew, exactly.
    assert_success(&sluice(&["run"], &first));
    let input = common::generate(50, 10, 3);
    assert_eq!(
        common::postgres_table(&schema.0),
        common::reduce_expected(&input)
    );
}
