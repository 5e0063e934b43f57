//! What `sluice produce`, tests, benchmarks and the torture helper need of a broker:
//! create a topic with N partitions, produce to a partition, delete a topic, and start a
//! local tansu broker when none answers on [`LOCAL_BROKER`].

use crate::broker::client_builder;
use rskafka::chrono::{DateTime, Utc};
use rskafka::client::Client;
use rskafka::client::partition::{Compression, UnknownTopicHandling};
use rskafka::record::Record;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub use rskafka::client::error::Error;

/// Where the tests' broker listens.
pub const LOCAL_BROKER: &str = "127.0.0.1:9092";

/// A client for topic administration and producing.
pub struct Admin {
    client: Client,
}

impl Admin {
    pub async fn connect(brokers: &[String]) -> Result<Admin, Error> {
        Ok(Admin {
            client: client_builder(brokers).build().await?,
        })
    }

    /// Creates `topic` with `partitions` partitions, replicated as the brokers' default.
    pub async fn create_topic(&self, topic: &str, partitions: i32) -> Result<(), Error> {
        self.client
            .controller_client()?
            .create_topic(topic, partitions, -1, 10_000)
            .await
    }

    pub async fn delete_topic(&self, topic: &str) -> Result<(), Error> {
        self.client
            .controller_client()?
            .delete_topic(topic, 10_000)
            .await
    }

    /// How many partitions `topic` has; `None` when it does not exist.
    pub async fn partitions(&self, topic: &str) -> Result<Option<usize>, Error> {
        let topics = self.client.list_topics().await?;
        Ok(topics
            .into_iter()
            .find(|t| t.name == topic)
            .map(|t| t.partitions.len()))
    }

    /// Produces `(key, value)` messages to `partition` as one batch, timestamped now;
    /// returns their offsets.
    pub async fn produce(
        &self,
        topic: &str,
        partition: i32,
        messages: impl IntoIterator<Item = (Option<Vec<u8>>, Vec<u8>)>,
    ) -> Result<Vec<i64>, Error> {
        let now = now_millis();
        let records = messages
            .into_iter()
            .map(|(key, value)| Record {
                key,
                value: Some(value),
                headers: Default::default(),
                timestamp: now,
            })
            .collect();
        self.produce_records(topic, partition, records).await
    }

    /// Produces whole records (headers, timestamps, tombstones) as one batch.
    pub async fn produce_records(
        &self,
        topic: &str,
        partition: i32,
        records: Vec<Record>,
    ) -> Result<Vec<i64>, Error> {
        self.client
            .partition_client(topic, partition, UnknownTopicHandling::Retry)
            .await?
            .produce(records, Compression::NoCompression)
            .await
    }
}

/// Now, to the millisecond (what a Kafka timestamp holds).
fn now_millis() -> DateTime<Utc> {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    DateTime::from_timestamp_millis(since_epoch.as_millis() as i64).unwrap_or_default()
}

fn answers(address: &str) -> bool {
    TcpStream::connect(address).is_ok()
}

/// Starts tansu on [`LOCAL_BROKER`] unless something answers there: the ready build
/// in `../shared/tools/tansu` beside the project when present, else `tansu` on the
/// `PATH`, with its data under `$HOME/.cache/sluice-tansu/local`. It is left running,
/// like the other local services, for the tests that follow; `.ci/services` starts it
/// the same way.
pub fn ensure_local_broker() -> Result<(), String> {
    if answers(LOCAL_BROKER) {
        return Ok(());
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/tmp".into());
    let dir = Path::new(&home).join(".cache/sluice-tansu/local");
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    // One starter at a time: tests run in parallel processes.
    let lock = std::fs::File::create(dir.join("start.lock"))
        .and_then(|file| file.lock().map(|()| file))
        .map_err(|e| format!("cannot lock {}: {e}", dir.display()))?;
    if answers(LOCAL_BROKER) {
        return Ok(());
    }
    let log = std::fs::File::create(dir.join("tansu.log"))
        .map_err(|e| format!("cannot create the tansu log in {}: {e}", dir.display()))?;
    let binary = tansu_binary();
    let url = format!("tcp://{LOCAL_BROKER}");
    let mut command = Command::new(&binary);
    command
        .args([
            "broker",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &url,
        ])
        .args(["--storage-engine", "sqlite://tansu.db"])
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stderr(log.try_clone().map_err(|e| e.to_string())?)
        .stdout(log);
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    command.spawn().map_err(|e| {
        format!(
            "no broker answers on {LOCAL_BROKER}, and {} cannot start: {e} (run .ci/services)",
            binary.display()
        )
    })?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !answers(LOCAL_BROKER) {
        if Instant::now() > deadline {
            return Err(format!(
                "tansu did not answer on {LOCAL_BROKER} within 30 s; see {}",
                dir.join("tansu.log").display()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(lock);
    Ok(())
}

/// `../shared/tools/tansu` beside the project root when it exists, else `tansu`.
fn tansu_binary() -> PathBuf {
    let shared = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../../shared/tools/tansu");
    if shared.exists() {
        shared
    } else {
        PathBuf::from("tansu")
    }
}
