//! The headers that say which transaction, and which message of it, a Kafka message
//! is: what a restart reads back from each partition's last message to know where the
//! partition ends ([`Tail`]), and what a reader checks exactly-once by.

use rskafka::record::Record;
use sluice_output_sdk::{BatchKind, GenerationId, Message, Tail};
use std::collections::BTreeMap;

pub const TXN_HEADER: &str = "sluice-txn";
pub const INDEX_HEADER: &str = "sluice-index";
pub const BATCH_HEADER: &str = "sluice-batch";
pub const MATERIALIZATION_HEADER: &str = "sluice-materialization";
pub const GENERATION_HEADER: &str = "sluice-generation";

/// What a message's headers say about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stamp {
    pub txn: u64,
    /// Its index within its transaction's batch (across all partitions).
    pub index: u64,
    pub batch: BatchKind,
    pub materialization: String,
    /// The generation that wrote it (`None`: a release before generations).
    pub generation: Option<GenerationId>,
}

impl Stamp {
    pub fn tail(&self) -> Tail {
        Tail {
            txn: self.txn,
            index: self.index,
        }
    }

    /// Reads the headers of a message; the error says which is missing or bad.
    pub fn parse(headers: &BTreeMap<String, Vec<u8>>) -> Result<Stamp, String> {
        let text = |name: &str| -> Result<&str, String> {
            let value = headers
                .get(name)
                .ok_or_else(|| format!("it has no {name} header"))?;
            std::str::from_utf8(value).map_err(|_| format!("its {name} header is not UTF-8"))
        };
        let number = |name: &str| -> Result<u64, String> {
            let value = text(name)?;
            value
                .parse()
                .map_err(|_| format!("its {name} header {value:?} is not a number"))
        };
        let (txn, index) = (number(TXN_HEADER)?, number(INDEX_HEADER)?);
        let batch = match text(BATCH_HEADER)? {
            "delta" => BatchKind::Delta,
            "snapshot" => BatchKind::Snapshot,
            other => {
                return Err(format!(
                    "its {BATCH_HEADER} header {other:?} is neither delta nor snapshot"
                ));
            }
        };
        let generation =
            match headers.contains_key(GENERATION_HEADER) {
                true => Some(GenerationId::parse(text(GENERATION_HEADER)?).map_err(|e| {
                    format!("its {GENERATION_HEADER} header is not a generation: {e}")
                })?),
                false => None,
            };
        Ok(Stamp {
            txn,
            index,
            batch,
            materialization: text(MATERIALIZATION_HEADER)?.to_string(),
            generation,
        })
    }
}

/// The record of `message` of `generation`: its key and value, stamped.
pub fn record(
    message: &Message<'_>,
    batch: BatchKind,
    materialization: &str,
    generation: GenerationId,
    timestamp: rskafka::chrono::DateTime<rskafka::chrono::Utc>,
) -> Record {
    let headers = [
        (TXN_HEADER, message.txn.to_string().into_bytes()),
        (INDEX_HEADER, message.index.to_string().into_bytes()),
        (BATCH_HEADER, batch.as_str().as_bytes().to_vec()),
        (MATERIALIZATION_HEADER, materialization.as_bytes().to_vec()),
        (GENERATION_HEADER, generation.to_string().into_bytes()),
    ];
    Record {
        key: Some(message.key.to_vec()),
        value: Some(message.value.to_vec()),
        headers: headers
            .into_iter()
            .map(|(name, value)| (name.to_string(), value))
            .collect(),
        timestamp,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stamped_record_parses_back() {
        let message = Message {
            txn: 42,
            index: 7,
            packed_key: b"",
            key: b"{\"id\":1}",
            value: b"{\"insert\":{}}",
        };
        let generation = GenerationId::mint();
        let record = record(
            &message,
            BatchKind::Snapshot,
            "acme/views",
            generation,
            rskafka::chrono::Utc::now(),
        );
        assert_eq!(record.key.as_deref(), Some(message.key));
        assert_eq!(record.value.as_deref(), Some(message.value));
        assert_eq!(record.headers[TXN_HEADER], b"42");
        let stamp = Stamp::parse(&record.headers).unwrap();
        assert_eq!(
            stamp,
            Stamp {
                txn: 42,
                index: 7,
                batch: BatchKind::Snapshot,
                materialization: "acme/views".into(),
                generation: Some(generation),
            }
        );
        assert_eq!(stamp.tail(), Tail { txn: 42, index: 7 });
    }

    #[test]
    fn a_record_of_a_release_before_generations_has_none() {
        // Frozen: the headers the release before generations wrote.
        let headers: BTreeMap<String, Vec<u8>> = [
            (TXN_HEADER, &b"3"[..]),
            (INDEX_HEADER, b"0"),
            (BATCH_HEADER, b"delta"),
            (MATERIALIZATION_HEADER, b"m"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_vec()))
        .collect();
        assert_eq!(Stamp::parse(&headers).unwrap().generation, None);
    }

    #[test]
    fn missing_or_bad_headers_are_named() {
        let stamped = record(
            &Message {
                txn: 1,
                index: 0,
                packed_key: b"",
                key: b"",
                value: b"",
            },
            BatchKind::Delta,
            "m",
            GenerationId::mint(),
            rskafka::chrono::Utc::now(),
        );
        let without = |name: &str| {
            let mut headers = stamped.headers.clone();
            headers.remove(name);
            Stamp::parse(&headers).unwrap_err()
        };
        assert_eq!(without(TXN_HEADER), "it has no sluice-txn header");
        assert_eq!(without(INDEX_HEADER), "it has no sluice-index header");
        assert_eq!(
            without(MATERIALIZATION_HEADER),
            "it has no sluice-materialization header"
        );
        let with = |name: &str, value: &[u8]| {
            let mut headers = stamped.headers.clone();
            headers.insert(name.to_string(), value.to_vec());
            Stamp::parse(&headers).unwrap_err()
        };
        assert_eq!(
            with(INDEX_HEADER, b"-1"),
            "its sluice-index header \"-1\" is not a number"
        );
        assert_eq!(
            with(TXN_HEADER, b"\xff"),
            "its sluice-txn header is not UTF-8"
        );
        assert_eq!(
            with(BATCH_HEADER, b"full"),
            "its sluice-batch header \"full\" is neither delta nor snapshot"
        );
        assert!(
            with(GENERATION_HEADER, b"g1").contains("sluice-generation header is not a generation"),
            "{}",
            with(GENERATION_HEADER, b"g1")
        );
        assert!(Stamp::parse(&BTreeMap::new()).is_err());
    }
}
