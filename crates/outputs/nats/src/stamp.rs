//! What each published message carries in its headers besides its payload: where it
//! belongs (transaction, index, batch kind), what the stream deduplicates it by, what
//! a restart checks the subject against, and its key when a header can carry it.

use async_nats::HeaderMap;
use async_nats::header::NATS_MESSAGE_ID;
use sluice_output_sdk::{BatchKind, GenerationId, Tail};

pub const TXN: &str = "Sluice-Txn";
pub const INDEX: &str = "Sluice-Index";
pub const BATCH: &str = "Sluice-Batch";
pub const AFTER: &str = "Sluice-After";
pub const KEY: &str = "Sluice-Key";
pub const GENERATION: &str = "Sluice-Generation";

/// The stream's deduplication id of a message:
/// `<materialization>/<subject>/<generation>/<txn>/<index>`, the same on every replay of
/// the transaction. The subject is part of it because the stream deduplicates across
/// its subjects, and bindings may share a stream; the generation, so that after a reset
/// the stream never drops a new generation's message as a duplicate of an old one's
/// (transactions are numbered anew). A message of a release before generations
/// (`generation` `None`) has `<materialization>/<subject>/<txn>/<index>`.
pub fn msg_id(
    materialization: &str,
    subject: &str,
    generation: Option<GenerationId>,
    txn: u64,
    index: u64,
) -> String {
    match generation {
        Some(generation) => format!("{materialization}/{subject}/{generation}/{txn}/{index}"),
        None => format!("{materialization}/{subject}/{txn}/{index}"),
    }
}

/// The key as a header value, when the bytes are text a header carries verbatim: UTF-8
/// with no control characters and no surrounding spaces (which a header line would
/// lose). JSON keys always are; binary (Avro) keys generally are not, and are omitted.
pub fn key_header(key: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(key).ok()?;
    let verbatim = !text.is_empty() && !text.contains(char::is_control) && text.trim() == text;
    verbatim.then_some(text)
}

/// A message's place: its generation (`None`: a release before generations), its
/// transaction, its index in the transaction's batch, the batch's kind, and the stream
/// sequence of the subject's last message before the transaction (0: none), against
/// which a restart counts the transaction's messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    pub generation: Option<GenerationId>,
    pub txn: u64,
    pub index: u64,
    pub batch: BatchKind,
    pub after: u64,
}

impl Stamp {
    pub fn tail(&self) -> Tail {
        Tail {
            txn: self.txn,
            index: self.index,
        }
    }

    /// The headers of a message of `materialization` to `subject` with this stamp and
    /// `key`.
    pub fn headers(&self, materialization: &str, subject: &str, key: &[u8]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        let id = msg_id(
            materialization,
            subject,
            self.generation,
            self.txn,
            self.index,
        );
        headers.insert(NATS_MESSAGE_ID, id);
        if let Some(generation) = self.generation {
            headers.insert(GENERATION, generation.to_string());
        }
        headers.insert(TXN, self.txn.to_string());
        headers.insert(INDEX, self.index.to_string());
        headers.insert(BATCH, self.batch.as_str());
        headers.insert(AFTER, self.after.to_string());
        if let Some(key) = key_header(key) {
            headers.insert(KEY, key);
        }
        headers
    }

    /// The stamp in `headers`, or why there is none (a message this output did not
    /// write).
    pub fn parse(headers: Option<&HeaderMap>) -> Result<Stamp, String> {
        let value = |name: &str| {
            headers
                .and_then(|h| h.get(name))
                .map(|v| v.as_str())
                .ok_or_else(|| format!("it has no {name} header"))
        };
        let number = |name: &str| {
            let text = value(name)?;
            text.parse::<u64>()
                .map_err(|_| format!("its {name} header {text:?} is not a number"))
        };
        let (txn, index) = (number(TXN)?, number(INDEX)?);
        let batch = match value(BATCH)? {
            "delta" => BatchKind::Delta,
            "snapshot" => BatchKind::Snapshot,
            other => {
                return Err(format!(
                    "its {BATCH} header {other:?} is not delta or snapshot"
                ));
            }
        };
        let generation = match headers.and_then(|h| h.get(GENERATION)) {
            Some(value) => Some(
                GenerationId::parse(value.as_str())
                    .map_err(|e| format!("its {GENERATION} header is not a generation: {e}"))?,
            ),
            None => None,
        };
        Ok(Stamp {
            generation,
            txn,
            index,
            batch,
            after: number(AFTER)?,
        })
    }
}

