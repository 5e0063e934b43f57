//! Talking to the server: the stream's state, where a start resolves to, and ordered
//! consumers from a stream sequence (the only reads this source makes).
//!
//! Everything here is what nats-server 2.9 supports: stream info, `STREAM.MSG.GET` by
//! last subject, and ephemeral ordered pull consumers (`CONSUMER.CREATE` with a start
//! sequence, no acks, recreated by the client at the next sequence when it sees a
//! gap in its delivery). Direct gets are not used: they need `allow_direct` on the
//! stream, which streams made before 2.9 lack.

use crate::config::{NatsConfig, Start};
use async_nats::HeaderMap;
use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::consumer::pull::{Ordered, OrderedConfig};
use async_nats::jetstream::stream::{RetentionPolicy, Stream};
use bytes::Bytes;
use futures::{FutureExt, StreamExt};
use sluice_nats_client::ConnectError;
use sluice_source_sdk::{Fetch, SourceError};

/// At most this many messages are moved into the prefetch buffer per fetch: those
/// already delivered, so a backlog costs one wake-up per batch rather than per message.
const FETCH_BATCH: usize = 1024;

/// A connection to the server and the stream the source reads.
pub struct Connection {
    stream: Stream,
    /// What errors name: `nats://127.0.0.1:4222 stream EVENTS`.
    place: String,
    name: String,
}

/// The stream's sequences as the server reported them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sequences {
    /// The lowest sequence held (0 in a stream never written, `last + 1` once purged).
    pub first: u64,
    /// The last sequence assigned (0 in a stream never written).
    pub last: u64,
}

/// One message read from the stream.
pub struct Message {
    pub sequence: u64,
    /// Messages (matching the filter) after this one in the stream when it was delivered.
    pub pending: u64,
    pub subject: String,
    pub published: time::OffsetDateTime,
    pub headers: Option<HeaderMap>,
    pub payload: Bytes,
}

impl Connection {
    /// Connects and looks the stream up; refuses a stream whose messages vanish once
    /// read (work-queue or interest retention), as a step of it could not be replayed.
    pub async fn open(name: &str, config: &NatsConfig) -> Result<Connection, SourceError> {
        let place = format!("{} stream {}", config.url, config.stream);
        let client = config.server().connect().await.map_err(|e| match e {
            ConnectError::Refused(why) => SourceError::Config {
                name: name.to_string(),
                reason: format!("{place}: {why}"),
            },
            ConnectError::Unavailable(why) => io(name, &place, why),
        })?;
        let js = async_nats::jetstream::new(client);
        let mut stream = js
            .get_stream(&config.stream)
            .await
            .map_err(|e| match e.kind() {
                async_nats::jetstream::context::GetStreamErrorKind::JetStream(js)
                    if js.code() == 404 =>
                {
                    SourceError::Config {
                        name: name.to_string(),
                        reason: format!(
                            "{place}: there is no such stream ({js}); create it, or name \
                             an existing one under stream"
                        ),
                    }
                }
                _ => io(name, &place, e),
            })?;
        let retention = stream
            .info()
            .await
            .map_err(|e| io(name, &place, e))?
            .config
            .retention;
        if retention != RetentionPolicy::Limits {
            return Err(SourceError::Config {
                name: name.to_string(),
                reason: format!(
                    "stream {} has {retention:?} retention: its messages are removed once \
                     read, so a step could not be replayed after a crash; read a stream \
                     with limits retention (a mirror of this one, for instance)",
                    config.stream
                ),
            });
        }
        Ok(Connection {
            stream,
            place,
            name: name.to_string(),
        })
    }

    fn io(&self, error: impl std::fmt::Display) -> SourceError {
        io(&self.name, &self.place, error)
    }

    /// The stream's first and last sequence now.
    pub async fn sequences(&self) -> Result<Sequences, SourceError> {
        let state = self.stream.get_info().await.map_err(|e| self.io(e))?.state;
        Ok(Sequences {
            first: state.first_sequence,
            last: state.last_sequence,
        })
    }

