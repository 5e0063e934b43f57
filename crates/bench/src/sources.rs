//! `sluice bench sources`: what reading from a log broker costs against reading a file.
//! The same documents, preloaded into each of the three inputs, are materialized into
//! PostgreSQL by one `sluice run` each, in the same run of the bench:
//!
//! ```text
//!  datagen pageviews ─┬─▶ pageviews.jsonl                ─▶ sluice run ─▶ table file
//!  (the same text)    ├─▶ Kafka topic of 4 partitions    ─▶ sluice run ─▶ table kafka
//!                     └─▶ NATS JetStream stream          ─▶ sluice run ─▶ table nats
//! ```
//!
//! Each run is the `sluice` binary itself (as in `bench loads`), timed from its start
//! to its exit, which comes once its source has caught up with what it was given.
//! Figures: `file_docs_per_sec`, `kafka_docs_per_sec`, `nats_docs_per_sec`, and
//! `ratio_kafka`, `ratio_nats` (each over the file's), plus `exact` per input: its
//! table holds one row per key and the views generated. Preloading is not timed.
//!
//! The Kafka run has a second baseline, the consumer a user would pick instead:
//! librdkafka (Python's confluent-kafka, `kafka_consume.py`) reading the same topic from
//! the same broker in the same run, every partition from its start, counting values.
//! Figures: `kafka_consumer_docs_per_sec` and `ratio_kafka_consumer` (Sluice's whole
//! pipeline into PostgreSQL over the bare consumer).
//!
//! The brokers are the shared ones by default (a topic and a stream of unique names,
//! deleted at the end, as is the PostgreSQL schema, also when a run fails). Documents
//! are [`pageview`]s, written with their own JSON writer; a document goes to the Kafka
//! partition of its key, its key as the record's key.

use super::loads::sluice_run;
use super::sql::PAGEVIEWS_COLLECTION;
use anyhow::{Context, Error, bail, ensure};
use bytes::Bytes;
use serde_json::json;
use sluice_datagen::pageview;
use sluice_kafka::admin as kafka;
use sluice_nats::admin as nats;
use sluice_postgres::sql::quote_ident;
use std::collections::HashSet;
use std::io::Write;
use std::path::Path;
use tokio_postgres::NoTls;

/// The generator's seed.
const SEED: u64 = 7;
/// Partitions of the bench's topic.
const PARTITIONS: i32 = 4;
/// Documents per produce or publish call while preloading.
const BATCH: usize = 10_000;
/// The librdkafka baseline (see the module docs).
const CONSUME_PY: &str = include_str!("kafka_consume.py");

#[derive(clap::Args)]
pub struct SourcesArgs {
    /// Documents preloaded into each input.
    #[arg(long, default_value_t = 1_000_000)]
    docs: u64,
    /// Distinct keys among them.
    #[arg(long, default_value_t = 200_000)]
    keys: u64,
    /// The PostgreSQL server (a schema of a unique name is created, then dropped).
    #[arg(
        long,
        default_value = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
    )]
    url: String,
    /// The Kafka broker (a topic of a unique name is created, then deleted).
    #[arg(long, default_value = "127.0.0.1:9092")]
    kafka: String,
    /// The NATS server (a stream of a unique name is created, then deleted).
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
    /// Keep the bench's folder (input file, pipelines, recovery logs, run logs).
    #[arg(long)]
    keep: bool,
}

/// The three inputs, in the order they run.
const INPUTS: [&str; 3] = ["file", "kafka", "nats"];

/// What one input's run measured.
struct Figure {
    secs: f64,
    exact: Result<(), String>,
}

impl Figure {
    fn docs_per_sec(&self, docs: u64) -> f64 {
        docs as f64 / self.secs.max(1e-9)
    }
}

/// The names of everything the bench creates, unique to this run.
struct Names {
    schema: String,
    topic: String,
    stream: String,
    subject: String,
}

