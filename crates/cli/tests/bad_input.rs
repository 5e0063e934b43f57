//! Bad input, end to end with `sluice run` into SQLite: what `pipeline_e2e.rs` does not
//! already cover (malformed JSON, schema violation, missing key and `sum` overflow stop
//! the pipeline there).
//!
//! - `on_error: fail` (the default): a document above `max_document_size` (100 MiB),
//!   invalid UTF-8, and a CSV row with too many cells each stop the pipeline with an
//!   error naming source, file and line (the first bad one, whichever the kind); the
//!   transaction holding it commits nothing, the ones before it stay.
//! - `on_error: skip`: every kind of bad document lands in the dead-letter file with
//!   its reason and position, and as its document (JSON) or its text (not JSON, or the
//!   start of one too large), the table is the reduction of the good documents only,
//!   the summary counts the rejections, SIGKILLs never duplicate or lose a dead letter,
//!   and a 100 MiB document is streamed past in bounded memory.
//!
//! Expected tables are computed here, independently of Sluice's reducers.

use rusqlite::Connection;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use crate::common;

use common::{Row, SLUICE, assert_success, pipeline_yaml, reduce_expected};

/// Deterministic documents: `n` over `keys` users.
fn generate(n: usize, keys: usize) -> Vec<Value> {
    (0..n)
        .map(|i| {
            json!({
                "user_id": format!("user-{:04}", (i * 7919) % keys),
                "views": 1 + (i % 10) as i64,
                "bytes": ((i * 31) % 5000) as i64,
                "last_seen": format!("2026-11-{:02}T00:00:{:02}Z", 1 + i % 28, i % 60),
            })
        })
        .collect()
}

struct Fixture {
    dir: tempfile::TempDir,
    input: &'static str,
}

impl Fixture {
    /// A pipeline reading `input` (`views.jsonl` or `views.csv`) with the extra source
    /// settings `source` (YAML lines indented for the source) in transactions of
    /// `max_docs` documents.
    fn new(input: &'static str, source: &str, max_docs: u64, max_duration: &str) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let format = if input.ends_with(".csv") {
            "csv"
        } else {
            "json"
        };
        let pipeline = pipeline_yaml(
            source,
            "sqlite: {path: out/views.db}",
            false,
            max_docs,
            max_duration,
        );
        let pipeline = pipeline.replace("FORMAT", format).replace("INPUT", input);
        std::fs::write(dir.path().join("pipeline.yaml"), pipeline).unwrap();
        Fixture { dir, input }
    }

    /// Stops at bad input (the default), in transactions of 100 documents.
    fn failing(input: &'static str) -> Fixture {
        Fixture::new(input, "    file: {path: INPUT, format: FORMAT}", 100, "10s")
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn input(&self) -> PathBuf {
        self.path(self.input)
    }

    fn command(&self) -> Command {
        let mut cmd = Command::new(SLUICE);
        cmd.arg("run")
            .arg(self.path("pipeline.yaml"))
            .env("RUST_LOG", "warn");
        cmd
    }

    fn run(&self) -> Output {
        self.command().output().unwrap()
    }

    fn table(&self) -> BTreeMap<String, Row> {
        let conn = Connection::open(self.path("out/views.db")).unwrap();
        let mut stmt = conn
            .prepare(r#"SELECT "user_id", "views", "bytes", "last_seen" FROM "pageviews""#)
            .unwrap();
        stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                Row {
                    views: r.get(1)?,
                    bytes: r.get(2)?,
                    last_seen: r.get(3)?,
                },
            ))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect()
    }

    /// The dead-letter file's records.
    fn dead_letters(&self, path: &Path) -> Vec<Value> {
        match std::fs::read_to_string(path) {
            Ok(text) => text
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect(),
            Err(_) => Vec::new(),
        }
    }
}

fn json_lines(docs: &[Value]) -> Vec<u8> {
    docs.iter()
        .flat_map(|d| format!("{d}\n").into_bytes())
        .collect()
}