    /// The sequence `start` means now: the first message held, the last one
    /// (matching `subject`), or the one after the last.
    pub async fn resolve(&self, start: Start, subject: Option<&str>) -> Result<u64, SourceError> {
        let seq = self.sequences().await?;
        Ok(match start {
            Start::First => seq.first.max(1),
            Start::New => seq.last + 1,
            Start::Sequence(n) => n,
            Start::Last => match subject {
                None if seq.first <= seq.last && seq.first > 0 => seq.last,
                None => seq.last + 1,
                Some(filter) => match self.stream.get_last_raw_message_by_subject(filter).await {
                    Ok(message) => message.sequence,
                    Err(e)
                        if e.kind()
                            == async_nats::jetstream::stream::LastRawMessageErrorKind::NoMessageFound =>
                    {
                        seq.last + 1
                    }
                    Err(e) => return Err(self.io(e)),
                },
            },
        })
    }

    /// An ordered consumer delivering from stream sequence `from` (the messages
    /// matching `subject`), and how many messages it had pending when created.
    pub async fn read_from(
        &self,
        from: u64,
        subject: Option<&str>,
    ) -> Result<(Reading, u64), SourceError> {
        let consumer = self
            .stream
            .create_consumer(OrderedConfig {
                deliver_policy: DeliverPolicy::ByStartSequence {
                    start_sequence: from,
                },
                filter_subject: subject.unwrap_or_default().to_string(),
                ..Default::default()
            })
            .await
            .map_err(|e| self.io(e))?;
        let pending = consumer.cached_info().num_pending;
        let messages = consumer.messages().await.map_err(|e| self.io(e))?;
        let reading = Reading {
            messages,
            from,
            failed: None,
            name: self.name.clone(),
            place: self.place.clone(),
        };
        Ok((reading, pending))
    }
}

fn io(name: &str, place: &str, error: impl std::fmt::Display) -> SourceError {
    SourceError::Io {
        name: name.to_string(),
        path: place.to_string(),
        error: std::io::Error::other(error.to_string()),
    }
}

/// An ordered consumer's delivery, fetched by the source's prefetch task.
pub struct Reading {
    messages: Ordered,
    /// The lowest stream sequence still to hand out: a delivery below it (an ordered
    /// consumer recreating itself, a server re-sending) is dropped, never handed out
    /// twice, as the Kafka fetch drops offsets it handed out.
    from: u64,
    /// An error met after messages of the same fetch: the next fetch returns it.
    failed: Option<SourceError>,
    name: String,
    place: String,
}

impl Reading {
    /// The next message, waiting for it.
    pub async fn next(&mut self) -> Result<Message, SourceError> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        loop {
            let next = self.messages.next().await;
            if let Some(message) = self.accept(self.message(next)?) {
                return Ok(message);
            }
        }
    }

    /// `message`, unless its sequence was handed out already (or lies before the start).
    fn accept(&mut self, message: Message) -> Option<Message> {
        if message.sequence < self.from {
            return None;
        }
        self.from = message.sequence + 1;
        Some(message)
    }

    fn message(
        &self,
        next: Option<Result<async_nats::jetstream::Message, impl std::fmt::Display>>,
    ) -> Result<Message, SourceError> {
        let message = match next {
            Some(Ok(message)) => message,
            Some(Err(e)) => return Err(io(&self.name, &self.place, e)),
            None => return Err(io(&self.name, &self.place, "the ordered consumer ended")),
        };
        let info = message.info().map_err(|e| io(&self.name, &self.place, e))?;
        let (sequence, pending, published) = (info.stream_sequence, info.pending, info.published);
        let message = message.message;
        Ok(Message {
            sequence,
            pending,
            subject: message.subject.to_string(),
            published,
            headers: message.headers,
            payload: message.payload,
        })
    }
}

#[async_trait::async_trait]
impl Fetch for Reading {
    type Item = Message;

    /// Waits for one message, then takes those already delivered behind it.
    async fn fetch(&mut self) -> Result<Vec<(Message, u64)>, SourceError> {
        let first = self.next().await?;
        let mut batch = vec![(first.payload.len() as u64, first)];
        while batch.len() < FETCH_BATCH {
            let Some(next) = self.messages.next().now_or_never() else {
                break;
            };
            match self.message(next) {
                Ok(message) => {
                    if let Some(message) = self.accept(message) {
                        batch.push((message.payload.len() as u64, message));
                    }
                }
                Err(e) => {
                    self.failed = Some(e);
                    break;
                }
            }
        }
        Ok(batch.into_iter().map(|(bytes, m)| (m, bytes)).collect())
    }
}
