//! Every example under `examples/`, run as a user would run it (the `sluice` binary,
//! `sluice run examples/<folder>/pipeline.yaml` from the repository root) against the
//! local services, ends as its pipeline file's header comment says: the rows (or keys,
//! or published changes) of the bundled sample's 1 000 users, views adding up to
//! 10 000 and bytes to 25 323 633, equal to an independent reduction of the sample; a
//! second run changes nothing where the source ends (the quickstart's million generated
//! views are reduced independently from the generator's pure function). Each test first
//! checks that the header promises what it then checks, and every folder of `examples/`
//! must have its test here.
//!
//! No pipeline is written out here: each test runs the example's own file, from a copy
//! of its folder and `examples/data` in a temp dir (the same layout, so the relative
//! paths resolve as in the repository), so that its `out/` and `.sluice/` are its own
//! and neither parallel tests nor the developer's runs in place collide. Names that must be unique (a schema, a database, a topic, a stream, a
//! key prefix, a port) go through the examples' `${VAR:-default}` variables, and what a
//! test creates on a server is removed afterwards, but for Kafka topics: tansu 0.6 stops
//! serving when a topic is deleted under a fetch, so their names are unique instead.
//!
//! Needs the services `.ci/services` starts (PostgreSQL, MariaDB, Redis, NATS JetStream,
//! tansu), `psql` and PostgreSQL's server binaries (the CDC example runs on a private
//! cluster with `wal_level=logical`), and `python3` with grpcio, grpcio-tools and
//! pyiceberg.

use serde_json::Value;
use sluice_http::client::Client;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::common;

use common::{
    MYSQL_SERVER, MyDatabase, PythonProtocol, REDIS_URL, Row, SLUICE, assert_success, block_on,
    copy_dir, free_address, mysql, postgres_at, postgres_execute, redis, redis_keys,
    reduce_expected, sqlite_rows, sqlite_table,
};

const EXAMPLES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples");

/// The example folders, each tested below by `fn the_<folder>_example_…` (`-` as `_`).
const TESTED: &[&str] = &[
    "quickstart",
    "file",
    "postgres",
    "mysql",
    "redis",
    "iceberg",
    "iceberg-s3",
    "files",
    "kafka",
    "nats",
    "postgres-cdc",
    "http",
    "python-driver",
    "python-driver-current",
    "mysql-cdc",
    "airbyte-faker",
];

/// Folders of `examples/` that are not examples: the sample they share.
const NOT_EXAMPLES: &[&str] = &["data"];

/// What the sample reduces to, as the examples' comments say: users, the sum of views,
/// the sum of bytes, the latest last_seen, and user u0042's row.
const USERS: usize = 1_000;
const VIEWS: i64 = 10_000;
const BYTES: i64 = 25_323_633;
const LAST_SEEN: &str = "2026-01-31T23:47:35Z";
const U0042: (i64, i64, &str) = (14, 32_774, "2026-01-30T08:55:42Z");

/// The time a background `sluice run` or a condition gets before the test fails.
const PATIENCE: Duration = Duration::from_secs(120);

// ---------------------------------------------------------------------------------
// The sample, the promises, and running an example in a copy of its own.

fn sample_path() -> PathBuf {
    Path::new(EXAMPLES).join("data/pageviews.jsonl")
}

/// The sample's documents, in order.
fn sample() -> Vec<Value> {
    std::fs::read_to_string(sample_path())
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// Checks a per-user view against what the comments promise, and against the sample's
/// independent reduction.
fn assert_view(view: &BTreeMap<String, Row>, what: &str) {
    assert_eq!(view.len(), USERS, "{what}: one row per user");
    let views: i64 = view.values().map(|r| r.views).sum();
    let bytes: i64 = view.values().map(|r| r.bytes).sum();
    assert_eq!((views, bytes), (VIEWS, BYTES), "{what}: the sums");
    let latest = view.values().map(|r| r.last_seen.as_str()).max();
    assert_eq!(latest, Some(LAST_SEEN), "{what}: the latest last_seen");
    let u0042 = &view["u0042"];
    assert_eq!(
        (u0042.views, u0042.bytes, u0042.last_seen.as_str()),
        U0042,
        "{what}: u0042"
    );
    assert!(
        *view == reduce_expected(&sample()),
        "{what}: the view differs from the sample's reduction"
    );
}

/// The view of rows (user_id, views, bytes, last_seen): each user's rows reduced.
fn view_of(rows: &[(String, i64, i64, String)]) -> BTreeMap<String, Row> {
    let mut view: BTreeMap<String, Row> = BTreeMap::new();
    for (user, views, bytes, seen) in rows {
        view.entry(user.clone())
            .or_default()
            .add(*views, *bytes, seen);
    }
    view
}

/// The header comment of an example's pipeline file.
fn header(example: &str) -> String {
    let text =
        std::fs::read_to_string(Path::new(EXAMPLES).join(example).join("pipeline.yaml")).unwrap();
    text.lines()
        .take_while(|line| line.starts_with('#'))
        .map(|line| format!("{}\n", line.trim_start_matches('#').trim()))
        .collect()
}

/// Checks that the example's header says each of `promises` (how to run it first).
fn assert_says(example: &str, promises: &[&str]) {
    let header = header(example);
    let run = format!("run examples/{example}/pipeline.yaml");
    for promise in std::iter::once(run.as_str()).chain(promises.iter().copied()) {
        assert!(
            header.contains(promise),
            "the header of examples/{example}/pipeline.yaml does not say {promise:?}:\n{header}"
        );
    }
}

/// A name no other test (or earlier run) uses: the process and the time.
fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{prefix}_{}_{:x}",
        std::process::id(),
        nanos & 0xffff_ffff_ffff
    )
}

