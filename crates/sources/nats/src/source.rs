//! The NATS JetStream source: a stream read in order by stream sequence, exactly once.
//!
//! ```text
//!  seek/queue/replay ─▶ Connection::open (retention must be limits) ─▶ next sequence
//!  queue ─▶ Prefetch<Reading> (an ordered consumer from `next`) ─take─▶ Records + Step
//!  replay ─▶ a fresh ordered consumer from the step's `begin`, stopped at its `end`
//! ```
//!
//! A step's resume is the [`Span`] of stream sequences it read: `begin` is the sequence
//! of its first message (or, for an empty step, where it would have begun) and `end`
//! one past its last; `seek` restores `end` as the next sequence to read. Sequences
//! between messages of a step that the step did not emit (messages deleted before it
//! was read, or of subjects the filter leaves out) are not counted: a replay reads
//! from `begin` and stops at `end`, so it returns the same messages if the stream
//! still holds them. The step hash covers, per message, its sequence and the record as
//! emitted (with its metadata), or the raw payload of a message that was bad input.
//!
//! What cannot be read again is refused, never skipped: a `seek` to a sequence below
//! the stream's first (retention or a purge removed what lay in between), or beyond
//! one past its last (the stream was recreated), and a `replay` of a step whose first
//! message is gone, fail with [`SourceError::Unavailable`]. A message removed from
//! inside a step after it was read fails its replay with a hash mismatch. With a
//! subject filter this is conservative: removed messages of other subjects refuse a
//! seek too, as the stream does not say what they were.
//!
//! Metadata (`meta`, default `_meta`): each document is the message's JSON object with
//! `{"stream", "subject", "sequence", "timestamp", "headers"}` added as its first
//! property, spliced into the text after the opening `{` (the document is not parsed
//! here; the combiner parses it once). `timestamp` is the server's receive time in RFC
//! 3339; `headers` maps each header name to its values, names sorted, so the text (and
//! the hash) is the same on every read. A message that is not a JSON object cannot take
//! the metadata and is bad input at its position (`stream EVENTS sequence 17`); with
//! `meta: null` the payload is handed over as it is, and text that is not JSON is
//! reported at the same position by the reader.
//!
//! `end_of_input` says the source caught up with the stream as last seen: nothing is
//! buffered and the consumer had no messages pending (matching the filter) after the
//! last one delivered. The runtime ends a run there, or with `--follow` waits on
//! [`Source::ready`], which wakes when the next message arrives.

use crate::client::{Connection, Message};
use crate::config::{NatsConfig, Start};
use serde::Serialize;
use serde_json::Value;
use sluice_source_sdk::{
    FaultTolerance, InputError, Lag, Metric, Position, Prefetch, QueueLimits, Queued, Records,
    Resume, Source, SourceError, Span, Step, StepHasher, Unit, check_replay, replay_target,
};
use std::collections::BTreeMap;
use std::sync::Arc;

pub struct NatsSource {
    name: String,
    config: NatsConfig,
    /// Where records come from, as positions read: `stream EVENTS`.
    origin: Arc<str>,
    /// `"_meta":`, the metadata property's name as JSON text with its colon.
    meta_key: Option<Vec<u8>>,
    connection: Option<Connection>,
    /// The next stream sequence to read; `None` until `start` is resolved or a seek.
    next: Option<u64>,
    reader: Option<Reader>,
    /// The runtime's last word: Pause (true) or Extend. A reader starts unpaused, so
    /// a source is read ahead once positioned even before the first Extend.
    paused: bool,
}

/// The read-ahead from `next` on.
struct Reader {
    prefetch: Prefetch<Message>,
    /// Messages pending after the last one taken (at first: when the consumer was made).
    pending: u64,
}

/// What one step consumed so far.
struct Acc {
    records: usize,
    bytes: u64,
    errors: Vec<InputError>,
    hasher: StepHasher,
}

