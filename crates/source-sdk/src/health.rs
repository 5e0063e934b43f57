//! A part's health: healthy, unhealthy with a reason, or fatal with a reason (after
//! Feldera's connector health and its `error(fatal)`), for every source and every
//! endpoint of a run.
//!
//! Health has two witnesses, and a part is as sick as the worse of them says:
//!
//! - **What the part says.** A source reports through its [`Health`] handle: its
//!   connection while a call of its is pending ([`Health::connecting`],
//!   [`Health::retrying`], [`Health::connected`]: a client that backs off and dials again
//!   inside one call, as the Kafka client does for 30 s inside its first `queue`, would
//!   otherwise look fine until that call returns), or its health outright
//!   ([`Health::unhealthy`], [`Health::healthy`], [`Health::fatal`]: a client that lost
//!   one of its brokers, a subscription the server cancelled).
//! - **What the runtime sees.** A call that failed with a retryable error makes the part
//!   unhealthy with that error until a call of it succeeds again; an error that ends
//!   the run makes it fatal.
//!
//! ```text
//!                 says unhealthy(r) / retrying(e) / a call fails, retryable
//!   healthy ─────────────────────────────────────────────────────────▶ unhealthy {reason}
//!      ▲  ◀──── says healthy() / connected(), and a call succeeds ────────┘   │
//!      │                                                                       │
//!      └── a new instance (the loop reopened)      says fatal(r) / an error ends the run
//!          forgets what the old one said                                       ▼
//!                                                                     fatal {reason}
//! ```
//!
//! Connection reports map onto health: `retrying(error)` is unhealthy with that error,
//! `connected()` healthy, and `connecting()` leaves the health as it was (dialling again
//! after a failure is still unhealthy). [`Tracker`] is this machine, pure: the runtime
//! keeps one per part and logs each change it returns.
//!
//! The runtime hands every source it runs a [`Health`] through
//! [`Opening::health`](crate::Opening::health) and shows the reports on its status page
//! and metrics; a source opened outside a pipeline gets [`Health::none`], which reports
//! nowhere. Reporting is cheap (a lock held for an assignment) and never waits.

pub use sluice_report::HealthState;
use std::fmt;
use std::sync::Arc;

/// A source's connection, as the source itself tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Connection {
    /// Dialling its system, nothing failed yet.
    Connecting,
    /// An attempt failed with `error`; the source tries again by itself.
    Retrying { error: String },
    /// Connected: what it reads is now told by its steps.
    Connected,
}

/// One part's health from its two witnesses (see the module docs); each event returns
/// the part's health if it changed, so that the caller logs every change once.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tracker {
    /// What the part said last (of this instance).
    said: HealthState,
    /// What the runtime saw of its last call.
    seen: HealthState,
}

impl Tracker {
    /// The worse of what the part said and what the runtime saw; of two equally bad,
    /// what the runtime saw (the error a call ended with names the failure).
    pub fn state(&self) -> &HealthState {
        if self.said.code() > self.seen.code() {
            &self.said
        } else {
            &self.seen
        }
    }

    /// The part said `state`.
    pub fn said(&mut self, state: HealthState) -> Option<HealthState> {
        self.change(|t| t.said = state)
    }

    /// The source told its connection: retrying is unhealthy, connected healthy,
    /// connecting leaves what was.
    pub fn connection(&mut self, connection: Connection) -> Option<HealthState> {
        match connection {
            Connection::Connecting => None,
            Connection::Retrying { error } => self.said(HealthState::Unhealthy { reason: error }),
            Connection::Connected => self.said(HealthState::Healthy),
        }
    }

    /// A call of the part succeeded (a source's step, an endpoint's commit). A fatal
    /// state stays: the run it ended is over.
    pub fn succeeded(&mut self) -> Option<HealthState> {
        self.change(|t| {
            if !matches!(t.seen, HealthState::Fatal { .. }) {
                t.seen = HealthState::Healthy;
            }
        })
    }

