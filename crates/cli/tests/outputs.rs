//! End-to-end change streams into files: `sluice run` of the pageviews pipeline whose
//! bindings publish each transaction's changes as JSON `insert_delete`, Debezium and
//! CSV files. An independent model (the input in chunks of one transaction each,
//! reduced per user) says what every transaction changed; each format's files must
//! decode to exactly that, transaction by transaction, numbered without gaps. A binding
//! added later with `snapshot: true` starts with the whole view. A reset (`sluice apply
//! --delete`) between runs starts a new generation, on files, Kafka and NATS alike:
//! every change of the new generation arrives, however the old one numbered its
//! transactions, and its changes alone reduce to the model of all the input.

use serde_json::Value;
use sluice_files_output::parse_batch_file_name;
use sluice_output_sdk::{BatchKind, GenerationId};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output};

use crate::common;

use common::changes::{group, replay};
use common::{Row, SLUICE, assert_success, block_on, generate, reduce_expected, write_lines};

/// Documents per transaction: the pipeline closes transactions at exactly this many.
const PER_TXN: usize = 500;

fn sluice(dir: &Path, args: &[&str]) -> Output {
    Command::new(SLUICE)
        .args(args)
        .current_dir(dir)
        .env("RUST_LOG", "warn")
        .output()
        .unwrap()
}

/// The pageviews pipeline publishing to `out/<binding>` in each listed format.
fn pipeline(bindings: &[(&str, &str, bool)]) -> String {
    pipeline_to("files: {directory: out}", "path", bindings)
}

/// The pageviews pipeline publishing through `endpoint`, each binding's destination
/// under the resource key `destination` (after any other keys it is given: `partitions:
/// 3, topic`).
fn pipeline_to(endpoint: &str, destination: &str, bindings: &[(&str, &str, bool)]) -> String {
    let mut yaml = String::from(
        r#"
collections:
  acme/pageviews:
    key: [/user_id]
    schema:
      type: object
      required: [user_id, views, bytes, last_seen]
      reduce: {strategy: merge}
      properties:
        user_id: {type: string}
        views: {type: integer, reduce: {strategy: sum}}
        bytes: {type: integer, reduce: {strategy: sum}}
        last_seen: {type: string, reduce: {strategy: maximize}}
sources:
  views-file:
    target: acme/pageviews
    file: {path: views.jsonl, format: json}
materializations:
  views-out:
    endpoint:
      ENDPOINT
    bindings:
"#,
    )
    .replace("ENDPOINT", endpoint);
    for (path, format, snapshot) in bindings {
        yaml.push_str(&format!(
            "      - source: acme/pageviews\n        resource: {{{destination}: {path}, format: {format}, snapshot: {snapshot}}}\n"
        ));
    }
    yaml.push_str(&format!(
        "runtime:\n  transactions: {{max_docs: {PER_TXN}, max_duration: 5s, min_duration: 5s}}\n"
    ));
    yaml
}

/// One key's change: the row before (none: inserted) and after (none: deleted).
type Changes = BTreeMap<String, (Option<Row>, Option<Row>)>;

/// What each chunk of `PER_TXN` documents changes, reduced independently.
fn model(docs: &[Value], view: &mut BTreeMap<String, Row>) -> Vec<Changes> {
    docs.chunks(PER_TXN)
        .map(|chunk| {
            let mut changes = Changes::new();
            for doc in chunk {
                let user = doc["user_id"].as_str().unwrap().to_string();
                let before = view.get(&user).cloned();
                changes.entry(user.clone()).or_insert((before, None));
                view.entry(user).or_default().add_doc(doc);
            }
            for (user, change) in &mut changes {
                change.1 = view.get(user).cloned();
            }
            changes
        })
        .collect()
}

/// A binding's batch files in name order (a generation's in transaction order):
/// (generation, transaction, kind, lines).
fn batch_files(folder: &Path) -> Vec<(Option<GenerationId>, u64, BatchKind, Vec<String>)> {
    let mut files: Vec<_> = std::fs::read_dir(folder)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter_map(|name| parse_batch_file_name(&name).map(|file| (name, file)))
        .collect();
    files.sort_by(|a, b| a.0.cmp(&b.0));
    files
        .into_iter()
        .map(|(name, file)| {
            let text = std::fs::read_to_string(folder.join(name)).unwrap();
            let lines = text.lines().map(str::to_string).collect();
            (file.generation, file.txn, file.kind, lines)
        })
        .collect()
}

