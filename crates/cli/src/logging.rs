//! Logging: text or JSON lines on stderr, filtered by `RUST_LOG`, each line redacted
//! ([`sluice_source_sdk::redact`]) on its way out, so that a secret a connector or a
//! client library puts into a message (a URL with its password) never reaches the log.
//! The runtime's spans (`materialization`, `txn`) give every line of a
//! materialization's work its materialization, shard and transaction.

use sluice_source_sdk::redact::redact;
use std::io::{IsTerminal, Write};
use tracing_subscriber::EnvFilter;

/// What is logged without `RUST_LOG`: our own information, and the client libraries'
/// warnings only (rskafka, async-nats and tokio-postgres log every connection and server
/// notice).
const DEFAULT_LOG: &str = "info,rskafka=warn,async_nats=warn,tokio_postgres=warn";

#[derive(Debug, Clone, Copy, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines, the spans' fields before the message.
    #[default]
    Text,
    /// One JSON object a line: timestamp, level, target, message and fields, and
    /// `spans` (each with its name and fields).
    Json,
}

/// Installs the global subscriber.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| RedactedStderr)
        // Colours only on a terminal: a log file or a service manager's journal gets
        // plain text.
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(true)
            .init(),
    }
}

/// Stderr, with secrets redacted from what is written. The fmt layer writes each event
/// in one `write_all` of the whole line, which one `write` here takes entirely, so a
/// secret is never split between two writes.
struct RedactedStderr;

impl Write for RedactedStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let line = String::from_utf8_lossy(buf);
        std::io::stderr()
            .lock()
            .write_all(redact(&line).as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}
