//! The runtime: one transaction loop that moves documents from sources into drivers
//! exactly once. It knows sources through `sluice-source-sdk` and drivers through
//! `sluice-driver-sdk`, and which kinds of each exist only through the [`registry`].
//!
//! - [`applied`]: the spec last applied to a materialization's store, beside its log.
//! - [`config`]: the pipeline file (YAML), with errors that name their place.
//! - [`deadletter`]: the dead-letter files of sources with `on_error: skip`.
//! - [`intake`]: the check of a document against its collection that sources are opened
//!   with, for those that refuse bad documents where they come in (HTTP).
//! - [`failpoint`]: the fail points at every commit boundary (`failpoints` feature).
//! - [`metrics`]: the Prometheus metrics, named in one place, and their endpoint.
//! - [`registry`]: the source and driver kinds the binary knows, by their keys in the
//!   pipeline file.
//! - [`projections`]: collections, projections, field selection, materialization specs.
//! - [`pipeline`]: starting a run, a stage per module: plan (Spec, Validate, fields),
//!   admit, apply, and launch every materialization's loop.
//! - [`recovery`]: the recovery log: durable checkpoints and step intents, one writer.
//! - [`txn`]: the transaction loop.
//! - [`types`]: the loop's shared types (shard, bindings, collections, endpoint, summary,
//!   run error), beneath every module that names them.

pub mod admission;
pub mod applied;
mod blocking;
pub mod config;
pub mod deadletter;
pub mod envelope;
pub mod failpoint;
pub mod intake;
pub mod metrics;
pub mod pause;
pub mod pipeline;
pub mod projections;
pub mod recovery;
pub mod registry;
pub mod txn;
pub mod types;
