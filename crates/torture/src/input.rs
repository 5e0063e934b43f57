//! Where the torture's generated segments go, and the pipeline's source that reads
//! them: a JSON-lines file it appends to, a 4-partition Kafka topic it produces to
//! (each document to the partition of its key), or a NATS JetStream stream it
//! publishes to. Kafka and NATS inputs live in a private broker ([`PrivateBroker`]) of
//! the torture's own, never the shared one, so that runs are isolated and the
//! `broker-restart` scenario may crash it.
//!
//! A `postgres_cdc` input is a table of a private PostgreSQL with `wal_level=logical`
//! (one row per document, columns named as its properties): the first run snapshots
//! what the table holds (in small chunks, so that kills land mid-backfill), later
//! segments are inserted between runs and streamed. A row read twice would be summed
//! twice, a row lost would be missing from the sums: the model's comparison tells.
//! A `mysql_cdc` input is the same table in a private `mariadbd` with the binary log on
//! (`BinlogMariadb`), snapshotted, then read from the log as a replica.
//!
//! A segment is produced only while no run reads (between runs), and whole: the
//! model's segments are then exactly what the broker holds.
//!
//! The HTTP input is pushed instead: its segments wait here, and the `http` scenario's
//! clients post them (in bodies with Idempotency-Keys) while runs are killed under
//! them.

use super::block_on;
use super::server::{PrivateBroker, PrivateServer};
use super::store::yaml_str;
use anyhow::{Context, Error};
use bytes::Bytes;
use mysql_async::prelude::Queryable;
use serde_json::Value;
use sluice_kafka::admin as kafka;
use sluice_nats::admin as nats;
use sluice_testkit::mariadb::BinlogMariadb;
use sluice_testkit::postgres::LogicalPostgres;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Partitions of the torture's Kafka topic.
pub const PARTITIONS: i32 = 4;
/// The topic, or the stream, in the private broker.
const TOPIC: &str = "torture-events";
const STREAM: &str = "TORTURE";
const SUBJECT: &str = "torture.events";

/// The kind of input, as `--source` names it.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SourceKind {
    File,
    Kafka,
    Nats,
    #[value(name = "postgres_cdc")]
    PostgresCdc,
    #[value(name = "mysql_cdc")]
    MysqlCdc,
    Http,
}

impl SourceKind {
    /// A change-data-capture source: its steps are the server's transactions and
    /// backfill chunks, not the model's fixed transactions.
    pub fn is_cdc(self) -> bool {
        matches!(self, SourceKind::PostgresCdc | SourceKind::MysqlCdc)
    }
}

/// The bearer token of the torture's HTTP source.
pub const HTTP_TOKEN: &str = "torture";
/// The HTTP source's name, as its route says it.
pub const HTTP_SOURCE: &str = "events";

pub enum Input {
    File {
        path: PathBuf,
    },
    Kafka {
        broker: PrivateBroker,
    },
    Nats {
        broker: PrivateBroker,
    },
    PostgresCdc {
        server: LogicalPostgres,
        rows: u64,
    },
    MysqlCdc {
        server: BinlogMariadb,
        rows: u64,
    },
    Http {
        address: std::net::SocketAddr,
        /// Documents generated, not yet handed to the clients.
        unsent: Vec<Value>,
    },
}

/// Backfill rows per query of a CDC input: small, so that a backfill takes
/// many steps.
const CDC_CHUNK_ROWS: usize = 200;
/// Rows per INSERT (a transaction each) when a segment goes into the table.
const CDC_INSERT_ROWS: usize = 250;

