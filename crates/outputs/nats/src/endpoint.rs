//! One binding's subject: every publish fenced by what it must follow, pipelined when
//! the stream holds the subject alone or this endpoint is its one writer (else one at a
//! time), acknowledgements awaited in order, and the tail read (with the gap check) at
//! open and again after any failure. See the crate docs for why this is exactly once,
//! and where it stops being so.
//!
//! ```text
//!  read tail ─▶ written = the subject's last message (stream sequence L, 0: none)
//!  first publish after it ─▶ stream info: Pacing
//!    Pipelined    the stream holds the subject alone
//!    OneAtATime   other subjects (or sourced streams) share it; a former holder may
//!                 still publish (Target::former_writers: the view is shared)
//!    SoleWriter   other subjects share it; the view is local (one writer)
//!  publish m, expecting (the fence):
//!    Pipelined, m first since the read  Nats-Expected-Last-Subject-Sequence: L
//!    Pipelined, after message p         Nats-Expected-Last-Msg-Id: p's Nats-Msg-Id
//!    OneAtATime (each ack awaited)      Nats-Expected-Last-Subject-Sequence: the last ack's
//!    SoleWriter                         the first as Pipelined's; the rest nothing
//!  refused ─▶ another writer appended: the push fails, the tail is read again before
//!    the next batch
//! ```

use crate::config::{Config, Resource};
use crate::server::{self, external};
use crate::stamp::{Stamp, msg_id, msg_id_of};
use async_nats::Subject;
use async_nats::jetstream::Context;
use async_nats::jetstream::context::{PublishAckFuture, PublishError, PublishErrorKind};
use async_nats::jetstream::message::{PublishMessage, StreamMessage};
use async_nats::jetstream::stream::Stream;
use async_trait::async_trait;
use bytes::Bytes;
use sluice_nats_client::Server;
use sluice_output_sdk::{
    BatchKind, Buffer, Generation, OutputEndpoint, OutputError, Result, Tail, Target,
};
use std::collections::VecDeque;

pub struct NatsEndpoint {
    server: Server,
    subject: Subject,
    /// The stream created (or given the subject) when no stream holds the subject.
    stream_name: String,
    materialization: String,
    generation: Generation,
    max_buffer_size_bytes: usize,
    max_in_flight: usize,
    /// A former holder may still publish (the view is shared): every publish is fenced.
    former_writers: bool,
    /// What errors name: `nats://127.0.0.1:4222 stream VIEWS subject views`.
    place: String,
    connection: Option<Connection>,
    /// The subject's last message, as far as this endpoint knows; trusted only while
    /// `tail_known`.
    written: Option<Written>,
    /// False before `open` and after any failure: the next batch reads the tail again.
    tail_known: bool,
    /// How publishes are paced and what the next one follows; read at the first publish
    /// after the tail was read (`None` until then), once every binding has opened and
    /// added its subject to the stream.
    pacing: Option<Pacing>,
    batch: Option<Batch>,
    /// Published, not yet acknowledged, in publish order.
    in_flight: VecDeque<InFlight>,
}

struct Connection {
    js: Context,
    stream: Stream,
}

/// A message the subject holds.
#[derive(Debug, Clone, Copy)]
struct Written {
    stamp: Stamp,
    sequence: u64,
    /// Of this endpoint's generation: only then is it the tail a replay discards up to.
    ours: bool,
}

impl Written {
    /// The tail of this generation's messages, if the subject ends with one.
    fn tail(written: Option<Written>) -> Option<Tail> {
        written.filter(|w| w.ours).map(|w| w.stamp.tail())
    }
}

/// The batch being published.
#[derive(Debug, Clone, Copy)]
struct Batch {
    txn: u64,
    kind: BatchKind,
    /// Its messages' `Sluice-After`.
    after: u64,
    /// Messages a replay discarded as held.
    discarded: u64,
}

/// How publishes are paced, and what each one expects to follow (the fence).
#[derive(Debug, Clone)]
enum Pacing {
    /// The stream holds this subject alone: the first publish since the tail was read
    /// follows the subject's last message by its sequence, each later one the message
    /// published before it by its `Nats-Msg-Id`, which is known before that one is
    /// acknowledged. (A stream's last message id is the stream's, not the subject's:
    /// other subjects' messages between would refuse every publish.)
    Pipelined {
        /// The `Nats-Msg-Id` of the message published last; `None`: none since the tail
        /// was read.
        previous: Option<String>,
    },
    /// Other subjects (or sourced streams) share the stream and a former holder may
    /// still publish: each publish waits for the one before it, and follows its sequence.
    OneAtATime,
    /// Other subjects share the stream, and this endpoint is the subject's one writer
    /// (the view is local, under the recovery log's lock): pipelined, the first publish
    /// since the tail was read following the subject's last message by its sequence, the
    /// later ones unfenced (a hole a failed publish leaves is found by the next read's
    /// gap check).
    SoleWriter {
        /// A publish since the tail was read.
        started: bool,
    },
}

