//! Making, filling and deleting streams: what `sluice produce`, benchmarks, the torture
//! scenarios and tests need of a server, kept beside the source so they all use one
//! client.

use async_nats::jetstream::context::{GetStreamByNameErrorKind, GetStreamErrorKind};
use async_nats::jetstream::{self, Context, stream};
use bytes::Bytes;
use sluice_nats_client::Server;
use std::collections::VecDeque;

pub use async_nats::Error;

/// Publishes acknowledged this many at a time: enough to keep the server busy,
/// few enough that a batch does not hold every payload in flight.
const IN_FLIGHT: usize = 512;

/// A JetStream context on one server.
#[derive(Clone)]
pub struct Admin(Context);

impl Admin {
    /// A context on the server at `url`, in plain text without authentication.
    pub async fn connect(url: &str) -> Result<Admin, Error> {
        Admin::connect_to(&Server::from(url)).await
    }

    /// A context on `server`, reached as a source's configuration says
    /// ([`NatsConfig::server`](crate::NatsConfig::server)).
    pub async fn connect_to(server: &Server) -> Result<Admin, Error> {
        Ok(Admin(jetstream::new(server.connect().await?)))
    }

    /// Creates the stream `name` of `subjects`, limits retention (replayable), files
    /// on disk as the server's defaults keep them.
    pub async fn create_stream(&self, name: &str, subjects: &[&str]) -> Result<(), Error> {
        self.create_stream_with_retention(name, subjects, stream::RetentionPolicy::Limits)
            .await
    }

    /// As [`Admin::create_stream`], with a work-queue retention (what the source
    /// refuses to read).
    pub async fn create_work_queue(&self, name: &str, subjects: &[&str]) -> Result<(), Error> {
        self.create_stream_with_retention(name, subjects, stream::RetentionPolicy::WorkQueue)
            .await
    }

    async fn create_stream_with_retention(
        &self,
        name: &str,
        subjects: &[&str],
        retention: stream::RetentionPolicy,
    ) -> Result<(), Error> {
        self.0
            .create_stream(stream::Config {
                name: name.to_string(),
                subjects: subjects.iter().map(|s| s.to_string()).collect(),
                retention,
                ..Default::default()
            })
            .await?;
        Ok(())
    }

    /// The subjects of stream `name`; `None` when there is no such stream.
    pub async fn stream_subjects(&self, name: &str) -> Result<Option<Vec<String>>, Error> {
        match self.0.get_stream(name).await {
            Ok(stream) => Ok(Some(stream.cached_info().config.subjects.clone())),
            Err(e) if matches!(e.kind(), GetStreamErrorKind::JetStream(js) if js.code() == 404) => {
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The stream whose subjects hold `subject`, if one does.
    pub async fn stream_of_subject(&self, subject: &str) -> Result<Option<String>, Error> {
        match self.0.stream_by_subject(subject).await {
            Ok(name) => Ok(Some(name)),
            Err(e) if e.kind() == GetStreamByNameErrorKind::NotFound => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Publishes `payloads` to `subject`, in order, each acknowledged by the stream;
    /// returns the last one's stream sequence (0 for none).
    pub async fn publish_batch(
        &self,
        subject: &str,
        payloads: impl IntoIterator<Item = Bytes>,
    ) -> Result<u64, Error> {
        let messages = payloads.into_iter().map(|payload| (None, payload));
        self.publish_in_window(subject, messages).await
    }

    /// [`Admin::publish_batch`] of messages with their headers (the very messages
    /// another publisher sent, `Nats-Msg-Id` included).
    pub async fn publish_batch_with_headers(
        &self,
        subject: &str,
        messages: impl IntoIterator<Item = (async_nats::HeaderMap, Bytes)>,
    ) -> Result<u64, Error> {
        let messages = messages.into_iter().map(|(h, payload)| (Some(h), payload));
        self.publish_in_window(subject, messages).await
    }

    /// Publishes in order with [`IN_FLIGHT`] acknowledgements awaited at once.
    async fn publish_in_window(
        &self,
        subject: &str,
        messages: impl Iterator<Item = (Option<async_nats::HeaderMap>, Bytes)>,
    ) -> Result<u64, Error> {
        let mut acks = VecDeque::new();
        let mut last = 0;
        for (headers, payload) in messages {
            if acks.len() == IN_FLIGHT {
                let ack: jetstream::context::PublishAckFuture =
                    acks.pop_front().expect("a full window");
                last = ack.await?.sequence;
            }
            let subject = subject.to_string();
            let ack = match headers {
                None => self.0.publish(subject, payload).await?,
                Some(headers) => {
                    self.0
                        .publish_with_headers(subject, headers, payload)
                        .await?
                }
            };
            acks.push_back(ack);
        }
        for ack in acks {
            last = ack.await?.sequence;
        }
        Ok(last)
    }

    /// Publishes one message with `headers` (a name may repeat); returns its sequence.
    pub async fn publish(
        &self,
        subject: &str,
        headers: &[(&str, &str)],
        payload: Bytes,
    ) -> Result<u64, Error> {
        let mut map = async_nats::HeaderMap::new();
        for (name, value) in headers {
            map.append(*name, *value);
        }
        let ack = self
            .0
            .publish_with_headers(subject.to_string(), map, payload)
            .await?;
        Ok(ack.await?.sequence)
    }

    /// Deletes the message at `sequence` of `stream` (leaving a gap).
    pub async fn delete_message(&self, stream: &str, sequence: u64) -> Result<(), Error> {
        self.0
            .get_stream(stream)
            .await?
            .delete_message(sequence)
            .await?;
        Ok(())
    }

    /// Removes the messages of `stream` below `sequence`, as retention would.
    pub async fn purge_below(&self, stream: &str, sequence: u64) -> Result<(), Error> {
        self.0
            .get_stream(stream)
            .await?
            .purge()
            .sequence(sequence)
            .await?;
        Ok(())
    }

    pub async fn delete_stream(&self, name: &str) -> Result<(), Error> {
        self.0.delete_stream(name).await?;
        Ok(())
    }
}