impl NatsSource {
    pub fn new(name: &str, config: &NatsConfig) -> NatsSource {
        NatsSource {
            name: name.to_string(),
            config: config.clone(),
            origin: format!("stream {}", config.stream).into(),
            meta_key: config.meta.as_ref().map(|key| {
                let mut text = serde_json::to_vec(key).expect("a string serializes");
                text.push(b':');
                text
            }),
            connection: None,
            next: None,
            reader: None,
            paused: false,
        }
    }

    async fn connection(&mut self) -> Result<&Connection, SourceError> {
        if self.connection.is_none() {
            self.connection = Some(Connection::open(&self.name, &self.config).await?);
        }
        Ok(self.connection.as_ref().expect("connected above"))
    }

    fn unavailable(&self, position: Value, reason: String) -> SourceError {
        SourceError::Unavailable {
            name: self.name.clone(),
            position,
            reason,
        }
    }

    /// The next sequence to read, resolving `start` on first use.
    async fn next(&mut self) -> Result<u64, SourceError> {
        if let Some(next) = self.next {
            return Ok(next);
        }
        let (start, subject) = (self.config.start, self.config.subject.clone());
        let connection = self.connection().await?;
        let next = connection.resolve(start, subject.as_deref()).await?;
        if let Start::Sequence(n) = start {
            let seq = connection.sequences().await?;
            if n < seq.first {
                return Err(self.unavailable(
                    Value::from(n),
                    format!(
                        "start: {n} is below the first sequence stream {} still holds \
                         ({}): retention or a purge removed {n}..{}; start from first",
                        self.config.stream, seq.first, seq.first
                    ),
                ));
            }
        }
        self.next = Some(next);
        Ok(next)
    }

    /// The reader from `next`, started if need be.
    async fn reader(&mut self) -> Result<&mut Reader, SourceError> {
        if self.reader.is_none() {
            let next = self.next().await?;
            let subject = self.config.subject.clone();
            let connection = self.connection().await?;
            let (reading, pending) = connection.read_from(next, subject.as_deref()).await?;
            self.reader = Some(Reader {
                prefetch: Prefetch::spawn(reading, self.paused),
                pending,
            });
        }
        Ok(self.reader.as_mut().expect("started above"))
    }

    /// Appends `message` to the step: its record, or its bad-input error.
    fn emit(&self, message: &Message, out: &mut Records, acc: &mut Acc) {
        let position = Position::in_log(self.origin.clone(), Unit::Sequence, message.sequence, 0);
        let payload = &message.payload[..];
        acc.hasher.append(&message.sequence.to_le_bytes());
        acc.bytes += payload.len() as u64;
        let Some(key) = &self.meta_key else {
            acc.hasher.append(payload);
            acc.records += 1;
            out.push_json(payload, position, payload.len());
            return;
        };
        let Some(body) = object_body(payload) else {
            acc.hasher.append(payload);
            let reason = format!(
                "the message is not a JSON object, so its metadata cannot be added under \
                 {}; publish objects, or set meta: null to read messages as they are",
                self.config.meta.as_deref().unwrap_or_default()
            );
            acc.errors.push(InputError::new(position, payload, reason));
            return;
        };
        let text = out.push_json_with(position, |buf| {
            buf.push(b'{');
            buf.extend_from_slice(key);
            self.write_meta(message, buf);
            if !body.trim_ascii_start().starts_with(b"}") {
                buf.push(b',');
            }
            buf.extend_from_slice(body);
        });
        acc.hasher.append(text);
        acc.records += 1;
    }

