//! `sluice bench outputs`: what Sluice's exactly-once publishing of a materialization's
//! changes costs against a plain producer sending the same bytes, per destination and
//! format, in the same run:
//!
//! ```text
//!  datagen pageviews ─▶ pageviews.jsonl ─▶ sluice run ─▶ Kafka topic (4 partitions),
//!                                                    │   NATS subject, files folder
//!                                                    │  the messages it holds, read back
//!                                                    └─▶ plain producer, same client ─▶
//!                                                        a topic, subject, folder of its own
//! ```
//!
//! Sluice is timed from its start to its exit: reading and parsing the input, reducing
//! it per key and transaction, the output's local view, encoding, publishing. The
//! baseline is timed from its first send to its last acknowledgement, the very
//! messages Sluice sent already in memory, their headers included (a broker's cost
//! depends on them):
//!
//! - Kafka: rskafka, each record to the partition Sluice put it in, produce requests
//!   of at most 512 KiB (the output's), one at a time per partition, the partitions at
//!   once.
//! - NATS: async-nats JetStream publishes of the messages (their `Nats-Msg-Id` and
//!   `Sluice-*` headers too), acknowledgements pipelined (`sluice_nats::admin`).
//! - files: each of Sluice's batch files written again under the same name, buffered,
//!   then fsync'ed.
//!
//! Figures per case: the messages and MB published (keys and values as the
//! destination holds them; NATS and files hold values only), messages/s and MB/s of
//! each, `ratio` (Sluice over the baseline), and `ratio_phases`: Sluice's Store and
//! Commit phases alone (from the run's `transaction committed` lines: view, encoding,
//! publishing), what the baseline is the limit of. Top level: `ratio_kafka`,
//! `ratio_nats`, `ratio_files`, and `ratio_phases_kafka`, `ratio_phases_nats` (the
//! JSON-lines cases), the target being ≥ 0.8. Files
//! take JSON lines only (a file holds lines, Avro datums are not): their Avro case is
//! skipped, saying so. Topics and streams have unique names and are deleted at the
//! end, also when a case fails.

use super::iceberg::write_pageviews;
use super::loads::sink_secs;
use super::loads::sluice_run;
use super::sql::PAGEVIEWS_COLLECTION;
use anyhow::{Context, Error, ensure};
use futures::future::try_join_all;
use rskafka::client::ClientBuilder;
use rskafka::client::error::ProtocolError;
use rskafka::client::partition::{Compression, UnknownTopicHandling};
use rskafka::record::Record;
use serde_json::{Value, json};
use sluice_files_output::parse_batch_file_name;
use sluice_kafka::admin as kafka;
use sluice_nats::admin as nats;
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tokio::runtime::Runtime;

/// Partitions of the bench's topics.
const PARTITIONS: i32 = 4;
/// Bytes of records per produce request of the Kafka baseline, as the kafka output's.
const PRODUCE_BYTES: usize = 512 << 10;

#[derive(clap::Args)]
pub struct OutputsArgs {
    /// Documents in the input.
    #[arg(long, default_value_t = 1_000_000)]
    docs: u64,
    /// Distinct keys among them.
    #[arg(long, default_value_t = 200_000)]
    keys: u64,
    /// Destinations measured, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_values_t = [Destination::Kafka, Destination::Nats, Destination::Files]
    )]
    targets: Vec<Destination>,
    /// Message formats measured, comma-separated.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = [Format::Json, Format::Avro])]
    formats: Vec<Format>,
    /// The Kafka broker (topics of unique names are created, then deleted).
    #[arg(long, default_value = "127.0.0.1:9092")]
    kafka: String,
    /// The NATS server (streams of unique names are created, then deleted).
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Keep the bench's folder (input, pipelines, run logs, files written).
    #[arg(long)]
    keep: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Destination {
    Kafka,
    Nats,
    Files,
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Destination::Kafka => "kafka",
            Destination::Nats => "nats",
            Destination::Files => "files",
        })
    }
}

/// A binding's `format`, as its resource names it.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Format {
    Json,
    Avro,
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Format::Json => "json",
            Format::Avro => "avro",
        })
    }
}

/// What Sluice published in one case, and how long the baseline took to send it again.
struct Published {
    messages: u64,
    bytes: u64,
    baseline_secs: f64,
}

/// One destination and format's figures.
struct Case {
    destination: Destination,
    format: Format,
    published: Published,
    sluice_secs: f64,
    phases_secs: f64,
}

