//! Logging: text or JSON lines on stderr, filtered by `RUST_LOG`, each line redacted
//! ([`sluice_source_sdk::redact`]) on its way out, so that a secret a connector or a
//! client library puts into a message (a URL with its password) never reaches the log.
//! The runtime's spans (`materialization`, `txn`) give every line of a
//! materialization's work its materialization, shard and transaction.

use sluice_source_sdk::redact::redact;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use tracing_subscriber::EnvFilter;

/// What is logged without `RUST_LOG`: our own information, and the client libraries'
/// warnings only (async-nats and tokio-postgres log every connection and server
/// notice). rskafka warns at each of its own reconnection attempts, several a second
/// against a broker that is down: the source's error, retried by the loop, names the
/// cause once per attempt instead.
const DEFAULT_LOG: &str = "info,rskafka=error,async_nats=warn,tokio_postgres=warn";

#[derive(Debug, Clone, Copy, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines, the spans' fields before the message.
    #[default]
    Text,
    /// One JSON object a line: timestamp, level, target, message and fields, and
    /// `spans` (each with its name and fields).
    Json,
}

/// The logging option every sluice binary takes.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct LogArgs {
    /// How log lines are written to stderr: `text`, or `json` (one object a line).
    #[arg(
        long,
        global = true,
        value_enum,
        default_value_t,
        env = "SLUICE_LOG_FORMAT"
    )]
    pub log_format: LogFormat,
}

/// Installs the global subscriber.
fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG));
    // Colours only for a person at a terminal, never into a log file or a journal.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(|| RedactedStderr);
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

/// Runs a binary's command with logging installed; its error, if any, is the last line
/// written (see [`final_error`]) and makes the exit code a failure.
pub fn run(format: LogFormat, command: impl FnOnce() -> anyhow::Result<()>) -> ExitCode {
    init(format);
    match command() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            final_error(format, &error_chain(&err));
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes on one line, skipping a cause whose text its parent already
/// includes.
fn error_chain(err: &anyhow::Error) -> String {
    let mut text = err.to_string();
    for cause in err.chain().skip(1) {
        let cause = cause.to_string();
        if !text.contains(&cause) {
            text.push_str(": ");
            text.push_str(&cause);
        }
    }
    text
}

/// The error a command ends with, as its last line: `error: …` as text, or a JSON line
/// of level `ERROR` like every other (so a log collector reading JSON parses it too).
fn final_error(format: LogFormat, chain: &str) {
    match format {
        LogFormat::Text => eprintln!("error: {}", redact(chain)),
        LogFormat::Json => tracing::error!(target: "sluice", "{chain}"),
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
