//! What the end-to-end tests share: the pageviews pipeline, its expected reduction
//! computed independently of Sluice's reducers, running the binary, and reaching the
//! shared services (PostgreSQL, Redis) and a Python driver from synchronous tests.

// Each test binary uses its own subset of these helpers.
#![allow(dead_code)]

pub mod changes;
pub mod cluster;
pub mod torture;

use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// How long a test waits for what a run should soon do.
pub const PATIENCE: Duration = Duration::from_secs(120);

/// Runs `sluice bench <args> --json` and returns its figures, once they say the bench's
/// result was exact (the bench's own check against the input's reduction).
pub fn exact_bench_figures(args: &[&str]) -> Value {
    let out = Command::new(SLUICE)
        .arg("bench")
        .args(args)
        .arg("--json")
        .output()
        .expect("run sluice bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "bench {args:?} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let figures: Value =
        serde_json::from_str(stdout.lines().last().unwrap_or_default()).expect("JSON figures");
    assert_eq!(figures["exact"], true, "{figures}");
    figures
}

/// Copies folder `from` into `to`, recursively, leaving out the entries named in `skip`
/// at any depth (a backup of a recovery log; an example without what a run wrote).
pub fn copy_dir(from: &Path, to: &Path, skip: &[&str]) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if skip.contains(&name.to_string_lossy().as_ref()) {
            continue;
        }
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &to.join(&name), skip);
        } else {
            std::fs::copy(entry.path(), to.join(&name)).unwrap();
        }
    }
}

/// Polls `probe` every 100 ms until it returns something, failing with `what` after
/// `limit`.
pub fn wait_until<T>(what: &str, limit: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(found) = probe() {
            return found;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The shared PostgreSQL server's test database.
pub const POSTGRES_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The shared Redis server's database 0.
pub const REDIS_URL: &str = "redis://127.0.0.1:6379/0";

/// The protobuf definitions a driver's Python modules are generated from.
pub const PROTOS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../proto/proto");

/// Runs `f` to completion on a current-thread runtime of its own (the tests themselves
/// are synchronous).
pub fn block_on<T>(f: impl Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(f)
}

/// Sends signal `name` (`INT`, `TERM`, `STOP`, …) to `child`.
pub fn signal(child: &Child, name: &str) {
    let status = Command::new("kill")
        .arg(format!("-{name}"))
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(status.success(), "kill -{name}");
}

/// An address on 127.0.0.1 free now, and claimed for this test (`free_port`).
pub fn free_address() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], sluice_testkit::ports::free_port()))
}

/// Runs `f` with a client of the shared PostgreSQL server, on a runtime of its own.
pub fn postgres<T>(f: impl AsyncFnOnce(&tokio_postgres::Client) -> T) -> T {
    postgres_at(POSTGRES_URL, f)
}

/// Runs `f` with a client of the PostgreSQL server at `url`, on a runtime of its own.
pub fn postgres_at<T>(url: &str, f: impl AsyncFnOnce(&tokio_postgres::Client) -> T) -> T {
    block_on(async {
        let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        f(&client).await
    })
}

/// Runs the statements `sql` on the PostgreSQL server at `url`.
pub fn postgres_execute(url: &str, sql: &str) {
    postgres_at(url, async |c| c.batch_execute(sql).await.unwrap());
}

/// Runs `f` with a connection to the shared Redis server, on a runtime of its own.
pub fn redis<T>(f: impl AsyncFnOnce(&mut redis::aio::MultiplexedConnection) -> T) -> T {
    block_on(async {
        let client = redis::Client::open(REDIS_URL).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        f(&mut conn).await
    })
}

/// Every key under `prefix` (SCAN to the end).
pub async fn redis_keys(conn: &mut redis::aio::MultiplexedConnection, prefix: &str) -> Vec<String> {
    let mut keys: Vec<String> = Vec::new();
    let mut cursor = 0u64;
    loop {
        let (next, found): (u64, Vec<String>) = redis::cmd("SCAN")
            .cursor_arg(cursor)
            .arg("MATCH")
            .arg(sluice_redis::key::scan_pattern(prefix))
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await
            .unwrap();
        keys.extend(found);
        if next == 0 {
            return keys;
        }
        cursor = next;
    }
}

/// The `.proto` files a Python driver's modules are generated from: the seed's protocol
/// or Flow's current one.
#[derive(Clone, Copy)]
pub enum PythonProtocol {
    Seed,
    Current,
}