impl Case {
    fn per_sec(&self, secs: f64) -> (f64, f64) {
        let secs = secs.max(1e-9);
        (
            self.published.messages as f64 / secs,
            self.published.bytes as f64 / 1e6 / secs,
        )
    }

    /// Sluice's messages/s over the baseline's (the bytes are the same).
    fn ratio(&self) -> f64 {
        self.published.baseline_secs / self.sluice_secs.max(1e-9)
    }

    fn ratio_phases(&self) -> f64 {
        self.published.baseline_secs / self.phases_secs.max(1e-9)
    }

    fn to_json(&self) -> Value {
        let (sluice_msgs, sluice_mb) = self.per_sec(self.sluice_secs);
        let (phases_msgs, phases_mb) = self.per_sec(self.phases_secs);
        let (baseline_msgs, baseline_mb) = self.per_sec(self.published.baseline_secs);
        json!({
            "target": self.destination.to_string(),
            "format": self.format.to_string(),
            "messages": self.published.messages,
            "mb": self.published.bytes as f64 / 1e6,
            "sluice_secs": self.sluice_secs,
            "sluice_msgs_per_sec": sluice_msgs,
            "sluice_mb_per_sec": sluice_mb,
            "phases_secs": self.phases_secs,
            "phases_msgs_per_sec": phases_msgs,
            "phases_mb_per_sec": phases_mb,
            "baseline_secs": self.published.baseline_secs,
            "baseline_msgs_per_sec": baseline_msgs,
            "baseline_mb_per_sec": baseline_mb,
            "ratio": self.ratio(),
            "ratio_phases": self.ratio_phases(),
        })
    }
}

