//! What a part of a pipeline (a source, an endpoint) reports of itself, after
//! Feldera's connector health, `memory()` and custom metrics: its [`HealthState`], the
//! memory it holds and its own [`Metric`]s. The bottom of the SDKs: the source SDK and
//! the driver SDK both re-export these types, so that the runtime reads one vocabulary
//! from every part, and neither SDK depends on the other.
//!
//! ```text
//!  source-sdk ──┐                       Source::memory / metrics, Health ──┐
//!               ├──▶ report (this crate)                                   ├──▶ runtime: metrics,
//!  driver-sdk ──┘                       Transactor::report → Report ───────┘    /api/status, page
//! ```
//!
//! Plain data only (serde, nothing else): what the runtime does with a report (the
//! health trackers, the Prometheus families) lives in the runtime.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A part's health, as served: `{"state": "healthy"}`,
/// `{"state": "unhealthy", "reason": …}`, `{"state": "fatal", "reason": …}`. Ordered
/// from well to worst.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum HealthState {
    #[default]
    Healthy,
    /// It cannot do its work now and is expected to recover: `reason` says why.
    Unhealthy { reason: String },
    /// It cannot go on: the run ends, or has ended, on `reason`.
    Fatal { reason: String },
}

impl HealthState {
    /// The metrics' encoding (`sluice_source_health`, `sluice_endpoint_health`):
    /// 0 healthy, 1 unhealthy, 2 fatal.
    pub fn code(&self) -> i64 {
        match self {
            HealthState::Healthy => 0,
            HealthState::Unhealthy { .. } => 1,
            HealthState::Fatal { .. } => 2,
        }
    }

    pub fn reason(&self) -> Option<&str> {
        match self {
            HealthState::Healthy => None,
            HealthState::Unhealthy { reason } | HealthState::Fatal { reason } => Some(reason),
        }
    }

    /// `healthy`, `unhealthy` or `fatal`.
    pub fn label(&self) -> &'static str {
        match self {
            HealthState::Healthy => "healthy",
            HealthState::Unhealthy { .. } => "unhealthy",
            HealthState::Fatal { .. } => "fatal",
        }
    }
}

impl fmt::Display for HealthState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.reason() {
            None => f.write_str(self.label()),
            Some(reason) => write!(f, "{}: {reason}", self.label()),
        }
    }
}

/// One of a part's own metrics (a source's `Source::metrics`, an endpoint's
/// [`Report::metrics`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Metric {
    /// Its name, snake_case, without a unit suffix the kind adds (`_total`):
    /// `partition_lag_messages`, `buffered_bytes`.
    pub name: &'static str,
    /// What it measures, shown on the status page.
    pub help: &'static str,
    pub kind: MetricKind,
    /// Labels beside the part's (`partition`), each key snake_case.
    pub labels: Vec<(&'static str, String)>,
    pub value: u64,
}

/// How a [`Metric`]'s value behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MetricKind {
    /// Goes up and down: a lag, a buffer's size.
    Gauge,
    /// Only grows, for the life of the part's instance: messages received, reconnects.
    Counter,
}

impl Metric {
    /// A gauge of `value`, without labels.
    pub fn gauge(name: &'static str, help: &'static str, value: u64) -> Metric {
        Metric {
            name,
            help,
            kind: MetricKind::Gauge,
            labels: Vec::new(),
            value,
        }
    }

    /// A counter at `value`, without labels.
    pub fn counter(name: &'static str, help: &'static str, value: u64) -> Metric {
        Metric {
            kind: MetricKind::Counter,
            ..Metric::gauge(name, help, value)
        }
    }

    /// With the label `key` = `value` too.
    pub fn label(mut self, key: &'static str, value: impl ToString) -> Metric {
        self.labels.push((key, value.to_string()));
        self
    }
}

/// What an endpoint (a driver's transactor) reports of itself, asked by the runtime
/// after each transaction it committed: the bytes of memory it holds (its staging,
/// an encode buffer), its own metrics, and its health if it has something to say.
/// The default says nothing: no memory, no metrics, health left to the runtime.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    /// Bytes of memory it holds, as far as it knows.
    pub memory: u64,
    /// Its own metrics; names and label keys snake_case and fixed in code, a label's
    /// values few.
    pub metrics: Vec<Metric>,
    /// `None`: it says nothing, and the health the runtime derives from its calls
    /// stands. `Some(Unhealthy | Fatal)` makes it that while it says so (the worse of
    /// what it says and what the runtime sees); a fatal endpoint is expected to fail
    /// its next call with an error that is not retryable, which ends the run.
    pub health: Option<HealthState>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_serializes_with_its_reason_and_encodes_as_a_number() {
        let unhealthy = HealthState::Unhealthy {
            reason: "refused".into(),
        };
        assert_eq!(
            serde_json::to_string(&unhealthy).unwrap(),
            r#"{"state":"unhealthy","reason":"refused"}"#
        );
        assert_eq!(unhealthy.to_string(), "unhealthy: refused");
        assert_eq!(HealthState::Healthy.code(), 0);
        assert_eq!(unhealthy.code(), 1);
    }

    #[test]
    fn a_metric_is_built_with_its_kind_and_labels() {
        let lag = Metric::gauge("lag_messages", "lag", 7).label("partition", 2);
        assert_eq!(lag.kind, MetricKind::Gauge);
        assert_eq!(lag.labels, [("partition", "2".to_string())]);
        assert_eq!(Metric::counter("sent", "sent", 1).kind, MetricKind::Counter);
        assert_eq!(Report::default().health, None, "the default says nothing");
    }
}
