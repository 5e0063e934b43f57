//! What `sluice run` shows of its progress, from the runtime's one [`Progress`]:
//!
//! - on a terminal (stderr), a line redrawn every 200 ms: what the open transactions
//!   read, the phase the committer is in, what is committed, and, for a run that ends
//!   (no `--follow`) whose sources say how much input is left, a bar with an ETA;
//! - otherwise (a log file, a service manager), a log line every `--progress-interval`
//!   (10 s by default; `0s`: none) through `tracing`, so `--log-format json` makes it a
//!   JSON object: the phase, the documents committed, the rate over the interval, what
//!   the sources have left and, for a run that ends, an ETA.

use indicatif::{ProgressBar, ProgressStyle};
use sluice_runtime::txn::{Progress, Remaining};
use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How often the line is redrawn.
const TICK: Duration = Duration::from_millis(200);

/// What shows the progress of a run until [`Shown::finish`].
pub enum Shown {
    Bar(ProgressBar),
    Log(tokio::task::JoinHandle<()>),
    Nothing,
}

impl Shown {
    /// Clears the bar or stops the log lines (the task is awaited: no line follows).
    pub async fn finish(self) {
        match self {
            Shown::Bar(bar) => bar.finish_and_clear(),
            Shown::Log(task) => {
                task.abort();
                let _ = task.await;
            }
            Shown::Nothing => {}
        }
    }
}

/// Draws `progress` on stderr when it is a terminal, else logs it every `interval`
/// (none when zero).
pub fn show(progress: Arc<Progress>, started: Instant, follow: bool, interval: Duration) -> Shown {
    if std::io::stderr().is_terminal() {
        Shown::Bar(draw(progress, started, follow))
    } else if interval.is_zero() {
        Shown::Nothing
    } else {
        Shown::Log(tokio::spawn(log(progress, started, follow, interval)))
    }
}

fn draw(progress: Arc<Progress>, started: Instant, follow: bool) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_style(spinner());
    let ticker = bar.clone();
    tokio::spawn(async move {
        let mut with_bar = false;
        loop {
            let line = Line::of(&progress, started.elapsed(), follow);
            if let Some((done, total)) = line.bar {
                if !with_bar {
                    ticker.set_style(bar_style());
                    with_bar = true;
                }
                ticker.set_length(total);
                ticker.set_position(done);
            }
            ticker.set_message(line.message);
            ticker.tick();
            if ticker.is_finished() {
                return;
            }
            tokio::time::sleep(TICK).await;
        }
    });
    bar
}

