//! The status API, page and command during a followed run of a growing file into
//! SQLite: `/api/status` reports the shard running, its last committed transaction
//! (phases, source positions), its source and binding, and a growing history beside the
//! pipeline's graph, the version and the configuration; the page, driven in headless
//! Chromium, draws the graph, counters that update and charts on a time axis (its
//! screenshot is saved); `sluice status` reads the API while the run lasts and the
//! recovery log after; the log names the page, and the configuration served hides its
//! secrets. A failed run leaves its state and error for `sluice status`. Timings are
//! never compared.

use serde_json::{Value, json};
use sluice_http::client::Client;
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::common;

use common::{
    PATIENCE, SLUICE, free_address, generate, pipeline_yaml, sluice_status, user_ids_into_sqlite,
    wait_until,
};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// `sluice run --follow --metrics` of a file that a thread keeps appending to, so that
/// transactions keep committing; killed when dropped.
struct Run {
    child: Child,
    address: SocketAddr,
    pipeline: PathBuf,
    feeding: Arc<AtomicBool>,
    feeder: Option<JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Run {
    fn start() -> Run {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("views.jsonl");
        std::fs::write(&input, "").unwrap();
        let pipeline = dir.path().join("pipeline.yaml");
        let yaml = pipeline_yaml(
            "    file: {path: views.jsonl, format: json, follow: true}",
            "sqlite: {path: out/views.db}",
            false,
            100,
            "200ms",
        );
        std::fs::write(&pipeline, yaml).unwrap();
        let feeding = Arc::new(AtomicBool::new(true));
        let feeder = {
            let feeding = feeding.clone();
            std::thread::spawn(move || {
                let mut file = std::fs::OpenOptions::new()
                    .append(true)
                    .open(&input)
                    .unwrap();
                for seed in 0.. {
                    if !feeding.load(Ordering::Relaxed) {
                        break;
                    }
                    let lines: String = (generate(50, 200, seed).iter())
                        .map(|doc| format!("{doc}\n"))
                        .collect();
                    file.write_all(lines.as_bytes()).unwrap();
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        };
        let address = free_address();
        let child = Command::new(SLUICE)
            .arg("run")
            .arg("--follow")
            .arg("--metrics")
            .arg(address.to_string())
            .arg(&pipeline)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        Run {
            child,
            address,
            pipeline,
            feeding,
            feeder: Some(feeder),
            _dir: dir,
        }
    }

    /// `/api/status`, or `None` while nothing answers.
    fn status(&self) -> Option<Value> {
        let response = (Client::new(self.address, ""))
            .request("GET", "/api/status", &[], b"")
            .ok()?;
        assert_eq!(response.status, 200);
        assert_eq!(response.header("content-type"), Some("application/json"));
        Some(response.json())
    }

    /// The first status whose only shard satisfies `done`.
    fn wait_for(&mut self, what: &str, done: impl Fn(&Value) -> bool) -> Value {
        wait_until(what, PATIENCE, || {
            assert!(
                self.child.try_wait().unwrap().is_none(),
                "sluice run exited"
            );
            self.status().filter(|status| done(&status["shards"][0]))
        })
    }

    fn stop_feeding(&mut self) {
        self.feeding.store(false, Ordering::Relaxed);
        if let Some(feeder) = self.feeder.take() {
            feeder.join().unwrap();
        }
    }

    /// SIGTERM: the run commits what it read and exits well.
    fn terminate(&mut self) {
        self.stop_feeding();
        let killed = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        let mut stdout = String::new();
        let pipe = self.child.stdout.as_mut().unwrap();
        pipe.read_to_string(&mut stdout).unwrap();
        assert!(self.child.wait().unwrap().success(), "{stdout}");
    }

    /// `sluice status <pipeline> <args>`: its standard output.
    fn sluice_status(&self, args: &[&str]) -> String {
        sluice_status(&self.pipeline, args)
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        self.feeding.store(false, Ordering::Relaxed);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn transactions(shard: &Value) -> u64 {
    shard["transactions"].as_u64().unwrap_or(0)
}

fn last_txn(shard: &Value) -> u64 {
    shard["last_committed"]["txn"].as_u64().unwrap_or(0)
}

#[test]
fn the_api_reports_the_run_and_status_reads_the_log_after_it() {
    let mut run = Run::start();
    let first = run.wait_for("two committed transactions", |shard| {
        shard["state"] == "running" && transactions(shard) >= 2
    });
    assert_eq!(
        first["graph"],
        json!({
            "sources": [{"name": "views-file", "collection": "acme/pageviews"}],
            "collections": ["acme/pageviews"],
            "materializations": [{"name": "views-db", "collections": ["acme/pageviews"]}],
        })
    );
    let shard = &first["shards"][0];
    assert_eq!(shard["materialization"], "views-db");
    assert_eq!(shard["shard"], "00000000-ffffffff");
    assert_eq!(shard["last_error"], Value::Null);
    let source = &shard["sources"]["views-file"];
    assert_eq!(source["lag"]["unit"], "bytes");
    assert!(
        ["reading", "idle", "caught_up"].contains(&source["state"].as_str().unwrap()),
        "{source}"
    );
    assert!(source["documents"].as_u64().unwrap() > 0, "{source}");
    assert_eq!(source["retries"], 0);
    let binding = &shard["bindings"][0];
    assert_eq!(binding["resource"], "pageviews");
    assert_eq!(binding["collection"], "acme/pageviews");
    assert!(binding["stored"].as_u64().unwrap() > 0, "{binding}");
    assert_eq!(first["version"], env!("CARGO_PKG_VERSION"));
    assert!(first["uptime_ms"].is_u64(), "{first}");
    assert_eq!(
        first["config"]["sources"]["views-file"]["file"]["path"],
        "views.jsonl"
    );
    let last = &shard["last_committed"];
    let phases: Vec<&str> = (last["phases"].as_array().unwrap().iter())
        .map(|p| p["phase"].as_str().unwrap())
        .collect();
    assert_eq!(
        phases,
        ["read", "loads", "prepare", "store", "commit", "log_commit"]
    );
    assert!(last["sources"]["views-file"].is_object(), "{last}");
    assert!(last["documents"].as_u64().unwrap() > 0, "{last}");
    let history = shard["history"].as_array().unwrap();
    assert_eq!(history.last(), Some(last));

    let later = run.wait_for("a later transaction", |shard| {
        last_txn(shard) > last_txn(&first["shards"][0])
    });
    let later_shard = &later["shards"][0];
    assert!(later_shard["history"].as_array().unwrap().len() > history.len());
    assert!(transactions(later_shard) > transactions(shard));

    let live = run.sluice_status(&["--metrics", &run.address.to_string()]);
    assert!(
        live.contains("views-file → acme/pageviews → views-db"),
        "{live}"
    );
    assert!(
        live.contains("views-db 00000000-ffffffff: running"),
        "{live}"
    );
    assert!(live.contains("last committed: transaction "), "{live}");

    run.terminate();
    let offline = run.sluice_status(&[]);
    assert!(offline.contains("the recovery logs hold"), "{offline}");
    let committed: u64 = offline
        .split("last commit: transaction ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no last commit in {offline}"));
    assert!(committed >= last_txn(later_shard), "{offline}");
    assert!(offline.contains("source views-file: "), "{offline}");
}

/// A WebDriver session of headless Chromium, over chromedriver's HTTP; ended when dropped.
struct Browser {
    chromedriver: Child,
    client: Client,
    session: String,
}

impl Browser {
    fn start() -> Browser {
        for tool in [CHROMIUM, CHROMEDRIVER] {
            assert!(
                Path::new(tool).exists(),
                "{tool} is missing: run .ci/services, which installs chromium and chromium-driver"
            );
        }
        let address = free_address();
        let chromedriver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={}", address.port()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut client = Client::new(address, "");
        wait_until("chromedriver", PATIENCE, || {
            let ready = client.request("GET", "/status", &[], b"").ok()?;
            ready.json()["value"]["ready"]
                .as_bool()
                .filter(|ready| *ready)
        });
        let mut browser = Browser {
            chromedriver,
            client,
            session: String::new(),
        };
        let created = browser.command(
            "POST",
            "/session",
            json!({"capabilities": {"alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": CHROMIUM,
                    "args": ["--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                             "--window-size=1100,1300"],
                },
            }}}),
        );
        browser.session = created["sessionId"].as_str().unwrap().to_string();
        browser
    }

    /// A WebDriver command (a `null` body: none): its `value`.
    fn command(&mut self, method: &str, path: &str, body: Value) -> Value {
        let body = if body.is_null() {
            String::new()
        } else {
            body.to_string()
        };
        let headers = [("Content-Type", "application/json")];
        let response = (self.client)
            .request(method, path, &headers, body.as_bytes())
            .unwrap();
        let json = response.json();
        assert_eq!(response.status, 200, "{method} {path}: {json}");
        json["value"].clone()
    }

    fn session_command(&mut self, method: &str, path: &str, body: Value) -> Value {
        let path = format!("/session/{}{path}", self.session);
        self.command(method, &path, body)
    }

    fn open(&mut self, url: &str) {
        self.session_command("POST", "/url", json!({ "url": url }));
    }

    /// What `script` returns in the page.
    fn eval(&mut self, script: &str) -> Value {
        self.session_command(
            "POST",
            "/execute/sync",
            json!({"script": script, "args": []}),
        )
    }

    fn screenshot(&mut self, path: &Path) {
        let png = self.session_command("GET", "/screenshot", Value::Null);
        std::fs::write(path, decode_base64(png.as_str().unwrap())).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let path = format!("/session/{}", self.session);
            let _ = self.client.request("DELETE", &path, &[], b"");
        }
        let _ = self.chromedriver.kill();
        let _ = self.chromedriver.wait();
    }
}

/// Standard base64, padded (WebDriver's screenshots).
fn decode_base64(text: &str) -> Vec<u8> {
    let sextet = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {:?}", c as char),
    };
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    let (mut bits, mut held) = (0u32, 0);
    for c in text.bytes().filter(|c| *c != b'=') {
        bits = (bits << 6) | u32::from(sextet(c));
        held += 6;
        if held >= 8 {
            held -= 8;
            out.push((bits >> held) as u8);
            bits &= (1 << held) - 1;
        }
    }
    out
}

#[test]
fn the_page_draws_the_graph_and_live_counters_in_chromium() {
    let mut run = Run::start();
    run.wait_for("a committed transaction", |shard| transactions(shard) >= 1);
    let mut browser = Browser::start();
    browser.open(&format!("http://{}/", run.address));

    let nodes = wait_until("the graph's nodes", PATIENCE, || {
        let nodes = browser.eval(
            "return [...document.querySelectorAll('#graph .node')]\
               .map(n => n.dataset.kind + ' ' + n.dataset.name)",
        );
        Some(nodes).filter(|nodes| nodes.as_array().is_some_and(|n| !n.is_empty()))
    });
    assert_eq!(
        nodes,
        json!([
            "source views-file",
            "collection acme/pageviews",
            "materialization views-db"
        ])
    );
    let mut counter = || {
        let text = browser.eval(
            "const c = document.querySelector('[data-counter=transactions]');\
             return c && c.textContent",
        );
        text.as_str()
            .and_then(|text| text.replace(',', "").parse::<u64>().ok())
    };
    let first = wait_until("the transactions counter", PATIENCE, &mut counter);
    let second = wait_until("the counter to update", PATIENCE, || {
        counter().filter(|n| *n > first)
    });
    assert!(second > first);
    let bars = browser.eval("return document.querySelectorAll('.timeline rect').length");
    assert!(bars.as_u64().unwrap() > 0, "no transaction in the timeline");
    // Each small chart has its time axis: the last five minutes, a tick every minute.
    let axes = browser.eval(
        "return [...document.querySelectorAll('.spark')]\
           .map(s => [...s.querySelectorAll('.axis text')].map(t => t.textContent))",
    );
    let minutes = json!(["−5m", "−4m", "−3m", "−2m", "−1m", "now"]);
    assert_eq!(axes, json!([minutes, minutes]));
    let line = browser.eval("return document.querySelectorAll('.spark polyline').length");
    assert!(line.as_u64().unwrap() > 0, "no line on the time axis");
    let source = browser
        .eval("return document.querySelector('tr[data-source=\"views-file\"] .state').textContent");
    assert!(
        ["reading", "idle", "caught up"].contains(&source.as_str().unwrap()),
        "{source}"
    );
    let binding = browser.eval("return document.querySelectorAll('tr[data-binding]').length");
    assert_eq!(binding, 1);

    let screenshot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    browser.screenshot(&screenshot);
    assert!(std::fs::read(&screenshot).unwrap().starts_with(b"\x89PNG"));
    println!("status page screenshot: {}", screenshot.display());
}

/// The log names the status page beside `/metrics` at start; the status serves the
/// binary's version and the configuration with the HTTP source's token hidden.
#[test]
fn the_log_names_the_page_and_the_status_hides_the_configurations_secrets() {
    const TOKEN: &str = "s3cret-t0ken";
    let dir = tempfile::tempdir().unwrap();
    let pipeline = dir.path().join("pipeline.yaml");
    let sources = format!(
        "  views-http:
    target: acme/pageviews
    http: {{listen: \"127.0.0.1:0\", token: \"{TOKEN}\"}}"
    );
    std::fs::write(&pipeline, user_ids_into_sqlite(&sources)).unwrap();
    let address = free_address();
    let log = dir.path().join("sluice.log");
    let mut child = Command::new(SLUICE)
        .args(["run", "--follow", "--metrics", &address.to_string()])
        .arg(&pipeline)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut client = Client::new(address, "");
    let status = wait_until("the shard", PATIENCE, || {
        assert!(child.try_wait().unwrap().is_none(), "sluice run exited");
        let status = client.request("GET", "/api/status", &[], b"").ok()?.json();
        Some(status.clone()).filter(|_| status["shards"][0].is_object())
    });
    let _ = child.kill();
    let _ = child.wait();

    assert_eq!(status["version"], env!("CARGO_PKG_VERSION"));
    let config = &status["config"]["sources"]["views-http"]["http"];
    assert_eq!(config["token"], "***", "{config}");
    assert_eq!(config["listen"], "127.0.0.1:0", "{config}");
    assert!(!status.to_string().contains(TOKEN), "{status}");
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(
        log.contains(&format!(
            "metrics on http://{address}/metrics, status page on http://{address}/"
        )),
        "{log}"
    );
}

/// Every run leaves how it ended beside its recovery log: with no process to ask,
/// `sluice status` prints beside the checkpoints the state the shard and its source were
/// left in, and the error. A run that ends well says so; a later one that fails (its
/// file cut shorter than the position committed) replaces it.
#[test]
fn a_failed_run_leaves_its_state_and_error_for_sluice_status() {
    let dir = tempfile::tempdir().unwrap();
    let pipeline = dir.path().join("pipeline.yaml");
    let sources = "  views-file:
    target: acme/pageviews
    file: {path: views.jsonl, format: json}";
    std::fs::write(&pipeline, user_ids_into_sqlite(sources)).unwrap();
    let input = dir.path().join("views.jsonl");
    let run = || {
        Command::new(SLUICE)
            .arg("run")
            .arg(&pipeline)
            .output()
            .unwrap()
    };
    let status = || sluice_status(&pipeline, &[]);
    let ended = format!(
        "views-db 00000000-ffffffff: its last run (sluice {}) ended ",
        env!("CARGO_PKG_VERSION")
    );
    // What `status` printed of the last run's end.
    let end = |text: &str| {
        let end = text.split(&ended).nth(1);
        end.unwrap_or_else(|| panic!("no end in {text}"))
            .to_string()
    };

    std::fs::write(&input, "{\"user_id\": \"a\"}\n{\"user_id\": \"b\"}\n").unwrap();
    assert!(run().status.success());
    let stopped = status();
    assert!(stopped.contains("last commit: transaction 1"), "{stopped}");
    let last = end(&stopped);
    assert!(
        last.lines().next().unwrap().ends_with(" ago: stopped"),
        "{stopped}"
    );
    assert!(
        last.contains("committed by that run: 1 transactions, 2 documents"),
        "{stopped}"
    );
    assert!(last.contains("  last error: none"), "{stopped}");

    std::fs::write(&input, "").unwrap();
    assert!(
        !run().status.success(),
        "views.jsonl is shorter than committed"
    );
    let failed = status();
    let last = end(&failed);
    assert!(
        last.lines().next().unwrap().ends_with(" ago: failed"),
        "{failed}"
    );
    assert!(last.contains("  source views-file: failed"), "{failed}");
    let error = last
        .split("  last error (source, ")
        .nth(1)
        .unwrap_or_default();
    assert!(
        error.contains("source views-file: cannot resume at"),
        "{failed}"
    );
}
