//! The runtime: one transaction loop that moves documents from sources into drivers
//! exactly once.
//!
//! - [`config`]: the pipeline file (YAML), with errors that name their place.
//! - [`deadletter`]: the dead-letter files of sources with `on_error: skip`.
//! - [`failpoint`]: the fail points at every commit boundary (`failpoints` feature).
//! - [`source`]: the source model (commands, steps, resume positions) and the built-in
//!   sources (file, datagen).
//! - [`projections`]: collections, projections, field selection, materialization specs.
//! - [`pipeline`]: plan (Spec, Validate, fields), apply, and run every materialization.
//! - [`recovery`]: the recovery log: durable checkpoints and step intents, one writer.
//! - [`txn`]: the transaction loop.

pub mod config;
pub mod deadletter;
pub mod failpoint;
pub mod pipeline;
pub mod projections;
pub mod recovery;
pub mod source;
pub mod txn;