/// What a publish expects the stream to end with, or the server refuses it.
#[derive(Debug, Clone)]
enum Follows {
    /// The subject's last message has this stream sequence (0: the subject has none).
    Sequence(u64),
    /// The stream's last message has this `Nats-Msg-Id`.
    Message(String),
    /// Nothing: a sole writer's publish after the first since the tail was read.
    Anything,
}

struct InFlight {
    ack: PublishAckFuture,
    stamp: Stamp,
    /// What it was published to follow.
    follows: Follows,
}

impl NatsEndpoint {
    pub fn new(config: &Config, resource: &Resource, target: &Target) -> NatsEndpoint {
        NatsEndpoint {
            server: config.server(),
            subject: Subject::from(resource.subject.as_str()),
            stream_name: (config.stream.clone()).unwrap_or_else(|| resource.default_stream()),
            materialization: target.materialization.clone(),
            generation: target.generation,
            former_writers: target.former_writers,
            max_buffer_size_bytes: config.max_buffer_size_bytes,
            max_in_flight: config.max_in_flight,
            place: format!("{} subject {}", config.url, resource.subject),
            connection: None,
            written: None,
            tail_known: false,
            pacing: None,
            batch: None,
            in_flight: VecDeque::new(),
        }
    }

    fn connection(&self) -> Result<&Connection> {
        self.connection.as_ref().ok_or_else(|| {
            OutputError::External(format!("{}: used before it was opened", self.place))
        })
    }

    /// The subject's last message, checked: written by this materialization, and, if
    /// of this generation, the last of an unbroken run of its transaction's messages.
    /// Another generation's (written before a reset) is nothing of this one's: not
    /// checked, and never a tail to discard up to.
    async fn read_tail(&self) -> Result<Option<Written>> {
        let stream = &self.connection()?.stream;
        let Some(last) = server::last_message(stream, &self.subject, &self.place).await? else {
            return Ok(None);
        };
        let foreign = |why: String| {
            OutputError::Corrupt(format!(
                "{}: the subject's last message (sequence {}) was not written by this \
                 output: {why}. Another publisher writes to the subject; give the binding \
                 a subject of its own",
                self.place, last.sequence
            ))
        };
        let stamp = Stamp::parse(Some(&last.headers)).map_err(foreign)?;
        let expected = msg_id(
            &self.materialization,
            &self.subject,
            stamp.generation,
            stamp.txn,
            stamp.index,
        );
        match msg_id_of(Some(&last.headers)) {
            Some(id) if id == expected => {}
            id => {
                return Err(foreign(format!(
                    "its Nats-Msg-Id is {id:?}, not {expected:?} (another materialization's?)"
                )));
            }
        }
        let ours = self.generation.owns(stamp.generation);
        if ours {
            self.check_unbroken(stream, &last, stamp).await?;
        } else {
            tracing::info!(
                place = self.place,
                generation = %self.generation.id,
                ended_with = ?stamp.generation.map(|g| g.to_string()),
                "the subject ends with an earlier generation's message (a reset): nothing \
                 of this generation is written yet"
            );
        }
        Ok(Some(Written {
            stamp,
            sequence: last.sequence,
            ours,
        }))
    }

    /// Checks that the subject holds exactly `index + 1` messages after the tail's
    /// `Sluice-After`: its transaction's messages 0 to `index`, no gap (see the crate
    /// docs). Skipped when retention removed messages after `Sluice-After`, as the
    /// transaction's first ones may be among them.
    async fn check_unbroken(
        &self,
        stream: &Stream,
        last: &StreamMessage,
        tail: Stamp,
    ) -> Result<()> {
        let first = server::first_sequence(stream, &self.place).await?;
        if first > tail.after + 1 {
            tracing::debug!(
                place = self.place,
                first,
                after = tail.after,
                "retention removed messages the gap check would count; skipped"
            );
            return Ok(());
        }
        let (consumer, count) =
            server::consumer_from(stream, &self.subject, tail.after + 1, &self.place).await?;
        server::remove_consumer(stream, &consumer.cached_info().name).await;
        if count != tail.index + 1 {
            return Err(OutputError::Corrupt(format!(
                "{}: the last message (sequence {}) is transaction {}'s message {}, so the \
                 subject should hold {} messages after sequence {} (the transaction's \
                 0 to {}), but it holds {count}: a publish failed while later ones were \
                 stored (a gap), messages were deleted, or another publisher wrote there. \
                 The subject cannot be continued exactly: inspect it, then purge it or \
                 give the binding a new subject",
                self.place,
                last.sequence,
                tail.txn,
                tail.index,
                tail.index + 1,
                tail.after,
                tail.index,
            )));
        }
        Ok(())
    }