impl Input {
    /// An empty input of `kind` in the torture's folder `dir` (a broker started there,
    /// its topic or stream created).
    pub fn create(kind: SourceKind, dir: &Path) -> anyhow::Result<Input> {
        Ok(match kind {
            SourceKind::File => Input::File {
                path: dir.join("events.jsonl"),
            },
            SourceKind::Kafka => {
                let broker = PrivateBroker::tansu(&dir.join("tansu"))?;
                block_on(async {
                    let admin = kafka::Admin::connect(&[broker.url()]).await?;
                    Ok(admin.create_topic(TOPIC, PARTITIONS).await?)
                })
                .with_context(|| format!("creating topic {TOPIC} at {}", broker.url()))?;
                Input::Kafka { broker }
            }
            SourceKind::Nats => {
                let broker = PrivateBroker::nats(&dir.join("nats"))?;
                block_on(async {
                    let admin = nats::Admin::connect(&broker.url())
                        .await
                        .map_err(Error::from_boxed)?;
                    (admin.create_stream(STREAM, &[SUBJECT]).await).map_err(Error::from_boxed)
                })
                .with_context(|| format!("creating stream {STREAM} at {}", broker.url()))?;
                Input::Nats { broker }
            }
            SourceKind::PostgresCdc => {
                let server = LogicalPostgres::start();
                block_on(async {
                    let client = connect(&server.url()).await?;
                    client
                        .batch_execute(
                            "CREATE TABLE events (seq bigint PRIMARY KEY, key text NOT NULL, \
                             views bigint NOT NULL, bytes bigint NOT NULL, last_seen text NOT \
                             NULL, attrs jsonb NOT NULL)",
                        )
                        .await?;
                    Ok(())
                })
                .with_context(|| format!("creating table events at {}", server.url()))?;
                Input::PostgresCdc { server, rows: 0 }
            }
            SourceKind::MysqlCdc => {
                let server = BinlogMariadb::start();
                block_on(async {
                    let mut conn = mysql(&server.url()).await?;
                    conn.query_drop(
                        "CREATE DATABASE src; CREATE TABLE src.events (seq bigint PRIMARY KEY, \
                         `key` varchar(255) NOT NULL, views bigint NOT NULL, bytes bigint NOT \
                         NULL, last_seen varchar(255) NOT NULL, attrs json NOT NULL)",
                    )
                    .await?;
                    Ok(())
                })
                .with_context(|| format!("creating table src.events at {}", server.url()))?;
                Input::MysqlCdc { server, rows: 0 }
            }
            SourceKind::Http => Input::Http {
                address: ([127, 0, 0, 1], sluice_testkit::ports::free_port()).into(),
                unsent: Vec::new(),
            },
        })
    }

