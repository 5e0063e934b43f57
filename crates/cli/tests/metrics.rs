//! `sluice run --metrics`: the endpoint answers during a run, its counters agree with
//! the run's summary, every transaction is timed in every phase, and the names follow
//! Prometheus' conventions. Timings are never compared, only counted.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;

use common::{SLUICE, generate, pipeline_yaml, write_lines};

const DOCS: usize = 20_000;

/// A running `sluice run`, killed when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One sample of the exposition: `name{labels} value`.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// A scrape: the families' declared types, by name, and the samples.
struct Scrape {
    types: BTreeMap<String, String>,
    samples: Vec<Sample>,
}

impl Scrape {
    /// The sum of the samples named `name` whose labels include `with`.
    fn sum(&self, name: &str, with: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                with.iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(v))
            })
            .map(|s| s.value)
            .sum()
    }

    fn count(&self, name: &str) -> u64 {
        self.sum(name, &[]) as u64
    }

    /// A phase's number of observations.
    fn phase(&self, phase: &str) -> u64 {
        self.sum(
            "sluice_transaction_phase_seconds_count",
            &[("phase", phase)],
        ) as u64
    }
}

fn parse(text: &str) -> Scrape {
    let mut types = BTreeMap::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        if let Some(family) = line.strip_prefix("# TYPE ") {
            let (name, kind) = family.split_once(' ').expect("# TYPE name kind");
            types.insert(name.to_string(), kind.to_string());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("a sample has a value");
        let (name, labels) = match series.split_once('{') {
            Some((name, labels)) => (name, parse_labels(labels.trim_end_matches('}'))),
            None => (series, BTreeMap::new()),
        };
        samples.push(Sample {
            name: name.to_string(),
            labels,
            value: value
                .parse()
                .unwrap_or_else(|_| panic!("a number in {line:?}")),
        });
    }
    Scrape { types, samples }
}

/// `a="x",b="y"` (no escapes: our label values hold none).
fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while let Some((key, after)) = rest.split_once("=\"") {
        let (value, after) = after.split_once('"').expect("a closing quote");
        labels.insert(key.trim_start_matches(',').to_string(), value.to_string());
        rest = after;
    }
    labels
}

/// GET /metrics: the Content-Type and the body, or `None` while nothing answers.
fn get_metrics(address: SocketAddr) -> Option<(String, String)> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(1)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .ok()?;
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let header = |name: &str| {
        head.lines()
            .filter_map(|l| l.split_once(": "))
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.to_string())
    };
    assert_eq!(header("transfer-encoding"), None, "a body of known length");
    Some((header("content-type").unwrap_or_default(), body.to_string()))
}

/// The number before `word` in the summary line.
fn summary_number(summary: &str, word: &str) -> u64 {
    let words: Vec<&str> = summary.split_whitespace().collect();
    let at = words
        .iter()
        .position(|w| w.trim_end_matches(',') == word)
        .unwrap_or_else(|| panic!("no {word:?} in {summary:?}"));
    words[at - 1].parse().unwrap()
}