/// Logs a [`Report`] every `interval`, each over the interval before it.
async fn log(progress: Arc<Progress>, started: Instant, follow: bool, interval: Duration) {
    let mut ticks = tokio::time::interval_at((started + interval).into(), interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = Counts {
        at: Duration::ZERO,
        docs: 0,
        read_bytes: 0,
    };
    loop {
        ticks.tick().await;
        let now = Counts::of(&progress, started.elapsed());
        let report = Report::of(&progress, &last, &now, follow);
        tracing::info!(
            target: "sluice::progress",
            phase = report.phase,
            committed_docs = report.committed,
            docs_per_s = report.docs_per_s,
            left = report.left.map(|(n, _)| n),
            left_unit = report.left.map(|(_, unit)| unit),
            eta_s = report.eta.map(|eta| eta.as_secs()),
            "{}",
            report.message(),
        );
        last = now;
    }
}

/// The counters a log line's rates are taken between.
#[derive(Debug, Clone, Copy)]
struct Counts {
    at: Duration,
    docs: u64,
    read_bytes: u64,
}

impl Counts {
    fn of(progress: &Progress, at: Duration) -> Counts {
        Counts {
            at,
            docs: progress.docs.load(Ordering::Relaxed),
            read_bytes: progress.read_bytes.load(Ordering::Relaxed),
        }
    }
}

/// One progress log line.
#[derive(Debug, PartialEq)]
struct Report {
    phase: &'static str,
    committed: u64,
    /// Documents committed per second over the interval.
    docs_per_s: u64,
    /// The input the sources have left, and its unit.
    left: Option<(u64, &'static str)>,
    /// When the input left would be done at the interval's rate (a run that ends).
    eta: Option<Duration>,
}

impl Report {
    fn of(progress: &Progress, last: &Counts, now: &Counts, follow: bool) -> Report {
        let secs = now.at.saturating_sub(last.at).as_secs_f64().max(1e-3);
        let per_s = |from: u64, to: u64| to.saturating_sub(from) as f64 / secs;
        let docs_per_s = per_s(last.docs, now.docs);
        // A count of messages drains at the documents' rate, bytes at the read's.
        let (left, rate) = match progress.remaining() {
            Some(Remaining::Messages(n)) => (Some((n, "documents")), docs_per_s),
            Some(Remaining::Bytes(n)) => {
                (Some((n, "bytes")), per_s(last.read_bytes, now.read_bytes))
            }
            None => (None, 0.0),
        };
        let eta = match left {
            Some((n, _)) if !follow && rate > 0.0 => Some(Duration::from_secs_f64(n as f64 / rate)),
            _ => None,
        };
        Report {
            phase: progress.phase().label(),
            committed: now.docs,
            docs_per_s: docs_per_s as u64,
            left,
            eta,
        }
    }

    /// e.g. "reading: 1 200 000 documents committed, 240 000 docs/s, 1 800 000
    /// documents left, ETA 8s".
    fn message(&self) -> String {
        let mut text = format!(
            "{}: {} documents committed, {} docs/s",
            self.phase,
            grouped(self.committed),
            grouped(self.docs_per_s),
        );
        match self.left {
            Some((n, "bytes")) => {
                text += &format!(", {} left", human_bytes(n));
            }
            Some((n, unit)) => text += &format!(", {} {unit} left", grouped(n)),
            None => {}
        }
        if let Some(eta) = self.eta {
            text += &format!(", ETA {}", indicatif::HumanDuration(eta));
        }
        text
    }
}

fn spinner() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} {msg}").expect("a valid template")
}

fn bar_style() -> ProgressStyle {
    ProgressStyle::with_template("{spinner} [{bar:24}] {percent:>3}% ETA {eta} · {msg}")
        .expect("a valid template")
        .progress_chars("=> ")
}

/// One drawing of the line.
#[derive(Debug, PartialEq)]
struct Line {
    message: String,
    /// Input read and read plus left, in the unit the sources count it in.
    bar: Option<(u64, u64)>,
}

impl Line {
    fn of(progress: &Progress, elapsed: Duration, follow: bool) -> Line {
        let load = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
        let (read_docs, read_bytes) = (load(&progress.read_docs), load(&progress.read_bytes));
        let committed = load(&progress.docs);
        let rate = committed as f64 / elapsed.as_secs_f64().max(1e-3);
        let message = format!(
            "{}: {} read · {} committed ({}) in {} transactions · {} docs/s",
            progress.phase().label(),
            grouped(read_docs),
            grouped(committed),
            human_bytes(load(&progress.bytes)),
            grouped(load(&progress.transactions)),
            grouped(rate as u64),
        );
        let bar = match (follow, progress.remaining()) {
            (false, Some(Remaining::Bytes(left))) => Some((read_bytes, read_bytes + left)),
            (false, Some(Remaining::Messages(left))) => Some((read_docs, read_docs + left)),
            _ => None,
        };
        Line { message, bar }
    }
}

/// `1234567` as `1 234 567`.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(' ');
        }
        out.push(digit);
    }
    out
}

