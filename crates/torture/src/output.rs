//! Outputs as torture targets: the materialization publishes each transaction's changes
//! (`json`: `{"insert": doc}` / `{"delete": doc}`, an update a delete then an insert) to
//! a destination of the torture's own instead of a store's table: a folder, a topic
//! of a private Kafka broker (tansu) or a subject of a private NATS JetStream server
//! ([`PrivateBroker`]). An output is exactly
//! once in its stream of batches, not in a final table, so at the end the torture reads
//! the whole destination back, with none of the output's own code (no tail, no view),
//! and [`check`]s it:
//!
//! 1. transaction numbers run without a gap from the first batch to the last;
//! 2. no transaction is published twice (a folder holds one file per transaction, a
//!    topic or subject no (transaction, index) twice);
//! 3. each transaction's messages are numbered exactly 0..n (across the topic's
//!    partitions, which a transaction's messages spread over by key);
//! 4. folded in (transaction, index) order, every delete removes exactly the current
//!    document of its key and every insert adds a key that is absent;
//! 5. every message is of one generation: kills and restarts continue the
//!    materialization, only a reset (which the torture never does) starts a new one.
//!
//! Each broken rule is an anomaly. The folded view is then what the table of a store
//! would be: compared with the model's reduction of all the input (lost, duplicated,
//! mismatched).

use super::server::{PrivateBroker, PrivateServer};
use super::{TABLE, block_on};
use anyhow::Context;
use serde_json::{Value, json};
use sluice_files_output::parse_batch_file_name;
use sluice_output_sdk::{BatchKind, GenerationId};
use sluice_runtime::failpoint::{self, OnReturn};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

/// The kind of output, as `--output` names it.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputKind {
    Files,
    Kafka,
    Nats,
}

/// Partitions of the torture's Kafka topic.
const PARTITIONS: u32 = 4;

pub enum Output {
    /// `files: {directory}`: the binding writes one file per transaction into
    /// `<directory>/torture_events`.
    Files { directory: PathBuf },
    /// `kafka: {brokers}`: the binding produces to `topic`, of [`PARTITIONS`]
    /// partitions (created by the output).
    Kafka {
        broker: PrivateBroker,
        topic: String,
    },
    /// `nats: {url}`: the binding publishes to `subject` (its stream, named after it,
    /// created by the output).
    Nats {
        broker: PrivateBroker,
        subject: String,
    },
}

impl Output {
    /// An empty destination of `kind` in the torture's folder `dir` (a broker started
    /// there), named after the torture's `tag`.
    pub fn create(kind: OutputKind, dir: &Path, tag: &str) -> anyhow::Result<Output> {
        Ok(match kind {
            OutputKind::Files => Output::Files {
                directory: dir.join("output"),
            },
            OutputKind::Kafka => Output::Kafka {
                broker: PrivateBroker::tansu(&dir.join("tansu-output"))?,
                topic: format!("torture-changes-{tag}"),
            },
            OutputKind::Nats => Output::Nats {
                broker: PrivateBroker::nats(&dir.join("nats-output"))?,
                subject: format!("torture.changes.{tag}"),
            },
        })
    }

    /// What reports call it.
    pub fn describe(&self) -> &'static str {
        match self {
            Output::Files { .. } => "files-output",
            Output::Kafka { .. } => "kafka-output",
            Output::Nats { .. } => "nats-output",
        }
    }

    /// The endpoint kind and its configuration.
    pub fn endpoint(&self) -> (&'static str, Value) {
        match self {
            Output::Files { directory } => ("files", json!({ "directory": directory })),
            Output::Kafka { broker, .. } => ("kafka", json!({ "brokers": [broker.url()] })),
            Output::Nats { broker, .. } => ("nats", json!({ "url": broker.url() })),
        }
    }

    /// The binding's resource: its destination, its changes encoded as `json`.
    pub fn resource(&self) -> Value {
        match self {
            Output::Files { .. } => json!({ "path": TABLE, "format": "json" }),
            Output::Kafka { topic, .. } => {
                json!({ "topic": topic, "partitions": PARTITIONS, "format": "json" })
            }
            Output::Nats { subject, .. } => json!({ "subject": subject, "format": "json" }),
        }
    }

    /// Every message the destination holds.
    pub fn read(&self) -> anyhow::Result<Vec<Published>> {
        match self {
            Output::Files { directory } => read_folder(&directory.join(TABLE)),
            Output::Kafka { broker, topic } => read_topic(&broker.url(), topic),
            Output::Nats { broker, subject } => read_subject(&broker.url(), subject),
        }
    }

    /// Reads the destination and checks it.
    pub fn check(&self) -> anyhow::Result<Checked> {
        Ok(check(&self.read()?))
    }
}

