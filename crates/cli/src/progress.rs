//! The progress line of `sluice run` on a terminal: what the open transactions read,
//! the phase the committer is in, what is committed, and, for a run that ends (no
//! `--follow`) whose sources say how much input is left, a bar with an ETA.

use indicatif::{ProgressBar, ProgressStyle};
use sluice_runtime::txn::{Progress, Remaining};
use std::io::IsTerminal;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// How often the line is redrawn.
const TICK: Duration = Duration::from_millis(200);

/// Draws `progress` on stderr until the returned bar is finished; none when stderr is
/// not a terminal.
pub fn show(progress: Arc<Progress>, started: Instant, follow: bool) -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
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
    Some(bar)
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
            crate::pipeline_cmd::human_bytes(load(&progress.bytes)),
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