    /// What reports call it.
    pub fn describe(&self) -> &'static str {
        match self {
            Input::File { .. } => "file",
            Input::Kafka { .. } => "kafka",
            Input::Nats { .. } => "nats",
            Input::PostgresCdc { .. } => "postgres_cdc",
            Input::MysqlCdc { .. } => "mysql_cdc",
            Input::Http { .. } => "http",
        }
    }

    /// The private broker, if the input lives in one.
    pub fn broker(&mut self) -> Option<&mut PrivateBroker> {
        match self {
            Input::File { .. }
            | Input::PostgresCdc { .. }
            | Input::MysqlCdc { .. }
            | Input::Http { .. } => None,
            Input::Kafka { broker } | Input::Nats { broker } => Some(broker),
        }
    }

    /// The source of a pipeline file reading this input (YAML flow style).
    pub fn source_yaml(&self) -> String {
        match self {
            Input::File { path } => {
                format!("file: {{path: {}, format: json}}", yaml_str(path))
            }
            Input::Kafka { broker } => format!(
                r#"kafka: {{brokers: ["{}"], topic: {TOPIC}, start: earliest, format: json}}"#,
                broker.url()
            ),
            Input::Nats { broker } => {
                format!(
                    r#"nats: {{url: "{}", stream: {STREAM}, start: first}}"#,
                    broker.url()
                )
            }
            Input::PostgresCdc { server, .. } => format!(
                r#"postgres_cdc: {{url: "{}", tables: [public.events], chunk_rows: {CDC_CHUNK_ROWS}}}"#,
                server.url()
            ),
            Input::MysqlCdc { server, .. } => format!(
                r#"mysql_cdc: {{url: "{}", tables: [src.events], chunk_rows: {CDC_CHUNK_ROWS}}}"#,
                server.url()
            ),
            Input::Http { address, .. } => {
                format!(r#"http: {{listen: "{address}", token: {HTTP_TOKEN}}}"#)
            }
        }
    }

    /// Appends a segment of documents, durably: synced to disk (file) or acknowledged
    /// by the broker.
    pub fn append(&mut self, docs: &[Value]) -> anyhow::Result<()> {
        match self {
            Input::Http { unsent, .. } => {
                unsent.extend_from_slice(docs);
                Ok(())
            }
            Input::File { path } => {
                append_lines(path, docs).with_context(|| format!("writing {}", path.display()))
            }
            Input::Kafka { broker } => {
                let mut partitions = vec![Vec::new(); PARTITIONS as usize];
                for doc in docs {
                    let key = doc["key"].as_str().unwrap_or_default().as_bytes().to_vec();
                    let partition = partition_of(&key);
                    partitions[partition].push((Some(key), serde_json::to_vec(doc)?));
                }
                block_on(async {
                    let admin = kafka::Admin::connect(&[broker.url()]).await?;
                    for (partition, records) in (0..).zip(partitions) {
                        admin.produce(TOPIC, partition, records).await?;
                    }
                    Ok(())
                })
                .with_context(|| format!("producing to topic {TOPIC} at {}", broker.url()))
            }
            Input::Nats { broker } => {
                let payloads = docs
                    .iter()
                    .map(|doc| serde_json::to_vec(doc).map(Bytes::from))
                    .collect::<Result<Vec<_>, _>>()?;
                block_on(async {
                    let admin = nats::Admin::connect(&broker.url())
                        .await
                        .map_err(Error::from_boxed)?;
                    (admin.publish_batch(SUBJECT, payloads).await).map_err(Error::from_boxed)?;
                    Ok(())
                })
                .with_context(|| format!("publishing to stream {STREAM} at {}", broker.url()))
            }
            Input::PostgresCdc { server, rows } => {
                let first = *rows;
                block_on(async {
                    let client = connect(&server.url()).await?;
                    for (n, chunk) in docs.chunks(CDC_INSERT_ROWS).enumerate() {
                        let seq = first + (n * CDC_INSERT_ROWS) as u64;
                        client
                            .batch_execute(&insert_rows("events", seq, chunk)?)
                            .await?;
                    }
                    Ok(())
                })
                .with_context(|| format!("inserting into table events at {}", server.url()))?;
                *rows += docs.len() as u64;
                Ok(())
            }
            Input::MysqlCdc { server, rows } => {
                let first = *rows;
                block_on(async {
                    let mut conn = mysql(&server.url()).await?;
                    // Quotes are doubled, backslashes left alone, as in PostgreSQL.
                    conn.query_drop(
                        "SET SESSION sql_mode = 'STRICT_TRANS_TABLES,NO_BACKSLASH_ESCAPES'",
                    )
                    .await?;
                    for (n, chunk) in docs.chunks(CDC_INSERT_ROWS).enumerate() {
                        let seq = first + (n * CDC_INSERT_ROWS) as u64;
                        conn.query_drop(insert_rows("src.events", seq, chunk)?)
                            .await?;
                    }
                    Ok(())
                })
                .with_context(|| format!("inserting into table src.events at {}", server.url()))?;
                *rows += docs.len() as u64;
                Ok(())
            }
        }
    }
}

async fn mysql(url: &str) -> anyhow::Result<mysql_async::Conn> {
    mysql_async::Conn::from_url(url)
        .await
        .with_context(|| format!("connecting to {url}"))
}

async fn connect(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

/// One INSERT of `docs` as rows of `table`, numbered from `first` (standard quoting:
/// a quote doubled, a backslash plain).
fn insert_rows(table: &str, first: u64, docs: &[Value]) -> anyhow::Result<String> {
    let literal = |text: &str| format!("'{}'", text.replace('\'', "''"));
    let mut values = Vec::with_capacity(docs.len());
    for (seq, doc) in (first..).zip(docs) {
        let int = |name: &str| {
            doc[name]
                .as_i64()
                .with_context(|| format!("{name} in {doc}"))
        };
        let text = |name: &str| {
            doc[name]
                .as_str()
                .with_context(|| format!("{name} in {doc}"))
        };
        values.push(format!(
            "({seq}, {}, {}, {}, {}, {})",
            literal(text("key")?),
            int("views")?,
            int("bytes")?,
            literal(text("last_seen")?),
            literal(&doc["attrs"].to_string())
        ));
    }
    Ok(format!("INSERT INTO {table} VALUES {}", values.join(", ")))
}

/// The partition of a record's key: a hash (FNV-1a) of its bytes.
fn partition_of(key: &[u8]) -> usize {
    let hash = key.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    (hash % PARTITIONS as u64) as usize
}

/// Appends one JSON line per document to `path`, then syncs it.
fn append_lines(path: &Path, docs: &[Value]) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    let mut out = std::io::BufWriter::new(file);
    for doc in docs {
        serde_json::to_writer(&mut out, doc)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    out.get_ref().sync_all()
}