/// Runs a failing pipeline over `input` and checks the error names the source, the
/// file and line 551, and `needle`; and that only the first five transactions of 100
/// documents (the good documents before line 501) committed.
fn assert_stops_at_line_551(fx: &Fixture, good: &[Value], needle: &str) {
    let out = fx.run();
    assert!(!out.status.success(), "bad input must stop the pipeline");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let at = format!("{}:551", fx.input);
    for needle in [at.as_str(), "views-file", needle] {
        assert!(
            stderr.contains(needle),
            "error mentions {needle:?}: {stderr}"
        );
    }
    assert_eq!(fx.table(), reduce_expected(&good[..500]));
}

/// 550 good JSON lines, `bad` as line 551, then 449 more good ones.
fn json_with_bad_line(fx: &Fixture, bad: &[u8]) -> Vec<Value> {
    let docs = generate(1_000, 50);
    let mut text = json_lines(&docs[..550]);
    text.extend_from_slice(bad);
    text.push(b'\n');
    text.extend_from_slice(&json_lines(&docs[550..]));
    std::fs::write(fx.input(), text).unwrap();
    docs
}

/// A valid document of `size` bytes: its `last_seen` is padded with spaces.
fn huge_document(size: usize) -> Vec<u8> {
    let mut doc = br#"{"user_id": "user-0001", "views": 1, "bytes": 1, "last_seen": "x"#.to_vec();
    doc.resize(size - 2, b' ');
    doc.extend_from_slice(b"\"}");
    doc
}

#[test]
fn a_100_mib_document_stops_with_source_line_and_the_limit_to_raise() {
    let fx = Fixture::failing("views.jsonl");
    let docs = json_with_bad_line(&fx, &huge_document(100 << 20));
    assert_stops_at_line_551(&fx, &docs, "max_document_size");
}

#[test]
fn invalid_utf8_stops_with_source_and_line() {
    let fx = Fixture::failing("views.jsonl");
    let docs = json_with_bad_line(
        &fx,
        b"{\"user_id\": \"user-\xff\xfe\", \"views\": 1, \"bytes\": 1, \"last_seen\": \"x\"}",
    );
    assert_stops_at_line_551(&fx, &docs, "invalid UTF-8");
}

#[test]
fn the_first_bad_line_is_the_one_reported() {
    // Line 551 is not JSON (found when it is combined), line 552 is above 1 KiB (found
    // when it is read): one step reads both, the error names the first.
    let fx = Fixture::new(
        "views.jsonl",
        "    file: {path: INPUT, format: FORMAT, max_document_size: 1KiB}",
        100,
        "10s",
    );
    let mut bad = br#"{"user_id": "user-0001", "views": 1,"#.to_vec();
    bad.push(b'\n');
    bad.extend_from_slice(&huge_document(4096));
    let docs = json_with_bad_line(&fx, &bad);
    assert_stops_at_line_551(&fx, &docs, "invalid JSON");
    let stderr = String::from_utf8_lossy(&fx.run().stderr).into_owned();
    assert!(!stderr.contains("max_document_size"), "{stderr}");
}

#[test]
fn csv_row_with_too_many_columns_stops_with_source_and_line() {
    let fx = Fixture::failing("views.csv");
    let docs = generate(1_000, 50);
    let row = |d: &Value| {
        format!(
            "{},{},{},{}\n",
            d["user_id"].as_str().unwrap(),
            d["views"],
            d["bytes"],
            d["last_seen"].as_str().unwrap()
        )
    };
    // The header is line 1: the bad row, after 549 good ones, is line 551.
    let mut text = String::from("user_id,views,bytes,last_seen\n");
    docs[..549].iter().for_each(|d| text.push_str(&row(d)));
    text.push_str("user-0001,1,1,x,surplus\n");
    docs[549..].iter().for_each(|d| text.push_str(&row(d)));
    std::fs::write(fx.input(), text).unwrap();
    assert_stops_at_line_551(&fx, &docs, "row has 5 columns, the header has 4");
}

