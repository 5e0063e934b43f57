//! `sluice run` on a terminal shows what happens as it happens: a bounded run's line
//! has a bar of the input read, the committer's phase and what the open transactions
//! read, and it moves before the run ends. Run under `script`, which gives the process
//! a pseudo-terminal, as a user's shell would.

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