/// Generates the Python protobuf and grpcio modules of `protocol` into `generated`.
pub fn generate_python_modules(protocol: PythonProtocol, generated: &Path) {
    let (dir, files): (String, &[&str]) = match protocol {
        PythonProtocol::Seed => (PROTOS.to_string(), &["flow.proto", "materialize.proto"]),
        PythonProtocol::Current => (
            format!("{PROTOS}/current"),
            &["consumer.proto", "flow.proto", "materialize.proto"],
        ),
    };
    std::fs::create_dir_all(generated).unwrap();
    let protoc = Command::new("python3")
        .args(["-m", "grpc_tools.protoc", "-I", &dir])
        .arg(format!("--python_out={}", generated.display()))
        .arg(format!("--grpc_python_out={}", generated.display()))
        .args(files)
        .output()
        .expect("run python3 (needed with grpcio and grpcio-tools: see .ci/services)");
    assert!(
        protoc.status.success(),
        "generating the Python protobuf modules failed (python3 -m pip install grpcio \
         grpcio-tools, as .ci/services does): {}",
        String::from_utf8_lossy(&protoc.stderr)
    );
}

/// Starts a driver written with Python's grpcio: generates the protobuf modules of
/// `protocol` into `generated`, spawns `driver` (a `python3` command) with them on its
/// path and its stderr in `log`, and returns it with the address its first line names
/// (`listening on HOST:PORT`). A driver that does not start is killed, failing the test.
pub fn start_python_driver(
    protocol: PythonProtocol,
    mut driver: Command,
    generated: &Path,
    log: &Path,
) -> (Child, String) {
    generate_python_modules(protocol, generated);
    let mut child = driver
        .env("PYTHONPATH", generated)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("start the grpcio driver");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    match line.trim().strip_prefix("listening on ") {
        Some(address) => (child, address.to_string()),
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the grpcio driver did not start ({line:?}): {}",
                std::fs::read_to_string(log).unwrap_or_default()
            )
        }
    }
}

/// Deterministic input: `n` documents over `keys` users.
pub fn generate(n: usize, keys: usize, seed: u64) -> Vec<Value> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 33
    };
    (0..n)
        .map(|i| {
            let user = next() as usize % keys;
            json!({
                "user_id": format!("user-{user:05}"),
                "views": (next() % 10) as i64,
                "bytes": (next() % 5000) as i64,
                "last_seen": format!("2026-11-{:02}T{:02}:00:{:02}Z", 1 + next() % 28, next() % 24, i % 60),
            })
        })
        .collect()
}

pub fn write_lines(path: &Path, docs: &[Value]) {
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    for d in docs {
        serde_json::to_writer(&mut f, d).unwrap();
        f.write_all(b"\n").unwrap();
    }
}

/// Appends `docs` to the JSON-lines file `path` (created if absent), in one write.
pub fn append_lines(path: &Path, docs: &[Value]) {
    let mut text = String::new();
    for doc in docs {
        text.push_str(&doc.to_string());
        text.push('\n');
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    file.write_all(text.as_bytes()).unwrap();
}

/// The expected row of one user: views and bytes summed, last_seen maximized.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Row {
    pub views: i64,
    pub bytes: i64,
    pub last_seen: String,
}

impl Row {
    /// The row of one pageviews document (or of a row read back as one).
    pub fn of(doc: &Value) -> Row {
        let mut row = Row::default();
        row.add_doc(doc);
        row
    }

    /// Reduces one more pageviews document (or row read back as one) into the row.
    pub fn add_doc(&mut self, doc: &Value) {
        self.add(
            doc["views"].as_i64().unwrap(),
            doc["bytes"].as_i64().unwrap(),
            doc["last_seen"].as_str().unwrap(),
        );
    }

    /// Reduces one more document (or row) of this user into the row.
    pub fn add(&mut self, views: i64, bytes: i64, last_seen: &str) {
        self.views += views;
        self.bytes += bytes;
        if last_seen > self.last_seen.as_str() {
            self.last_seen = last_seen.to_string();
        }
    }
}

