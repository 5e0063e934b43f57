//! `sluice run` shows what happens as it happens. On a terminal, a bounded run's line
//! has a bar of the input read, the committer's phase and what the open transactions
//! read, and it moves before the run ends (run under `script`, which gives the process
//! a pseudo-terminal, as a user's shell would). Without one (pipes, as a log file or a
//! service manager gives), it logs a progress line every `--progress-interval`.

use crate::common;

use std::process::Command;

#[test]
fn a_bounded_run_on_a_terminal_shows_its_phase_reads_and_a_moving_bar() {
    let dir = tempfile::tempdir().unwrap();
    // Transactions of 20 000 documents: the run holds several, so the line is drawn
    // (every 200 ms) while work is open, not only at the end.
    let yaml = common::pipeline_yaml(
        "    datagen: {seed: 3, documents: 400000, keys: 5000, shape: pageviews}",
        "sqlite: {path: views.db}",
        false,
        20_000,
        "1m",
    );
    let pipeline = dir.path().join("pipeline.yaml");
    std::fs::write(&pipeline, yaml).unwrap();
    let command = format!(
        "{} run {}",
        env!("CARGO_BIN_EXE_sluice"),
        pipeline.display()
    );
    let out = Command::new("script")
        .args([
            "--quiet",
            "--flush",
            "--return",
            "--command",
            &command,
            "/dev/null",
        ])
        .env("COLUMNS", "200")
        .env("TERM", "xterm")
        .output()
        .expect("script(1) runs");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "sluice run failed: {text}");
    // Each redraw starts after a carriage return or an erase-line sequence.
    let frames: Vec<&str> = text
        .split(['\r', '\n'])
        .filter(|frame| frame.contains(" read · "))
        .collect();
    assert!(!frames.is_empty(), "no progress line: {text}");
    let percents: Vec<u32> = frames
        .iter()
        .filter_map(|frame| {
            let (before, _) = frame.split_once("% ETA")?;
            before.rsplit(' ').next()?.parse().ok()
        })
        .collect();
    assert!(
        percents.iter().any(|p| (1..100).contains(p)),
        "no bar part-way through: {percents:?} in {frames:#?}"
    );
    assert!(
        frames.iter().any(|frame| {
            ["reading:", "loading:", "storing:", "committing:"]
                .iter()
                .any(|phase| frame.contains(phase))
        }),
        "no phase named: {frames:#?}"
    );
    assert!(
        text.contains("400000 documents"),
        "the summary still ends the run: {text}"
    );
}

/// `sluice run` with its output to pipes, logging progress every second, of a datagen
/// run throttled to last about four seconds however fast the machine is; its stderr.
fn run_without_a_terminal(extra: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let yaml = common::pipeline_yaml(
        "    datagen: {seed: 3, documents: 8000, keys: 500, rate: 2000, shape: pageviews}",
        "sqlite: {path: views.db}",
        false,
        1_000,
        "200ms",
    );
    let pipeline = dir.path().join("pipeline.yaml");
    std::fs::write(&pipeline, yaml).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("run")
        .arg(&pipeline)
        .args(["--progress-interval", "1s"])
        .args(extra)
        .env_remove("RUST_LOG")
        .output()
        .expect("sluice runs");
    common::assert_success(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("8000 documents"),
        "the summary still ends the run: {stdout}"
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_run_without_a_terminal_logs_progress_lines_of_what_is_committed_and_the_rate() {
    let stderr = run_without_a_terminal(&[]);
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains(" documents committed, ") && line.contains(" docs/s"))
        .collect();
    assert!(lines.len() >= 2, "fewer than two progress lines: {stderr}");
    assert!(
        lines.iter().all(|line| line.contains("committed_docs=")),
        "the numbers as fields too: {lines:#?}"
    );
}

#[test]
fn a_run_without_a_terminal_logs_progress_as_json_lines_with_log_format_json() {
    let stderr = run_without_a_terminal(&["--log-format", "json"]);
    let reports: Vec<serde_json::Value> = stderr
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| line["target"] == "sluice::progress")
        .collect();
    assert!(
        reports.len() >= 2,
        "fewer than two progress lines: {stderr}"
    );
    for report in &reports {
        assert!(report["committed_docs"].is_u64(), "{report}");
        assert!(report["docs_per_s"].is_u64(), "{report}");
        assert!(report["phase"].is_string(), "{report}");
    }
}

/// A `--follow` run leaves the time it waits for input out of its summary's rate and
/// out of its transactions' read phase: a line appended after seconds of quiet is read
/// in a transaction whose read phase holds none of that wait, and the summary says how
/// much of the run was idle.
#[test]
fn a_follow_run_leaves_idle_time_out_of_its_rate_and_read_phase() {
    use sluice_http::client::Client;
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("views.jsonl");
    common::write_lines(&input, &common::generate(100, 10, 1));
    let yaml = common::pipeline_yaml(
        "    file: {path: views.jsonl, format: json}",
        "sqlite: {path: views.db}",
        false,
        1_000,
        "10m",
    )
    // Batches close early once caught up, and an empty one only after ten minutes:
    // every wait for input is inside a batch.
    .replace("min_duration: 10m", "min_duration: 10ms");
    let pipeline = dir.path().join("pipeline.yaml");
    std::fs::write(&pipeline, yaml).unwrap();
    let address = common::free_address();
    let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["run", "--follow", "--metrics", &address.to_string()])
        .arg(&pipeline)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let transactions = |at_least: u64| {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let status = (Client::new(address, ""))
                .request("GET", "/api/status", &[], b"")
                .ok()
                .map(|r| r.json());
            if let Some(status) = status
                && status["shards"][0]["transactions"].as_u64() >= Some(at_least)
            {
                return status;
            }
            assert!(Instant::now() < deadline, "no transaction {at_least}");
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    transactions(1);
    let quiet = Duration::from_secs(3);
    std::thread::sleep(quiet);
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&input)
        .unwrap();
    std::io::Write::write_all(&mut file, b"{\"user_id\": \"late\", \"views\": 1, \"bytes\": 1, \"last_seen\": \"2026-01-01T00:00:00Z\"}\n").unwrap();
    let status = transactions(2);
    let phases = &status["shards"][0]["last_committed"]["phases"];
    let read = (phases.as_array().unwrap().iter())
        .find(|p| p["phase"] == "read")
        .and_then(|p| p["ms"].as_f64())
        .unwrap_or_else(|| panic!("no read phase: {status}"));
    assert!(
        read < quiet.as_millis() as f64 / 2.0,
        "the read phase holds the wait for input: {read} ms"
    );
    common::signal(&child, "TERM");
    let out = child.wait_with_output().unwrap();
    common::assert_success(&out);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let idle: f64 = (stdout.split("s of it idle").next())
        .and_then(|before| before.rsplit(" (").next())
        .and_then(|secs| secs.parse().ok())
        .unwrap_or_else(|| panic!("the summary says nothing of idle time: {stdout}"));
    assert!(idle >= quiet.as_secs_f64() * 0.9, "{stdout}");
}