/// One bad line of kind `kind % 6` for a document following one of `user`, and the
/// words its reason must contain.
fn bad_line(kind: usize, user: &str) -> (Vec<u8>, &'static str) {
    match kind % 6 {
        0 => (br#"{"user_id": "user-0001", "views": 1,"#.to_vec(), "invalid JSON"),
        1 => (b"{\"user_id\": \"\xff\"}".to_vec(), "invalid UTF-8"),
        2 => (
            br#"{"user_id": "user-0002", "views": "many", "bytes": 1, "last_seen": "x"}"#.to_vec(),
            "/views",
        ),
        3 => (br#"{"views": 1, "bytes": 1, "last_seen": "x"}"#.to_vec(), "/user_id"),
        // Right after a document of the same user, so the sum overflows within the
        // transaction (batch boundaries fall after every 100th or 200th good document,
        // never before an overflow line: see `mixed_input`).
        4 => (
            format!(
                r#"{{"user_id": "{user}", "views": 18446744073709551615, "bytes": 1, "last_seen": "x"}}"#
            )
            .into_bytes(),
            "sum overflows",
        ),
        _ => (huge_document(4096), "max_document_size"),
    }
}

/// A bad line of [`mixed_input`].
struct BadLine {
    line: usize,
    /// Words of its reason.
    reason: &'static str,
    text: Vec<u8>,
}

/// Writes `n` good documents with a bad line after every 97th (from the 51st), cycling
/// through the kinds of [`bad_line`]; returns the good documents and the bad lines.
///
/// The k-th bad line follows good document `97k + 50`; with transactions of 100 (or
/// 200) good documents, a boundary follows it only for odd k, and overflow lines have
/// an even k: each overflow meets its user's document in its own transaction.
fn mixed_input(fx: &Fixture, n: usize) -> (Vec<Value>, Vec<BadLine>) {
    let docs = generate(n, 40);
    let mut text = Vec::new();
    let mut rejected = Vec::new();
    for (i, doc) in docs.iter().enumerate() {
        text.extend_from_slice(format!("{doc}\n").as_bytes());
        if i % 97 == 50 {
            let (raw, reason) = bad_line(rejected.len(), doc["user_id"].as_str().unwrap());
            text.extend_from_slice(&raw);
            text.push(b'\n');
            rejected.push(BadLine {
                // Lines are 1-based: i + 1 good lines and the earlier bad ones precede it.
                line: i + 2 + rejected.len(),
                reason,
                text: raw,
            });
        }
    }
    std::fs::write(fx.input(), text).unwrap();
    (docs, rejected)
}

/// A skipping source writing to `rejected/views.jsonl`, with documents of at most 1 KiB.
fn skipping(max_docs: u64, max_duration: &str) -> Fixture {
    Fixture::new(
        "views.jsonl",
        "    file: {path: INPUT, format: FORMAT, max_document_size: 1KiB}\n    \
         on_error: skip\n    dead_letter: rejected/views.jsonl",
        max_docs,
        max_duration,
    )
}

#[test]
fn skipped_documents_land_in_the_dead_letter_file_and_only_good_ones_are_reduced() {
    let fx = skipping(100, "10s");
    let (docs, rejected) = mixed_input(&fx, 1_200);
    let out = fx.run();
    assert_success(&out);
    assert_eq!(fx.table(), reduce_expected(&docs));

    let path = fx.path("rejected/views.jsonl");
    let letters = fx.dead_letters(&path);
    assert_eq!(letters.len(), rejected.len(), "{letters:#?}");
    for (letter, bad) in letters.iter().zip(&rejected) {
        let line = bad.line;
        assert_eq!(letter["source"], "views-file");
        let position = letter["position"].as_str().unwrap();
        assert!(
            position.contains(&format!("views.jsonl:{line} ")),
            "{position} is line {line}"
        );
        let why = letter["reason"].as_str().unwrap();
        assert!(why.contains(bad.reason), "reason of line {line}: {why}");
        let text = String::from_utf8_lossy(&bad.text);
        if letter["truncated"] == true {
            let start = letter["raw"].as_str().unwrap();
            assert!(text.starts_with(start), "line {line} starts with {start:?}");
        } else if let Ok(doc) = serde_json::from_slice::<Value>(&bad.text) {
            assert_eq!(letter["document"], doc, "line {line}");
        } else {
            assert_eq!(letter["raw"], *text, "line {line}");
        }
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let summary = format!("{} rejected, see {}", rejected.len(), path.display());
    assert!(stdout.contains(&summary), "{summary:?} in {stdout}");
}

#[test]
fn sigkills_neither_duplicate_nor_lose_dead_letters() {
    let fx = Fixture::new(
        "views.jsonl",
        "    file: {path: INPUT, format: FORMAT, max_document_size: 1KiB}\n    on_error: skip",
        200,
        "10s",
    );
    let (docs, rejected) = mixed_input(&fx, 60_000);
    let mut seed = 0xdead_u64;
    for _ in 0..6 {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        let mut child = fx
            .command()
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        std::thread::sleep(Duration::from_millis(200 + (seed >> 33) % 600));
        let _ = child.kill(); // SIGKILL, if it is still running
        child.wait().unwrap();
    }
    assert_success(&fx.run());
    assert_eq!(fx.table(), reduce_expected(&docs));
    // The default place: in the materialization's recovery log.
    let path = fx.path(".sluice/pipeline/views-db/dead-letters.jsonl");
    let lines: Vec<String> = fx
        .dead_letters(&path)
        .iter()
        .map(|l| l["position"].as_str().unwrap().to_string())
        .collect();
    let expected: Vec<String> = rejected
        .iter()
        .map(|bad| format!("views.jsonl:{} ", bad.line))
        .collect();
    assert_eq!(lines.len(), expected.len(), "each rejection recorded once");
    for (position, line) in lines.iter().zip(&expected) {
        assert!(position.contains(line), "{position} is {line}");
    }
}

/// Peak resident memory of a live process, in KiB (Linux).
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_100_mib_document_is_skipped_in_bounded_memory() {
    let fx = Fixture::new(
        "views.jsonl",
        "    file: {path: INPUT, format: FORMAT, max_document_size: 1MiB}\n    on_error: skip",
        100,
        "200ms",
    );
    let docs = generate(1_000, 50);
    let mut text = json_lines(&docs[..500]);
    text.extend_from_slice(&huge_document(100 << 20));
    text.push(b'\n');
    text.extend_from_slice(&json_lines(&docs[500..]));
    std::fs::write(fx.input(), text).unwrap();

    // Following, the process stays alive after the document is skipped, so its peak
    // memory can be read.
    let mut child = fx
        .command()
        .arg("--follow")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let path = fx.path(".sluice/pipeline/views-db/dead-letters.jsonl");
    while fx.dead_letters(&path).is_empty() {
        assert!(child.try_wait().unwrap().is_none(), "sluice exited early");
        std::thread::sleep(Duration::from_millis(50));
    }
    let peak = peak_rss_kib(child.id());
    child.kill().unwrap();
    child.wait().unwrap();
    // Holding the document would take over 100 MiB on top of the process's own. A
    // bounded reader keeps the 1 MiB limit and a few 1 MiB reads above the process's
    // own: measured 36 MiB on a quiet machine but 68 MiB while the whole suite runs on
    // 2 cores (cause not yet found), so the bound sits below what holding the document
    // would take, not near the quiet figure.
    assert!(peak < 96 << 10, "peak RSS {peak} KiB");

    let letters = fx.dead_letters(&path);
    assert_eq!(letters.len(), 1);
    assert!(
        letters[0]["position"]
            .as_str()
            .unwrap()
            .contains("views.jsonl:501 ")
    );
    assert!(
        letters[0]["reason"]
            .as_str()
            .unwrap()
            .contains("max_document_size")
    );
    assert_success(&fx.run());
    assert_eq!(fx.table(), reduce_expected(&docs));
}