/// A binding's batch files of one run from an empty view: (transaction, kind, lines).
fn batches(folder: &Path) -> Vec<(u64, BatchKind, Vec<String>)> {
    let files = batch_files(folder);
    assert!(
        files.iter().all(|f| f.0.is_some() && f.0 == files[0].0),
        "one generation, named in every file's name"
    );
    (files.into_iter())
        .map(|(_, txn, kind, lines)| (txn, kind, lines))
        .collect()
}

/// Folds a batch's insert/delete records (by key, in order) into changes.
fn fold(records: impl IntoIterator<Item = (bool, String, Row)>) -> Changes {
    let mut changes = Changes::new();
    for (insert, user, row) in records {
        let change = changes.entry(user).or_insert((None, None));
        if insert {
            assert!(change.1.is_none(), "inserted twice in one transaction");
            change.1 = Some(row);
        } else {
            assert!(
                change.0.is_none() && change.1.is_none(),
                "deleted out of order"
            );
            change.0 = Some(row);
        }
    }
    changes
}

fn decode_json(lines: &[String]) -> Changes {
    fold(lines.iter().map(|line| {
        let record: Value = serde_json::from_str(line).unwrap();
        let (insert, doc) = match (record.get("insert"), record.get("delete")) {
            (Some(doc), None) => (true, doc),
            (None, Some(doc)) => (false, doc),
            _ => panic!("not an insert_delete record: {line}"),
        };
        (
            insert,
            doc["user_id"].as_str().unwrap().to_string(),
            Row::of(doc),
        )
    }))
}

fn decode_debezium(lines: &[String], txn: u64, snapshot: bool) -> Changes {
    lines
        .iter()
        .map(|line| {
            let event: Value = serde_json::from_str(line).unwrap();
            assert_eq!(event["source"]["txn"], txn, "{line}");
            assert_eq!(event["source"]["materialization"], "views-out", "{line}");
            let (before, after) = (&event["before"], &event["after"]);
            let op = event["op"].as_str().unwrap();
            let expected_op = match (before.is_null(), after.is_null()) {
                _ if snapshot => "r",
                (true, false) => "c",
                (false, false) => "u",
                (false, true) => "d",
                (true, true) => panic!("an event with neither before nor after: {line}"),
            };
            assert_eq!(op, expected_op, "{line}");
            let user = if after.is_null() { before } else { after }["user_id"]
                .as_str()
                .unwrap()
                .to_string();
            let before = (!before.is_null()).then(|| Row::of(before));
            let after = (!after.is_null()).then(|| Row::of(after));
            (user, (before, after))
        })
        .collect()
}

fn decode_csv(lines: &[String]) -> Changes {
    assert_eq!(lines[0], "user_id,bytes,last_seen,views,_op", "the header");
    fold(lines[1..].iter().map(|line| {
        let cells = sluice_output_sdk::encode::read_csv_row(line.as_bytes()).unwrap();
        let cell = |i: usize| {
            cells[i]
                .as_deref()
                .unwrap_or_else(|| panic!("cell {i}: {line}"))
        };
        let mut row = Row::default();
        row.add(cell(3).parse().unwrap(), cell(1).parse().unwrap(), cell(2));
        let insert = match cell(4) {
            "insert" => true,
            "delete" => false,
            other => panic!("_op {other:?}"),
        };
        (insert, cell(0).to_string(), row)
    }))
}

#[test]
fn every_transactions_changes_are_published_once_in_each_format() {
    let dir = tempfile::tempdir().unwrap();
    let docs = generate(3_000, 150, 71);
    write_lines(&dir.path().join("views.jsonl"), &docs);
    let bindings = [
        ("json", "json", false),
        ("debezium", "debezium", false),
        ("csv", "csv", false),
    ];
    std::fs::write(dir.path().join("pipeline.yaml"), pipeline(&bindings)).unwrap();
    assert_success(&sluice(dir.path(), &["run", "pipeline.yaml"]));

    let expected = model(&docs, &mut BTreeMap::new());
    for (path, format, _) in bindings {
        let batches = batches(&dir.path().join("out").join(path));
        assert_eq!(
            batches.len(),
            expected.len(),
            "{format}: one file per transaction"
        );
        let first = batches[0].0;
        for (i, ((txn, kind, lines), want)) in batches.iter().zip(&expected).enumerate() {
            assert_eq!(
                *txn,
                first + i as u64,
                "{format}: transactions are contiguous"
            );
            assert_eq!(*kind, BatchKind::Delta);
            let got = match format {
                "json" => decode_json(lines),
                "debezium" => decode_debezium(lines, *txn, false),
                _ => decode_csv(lines),
            };
            assert_eq!(&got, want, "{format}: transaction {txn}");
        }
    }
}