pub fn run(args: SourcesArgs) -> anyhow::Result<()> {
    ensure!(
        args.docs > 0 && args.keys > 0,
        "--docs and --keys must be at least 1"
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(bench(&args))
}

async fn bench(args: &SourcesArgs) -> anyhow::Result<()> {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .subsec_nanos();
    let tag = format!("{}_{nanos:x}", std::process::id());
    let names = Names {
        schema: format!("sluice_sources_{tag}"),
        topic: format!("sluice-sources-{tag}"),
        stream: format!("SLUICE_SOURCES_{tag}"),
        subject: format!("sluice.sources.{tag}"),
    };
    let (client, connection) = tokio_postgres::connect(&args.url, NoTls)
        .await
        .context("connecting to the server given by --url")?;
    tokio::spawn(connection);
    client
        .batch_execute(&format!("CREATE SCHEMA {}", quote_ident(&names.schema)))
        .await?;
    let work = std::env::temp_dir().join(&names.schema);
    let result = runs(args, &client, &names, &work).await;
    let cleanup = cleanup(args, &client, &names).await;
    if args.keep {
        eprintln!("kept {}", work.display());
    } else {
        let _ = std::fs::remove_dir_all(&work);
    }
    let figures = result?;
    cleanup?;
    report(args, &figures);
    for (input, figure) in INPUTS.iter().zip(&figures) {
        if let Err(differs) = &figure.exact {
            bail!("the {input} table is not the reduction of the input: {differs}");
        }
    }
    Ok(())
}

async fn runs(
    args: &SourcesArgs,
    client: &tokio_postgres::Client,
    names: &Names,
    work: &Path,
) -> anyhow::Result<Vec<Figure>> {
    std::fs::create_dir_all(work)?;
    let input = work.join("pageviews.jsonl");
    progress(args, format!("preloading {} documents", args.docs));
    let expected = preload(args, names, &input).await?;
    let mut figures = Vec::new();
    for name in INPUTS {
        let source = match name {
            "file" => format!(
                "file: {{path: {}, format: json}}",
                json!(input.to_string_lossy())
            ),
            "kafka" => format!(
                "kafka: {{brokers: [{}], topic: {}, start: earliest, format: json, meta: null}}",
                json!(args.kafka),
                json!(names.topic)
            ),
            _ => format!(
                "nats: {{url: {}, stream: {}, start: first, meta: null}}",
                json!(args.nats),
                json!(names.stream)
            ),
        };
        let dir = work.join(name);
        std::fs::create_dir_all(&dir)?;
        let pipeline = dir.join("pipeline.yaml");
        std::fs::write(
            &pipeline,
            pipeline_yaml(&args.url, &names.schema, name, &source),
        )?;
        progress(args, format!("{name}: sluice run into PostgreSQL"));
        let run = tokio::task::block_in_place(|| sluice_run(&pipeline, &dir.join("run.log")))?;
        let exact = check(client, &names.schema, name, expected).await?;
        let figure = Figure {
            secs: run.elapsed.as_secs_f64(),
            exact,
        };
        progress(
            args,
            format!(
                "{name}: {:.2} s, {:.0} docs/s",
                figure.secs,
                figure.docs_per_sec(args.docs)
            ),
        );
        figures.push(figure);
    }
    // After Sluice's run: the broker has served the topic once, as it has for a user's
    // consumer reading what others read before.
    progress(args, "kafka: librdkafka consuming the topic".to_string());
    let consumer = tokio::task::block_in_place(|| consume(args, names, work))?;
    progress(
        args,
        format!(
            "kafka: librdkafka {:.2} s, {:.0} docs/s",
            consumer.secs,
            consumer.docs_per_sec(args.docs)
        ),
    );
    figures.push(consumer);
    Ok(figures)
}

/// The librdkafka baseline: `kafka_consume.py` reading the preloaded topic whole.
fn consume(args: &SourcesArgs, names: &Names, work: &Path) -> anyhow::Result<Figure> {
    let script = work.join("kafka_consume.py");
    std::fs::write(&script, CONSUME_PY)?;
    let out = std::process::Command::new("python3")
        .arg(&script)
        .arg(&args.kafka)
        .arg(&names.topic)
        .arg(args.docs.to_string())
        .output()
        .context("running python3")?;
    ensure!(
        out.status.success(),
        "the librdkafka baseline failed (is confluent-kafka installed? \
         `pip install confluent-kafka`): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let figures: serde_json::Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "kafka_consume.py printed {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })?;
    ensure!(
        figures["messages"].as_u64() == Some(args.docs),
        "librdkafka read {} messages, not {}",
        figures["messages"],
        args.docs
    );
    Ok(Figure {
        secs: figures["secs"].as_f64().context("secs")?,
        exact: Ok(()),
    })
}

/// The rows and the views every table must hold.
#[derive(Clone, Copy)]
struct Expected {
    keys: u64,
    views: i64,
}

/// Writes the documents to the file, produces them to a new topic and publishes them
/// to a new stream, in batches; returns what their reduction holds.
async fn preload(args: &SourcesArgs, names: &Names, input: &Path) -> anyhow::Result<Expected> {
    let kafka = kafka::Admin::connect(std::slice::from_ref(&args.kafka))
        .await
        .with_context(|| format!("connecting to Kafka at {}", args.kafka))?;
    kafka
        .create_topic(&names.topic, PARTITIONS)
        .await
        .with_context(|| format!("creating topic {} at {}", names.topic, args.kafka))?;
    let nats = nats::Admin::connect(&args.nats)
        .await
        .map_err(Error::from_boxed)
        .with_context(|| format!("connecting to NATS at {}", args.nats))?;
    nats.create_stream(&names.stream, &[names.subject.as_str()])
        .await
        .map_err(Error::from_boxed)
        .with_context(|| format!("creating stream {} at {}", names.stream, args.nats))?;
    let mut file = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(input)?);
    let mut keys = HashSet::new();
    let mut views = 0i64;
    let mut seq = 0;
    while seq < args.docs {
        let end = (seq + BATCH as u64).min(args.docs);
        let mut partitions = vec![Vec::new(); PARTITIONS as usize];
        let mut payloads = Vec::with_capacity(BATCH);
        for seq in seq..end {
            let doc = pageview(SEED, args.keys, seq);
            keys.insert(doc.key);
            views += doc.views as i64;
            let mut text = Vec::with_capacity(160);
            doc.write_json(&mut text);
            file.write_all(&text)?;
            file.write_all(b"\n")?;
            let partition = (doc.key % PARTITIONS as u64) as usize;
            partitions[partition].push((Some(doc.user_id().into_bytes()), text.clone()));
            payloads.push(Bytes::from(text));
        }
        for (partition, records) in (0..).zip(partitions) {
            kafka
                .produce(&names.topic, partition, records)
                .await
                .with_context(|| format!("producing to topic {}", names.topic))?;
        }
        nats.publish_batch(&names.subject, payloads)
            .await
            .map_err(Error::from_boxed)
            .with_context(|| format!("publishing to stream {}", names.stream))?;
        seq = end;
        if seq % 100_000 == 0 {
            progress(args, format!("  {seq} documents preloaded"));
        }
    }
    file.flush()?;
    Ok(Expected {
        keys: keys.len() as u64,
        views,
    })
}

