//! The source over a connector's `read`: records become documents, each state message
//! ends a step whose position is the state, and a seek restarts the connector from it.
//!
//! ```text
//!  connector stdout ─▶ Reader (Fetch, in a Prefetch task) ─▶ Item::{Record, State, End}
//!                        parse a line; fold a STATE (P::absorb);          │
//!                        LOG/TRACE logged, estimates kept                 ▼
//!  queue ─▶ records up to the next State ─▶ Step { resume: Seek {"state": the state} }
//!           limits reached first ─▶ Step { resume: Barrier }  (no checkpoint inside)
//!           End (exit 0) ─▶ Step { end_of_input, resume: Seek {"state": the last one} }
//! ```
//!
//! At-least-once, and honestly so: a step's position is the connector's state after
//! its records, and `seek` hands that state back to a new `read`. What the connector
//! sent after its last committed state is sent again (or, for a connector whose
//! incremental cursor is not strictly increasing, differently): the steps are never
//! replayed. Records between two states are steps that end on a `Barrier`, so no
//! transaction ends between them and every committed position is a state.
//!
//! The connector starts on the first `queue` after the source opened or was sought
//! (`open` and `seek` start nothing), with the discover its catalog needs run once per
//! source instance. Dropping the prefetch (a seek, a disconnect, the source dropped)
//! aborts the reader task, whose [`Process`] kills the connector's process group.

use crate::launch::Launch;
use crate::process::Process;
use crate::protocol::{Message, Protocol};
use serde_json::{Value, json};
use sluice_source_sdk::{
    FaultTolerance, Fetch, Lag, Position, Prefetch, QueueLimits, Queued, ReadAhead, Records,
    Resume, Source, SourceError, Step, Unit,
};
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

/// What the reader hands the source, in the connector's order.
#[derive(Debug)]
enum Item {
    /// A document's JSON text.
    Record(Vec<u8>),
    /// A state message: the state to resume from after the records before it.
    State(Value),
    /// The connector exited successfully: its input is read.
    End,
}

/// The rows each stream said it will send (Airbyte's estimates).
type Estimates = Arc<Mutex<BTreeMap<String, u64>>>;

/// A source over an Airbyte connector or a Singer tap.
pub struct ConnectorSource<P: Protocol> {
    launch: Arc<Launch<P>>,
    /// Where records of this source say they come from (`airbyte users`).
    label: Arc<str>,
    /// `{"state": …}`: the state the current read started from, or the last one taken.
    position: Value,
    /// Paused until the runtime extends the source.
    read_ahead: ReadAhead<Item>,
    /// Items taken from the prefetch past a step's end.
    leftover: VecDeque<(Item, u64)>,
    ended: bool,
    estimates: Estimates,
    /// Records handed out since the current read started (their sequence numbers).
    read: u64,
}

impl<P: Protocol> ConnectorSource<P> {
    pub fn new(launch: Launch<P>) -> ConnectorSource<P> {
        let streams: Vec<&str> = launch
            .config
            .streams
            .iter()
            .map(|s| s.name.as_str())
            .collect();
        ConnectorSource {
            label: format!("{} {}", P::NAME, streams.join(",")).into(),
            launch: Arc::new(launch),
            position: json!({"state": null}),
            read_ahead: ReadAhead::new(true),
            leftover: VecDeque::new(),
            ended: false,
            estimates: Estimates::default(),
            read: 0,
        }
    }

    /// The running read, started (from the current position) if there is none.
    fn prefetch(&mut self) -> &Prefetch<Item> {
        if self.read_ahead.running().is_none() {
            let from = self.position["state"].clone();
            let reader = Reader::<P> {
                launch: self.launch.clone(),
                state: P::state_from(&from).expect("a position this source checked"),
                from,
                process: None,
                done: false,
                line: Vec::new(),
                selected: (self.launch.config.streams.iter())
                    .map(|s| s.name.clone())
                    .collect(),
                estimates: self.estimates.clone(),
                config_error: None,
            };
            self.read_ahead.start(reader);
        }
        self.read_ahead.running().expect("started above")
    }

