//! The source's lag, read on a connection of its own: every [`LAG_EVERY`], `SHOW BINARY
//! LOGS`, and the bytes of binary log the server holds past the position the stream
//! has handed over ([`bytes_after`]), across log files.
//!
//! ```text
//!  Source::queue ─▶ Monitor::at(end) ─▶ shared position ◀── task: SHOW BINARY LOGS every 2 s ─▶ lag
//!  Source::lag ◀── lag (None until the first reading)
//! ```
//!
//! Thread: a tokio task of the source, aborted when the monitor is dropped (a
//! disconnect, a reopen); it never blocks the reader. A failed reading is logged (at
//! most once a minute) and tried again; the last lag read stays until then.

use crate::catalog::Catalog;
use crate::position::BinlogPos;
use mysql_async::Opts;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// How often the server's logs are read: often enough for a progress line, rare
/// enough that a `SHOW BINARY LOGS` (a directory listing) costs the server nothing.
pub const LAG_EVERY: Duration = Duration::from_secs(2);

/// The bytes of the binary log `logs` (name, size, in order) past `at`; none when the
/// server no longer lists `at`'s file.
pub fn bytes_after(logs: &[(String, u64)], at: &BinlogPos) -> Option<u64> {
    let here = logs.iter().position(|(file, _)| file == &at.file)?;
    let rest: u64 = logs[here + 1..].iter().map(|(_, size)| size).sum();
    Some(logs[here].1.saturating_sub(at.pos) + rest)
}

pub struct Monitor {
    at: Arc<Mutex<Option<BinlogPos>>>,
    /// The lag, plus one (0: not read yet).
    lag: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Monitor {
    pub fn spawn(name: String, opts: Opts, url: String) -> Monitor {
        let at = Arc::new(Mutex::new(None::<BinlogPos>));
        let lag = Arc::new(AtomicU64::new(0));
        let (shared_at, shared_lag) = (at.clone(), lag.clone());
        let task = tokio::spawn(async move {
            let mut catalog: Option<Catalog> = None;
            let mut warned: Option<Instant> = None;
            loop {
                tokio::time::sleep(LAG_EVERY).await;
                let position = shared_at.lock().expect("not poisoned").clone();
                let Some(position) = position else { continue };
                if catalog.is_none() {
                    catalog = Catalog::connect(&name, &opts, &url).await.ok();
                }
                let Some(conn) = catalog.as_mut() else {
                    continue;
                };
                match conn.binary_logs().await {
                    Ok(logs) => {
                        if let Some(bytes) = bytes_after(&logs, &position) {
                            shared_lag.store(bytes + 1, Ordering::Relaxed);
                        }
                    }
                    Err(e) => {
                        catalog = None;
                        if warned.is_none_or(|w| w.elapsed() > Duration::from_secs(60)) {
                            tracing::warn!(source = %name, error = %e, "cannot read the binary logs' sizes for the lag");
                            warned = Some(Instant::now());
                        }
                    }
                }
            }
        });
        Monitor { at, lag, task }
    }

    /// The stream has handed over everything up to `end`.
    pub fn at(&self, end: &BinlogPos) {
        *self.at.lock().expect("not poisoned") = Some(end.clone());
    }

    /// The bytes of binary log past the position, as last read.
    pub fn lag(&self) -> Option<u64> {
        self.lag.load(Ordering::Relaxed).checked_sub(1)
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lag_counts_the_rest_of_the_file_and_every_later_one() {
        let logs = [
            ("b.000001".to_string(), 1000),
            ("b.000002".to_string(), 500),
            ("b.000003".to_string(), 300),
        ];
        let at = |f: &str, p| BinlogPos::new(f, p);
        assert_eq!(bytes_after(&logs, &at("b.000003", 300)), Some(0));
        assert_eq!(bytes_after(&logs, &at("b.000003", 100)), Some(200));
        assert_eq!(
            bytes_after(&logs, &at("b.000001", 900)),
            Some(100 + 500 + 300)
        );
        assert_eq!(bytes_after(&logs, &at("b.000000", 4)), None);
    }
}