#[test]
fn a_binding_added_with_snapshot_starts_with_the_whole_view_then_changes() {
    let dir = tempfile::tempdir().unwrap();
    let docs = generate(2_000, 120, 72);
    let (first, second) = docs.split_at(1_000);
    write_lines(&dir.path().join("views.jsonl"), first);
    std::fs::write(
        dir.path().join("pipeline.yaml"),
        pipeline(&[("all", "json", false)]),
    )
    .unwrap();
    assert_success(&sluice(dir.path(), &["run", "pipeline.yaml"]));

    // A second binding of the same collection, asking for a snapshot; more input.
    std::fs::write(
        dir.path().join("pipeline.yaml"),
        pipeline(&[("all", "json", false), ("fresh", "debezium", true)]),
    )
    .unwrap();
    assert_success(&sluice(dir.path(), &["apply", "pipeline.yaml"]));
    let mut all = first.to_vec();
    all.extend_from_slice(second);
    write_lines(&dir.path().join("views.jsonl"), &all);
    assert_success(&sluice(dir.path(), &["run", "pipeline.yaml"]));

    let mut view = BTreeMap::new();
    model(first, &mut view);
    let expected = model(second, &mut view.clone());
    let batches = batches(&dir.path().join("out/fresh"));
    assert_eq!(batches.len(), expected.len());
    // The first batch is a snapshot: every user of the view after its transaction.
    let (txn, kind, lines) = &batches[0];
    assert_eq!(*kind, BatchKind::Snapshot);
    let mut after_first = view.clone();
    for (user, (_, after)) in &expected[0] {
        after_first.insert(user.clone(), after.clone().unwrap());
    }
    let snapshot = decode_debezium(lines, *txn, true);
    let want: Changes = (after_first.into_iter())
        .map(|(user, row)| (user, (None, Some(row))))
        .collect();
    assert_eq!(snapshot, want, "the snapshot is the whole view");
    for ((txn, kind, lines), want) in batches.iter().zip(&expected).skip(1) {
        assert_eq!(*kind, BatchKind::Delta);
        assert_eq!(
            &decode_debezium(lines, *txn, false),
            want,
            "transaction {txn}"
        );
    }
    // The first binding went on with changes only.
    let all_batches = self::batches(&dir.path().join("out/all"));
    assert!(
        all_batches
            .iter()
            .all(|(_, kind, _)| *kind == BatchKind::Delta)
    );
}

/// Checks that `batches` (transaction, lines) of a message destination decode, as
/// `format`, to the model's changes of every transaction, numbered without gaps.
fn assert_batches(format: &str, batches: &[(u64, Vec<String>)], expected: &[Changes]) {
    assert_eq!(
        batches.len(),
        expected.len(),
        "{format}: one batch per transaction"
    );
    let first = batches[0].0;
    for (i, ((txn, lines), want)) in batches.iter().zip(expected).enumerate() {
        assert_eq!(
            *txn,
            first + i as u64,
            "{format}: transactions are contiguous"
        );
        let got = match format {
            "json" => decode_json(lines),
            _ => decode_debezium(lines, *txn, false),
        };
        assert_eq!(&got, want, "{format}: transaction {txn}");
    }
}

/// A unique name for a test's stream, subject or topic.
fn unique(test: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("sluice-test-{test}-{nanos:x}-{}", std::process::id())
}

#[test]
fn nats_subjects_get_every_transactions_changes_once_in_order() {
    const URL: &str = "nats://127.0.0.1:4222";
    let name = unique("out").replace('-', "_");
    let dir = tempfile::tempdir().unwrap();
    let docs = generate(3_000, 150, 73);
    write_lines(&dir.path().join("views.jsonl"), &docs);
    let (json_subject, debezium_subject) = (format!("{name}.json"), format!("{name}.debezium"));
    let yaml = pipeline_to(
        &format!("nats: {{url: \"{URL}\", stream: {name}}}"),
        "subject",
        &[
            (&json_subject, "json", false),
            (&debezium_subject, "debezium", false),
        ],
    );
    std::fs::write(dir.path().join("pipeline.yaml"), yaml).unwrap();
    let out = sluice(dir.path(), &["run", "pipeline.yaml"]);
    let read =
        |subject: &str| block_on(sluice_nats_output::read::read_subject(URL, subject)).unwrap();
    let messages = (out.status.success()).then(|| (read(&json_subject), read(&debezium_subject)));
    block_on(async {
        let admin = sluice_nats::admin::Admin::connect(URL).await.unwrap();
        admin.delete_stream(&name).await.unwrap();
    });
    assert_success(&out);
    let (json, debezium) = messages.unwrap();

    let expected = model(&docs, &mut BTreeMap::new());
    for (format, messages) in [("json", json), ("debezium", debezium)] {
        let stamped = messages.into_iter().map(|m| {
            let value = String::from_utf8(m.payload.to_vec()).unwrap();
            (m.stamp.txn, m.stamp.index, value)
        });
        assert_batches(format, &group(stamped), &expected);
    }
}