    /// How the publishes after a read of the tail are paced (see [`Pacing`]).
    async fn read_pacing(&self) -> Result<Pacing> {
        let info = server::stream_info(&self.connection()?.stream, &self.place).await?;
        Ok(
            match (
                server::holds_only(&info, &self.subject),
                self.former_writers,
            ) {
                (true, _) => Pacing::Pipelined { previous: None },
                (false, true) => {
                    tracing::debug!(
                        place = self.place,
                        "the stream holds other subjects too, and a former holder may still \
                         publish: publishing one at a time"
                    );
                    Pacing::OneAtATime
                }
                (false, false) => Pacing::SoleWriter { started: false },
            },
        )
    }

    /// What the next publish, whose `Nats-Msg-Id` is `id`, must follow. Settles
    /// acknowledgements first as far as the pacing needs.
    async fn place_next(&mut self, id: &str) -> Result<Follows> {
        let pacing = match self.pacing.take() {
            Some(pacing) => pacing,
            None => self.read_pacing().await?,
        };
        let follows = match pacing {
            Pacing::Pipelined { previous } => {
                if self.in_flight.len() >= self.max_in_flight {
                    self.settle_oldest().await?;
                }
                self.pacing = Some(Pacing::Pipelined {
                    previous: Some(id.to_string()),
                });
                match previous {
                    Some(previous) => Follows::Message(previous),
                    None => Follows::Sequence(self.written.map_or(0, |w| w.sequence)),
                }
            }
            Pacing::OneAtATime => {
                while !self.in_flight.is_empty() {
                    self.settle_oldest().await?;
                }
                self.pacing = Some(Pacing::OneAtATime);
                Follows::Sequence(self.written.map_or(0, |w| w.sequence))
            }
            Pacing::SoleWriter { started } => {
                if self.in_flight.len() >= self.max_in_flight {
                    self.settle_oldest().await?;
                }
                self.pacing = Some(Pacing::SoleWriter { started: true });
                match started {
                    true => Follows::Anything,
                    false => Follows::Sequence(self.written.map_or(0, |w| w.sequence)),
                }
            }
        };
        Ok(follows)
    }

    /// Awaits the oldest acknowledgement; the tail moves to its message. A publish the
    /// fence refused fails the push and has the tail read again.
    async fn settle_oldest(&mut self) -> Result<()> {
        let Some(InFlight {
            ack,
            stamp,
            follows,
        }) = self.in_flight.pop_front()
        else {
            return Ok(());
        };
        let what = format!("transaction {} message {}", stamp.txn, stamp.index);
        let ack = ack.await.map_err(|e| {
            self.tail_known = false;
            let expected = match (e.kind(), &follows) {
                (PublishErrorKind::WrongLastSequence, Follows::Sequence(sequence)) => format!(
                    "it was to follow the subject's message at sequence {sequence} (0: none)"
                ),
                (PublishErrorKind::WrongLastMessageId, Follows::Message(id)) => {
                    format!("it was to follow message {id} at the end of the stream")
                }
                _ => return external(&self.place, &format!("publishing {what}"), e),
            };
            OutputError::External(format!(
                "{}: {what} was refused: {expected}, but the stream ends elsewhere ({e}). \
                 Another writer appended to subject {} or its stream since this endpoint \
                 read it: a former holder of this shard that has not learned it lost it, \
                 another publisher, or another subject's since the stream holds more than \
                 one. Nothing was skipped or reordered; the tail is read again before the \
                 next batch",
                self.place, self.subject
            ))
        })?;
        if ack.duplicate {
            // Another attempt stored this very message within the duplicate window (an
            // abandoned publish of an earlier one, or a former holder of the shard): the
            // subject holds it once. The next publish follows it (by its id or sequence),
            // and the fence refuses that one if the stream ends elsewhere.
            tracing::warn!(
                place = self.place,
                txn = stamp.txn,
                index = stamp.index,
                sequence = ack.sequence,
                "the stream already held this message (dropped as a duplicate)"
            );
        }
        self.written = Some(Written {
            stamp,
            sequence: ack.sequence,
            ours: true,
        });
        Ok(())
    }

