//! What an epoch sink declares about itself, before anything opens: the facts admission
//! decides on beside a driver's commit pattern ([`crate::Declared`]). Here rather than in
//! the sink SDK so that the runtime reads it knowing only this crate.

use serde::Serialize;
use std::fmt;

/// How far a sink's writes survive a crash.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Consistency {
    /// Lost or doubled on a crash.
    Ephemeral,
    /// Durable, but a replayed epoch may be written twice.
    AtLeastOnce,
    /// Staged per epoch and committed once the decision is durable: exactly once.
    CheckpointCommittable,
}

/// How many writers a sink's target takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// One writer (one shard) at a time.
    Singleton,
    /// Several shards may write at once.
    MultiWriter,
}

/// What the rows a sink takes mean.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum InputMode {
    /// Rows are appended; no `_op`.
    AppendOnly,
    /// A trailing `_op` column of `U` (upsert) or `D` (delete) per key.
    KeyedUpsert,
    /// Every change is kept, with its `_op`, as a log.
    FullChangelog,
}

/// A sink's declared contract. The default fails closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SinkContract {
    pub consistency: Consistency,
    pub placement: Placement,
    pub input: InputMode,
}

impl Default for SinkContract {
    fn default() -> Self {
        SinkContract {
            consistency: Consistency::Ephemeral,
            placement: Placement::Singleton,
            input: InputMode::AppendOnly,
        }
    }
}

impl fmt::Display for Consistency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Consistency::Ephemeral => "ephemeral",
            Consistency::AtLeastOnce => "durable at-least-once",
            Consistency::CheckpointCommittable => "checkpoint-committable",
        })
    }
}
