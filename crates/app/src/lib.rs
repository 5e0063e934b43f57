//! What the `sluice` binary and its tools (`sluice-bench`, `sluice-torture`) share, so
//! that a tool runs pipelines exactly as `sluice run` does:
//!
//! - [`registry`]: every source and driver kind this build links, by its key in the
//!   pipeline file.
//! - [`logging`]: text or JSON log lines on stderr, redacted.
//! - [`sibling`]: the other binaries of the same build, found beside the running one
//!   (`sluice bench` runs `sluice-bench`, which runs `sluice`).

pub mod logging;
pub mod registry;
pub mod sibling;

pub use registry::registry;