/// An example copied into a temp dir of its own (`examples/<name>` and `examples/data`),
/// run from there as from the repository root, with the environment variables it is
/// given.
struct Example {
    root: tempfile::TempDir,
    name: &'static str,
    vars: Vec<(String, String)>,
}

impl Example {
    fn new(name: &'static str) -> Example {
        let root = tempfile::tempdir().unwrap();
        for folder in [name, "data"] {
            copy_dir(
                &Path::new(EXAMPLES).join(folder),
                &root.path().join("examples").join(folder),
                &["out", ".sluice", "__pycache__"],
            );
        }
        Example {
            root,
            name,
            vars: Vec::new(),
        }
    }

    fn var(mut self, name: &str, value: impl Into<String>) -> Example {
        self.vars.push((name.to_string(), value.into()));
        self
    }

    /// A path in the copy of the example's folder.
    fn path(&self, relative: &str) -> PathBuf {
        self.root
            .path()
            .join("examples")
            .join(self.name)
            .join(relative)
    }

    fn pipeline(&self) -> String {
        format!("examples/{}/pipeline.yaml", self.name)
    }

    /// `sluice ARGS` from the copy's root, with the example's variables.
    fn sluice(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(SLUICE);
        cmd.args(args)
            .current_dir(self.root.path())
            .env("RUST_LOG", "warn");
        for (name, value) in &self.vars {
            cmd.env(name, value);
        }
        cmd
    }

    /// The header's `sluice produce …` command (`command`, before the sample's path),
    /// which must send the whole sample to `to` (`topic t`, `subject s`).
    fn produce(&self, command: &str, to: &str) {
        let mut args: Vec<&str> = command.split(' ').skip(1).collect();
        args.push("examples/data/pageviews.jsonl");
        let out = self.sluice(&args).output().unwrap();
        assert_success(&out);
        let said = String::from_utf8_lossy(&out.stdout);
        let sent = format!("sent {VIEWS} documents to {to}");
        assert!(said.contains(&sent), "{said}");
    }

    /// `sluice run` of the example, which must succeed.
    fn run(&self) -> Output {
        let out = self.sluice(&["run", &self.pipeline()]).output().unwrap();
        assert_success(&out);
        out
    }

    /// Runs the example twice: after the first run the store's `rows` (`what`: the
    /// store) are one per user and the sample's view; the second run changes none.
    fn run_twice(&self, what: &str, rows: impl Fn() -> Vec<(String, i64, i64, String)>) {
        self.run();
        let first = rows();
        assert_eq!(first.len(), USERS, "{what}: one row per user");
        assert_view(&view_of(&first), what);
        self.run();
        assert_eq!(rows(), first, "a second run changes nothing");
    }

    /// Runs the example again, which must leave the SQLite table `db` with its `rows` and
    /// publish nothing: `published` still counts the `count` changes of the first run.
    fn run_again_idle(
        &self,
        db: &Path,
        rows: &[(String, i64, i64, String)],
        count: usize,
        published: impl Fn() -> usize,
    ) {
        self.run();
        assert_eq!(sqlite_snapshot(db), rows, "a second run changes no row");
        assert_eq!(published(), count, "a second run publishes nothing");
    }

    /// `sluice apply --delete` of the example, which must succeed.
    fn apply_delete(&self) {
        assert_success(
            &self
                .sluice(&["apply", "--delete", &self.pipeline()])
                .output()
                .unwrap(),
        );
    }

    /// `sluice run` of the example in the background (`more`: more arguments), its
    /// stderr in `sluice.log` beside the copy.
    fn spawn(&self, more: &[&str]) -> Running {
        let pipeline = self.pipeline();
        let mut args = vec!["run", pipeline.as_str()];
        args.extend_from_slice(more);
        let log = self.root.path().join("sluice.log");
        let child = self
            .sluice(&args)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        Running { child, log }
    }
}

/// A process started in the background, killed when dropped.
struct Running {
    child: Child,
    log: PathBuf,
}

