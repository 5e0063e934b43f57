//! Fail points: named places at every commit boundary where a test can crash the whole
//! process or make the operation fail, to prove that recovery is exact.
//!
//! ```text
//!  reader     queue step ─▶ [txn::after-queue] · dead letters [deadletter::write] (delay only)
//!  committer  intent ─▶ [txn::after-intent] ─▶ Ack + Loads ─▶ [txn::after-loads] ─▶ Prepared
//!             ─▶ [txn::after-prepared] ─▶ Stores … [txn::mid-store] … ─▶ Commit ─▶ DriverCommitted
//!             ─▶ [txn::after-driver-committed] ─▶ log commit (fsync: [recovery::fsync])
//!             ─▶ [txn::after-log-commit] ─▶ Acknowledge
//!  recovery   Open ─▶ Opened ─▶ [recovery::after-open] ─▶ seek sources
//!  driver     [driver::store] Store · [driver::before-commit] commit [driver::after-commit]
//!             · [driver::acknowledge] acknowledge (the idempotent apply of that pattern)
//! ```
//!
//! The points are the `fail` crate's, compiled in only with the `failpoints` cargo
//! feature (the `fail_point!` macro expands to nothing otherwise, so release builds
//! carry none). A process built with it reads `FAILPOINTS` at start
//! ([`setup`]), in the `fail` crate's syntax: `name=actions;name=actions`, e.g.
//! `txn::after-prepared=2*off->panic` crashes at the third transaction to reach
//! Prepared, `recovery::fsync=1*return` fails one recovery-log fsync with ENOSPC.
//!
//! - `panic` **aborts the process** (a hook turns a fail point's panic into
//!   `std::process::abort`, no unwinding, no destructors): what a crash or `kill -9`
//!   leaves behind.
//! - `return` makes the operation fail with an error naming the point: retryable at
//!   the protocol points (the runtime reopens with backoff, as after a lost
//!   connection), ENOSPC at `recovery::fsync` (not retryable: the run stops).
//! - `sleep(ms)` slows a boundary down (tests use it to keep a run alive long enough).
//!
//! [`POINTS`] lists every point that fails an operation, so the torture command can pick
//! one at random ([`DEAD_LETTER_WRITE`] only delays, so is not among them). The
//! runtime's `tests/loop.rs` fails the loop at each of them in-process, then restarts it.

use sluice_driver_sdk::Error as DriverError;

pub const AFTER_QUEUE: &str = "txn::after-queue";
pub const AFTER_INTENT: &str = "txn::after-intent";
pub const AFTER_LOADS: &str = "txn::after-loads";
pub const AFTER_PREPARED: &str = "txn::after-prepared";
pub const MID_STORE: &str = "txn::mid-store";
pub const AFTER_DRIVER_COMMITTED: &str = "txn::after-driver-committed";
pub const AFTER_LOG_COMMIT: &str = "txn::after-log-commit";
pub const RECOVERY_AFTER_OPEN: &str = "recovery::after-open";
pub const RECOVERY_FSYNC: &str = "recovery::fsync";
/// Before the dead-letter writer thread appends a transaction's records: `sleep(ms)`
/// holds a write in flight (its `return` is not supported).
pub const DEAD_LETTER_WRITE: &str = "deadletter::write";
/// Driver side (`sluice_driver_sdk::serve`, which cannot depend on this crate: same names).
pub const DRIVER_STORE: &str = "driver::store";
pub const DRIVER_BEFORE_COMMIT: &str = "driver::before-commit";
pub const DRIVER_AFTER_COMMIT: &str = "driver::after-commit";
pub const DRIVER_ACKNOWLEDGE: &str = "driver::acknowledge";

/// What `return` does at a point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnReturn {
    /// A retryable error: the runtime reopens the stream and recovers in-process.
    Retryable,
    /// An I/O error (ENOSPC) of the recovery log: the run stops with it.
    DiskFull,
}

/// Every fail point and what its `return` action does.
pub const POINTS: &[(&str, OnReturn)] = &[
    (AFTER_QUEUE, OnReturn::Retryable),
    (AFTER_INTENT, OnReturn::Retryable),
    (AFTER_LOADS, OnReturn::Retryable),
    (AFTER_PREPARED, OnReturn::Retryable),
    (MID_STORE, OnReturn::Retryable),
    (AFTER_DRIVER_COMMITTED, OnReturn::Retryable),
    (AFTER_LOG_COMMIT, OnReturn::Retryable),
    (RECOVERY_AFTER_OPEN, OnReturn::Retryable),
    (RECOVERY_FSYNC, OnReturn::DiskFull),
    (DRIVER_STORE, OnReturn::Retryable),
    (DRIVER_BEFORE_COMMIT, OnReturn::Retryable),
    (DRIVER_AFTER_COMMIT, OnReturn::Retryable),
    (DRIVER_ACKNOWLEDGE, OnReturn::Retryable),
];

/// The text every injected error and crash message contains, followed by the point's
/// name: how a test tells that a point fired.
pub const MARKER: &str = "injected by fail point";

/// The error a protocol point's `return` action injects: a transport failure, which
/// the runtime retries like a lost connection.
pub fn injected(point: &str) -> DriverError {
    DriverError::Transport(format!("{MARKER} {point}"))
}

/// The error `recovery::fsync`'s `return` action injects: the disk is full.
pub fn disk_full() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::StorageFull,
        format!("no space left on device ({MARKER} {RECOVERY_FSYNC})"),
    )
}

/// `fail_point!(NAME, wrap)`: the fail point named by this module's constant `NAME`.
/// Its `return` action makes the enclosing function return
/// `Err(wrap(injected(NAME)))` (`fail_point!(NAME => error)`: `Err(error)`;
/// `fail_point!(NAME)`: delays and crashes only); without the `failpoints` feature it is
/// nothing.
macro_rules! fail_point {
    ($point:ident) => {
        ::fail::fail_point!($crate::failpoint::$point)
    };
    ($point:ident => $err:expr) => {
        ::fail::fail_point!($crate::failpoint::$point, |_| Err($err))
    };
    ($point:ident, $wrap:expr) => {
        ::fail::fail_point!($crate::failpoint::$point, |_| {
            Err($wrap($crate::failpoint::injected(
                $crate::failpoint::$point,
            )))
        })
    };
}
pub(crate) use fail_point;

/// Configures the fail points named in `FAILPOINTS` and makes a fail point's `panic`
/// abort the process. Keep the returned scenario alive while the process runs.
///
/// # Panics
/// If `FAILPOINTS` is malformed (a test's mistake, reported at once).
#[cfg(feature = "failpoints")]
pub fn setup() -> fail::FailScenario<'static> {
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or_default();
        // The `fail` crate panics with "failpoint <name> panic".
        if let Some(point) = message
            .strip_prefix("failpoint ")
            .and_then(|m| m.strip_suffix(" panic"))
        {
            eprintln!("{MARKER} {point}: aborting the process");
            std::process::abort();
        }
        default_hook(info);
    }));
    fail::FailScenario::setup()
}
