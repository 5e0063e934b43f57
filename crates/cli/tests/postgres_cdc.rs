//! End-to-end: `sluice run` of a `postgres_cdc` source (a private PostgreSQL with
//! `wal_level=logical`) into SQLite: the first run snapshots the table and streams what
//! changed meanwhile, a second run resumes from the slot; each time the store equals
//! the source table (deleted rows, and the old keys of rows whose key changed, gone).
//! What operators do to it: a long quiet period of the captured table while 100 MB
//! are written elsewhere (the slot must advance and hold back little WAL), and a store
//! restored from a backup behind what the slot confirmed (refused, naming both LSNs).

use sluice_testkit::postgres::LogicalPostgres;
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;

use common::{SLUICE, assert_success, free_address, postgres_at, postgres_execute};

type Rows = BTreeMap<i64, (Option<String>, Option<i64>)>;

fn source_rows(url: &str) -> Rows {
    postgres_at(url, async |client| {
        let rows = client
            .query("SELECT id, name, qty::bigint FROM items", &[])
            .await
            .unwrap();
        rows.iter()
            .map(|r| (r.get(0), (r.get(1), r.get(2))))
            .collect()
    })
}

fn store_rows(db: &Path) -> Rows {
    let conn = rusqlite::Connection::open(db).unwrap();
    let mut stmt = conn
        .prepare(r#"SELECT "id", "name", "qty" FROM "items""#)
        .unwrap();
    stmt.query_map([], |r| Ok((r.get(0)?, (r.get(1)?, r.get(2)?))))
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn pipeline(url: &str) -> String {
    format!(
        r#"
collections:
  shop/items:
    key: [/id]
    schema:
      type: object
      required: [id]
      properties:
        id: {{type: integer}}
        name: {{type: [string, "null"]}}
        qty: {{type: [integer, "null"]}}
sources:
  items-cdc:
    target: shop/items
    postgres_cdc: {{url: "{url}", tables: [public.items], chunk_rows: 500}}
materializations:
  items-db:
    endpoint:
      sqlite: {{path: out/items.db}}
    bindings:
      - source: shop/items
        resource: {{table: items}}
runtime:
  transactions: {{max_docs: 700, max_duration: 1s, min_duration: 1s}}
"#
    )
}

#[test]
fn snapshot_and_streamed_changes_equal_the_source_table() {
    let pg = LogicalPostgres::start();
    let url = pg.url();
    postgres_execute(
        &url,
        "CREATE TABLE items (id bigint PRIMARY KEY, name text, qty int);
         INSERT INTO items SELECT g, 'item ' || g, g FROM generate_series(1, 3000) g;",
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    std::fs::write(&file, pipeline(&url)).unwrap();
    let run = || {
        let out = Command::new(SLUICE)
            .arg("run")
            .arg(&file)
            .env("RUST_LOG", "warn")
            .output()
            .unwrap();
        assert_success(&out);
    };
    run();
    assert_eq!(
        store_rows(&dir.path().join("out/items.db")),
        source_rows(&url)
    );
    postgres_execute(
        &url,
        "UPDATE items SET qty = qty * 2 WHERE id % 7 = 0;
         INSERT INTO items SELECT g, NULL, NULL FROM generate_series(3001, 3500) g;
         UPDATE items SET name = 'renamed' WHERE id BETWEEN 10 AND 20;
         DELETE FROM items WHERE id % 5 = 0;
         UPDATE items SET id = id + 10000 WHERE id BETWEEN 100 AND 104;",
    );
    run();
    assert_eq!(
        store_rows(&dir.path().join("out/items.db")),
        source_rows(&url)
    );
}

/// The slot every test's pipeline reads: `sluice_<materialization>_<source>`.
const SLOT: &str = "sluice_items_db_items_cdc";

/// One number from a query of the server at `url` (an LSN as `pg_lsn - '0/0'`).
fn number(url: &str, query: &str) -> Option<u64> {
    let query = query.to_string();
    postgres_at(url, async move |client| {
        let rows = client.query(&query, &[]).await.unwrap();
        rows.first()
            .and_then(|r| r.get::<_, Option<String>>(0))
            .map(|n| n.parse().unwrap())
    })
}

fn confirmed_flush(url: &str) -> u64 {
    number(
        url,
        &format!(
            "SELECT (confirmed_flush_lsn - '0/0'::pg_lsn)::text FROM pg_replication_slots \
             WHERE slot_name = '{SLOT}'"
        ),
    )
    .unwrap_or(0)
}

fn wal_lsn(url: &str) -> u64 {
    number(url, "SELECT (pg_current_wal_lsn() - '0/0'::pg_lsn)::text").unwrap()
}

/// What the server keeps for the slot: from its `restart_lsn` to the end of the WAL.
fn retained(url: &str) -> u64 {
    number(
        url,
        &format!(
            "SELECT (pg_current_wal_lsn() - restart_lsn)::text FROM pg_replication_slots \
             WHERE slot_name = '{SLOT}'"
        ),
    )
    .unwrap()
}

fn lsn_text(lsn: u64) -> String {
    format!("{:X}/{:X}", lsn >> 32, lsn & 0xffff_ffff)
}

/// A `sluice run --follow`, stopped (SIGKILL) when dropped.
struct Following(Child);

impl Drop for Following {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The body of `GET path` from the run's metrics endpoint, once it answers.
fn http_get(address: SocketAddr, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(address).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
}

/// `sluice_source_retained_bytes` of the pipeline's source, once reported.
fn retained_metric(address: SocketAddr) -> Option<u64> {
    let text = http_get(address, "/metrics")?;
    text.lines()
        .find(|l| l.starts_with("sluice_source_retained_bytes{") && l.contains("items-cdc"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Waits for `done`, failing with `what` after `limit`.
fn wait_for(limit: Duration, what: &str, mut done: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !done() {
        assert!(started.elapsed() < limit, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    started.elapsed()
}

/// A captured table that stays quiet while 100 MB go into a table outside the
/// publication: the slot's `confirmed_flush_lsn` follows the WAL within 10 s of the
/// last write (quiet steps, committed like any other), and what the slot holds back
/// falls below 16 MiB (its `restart_lsn` follows at the next running-transactions
/// snapshot, which PostgreSQL logs every 15 s), as `sluice_source_retained_bytes`
/// reports too, and a warning said when it held back more than `retained_warning`.
#[test]
fn a_quiet_slot_advances_while_100_mb_are_written_outside_the_publication() {
    let pg = LogicalPostgres::start();
    let url = pg.url();
    postgres_execute(
        &url,
        "CREATE TABLE items (id bigint PRIMARY KEY, name text, qty int);
         INSERT INTO items SELECT g, 'item ' || g, g FROM generate_series(1, 10) g;
         CREATE TABLE noise (id bigint PRIMARY KEY, pad text);",
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    let warned = pipeline(&url).replace(
        "chunk_rows: 500}",
        "chunk_rows: 500, retained_warning: 8MiB}",
    );
    std::fs::write(&file, warned).unwrap();
    let address = free_address();
    let log = std::fs::File::create(dir.path().join("sluice.log")).unwrap();
    let _run = Following(
        Command::new(SLUICE)
            .args(["run", "--follow", "--metrics", &address.to_string()])
            .arg(&file)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let db = dir.path().join("out/items.db");
    wait_for(Duration::from_secs(60), "the snapshot in the store", || {
        db.exists()
            && rusqlite::Connection::open(&db)
                .and_then(|c| c.query_row("SELECT count(*) FROM items", [], |r| r.get(0)))
                .is_ok_and(|n: i64| n == 10)
    });

    let start = wal_lsn(&url);
    for i in 0..20 {
        postgres_execute(
            &url,
            &format!(
                "INSERT INTO noise SELECT g, repeat(md5(g::text), 32) FROM \
                 generate_series({}, {}) g",
                i * 5000 + 1,
                (i + 1) * 5000
            ),
        );
    }
    let written = wal_lsn(&url);
    assert!(
        written - start >= 100 << 20,
        "{} bytes of WAL",
        written - start
    );

    let took = wait_for(
        Duration::from_secs(10),
        "the slot confirms the WAL written outside the publication",
        || written.saturating_sub(confirmed_flush(&url)) < 1 << 20,
    );
    eprintln!("confirmed within 1 MiB of the WAL end {took:?} after the last write");
    wait_for(
        Duration::from_secs(40),
        "the slot holds back less than 16 MiB of WAL",
        || retained(&url) < 16 << 20,
    );
    wait_for(
        Duration::from_secs(20),
        "sluice_source_retained_bytes below 16 MiB",
        || retained_metric(address).is_some_and(|n| n < 16 << 20),
    );
    let status: serde_json::Value =
        serde_json::from_str(&http_get(address, "/api/status").unwrap()).unwrap();
    let source = &status["shards"][0]["sources"]["items-cdc"];
    assert!(source["retained"].is_u64(), "{status}");
    // While the slot held back more than retained_warning, a warning said so (once a
    // minute at most).
    let log = std::fs::read_to_string(dir.path().join("sluice.log")).unwrap();
    let warnings = log.matches("above retained_warning (8.0 MiB)").count();
    assert_eq!(warnings, 1, "{log}");
    assert!(
        log.contains(&format!("replication slot `{SLOT}` holds back")),
        "{log}"
    );
    assert_eq!(
        store_rows(&db),
        source_rows(&url),
        "nothing captured meanwhile"
    );
}

/// A store restored from a backup whose checkpoint is behind what the slot already
/// confirmed: the server would start the stream at its confirmed position without a
/// word, losing the changes in between, so the run refuses, naming the slot, both
/// LSNs and what to do, and leaves the store as restored; `sluice apply --delete` then
/// starts over and the store equals the table again.
#[test]
fn a_store_restored_behind_the_slot_is_refused_naming_both_lsns() {
    let pg = LogicalPostgres::start();
    let url = pg.url();
    postgres_execute(
        &url,
        "CREATE TABLE items (id bigint PRIMARY KEY, name text, qty int);
         INSERT INTO items SELECT g, 'item ' || g, g FROM generate_series(1, 1000) g;",
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pipeline.yaml");
    std::fs::write(&file, pipeline(&url)).unwrap();
    let sluice = |args: &[&str]| {
        Command::new(SLUICE)
            .args(args)
            .arg(&file)
            .env("RUST_LOG", "warn")
            .output()
            .unwrap()
    };
    let db = dir.path().join("out/items.db");
    assert_success(&sluice(&["run"]));
    postgres_execute(&url, "INSERT INTO items VALUES (1001, 'streamed', 1)");
    assert_success(&sluice(&["run"]));
    assert_eq!(store_rows(&db), source_rows(&url));
    let backed_up = confirmed_flush(&url);
    let wal_at_backup = wal_lsn(&url);
    let backup = dir.path().join("backup.db");
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute("VACUUM INTO ?1", [backup.to_str().unwrap()])
        .unwrap();
    let restored = store_rows(&db);

    postgres_execute(
        &url,
        "UPDATE items SET qty = -1 WHERE id <= 10;
         INSERT INTO items VALUES (1002, 'lost', 2);",
    );
    assert_success(&sluice(&["run"]));
    assert_eq!(store_rows(&db), source_rows(&url));
    // A clean stop confirms its last commit: the slot is past the backup.
    let confirmed = confirmed_flush(&url);
    assert!(
        confirmed > wal_at_backup,
        "the slot confirmed {} after the last run, the backup was taken at {}",
        lsn_text(confirmed),
        lsn_text(wal_at_backup)
    );

    for suffix in ["-wal", "-shm"] {
        let _ = std::fs::remove_file(dir.path().join(format!("out/items.db{suffix}")));
    }
    std::fs::copy(&backup, &db).unwrap();
    let out = sluice(&["run"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a run behind the slot must fail; the store now has {} rows of {}:\n{stderr}",
        store_rows(&db).len(),
        source_rows(&url).len()
    );
    for needle in [
        "source items-cdc: cannot seek back to",
        &format!("replication slot `{SLOT}`"),
        &format!("has confirmed LSN {}", lsn_text(confirmed)),
        &format!("past LSN {}", lsn_text(backed_up)),
        "sluice apply --delete",
        "older than the recovery log's",
    ] {
        assert!(stderr.contains(needle), "{needle:?} in {stderr}");
    }
    eprintln!("{stderr}");
    assert_eq!(store_rows(&db), restored, "the store is left as restored");
    assert_eq!(confirmed_flush(&url), confirmed, "the slot did not move");

    // What the error says to do: start over.
    assert_success(&sluice(&["apply", "--delete"]));
    assert_success(&sluice(&["run"]));
    assert_eq!(store_rows(&db), source_rows(&url));
}
