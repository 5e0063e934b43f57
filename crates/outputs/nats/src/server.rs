//! Talking to the server, in what nats-server 2.9 supports: `STREAM.NAMES` by subject,
//! stream create and update, `STREAM.MSG.GET` of a subject's last message, stream info
//! (its subjects and last sequence, for the fence's pacing), and ephemeral ordered
//! consumers (their pending count is a subject's message count from a sequence). Direct
//! gets are not used: they need `allow_direct`, which streams made before 2.9 lack.

use async_nats::jetstream::consumer::pull::OrderedConfig;
use async_nats::jetstream::consumer::{Consumer, DeliverPolicy};
use async_nats::jetstream::context::{
    ContextBuilder, GetStreamByNameErrorKind, GetStreamErrorKind,
};
use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{self, LastRawMessageErrorKind, Stream};
use async_nats::jetstream::{self, Context};
use sluice_nats_client::{ConnectError, Server};
use sluice_output_sdk::{OutputError, Result};
use std::fmt::Display;
use std::time::Duration;

/// How long an API request or a publish's acknowledgement may take before the
/// operation fails (retryably): the client's bound on connecting and requests.
pub const TIMEOUT: Duration = sluice_nats_client::TIMEOUT;

/// A retryable failure at `place` (`nats://127.0.0.1:4222 subject views`).
pub fn external(place: &str, doing: &str, error: impl Display) -> OutputError {
    OutputError::External(format!("{place}: {doing}: {error}"))
}

/// A JetStream context on `server`, at most `max_in_flight` publishes unacknowledged;
/// refused settings (credentials, TLS) are a configuration error, not retried.
pub async fn connect(server: &Server, max_in_flight: usize, place: &str) -> Result<Context> {
    let client = server.connect().await.map_err(|e| match e {
        ConnectError::Refused(why) => OutputError::Config(format!("{place}: connecting: {why}")),
        ConnectError::Unavailable(why) => external(place, "connecting", why),
    })?;
    Ok(ContextBuilder::new()
        .timeout(TIMEOUT)
        .max_ack_inflight(max_in_flight)
        .build(client))
}

/// The stream whose subjects hold `subject`, if one does.
pub async fn stream_of(js: &Context, subject: &str, place: &str) -> Result<Option<Stream>> {
    let name = match js.stream_by_subject(subject).await {
        Ok(name) => name,
        Err(e) if e.kind() == GetStreamByNameErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(external(place, "looking for its stream", e)),
    };
    let stream = js
        .get_stream(&name)
        .await
        .map_err(|e| external(place, &format!("reading stream {name}"), e))?;
    Ok(Some(stream))
}

/// The stream holding `subject`: the one that does, else `name` given the subject (a
/// new stream on disk with limits retention, or an existing one extended).
pub async fn stream_holding(
    js: &Context,
    subject: &str,
    name: &str,
    place: &str,
) -> Result<Stream> {
    if let Some(stream) = stream_of(js, subject, place).await? {
        return Ok(stream);
    }
    let creating = format!("creating stream {name} for it");
    match js.get_stream(name).await {
        Ok(mut stream) => {
            let mut config = stream
                .info()
                .await
                .map_err(|e| external(place, &creating, e))?
                .config
                .clone();
            config.subjects.push(subject.to_string());
            js.update_stream(config)
                .await
                .map_err(|e| external(place, &format!("adding it to stream {name}"), e))?;
        }
        Err(e) if matches!(e.kind(), GetStreamErrorKind::JetStream(js) if js.code() == 404) => {
            js.create_stream(stream::Config {
                name: name.to_string(),
                subjects: vec![subject.to_string()],
                storage: stream::StorageType::File,
                retention: stream::RetentionPolicy::Limits,
                ..Default::default()
            })
            .await
            .map_err(|e| external(place, &creating, e))?;
        }
        Err(e) => return Err(external(place, &creating, e)),
    }
    js.get_stream(name)
        .await
        .map_err(|e| external(place, &format!("reading stream {name}"), e))
}

/// The subject's last message in `stream`, if it has one.
pub async fn last_message(
    stream: &Stream,
    subject: &str,
    place: &str,
) -> Result<Option<StreamMessage>> {
    match stream.get_last_raw_message_by_subject(subject).await {
        Ok(message) => Ok(Some(message)),
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => Ok(None),
        Err(e) => Err(external(place, "reading its last message", e)),
    }
}

/// An ordered consumer of the subject's messages from stream sequence `from`, and how
/// many it has to deliver (the subject's messages from `from` when it was made).
pub async fn consumer_from(
    stream: &Stream,
    subject: &str,
    from: u64,
    place: &str,
) -> Result<(Consumer<OrderedConfig>, u64)> {
    let consumer = stream
        .create_consumer(OrderedConfig {
            deliver_policy: DeliverPolicy::ByStartSequence {
                start_sequence: from.max(1),
            },
            filter_subject: subject.to_string(),
            ..Default::default()
        })
        .await
        .map_err(|e| external(place, &format!("reading from sequence {from}"), e))?;
    let pending = consumer.cached_info().num_pending;
    Ok((consumer, pending))
}

/// Removes a consumer [`consumer_from`] made (the server would after 30 s idle).
pub async fn remove_consumer(stream: &Stream, name: &str) {
    if let Err(err) = stream.delete_consumer(name).await {
        tracing::debug!(%err, consumer = name, "removing an ordered consumer");
    }
}

/// The stream's configuration and state now.
pub async fn stream_info(stream: &Stream, place: &str) -> Result<jetstream::stream::Info> {
    stream
        .get_info()
        .await
        .map_err(|e| external(place, "reading the stream's state", e))
}

/// The stream's first sequence held now (`last + 1` once emptied).
pub async fn first_sequence(stream: &Stream, place: &str) -> Result<u64> {
    Ok(stream_info(stream, place).await?.state.first_sequence)
}

/// Whether `subject` is all `info`'s stream stores: no other subject, no sourced
/// stream. Only then is the stream's last message the subject's, which the pipelined
/// fence (each publish expecting the stream's last message id) needs.
pub fn holds_only(info: &jetstream::stream::Info, subject: &str) -> bool {
    let config = &info.config;
    config.subjects == [subject]
        && config.mirror.is_none()
        && config.sources.as_ref().is_none_or(Vec::is_empty)
}