    fn step(&self, records: usize, bytes: u64, end: Option<Boundary>) -> Step {
        let (resume, advances, end_of_input) = match end {
            None => (Resume::Barrier, false, false),
            Some(boundary) => (
                Resume::Seek {
                    position: self.position.clone(),
                },
                records == 0,
                boundary == Boundary::End,
            ),
        };
        Step {
            records,
            bytes,
            errors: Vec::new(),
            end_of_input,
            advances,
            unit_continues: false,
            resume,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Boundary {
    State,
    End,
}

#[async_trait::async_trait]
impl<P: Protocol> Source for ConnectorSource<P> {
    fn name(&self) -> &str {
        &self.launch.name
    }

    fn fault_tolerance(&self) -> FaultTolerance {
        FaultTolerance::AtLeastOnce
    }

    async fn probe(&mut self) -> Result<(), SourceError> {
        self.launch.check().await?;
        // The selected streams exist: a read would fail on the first queue otherwise.
        let offered = self.launch.offered().await?;
        P::configured(offered, &self.launch.config.streams)
            .map(|_| ())
            .map_err(|e| self.launch.config_error(&e))
    }

    async fn seek(&mut self, position: &Value) -> Result<(), SourceError> {
        let bad = |reason: String| SourceError::BadResume {
            name: self.launch.name.clone(),
            action: "seek",
            resume: position.clone(),
            reason,
        };
        let state = position
            .get("state")
            .ok_or_else(|| bad("not a connector state position ({\"state\": …})".into()))?;
        P::state_from(state).map_err(bad)?;
        self.position = json!({ "state": state });
        self.read_ahead.stop();
        self.leftover.clear();
        self.ended = false;
        self.read = 0;
        Ok(())
    }

    async fn replay(&mut self, step: &Resume, _: &mut Records) -> Result<Step, SourceError> {
        Err(SourceError::BadResume {
            name: self.launch.name.clone(),
            action: "replay",
            resume: serde_json::to_value(step).expect("a resume serializes"),
            reason: "a connector's steps cannot be replayed, only resumed from a state".into(),
        })
    }

    async fn queue(&mut self, limits: QueueLimits, out: &mut Records) -> Result<Step, SourceError> {
        if self.ended {
            return Ok(self.step(0, 0, Some(Boundary::End)));
        }
        if self.leftover.is_empty() {
            let taken = self.prefetch().take(limits)?;
            self.leftover.extend(taken.into_iter().map(|item| {
                let bytes = match &item {
                    Item::Record(text) => text.len() as u64,
                    _ => 0,
                };
                (item, bytes)
            }));
        }
        let (mut records, mut bytes) = (0, 0u64);
        while let Some((item, size)) = self.leftover.pop_front() {
            match item {
                Item::Record(text) => {
                    self.read += 1;
                    let at = Position::in_log(self.label.clone(), Unit::Sequence, self.read, 0);
                    out.push_json(&text, at, text.len());
                    records += 1;
                    bytes += size;
                    if records >= limits.max_records || bytes >= limits.max_bytes {
                        return Ok(self.step(records, bytes, None));
                    }
                }
                Item::State(state) => {
                    self.position = json!({ "state": state });
                    return Ok(self.step(records, bytes, Some(Boundary::State)));
                }
                Item::End => {
                    self.ended = true;
                    self.read_ahead.stop();
                    return Ok(self.step(records, bytes, Some(Boundary::End)));
                }
            }
        }
        Ok(self.step(records, bytes, None))
    }

    async fn ready(&mut self) {
        if self.ended || !self.leftover.is_empty() {
            return;
        }
        // Without a read, the next queue starts the connector: nothing to wait for.
        if let Some(prefetch) = self.read_ahead.running() {
            prefetch.ready().await;
        }
    }

    fn queued(&self) -> Queued {
        let mut queued = self.read_ahead.queued();
        queued.records += self.leftover.len();
        queued.bytes += self.leftover.iter().map(|(_, b)| b).sum::<u64>();
        queued
    }

    fn extend(&mut self) {
        self.read_ahead.extend();
    }

    fn pause(&mut self) {
        self.read_ahead.pause();
    }

    fn lag(&self) -> Option<Lag> {
        let estimates = self.estimates.lock().expect("the estimates");
        if estimates.is_empty() {
            return None;
        }
        let total: u64 = estimates.values().sum();
        Some(Lag::Messages(total.saturating_sub(self.read)))
    }

    async fn disconnect(&mut self) {
        self.read_ahead.stop();
    }
}

/// The prefetch's fetch: the connector's `read`, started on the first fetch.
struct Reader<P: Protocol> {
    launch: Arc<Launch<P>>,
    /// The state file the read starts from, and the state folded since.
    from: Value,
    state: P::State,
    process: Option<Process>,
    done: bool,
    line: Vec<u8>,
    selected: HashSet<String>,
    estimates: Estimates,
    /// An error the connector gave as its configuration's fault.
    config_error: Option<String>,
}

/// At most this many items a fetch: the prefetch's buffer then wakes the reader.
const FETCH_ITEMS: usize = 1024;

impl<P: Protocol> Reader<P> {
    /// What one line means; `None`: nothing to hand on.
    fn item(&mut self, process: &Process) -> Result<Option<Item>, SourceError> {
        let name = &self.launch.name;
        let message = match P::parse(&self.line) {
            Ok(message) => message,
            Err(_) => {
                let text = String::from_utf8_lossy(&self.line);
                tracing::debug!(source = %name, "connector output: {text}");
                return Ok(None);
            }
        };
        Ok(match message {
            Message::Record { stream, data } if self.selected.contains(&*stream) => {
                Some(Item::Record(data.get().as_bytes().to_vec()))
            }
            Message::Record { .. } => None,
            Message::State(message) => {
                let file = P::absorb(&mut self.state, message).map_err(|e| {
                    self.launch
                        .config_error(&format!("a bad STATE message: {e}"))
                })?;
                Some(Item::State(file))
            }
            Message::Log { error, message } => {
                if error {
                    tracing::warn!(source = %name, "connector: {message}");
                    process.said_error(&message);
                } else {
                    tracing::debug!(source = %name, "connector: {message}");
                }
                None
            }
            Message::Error { message, config } => {
                tracing::warn!(source = %name, "connector error: {message}");
                process.said_error(&message);
                if config {
                    self.config_error = Some(message);
                }
                None
            }
            Message::Estimate { stream, rows } => {
                self.estimates
                    .lock()
                    .expect("the estimates")
                    .insert(stream, rows);
                None
            }
            Message::Catalog(_) | Message::Status(_) | Message::Other => None,
        })
    }
}

#[async_trait::async_trait]
impl<P: Protocol> Fetch for Reader<P> {
    type Item = Item;

    async fn fetch(&mut self) -> Result<Vec<(Item, u64)>, SourceError> {
        if self.done {
            // Read to its end: the prefetch is dropped once End is taken.
            std::future::pending::<()>().await;
        }
        let mut process = match self.process.take() {
            Some(process) => process,
            None => {
                let process = self.launch.read(&self.from).await?;
                tracing::debug!(source = %self.launch.name, has_state = P::has_state(&self.state), "connector started");
                process
            }
        };
        let mut items = Vec::new();
        loop {
            if !process.next_line(&mut self.line).await? {
                if !items.is_empty() {
                    // The items first; the exit (and any error) at the next fetch.
                    self.process = Some(process);
                    return Ok(items);
                }
                self.done = true;
                return match (process.finish().await, self.config_error.take()) {
                    (Ok(()), _) => Ok(vec![(Item::End, 0)]),
                    (Err(_), Some(reason)) => Err(self.launch.config_error(&reason)),
                    (Err(e), None) => Err(e),
                };
            }
            if let Some(item) = self.item(&process)? {
                let bytes = match &item {
                    Item::Record(text) => text.len() as u64,
                    _ => 0,
                };
                items.push((item, bytes));
            }
            if !items.is_empty() && (items.len() >= FETCH_ITEMS || !process.line_buffered()) {
                self.process = Some(process);
                return Ok(items);
            }
        }
    }
}