/// The rows of the `pageviews` table of the SQLite database `db`:
/// (user_id, views, bytes, last_seen).
pub fn sqlite_rows(db: &Path) -> Vec<(String, i64, i64, String)> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut stmt = conn
        .prepare(r#"SELECT "user_id", "views", "bytes", "last_seen" FROM "pageviews""#)
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// The `flow_document`s of the SQLite table `things` of `db` (keyed by `k`) in key
/// order; a delta table's (no primary key, so a rowid) in the order stored too.
pub fn sqlite_things(db: &Path) -> Vec<String> {
    let conn = rusqlite::Connection::open(db).unwrap();
    let keyed: bool = conn
        .query_row(
            "SELECT sql LIKE '%WITHOUT ROWID' FROM sqlite_master WHERE name = 'things'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let order = if keyed { r#""k""# } else { r#""k", rowid"# };
    let mut stmt = conn
        .prepare(&format!(
            r#"SELECT "flow_document" FROM "things" ORDER BY {order}"#
        ))
        .unwrap();
    stmt.query_map([], |r| r.get::<_, String>(0))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// The SQLite table `pageviews` of `db`, per user.
pub fn sqlite_table(db: &Path) -> BTreeMap<String, Row> {
    let mut table: BTreeMap<String, Row> = BTreeMap::new();
    for (user, views, bytes, seen) in sqlite_rows(db) {
        table.entry(user).or_default().add(views, bytes, &seen);
    }
    table
}

/// The pageviews upsert table under `dir/out` as pyiceberg reads it (position deletes
/// applied): each user's row, its columns equal to its document's, or why it cannot be
/// read yet (a user with two live rows is a failure, not a wait).
pub fn iceberg_upsert_view(dir: &Path) -> Result<BTreeMap<String, Row>, String> {
    let rows = sluice_iceberg::pyiceberg_read(
        &dir.join("out/catalog.db"),
        &dir.join("out/warehouse"),
        "sluice.pageviews",
        false,
    )?;
    let mut view = BTreeMap::new();
    for row in &rows {
        let user = row["user_id"].as_str().unwrap().to_string();
        let doc: Value = serde_json::from_str(row["flow_document"].as_str().unwrap()).unwrap();
        assert_eq!(
            doc["views"], row["views"],
            "the document column holds the row"
        );
        assert!(
            view.insert(user.clone(), Row::of(row)).is_none(),
            "user {user} has two live rows"
        );
    }
    Ok(view)
}

/// The reduction of `docs` per user, as the pipeline's schema says.
pub fn reduce_expected(docs: &[Value]) -> BTreeMap<String, Row> {
    let mut out: BTreeMap<String, Row> = BTreeMap::new();
    for doc in docs {
        out.entry(doc["user_id"].as_str().unwrap().to_string())
            .or_default()
            .add_doc(doc);
    }
    out
}

/// The `collections:` section of the pageviews pipelines: `acme/pageviews`, keyed by
/// user, summing views and bytes and keeping the latest `last_seen`.
pub const PAGEVIEWS_COLLECTION: &str = r#"collections:
  acme/pageviews:
    key: [/user_id]
    schema:
      type: object
      required: [user_id, views, bytes, last_seen]
      reduce: {strategy: merge}
      properties:
        user_id: {type: string}
        views: {type: integer, reduce: {strategy: sum}}
        bytes: {type: integer, reduce: {strategy: sum}}
        last_seen: {type: string, reduce: {strategy: maximize}}
"#;

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
{PAGEVIEWS_COLLECTION}sources:
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

/// The pageviews collection (its documents only need a `user_id`) from `sources` (YAML,
/// indented as sources) into SQLite.
pub fn user_ids_into_sqlite(sources: &str) -> String {
    format!(
        r#"
collections:
  acme/pageviews:
    key: [/user_id]
    schema: {{type: object, required: [user_id], properties: {{user_id: {{type: string}}}}}}
sources:
{sources}
materializations:
  views-db:
    endpoint: {{sqlite: {{path: out/views.db}}}}
    bindings: [{{source: acme/pageviews, resource: {{table: pageviews}}}}]
"#
    )
}

/// `sluice status <args> <pipeline>`, which must succeed: its standard output.
pub fn sluice_status(pipeline: &Path, args: &[&str]) -> String {
    let out = Command::new(SLUICE)
        .arg("status")
        .args(args)
        .arg(pipeline)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

pub fn assert_success(out: &Output) {
    assert!(
        out.status.success(),
        "sluice run failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The rows of the `pageviews` table of `schema` of the shared PostgreSQL server:
/// (user_id, views, bytes, last_seen).
pub fn postgres_rows(schema: &str) -> Vec<(String, i64, i64, String)> {
    let sql =
        format!(r#"SELECT "user_id", "views", "bytes", "last_seen" FROM "{schema}"."pageviews""#);
    postgres(async |c| {
        c.query(&sql, &[])
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
            .collect()
    })
}

/// The `pageviews` table of `schema`, per user, asserting no user has two rows.
pub fn postgres_table(schema: &str) -> BTreeMap<String, Row> {
    let mut table: BTreeMap<String, Row> = BTreeMap::new();
    for (user, views, bytes, seen) in postgres_rows(schema) {
        assert!(!table.contains_key(&user), "{user} written twice");
        table.entry(user).or_default().add(views, bytes, &seen);
    }
    table
}

/// A schema of the shared server (`sluice_<tag>_<pid>`), dropped when dropped.
pub struct Schema(pub String);

impl Schema {
    pub fn new(tag: &str) -> Schema {
        let name = format!("sluice_{tag}_{}", std::process::id());
        let sql = format!(r#"DROP SCHEMA IF EXISTS "{name}" CASCADE; CREATE SCHEMA "{name}""#);
        postgres_execute(POSTGRES_URL, &sql);
        Schema(name)
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let sql = format!(r#"DROP SCHEMA IF EXISTS "{}" CASCADE"#, self.0);
        postgres_execute(POSTGRES_URL, &sql);
    }
}

/// The shared MariaDB server (its databases under it).
pub const MYSQL_SERVER: &str = "mysql://root@127.0.0.1:3306";

/// `f` on a connection to the shared MariaDB server.
pub fn mysql<T>(f: impl AsyncFnOnce(&mut mysql_async::Conn) -> T) -> T {
    mysql_at(&format!("{MYSQL_SERVER}/test"), f)
}

/// `f` on a connection to the MariaDB server at `url`, on a runtime of its own.
pub fn mysql_at<T>(url: &str, f: impl AsyncFnOnce(&mut mysql_async::Conn) -> T) -> T {
    block_on(async {
        let mut conn = mysql_async::Conn::from_url(url).await.unwrap();
        let out = f(&mut conn).await;
        conn.disconnect().await.unwrap();
        out
    })
}

/// A database of the shared MariaDB server, dropped when dropped.
pub struct MyDatabase(pub String);

impl MyDatabase {
    /// Creates database `name`.
    pub fn create(name: &str) -> MyDatabase {
        use mysql_async::prelude::Queryable;
        let sql = format!("CREATE DATABASE `{name}`");
        mysql(async |conn| conn.query_drop(sql).await.unwrap());
        MyDatabase(name.to_string())
    }

    /// The URL of a driver writing into it.
    pub fn url(&self) -> String {
        format!("{MYSQL_SERVER}/{}", self.0)
    }
}

impl Drop for MyDatabase {
    fn drop(&mut self) {
        use mysql_async::prelude::Queryable;
        let sql = format!("DROP DATABASE IF EXISTS `{}`", self.0);
        mysql(async |conn| conn.query_drop(sql).await.unwrap());
    }
}

/// The `pageviews` table of `database` of the shared MariaDB server, per user, asserting
/// no user has two rows.
pub fn mysql_table(database: &str) -> BTreeMap<String, Row> {
    use mysql_async::prelude::Queryable;
    let sql = format!("SELECT user_id, views, bytes, last_seen FROM `{database}`.pageviews");
    let rows: Vec<(String, i64, i64, String)> = mysql(async |conn| conn.query(sql).await.unwrap());
    let mut table: BTreeMap<String, Row> = BTreeMap::new();
    for (user, views, bytes, seen) in rows {
        assert!(!table.contains_key(&user), "{user} written twice");
        table.entry(user).or_default().add(views, bytes, &seen);
    }
    table
}

/// A driver served by `sluice driver serve`, killed however the test ends.
pub struct Served(pub Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `sluice driver serve <name> --listen <listen> --protocol <protocol>`;
/// returns it and the address from its `listening on ADDRESS` line.
pub fn serve_driver(name: &str, listen: &str, protocol: &str) -> (Served, String) {
    let mut child = Command::new(SLUICE)
        .args(["driver", "serve", name, "--listen", listen])
        .args(["--protocol", protocol])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start sluice driver serve");
    let stdout = child.stdout.take().unwrap();
    let served = Served(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    let address = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    (served, address)
}

/// An input file that grows on a thread of its own while a test kills members: 200 more
/// of `docs` every 100 ms, from the `from`-th on, until stopped.
pub struct Growing {
    appended: Arc<AtomicUsize>,
    running: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl Growing {
    pub fn start(path: &Path, docs: &[Value], from: usize) -> Growing {
        let (appended, running) = (
            Arc::new(AtomicUsize::new(from)),
            Arc::new(AtomicBool::new(true)),
        );
        let thread = {
            let (path, docs) = (path.to_path_buf(), docs.to_vec());
            let (appended, running) = (appended.clone(), running.clone());
            std::thread::spawn(move || {
                while running.load(Ordering::SeqCst) {
                    let from = appended.load(Ordering::SeqCst);
                    let to = (from + 200).min(docs.len());
                    append_lines(&path, &docs[from..to]);
                    appended.store(to, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        };
        Growing {
            appended,
            running,
            thread,
        }
    }

    /// Stops growing: how many of the documents the input holds, fewer than all (the
    /// input must not run out while it grows).
    pub fn stop(self, docs: &[Value]) -> usize {
        self.running.store(false, Ordering::SeqCst);
        self.thread.join().unwrap();
        let appended = self.appended.load(Ordering::SeqCst);
        assert!(appended < docs.len(), "the input ran out while growing");
        appended
    }
}
