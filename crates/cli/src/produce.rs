//! `sluice produce PIPELINE SOURCE FILE`: loads a JSON-lines file into what a source
//! reads, a Kafka topic or a NATS JetStream stream, so that trying a pipeline needs no
//! tool of the broker's own (`kafka-console-producer.sh`, the `nats` CLI).
//!
//! ```text
//!  FILE ──check every line──▶ N documents ──rewind──▶ chunks of ~4 MiB ──▶ kafka::Topic
//!  (`-`: stdin, spooled)                                              └──▶ nats::Subject
//! ```
//!
//! - Nothing is sent unless every line is a JSON document: the whole input is checked
//!   first, and a bad line is named by file and line ([`input`]).
//! - The destination is the source's own, read from the pipeline file through its
//!   kind's configuration (brokers and topic; server, stream and subject). A missing
//!   topic or stream is created for it.
//! - Each chunk is acknowledged by the broker before the next is read. This is a
//!   loader, not exactly-once: a failure partway leaves what was acknowledged sent and
//!   says how much, running again sends everything again, and the Kafka client's retry
//!   of a request whose connection broke may write that request twice.
//!
//! A chunk of ~4 MiB spreads over a topic's partitions as several concurrent requests,
//! keeps enough NATS publishes in flight, and bounds memory; progress is logged between
//! chunks, at most every [`PROGRESS_EVERY`].

mod input;
mod kafka;
mod nats;

use crate::pipeline_cmd::load;
use anyhow::{Context as _, bail};
use clap::Args;
use input::Input;
use sluice_app::registry;
use sluice_kafka::{KafkaConfig, KafkaKind};
use sluice_nats::{NatsConfig, NatsKind};
use sluice_runtime::config::{Pipeline, SourceDef};
use sluice_runtime::intake::shard_keys;
use sluice_runtime::projections::compile_collection;
use sluice_source_sdk::SourceKind;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of documents read and sent at a time.
const CHUNK_BYTES: usize = 4 << 20;

/// How often a long file's progress is logged.
const PROGRESS_EVERY: Duration = Duration::from_secs(2);

#[derive(Args)]
pub struct ProduceArgs {
    /// The pipeline file (YAML).
    pub pipeline: PathBuf,
    /// The source whose topic (kafka) or stream (nats) receives the documents.
    pub source: String,
    /// A JSON-lines file, one document a line (`-`: stdin).
    pub file: PathBuf,
    /// Kafka: the partitions of the topic when it does not exist and is created
    /// (default: 1, or enough for the partitions the source names).
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..))]
    pub partitions: Option<i32>,
    /// NATS: the subject to publish to, when the source's filter has wildcards or it
    /// has none and its stream holds several subjects.
    #[arg(long)]
    pub subject: Option<String>,
}

/// Where the documents go: a source's configuration of a kind this command sends to.
enum Target<'a> {
    Kafka(&'a KafkaConfig),
    Nats(&'a NatsConfig),
}

/// An open destination.
enum Destination {
    Kafka(kafka::Topic),
    Nats(nats::Subject),
}

impl Destination {
    fn name(&self) -> String {
        match self {
            Destination::Kafka(topic) => topic.name(),
            Destination::Nats(subject) => subject.name(),
        }
    }

    async fn send(&self, documents: Vec<Vec<u8>>) -> anyhow::Result<()> {
        match self {
            Destination::Kafka(topic) => topic.send(documents).await,
            Destination::Nats(subject) => subject.send(documents).await,
        }
    }
}

pub fn main(args: ProduceArgs) -> anyhow::Result<()> {
    let registry = registry();
    let pipeline = load(&args.pipeline, &registry)?;
    let (source, target) = target(&pipeline, &args)?;
    let mut input = Input::open(&args.file)?;
    let total = input.check()?;
    let collection = &pipeline.collections[&source.target];
    let key = &collection.key;

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let destination = runtime.block_on(async {
        anyhow::Ok(match target {
            Target::Kafka(config) => {
                // Partitioned by key range: each document's key hash as the runtime
                // routes it (its schema's defaults, its envelope).
                let key_range = match config.partitioned_by {
                    None => None,
                    Some(_) => {
                        let compiled = compile_collection(
                            &format!("collections.{}", source.target),
                            &source.target,
                            key,
                            &collection.schema,
                        )?;
                        Some(shard_keys(
                            source.envelope,
                            Arc::new(compiled),
                            [(0, u32::MAX)],
                        ))
                    }
                };
                let topic = kafka::Topic::open(config, key, key_range, args.partitions);
                Destination::Kafka(topic.await?)
            }
            Target::Nats(config) => {
                Destination::Nats(nats::Subject::open(config, args.subject.as_deref()).await?)
            }
        })
    })?;
    let to = destination.name();
    let (mut sent, mut logged) = (0, Instant::now());
    loop {
        // Read on this thread, between sends: no file I/O on the runtime's worker.
        let chunk = input.next_chunk(CHUNK_BYTES)?;
        if chunk.is_empty() {
            break;
        }
        let count = chunk.len() as u64;
        (runtime.block_on(destination.send(chunk))).with_context(|| {
            format!("sending to {to} failed after {sent} of {total} documents were acknowledged")
        })?;
        sent += count;
        if logged.elapsed() >= PROGRESS_EVERY && sent < total {
            tracing::info!("sent {sent} of {total} documents to {to}");
            logged = Instant::now();
        }
    }
    let documents = if sent == 1 { "document" } else { "documents" };
    println!("sent {sent} {documents} to {to} ({})", args.source);
    Ok(())
}

/// The source `args` name and where it reads from, if this command sends there and
/// the flags given fit its kind.
fn target<'a>(
    pipeline: &'a Pipeline,
    args: &ProduceArgs,
) -> anyhow::Result<(&'a SourceDef, Target<'a>)> {
    let Some(source) = pipeline.sources.get(&args.source) else {
        let names: Vec<&str> = pipeline.sources.keys().map(String::as_str).collect();
        bail!(
            "pipeline file {} has no source {:?} (its sources: {})",
            args.pipeline.display(),
            args.source,
            names.join(", ")
        );
    };
    let kind = source.config.kind();
    let target = if let Some(config) = source.config.get::<KafkaConfig>() {
        Target::Kafka(config)
    } else if let Some(config) = source.config.get::<NatsConfig>() {
        Target::Nats(config)
    } else {
        bail!(
            "source {} is a {kind} source: `sluice produce` sends to {} and {} sources only",
            args.source,
            KafkaKind::NAME,
            NatsKind::NAME
        );
    };
    match (&target, &args.partitions, &args.subject) {
        (Target::Nats(_), Some(_), _) => bail!("--partitions is for a kafka source"),
        (Target::Kafka(_), _, Some(_)) => bail!("--subject is for a nats source"),
        _ => Ok((source, target)),
    }
}
