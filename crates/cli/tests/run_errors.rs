//! `sluice run` when something fails: what was committed is printed before the error,
//! and a store that stops answering ends the stream with a retryable timeout instead of
//! hanging the pipeline; once it answers again the loop reopens and the table is exact.
//!
//! The hung store is the shared PostgreSQL server behind a TCP proxy of this test,
//! which stops forwarding, in both directions, once the run has sent it a given number
//! of bytes: its connections stay open, so only a timeout can end the wait. While it is
//! stopped it refuses new connections (as a partitioned server's host does); when the
//! test has seen the timeout it forwards again.
//!
//! A store that cannot be reached at the first start is retried as the loop retries,
//! each attempt logged with its cause, and a signal ends the wait.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::common;

use common::{Row, SLUICE, assert_success, generate, pipeline_yaml, reduce_expected, write_lines};

const POSTGRES: &str = "127.0.0.1:5432";

#[test]
fn a_failed_run_prints_what_it_committed_before_the_error() {
    let dir = tempfile::tempdir().unwrap();
    let docs = generate(3_000, 100, 7);
    let input = dir.path().join("views.jsonl");
    write_lines(&input, &docs);
    // Line 3001 is not JSON: transaction 4 fails, transactions 1-3 (1000 each) commit.
    let mut text = std::fs::read_to_string(&input).unwrap();
    text.push_str("{not json\n");
    std::fs::write(&input, text).unwrap();
    let pipeline = pipeline_yaml(
        "    file: {path: views.jsonl, format: json}",
        "sqlite: {path: views.db}",
        false,
        1000,
        "10m",
    );
    std::fs::write(dir.path().join("pipeline.yaml"), pipeline).unwrap();

    let out = Command::new(SLUICE)
        .arg("run")
        .arg(dir.path().join("pipeline.yaml"))
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        !out.status.success(),
        "bad input must fail the run: {stdout}"
    );
    assert!(stderr.contains("views.jsonl:3001"), "{stderr}");
    assert!(
        stdout.starts_with("views-db (failed): 3000 documents ("),
        "{stdout}"
    );
    assert!(
        stdout.contains(" in 3 transactions, ")
            && stdout.contains("; last committed transaction 3"),
        "{stdout}"
    );
}

/// A TCP proxy to PostgreSQL that stops forwarding once it has forwarded `stall_after`
/// bytes to the server, until [`Proxy::resume`].
struct Proxy {
    port: u16,
    forwarding: Arc<watch::Sender<bool>>,
    stalled: Arc<AtomicBool>,
    /// Runs the proxy's tasks; they end with it.
    _runtime: tokio::runtime::Runtime,
}

impl Proxy {
    fn start(stall_after: u64) -> Proxy {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime.block_on(TcpListener::bind("127.0.0.1:0")).unwrap();
        let port = listener.local_addr().unwrap().port();
        let forwarding = Arc::new(watch::channel(true).0);
        let to_server = Arc::new(AtomicU64::new(0));
        let stalled = Arc::new(AtomicBool::new(false));
        let accepting = forwarding.clone();
        let stall_flag = stalled.clone();
        runtime.spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                // Stopped: a new connection is refused (closed at once).
                if !*accepting.borrow() {
                    continue;
                }
                let Ok(server) = TcpStream::connect(POSTGRES).await else {
                    continue;
                };
                let (client_read, client_write) = client.into_split();
                let (server_read, server_write) = server.into_split();
                let stall = Some(Stall {
                    sent: to_server.clone(),
                    threshold: stall_after,
                    stalled: stall_flag.clone(),
                });
                tokio::spawn(pump(client_read, server_write, accepting.clone(), stall));
                tokio::spawn(pump(server_read, client_write, accepting.clone(), None));
            }
        });
        Proxy {
            port,
            forwarding,
            stalled,
            _runtime: runtime,
        }
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/test", self.port)
    }

    /// Whether it has stopped forwarding (and not necessarily resumed since).
    fn stalled(&self) -> bool {
        self.stalled.load(Ordering::SeqCst)
    }

    fn resume(&self) {
        self.forwarding.send_replace(true);
    }
}

/// When a pump stops forwarding everywhere: once `sent` passes `threshold`.
struct Stall {
    sent: Arc<AtomicU64>,
    threshold: u64,
    stalled: Arc<AtomicBool>,
}

/// Copies `from` to `to` while forwarding is on (bytes read meanwhile wait). With
/// `stall`, counts the bytes it forwards.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    forwarding: Arc<watch::Sender<bool>>,
    stall: Option<Stall>,
) {
    let mut on = forwarding.subscribe();
    let mut buf = vec![0; 16 << 10];
    loop {
        let n = from.read(&mut buf).await.unwrap_or(0);
        if on.wait_for(|on| *on).await.is_err() {
            return;
        }
        if n == 0 {
            let _ = to.shutdown().await;
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
        if let Some(stall) = &stall {
            let before = stall.sent.fetch_add(n as u64, Ordering::SeqCst);
            if before < stall.threshold && before + n as u64 >= stall.threshold {
                forwarding.send_replace(false);
                stall.stalled.store(true, Ordering::SeqCst);
            }
        }
    }
}

fn postgres<T>(f: impl AsyncFnOnce(&tokio_postgres::Client) -> T) -> T {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let url = format!("postgres://postgres@{POSTGRES}/test");
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(conn);
        f(&client).await
    })
}

/// A schema of its own in the shared server, dropped afterwards.
struct Schema(String);

