//! What the server and the source share: accepted bodies waiting for a transaction, the
//! requests waiting for their answer, and the idempotency keys.
//!
//! ```text
//!  handler: accept ──▶ queue (seq order) ──take (whole bodies)──▶ step of the reader
//!             │          └ a keyed body is queueable once its key is durable (writer;
//!             │            at once when the keys travel in the positions: keys.rs)
//!             └──▶ waiting[seq] ◀── commit(txn, seq): answered 200 {txn, documents[, dead_lettered]}
//! ```
//!
//! Every accepted body gets the next sequence number. The queue hands out bodies in
//! that order and only from its front: a keyed body whose key is not yet durable holds
//! back those behind it (for the length of one group fsync), so a step always covers
//! the sequence numbers up to its position, which is what a commit answers.
//!
//! A request waits for the commit of its body's transaction and is answered then,
//! never earlier. When the source closes, a request whose body was not yet handed to a
//! transaction is answered 503 (not applied); one whose body was handed but not
//! committed 503 too, saying its outcome is unknown (a retry with its key is safe).

use crate::body::{Batch, Checked, frame, hash};
use crate::config::HttpConfig;
use crate::keys::{CARRIED_BUDGET, Command, KeyEntry, KeyPlace, KeyTable, Writer, now_ms};
use serde_json::json;
use sluice_source_sdk::{Intake, Position, QueueLimits, Queued, Records, Resume, Step};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use tokio::sync::{Notify, oneshot};

/// The answer a request waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// Its body is in the store: 200. `documents` were stored, `dead_lettered` went to
    /// the source's dead-letter file instead (`on_error: skip`).
    Committed {
        txn: u64,
        documents: u64,
        dead_lettered: u64,
    },
    /// Its body was not applied, and will not be: 503.
    NotApplied(String),
    /// Its body may have been applied: 503; only a retry with its key is safe.
    Unknown(String),
}

/// What [`Shared::accept`] or [`Shared::lookup`] decided for a request.
#[derive(Debug)]
pub enum Outcome {
    Answer(Answer),
    /// Accepted (or its key's first request was): wait for the commit.
    Wait(oneshot::Receiver<Answer>),
    /// The buffer is full: 429.
    Busy,
    /// The window holds as many keys as a cluster's shard log can carry: 429.
    KeysFull {
        keys: usize,
    },
}

pub struct Shared {
    /// The source's name: `POST /ingest/<name>`.
    pub name: String,
    pub config: HttpConfig,
    /// The check of a body's documents against the collection the source feeds.
    pub intake: Option<Intake>,
    /// Where the keys are kept.
    place: KeyPlace,
    state: Mutex<State>,
    /// Wakes the reader's [`Shared::ready`] when a body becomes queueable.
    ready: Notify,
}

struct State {
    next_seq: u64,
    /// Accepted bodies not yet handed to a step, by sequence number.
    queue: VecDeque<Accepted>,
    /// Their bytes.
    buffered: u64,
    /// The last sequence number handed to a step (or recovered).
    handed: u64,
    /// Requests waiting for their answer, by their body's sequence number.
    waiting: BTreeMap<u64, Waiting>,
    keys: KeyTable,
    writer: Option<Writer>,
    /// The runtime paused the source: refuse bodies (429) until it extends it.
    paused: bool,
    phase: Phase,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    Running,
    /// Closed (shutdown, or the source dropped): every request is answered 503.
    Closed(String),
    /// The keys writer failed: the source fails its next step.
    Failed(String),
}

struct Accepted {
    seq: u64,
    key: Option<String>,
    at: u64,
    batch: Batch,
    /// Its key is durable (or it has none): it may be handed to a step.
    durable: bool,
}

struct Waiting {
    /// Its documents that are stored, and those dead-lettered instead.
    docs: u64,
    dead_lettered: u64,
    key: Option<String>,
    /// In a step of a transaction not yet committed.
    handed: bool,
    waiters: Vec<oneshot::Sender<Answer>>,
}

