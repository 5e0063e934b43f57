//! What a source says about its connection while the runtime waits on one of its calls.
//!
//! The runtime sees most of a source's health itself: the steps it hands over (reading,
//! idle, caught up) and the error a call ends with. What it cannot see is a source that
//! retries inside one call: a client that backs off and dials again until its own
//! deadline (the Kafka client does, for 30 s, inside the first `queue`). Until that call
//! returns, the source would look fine. Such a source reports here instead:
//!
//! ```text
//!  connecting() ──dial──▶ failed, will try again: retrying(error) ──dial──▶ … ──▶ connected()
//!                                                   └── shown as "backing off", with the error
//! ```
//!
//! The runtime hands every source it runs a [`Health`] through
//! [`Opening::health`](crate::Opening::health) and shows the reports on its status page;
//! a source opened outside a pipeline gets [`Health::none`], which reports nowhere.
//! Reporting is cheap (a lock held for an assignment) and never waits.

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

/// Where the reports of a [`Health`] go (the runtime's status of one source).
pub trait Report: Send + Sync {
    fn report(&self, connection: Connection);
}

/// A source's handle to report its [`Connection`] (see the module docs).
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

    /// An attempt failed with `error`, and the source will try again by itself.
    pub fn retrying(&self, error: &dyn fmt::Display) {
        self.report(Connection::Retrying {
            error: error.to_string(),
        });
    }

    pub fn connected(&self) {
        self.report(Connection::Connected);
    }

    fn report(&self, connection: Connection) {
        if let Some(to) = &self.0 {
            to.report(connection);
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
