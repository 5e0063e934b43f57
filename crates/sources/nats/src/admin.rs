//! Making, filling and deleting streams: what `sluice produce`, benchmarks, the torture
//! scenarios and tests need of a server, kept beside the source so they all use one
//! client.

use async_nats::jetstream::context::{GetStreamByNameErrorKind, GetStreamErrorKind};
use async_nats::jetstream::{self, Context, stream};
use bytes::Bytes;
use std::collections::VecDeque;

pub use async_nats::Error;

/// Publishes acknowledged this many at a time: enough to keep the server busy,
/// few enough that a batch does not hold every payload in flight.
const IN_FLIGHT: usize = 512;

/// A JetStream context on one server.
#[derive(Clone)]
pub struct Admin(Context);

impl Admin {
    pub async fn connect(url: &str) -> Result<Admin, Error> {
        Ok(Admin(jetstream::new(async_nats::connect(url).await?)))
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
        let mut acks = VecDeque::new();
        let mut last = 0;
        for payload in payloads {
            if acks.len() == IN_FLIGHT {
                let ack: jetstream::context::PublishAckFuture =
                    acks.pop_front().expect("a full window");
                last = ack.await?.sequence;
            }
            acks.push_back(self.0.publish(subject.to_string(), payload).await?);
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
