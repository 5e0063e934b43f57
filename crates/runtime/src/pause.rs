//! Pause and resume: the operator's run-time hold on a process's sources, as Feldera's
//! pipeline states have it (`Running ⇄ Paused`, `Terminated` being the end of the run).
//!
//! ```text
//!  a source:     running ──pause──▶ paused ──resume──▶ running
//!  the pipeline: paused while every source is paused, else running
//!                (pause/resume without a source: every source at once)
//!
//!  POST /api/pause[?source=S] ─▶ Pauses::apply ─(watch)─▶ each reader of S, between steps:
//!     held:     Source::pause (stop reading ahead), queued no more, not waited on
//!     released: Source::extend (read ahead again), queued again
//! ```
//!
//! What a paused source keeps, and what holds while it is paused:
//! - Its connections: it is not disconnected or reopened, only no longer queued, and its
//!   read-ahead stops (the same `pause` the reader's backpressure sends; the reader
//!   extends it again only once neither holds it).
//! - Nothing new of it commits. The batch being read when the pause arrives closes and
//!   commits as usual (a transaction in flight finishes); after it, no step of the source
//!   enters a batch. A source whose last step was a barrier (at-least-once, no position
//!   to checkpoint there) or inside a unit (`Step::unit_continues`) is read on until a
//!   step it can be checkpointed at: the batch in hand could not close otherwise.
//! - It is still told of the commits of earlier steps (`Source::committed`: a slot
//!   confirms them, an HTTP client gets its answer), as the reader waits on durable
//!   commits whatever it queues.
//! - The loop does not look stuck: a reader with nothing to queue closes empty batches at
//!   `max_duration` as any idle follower does (the committer acknowledges; no driver
//!   call waits on input), and a source's calls are timed one by one, never across a
//!   pause, as a paused source gets none.
//!
//! The state is the process's: it is not kept in the recovery log, so a restarted
//! process runs every source. [`transition`] decides a request, pure; [`Pauses`] holds
//! the state, logs each change once, and tells the readers.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};
use tokio::sync::watch;

/// A source's state, or the pipeline's, as an operator sets it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RunState {
    #[default]
    Running,
    Paused,
}

impl RunState {
    pub fn of(paused: bool) -> RunState {
        match paused {
            true => RunState::Paused,
            false => RunState::Running,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            RunState::Running => "running",
            RunState::Paused => "paused",
        }
    }
}

impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What an operator asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    Pause,
    Resume,
}

impl Request {
    /// The state it leaves its sources in.
    fn target(self) -> RunState {
        match self {
            Request::Pause => RunState::Paused,
            Request::Resume => RunState::Running,
        }
    }
}

/// What a request applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope<'a> {
    /// Every source of the pipeline.
    Pipeline,
    Source(&'a str),
}

/// A request named a source the pipeline does not have (a user error: HTTP 404).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the pipeline has no source {name:?}; its sources are: {}", .known.join(", "))]
pub struct UnknownSource {
    pub name: String,
    pub known: Vec<String>,
}

/// The sources held (paused), each with when it was paused (Unix milliseconds).
pub type Held = BTreeMap<String, u64>;

/// A request's outcome: the sources held after it, and what it changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    pub held: Held,
    /// The sources whose state changed, in name order.
    pub changed: Vec<String>,
    /// The pipeline's state before and after.
    pub pipeline: (RunState, RunState),
}

/// The pipeline's state over `known` sources of which `held` are paused: paused while
/// every source is (a pipeline without sources runs).
pub fn pipeline_state(known: &[String], held: &Held) -> RunState {
    RunState::of(!known.is_empty() && known.iter().all(|name| held.contains_key(name)))
}

/// What `request` on `scope` does to the sources `held` of a pipeline whose sources are
/// `known`, at `now` (Unix milliseconds). Pausing a paused source or resuming a running
/// one changes nothing (and is no error).
pub fn transition(
    known: &[String],
    held: &Held,
    request: Request,
    scope: Scope<'_>,
    now: u64,
) -> Result<Transition, UnknownSource> {
    let targets: Vec<&String> = match scope {
        Scope::Pipeline => known.iter().collect(),
        Scope::Source(name) => match known.iter().find(|k| *k == name) {
            Some(known) => vec![known],
            None => {
                return Err(UnknownSource {
                    name: name.to_string(),
                    known: known.to_vec(),
                });
            }
        },
    };
    let mut after = held.clone();
    let mut changed = Vec::new();
    for name in targets {
        let was = RunState::of(held.contains_key(name));
        if was == request.target() {
            continue;
        }
        match request {
            Request::Pause => after.insert(name.clone(), now),
            Request::Resume => after.remove(name),
        };
        changed.push(name.clone());
    }
    Ok(Transition {
        pipeline: (pipeline_state(known, held), pipeline_state(known, &after)),
        held: after,
        changed,
    })
}

/// The answer to a request, and what `/api/status` shows of it: the pipeline's state
/// and each source's.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Answer {
    pub state: RunState,
    pub sources: BTreeMap<String, RunState>,
}

impl Answer {
    pub fn of(known: &[String], held: &Held) -> Answer {
        Answer {
            state: pipeline_state(known, held),
            sources: (known.iter())
                .map(|name| (name.clone(), RunState::of(held.contains_key(name))))
                .collect(),
        }
    }
}

/// The process's pause state, shared by the status server (which changes it) and every
/// reader (which follows it).
#[derive(Debug)]
pub struct Pauses {
    held: watch::Sender<Held>,
}

impl Default for Pauses {
    fn default() -> Self {
        Pauses {
            held: watch::Sender::new(Held::new()),
        }
    }
}