/// Drops the schema, deletes the topic and the stream; the first failure is returned
/// after trying all three.
async fn cleanup(
    args: &SourcesArgs,
    client: &tokio_postgres::Client,
    names: &Names,
) -> anyhow::Result<()> {
    let schema = client
        .batch_execute(&format!(
            "DROP SCHEMA IF EXISTS {} CASCADE",
            quote_ident(&names.schema)
        ))
        .await
        .with_context(|| format!("dropping schema {}", names.schema));
    let topic = async {
        let admin = kafka::Admin::connect(std::slice::from_ref(&args.kafka)).await?;
        admin.delete_topic(&names.topic).await
    };
    let topic = (topic.await).with_context(|| format!("deleting topic {}", names.topic));
    let stream = async {
        let admin = nats::Admin::connect(&args.nats).await?;
        admin.delete_stream(&names.stream).await
    };
    let stream = (stream.await.map_err(Error::from_boxed))
        .with_context(|| format!("deleting stream {}", names.stream));
    schema.and(topic).and(stream)
}

fn progress(args: &SourcesArgs, line: String) {
    if !args.json {
        eprintln!("{line}");
    }
}

/// The pageviews pipeline of bench postgres, from `source` into table `table`.
fn pipeline_yaml(url: &str, schema: &str, table: &str, source: &str) -> String {
    format!(
        r#"
{PAGEVIEWS_COLLECTION}sources:
  pageviews:
    target: bench/pageviews
    {source}
materializations:
  sources-{table}:
    endpoint: {{postgres: {{url: {url}, schema: {schema}}}}}
    bindings:
      - source: bench/pageviews
        resource: {{table: {table}}}
"#,
        url = json!(url),
        schema = json!(schema),
    )
}