    fn write_meta(&self, message: &Message, buf: &mut Vec<u8>) {
        #[derive(Serialize)]
        struct Meta<'a> {
            stream: &'a str,
            subject: &'a str,
            sequence: u64,
            timestamp: String,
            headers: BTreeMap<&'a str, Vec<&'a str>>,
        }
        let headers = message
            .headers
            .iter()
            .flat_map(|h| h.iter())
            .map(|(name, values)| {
                (
                    name.as_ref(),
                    values.iter().map(|v| v.as_str()).collect::<Vec<_>>(),
                )
            });
        let meta = Meta {
            stream: &self.config.stream,
            subject: &message.subject,
            sequence: message.sequence,
            timestamp: message
                .published
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default(),
            headers: headers.collect(),
        };
        serde_json::to_writer(buf, &meta).expect("metadata serializes");
    }
}

/// The text after the opening `{` of a JSON object's text; `None` if it is not one.
fn object_body(text: &[u8]) -> Option<&[u8]> {
    text.trim_ascii_start().strip_prefix(b"{")
}

impl Acc {
    fn new() -> Acc {
        Acc {
            records: 0,
            bytes: 0,
            errors: Vec::new(),
            hasher: StepHasher::new(),
        }
    }

    fn into_step(self, span: Span<u64>, end_of_input: bool) -> Step {
        Step {
            records: self.records,
            bytes: self.bytes,
            errors: self.errors,
            end_of_input,
            advances: false,
            unit_continues: false,
            resume: span.replay(self.hasher.finish()),
        }
    }
}

#[async_trait::async_trait]
impl Source for NatsSource {
    fn name(&self) -> &str {
        &self.name
    }

    fn fault_tolerance(&self) -> FaultTolerance {
        FaultTolerance::ExactlyOnce
    }

    /// The server, and a stream this source can read (it exists, with limits retention).
    async fn probe(&mut self) -> Result<(), SourceError> {
        Connection::open(&self.name, &self.config).await.map(drop)
    }

    async fn seek(&mut self, position: &Value) -> Result<(), SourceError> {
        let span = Span::<u64>::from_value(&self.name, "seek to", position)?;
        self.reader = None;
        let seq = self.connection().await?.sequences().await?;
        let stream = &self.config.stream;
        let next = span.end;
        if next < seq.first {
            return Err(self.unavailable(
                position.clone(),
                format!(
                    "stream {stream} now begins at sequence {}, and this position is \
                     sequence {next}: retention or a purge removed sequences \
                     {next}..{} before they were read",
                    seq.first, seq.first
                ),
            ));
        }
        if next > seq.last + 1 {
            return Err(self.unavailable(
                position.clone(),
                format!(
                    "stream {stream} ends at sequence {}, before this position (sequence \
                     {next}): was it deleted and created again?",
                    seq.last
                ),
            ));
        }
        self.next = Some(next);
        Ok(())
    }

    async fn replay(&mut self, step: &Resume, out: &mut Records) -> Result<Step, SourceError> {
        let span = replay_target::<u64>(&self.name, step)?;
        self.reader = None;
        let first = out.len();
        let mut acc = Acc::new();
        if span.begin < span.end {
            let read = self.replay_range(span, step, out, &mut acc).await;
            if let Err(e) = read {
                out.truncate(first);
                return Err(e);
            }
        }
        let replayed = acc.into_step(span, false);
        if let Err(e) = check_replay(&self.name, step, replayed.resume.hash()) {
            out.truncate(first);
            return Err(e);
        }
        self.next = Some(span.end);
        Ok(replayed)
    }

    async fn queue(&mut self, limits: QueueLimits, out: &mut Records) -> Result<Step, SourceError> {
        let begin = self.next().await?;
        let reader = self.reader().await?;
        let taken = match reader.prefetch.take(limits) {
            Ok(taken) => taken,
            Err(e) => {
                // The fetch task stopped; a later queue starts a new one.
                self.reader = None;
                return Err(e);
            }
        };
        if let Some(last) = taken.last() {
            reader.pending = last.pending;
        }
        let end_of_input = reader.pending == 0 && reader.prefetch.queued().records == 0;
        let mut acc = Acc::new();
        for message in &taken {
            self.emit(message, out, &mut acc);
        }
        let span = match (taken.first(), taken.last()) {
            (Some(first), Some(last)) => Span {
                begin: first.sequence,
                end: last.sequence + 1,
            },
            _ => Span { begin, end: begin },
        };
        self.next = Some(span.end);
        Ok(acc.into_step(span, end_of_input))
    }

