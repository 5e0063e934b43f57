//! The closing table of a torture: the faults armed and fired per kind, the restarts,
//! the rows expected and found, and every anomaly by kind (a run whose outcome
//! contradicts its fault), which fails the torture whatever the final comparison says.

use super::model::Verdict;

/// What a torture did, for the closing table.
#[derive(Default)]
pub struct Report {
    pub scenario: String,
    /// Faults that fired (a fail point hit, a kill while running, a fenced zombie…).
    pub faults: u64,
    /// Process restarts after a fault, plus the runtime's own reopenings after
    /// retryable failures.
    pub restarts: u64,
    /// Per fault kind: (kind, armed, fired).
    pub kinds: Vec<(String, u64, u64)>,
    /// `sluice maintain` runs between runs (`--maintain-every`), each changing no row.
    pub maintained: u64,
    /// Each anomaly: its kind (what the summary line counts) and what happened.
    pub anomalies: Vec<(&'static str, String)>,
}

impl Report {
    pub fn armed(&mut self, kind: &str, fired: bool) {
        let at = match self.kinds.iter().position(|(k, ..)| k == kind) {
            Some(at) => at,
            None => {
                self.kinds.push((kind.to_string(), 0, 0));
                self.kinds.len() - 1
            }
        };
        self.kinds[at].1 += 1;
        self.kinds[at].2 += u64::from(fired);
        self.faults += u64::from(fired);
    }

    /// An outcome no fault explains (of a kind the scenario does not name).
    pub fn anomaly(&mut self, what: impl Into<String>) {
        self.anomaly_of("unexpected outcome", what);
    }

    /// An anomaly of `kind`, which the summary line counts by name.
    pub fn anomaly_of(&mut self, kind: &'static str, what: impl Into<String>) {
        let what = what.into();
        eprintln!("anomaly ({kind}): {what}");
        self.anomalies.push((kind, what));
    }

    /// The anomalies counted by kind: `2 anomalies (split failed: 1, zombie not
    /// fenced: 1)`.
    pub fn anomaly_counts(&self) -> String {
        let mut counts = std::collections::BTreeMap::new();
        for (kind, _) in &self.anomalies {
            *counts.entry(*kind).or_insert(0u64) += 1;
        }
        let named: Vec<String> = counts.iter().map(|(k, n)| format!("{k}: {n}")).collect();
        match named.is_empty() {
            true => "0 anomalies".to_string(),
            false => format!("{} anomalies ({})", self.anomalies.len(), named.join(", ")),
        }
    }

    pub fn print(&self, v: &Verdict) {
        if !self.kinds.is_empty() {
            println!("\n{:<34} {:>6} {:>6}", "fault", "armed", "fired");
            let mut kinds = self.kinds.clone();
            kinds.sort();
            for (kind, armed, fired) in kinds {
                println!("{kind:<34} {armed:>6} {fired:>6}");
            }
        }
        if self.maintained > 0 {
            println!("\nsluice maintain between runs: {}", self.maintained);
        }
        println!(
            "\n{:<38} {:>6} {:>8} {:>13} {:>10} {:>5} {:>10} {:>10} {:>9}",
            "scenario",
            "faults",
            "restarts",
            "rows expected",
            "rows found",
            "lost",
            "duplicated",
            "mismatched",
            "anomalies"
        );
        println!(
            "{:<38} {:>6} {:>8} {:>13} {:>10} {:>5} {:>10} {:>10} {:>9}",
            self.scenario,
            self.faults,
            self.restarts,
            v.rows_expected,
            v.rows_found,
            v.lost,
            v.duplicated,
            v.mismatched,
            self.anomalies.len()
        );
        if !self.anomalies.is_empty() {
            println!("{}", self.anomaly_counts());
        }
    }
}