impl Running {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until `done` holds, failing if the process exits or [`PATIENCE`] passes.
    fn wait_until(&mut self, what: &str, mut done: impl FnMut() -> bool) {
        let deadline = Instant::now() + PATIENCE;
        while !done() {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("exited ({status}) before {what}:\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "no {what} after {PATIENCE:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, then the exit, which must be a success.
    fn terminate(mut self) {
        let pid = self.child.id().to_string();
        let kill = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(kill.success());
        let status = self.child.wait().unwrap();
        assert!(status.success(), "after SIGTERM: {status}\n{}", self.log());
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The whole `pageviews` table of an SQLite file, sorted: what a second run must leave
/// as it is.
fn sqlite_snapshot(db: &Path) -> Vec<(String, i64, i64, String)> {
    let mut rows = sqlite_rows(db);
    rows.sort();
    rows
}

/// Checks the SQLite table `pageviews` of `db` holds the sample's view, one row per
/// user; returns its rows.
fn assert_sqlite_view(db: &Path) -> Vec<(String, i64, i64, String)> {
    let rows = sqlite_snapshot(db);
    assert_eq!(rows.len(), USERS, "one row per user");
    assert_view(&sqlite_table(db), "the SQLite table");
    rows
}

// ---------------------------------------------------------------------------------
// Discovery.

#[test]
fn every_example_folder_has_a_test() {
    let mut folders: Vec<String> = std::fs::read_dir(EXAMPLES)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| !NOT_EXAMPLES.contains(&name.as_str()))
        .collect();
    folders.sort();
    let mut tested: Vec<String> = TESTED.iter().map(|s| s.to_string()).collect();
    tested.sort();
    assert_eq!(
        folders, tested,
        "every folder of examples/ is tested here (TESTED lists them), and every listed one exists"
    );
    // Each listed folder has its test, and holds a pipeline file with a header.
    let source = include_str!("examples.rs");
    for folder in TESTED {
        let test = format!("fn the_{}_example_", folder.replace('-', "_"));
        assert!(
            source.contains(&test),
            "no test `{test}…` for examples/{folder}"
        );
        assert!(
            !header(folder).is_empty(),
            "examples/{folder}/pipeline.yaml has no header comment"
        );
    }
}

#[test]
fn the_sample_adds_up_to_what_the_examples_say() {
    let docs = sample();
    assert_eq!(docs.len(), 10_000);
    assert_view(&reduce_expected(&docs), "the sample");
}

// ---------------------------------------------------------------------------------
// Into stores.

#[test]
fn the_quickstart_example_reduces_its_generated_views_as_its_comments_say() {
    // A million generated documents over 100 000 users (seed 7), reduced here
    // independently from the generator's pure function.
    assert_says(
        "quickstart",
        &[
            "sqlite3 examples/quickstart/out/views.db",
            "Run it again and nothing changes",
        ],
    );
    let ex = Example::new("quickstart");
    ex.run();
    let mut expected: BTreeMap<String, Row> = BTreeMap::new();
    for seq in 0..1_000_000 {
        let doc = sluice_datagen::pageview::pageview(7, 100_000, seq);
        expected.entry(doc.user_id()).or_default().add(
            doc.views as i64,
            doc.bytes as i64,
            &doc.last_seen(),
        );
    }
    let db = ex.path("out/views.db");
    let rows = sqlite_snapshot(&db);
    assert_eq!(rows.len(), expected.len(), "one row per user");
    assert!(
        sqlite_table(&db) == expected,
        "the table is the generated views' reduction"
    );
    // `workers: auto`: one key-range shard per core.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let shards = ex.path(".sluice/pipeline/views-db/shards/ranges");
    let listed: Vec<String> = match std::fs::read(&shards) {
        Ok(text) => serde_json::from_slice(&text).unwrap(),
        Err(_) => vec![String::new()],
    };
    assert_eq!(listed.len(), cores, "one shard per core: {listed:?}");
    ex.run();
    assert_eq!(sqlite_snapshot(&db), rows, "a second run changes nothing");
}

#[test]
fn the_file_example_fills_its_sqlite_table_as_its_comments_say() {
    assert_says(
        "file",
        &[
            "1000|10000|25323633|2026-01-31T23:47:35Z",
            "u0042|14|32774|2026-01-30T08:55:42Z",
            "1000 rows",
        ],
    );
    let ex = Example::new("file");
    let db = ex.path("out/views.db");
    ex.run_twice("the SQLite table", || sqlite_snapshot(&db));
}

#[test]
fn the_airbyte_faker_example_reads_fake_users_into_sqlite_as_its_comments_say() {
    assert_says(
        "airbyte-faker",
        &["pip install airbyte-source-faker", "100|100", "100 rows"],
    );
    // `.ci/services` installs the connector and links it into this folder.
    let home = std::env::var("HOME").unwrap();
    let bin = std::env::var("SLUICE_CONNECTORS")
        .unwrap_or_else(|_| format!("{home}/.cache/sluice-connectors/bin"));
    assert!(
        Path::new(&bin).join("source-faker").exists(),
        "{bin}/source-faker is missing: run `bash .ci/services`"
    );
    let path = format!("{bin}:{}", std::env::var("PATH").unwrap_or_default());
    let ex = Example::new("airbyte-faker").var("PATH", path);
    ex.run();
    let db = rusqlite::Connection::open(ex.path("out/faker.db")).unwrap();
    let counted: (i64, i64) = db
        .query_row("SELECT count(*), count(DISTINCT id) FROM users", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!(counted, (100, 100));
}

/// A schema of the shared PostgreSQL server, dropped with everything in it when dropped.
struct PgSchema(String);

impl Drop for PgSchema {
    fn drop(&mut self) {
        let sql = format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.0);
        postgres_execute(common::POSTGRES_URL, &sql);
    }
}

/// The `pageviews` table of `schema`: (user_id, views, bytes, last_seen in RFC 3339).
fn postgres_rows(schema: &str) -> Vec<(String, i64, i64, String)> {
    let sql = format!(
        "SELECT user_id, views::bigint, bytes::bigint, \
         to_char(last_seen AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"') \
         FROM \"{schema}\".pageviews ORDER BY user_id"
    );
    common::postgres(async |client| {
        let rows = client.query(&sql, &[]).await.unwrap();
        rows.iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect()
    })
}

#[test]
fn the_postgres_example_fills_its_table_as_its_comments_say() {
    assert_says(
        "postgres",
        &[
            "1000|10000|25323633",
            "u0042|14|32774|2026-01-30 08:55:42+00",
            "--metrics 127.0.0.1:9464 --follow",
        ],
    );
    let schema = PgSchema(unique("ex"));
    let ex = Example::new("postgres")
        .var("POSTGRES_URL", common::POSTGRES_URL)
        .var("POSTGRES_SCHEMA", &schema.0);
    ex.run_twice("the PostgreSQL table", || postgres_rows(&schema.0));

    // As the getting-started guide runs it: metrics and the status page, kept up once
    // the file is read, tailing it: a line appended meanwhile is reduced in.
    let address = free_address();
    let mut running = ex.spawn(&["--metrics", &address.to_string(), "--follow"]);
    let get = |path: &str| {
        Client::new(address, "")
            .request("GET", path, &[], b"")
            .ok()
            .filter(|r| r.status == 200)
            .map(|r| String::from_utf8_lossy(&r.body).into_owned())
    };
    running.wait_until("metrics served", || get("/metrics").is_some());
    assert!(get("/").is_some(), "the status page");
    let metrics = get("/metrics").unwrap();
    for series in [
        "sluice_transactions_committed_total",
        "sluice_source_documents_read_total",
    ] {
        assert!(metrics.contains(series), "{series} in\n{metrics}");
    }
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(ex.root.path().join("examples/data/pageviews.jsonl"))
        .unwrap();
    writeln!(
        file,
        r#"{{"user_id":"u0042","views":1,"bytes":100,"last_seen":"2026-02-01T00:00:00Z"}}"#
    )
    .unwrap();
    drop(file);
    let appended = (
        "u0042".to_string(),
        15,
        32_774 + 100,
        "2026-02-01T00:00:00Z".to_string(),
    );
    running.wait_until("the appended line reduced in", || {
        postgres_rows(&schema.0).contains(&appended)
    });
    assert!(
        running.child.try_wait().unwrap().is_none(),
        "--follow keeps the run up"
    );
    running.terminate();
    ex.run();
    let after = postgres_rows(&schema.0);
    assert!(after.contains(&appended), "a later run reads nothing twice");
    assert_eq!(after.len(), USERS);
    ex.apply_delete();
    let table = format!("SELECT to_regclass('\"{}\".pageviews')::text", schema.0);
    let left: Option<String> =
        common::postgres(async |client| client.query_one(&table, &[]).await.unwrap().get(0));
    assert_eq!(left, None, "apply --delete drops the table");
}

fn mysql_rows(database: &str) -> Vec<(String, i64, i64, String)> {
    use mysql_async::prelude::Queryable;
    let sql = format!(
        "SELECT user_id, views, bytes, last_seen FROM `{database}`.pageviews ORDER BY user_id"
    );
    mysql(async |conn| conn.query(sql).await.unwrap())
}

#[test]
fn the_mysql_example_fills_its_table_as_its_comments_say() {
    use mysql_async::prelude::Queryable;
    assert_says(
        "mysql",
        &[
            "1000 rows",
            "the views add up to 10000, the bytes to 25323633",
            "latest last_seen is 2026-01-31T23:47:35Z",
        ],
    );
    let database = MyDatabase::create(&unique("ex"));
    let ex = Example::new("mysql").var("MYSQL_URL", format!("{MYSQL_SERVER}/{}", database.0));
    ex.run_twice("the MariaDB table", || mysql_rows(&database.0));
    ex.apply_delete();
    let tables = format!(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = '{}' \
         AND table_name = 'pageviews'",
        database.0
    );
    let left: Vec<String> = mysql(async |conn| conn.query(tables).await.unwrap());
    assert!(left.is_empty(), "apply --delete drops the table");
}

/// A key prefix of the shared Redis server; every key under it is removed when dropped.
struct RedisPrefix(String);

impl Drop for RedisPrefix {
    fn drop(&mut self) {
        let prefix = self.0.clone();
        redis(async |conn| {
            sluice_redis::client::delete_prefix(conn, &prefix)
                .await
                .unwrap()
        });
    }
}

/// Every hash under `prefix`, by key.
fn redis_hashes(prefix: &str) -> BTreeMap<String, BTreeMap<String, String>> {
    redis(async |conn| {
        let mut hashes = BTreeMap::new();
        for key in redis_keys(conn, prefix).await {
            let hash: BTreeMap<String, String> = redis::cmd("HGETALL")
                .arg(&key)
                .query_async(conn)
                .await
                .unwrap();
            hashes.insert(key, hash);
        }
        hashes
    })
}

#[test]
fn the_redis_example_stores_a_hash_per_user_as_its_comments_say() {
    assert_says(
        "redis",
        &[
            "HGETALL pageviews:02753030343200",
            "1000 keys",
            "delivery: at_least_once",
        ],
    );
    let prefix = RedisPrefix(format!("{}:pageviews:", unique("ex")));
    let ex = Example::new("redis")
        .var("REDIS_URL", REDIS_URL)
        .var("REDIS_PREFIX", &prefix.0);
    ex.run();
    let hashes = redis_hashes(&prefix.0);
    assert_eq!(hashes.len(), USERS, "one key per user");
    let mut view = BTreeMap::new();
    for (key, hash) in &hashes {
        let doc: Value = serde_json::from_str(&hash["flow_document"]).unwrap();
        let user = doc["user_id"].as_str().unwrap();
        for field in ["views", "bytes"] {
            assert_eq!(hash[field], doc[field].to_string(), "{key} {field}");
        }
        assert_eq!(hash["user_id"], user);
        assert_eq!(hash["last_seen"], doc["last_seen"].as_str().unwrap());
        view.insert(user.to_string(), Row::of(&doc));
    }
    assert_view(&view, "the Redis hashes");
    let u0042 = &hashes[&format!("{}02753030343200", prefix.0)];
    let fields = ["user_id", "views", "bytes", "last_seen"].map(|f| u0042[f].as_str());
    assert_eq!(
        fields,
        ["u0042", "14", "32774", "2026-01-30T08:55:42Z"],
        "the key the comments show"
    );
    ex.run();
    assert_eq!(
        redis_hashes(&prefix.0),
        hashes,
        "a second run changes nothing"
    );
    ex.apply_delete();
    assert!(
        redis_hashes(&prefix.0).is_empty(),
        "apply --delete removes every key"
    );
}

#[test]
fn the_iceberg_example_appends_a_change_log_as_its_comments_say() {
    assert_says(
        "iceberg",
        &["1000 1000 10000 25323633", "delta_updates: true"],
    );
    let ex = Example::new("iceberg");
    ex.run();
    let read = || {
        sluice_iceberg::pyiceberg_read(
            &ex.path("out/catalog.db"),
            &ex.path("out/warehouse"),
            "sluice.pageviews",
            false,
        )
        .unwrap()
    };
    let rows = read();
    let mut view: BTreeMap<String, Row> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    for row in &rows {
        let user = row["user_id"].as_str().unwrap().to_string();
        let txn = row["_txn"].as_i64().unwrap();
        assert_eq!(row["_op"], "U", "{row}");
        assert!(seen.insert((txn, user.clone())), "{user} twice in {txn}");
        view.entry(user).or_default().add_doc(row);
    }
    assert_view(&view, "the Iceberg change log, summed per user");
    ex.run();
    assert_eq!(read().len(), rows.len(), "a second run appends nothing");
}

#[test]
fn the_iceberg_s3_example_upserts_one_row_per_user_on_s3_as_its_comments_say() {
    assert_says(
        "iceberg-s3",
        &["1000 1000 10000 25323633", "mode: upsert", "create_bucket"],
    );
    let bucket = sluice_testkit::s3::TestBucket::create("iceberg-s3-example");
    let ex = Example::new("iceberg-s3").var("ICEBERG_BUCKET", &bucket.name);
    let read = || {
        let warehouse = sluice_iceberg::Warehouse::S3 {
            url: sluice_object_store::S3Url::parse(&bucket.url("warehouse")).unwrap(),
            settings: sluice_testkit::s3::settings(),
        };
        let rows = sluice_iceberg::pyiceberg_read(
            &ex.path("out/catalog.db"),
            warehouse,
            "sluice.pageviews",
            false,
        )
        .unwrap();
        let mut view: BTreeMap<String, Row> = BTreeMap::new();
        for row in &rows {
            let user = row["user_id"].as_str().unwrap().to_string();
            assert!(
                view.insert(user, Row::of(row)).is_none(),
                "{row}: a user twice"
            );
        }
        view
    };
    ex.run();
    assert_view(&read(), "the upserted table, one row per user");
    ex.run();
    assert_view(&read(), "a second run changes nothing");
}

// ---------------------------------------------------------------------------------
// Change streams out.

/// Folds changes in Feldera's insert_delete format (`{"insert": doc}`, `{"delete":
/// doc}`), in order, into the view they describe: a delete must remove what the view
/// holds.
fn fold_insert_delete(view: &mut BTreeMap<String, Row>, line: &str) {
    let change: Value = serde_json::from_str(line).unwrap();
    match (change.get("insert"), change.get("delete")) {
        (Some(doc), None) => {
            let user = doc["user_id"].as_str().unwrap().to_string();
            assert!(
                view.insert(user, Row::of(doc)).is_none(),
                "an insert onto a row not deleted first: {line}"
            );
        }
        (None, Some(doc)) => {
            let user = doc["user_id"].as_str().unwrap();
            assert_eq!(
                view.remove(user),
                Some(Row::of(doc)),
                "a delete of another row than the view's: {line}"
            );
        }
        _ => panic!("not an insert_delete change: {line}"),
    }
}

/// The change files of the files example, in transaction order: (name, text).
fn change_files(folder: &Path) -> Vec<(String, String)> {
    let mut files: Vec<(u64, String)> = std::fs::read_dir(folder)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|name| {
            sluice_files_output::parse_batch_file_name(&name).map(|file| (file.txn, name))
        })
        .collect();
    files.sort();
    for (i, (txn, _)) in files.iter().enumerate() {
        assert_eq!(*txn, files[0].0 + i as u64, "transactions are contiguous");
    }
    files
        .into_iter()
        .map(|(_, name)| {
            let text = std::fs::read_to_string(folder.join(&name)).unwrap();
            (name, text)
        })
        .collect()
}

#[test]
fn the_files_example_publishes_changes_that_fold_to_the_view() {
    assert_says(
        "files",
        &["examples/files/out/changes/", "insert_delete", "1000 users"],
    );
    let ex = Example::new("files");
    ex.run();
    let files = change_files(&ex.path("out/changes"));
    assert!(!files.is_empty());
    assert!(files[0].0.ends_with(".jsonl"), "{}", files[0].0);
    let mut view = BTreeMap::new();
    for (_, text) in &files {
        for line in text.lines() {
            fold_insert_delete(&mut view, line);
        }
    }
    assert_view(&view, "the folded change files");
    ex.run();
    assert_eq!(
        change_files(&ex.path("out/changes")),
        files,
        "a second run writes nothing"
    );
}

/// Folds Debezium change events (in order) into the view: each event's `after` is the
/// user's row, its `before` what the view held.
fn fold_debezium(view: &mut BTreeMap<String, Row>, event: &Value) {
    let after = &event["after"];
    let user = after["user_id"].as_str().unwrap().to_string();
    let before = (!event["before"].is_null()).then(|| Row::of(&event["before"]));
    let op = if before.is_some() { "u" } else { "c" };
    assert_eq!(event["op"], op, "{event}");
    assert_eq!(view.get(&user).cloned(), before, "{event}");
    view.insert(user, Row::of(after));
}

#[test]
fn the_kafka_example_reads_a_topic_and_publishes_its_changes_as_its_comments_say() {
    use sluice_testkit::tansu::{LOCAL_BROKER, ensure_local_broker};
    let produce = "sluice produce --partitions 4 examples/kafka/pipeline.yaml views-kafka";
    assert_says(
        "kafka",
        &[
            produce,
            "examples/data/pageviews.jsonl",
            "1000|10000|25323633|2026-01-31T23:47:35Z",
            "\"after\"",
        ],
    );
    ensure_local_broker().unwrap();
    let name = unique("ex").replace('_', "-");
    let (topic, changes) = (format!("{name}-pageviews"), format!("{name}-changes"));
    let runtime = tokio::runtime::Runtime::new().unwrap();

    let ex = Example::new("kafka")
        .var("KAFKA_BROKERS", LOCAL_BROKER)
        .var("KAFKA_TOPIC", &topic)
        .var("KAFKA_CHANGES_TOPIC", &changes);
    ex.produce(produce, &format!("topic {topic}"));
    ex.run();
    let db = ex.path("out/views.db");
    let rows = assert_sqlite_view(&db);
    let read_changes = || {
        let mut messages = runtime
            .block_on(sluice_kafka_output::read::read_topic(
                &[LOCAL_BROKER.to_string()],
                &changes,
            ))
            .unwrap();
        messages.sort_by_key(|m| (m.stamp.txn, m.stamp.index));
        messages
    };
    let messages = read_changes();
    let mut view = BTreeMap::new();
    for message in &messages {
        let event: Value = serde_json::from_slice(&message.value).unwrap();
        let key: Value = serde_json::from_slice(&message.key).unwrap();
        assert_eq!(
            key,
            serde_json::json!({"user_id": event["after"]["user_id"]})
        );
        fold_debezium(&mut view, &event);
    }
    assert_view(&view, "the changes topic, folded");

    ex.run_again_idle(&db, &rows, messages.len(), || read_changes().len());
}

/// JetStream streams of the local server, deleted when dropped.
struct NatsStreams(Vec<String>);

const NATS_URL: &str = "nats://127.0.0.1:4222";

impl Drop for NatsStreams {
    fn drop(&mut self) {
        block_on(async {
            let admin = sluice_nats::admin::Admin::connect(NATS_URL).await.unwrap();
            for stream in &self.0 {
                admin.delete_stream(stream).await.ok();
            }
        });
    }
}

#[test]
fn the_nats_example_reads_a_stream_and_publishes_its_changes_as_its_comments_say() {
    let produce = "sluice produce examples/nats/pipeline.yaml views-nats";
    assert_says(
        "nats",
        &[
            produce,
            "examples/data/pageviews.jsonl",
            "1000|10000|25323633|2026-01-31T23:47:35Z",
            "insert_delete",
        ],
    );
    let name = unique("EX");
    let streams = NatsStreams(vec![name.clone(), format!("{name}_CHANGES")]);
    let (subject, changes) = (
        format!("{}.pageviews", name.to_lowercase()),
        format!("{}.changes", name.to_lowercase()),
    );

    let ex = Example::new("nats")
        .var("NATS_URL", NATS_URL)
        .var("NATS_STREAM", &name)
        .var("NATS_SUBJECT", &subject)
        .var("NATS_CHANGES_STREAM", &streams.0[1])
        .var("NATS_CHANGES_SUBJECT", &changes);
    ex.produce(produce, &format!("subject {subject}"));
    ex.run();
    let db = ex.path("out/views.db");
    let rows = assert_sqlite_view(&db);
    let read_changes =
        || block_on(sluice_nats_output::read::read_subject(NATS_URL, &changes)).unwrap();
    let messages = read_changes();
    let mut view = BTreeMap::new();
    for message in &messages {
        fold_insert_delete(
            &mut view,
            std::str::from_utf8(&message.payload).unwrap().trim_end(),
        );
    }
    assert_view(&view, "the changes subject, folded");

    ex.run_again_idle(&db, &rows, messages.len(), || read_changes().len());
}

// ---------------------------------------------------------------------------------
// Other sources.

/// The SQLite mirror of the CDC example: id → (user_id, views, bytes, last_seen).
type Mirror = BTreeMap<i64, (String, i64, i64, String)>;

fn mirror(db: &Path) -> Mirror {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut stmt = conn
        .prepare(r#"SELECT "id", "user_id", "views", "bytes", "last_seen" FROM "pageviews""#)
        .unwrap();
    stmt.query_map([], |r| {
        Ok((r.get(0)?, (r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)))
    })
    .unwrap()
    .map(Result::unwrap)
    .collect()
}

fn psql(ex: &Example, url: &str, args: &[&str]) {
    let out = Command::new("psql")
        .arg(url)
        .args(["-q", "-v", "ON_ERROR_STOP=1"])
        .args(args)
        .current_dir(ex.root.path())
        .output()
        .expect("run psql");
    assert!(
        out.status.success(),
        "psql {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_postgres_cdc_example_mirrors_its_table_as_its_comments_say() {
    assert_says(
        "postgres-cdc",
        &[
            "wal_level = logical",
            "psql postgres://postgres@127.0.0.1:5432/test -f examples/postgres-cdc/setup.sql",
            "10000|1000|10000|25323633",
            "-c 'UPDATE pageviews SET views = 5 WHERE id = 1' -c 'DELETE FROM pageviews WHERE id = 2'",
            "9999 rows, the views adding up to 10003",
            "pg_drop_replication_slot('sluice_views_db_views_cdc')",
        ],
    );
    let pg = sluice_testkit::postgres::LogicalPostgres::start();
    let url = pg.url();
    let ex = Example::new("postgres-cdc").var("POSTGRES_CDC_URL", &url);
    psql(&ex, &url, &["-f", "examples/postgres-cdc/setup.sql"]);
    ex.run();

    // Row i is line i of the sample.
    let db = ex.path("out/pageviews.db");
    let rows = mirror(&db);
    let expected: Mirror = (sample().iter().enumerate())
        .map(|(i, doc)| {
            let row = (
                doc["user_id"].as_str().unwrap().to_string(),
                doc["views"].as_i64().unwrap(),
                doc["bytes"].as_i64().unwrap(),
                doc["last_seen"].as_str().unwrap().to_string(),
            );
            (i as i64 + 1, row)
        })
        .collect();
    assert!(rows == expected, "the mirror is the sample, line by line");
    let distinct: BTreeSet<&String> = rows.values().map(|r| &r.0).collect();
    assert_eq!(distinct.len(), USERS);
    let slots = postgres_at(&url, async |client| {
        let rows = client
            .query("SELECT slot_name::text FROM pg_replication_slots", &[])
            .await
            .unwrap();
        rows.iter()
            .map(|r| r.get::<_, String>(0))
            .collect::<Vec<_>>()
    });
    assert_eq!(
        slots,
        ["sluice_views_db_views_cdc"],
        "the slot the comments name"
    );

    ex.run();
    assert_eq!(mirror(&db), rows, "a second run changes nothing");

    psql(
        &ex,
        &url,
        &[
            "-c",
            "UPDATE pageviews SET views = 5 WHERE id = 1",
            "-c",
            "DELETE FROM pageviews WHERE id = 2",
        ],
    );
    ex.run();
    let changed = mirror(&db);
    assert_eq!(changed.len(), 9_999);
    assert_eq!(changed.values().map(|r| r.1).sum::<i64>(), 10_003);
    assert_eq!(changed[&1].1, 5);
    assert!(!changed.contains_key(&2));
}

#[test]
fn the_http_example_takes_the_posted_sample_as_its_comments_say() {
    assert_says(
        "http",
        &[
            "curl -H \"Authorization: Bearer change-me\" -H \"Idempotency-Key: sample-1\"",
            "--data-binary @examples/data/pageviews.jsonl http://127.0.0.1:8080/ingest/views-http",
            "{\"txn\":1,\"documents\":10000}",
            "1000|10000|25323633|2026-01-31T23:47:35Z",
        ],
    );
    const TOKEN: &str = "example-token";
    let address = free_address();
    let ex = Example::new("http")
        .var("INGEST_LISTEN", address.to_string())
        .var("INGEST_TOKEN", TOKEN);
    let mut running = ex.spawn(&[]);
    running.wait_until("the server healthy", || {
        Client::new(address, TOKEN)
            .request("GET", "/health", &[], b"")
            .is_ok_and(|r| r.status == 200 && r.json()["source"] == "views-http")
    });

    let body = std::fs::read(ex.root.path().join("examples/data/pageviews.jsonl")).unwrap();
    let mut client = Client::new(address, TOKEN);
    let answer = client
        .ingest("views-http", Some("sample-1"), &body)
        .unwrap();
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    assert_eq!(
        answer.json(),
        serde_json::json!({"txn": 1, "documents": 10_000})
    );
    // Durable before the answer: the store holds the sample now.
    let db = ex.path("out/views.db");
    let rows = assert_sqlite_view(&db);

    let again = client
        .ingest("views-http", Some("sample-1"), &body)
        .unwrap();
    assert_eq!(again.status, 200);
    assert_eq!(
        again.json(),
        answer.json(),
        "the same answer for the same key"
    );
    assert_eq!(sqlite_snapshot(&db), rows, "applied once");
    running.terminate();
    assert_eq!(sqlite_snapshot(&db), rows);
}

// ---------------------------------------------------------------------------------
// An external driver.

/// The example's Python driver, started as its README says; killed when dropped.
fn start_python_driver(ex: &Example) -> (Running, String) {
    let log = ex.path("out/driver.log");
    let mut command = Command::new("python3");
    command
        .args([
            "examples/python-driver/driver.py",
            "--state",
            "examples/python-driver/out/driver-state.json",
        ])
        .current_dir(ex.root.path());
    let (child, address) = common::start_python_driver(
        PythonProtocol::Seed,
        command,
        &ex.path("out/generated"),
        &log,
    );
    (Running { child, log }, address)
}

#[test]
fn the_python_driver_example_fills_the_drivers_table_as_its_comments_say() {
    assert_says(
        "python-driver",
        &[
            "export DRIVER_ADDRESS=127.0.0.1:PORT",
            "1000 10000 25323633",
        ],
    );
    let readme =
        std::fs::read_to_string(Path::new(EXAMPLES).join("python-driver/README.md")).unwrap();
    for step in [
        "python3 -m grpc_tools.protoc -I crates/proto/proto",
        "python3 examples/python-driver/driver.py --state examples/python-driver/out/driver-state.json",
        "sluice driver test --endpoint $DRIVER_ADDRESS",
        "sluice run examples/python-driver/pipeline.yaml",
    ] {
        assert!(readme.contains(step), "the README says {step:?}");
    }
    let ex = Example::new("python-driver");
    let (driver, address) = start_python_driver(&ex);
    let ex = ex.var("DRIVER_ADDRESS", &address);

    let suite = ex
        .sluice(&[
            "driver",
            "test",
            "--endpoint",
            &address,
            "--config",
            "examples/python-driver/config.json",
            "--lacks",
            "delta-updates",
        ])
        .output()
        .unwrap();
    assert!(
        suite.status.success(),
        "sluice driver test: {}\n{}\ndriver log:\n{}",
        String::from_utf8_lossy(&suite.stdout),
        String::from_utf8_lossy(&suite.stderr),
        driver.log()
    );

    let table = || -> BTreeMap<String, Value> {
        let text = std::fs::read_to_string(ex.path("out/driver-state.json")).unwrap();
        let state: Value = serde_json::from_str(&text).unwrap();
        let table = state["views-driver"]["pageviews"].as_object().unwrap();
        table.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
    };
    ex.run();
    let rows = table();
    let view: BTreeMap<String, Row> = rows
        .values()
        .map(|doc| (doc["user_id"].as_str().unwrap().to_string(), Row::of(doc)))
        .collect();
    assert_eq!(rows.len(), USERS);
    assert_view(&view, "the driver's table");
    ex.run();
    assert_eq!(table(), rows, "a second run changes nothing");
    drop(driver);
}

/// The example's current-protocol Python driver, started as its README says (its
/// modules generated into its `out/generated`, where it finds them); killed when
/// dropped.
fn start_python_driver_current(ex: &Example) -> (Running, String) {
    let log = ex.path("out/driver.log");
    let mut command = Command::new("python3");
    command
        .args([
            "examples/python-driver-current/driver.py",
            "--state",
            "examples/python-driver-current/out/driver-state.json",
        ])
        .current_dir(ex.root.path());
    let generated = ex.path("out/generated");
    let (child, address) =
        common::start_python_driver(PythonProtocol::Current, command, &generated, &log);
    (Running { child, log }, address)
}

#[test]
fn the_python_driver_current_example_fills_the_drivers_table_as_its_comments_say() {
    assert_says(
        "python-driver-current",
        &[
            "export DRIVER_ADDRESS=127.0.0.1:PORT",
            "--protocol current",
            "1000 10000 25323633",
        ],
    );
    let readme =
        std::fs::read_to_string(Path::new(EXAMPLES).join("python-driver-current/README.md"))
            .unwrap();
    for step in [
        "python3 -m grpc_tools.protoc -I crates/proto/proto/current",
        "python3 examples/python-driver-current/driver.py \\\n  --state examples/python-driver-current/out/driver-state.json",
        "sluice driver test --endpoint $DRIVER_ADDRESS --protocol current",
        "sluice run examples/python-driver-current/pipeline.yaml",
    ] {
        assert!(readme.contains(step), "the README says {step:?}");
    }
    let ex = Example::new("python-driver-current");
    let (driver, address) = start_python_driver_current(&ex);
    let ex = ex.var("DRIVER_ADDRESS", &address);

    let suite = ex
        .sluice(&[
            "driver",
            "test",
            "--endpoint",
            &address,
            "--protocol",
            "current",
            "--config",
            "examples/python-driver-current/config.json",
            "--lacks",
            "delta-updates",
        ])
        .output()
        .unwrap();
    assert!(
        suite.status.success(),
        "sluice driver test: {}\n{}\ndriver log:\n{}",
        String::from_utf8_lossy(&suite.stdout),
        String::from_utf8_lossy(&suite.stderr),
        driver.log()
    );

    // The store: {"tables": {materialization: {table: {key hex: document text}}}, …}.
    let table = || -> BTreeMap<String, Value> {
        let text = std::fs::read_to_string(ex.path("out/driver-state.json")).unwrap();
        let state: Value = serde_json::from_str(&text).unwrap();
        let table = state["tables"]["views-driver"]["pageviews"]
            .as_object()
            .unwrap();
        (table.iter())
            .map(|(k, v)| {
                (
                    k.clone(),
                    serde_json::from_str(v.as_str().unwrap()).unwrap(),
                )
            })
            .collect()
    };
    ex.run();
    let rows = table();
    let view: BTreeMap<String, Row> = rows
        .values()
        .map(|doc| (doc["user_id"].as_str().unwrap().to_string(), Row::of(doc)))
        .collect();
    assert_eq!(rows.len(), USERS);
    assert_view(&view, "the driver's table");
    ex.run();
    assert_eq!(table(), rows, "a second run changes nothing");
    drop(driver);
}

/// Runs the mariadb client in the example's copy (LOAD DATA LOCAL reads files there).
fn mariadb_client(ex: &Example, port: u16, args: &[&str], input: Option<&str>) {
    let mut cmd = Command::new("mariadb");
    cmd.args(["-h", "127.0.0.1", "-P", &port.to_string(), "-u", "root"])
        .args(args)
        .current_dir(ex.root.path());
    if let Some(file) = input {
        cmd.stdin(std::fs::File::open(ex.root.path().join(file)).unwrap());
    }
    let out = cmd.output().expect("run mariadb");
    assert!(
        out.status.success(),
        "mariadb {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_mysql_cdc_example_mirrors_its_table_as_its_comments_say() {
    assert_says(
        "mysql-cdc",
        &[
            "binlog_format = ROW",
            "mariadb -h 127.0.0.1 -u root --local-infile=1 test < examples/mysql-cdc/setup.sql",
            "10000|1000|10000|25323633",
            "-e 'UPDATE pageviews SET views = 5 WHERE id = 1; DELETE FROM pageviews WHERE id = 2'",
            "9999 rows, the views adding up to 10003",
        ],
    );
    let server = sluice_testkit::mariadb::BinlogMariadb::start();
    let ex = Example::new("mysql-cdc").var("MYSQL_CDC_URL", format!("{}/test", server.url()));
    mariadb_client(&ex, server.port, &["-e", "CREATE DATABASE test"], None);
    mariadb_client(
        &ex,
        server.port,
        &["--local-infile=1", "test"],
        Some("examples/mysql-cdc/setup.sql"),
    );
    ex.run();
    let db = ex.path("out/pageviews.db");
    let rows = mirror(&db);
    let expected: Mirror = (sample().iter().enumerate())
        .map(|(i, doc)| {
            let row = (
                doc["user_id"].as_str().unwrap().to_string(),
                doc["views"].as_i64().unwrap(),
                doc["bytes"].as_i64().unwrap(),
                doc["last_seen"].as_str().unwrap().to_string(),
            );
            (i as i64 + 1, row)
        })
        .collect();
    assert!(rows == expected, "the mirror is the sample, line by line");
    let distinct: BTreeSet<&String> = rows.values().map(|r| &r.0).collect();
    assert_eq!(distinct.len(), USERS);
    ex.run();
    assert_eq!(mirror(&db), rows, "a second run changes nothing");
    mariadb_client(
        &ex,
        server.port,
        &[
            "test",
            "-e",
            "UPDATE pageviews SET views = 5 WHERE id = 1; DELETE FROM pageviews WHERE id = 2",
        ],
        None,
    );
    ex.run();
    let changed = mirror(&db);
    assert_eq!(changed.len(), 9_999);
    assert_eq!(changed.values().map(|r| r.1).sum::<i64>(), 10_003);
    assert_eq!(changed[&1].1, 5);
    assert!(!changed.contains_key(&2));
}