/// A body replayed from the interrupted transaction at start: pending again.
pub struct Pending {
    pub seq: u64,
    pub key: String,
    pub docs: u64,
    pub dead_lettered: u64,
}

impl Shared {
    /// The state after recovery: sequence numbers go on after `handed`; `pending` are
    /// the keyed bodies of the replayed transaction; `keys` what the keys file holds.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: &str,
        config: &HttpConfig,
        intake: Option<Intake>,
        place: KeyPlace,
        handed: u64,
        pending: Vec<Pending>,
        keys: KeyTable,
        paused: bool,
    ) -> Arc<Shared> {
        let waiting = pending
            .into_iter()
            .map(|p| {
                let waiting = Waiting {
                    docs: p.docs,
                    dead_lettered: p.dead_lettered,
                    key: Some(p.key),
                    handed: true,
                    waiters: Vec::new(),
                };
                (p.seq, waiting)
            })
            .collect();
        Arc::new(Shared {
            name: name.to_string(),
            config: config.clone(),
            intake,
            place,
            state: Mutex::new(State {
                next_seq: handed + 1,
                queue: VecDeque::new(),
                buffered: 0,
                handed,
                waiting,
                keys,
                writer: None,
                paused,
                phase: Phase::Running,
            }),
            ready: Notify::new(),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands the keys file's writer over; it reports to [`Shared::durable`].
    pub fn set_writer(&self, writer: Writer) {
        self.state().writer = Some(writer);
    }

    /// What reports the writer's progress to `shared` (held weakly: the writer thread
    /// must not keep a dropped source alive).
    pub fn on_durable(shared: Weak<Shared>) -> crate::keys::OnDurable {
        Box::new(move |result| {
            if let Some(shared) = shared.upgrade() {
                shared.durable(result);
            }
        })
    }

    /// The writer made the keys of `seqs` durable (or failed).
    fn durable(&self, result: Result<Vec<u64>, String>) {
        let mut state = self.state();
        match result {
            Ok(seqs) => {
                for seq in seqs {
                    let at = state.queue.partition_point(|a| a.seq < seq);
                    if let Some(accepted) = state.queue.get_mut(at)
                        && accepted.seq == seq
                    {
                        accepted.durable = true;
                    }
                }
            }
            Err(e) => {
                if state.phase == Phase::Running {
                    state.phase =
                        Phase::Failed(format!("cannot write the idempotency keys file {e}"));
                }
            }
        }
        drop(state);
        self.ready.notify_one();
    }

    /// A request with `key`: the answer of its first request if that committed within
    /// the window, a wait for it if it is pending; `None` if the key is new.
    pub fn lookup(&self, key: &str) -> Option<Outcome> {
        let mut state = self.state();
        lookup(&mut state, key, now_ms())
    }

    /// Accepts a checked body (see the module docs).
    pub fn accept(&self, checked: Checked, key: Option<String>) -> Outcome {
        let Checked {
            batch,
            dead_lettered,
        } = checked;
        let now = now_ms();
        let mut state = self.state();
        if let Some(answer) = state.refusal() {
            return Outcome::Answer(answer);
        }
        if let Some(key) = &key
            && let Some(outcome) = lookup(&mut state, key, now)
        {
            // Another request with this key got in first.
            return outcome;
        }
        if state.paused || state.buffered + batch.bytes() > self.config.max_buffered_bytes {
            return Outcome::Busy;
        }
        if key.is_some()
            && self.place == KeyPlace::Positions
            && state.keys.carried_bytes() >= CARRIED_BUDGET
        {
            state.keys.expire(now);
            if state.keys.carried_bytes() >= CARRIED_BUDGET {
                return Outcome::KeysFull {
                    keys: state.keys.len(),
                };
            }
        }
        let seq = state.next_seq;
        state.next_seq += 1;
        let (tx, rx) = oneshot::channel();
        let docs = batch.len() as u64 - dead_lettered;
        state.waiting.insert(
            seq,
            Waiting {
                docs,
                dead_lettered,
                key: key.clone(),
                handed: false,
                waiters: vec![tx],
            },
        );
        state.buffered += batch.bytes();
        state.queue.push_back(Accepted {
            seq,
            key: key.clone(),
            at: now,
            batch,
            durable: key.is_none() || self.place == KeyPlace::Positions,
        });
        if let Some(key) = key {
            let entry = KeyEntry {
                key,
                seq,
                docs,
                dead_lettered,
                at: now,
                txn: None,
            };
            state.keys.insert(entry.clone());
            if self.place == KeyPlace::File {
                // Queueable once the writer made it durable ([`Shared::durable`]).
                let sent = state
                    .writer
                    .as_ref()
                    .is_some_and(|w| w.send(Command::Record(entry)));
                if !sent && state.phase == Phase::Running {
                    state.phase = Phase::Failed("the idempotency keys writer stopped".into());
                }
                return Outcome::Wait(rx);
            }
        }
        drop(state);
        self.ready.notify_one();
        Outcome::Wait(rx)
    }

    /// Hands whole queued bodies to a step, within `limits` (a body larger than them
    /// makes a step of its own); `Err` once the keys writer failed.
    pub fn take(&self, limits: QueueLimits, out: &mut Records) -> Result<Step, String> {
        let mut state = self.state();
        if let Phase::Failed(e) = &state.phase {
            return Err(e.clone());
        }
        let (mut data, mut records, mut bytes) = (Vec::new(), 0, 0);
        while let Some(front) = state.queue.front() {
            let (n, b) = (front.batch.len(), front.batch.bytes());
            if !front.durable
                || (records > 0
                    && (records + n > limits.max_records || bytes + b > limits.max_bytes))
            {
                break;
            }
            let accepted = state.queue.pop_front().expect("a front");
            state.buffered -= b;
            state.handed = accepted.seq;
            if let Some(waiting) = state.waiting.get_mut(&accepted.seq) {
                waiting.handed = true;
            }
            frame(
                &mut data,
                accepted.seq,
                accepted.key.as_deref(),
                accepted.at,
                &accepted.batch,
            );
            push_records(&self.name, accepted.seq, &accepted.batch, out);
            records += n;
            bytes += b;
        }
        Ok(Step {
            records,
            bytes,
            errors: Vec::new(),
            end_of_input: false,
            advances: false,
            unit_continues: false,
            resume: match self.place {
                KeyPlace::Positions if records > 0 => {
                    let carried = state.keys.carried(state.handed, now_ms());
                    resume(state.handed, Some(carried), data)
                }
                // An empty step is dropped: its position is never checkpointed.
                _ => resume(state.handed, None, data),
            },
        })
    }

    /// Whether a step would have something now (or the source failed or closed).
    fn has_news(&self) -> bool {
        let state = self.state();
        state.phase != Phase::Running || state.queue.front().is_some_and(|a| a.durable)
    }

    /// Returns once a body is queueable, or the source failed or closed.
    pub async fn ready(&self) {
        while !self.has_news() {
            // A notification sent since the check is kept as a permit: none is lost.
            self.ready.notified().await;
        }
    }

    pub fn queued(&self) -> Queued {
        let state = self.state();
        Queued {
            records: state.queue.iter().map(|a| a.batch.len()).sum(),
            bytes: state.buffered,
        }
    }

    pub fn set_paused(&self, paused: bool) {
        self.state().paused = paused;
    }

    /// Transaction `txn`, holding every body up to `seq`, is durable: answers their
    /// requests, after the keys file has its marker if any of them had a key.
    pub fn commit(&self, txn: u64, seq: u64) {
        let mut state = self.state();
        let rest = state.waiting.split_off(&(seq + 1));
        let done = std::mem::replace(&mut state.waiting, rest);
        if done.is_empty() {
            return;
        }
        state.keys.commit(txn, seq);
        state.keys.expire(now_ms());
        let keyed = done.values().any(|w| w.key.is_some());
        let answer = move || {
            for waiting in done.into_values() {
                let answer = Answer::Committed {
                    txn,
                    documents: waiting.docs,
                    dead_lettered: waiting.dead_lettered,
                };
                for waiter in waiting.waiters {
                    let _ = waiter.send(answer.clone());
                }
            }
        };
        match &state.writer {
            Some(writer) if keyed => {
                let then = Box::new(answer);
                if !writer.send(Command::Committed { txn, seq, then }) {
                    // The writer failed: the marker is lost, so a restart answers the
                    // keys with the recovered transaction; the commit itself stands.
                    tracing::warn!(
                        source = self.name,
                        txn,
                        "the idempotency keys writer stopped before a commit's marker"
                    );
                }
            }
            _ => answer(),
        }
    }

    /// Closes: every waiting request is answered 503, and later ones get a 503 too.
    /// Returns the keys writer, for the caller to join.
    pub fn close(&self, why: &str) -> Option<Writer> {
        let mut state = self.state();
        if state.phase == Phase::Running {
            state.phase = Phase::Closed(why.to_string());
        }
        for (_, waiting) in std::mem::take(&mut state.waiting) {
            let answer = if waiting.handed {
                Answer::Unknown(format!(
                    "{why} before this request's transaction was known to commit: its \
                     documents may or may not be stored; retry with the same \
                     Idempotency-Key (a retry without one may apply them twice)"
                ))
            } else {
                Answer::NotApplied(format!("{why}: this request was not applied; retry it"))
            };
            for waiter in waiting.waiters {
                let _ = waiter.send(answer.clone());
            }
        }
        state.queue.clear();
        state.buffered = 0;
        let writer = state.writer.take();
        drop(state);
        self.ready.notify_one();
        writer
    }

    /// Whether requests are taken (`GET /health`).
    pub fn running(&self) -> bool {
        self.state().phase == Phase::Running
    }
}

impl State {
    /// The answer of a request that arrives after the source closed or failed.
    fn refusal(&self) -> Option<Answer> {
        match &self.phase {
            Phase::Running => None,
            Phase::Closed(why) => Some(Answer::NotApplied(format!(
                "{why}: this request was not applied; retry it"
            ))),
            Phase::Failed(why) => Some(Answer::NotApplied(format!(
                "{why}: this request was not applied; retry it"
            ))),
        }
    }
}

fn lookup(state: &mut State, key: &str, now: u64) -> Option<Outcome> {
    let entry = state.keys.get(key, now)?;
    if let Some(txn) = entry.txn {
        return Some(Outcome::Answer(Answer::Committed {
            txn,
            documents: entry.docs,
            dead_lettered: entry.dead_lettered,
        }));
    }
    let seq = entry.seq;
    if let Some(answer) = state.refusal() {
        return Some(Outcome::Answer(answer));
    }
    let (tx, rx) = oneshot::channel();
    let (docs, dead_lettered) = (entry.docs, entry.dead_lettered);
    // Every pending key has its waiting entry (accepted here, or replayed at start).
    let waiting = state.waiting.entry(seq).or_insert_with(|| Waiting {
        docs,
        dead_lettered,
        key: Some(key.to_string()),
        handed: true,
        waiters: Vec::new(),
    });
    waiting.waiters.push(tx);
    Some(Outcome::Wait(rx))
}

/// The resume of a step ending at sequence number `last`, holding the framed `data`;
/// its position carries `keys` when they travel in the positions.
pub fn resume(last: u64, keys: Option<crate::keys::CarriedKeys>, data: Vec<u8>) -> Resume {
    let mut position = json!({ "seq": last });
    if let Some(keys) = keys {
        position["keys"] = serde_json::to_value(keys).expect("keys serialize");
    }
    Resume::Replay {
        position,
        hash: hash(&data),
        data: Some(data),
    }
}

/// Appends the documents of body `seq` to `out`, each at its position
/// (`http views request 12:3 (byte 40)`: its source, request, document and byte).
pub fn push_records(name: &str, seq: u64, batch: &Batch, out: &mut Records) {
    let origin: Arc<str> = format!("http {name} request {seq}").into();
    for (index, (offset, doc)) in batch.docs().enumerate() {
        let position = Position {
            source: origin.clone(),
            line: index as u64 + 1,
            byte_offset: offset,
            unit: sluice_source_sdk::Unit::Line,
        };
        out.push_json(doc, position, doc.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::time::Duration;

    fn shared(place: KeyPlace, keys: KeyTable) -> Arc<Shared> {
        let config: HttpConfig =
            serde_json::from_value(json!({"listen": "127.0.0.1:0", "token": "t"})).unwrap();
        Shared::new("views", &config, None, place, 0, Vec::new(), keys, false)
    }

    fn body() -> Checked {
        Checked {
            batch: Batch::parse(b"{\"n\": 1}").unwrap(),
            dead_lettered: 0,
        }
    }

    /// In a cluster the keys travel in the positions: a window holding what a shard's
    /// record can carry refuses a new keyed body (429), never drops a key early; a body
    /// without a key is still taken, and one process (a keys file) has no such bound.
    #[test]
    fn a_window_full_of_carried_keys_refuses_a_keyed_body() {
        let mut keys = KeyTable::new(Duration::from_secs(600));
        let now = now_ms();
        let mut seq = 0;
        while keys.carried_bytes() < CARRIED_BUDGET {
            seq += 1;
            keys.insert(KeyEntry {
                key: format!("{seq:036}"),
                seq,
                docs: 1,
                dead_lettered: 0,
                at: now,
                txn: Some(1),
            });
        }
        let cluster = shared(KeyPlace::Positions, keys.clone());
        match cluster.accept(body(), Some("new".into())) {
            Outcome::KeysFull { keys } => assert_eq!(keys, seq as usize),
            other => panic!("{other:?}"),
        }
        assert!(matches!(cluster.accept(body(), None), Outcome::Wait(_)));
        let one_process = shared(KeyPlace::File, keys);
        assert!(matches!(
            one_process.accept(body(), Some("new".into())),
            Outcome::Wait(_)
        ));
    }

    /// A step's position carries the keys of its bodies and earlier ones (never those of
    /// bodies still queued): what commits with it.
    #[test]
    fn a_position_carries_the_keys_of_the_bodies_up_to_it() {
        let cluster = shared(KeyPlace::Positions, KeyTable::new(Duration::from_secs(600)));
        let _first = cluster.accept(body(), Some("a".into()));
        let limits = QueueLimits {
            max_records: 1,
            max_bytes: 1 << 20,
            max_journaled: u64::MAX,
        };
        let mut out = Records::default();
        let step = cluster.take(limits, &mut out).unwrap();
        let _second = cluster.accept(body(), Some("b".into()));
        let position = step.resume.position().unwrap();
        assert_eq!(position["seq"], 1);
        let carried = position["keys"].as_object().unwrap();
        assert_eq!(carried.keys().collect::<Vec<_>>(), ["a"]);
        assert_eq!(carried["a"][0], 1, "its seq");
        assert_eq!(carried["a"][4], Value::Null, "not known to have committed");
        cluster.commit(3, 1);
        let step = cluster.take(limits, &mut out).unwrap();
        let position = step.resume.position().unwrap();
        assert_eq!(position["keys"]["a"][4], 3);
        assert_eq!(position["keys"]["b"][0], 2);
    }
}