#[test]
fn kafka_topics_get_every_transactions_changes_once_in_order() {
    // The local tansu (`.ci/services` starts it); its topics are not deleted: tansu
    // 0.6 stops serving when a topic is deleted under a fetch. Names are unique.
    const BROKERS: &str = "127.0.0.1:9092";
    let name = unique("out");
    let dir = tempfile::tempdir().unwrap();
    let docs = generate(3_000, 150, 74);
    write_lines(&dir.path().join("views.jsonl"), &docs);
    let (json_topic, debezium_topic) = (format!("{name}-json"), format!("{name}-debezium"));
    let yaml = pipeline_to(
        &format!("kafka: {{brokers: \"{BROKERS}\"}}"),
        "partitions: 3, topic",
        &[
            (&json_topic, "json", false),
            (&debezium_topic, "debezium", false),
        ],
    );
    std::fs::write(dir.path().join("pipeline.yaml"), yaml).unwrap();
    assert_success(&sluice(dir.path(), &["run", "pipeline.yaml"]));

    let expected = model(&docs, &mut BTreeMap::new());
    let brokers = [BROKERS.to_string()];
    for (format, topic) in [("json", &json_topic), ("debezium", &debezium_topic)] {
        let mut messages =
            block_on(sluice_kafka_output::read::read_topic(&brokers, topic)).unwrap();
        assert!(
            messages.iter().any(|m| m.partition > 0),
            "the keys spread over the topic's partitions"
        );
        // Partitions interleave; a transaction's messages are ordered by their index.
        messages.sort_by_key(|m| (m.stamp.txn, m.stamp.index));
        let stamped = messages.into_iter().map(|m| {
            (
                m.stamp.txn,
                m.stamp.index,
                String::from_utf8(m.value).unwrap(),
            )
        });
        assert_batches(format, &group(stamped), &expected);
    }
}

/// What a destination holds, per generation (`None`: written with no generation), oldest
/// first: each generation's batches, (transaction, message values).
type Generations = Vec<(Option<String>, Vec<(u64, Vec<String>)>)>;

/// Runs the reset scenario in `dir` (its `pipeline.yaml` written): a run, more input, a
/// run, `sluice apply --delete`, a run, more input, a run. Returns the input of the
/// first generation and all the input.
fn run_reset_scenario(dir: &Path, seed: u64) -> (Vec<Value>, Vec<Value>) {
    let docs = generate(3_000, 150, seed);
    let input = dir.join("views.jsonl");
    write_lines(&input, &docs[..1_000]);
    assert_success(&sluice(dir, &["run", "pipeline.yaml"]));
    write_lines(&input, &docs[..2_000]);
    assert_success(&sluice(dir, &["run", "pipeline.yaml"]));
    assert_success(&sluice(dir, &["apply", "--delete", "pipeline.yaml"]));
    assert_success(&sluice(dir, &["run", "pipeline.yaml"]));
    write_lines(&input, &docs);
    assert_success(&sluice(dir, &["run", "pipeline.yaml"]));
    (docs[..2_000].to_vec(), docs)
}

/// What a reset promises: the destination holds two generations; the first holds the
/// changes of the input before the reset, the second every change of the whole input
/// from an empty view, transaction by transaction, and its changes alone reduce to the
/// model.
fn assert_reset_published(generations: &Generations, before: &[Value], all: &[Value]) {
    let (_, newest) = generations.last().expect("the destination holds nothing");
    assert_eq!(
        replay(newest),
        reduce_expected(all),
        "the newest generation's changes, from an empty view, reduce to the model"
    );
    let names: Vec<_> = generations.iter().map(|(g, _)| g.clone()).collect();
    assert_eq!(names.len(), 2, "a reset starts a new generation: {names:?}");
    assert!(
        names.iter().all(Option::is_some) && names[0] != names[1],
        "every message names its generation, and a reset makes a new one: {names:?}"
    );
    assert_batches(
        "json",
        &generations[0].1,
        &model(before, &mut BTreeMap::new()),
    );
    assert_batches("json", newest, &model(all, &mut BTreeMap::new()));
}