    /// A call of the part failed with `error`: unhealthy if the runtime tries again
    /// (`retried`), else fatal.
    pub fn failed(&mut self, error: String, retried: bool) -> Option<HealthState> {
        self.change(|t| {
            t.seen = match retried {
                true => HealthState::Unhealthy { reason: error },
                false => HealthState::Fatal { reason: error },
            }
        })
    }

    /// The part was opened anew (the loop reopened after a retryable failure): what
    /// the old instance said is forgotten; what the runtime saw stays until a call
    /// succeeds.
    pub fn reopened(&mut self) -> Option<HealthState> {
        self.change(|t| t.said = HealthState::Healthy)
    }

    fn change(&mut self, event: impl FnOnce(&mut Tracker)) -> Option<HealthState> {
        let before = self.state().clone();
        event(self);
        Some(self.state().clone()).filter(|now| *now != before)
    }
}

/// Where the reports of a [`Health`] go (the runtime's status of one source).
pub trait Report: Send + Sync {
    fn report(&self, connection: Connection);
    /// The source said its health outright. A report that keeps no health (a test's)
    /// may ignore it (the default).
    fn health(&self, state: HealthState) {
        let _ = state;
    }
}

/// A source's handle to report its [`Connection`] and its health (see the module docs).
#[derive(Clone)]
pub struct Health(Option<Arc<dyn Report>>);

impl Health {
    /// Reports to `to`.
    pub fn new(to: Arc<dyn Report>) -> Health {
        Health(Some(to))
    }

    /// Reports nowhere: a source opened outside a pipeline (tests, tools, admission).
    pub fn none() -> &'static Health {
        static NONE: Health = Health(None);
        &NONE
    }

    pub fn connecting(&self) {
        self.report(Connection::Connecting);
    }

    /// An attempt failed with `error`, and the source will try again by itself: it is
    /// unhealthy with that error until it connects.
    pub fn retrying(&self, error: &dyn fmt::Display) {
        self.report(Connection::Retrying {
            error: error.to_string(),
        });
    }

    /// Connected: healthy, as far as the source knows.
    pub fn connected(&self) {
        self.report(Connection::Connected);
    }

    /// Working again, as far as the source knows (after [`unhealthy`](Health::unhealthy)).
    pub fn healthy(&self) {
        self.health(HealthState::Healthy);
    }

    /// It cannot read now and expects to recover (a broker of several lost, a server
    /// refusing for a while): `reason` says why, until [`healthy`](Health::healthy).
    pub fn unhealthy(&self, reason: &dyn fmt::Display) {
        self.health(HealthState::Unhealthy {
            reason: reason.to_string(),
        });
    }

    /// It cannot go on: `reason` says why. The source then fails its next call with an
    /// error that is not retryable, which ends the run.
    pub fn fatal(&self, reason: &dyn fmt::Display) {
        self.health(HealthState::Fatal {
            reason: reason.to_string(),
        });
    }

    fn report(&self, connection: Connection) {
        if let Some(to) = &self.0 {
            to.report(connection);
        }
    }

    fn health(&self, state: HealthState) {
        if let Some(to) = &self.0 {
            to.health(state);
        }
    }
}