impl Pauses {
    /// Applies `request` on `scope` to the pipeline whose sources are `known`; `by` says
    /// who asked (logged). Each change is logged once, here; readers follow at their
    /// next step (or wake at once when waiting).
    pub fn apply(
        &self,
        known: &[String],
        request: Request,
        scope: Scope<'_>,
        by: &str,
    ) -> Result<Answer, UnknownSource> {
        let mut answer = None;
        let mut failed = None;
        self.held.send_if_modified(|held| {
            match transition(known, held, request, scope, unix_ms()) {
                Ok(t) => {
                    log(&t, request, scope, by);
                    let modified = !t.changed.is_empty();
                    *held = t.held;
                    answer = Some(Answer::of(known, held));
                    modified
                }
                Err(e) => {
                    failed = Some(e);
                    false
                }
            }
        });
        match (answer, failed) {
            (Some(answer), _) => Ok(answer),
            (None, Some(e)) => Err(e),
            (None, None) => unreachable!("the closure ran"),
        }
    }

    /// The sources held now.
    pub fn held(&self) -> Held {
        self.held.borrow().clone()
    }

    /// Follows the state: a reader's view of it.
    pub fn subscribe(&self) -> watch::Receiver<Held> {
        self.held.subscribe()
    }
}

/// Logs what a request changed, once: the pipeline's state when the request was the
/// pipeline's or changed it, else the source's.
fn log(t: &Transition, request: Request, scope: Scope<'_>, by: &str) {
    let (from, to) = t.pipeline;
    if t.changed.is_empty() {
        tracing::debug!(by, ?scope, "pause state unchanged: already {to}");
        return;
    }
    let sources = t.changed.join(", ");
    if from != to || scope == Scope::Pipeline {
        tracing::info!(by, %from, %to, sources, "pipeline {from} → {to}");
    } else {
        let to = request.target();
        let from = RunState::of(to == RunState::Running);
        tracing::info!(by, source = sources, %from, %to, "source {sources} {from} → {to}");
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn known() -> Vec<String> {
        vec!["a".to_string(), "b".to_string()]
    }

    /// Held before, the request and its scope, held after, changed, the pipeline's states.
    type Case<'a> = (
        &'a [&'a str],
        Request,
        Scope<'a>,
        &'a [&'a str],
        &'a [&'a str],
        (RunState, RunState),
    );

    fn held(names: &[&str]) -> Held {
        names.iter().map(|n| (n.to_string(), 7)).collect()
    }

    /// Each request on each state: the sources held after, what changed, and the
    /// pipeline's state before and after.
    #[test]
    fn requests_move_sources_and_the_pipeline_between_running_and_paused() {
        use Request::*;
        use RunState::*;
        let cases: &[Case<'_>] = &[
            (
                &[],
                Pause,
                Scope::Pipeline,
                &["a", "b"],
                &["a", "b"],
                (Running, Paused),
            ),
            (
                &[],
                Pause,
                Scope::Source("a"),
                &["a"],
                &["a"],
                (Running, Running),
            ),
            (
                &["a"],
                Pause,
                Scope::Source("b"),
                &["a", "b"],
                &["b"],
                (Running, Paused),
            ),
            (
                &["a"],
                Pause,
                Scope::Source("a"),
                &["a"],
                &[],
                (Running, Running),
            ),
            (
                &["a"],
                Pause,
                Scope::Pipeline,
                &["a", "b"],
                &["b"],
                (Running, Paused),
            ),
            (
                &["a", "b"],
                Resume,
                Scope::Source("a"),
                &["b"],
                &["a"],
                (Paused, Running),
            ),
            (
                &["a", "b"],
                Resume,
                Scope::Pipeline,
                &[],
                &["a", "b"],
                (Paused, Running),
            ),
            (&[], Resume, Scope::Pipeline, &[], &[], (Running, Running)),
            (
                &["b"],
                Resume,
                Scope::Source("a"),
                &["b"],
                &[],
                (Running, Running),
            ),
        ];
        for (before, request, scope, after, changed, pipeline) in cases {
            let t = transition(&known(), &held(before), *request, *scope, 7).unwrap();
            let case = format!("{before:?} {request:?} {scope:?}");
            assert_eq!(t.held, held(after), "{case}");
            assert_eq!(t.changed, *changed, "{case}");
            assert_eq!(t.pipeline, *pipeline, "{case}");
        }
    }

    #[test]
    fn an_unknown_source_is_refused_naming_the_known_ones() {
        let err = transition(
            &known(),
            &Held::new(),
            Request::Pause,
            Scope::Source("c"),
            0,
        )
        .unwrap_err();
        assert_eq!(
            err.to_string(),
            r#"the pipeline has no source "c"; its sources are: a, b"#
        );
        let pauses = Pauses::default();
        assert!(
            pauses
                .apply(&known(), Request::Pause, Scope::Source("c"), "test")
                .is_err()
        );
        assert!(pauses.held().is_empty());
    }

    #[test]
    fn readers_hear_of_changes_only() {
        let pauses = Pauses::default();
        let mut rx = pauses.subscribe();
        let answer = pauses.apply(&known(), Request::Pause, Scope::Source("a"), "test");
        assert_eq!(answer.unwrap().sources["a"], RunState::Paused);
        assert!(rx.has_changed().unwrap());
        rx.borrow_and_update();
        let answer = pauses.apply(&known(), Request::Pause, Scope::Source("a"), "test");
        assert_eq!(answer.unwrap().state, RunState::Running);
        assert!(!rx.has_changed().unwrap());
    }
}