#[test]
fn a_scrape_during_a_run_agrees_with_its_summary() {
    let dir = tempfile::tempdir().unwrap();
    let docs = generate(DOCS, 1_500, 7);
    let input = dir.path().join("views.jsonl");
    write_lines(&input, &docs);
    let pipeline = pipeline_yaml(
        "    file: {path: views.jsonl, format: json}",
        "sqlite: {path: out/views.db}",
        false,
        1000,
        "10s",
    );
    std::fs::write(dir.path().join("pipeline.yaml"), pipeline).unwrap();
    let address = common::free_address();
    let child = Command::new(SLUICE)
        .arg("run")
        .arg("--follow")
        .arg("--metrics")
        .arg(address.to_string())
        .arg(dir.path().join("pipeline.yaml"))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut running = Running(child);

    // Scrape until everything read is committed, its log commit timed too.
    let deadline = Instant::now() + Duration::from_secs(120);
    let (content_type, last) = loop {
        assert!(
            running.0.try_wait().unwrap().is_none(),
            "sluice run exited while following"
        );
        assert!(Instant::now() < deadline, "the run did not catch up");
        if let Some((content_type, text)) = get_metrics(address) {
            let scrape = parse(&text);
            let transactions = scrape.count("sluice_transactions_committed_total");
            if scrape.count("sluice_source_documents_read_total") == DOCS as u64
                && scrape.phase("log_commit") == transactions
            {
                break (content_type, scrape);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // SIGTERM: the run stops and prints its summary.
    let status = Command::new("kill")
        .args(["-TERM", &running.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let mut stdout = String::new();
    running
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    assert!(running.0.wait().unwrap().success(), "{stdout}");
    let summary = stdout.lines().find(|l| l.starts_with("views-db:")).unwrap();

    assert_eq!(content_type, "text/plain; version=0.0.4; charset=utf-8");
    let transactions = summary_number(summary, "transactions");
    assert!(transactions >= 2, "{summary}");
    assert_eq!(
        last.count("sluice_transactions_committed_total"),
        transactions
    );
    let read = last.count("sluice_source_documents_read_total");
    assert_eq!(read, summary_number(summary, "documents"));
    assert_eq!(
        last.sum(
            "sluice_source_read_bytes_total",
            &[("source", "views-file")]
        ) as u64,
        std::fs::metadata(&input).unwrap().len()
    );
    let binding = [("binding", "pageviews")];
    assert_eq!(
        last.sum("sluice_binding_documents_combined_total", &binding) as u64,
        read
    );
    assert_eq!(
        last.sum("sluice_binding_documents_loaded_total", &binding) as u64,
        summary_number(summary, "loaded")
    );
    assert_eq!(
        last.sum("sluice_binding_documents_stored_total", &binding) as u64,
        summary_number(summary, "stored")
    );
    assert_eq!(last.count("sluice_binding_documents_deleted_total"), 0);
    assert_eq!(last.count("sluice_source_documents_dead_lettered_total"), 0);
    assert_eq!(last.count("sluice_source_lag_bytes"), 0, "read to the end");
    assert_eq!(last.count("sluice_errors_total"), 0);

    // Every committed transaction is timed in every phase it waits on.
    for phase in ["read", "loads", "prepare", "store", "commit", "log_commit"] {
        assert_eq!(last.phase(phase), transactions, "phase {phase}");
    }
    let acknowledged = last.phase("acknowledge");
    assert!(
        (1..=transactions + 1).contains(&acknowledged),
        "{acknowledged} acknowledgements timed of {transactions} transactions"
    );
    assert_eq!(
        last.count("sluice_end_to_end_latency_seconds_count"),
        transactions
    );

    // Prometheus' conventions, and the shard's labels on every series.
    for (name, kind) in &last.types {
        assert!(name.starts_with("sluice_"), "{name}");
        let unit_ok = match kind.as_str() {
            "counter" => name.ends_with("_total"),
            "histogram" => name.ends_with("_seconds"),
            // Health is a state (0 healthy, 1 unhealthy, 2 fatal), not a quantity.
            "gauge" => {
                name.ends_with("_bytes") || name.ends_with("_messages") || name.ends_with("_health")
            }
            other => panic!("{name}: unexpected type {other}"),
        };
        assert!(unit_ok, "{name} ({kind})");
    }
    for sample in &last.samples {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| sample.name.strip_suffix(suffix))
            .filter(|family| last.types.get(*family).map(String::as_str) == Some("histogram"))
            .unwrap_or(&sample.name);
        assert!(
            last.types.contains_key(family),
            "{} has no # TYPE",
            sample.name
        );
        assert_eq!(sample.labels["materialization"], "views-db", "{sample:?}");
        assert_eq!(sample.labels["shard"], "00000000-ffffffff", "{sample:?}");
    }
}