/// Whether `table` holds one row per key and every generated view.
async fn check(
    client: &tokio_postgres::Client,
    schema: &str,
    table: &str,
    expected: Expected,
) -> anyhow::Result<Result<(), String>> {
    let query = format!(
        "SELECT count(*), coalesce(sum(views), 0)::bigint FROM {}.{}",
        quote_ident(schema),
        quote_ident(table)
    );
    let row = client.query_one(&query, &[]).await.context(query.clone())?;
    let (rows, views): (i64, i64) = (row.try_get(0)?, row.try_get(1)?);
    Ok(if rows as u64 == expected.keys && views == expected.views {
        Ok(())
    } else {
        Err(format!(
            "{rows} rows and {views} views, wanted {} and {}",
            expected.keys, expected.views
        ))
    })
}

fn report(args: &SourcesArgs, figures: &[Figure]) {
    let rate = |i: usize| figures[i].docs_per_sec(args.docs);
    let (file, kafka, nats, consumer) = (rate(0), rate(1), rate(2), rate(3));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let exact = figures.iter().all(|f| f.exact.is_ok());
    if args.json {
        let figures = json!({
            "docs": args.docs,
            "keys": args.keys,
            "cores": cores,
            "file_secs": figures[0].secs,
            "kafka_secs": figures[1].secs,
            "nats_secs": figures[2].secs,
            "file_docs_per_sec": file,
            "kafka_docs_per_sec": kafka,
            "nats_docs_per_sec": nats,
            "ratio_kafka": kafka / file,
            "ratio_nats": nats / file,
            "kafka_consumer_secs": figures[3].secs,
            "kafka_consumer_docs_per_sec": consumer,
            "ratio_kafka_consumer": kafka / consumer,
            "exact": exact,
        });
        println!("{figures}");
        return;
    }
    println!(
        "{} documents over {} keys into PostgreSQL, {cores} cores",
        args.docs, args.keys
    );
    for (i, name) in INPUTS.iter().enumerate() {
        println!(
            "  {name:<6} {:>7.2} s  {:>9.0} docs/s  {}",
            figures[i].secs,
            rate(i),
            if figures[i].exact.is_ok() {
                "exact"
            } else {
                "NOT exact"
            }
        );
    }
    println!(
        "  ratio_kafka {:.2}, ratio_nats {:.2} (each over the file)",
        kafka / file,
        nats / file
    );
    println!(
        "  librdkafka {:>7.2} s  {consumer:>9.0} docs/s  ratio_kafka_consumer {:.2} (Sluice over it)",
        figures[3].secs,
        kafka / consumer
    );
}