    /// Publishes the messages of `buffer` the subject does not hold.
    async fn publish(&mut self, buffer: &Buffer, batch: Batch) -> Result<u64> {
        let mut discarded = 0;
        for message in buffer.messages() {
            if Tail::holds(Written::tail(self.written), &message) {
                discarded += 1;
                continue;
            }
            let stamp = Stamp {
                generation: Some(self.generation.id),
                txn: message.txn,
                index: message.index,
                batch: batch.kind,
                after: batch.after,
            };
            let headers = stamp.headers(&self.materialization, &self.subject, message.key);
            let follows = self
                .place_next(msg_id_of(Some(&headers)).unwrap_or_default())
                .await?;
            let publish = PublishMessage::build()
                .payload(Bytes::copy_from_slice(message.value))
                .headers(headers);
            let publish = match &follows {
                Follows::Sequence(sequence) => publish.expected_last_subject_sequence(*sequence),
                Follows::Message(id) => publish.expected_last_message_id(id),
                Follows::Anything => publish,
            };
            let ack = (self.connection()?.js)
                .send_publish(self.subject.clone(), publish)
                .await
                .map_err(|e| self.publish_error(stamp, e))?;
            self.in_flight.push_back(InFlight {
                ack,
                stamp,
                follows,
            });
        }
        Ok(discarded)
    }

    fn publish_error(&self, stamp: Stamp, error: PublishError) -> OutputError {
        let what = format!("transaction {} message {}", stamp.txn, stamp.index);
        if error.kind() == PublishErrorKind::MaxPayloadExceeded {
            OutputError::Config(format!(
                "{}: {what} is larger than the server accepts ({error}); raise the \
                 server's max_payload",
                self.place
            ))
        } else {
            external(&self.place, &format!("publishing {what}"), error)
        }
    }
}

#[async_trait]
impl OutputEndpoint for NatsEndpoint {
    async fn probe(&mut self) -> Result<String> {
        let js = server::connect(&self.server, self.max_in_flight, &self.place).await?;
        Ok(
            match server::stream_of(&js, &self.subject, &self.place).await? {
                Some(stream) => format!(
                    "subject {} is in stream {}",
                    self.subject,
                    stream.cached_info().config.name
                ),
                None => format!(
                    "subject {} is added to stream {} at the first run",
                    self.subject, self.stream_name
                ),
            },
        )
    }

    async fn open(&mut self) -> Result<()> {
        self.tail_known = false;
        self.pacing = None;
        if self.connection.is_none() {
            let js = server::connect(&self.server, self.max_in_flight, &self.place).await?;
            let stream =
                server::stream_holding(&js, &self.subject, &self.stream_name, &self.place).await?;
            self.place = format!(
                "{} stream {} subject {}",
                self.server.url,
                stream.cached_info().config.name,
                self.subject
            );
            self.connection = Some(Connection { js, stream });
        }
        self.written = self.read_tail().await?;
        self.tail_known = true;
        Ok(())
    }

    fn max_buffer_size_bytes(&self) -> usize {
        self.max_buffer_size_bytes
    }

    async fn batch_start(&mut self, txn: u64, kind: BatchKind) -> Result<()> {
        if self.batch.is_some() || !self.in_flight.is_empty() {
            self.abort().await;
        }
        if !self.tail_known {
            self.open().await?;
        }
        // A transaction written in part before keeps counting from where it began.
        let after = match self.written {
            Some(w) if w.ours && w.stamp.txn == txn => w.stamp.after,
            Some(w) => w.sequence,
            None => 0,
        };
        self.batch = Some(Batch {
            txn,
            kind,
            after,
            discarded: 0,
        });
        Ok(())
    }

    async fn push(&mut self, buffer: &Buffer) -> Result<()> {
        let Some(batch) = self.batch else {
            return Err(OutputError::External(format!(
                "{}: a push outside a batch",
                self.place
            )));
        };
        let discarded = self.publish(buffer, batch).await.inspect_err(|_| {
            self.tail_known = false;
        })?;
        if let Some(batch) = &mut self.batch {
            batch.discarded += discarded;
        }
        Ok(())
    }

    async fn batch_end(&mut self) -> Result<()> {
        while !self.in_flight.is_empty() {
            self.settle_oldest().await?;
        }
        if let Some(batch) = self.batch.take()
            && batch.discarded > 0
        {
            tracing::info!(
                place = self.place,
                txn = batch.txn,
                discarded = batch.discarded,
                "a replayed transaction's messages the subject held were discarded"
            );
        }
        Ok(())
    }

    /// Lets every publish in flight land or time out, so that the tail read by the
    /// next batch is not overtaken by them.
    async fn abort(&mut self) {
        self.batch = None;
        self.tail_known = false;
        let abandoned = std::mem::take(&mut self.in_flight);
        let acks = futures::future::join_all(abandoned.into_iter().map(|f| f.ack.into_future()));
        for ack in acks.await {
            if let Err(err) = ack {
                tracing::debug!(place = self.place, %err, "an abandoned publish failed");
            }
        }
    }
}
