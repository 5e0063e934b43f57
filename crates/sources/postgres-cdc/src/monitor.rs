//! What the source watches beside its reading, on a task of its own with its own SQL
//! connection (so a slow query never holds up a step):
//!
//! ```text
//!  every RETAINED_EVERY: pg_current_wal_lsn() - restart_lsn of the slot ─▶ retained (Source::retained)
//!                        above retained_warning ─▶ a warning, at most once per WARN_EVERY
//!  every heartbeat:      SELECT pg_logical_emit_message(false, 'sluice-heartbeat', '')
//! ```
//!
//! **Retained WAL** is what the server keeps for the slot and may not remove: from the
//! slot's `restart_lsn` (the oldest WAL its decoding may still need; it follows the
//! confirmed position, at the running-transaction snapshots PostgreSQL logs about every
//! 15 s) to the end of the WAL. A pipeline that keeps up holds back a few segments; one
//! that stopped committing holds back everything written since, and that fills the
//! primary's disk.
//!
//! **The heartbeat** writes a non-transactional logical message (a WAL record of a few
//! dozen bytes, which pgoutput does not send without its `messages` option), so that
//! a server where nothing else writes still moves the WAL end the keepalives report.
//!
//! Failures here never stop the source (its reading fails on its own when the server
//! is gone): they are logged, and the connection is opened again at the next tick.

use crate::catalog::{Catalog, quote_literal};
use crate::wire::{Target, format_lsn};
use sluice_source_sdk::tls::rustls::ClientConfig;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How often the retained WAL is read: the status page's refresh is 1 s and a disk
/// fills in minutes at the least, so a few seconds is plenty and costs one small query.
const RETAINED_EVERY: Duration = Duration::from_secs(5);

/// The longest a warning about retained WAL (or a failing heartbeat) is repeated.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// `retained` before the first reading.
const UNKNOWN: u64 = u64::MAX;

/// What the monitor task needs.
pub struct Watch {
    pub name: String,
    /// Where to connect and how TLS is checked, and the URL without its password (for
    /// messages).
    pub target: Target,
    pub tls: Arc<ClientConfig>,
    pub redacted: String,
    pub slot: String,
    pub heartbeat: Option<Duration>,
    pub retained_warning: u64,
}

/// The running monitor; dropping it ends the task.
pub struct Monitor {
    task: tokio::task::JoinHandle<()>,
    retained: Arc<AtomicU64>,
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Monitor {
    pub fn spawn(watch: Watch) -> Monitor {
        let retained = Arc::new(AtomicU64::new(UNKNOWN));
        let task = tokio::spawn(run(watch, retained.clone()));
        Monitor { task, retained }
    }

    /// The WAL the slot holds back, as last read (none before the first reading, or
    /// while the slot does not exist).
    pub fn retained(&self) -> Option<u64> {
        Some(self.retained.load(Ordering::Relaxed)).filter(|&n| n != UNKNOWN)
    }
}

async fn run(watch: Watch, retained: Arc<AtomicU64>) {
    let mut catalog: Option<Catalog> = None;
    let mut next_retained = Instant::now();
    let mut next_heartbeat = watch.heartbeat.map(|every| Instant::now() + every);
    let (mut warned, mut heartbeat_warned): (Option<Instant>, Option<Instant>) = (None, None);
    let due = |last: Option<Instant>| last.is_none_or(|at| at.elapsed() >= WARN_EVERY);
    loop {
        let wake = next_heartbeat.map_or(next_retained, |h| h.min(next_retained));
        tokio::time::sleep_until(wake.into()).await;
        if catalog.is_none() {
            match Catalog::connect(&watch.name, &watch.target, &watch.tls, &watch.redacted).await {
                Ok(c) => catalog = Some(c),
                Err(e) => {
                    tracing::debug!(source = %watch.name, "cannot watch the slot: {e}");
                    next_retained = Instant::now() + RETAINED_EVERY;
                    continue;
                }
            }
        }
        let c = catalog.as_ref().expect("connected above");
        if next_heartbeat.is_some_and(|at| at <= Instant::now()) {
            let every = watch.heartbeat.expect("a heartbeat is set");
            next_heartbeat = Some(Instant::now() + every);
            let sql = "SELECT pg_logical_emit_message(false, 'sluice-heartbeat', '')";
            if let Err(e) = c.batch(sql).await {
                if due(heartbeat_warned) {
                    heartbeat_warned = Some(Instant::now());
                    tracing::warn!(
                        source = %watch.name,
                        "the heartbeat (pg_logical_emit_message) failed, retrying: {e}"
                    );
                }
                catalog = None;
                continue;
            }
        }
        if next_retained <= Instant::now() {
            next_retained = Instant::now() + RETAINED_EVERY;
            let bytes = match slot_retained(c, &watch.slot).await {
                Ok(bytes) => bytes,
                Err(e) => {
                    tracing::debug!(source = %watch.name, "cannot read the slot's retained WAL: {e}");
                    catalog = None;
                    continue;
                }
            };
            retained.store(bytes.map_or(UNKNOWN, |(n, _)| n), Ordering::Relaxed);
            if let Some((bytes, restart)) = bytes
                && bytes > watch.retained_warning
                && due(warned)
            {
                warned = Some(Instant::now());
                tracing::warn!(
                    source = %watch.name,
                    slot = %watch.slot,
                    retained = bytes,
                    "replication slot `{}` holds back {} of WAL (from its restart_lsn {}), \
                     above retained_warning ({}): the server cannot remove it until the \
                     pipeline commits past it. Is the pipeline stopped, failing or far \
                     behind? A slot no pipeline reads any more must be dropped \
                     (SELECT pg_drop_replication_slot('{}'))",
                    watch.slot,
                    human(bytes),
                    format_lsn(restart),
                    human(watch.retained_warning),
                    watch.slot,
                );
            }
        }
    }
}

/// `pg_current_wal_lsn() - restart_lsn` of `slot`, and its `restart_lsn`; none while
/// the slot does not exist.
async fn slot_retained(
    catalog: &Catalog,
    slot: &str,
) -> Result<Option<(u64, u64)>, sluice_source_sdk::SourceError> {
    let rows = catalog
        .rows(&format!(
            "SELECT greatest(pg_current_wal_lsn() - restart_lsn, 0)::bigint::text, \
             (restart_lsn - '0/0'::pg_lsn)::bigint::text FROM pg_replication_slots \
             WHERE slot_name = {} AND restart_lsn IS NOT NULL",
            quote_literal(slot)
        ))
        .await?;
    let number = |v: &Option<String>| v.as_deref().and_then(|t| t.parse::<u64>().ok());
    Ok(rows
        .first()
        .and_then(|r| Some((number(&r[0])?, number(&r[1])?))))
}

/// `1.5 GiB`, `12.0 MiB`, `512 B`.
fn human(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let (mut value, mut unit) = (bytes as f64 / 1024.0, 0);
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(16 << 20), "16.0 MiB");
        assert_eq!(human(3 << 29), "1.5 GiB");
    }
}
