//! One connection attempt of our own after rskafka failed to connect, to learn what its
//! joined error text hides: with `tls`, the TLS handshake (a certificate that does not
//! verify fails naming its issuer); without, whether the broker answers a plain Kafka
//! request with a TLS alert (a TLS listener does: the client must use TLS).
//!
//! Each step is bounded by [`PROBE_FOR`]; a broker that cannot be reached, or answers
//! nothing, explains nothing here (rskafka's error stands, and is retried).

use crate::ConnectError;
use sluice_tls::TlsConnector;
use sluice_tls::rustls::ClientConfig;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::timeout;

/// How long each step of the probe waits.
const PROBE_FOR: Duration = Duration::from_secs(5);

/// ApiVersions v0 from client `sluice`, correlation id 1: the first request every Kafka
/// client sends, and the one a broker answers before authentication.
const API_VERSIONS: [u8; 20] = [
    0, 0, 0, 16, // size of what follows
    0, 18, 0, 0, // api key 18 (ApiVersions), version 0
    0, 0, 0, 1, // correlation id
    0, 6, b's', b'l', b'u', b'i', b'c', b'e', // client id
];

/// A refusal of the first broker that accepts a TCP connection, if its transport
/// explains one.
pub(crate) async fn transport(
    brokers: &[String],
    tls: Option<&Arc<ClientConfig>>,
) -> Option<ConnectError> {
    for broker in brokers {
        let Ok(Ok(stream)) = timeout(PROBE_FOR, TcpStream::connect(broker)).await else {
            continue;
        };
        return match tls {
            Some(config) => handshake(broker, stream, config).await,
            None => plain(broker, stream).await,
        };
    }
    None
}

async fn handshake(
    broker: &str,
    stream: TcpStream,
    config: &Arc<ClientConfig>,
) -> Option<ConnectError> {
    let host = host_of(broker);
    let name = match sluice_tls::server_name(host) {
        Ok(name) => name,
        Err(e) => return Some(ConnectError::Refused(format!("brokers: {}", e.message))),
    };
    let connecting = TlsConnector::from(config.clone()).connect(name, stream);
    match timeout(PROBE_FOR, connecting).await {
        Ok(Ok(_)) | Err(_) => None,
        Ok(Err(error)) => Some(match sluice_tls::handshake_failure(&error) {
            Some(why) => ConnectError::Refused(format!("broker {broker}: {why}")),
            None => ConnectError::Failed(format!(
                "broker {broker} ended the TLS handshake ({error}): does it listen for \
                 TLS on that port?"
            )),
        }),
    }
}

async fn plain(broker: &str, mut stream: TcpStream) -> Option<ConnectError> {
    let answer = async {
        stream.write_all(&API_VERSIONS).await?;
        let mut first = [0u8; 2];
        stream.read_exact(&mut first).await.map(|_| first)
    };
    match timeout(PROBE_FOR, answer).await {
        Ok(Ok(first)) if is_tls_record(&first) => Some(ConnectError::Refused(format!(
            "broker {broker} answered plain Kafka with TLS: it requires TLS; set tls \
             (tls: {{ca: <the CA file its certificate chains to>}})"
        ))),
        _ => None,
    }
}

/// Whether `bytes` begin a TLS record (an alert or a handshake, TLS 1.x), which no
/// Kafka answer does: its size would be over 350 MB.
fn is_tls_record(bytes: &[u8]) -> bool {
    matches!(bytes, [0x15 | 0x16, 0x03, ..])
}

/// The host of `host:port` (`[::1]:9092` gives `::1`).
fn host_of(broker: &str) -> &str {
    let host = broker.rsplit_once(':').map_or(broker, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tls_alert_is_told_from_a_kafka_answer() {
        assert!(is_tls_record(&[0x15, 0x03, 0x03, 0x00, 0x02]));
        assert!(is_tls_record(&[0x16, 0x03]));
        // A Kafka answer starts with its size: small, so its first byte is 0.
        assert!(!is_tls_record(&[0x00, 0x00, 0x01, 0x2C]));
        assert!(!is_tls_record(&[0x15]));
    }

    #[test]
    fn the_host_is_what_the_certificate_must_name() {
        assert_eq!(host_of("localhost:9093"), "localhost");
        assert_eq!(host_of("[::1]:9093"), "::1");
        assert_eq!(host_of("kafka.example.com:9093"), "kafka.example.com");
    }

    #[test]
    fn the_request_is_as_long_as_it_says() {
        assert_eq!(API_VERSIONS.len(), 4 + usize::from(API_VERSIONS[3]));
    }
}