/// A files binding's folder, by generation (in name order, which puts a later
/// generation after an earlier one).
fn file_generations(folder: &Path) -> Generations {
    by_generation(
        (batch_files(folder).into_iter())
            .flat_map(|(generation, txn, _, lines)| {
                let generation = generation.map(|g| g.to_string());
                (0..)
                    .zip(lines)
                    .map(move |(index, line)| (generation.clone(), txn, index, line))
            })
            .collect(),
    )
}

#[test]
fn a_reset_files_output_starts_a_new_generation_with_every_change() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("pipeline.yaml"),
        pipeline(&[("json", "json", false)]),
    )
    .unwrap();
    let (before, all) = run_reset_scenario(dir.path(), 75);
    let generations = file_generations(&dir.path().join("out/json"));
    assert_reset_published(&generations, &before, &all);
}

/// Messages stamped (generation, transaction, index, value), grouped by generation in
/// the order given, each generation's into batches ([`group`]).
fn by_generation(messages: Vec<(Option<String>, u64, u64, String)>) -> Generations {
    type Stamped = Vec<(u64, u64, String)>;
    let mut generations: Vec<(Option<String>, Stamped)> = Vec::new();
    for (generation, txn, index, value) in messages {
        match generations.iter_mut().find(|(g, _)| *g == generation) {
            Some((_, of)) => of.push((txn, index, value)),
            None => generations.push((generation, vec![(txn, index, value)])),
        }
    }
    (generations.into_iter())
        .map(|(generation, messages)| (generation, group(messages)))
        .collect()
}

#[test]
fn a_reset_nats_output_starts_a_new_generation_with_every_change() {
    const URL: &str = "nats://127.0.0.1:4222";
    let name = unique("reset").replace('-', "_");
    let dir = tempfile::tempdir().unwrap();
    let subject = format!("{name}.json");
    let yaml = pipeline_to(
        &format!("nats: {{url: \"{URL}\", stream: {name}}}"),
        "subject",
        &[(&subject, "json", false)],
    );
    std::fs::write(dir.path().join("pipeline.yaml"), yaml).unwrap();
    let ran = std::panic::catch_unwind(|| run_reset_scenario(dir.path(), 76));
    let messages = ran
        .is_ok()
        .then(|| block_on(sluice_nats_output::read::read_subject(URL, &subject)).unwrap());
    block_on(async {
        let admin = sluice_nats::admin::Admin::connect(URL).await.unwrap();
        admin.delete_stream(&name).await.unwrap();
    });
    let (before, all) = ran.unwrap();
    let stamped = (messages.unwrap().into_iter())
        .map(|m| {
            let value = String::from_utf8(m.payload.to_vec()).unwrap();
            (
                m.stamp.generation.map(|g| g.to_string()),
                m.stamp.txn,
                m.stamp.index,
                value,
            )
        })
        .collect();
    assert_reset_published(&by_generation(stamped), &before, &all);
}

#[test]
fn a_reset_kafka_output_starts_a_new_generation_with_every_change() {
    const BROKERS: &str = "127.0.0.1:9092";
    let topic = unique("reset");
    let dir = tempfile::tempdir().unwrap();
    let yaml = pipeline_to(
        &format!("kafka: {{brokers: \"{BROKERS}\"}}"),
        "partitions: 3, topic",
        &[(&topic, "json", false)],
    );
    std::fs::write(dir.path().join("pipeline.yaml"), yaml).unwrap();
    let (before, all) = run_reset_scenario(dir.path(), 77);
    let brokers = [BROKERS.to_string()];
    let mut messages = block_on(sluice_kafka_output::read::read_topic(&brokers, &topic)).unwrap();
    // Generations are named so that a later one sorts after an earlier one; partitions
    // interleave, a transaction's messages are ordered by their index.
    messages.sort_by(|a, b| {
        let key = |m: &sluice_kafka_output::read::Written| {
            (
                m.stamp.generation.map(|g| g.to_string()),
                m.stamp.txn,
                m.stamp.index,
            )
        };
        key(a).cmp(&key(b))
    });
    let stamped = (messages.into_iter())
        .map(|m| {
            let value = String::from_utf8(m.value).unwrap();
            (
                m.stamp.generation.map(|g| g.to_string()),
                m.stamp.txn,
                m.stamp.index,
                value,
            )
        })
        .collect();
    assert_reset_published(&by_generation(stamped), &before, &all);
}
