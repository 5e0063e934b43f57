//! Reading a subject back, for tests, benchmarks and `sluice torture`: every message it
//! holds, in stream order, with the stamp this output gave it. (Deleting a stream after
//! a test is `sluice_nats::admin::Admin::delete_stream`.)

use crate::server::{self, TIMEOUT, external};
use crate::stamp::{KEY, Stamp, msg_id_of};
use bytes::Bytes;
use futures::StreamExt;
use sluice_nats_client::Server;
use sluice_output_sdk::{OutputError, Result};

/// A message of the subject as the stream holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredMessage {
    pub sequence: u64,
    pub stamp: Stamp,
    /// Its `Nats-Msg-Id` (`<materialization>/<subject>/<txn>/<index>`).
    pub msg_id: String,
    /// Its `Sluice-Key`, absent when the key was not header text.
    pub key: Option<String>,
    /// All its headers, as published.
    pub headers: async_nats::HeaderMap,
    pub payload: Bytes,
}

/// Every message `subject` holds on the server at `url` (reached in plain text without
/// authentication), as [`read_subject_on`] reads it.
pub async fn read_subject(url: &str, subject: &str) -> Result<Vec<StoredMessage>> {
    read_subject_on(&Server::from(url), subject).await
}

/// Every message `subject` holds on `server`, read by an ordered consumer from the
/// stream's start; a message this output did not write is `Corrupt`.
pub async fn read_subject_on(server: &Server, subject: &str) -> Result<Vec<StoredMessage>> {
    let url = &server.url;
    let place = format!("{url} subject {subject}");
    let js = server::connect(server, 1, &place).await?;
    let stream = server::stream_of(&js, subject, &place)
        .await?
        .ok_or_else(|| OutputError::External(format!("{place}: no stream holds the subject")))?;
    let place = format!(
        "{url} stream {} subject {subject}",
        stream.cached_info().config.name
    );
    let (consumer, pending) = server::consumer_from(&stream, subject, 1, &place).await?;
    let name = consumer.cached_info().name.clone();
    let mut messages = consumer
        .messages()
        .await
        .map_err(|e| external(&place, "reading", e))?;
    let mut read = Vec::new();
    while (read.len() as u64) < pending {
        let message = match tokio::time::timeout(TIMEOUT, messages.next()).await {
            Ok(Some(Ok(message))) => message,
            Ok(Some(Err(e))) => return Err(external(&place, "reading", e)),
            Ok(None) => return Err(external(&place, "reading", "the consumer ended")),
            Err(_) => {
                return Err(external(
                    &place,
                    "reading",
                    format!("no message for {TIMEOUT:?}"),
                ));
            }
        };
        let sequence = message
            .info()
            .map_err(|e| external(&place, "reading", e))?
            .stream_sequence;
        let headers = message.message.headers.as_ref();
        let stamp = Stamp::parse(headers).map_err(|why| {
            OutputError::Corrupt(format!(
                "{place}: the message at sequence {sequence} was not written by this \
                 output: {why}"
            ))
        })?;
        read.push(StoredMessage {
            sequence,
            stamp,
            msg_id: msg_id_of(headers).unwrap_or_default().to_string(),
            key: headers
                .and_then(|h| h.get(KEY))
                .map(|v| v.as_str().to_string()),
            headers: headers.cloned().unwrap_or_default(),
            payload: message.message.payload.clone(),
        });
    }
    drop(messages);
    server::remove_consumer(&stream, &name).await;
    Ok(read)
}