/// The message's `Nats-Msg-Id`, if any.
pub fn msg_id_of(headers: Option<&HeaderMap>) -> Option<&str> {
    headers
        .and_then(|h| h.get(NATS_MESSAGE_ID))
        .map(|v| v.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_msg_id_names_the_materialization_subject_transaction_and_index() {
        let generation = GenerationId::parse("0190f3a2b4c5d6e7").unwrap();
        assert_eq!(
            msg_id("acme/views", "v.orders", Some(generation), 42, 7),
            "acme/views/v.orders/0190f3a2b4c5d6e7/42/7"
        );
        // Frozen: the id the release before generations gave.
        assert_eq!(
            msg_id("acme/views", "v.orders", None, 42, 7),
            "acme/views/v.orders/42/7"
        );
    }

    #[test]
    fn a_stamp_round_trips_through_headers() {
        let generation = GenerationId::parse("0190f3a2b4c5d6e7").unwrap();
        let stamp = Stamp {
            generation: Some(generation),
            txn: 9,
            index: 3,
            batch: BatchKind::Snapshot,
            after: 120,
        };
        let headers = stamp.headers("acme/views", "v", br#"{"id":1}"#);
        assert_eq!(Stamp::parse(Some(&headers)), Ok(stamp));
        assert_eq!(
            msg_id_of(Some(&headers)),
            Some("acme/views/v/0190f3a2b4c5d6e7/9/3")
        );

        assert_eq!(headers.get(KEY).map(|v| v.as_str()), Some(r#"{"id":1}"#));
        assert_eq!(stamp.tail(), Tail { txn: 9, index: 3 });
        let unstamped = Stamp {
            generation: None,
            ..stamp
        };
        let headers = unstamped.headers("acme/views", "v", b"");
        assert_eq!(Stamp::parse(Some(&headers)), Ok(unstamped));
        assert_eq!(msg_id_of(Some(&headers)), Some("acme/views/v/9/3"));
    }

    #[test]
    fn keys_that_a_header_would_alter_are_left_out() {
        assert_eq!(key_header(br#"{"id":"a b"}"#), Some(r#"{"id":"a b"}"#));
        for key in [
            &b""[..],
            b"\xff\x01",
            b"a\r\nb",
            b"\x06abc",
            b" {}",
            b"{}\t",
        ] {
            assert_eq!(key_header(key), None, "{key:?}");
        }
        let stamp = Stamp {
            generation: Some(GenerationId::mint()),
            txn: 1,
            index: 0,
            batch: BatchKind::Delta,
            after: 0,
        };
        assert!(stamp.headers("m", "v", b"\xff").get(KEY).is_none());
    }

    #[test]
    fn a_foreign_message_says_what_it_lacks() {
        assert_eq!(
            Stamp::parse(None),
            Err("it has no Sluice-Txn header".into())
        );
        let mut headers = HeaderMap::new();
        headers.insert(TXN, "x1");
        let error = Stamp::parse(Some(&headers)).unwrap_err();
        assert_eq!(error, r#"its Sluice-Txn header "x1" is not a number"#);
        headers.insert(TXN, "1");
        headers.insert(INDEX, "0");
        headers.insert(BATCH, "full");
        let error = Stamp::parse(Some(&headers)).unwrap_err();
        assert!(error.contains("not delta or snapshot"), "{error}");
        headers.insert(BATCH, "delta");
        headers.insert(AFTER, "0");
        headers.insert(GENERATION, "g1");
        let error = Stamp::parse(Some(&headers)).unwrap_err();
        assert!(
            error.contains("Sluice-Generation header is not a generation"),
            "{error}"
        );
    }
}