/// A byte count for people: `1.5 MiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_runtime::txn::LivePhase;
    use sluice_source_sdk::Lag;

    #[test]
    fn the_line_shows_the_phase_what_is_read_and_what_is_committed() {
        let progress = Progress::default();
        progress.read_docs.store(1_500_000, Ordering::Relaxed);
        progress.docs.store(1_000_000, Ordering::Relaxed);
        progress.bytes.store(3 << 20, Ordering::Relaxed);
        progress.transactions.store(2, Ordering::Relaxed);
        let line = Line::of(&progress, Duration::from_secs(4), false);
        assert_eq!(
            line.message,
            "starting: 1 500 000 read · 1 000 000 committed (3.0 MiB) in 2 transactions \
             · 250 000 docs/s"
        );
        assert_eq!(line.bar, None, "no source said what is left");
    }

    #[test]
    fn a_run_that_ends_shows_a_bar_of_the_input_read_when_its_sources_say_what_is_left() {
        let progress = Progress::default();
        progress.enter(LivePhase::Loading);
        progress.read(10, 100);
        progress.behind(&[Some(Lag::Bytes(300))]);
        let line = Line::of(&progress, Duration::from_secs(1), false);
        assert!(
            line.message.starts_with("loading: 10 read"),
            "{}",
            line.message
        );
        assert_eq!(line.bar, Some((100, 400)));
        progress.behind(&[Some(Lag::Messages(30))]);
        assert_eq!(
            Line::of(&progress, Duration::ZERO, false).bar,
            Some((10, 40))
        );
        assert_eq!(
            Line::of(&progress, Duration::ZERO, true).bar,
            None,
            "--follow"
        );
    }

    #[test]
    fn a_log_line_has_the_rate_over_its_interval_what_is_left_and_an_eta() {
        let progress = Progress::default();
        progress.enter(LivePhase::Storing);
        progress.docs.store(1_200_000, Ordering::Relaxed);
        progress.behind(&[Some(Lag::Messages(1_800_000))]);
        let last = Counts {
            at: Duration::from_secs(10),
            docs: 800_000,
            read_bytes: 0,
        };
        let now = Counts::of(&progress, Duration::from_secs(20));
        let report = Report::of(&progress, &last, &now, false);
        assert_eq!(
            report,
            Report {
                phase: "storing",
                committed: 1_200_000,
                docs_per_s: 40_000,
                left: Some((1_800_000, "documents")),
                eta: Some(Duration::from_secs(45)),
            }
        );
        assert_eq!(
            report.message(),
            "storing: 1 200 000 documents committed, 40 000 docs/s, 1 800 000 documents \
             left, ETA 45 seconds"
        );
        assert_eq!(
            Report::of(&progress, &last, &now, true).eta,
            None,
            "--follow has no end"
        );
    }

    #[test]
    fn a_log_line_counts_bytes_left_at_the_read_rate_and_has_no_eta_while_nothing_moves() {
        let progress = Progress::default();
        progress.read(10, 4 << 20);
        progress.behind(&[Some(Lag::Bytes(8 << 20))]);
        let start = Counts {
            at: Duration::ZERO,
            docs: 0,
            read_bytes: 0,
        };
        let now = Counts::of(&progress, Duration::from_secs(2));
        let report = Report::of(&progress, &start, &now, false);
        assert_eq!(report.eta, Some(Duration::from_secs(4)));
        assert_eq!(
            report.message(),
            "starting: 0 documents committed, 0 docs/s, 8.0 MiB left, ETA 4 seconds"
        );
        let idle = Report::of(&progress, &now, &now, false);
        assert_eq!((idle.docs_per_s, idle.eta), (0, None));
        progress.behind(&[None]);
        assert_eq!(
            Report::of(&progress, &start, &now, false).message(),
            "starting: 0 documents committed, 0 docs/s"
        );
    }

    #[test]
    fn digits_are_grouped_by_three() {
        for (n, text) in [
            (0, "0"),
            (999, "999"),
            (1000, "1 000"),
            (123_456_789, "123 456 789"),
        ] {
            assert_eq!(grouped(n), text);
        }
    }
}