pub fn run(args: OutputsArgs) -> anyhow::Result<()> {
    ensure!(
        args.docs > 0 && args.keys > 0,
        "--docs and --keys must be at least 1"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .subsec_nanos();
    let tag = format!("{}-{nanos:x}", std::process::id());
    let work = std::env::temp_dir().join(format!("sluice-bench-outputs-{tag}"));
    std::fs::create_dir_all(&work).with_context(|| format!("creating {}", work.display()))?;
    let mut created = Created::default();
    let result = cases(&args, &runtime, &tag, &work, &mut created);
    let cleanup = runtime.block_on(created.delete(&args));
    if args.keep {
        eprintln!("kept {}", work.display());
    } else {
        let _ = std::fs::remove_dir_all(&work);
    }
    let cases = result?;
    cleanup?;
    report(&args, &cases);
    Ok(())
}

fn progress(args: &OutputsArgs, line: impl AsRef<str>) {
    if !args.json {
        eprintln!("{}", line.as_ref());
    }
}

/// The topics and streams the bench created (or may have: a name is noted before its
/// creation is asked for), to delete at the end.
#[derive(Default)]
struct Created {
    topics: Vec<String>,
    streams: Vec<String>,
}

impl Created {
    /// Deletes them all; every failure is named after trying every one.
    async fn delete(&self, args: &OutputsArgs) -> anyhow::Result<()> {
        let mut failures = Vec::new();
        if !self.topics.is_empty() {
            match kafka::Admin::connect(std::slice::from_ref(&args.kafka)).await {
                Ok(admin) => {
                    for topic in &self.topics {
                        match admin.delete_topic(topic).await {
                            // Never created, or gone already: tansu 0.6.0 drops every
                            // topic when one is deleted.
                            Ok(())
                            | Err(kafka::Error::ServerError {
                                protocol_error: ProtocolError::UnknownTopicOrPartition,
                                ..
                            }) => {}
                            Err(err) => failures.push(format!("deleting topic {topic}: {err}")),
                        }
                    }
                }
                Err(err) => failures.push(format!("connecting to delete topics: {err}")),
            }
        }
        if !self.streams.is_empty() {
            match nats::Admin::connect(&args.nats).await {
                Ok(admin) => {
                    for stream in &self.streams {
                        if let Err(err) = admin.delete_stream(stream).await {
                            failures.push(format!("deleting stream {stream}: {err}"));
                        }
                    }
                }
                Err(err) => failures.push(format!("connecting to delete streams: {err}")),
            }
        }
        ensure!(
            failures.is_empty(),
            "cleaning up at {} and {}: {}",
            args.kafka,
            args.nats,
            failures.join("; ")
        );
        Ok(())
    }
}

fn cases(
    args: &OutputsArgs,
    runtime: &Runtime,
    tag: &str,
    work: &Path,
    created: &mut Created,
) -> anyhow::Result<Vec<Case>> {
    progress(args, format!("writing {} documents", args.docs));
    let input = work.join("pageviews.jsonl");
    write_pageviews(&input, args.docs, args.keys)?;
    let mut cases = Vec::new();
    for &destination in &args.targets {
        for &format in &args.formats {
            if destination == Destination::Files && format == Format::Avro {
                eprintln!(
                    "files avro: skipped (a file holds lines, and Avro datums are not \
                     line-oriented: the files output refuses them)"
                );
                continue;
            }
            let placed = Placed {
                destination,
                format,
                names: Names::new(tag, format),
                dir: work.join(format!("{destination}-{format}")),
            };
            let case = placed.measure(args, runtime, &input, created)?;
            let (sluice, _) = case.per_sec(case.sluice_secs);
            let (baseline, _) = case.per_sec(case.published.baseline_secs);
            progress(
                args,
                format!(
                    "{destination} {format}: {} messages, sluice {sluice:.0} msgs/s, \
                     baseline {baseline:.0} msgs/s, ratio {:.2}",
                    case.published.messages,
                    case.ratio()
                ),
            );
            cases.push(case);
        }
    }
    Ok(cases)
}

/// The unique names of one format's topics, subjects and streams: Sluice's and the
/// baseline's.
struct Names {
    topic: String,
    baseline_topic: String,
    subject: String,
    stream: String,
    baseline_subject: String,
    baseline_stream: String,
}

impl Names {
    fn new(tag: &str, format: Format) -> Names {
        let subject = format!("sluice.outputs.{tag}.{format}");
        let stream = format!("SLUICE_OUTPUTS_{tag}_{format}").replace('-', "_");
        Names {
            topic: format!("sluice-outputs-{tag}-{format}"),
            baseline_topic: format!("sluice-outputs-{tag}-{format}-baseline"),
            baseline_subject: format!("{subject}.baseline"),
            baseline_stream: format!("{stream}_BASELINE"),
            subject,
            stream,
        }
    }
}

/// One case and where it writes.
struct Placed {
    destination: Destination,
    format: Format,
    names: Names,
    /// Its folder: pipeline, run log, files written.
    dir: PathBuf,
}

impl Placed {
    /// Runs Sluice into the destination, then the baseline with what it wrote.
    fn measure(
        &self,
        args: &OutputsArgs,
        runtime: &Runtime,
        input: &Path,
        created: &mut Created,
    ) -> anyhow::Result<Case> {
        let Placed {
            destination,
            format,
            names,
            dir,
        } = self;
        std::fs::create_dir_all(dir)?;
        let (endpoint, mut resource) = match destination {
            Destination::Kafka => {
                created.topics.push(names.topic.clone());
                (
                    json!({"kafka": {"brokers": [args.kafka]}}),
                    json!({"topic": names.topic, "partitions": PARTITIONS}),
                )
            }
            Destination::Nats => {
                created.streams.push(names.stream.clone());
                (
                    json!({"nats": {"url": args.nats, "stream": names.stream}}),
                    json!({"subject": names.subject}),
                )
            }
            Destination::Files => (
                json!({"files": {"directory": dir.join("sluice")}}),
                json!({"path": "pageviews"}),
            ),
        };
        resource["format"] = json!(format.to_string());
        let pipeline = dir.join("pipeline.yaml");
        std::fs::write(
            &pipeline,
            format!(
                "{PAGEVIEWS_COLLECTION}sources:
  file:
    target: bench/pageviews
    file: {{path: {input}, format: json}}
materializations:
  outputs-{destination}-{format}:
    endpoint: {endpoint}
    bindings:
      - source: bench/pageviews
        resource: {resource}
",
                input = json!(input.to_string_lossy()),
            ),
        )?;
        progress(args, format!("{destination} {format}: sluice run"));
        let log = dir.join("run.log");
        let run = sluice_run(&pipeline, &log)?;
        let phases_secs = sink_secs(&std::fs::read_to_string(&log)?)?;
        progress(
            args,
            format!("{destination} {format}: reading back, then the baseline"),
        );
        let published = match destination {
            Destination::Kafka => {
                created.topics.push(names.baseline_topic.clone());
                runtime.block_on(kafka_baseline(&args.kafka, names))?
            }
            Destination::Nats => {
                created.streams.push(names.baseline_stream.clone());
                runtime.block_on(nats_baseline(&args.nats, names))?
            }
            Destination::Files => {
                files_baseline(&dir.join("sluice").join("pageviews"), &dir.join("baseline"))?
            }
        };
        ensure!(
            published.messages > 0,
            "{destination} {format}: sluice published no message"
        );
        Ok(Case {
            destination: *destination,
            format: *format,
            published,
            sluice_secs: run.elapsed.as_secs_f64(),
            phases_secs,
        })
    }
}

/// Sluice's topic read back, then its messages (keys and values) produced again to the
/// baseline topic, each to the partition it was in.
async fn kafka_baseline(broker: &str, names: &Names) -> anyhow::Result<Published> {
    let brokers = [broker.to_string()];
    let written = sluice_kafka_output::read::read_topic(&brokers, &names.topic)
        .await
        .with_context(|| format!("reading topic {} back", names.topic))?;
    let admin = kafka::Admin::connect(&brokers)
        .await
        .with_context(|| format!("connecting to Kafka at {broker}"))?;
    admin
        .create_topic(&names.baseline_topic, PARTITIONS)
        .await
        .with_context(|| format!("creating topic {} at {broker}", names.baseline_topic))?;
    let (messages, bytes) = (
        written.len() as u64,
        (written.iter())
            .map(|w| (w.key.len() + w.value.len()) as u64)
            .sum(),
    );
    // Each partition's messages as produce requests, built before the clock starts.
    let timestamp = rskafka::chrono::Utc::now();
    let mut requests: Vec<Vec<Vec<Record>>> = vec![vec![Vec::new()]; PARTITIONS as usize];
    let mut request_bytes = vec![0; PARTITIONS as usize];
    for message in written {
        let p = message.partition as usize;
        let stamp = &message.stamp;
        let record = sluice_kafka_output::stamp::record(
            &sluice_output_sdk::Message {
                txn: stamp.txn,
                index: stamp.index,
                packed_key: b"",
                key: &message.key,
                value: &message.value,
            },
            stamp.batch,
            &stamp.materialization,
            stamp
                .generation
                .expect("Sluice's messages name their generation"),
            timestamp,
        );
        let size = record.approximate_size();
        if request_bytes[p] + size > PRODUCE_BYTES && request_bytes[p] > 0 {
            requests[p].push(Vec::new());
            request_bytes[p] = 0;
        }
        request_bytes[p] += size;
        requests[p].last_mut().expect("a request").push(record);
    }
    let client = ClientBuilder::new(brokers.to_vec())
        .build()
        .await
        .with_context(|| format!("connecting to Kafka at {broker}"))?;
    let partitions = (0..PARTITIONS).map(|p| {
        client.partition_client(names.baseline_topic.clone(), p, UnknownTopicHandling::Retry)
    });
    let partitions = try_join_all(partitions)
        .await
        .with_context(|| format!("connecting to topic {}", names.baseline_topic))?;
    let started = Instant::now();
    let producing = partitions
        .iter()
        .zip(requests)
        .map(|(partition, requests)| async move {
            for request in requests.into_iter().filter(|r| !r.is_empty()) {
                partition
                    .produce(request, Compression::NoCompression)
                    .await?;
            }
            Ok::<_, rskafka::client::error::Error>(())
        });
    try_join_all(producing)
        .await
        .with_context(|| format!("producing to topic {}", names.baseline_topic))?;
    Ok(Published {
        messages,
        bytes,
        baseline_secs: started.elapsed().as_secs_f64(),
    })
}

/// Sluice's subject read back, then its payloads published again to the baseline's
/// subject, in a stream of its own.
async fn nats_baseline(url: &str, names: &Names) -> anyhow::Result<Published> {
    let stored = sluice_nats_output::read::read_subject(url, &names.subject)
        .await
        .with_context(|| format!("reading subject {} back", names.subject))?;
    let admin = nats::Admin::connect(url)
        .await
        .map_err(Error::from_boxed)
        .with_context(|| format!("connecting to NATS at {url}"))?;
    admin
        .create_stream(&names.baseline_stream, &[names.baseline_subject.as_str()])
        .await
        .map_err(Error::from_boxed)
        .with_context(|| format!("creating stream {} at {url}", names.baseline_stream))?;
    // The very messages Sluice published, headers included (`Nats-Msg-Id`, which the
    // server checks against its duplicate window, the `Sluice-*` stamp, and the fence's
    // `Nats-Expected-Last-*`: each follows the one before it, as on a fresh stream of
    // the subject alone, so the server does the same checking work for the baseline).
    let messages: Vec<_> = stored.into_iter().map(|m| (m.headers, m.payload)).collect();
    let (messages, bytes, sent) = (
        messages.len() as u64,
        messages.iter().map(|(_, p)| p.len() as u64).sum(),
        messages,
    );
    let started = Instant::now();
    admin
        .publish_batch_with_headers(&names.baseline_subject, sent)
        .await
        .map_err(Error::from_boxed)
        .with_context(|| format!("publishing to subject {}", names.baseline_subject))?;
    Ok(Published {
        messages,
        bytes,
        baseline_secs: started.elapsed().as_secs_f64(),
    })
}

/// Sluice's batch files in `folder`, then each written again into `baseline` (same
/// name, same bytes): buffered writes, then an fsync per file, as the output does
/// before it renames a batch into place.
fn files_baseline(folder: &Path, baseline: &Path) -> anyhow::Result<Published> {
    let mut batches: Vec<(String, Vec<u8>)> = Vec::new();
    for entry in
        std::fs::read_dir(folder).with_context(|| format!("listing {}", folder.display()))?
    {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if parse_batch_file_name(&name).is_some() {
            let path = folder.join(&name);
            let bytes =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            batches.push((name, bytes));
        }
    }
    batches.sort();
    std::fs::create_dir_all(baseline)
        .with_context(|| format!("creating {}", baseline.display()))?;
    let paths: Vec<PathBuf> = batches
        .iter()
        .map(|(name, _)| baseline.join(name))
        .collect();
    let started = Instant::now();
    for ((_, bytes), path) in batches.iter().zip(&paths) {
        let write = || -> std::io::Result<()> {
            let mut file =
                std::io::BufWriter::with_capacity(256 << 10, std::fs::File::create(path)?);
            file.write_all(bytes)?;
            file.into_inner()?.sync_all()
        };
        write().with_context(|| format!("writing {}", path.display()))?;
    }
    let baseline_secs = started.elapsed().as_secs_f64();
    Ok(Published {
        // Files take line-oriented formats only: a message is a line.
        messages: batches
            .iter()
            .map(|(_, bytes)| bytes.iter().filter(|&&b| b == b'\n').count() as u64)
            .sum(),
        bytes: batches.iter().map(|(_, bytes)| bytes.len() as u64).sum(),
        baseline_secs,
    })
}

fn report(args: &OutputsArgs, cases: &[Case]) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let json_case = |destination: Destination| {
        (cases.iter()).find(|c| c.destination == destination && c.format == Format::Json)
    };
    let ratio_of = |destination| json_case(destination).map(Case::ratio);
    let phases_of = |destination| json_case(destination).map(Case::ratio_phases);
    if args.json {
        println!(
            "{}",
            json!({
                "docs": args.docs,
                "keys": args.keys,
                "cores": cores,
                "cases": cases.iter().map(Case::to_json).collect::<Vec<_>>(),
                "ratio_kafka": ratio_of(Destination::Kafka),
                "ratio_nats": ratio_of(Destination::Nats),
                "ratio_files": ratio_of(Destination::Files),
                "ratio_phases_kafka": phases_of(Destination::Kafka),
                "ratio_phases_nats": phases_of(Destination::Nats),
            })
        );
        return;
    }
    println!(
        "{} documents over {} keys, {cores} cores; ratio: Sluice end to end over the \
         baseline (target ≥ 0.8), phases: its Store and Commit phases alone",
        args.docs, args.keys
    );
    println!(
        "  {:<6} {:<5} {:>9} {:>8} {:>14} {:>8} {:>14} {:>8} {:>6} {:>7}",
        "target",
        "format",
        "messages",
        "MB",
        "sluice msg/s",
        "MB/s",
        "baseline msg/s",
        "MB/s",
        "ratio",
        "phases"
    );
    for case in cases {
        let (sluice_msgs, sluice_mb) = case.per_sec(case.sluice_secs);
        let (baseline_msgs, baseline_mb) = case.per_sec(case.published.baseline_secs);
        println!(
            "  {:<6} {:<5} {:>9} {:>8.1} {sluice_msgs:>14.0} {sluice_mb:>8.1} \
             {baseline_msgs:>14.0} {baseline_mb:>8.1} {:>6.2} {:>7.2}",
            case.destination.to_string(),
            case.format.to_string(),
            case.published.messages,
            case.published.bytes as f64 / 1e6,
            case.ratio(),
            case.ratio_phases()
        );
    }
}