    async fn ready(&mut self) {
        // Without a reader, `queue` starts one (or says why it cannot): at once.
        if let Some(reader) = &self.reader {
            reader.prefetch.ready().await;
        }
    }

    fn queued(&self) -> Queued {
        self.reader
            .as_ref()
            .map_or_else(Queued::default, |r| r.prefetch.queued())
    }

    fn extend(&mut self) {
        self.paused = false;
        if let Some(reader) = &self.reader {
            reader.prefetch.extend();
        }
    }

    fn pause(&mut self) {
        self.paused = true;
        if let Some(reader) = &self.reader {
            reader.prefetch.pause();
        }
    }

    /// The messages after the last one taken, as the consumer counted them when it
    /// delivered that one.
    fn lag(&self) -> Option<Lag> {
        self.reader
            .as_ref()
            .map(|reader| Lag::Messages(reader.pending))
    }

    /// Its prefetch buffer: the messages delivered and not yet queued, and their slots.
    fn memory(&self) -> u64 {
        self.reader.as_ref().map_or(0, |r| r.prefetch.memory())
    }

    /// What the consumer has pending and what the prefetch holds.
    fn metrics(&self) -> Vec<Metric> {
        let Some(reader) = &self.reader else {
            return Vec::new();
        };
        vec![
            Metric::gauge(
                "nats_consumer_pending_messages",
                "Messages of the stream (matching the subject) the consumer has pending \
                 after the last one read into a transaction.",
                reader.pending,
            ),
            Metric::gauge(
                "nats_prefetched_messages",
                "Messages delivered ahead of the transaction and not yet read into it.",
                reader.prefetch.queued().records as u64,
            ),
        ]
    }

    async fn disconnect(&mut self) {
        self.reader = None;
        self.connection = None;
    }
}

impl NatsSource {
    /// Re-reads the messages of `span` (not empty) into `out` and `acc`: from its
    /// `begin`, which must still be held, up to its `end`.
    async fn replay_range(
        &mut self,
        span: Span<u64>,
        step: &Resume,
        out: &mut Records,
        acc: &mut Acc,
    ) -> Result<(), SourceError> {
        let position = step.position().cloned().unwrap_or_default();
        let subject = self.config.subject.clone();
        let stream = self.config.stream.clone();
        self.connection().await?;
        let connection = self.connection.as_ref().expect("connected above");
        let seq = connection.sequences().await?;
        let gone = |now: String| {
            format!(
                "the step read stream {stream} sequences {}..{} and {now}, so it cannot \
                 be replayed (retention or a purge removed it)",
                span.begin, span.end
            )
        };
        if span.begin < seq.first {
            let reason = gone(format!("the stream now begins at sequence {}", seq.first));
            return Err(self.unavailable(position, reason));
        }
        let (mut reading, pending) = connection.read_from(span.begin, subject.as_deref()).await?;
        let mut expected = Some(span.begin);
        let mut pending = pending;
        while pending > 0 {
            let message = reading.next().await?;
            if let Some(begin) = expected.take()
                && message.sequence != begin
            {
                let reason = gone(format!("its first message, {begin}, is gone"));
                return Err(self.unavailable(position, reason));
            }
            if message.sequence >= span.end {
                break;
            }
            self.emit(&message, out, acc);
            if message.sequence + 1 == span.end {
                break;
            }
            pending = message.pending;
        }
        if let Some(begin) = expected {
            let reason = gone(format!("its first message, {begin}, is gone"));
            return Err(self.unavailable(position, reason));
        }
        Ok(())
    }
}
