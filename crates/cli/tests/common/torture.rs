//! What the torture tests share: `sluice torture` with small sizes, and the numbers of
//! its report's last line, checked exact.

use super::SLUICE;
use std::process::{Command, Output};

/// `sluice torture` with small sizes (3000 documents over 300 keys, 100 per
/// transaction, seed 11), unless `args` gives its own.
pub fn torture(args: &[&str]) -> Output {
    let defaults = [
        ("--docs", "3000"),
        ("--keys", "300"),
        ("--txn-docs", "100"),
        ("--seed", "11"),
    ];
    let mut command = Command::new(SLUICE);
    command.arg("torture");
    for (flag, value) in defaults {
        if !args.contains(&flag) {
            command.args([flag, value]);
        }
    }
    command
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run sluice torture")
}

/// The numbers of the report's last line: faults, restarts, rows expected, rows found,
/// lost, duplicated, mismatched, anomalies.
pub fn report(out: &Output) -> [u64; 8] {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "torture failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    let last = stdout.lines().last().unwrap_or_default();
    let numbers: Vec<u64> = last
        .split_whitespace()
        .skip(1)
        .map(|n| n.parse().expect("a number in the report"))
        .collect();
    numbers
        .try_into()
        .unwrap_or_else(|_| panic!("a report line: {last:?}\n{stdout}"))
}

/// Asserts an exact store after at least `faults` faults.
pub fn assert_exact_after(out: &Output, faults: u64) -> [u64; 8] {
    let r = report(out);
    let [
        fired,
        _,
        expected,
        found,
        lost,
        duplicated,
        mismatched,
        anomalies,
    ] = r;
    assert!(fired >= faults, "{fired} faults fired, wanted {faults}");
    assert_eq!((lost, duplicated, mismatched, anomalies), (0, 0, 0, 0));
    assert_eq!(found, expected);
    r
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Asserts that the report's table of fault kinds says each of `kinds` fired `times`.
pub fn assert_fired(out: &Output, kinds: &[&str], times: u64) {
    let report = stdout(out);
    for kind in kinds {
        let line = report.lines().find(|l| l.starts_with(kind));
        let fired = line.and_then(|l| l.split_whitespace().last());
        assert_eq!(
            fired,
            Some(times.to_string().as_str()),
            "{kind} fired {times} times:\n{report}"
        );
    }
}
