//! `sluice run` shows what happens as it happens. On a terminal, a bounded run's line
//! has a bar of the input read, the committer's phase and what the open transactions
//! read, and it moves before the run ends (run under `script`, which gives the process
//! a pseudo-terminal, as a user's shell would). Without one (pipes, as a log file or a
//! service manager gives), it logs a progress line every `--progress-interval`.

mod common;

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