/// The fail points a run publishing to an output is faulted at: every boundary of a
/// batch (started, pushed, about to end, ended but the view not committed) and the
/// runtime's commits after the driver's (the view committed but not the recovery log,
/// the log committed but the sources not acknowledged). `return` is retryable at all.
pub fn fault_points() -> Vec<(&'static str, OnReturn)> {
    let output = sluice_output_sdk::FAIL_POINTS.iter().copied();
    let commits = [
        failpoint::AFTER_DRIVER_COMMITTED,
        failpoint::AFTER_LOG_COMMIT,
    ];
    output
        .chain(commits)
        .map(|point| (point, OnReturn::Retryable))
        .collect()
}

/// The messages of a files output's folder: each batch file's lines, numbered from 0.
/// Names that start with a dot are batches a crash interrupted (the next run removes
/// them), not published.
fn read_folder(folder: &Path) -> anyhow::Result<Vec<Published>> {
    let mut names = Vec::new();
    for entry in
        std::fs::read_dir(folder).with_context(|| format!("listing {}", folder.display()))?
    {
        names.push(entry?.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    let mut published = Vec::new();
    for name in names.into_iter().filter(|n| !n.starts_with('.')) {
        let file = parse_batch_file_name(&name)
            .with_context(|| format!("{}: {name} is not a batch file", folder.display()))?;
        let path = folder.join(&name);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        for (index, line) in (0..).zip(text.lines()) {
            published.push(Published {
                generation: file.generation,
                txn: file.txn,
                index,
                batch: file.kind,
                file: Some(name.clone()),
                place: format!("{name} line {}", index + 1),
                key: None,
                value: line.as_bytes().to_vec(),
            });
        }
    }
    Ok(published)
}

/// The messages of a Kafka topic, partition by partition, with the stamps of their
/// headers.
fn read_topic(broker: &str, topic: &str) -> anyhow::Result<Vec<Published>> {
    let brokers = [broker.to_string()];
    let written =
        block_on(async { Ok(sluice_kafka_output::read::read_topic(&brokers, topic).await?) })
            .with_context(|| format!("reading topic {topic} at {broker}"))?;
    Ok((written.into_iter())
        .map(|message| Published {
            generation: message.stamp.generation,
            txn: message.stamp.txn,
            index: message.stamp.index,
            batch: message.stamp.batch,
            file: None,
            place: format!(
                "topic {topic} partition {} offset {}",
                message.partition, message.offset
            ),
            key: Some(message.key),
            value: message.value,
        })
        .collect())
}

/// The messages of a NATS subject, in stream order, with the stamps of their headers.
fn read_subject(url: &str, subject: &str) -> anyhow::Result<Vec<Published>> {
    let stored =
        block_on(async { Ok(sluice_nats_output::read::read_subject(url, subject).await?) })
            .with_context(|| format!("reading subject {subject} at {url}"))?;
    Ok((stored.into_iter())
        .map(|message| Published {
            generation: message.stamp.generation,
            txn: message.stamp.txn,
            index: message.stamp.index,
            batch: message.stamp.batch,
            file: None,
            place: format!("subject {subject} sequence {}", message.sequence),
            key: message.key.map(String::into_bytes),
            value: message.payload.to_vec(),
        })
        .collect())
}

/// One message read back from a destination.
#[derive(Debug, Clone)]
pub struct Published {
    /// The generation that wrote it (`None`: none written).
    pub generation: Option<GenerationId>,
    pub txn: u64,
    /// Its index within its transaction's batch.
    pub index: u64,
    pub batch: BatchKind,
    /// The file that holds it (files output; `None`: a broker's topic or subject).
    pub file: Option<String>,
    /// Where it was read, for reports (a file's line, a partition's offset…).
    pub place: String,
    /// Its key, where the destination keeps keys apart from values.
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
}

/// A broken rule of an output's stream of batches.
#[derive(Debug, Clone, PartialEq)]
pub enum Violation {
    /// Messages of several generations (`None`: of none), in order of first appearance:
    /// a restart started the materialization over.
    Generations { generations: Vec<String> },
    /// No batch of the transactions between `after` and `before`.
    Gap { after: u64, before: u64 },
    /// A transaction published as several files.
    InSeveralFiles { txn: u64, files: Vec<String> },
    /// Indexes of a transaction published more than once (`of`: its message count).
    DoubledIndexes {
        txn: u64,
        indexes: Vec<u64>,
        of: u64,
    },
    /// Indexes of a transaction missing below its last one.
    MissingIndexes {
        txn: u64,
        indexes: Vec<u64>,
        of: u64,
    },
    /// A snapshot batch: the torture's binding never asks for one.
    Snapshot { txn: u64, place: String },
    /// A message that is not a `json` insert or delete of a document with a key.
    Undecodable { place: String, why: String },
    /// A message whose key is not its document's.
    WrongKey {
        place: String,
        key: String,
        document_key: String,
    },
    /// A delete of another document than the current one of its key (`None`: absent).
    WrongBefore {
        txn: u64,
        index: u64,
        key: String,
        deleted: Value,
        current: Option<Value>,
    },
    /// An insert of a key that is present (a delete of it is missing).
    InsertOverPresent {
        txn: u64,
        index: u64,
        key: String,
        current: Value,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Generations { generations } => write!(
                f,
                "the destination holds {} generations ({}): a restart started the \
                 materialization over",
                generations.len(),
                generations.join(", ")
            ),
            Violation::Gap { after, before } => write!(
                f,
                "transactions {}..={} are missing between {after} and {before}",
                after + 1,
                before - 1
            ),
            Violation::InSeveralFiles { txn, files } => write!(
                f,
                "transaction {txn} is published {} times: {}",
                files.len(),
                files.join(", ")
            ),
            Violation::DoubledIndexes { txn, indexes, of } => write!(
                f,
                "transaction {txn}: messages {} of 0..{of} are published more than once",
                runs(indexes)
            ),
            Violation::MissingIndexes { txn, indexes, of } => write!(
                f,
                "transaction {txn}: messages {} of 0..{of} are missing",
                runs(indexes)
            ),
            Violation::Snapshot { txn, place } => write!(
                f,
                "transaction {txn} is a snapshot batch ({place}), which the binding never asks for"
            ),
            Violation::Undecodable { place, why } => write!(f, "{place}: {why}"),
            Violation::WrongKey {
                place,
                key,
                document_key,
            } => write!(
                f,
                "{place}: the message's key {key} is not its document's key {document_key:?}"
            ),
            Violation::WrongBefore {
                txn,
                index,
                key,
                deleted,
                current,
            } => match current {
                Some(current) => write!(
                    f,
                    "transaction {txn} message {index}: the delete of {key} removes {deleted}, \
                     but its document is {current}"
                ),
                None => write!(
                    f,
                    "transaction {txn} message {index}: the delete of {key} removes {deleted}, \
                     but the key is absent"
                ),
            },
            Violation::InsertOverPresent {
                txn,
                index,
                key,
                current,
            } => write!(
                f,
                "transaction {txn} message {index}: the insert of {key} finds it present as \
                 {current} (no delete before it)"
            ),
        }
    }
}

/// Indexes in order as runs: `0, 3..=5, 9`.
fn runs(indexes: &[u64]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut at = 0;
    while at < indexes.len() {
        let first = indexes[at];
        let mut last = first;
        while indexes.get(at + 1) == Some(&(last + 1)) {
            at += 1;
            last += 1;
        }
        out.push(if first == last {
            first.to_string()
        } else {
            format!("{first}..={last}")
        });
        at += 1;
    }
    out.join(", ")
}

/// What a destination's messages add up to.
#[derive(Debug, Default)]
pub struct Checked {
    pub violations: Vec<Violation>,
    /// Key → its document, after every change was folded in.
    pub view: BTreeMap<String, Value>,
}

/// Checks a destination's messages (in any order) against the rules of the module's
/// header, and folds them into the view they publish. A transaction's extra files and
/// a message's extra copies are reported, not folded.
pub fn check(published: &[Published]) -> Checked {
    let mut checked = Checked::default();
    let mut generations: Vec<Option<GenerationId>> = Vec::new();
    for message in published {
        if !generations.contains(&message.generation) {
            generations.push(message.generation);
        }
    }
    if generations.len() > 1 {
        let named = |g: &Option<GenerationId>| g.map_or("none".into(), |g| g.to_string());
        checked.violations.push(Violation::Generations {
            generations: generations.iter().map(named).collect(),
        });
    }
    let mut transactions: BTreeMap<u64, Vec<&Published>> = BTreeMap::new();
    for message in published {
        transactions.entry(message.txn).or_default().push(message);
    }
    let mut previous: Option<u64> = None;
    for (&txn, messages) in &mut transactions {
        if let Some(after) = previous.filter(|&p| p + 1 < txn) {
            checked
                .violations
                .push(Violation::Gap { after, before: txn });
        }
        previous = Some(txn);
        let files: BTreeSet<&str> = messages.iter().filter_map(|m| m.file.as_deref()).collect();
        if files.len() > 1 {
            checked.violations.push(Violation::InSeveralFiles {
                txn,
                files: files.iter().map(|f| f.to_string()).collect(),
            });
            let first = files.first().copied();
            messages.retain(|m| m.file.as_deref() == first);
        }
        messages.sort_by_key(|m| m.index);
        checked.violations.extend(numbering(txn, messages));
        if let Some(snapshot) = messages.iter().find(|m| m.batch == BatchKind::Snapshot) {
            checked.violations.push(Violation::Snapshot {
                txn,
                place: snapshot.place.clone(),
            });
            continue;
        }
        let mut folded = None;
        for message in messages.iter() {
            if folded != Some(message.index) {
                folded = Some(message.index);
                fold(message, &mut checked);
            }
        }
    }
    checked
}

/// What is wrong with the numbering of a transaction's messages (sorted by index).
fn numbering(txn: u64, messages: &[&Published]) -> Vec<Violation> {
    let of = messages.last().map_or(0, |m| m.index + 1);
    let mut counts = vec![0_u32; of as usize];
    for message in messages {
        counts[message.index as usize] += 1;
    }
    let indexes = |wanted: fn(u32) -> bool| -> Vec<u64> {
        (0..of).filter(|&i| wanted(counts[i as usize])).collect()
    };
    let (doubled, missing) = (indexes(|n| n > 1), indexes(|n| n == 0));
    let mut violations = Vec::new();
    if !doubled.is_empty() {
        violations.push(Violation::DoubledIndexes {
            txn,
            indexes: doubled,
            of,
        });
    }
    if !missing.is_empty() {
        violations.push(Violation::MissingIndexes {
            txn,
            indexes: missing,
            of,
        });
    }
    violations
}

/// Applies one message to the view, or says why it cannot be.
fn fold(message: &Published, checked: &mut Checked) {
    let (txn, index) = (message.txn, message.index);
    let (insert, key, doc) = match decode(message) {
        Ok(change) => change,
        Err(violation) => return checked.violations.push(violation),
    };
    let violation = if insert {
        let Some(current) = checked.view.insert(key.clone(), doc) else {
            return;
        };
        Violation::InsertOverPresent {
            txn,
            index,
            key,
            current,
        }
    } else {
        match checked.view.remove(&key) {
            Some(current) if current == doc => return,
            current => Violation::WrongBefore {
                txn,
                index,
                key,
                deleted: doc,
                current,
            },
        }
    };
    checked.violations.push(violation);
}

/// A `json` message as (insert?, the document's key, the document).
fn decode(message: &Published) -> Result<(bool, String, Value), Violation> {
    let undecodable = |why: String| Violation::Undecodable {
        place: message.place.clone(),
        why,
    };
    let value: Value = serde_json::from_slice(&message.value)
        .map_err(|e| undecodable(format!("the message is not JSON: {e}")))?;
    let (insert, doc) = match value.as_object().map(|o| o.iter().collect::<Vec<_>>()) {
        Some(fields) if fields.len() == 1 && fields[0].0 == "insert" => (true, fields[0].1),
        Some(fields) if fields.len() == 1 && fields[0].0 == "delete" => (false, fields[0].1),
        _ => {
            return Err(undecodable(format!(
                "{value} is neither {{\"insert\": doc}} nor {{\"delete\": doc}}"
            )));
        }
    };
    let key = (doc.get("key").and_then(Value::as_str))
        .ok_or_else(|| undecodable(format!("the document {doc} has no key")))?;
    if let Some(message_key) = &message.key {
        let parsed: Option<Value> = serde_json::from_slice(message_key).ok();
        if parsed != Some(json!({ "key": key })) {
            return Err(Violation::WrongKey {
                place: message.place.clone(),
                key: String::from_utf8_lossy(message_key).into_owned(),
                document_key: key.to_string(),
            });
        }
    }
    Ok((insert, key.to_string(), doc.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(key: &str, views: i64) -> Value {
        json!({"key": key, "views": views, "bytes": 1, "last_seen": "2026-01-01T00:00Z",
               "attrs": {}})
    }

    fn insert(doc: &Value) -> String {
        json!({ "insert": doc }).to_string()
    }

    fn delete(doc: &Value) -> String {
        json!({ "delete": doc }).to_string()
    }

    /// Messages of a broker: (txn, index, value), keyed by their document's key.
    fn broker(messages: &[(u64, u64, String)]) -> Vec<Published> {
        (messages.iter())
            .map(|(txn, index, value)| {
                let doc: Value = serde_json::from_str(value).unwrap();
                let key = doc.as_object().unwrap().values().next().unwrap()["key"].clone();
                Published {
                    generation: None,
                    txn: *txn,
                    index: *index,
                    batch: BatchKind::Delta,
                    file: None,
                    place: format!("offset {txn}/{index}"),
                    key: Some(json!({ "key": key }).to_string().into_bytes()),
                    value: value.clone().into_bytes(),
                }
            })
            .collect()
    }

    /// Messages of files: each file (name, txn) and its lines.
    fn files(files: &[(&str, u64, Vec<String>)]) -> Vec<Published> {
        (files.iter())
            .flat_map(|(name, txn, lines)| {
                (0..).zip(lines).map(move |(index, line)| Published {
                    generation: None,
                    txn: *txn,
                    index,
                    batch: BatchKind::Delta,
                    file: Some(name.to_string()),
                    place: format!("{name} line {}", index + 1),
                    key: None,
                    value: line.clone().into_bytes(),
                })
            })
            .collect()
    }

    /// Three transactions: a and b inserted; a updated; b deleted, c inserted.
    fn clean() -> Vec<(u64, u64, String)> {
        let (a1, a2, b, c) = (doc("a", 1), doc("a", 3), doc("b", 2), doc("c", 1));
        vec![
            (1, 0, insert(&a1)),
            (1, 1, insert(&b)),
            (2, 0, delete(&a1)),
            (2, 1, insert(&a2)),
            (3, 0, delete(&b)),
            (3, 1, insert(&c)),
        ]
    }

    #[test]
    fn a_clean_stream_in_any_order_folds_into_its_view() {
        let mut messages = broker(&clean());
        messages.reverse();
        let checked = check(&messages);
        assert_eq!(checked.violations, []);
        let view: Vec<_> = checked.view.into_iter().collect();
        assert_eq!(view, [("a".into(), doc("a", 3)), ("c".into(), doc("c", 1))]);
    }

    #[test]
    fn a_second_generation_is_reported_naming_both() {
        let mut messages = broker(&clean());
        let (old, new) = (GenerationId::mint(), GenerationId::mint());
        for (i, m) in messages.iter_mut().enumerate() {
            m.generation = Some(if i < 2 { old } else { new });
        }
        let checked = check(&messages);
        assert_eq!(
            checked.violations,
            [Violation::Generations {
                generations: vec![old.to_string(), new.to_string()]
            }]
        );
        assert!(checked.violations[0].to_string().contains("2 generations"));
    }

    #[test]
    fn a_transaction_replayed_into_a_broker_is_reported_once_and_folded_once() {
        let mut messages = clean();
        messages.extend([(2, 0, delete(&doc("a", 1))), (2, 1, insert(&doc("a", 3)))]);
        let checked = check(&broker(&messages));
        assert_eq!(
            checked.violations,
            [Violation::DoubledIndexes {
                txn: 2,
                indexes: vec![0, 1],
                of: 2
            }]
        );
        assert_eq!(checked.view["a"], doc("a", 3));
    }

    #[test]
    fn a_transaction_in_two_files_is_reported_naming_both() {
        let (a1, a2) = (doc("a", 1), doc("a", 3));
        let checked = check(&files(&[
            ("1.jsonl", 1, vec![insert(&a1)]),
            ("2.jsonl", 2, vec![delete(&a1), insert(&a2)]),
            ("2.snapshot.jsonl", 2, vec![insert(&a2)]),
        ]));
        assert_eq!(
            checked.violations,
            [Violation::InSeveralFiles {
                txn: 2,
                files: vec!["2.jsonl".into(), "2.snapshot.jsonl".into()]
            }]
        );
        assert_eq!(checked.view["a"], a2);
    }

    #[test]
    fn a_missing_index_is_reported_and_breaks_the_fold() {
        let mut messages = clean();
        messages.retain(|(txn, index, _)| (*txn, *index) != (2, 0));
        let checked = check(&broker(&messages));
        assert_eq!(
            checked.violations,
            [
                Violation::MissingIndexes {
                    txn: 2,
                    indexes: vec![0],
                    of: 2
                },
                Violation::InsertOverPresent {
                    txn: 2,
                    index: 1,
                    key: "a".into(),
                    current: doc("a", 1)
                },
            ]
        );
        let shown = checked.violations[0].to_string();
        assert_eq!(shown, "transaction 2: messages 0 of 0..2 are missing");
    }

    #[test]
    fn a_missing_transaction_is_a_gap_and_its_changes_are_wrong_befores_later() {
        let mut messages = clean();
        messages.retain(|(txn, ..)| *txn != 2);
        messages.push((4, 0, delete(&doc("a", 3))));
        let checked = check(&broker(&messages));
        assert_eq!(
            checked.violations,
            [
                Violation::Gap {
                    after: 1,
                    before: 3
                },
                Violation::WrongBefore {
                    txn: 4,
                    index: 0,
                    key: "a".into(),
                    deleted: doc("a", 3),
                    current: Some(doc("a", 1))
                },
            ]
        );
        let shown = checked.violations[0].to_string();
        assert_eq!(shown, "transactions 2..=2 are missing between 1 and 3");
    }

    #[test]
    fn a_wrong_before_names_the_document_deleted_and_the_current_one() {
        let mut messages = clean();
        messages[2].2 = delete(&doc("a", 2));
        messages.push((4, 0, delete(&doc("z", 1))));
        let checked = check(&broker(&messages));
        assert_eq!(checked.violations.len(), 2, "{:?}", checked.violations);
        let shown: Vec<String> = checked.violations.iter().map(|v| v.to_string()).collect();
        assert!(
            shown[0].starts_with("transaction 2 message 0: the delete of a removes ")
                && shown[0].contains(r#""views":2"#)
                && shown[0].contains(r#"but its document is {"#),
            "{shown:?}"
        );
        assert!(shown[1].ends_with("but the key is absent"), "{shown:?}");
    }

    #[test]
    fn foreign_messages_and_keys_are_reported_where_they_were_read() {
        let mut messages = broker(&clean());
        messages[0].value = b"{\"upsert\": {}}".to_vec();
        messages[1].key = Some(br#"{"key":"x"}"#.to_vec());
        let checked = check(&messages);
        let shown: Vec<String> = checked.violations.iter().map(|v| v.to_string()).collect();
        assert!(shown[0].starts_with("offset 1/0: {\"upsert\""), "{shown:?}");
        assert!(shown[1].contains("key {\"key\":\"x\"} is not"), "{shown:?}");
    }

    #[test]
    fn runs_of_indexes_read_as_ranges() {
        assert_eq!(runs(&[0, 3, 4, 5, 9]), "0, 3..=5, 9");
        assert_eq!(runs(&[]), "");
    }

    #[test]
    fn a_folder_reads_as_its_batch_files_lines_skipping_interrupted_batches() {
        let dir = tempfile::tempdir().unwrap();
        let generation = GenerationId::mint();
        let name = sluice_files_output::batch_file_name(
            generation,
            7,
            BatchKind::Delta,
            Default::default(),
        );
        std::fs::write(dir.path().join(&name), "{\"insert\":1}\n{\"insert\":2}\n").unwrap();
        std::fs::write(dir.path().join(format!(".{name}.tmp")), "half").unwrap();
        let read = read_folder(dir.path()).unwrap();
        let got: Vec<_> = read.iter().map(|m| (m.txn, m.index, &m.place)).collect();
        let line = |n| format!("{name} line {n}");
        assert_eq!(got, [(7, 0, &line(1)), (7, 1, &line(2))]);
        assert!(read.iter().all(|m| m.generation == Some(generation)));
        std::fs::write(dir.path().join("notes.txt"), "").unwrap();
        let err = read_folder(dir.path()).unwrap_err().to_string();
        assert!(err.contains("notes.txt is not a batch file"), "{err}");
    }
}