impl Schema {
    fn create() -> Schema {
        let name = format!("sluice_timeout_{}", std::process::id());
        let sql = format!(r#"DROP SCHEMA IF EXISTS "{name}" CASCADE; CREATE SCHEMA "{name}""#);
        postgres(async |c| c.batch_execute(&sql).await.unwrap());
        Schema(name)
    }

    fn table(&self) -> BTreeMap<String, Row> {
        let sql = format!(
            r#"SELECT "user_id", "views", "bytes", "last_seen" FROM "{}"."pageviews""#,
            self.0
        );
        let rows: Vec<(String, i64, i64, String)> = postgres(async |c| {
            let rows = c.query(&sql, &[]).await.unwrap();
            rows.iter()
                .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
                .collect()
        });
        let mut table: BTreeMap<String, Row> = BTreeMap::new();
        for (user, views, bytes, seen) in rows {
            table.entry(user).or_default().add(views, bytes, &seen);
        }
        table
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let sql = format!(r#"DROP SCHEMA IF EXISTS "{}" CASCADE"#, self.0);
        postgres(async |c| c.batch_execute(&sql).await.unwrap());
    }
}

#[test]
fn a_store_that_stops_answering_times_out_and_the_reopened_run_is_exact() {
    let schema = Schema::create();
    // About 2 MB of COPY in 10 transactions: the proxy stops after the first few.
    let proxy = Proxy::start(400 << 10);
    let dir = tempfile::tempdir().unwrap();
    let docs = generate(20_000, 3_000, 11);
    write_lines(&dir.path().join("views.jsonl"), &docs);
    let endpoint = format!(
        "postgres: {{url: \"{}\", schema: {}}}",
        proxy.url(),
        schema.0
    );
    let mut pipeline = pipeline_yaml(
        "    file: {path: views.jsonl, format: json}",
        &endpoint,
        false,
        2000,
        "10m",
    );
    // Longer than any healthy wait on a busy machine (a spurious timeout would only
    // retry, but the test waits for the stall's own).
    pipeline.push_str("  timeouts: {driver: 10s}\n");
    std::fs::write(dir.path().join("pipeline.yaml"), pipeline).unwrap();

    let mut child = Command::new(SLUICE)
        .arg("run")
        .arg(dir.path().join("pipeline.yaml"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = Vec::new();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    // Until the hung stream has timed out and the loop reopens.
    for line in lines.by_ref() {
        let line = line.unwrap();
        let timed_out = line.contains("timed out after 10s waiting for");
        stderr.push(line);
        if timed_out && proxy.stalled() {
            break;
        }
    }
    proxy.resume();
    stderr.extend(lines.map(Result::unwrap));
    let out = child.wait_with_output().unwrap();
    let stderr = stderr.join("\n");
    let timeout = stderr
        .lines()
        .find(|l| l.contains("timed out after 10s waiting for"))
        .unwrap_or_else(|| panic!("the store never stalled the run: {stderr}"));
    assert!(timeout.contains("driver postgres: "), "{timeout}");
    assert!(timeout.contains("runtime.timeouts.driver"), "{timeout}");
    assert!(timeout.contains("reopening in"), "retried: {timeout}");
    let out = std::process::Output {
        stderr: stderr.into_bytes(),
        ..out
    };
    assert_success(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("restarts"), "{stdout}");
    assert_eq!(schema.table(), reduce_expected(&docs), "the table is exact");
}

/// A first start whose PostgreSQL store refuses connections: each attempt is logged
/// with its cause (connection refused), the Apply is retried instead of ending the run
/// at once, and SIGINT ends the wait with the error.
#[test]
fn an_unreachable_store_at_the_first_start_is_retried_with_its_cause_until_a_signal() {
    let dir = tempfile::tempdir().unwrap();
    write_lines(&dir.path().join("views.jsonl"), &generate(10, 5, 3));
    let closed = common::free_address();
    let pipeline = pipeline_yaml(
        "    file: {path: views.jsonl, format: json}",
        &format!("postgres: {{url: \"postgres://root@{closed}/test\"}}"),
        false,
        1000,
        "200ms",
    );
    let path = dir.path().join("pipeline.yaml");
    std::fs::write(&path, pipeline).unwrap();
    let mut child = Command::new(SLUICE)
        .arg("run")
        .arg(&path)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let first = lines.next().expect("a line").unwrap();
    assert!(
        first.contains("Connection refused") && first.contains("applying again in"),
        "the first attempt is retried, naming its cause: {first}"
    );
    common::signal(&child, "INT");
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    let status = child.wait().unwrap();
    assert!(!status.success());
    let last = rest.last().expect("the final error");
    assert!(
        last.starts_with("error: ") && last.contains("Connection refused"),
        "{rest:?}"
    );
}

/// A Kafka source whose broker refuses connections: the client library's own
/// reconnection attempts (several a second) are not each a warning in the log, and a
/// signal ends the run's wait for the source at once.
#[test]
fn an_unreachable_kafka_broker_is_not_a_warning_per_reconnection() {
    let dir = tempfile::tempdir().unwrap();
    let closed = common::free_address();
    let pipeline = pipeline_yaml(
        &format!("    kafka: {{brokers: \"{closed}\", topic: t, format: json}}"),
        "sqlite: {path: views.db}",
        false,
        1000,
        "200ms",
    );
    let path = dir.path().join("pipeline.yaml");
    std::fs::write(&path, pipeline).unwrap();
    let child = Command::new(SLUICE)
        .arg("run")
        .arg(&path)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(3));
    // The run is still checking that its source can be read: a signal ends that wait at
    // once, before anything was created.
    common::signal(&child, "INT");
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("stopped before the run began"), "{stderr}");
    assert!(
        !stderr.contains("rskafka"),
        "the client's reconnections are logged: {stderr}"
    );
    assert!(
        !dir.path().join("views.db").exists(),
        "the store was created"
    );
}