impl fmt::Debug for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Health"
        } else {
            "Health(none)"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Mutex;

    fn unhealthy(reason: &str) -> HealthState {
        HealthState::Unhealthy {
            reason: reason.into(),
        }
    }

    fn fatal(reason: &str) -> HealthState {
        HealthState::Fatal {
            reason: reason.into(),
        }
    }

    #[test]
    fn a_retrying_connection_is_unhealthy_until_it_connects() {
        let mut t = Tracker::default();
        assert_eq!(t.connection(Connection::Connecting), None);
        let refused = Connection::Retrying {
            error: "connection refused".into(),
        };
        assert_eq!(
            t.connection(refused.clone()),
            Some(unhealthy("connection refused"))
        );
        assert_eq!(t.connection(refused), None, "a change is told once");
        assert_eq!(
            t.connection(Connection::Connecting),
            None,
            "dialling again is still unhealthy"
        );
        assert_eq!(
            t.connection(Connection::Connected),
            Some(HealthState::Healthy)
        );
    }

    #[test]
    fn a_failed_call_is_unhealthy_until_the_next_success() {
        let mut t = Tracker::default();
        assert_eq!(t.succeeded(), None);
        assert_eq!(t.failed("reset".into(), true), Some(unhealthy("reset")));
        // The loop reopens: the new instance says nothing yet, the failure stays.
        assert_eq!(t.reopened(), None);
        assert_eq!(t.state(), &unhealthy("reset"));
        assert_eq!(t.succeeded(), Some(HealthState::Healthy));
    }

    #[test]
    fn what_the_part_says_and_what_the_runtime_sees_the_worse_wins() {
        let mut t = Tracker::default();
        assert_eq!(
            t.said(unhealthy("1 of 3 brokers down")),
            Some(unhealthy("1 of 3 brokers down"))
        );
        assert_eq!(t.succeeded(), None, "its steps succeed, yet it said so");
        assert_eq!(
            t.failed("timed out".into(), true),
            Some(unhealthy("timed out"))
        );
        assert_eq!(t.succeeded(), Some(unhealthy("1 of 3 brokers down")));
        assert_eq!(t.said(HealthState::Healthy), Some(HealthState::Healthy));
        // A new instance forgets what the old one said.
        t.said(unhealthy("lagging"));
        assert_eq!(t.reopened(), Some(HealthState::Healthy));
    }

    #[test]
    fn an_error_that_ends_the_run_is_fatal_and_stays() {
        let mut t = Tracker::default();
        assert_eq!(
            t.failed("changed input".into(), false),
            Some(fatal("changed input"))
        );
        assert_eq!(t.succeeded(), None);
        assert_eq!(t.said(HealthState::Healthy), None);
        assert_eq!(t.state(), &fatal("changed input"));

        let mut t = Tracker::default();
        assert_eq!(
            t.said(fatal("subscription cancelled")),
            Some(fatal("subscription cancelled"))
        );
        assert_eq!(t.succeeded(), None);
    }

    #[test]
    fn the_state_serializes_with_its_reason_and_encodes_as_a_number() {
        assert_eq!(
            serde_json::to_value(HealthState::Healthy).unwrap(),
            json!({"state": "healthy"})
        );
        assert_eq!(
            serde_json::to_value(unhealthy("refused")).unwrap(),
            json!({"state": "unhealthy", "reason": "refused"})
        );
        assert_eq!(
            serde_json::from_value::<HealthState>(json!({"state": "fatal", "reason": "gone"}))
                .unwrap(),
            fatal("gone")
        );
        let codes = [HealthState::Healthy, unhealthy("r"), fatal("r")].map(|s| s.code());
        assert_eq!(codes, [0, 1, 2]);
        assert_eq!(unhealthy("refused").to_string(), "unhealthy: refused");
    }

    #[test]
    fn the_handle_reports_connections_and_health_outright() {
        #[derive(Default)]
        struct Told(Mutex<Vec<String>>);
        impl Report for Told {
            fn report(&self, connection: Connection) {
                self.0.lock().unwrap().push(format!("{connection:?}"));
            }
            fn health(&self, state: HealthState) {
                self.0.lock().unwrap().push(state.to_string());
            }
        }
        let told = Arc::new(Told::default());
        let health = Health::new(told.clone());
        health.retrying(&"refused");
        health.unhealthy(&"lagging");
        health.healthy();
        health.fatal(&"gone");
        assert_eq!(
            *told.0.lock().unwrap(),
            [
                r#"Retrying { error: "refused" }"#,
                "unhealthy: lagging",
                "healthy",
                "fatal: gone"
            ]
        );
        Health::none().fatal(&"told nowhere");
    }
}
