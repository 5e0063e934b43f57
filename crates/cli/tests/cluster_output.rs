//! An output under `cluster:` (two members of a private etcd): the NATS output, its view
//! (each key's last document, the checkpoint, the fence) kept in PostgreSQL with
//! `view: {url, schema}`, where every member reaches it. A binding's changes are one
//! ordered stream, so the materialization runs as one shard whatever `cluster.shards`
//! says, and a split is refused naming the endpoint. The holder is SIGKILLed three times
//! while the input grows, each victim rejoining under its name; then a holder is
//! SIGSTOPped past its lease and resumed, a zombie whose late messages the subject must
//! refuse (it exits fenced). The subject then holds every transaction's batch once, in
//! order, each change fitting the view before it, and its changes reduce to the model
//! of every document appended.

use crate::common;

use common::changes::{group, replay};
use common::cluster::Members;
use common::{
    Growing, PATIENCE, POSTGRES_URL, Row, Schema, append_lines, block_on, generate, pipeline_yaml,
    reduce_expected, signal,
};
use sluice_testkit::etcd::PrivateEtcd;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const NATS: &str = "nats://127.0.0.1:4222";

/// The pageviews pipeline publishing JSON changes to `subject` of `stream`, its view in
/// `schema`, in transactions of 500 documents or 200 ms, under `cluster:` asking for
/// three shards (a 3 s lease).
fn pipeline(etcd: &str, stream: &str, subject: &str, schema: &str) -> String {
    let endpoint = format!(
        "nats: {{url: \"{NATS}\", stream: {stream}, view: {{url: \"{POSTGRES_URL}\", schema: {schema}}}}}"
    );
    let yaml = pipeline_yaml(
        "    file: {path: views.jsonl, format: json}",
        &endpoint,
        false,
        500,
        "200ms",
    )
    .replace(
        "resource: {table: pageviews}",
        &format!("resource: {{subject: {subject}, format: json}}"),
    );
    format!(
        "{yaml}cluster:\n  etcd: [\"{etcd}\"]\n  member: ${{MEMBER}}\n  lease_ttl: 3s\n  shards: 3\n"
    )
}

/// What the subject's changes say each user's document is, read from the server
/// (grouping and replaying check every batch's order and every change on the way).
fn published(subject: &str) -> BTreeMap<String, Row> {
    let messages = block_on(sluice_nats_output::read::read_subject(NATS, subject)).unwrap();
    let generations: Vec<_> = messages.iter().map(|m| m.stamp.generation).collect();
    assert!(
        generations
            .iter()
            .all(|g| g.is_some() && *g == generations[0]),
        "every holder writes the one generation of the shared view: {:?}",
        generations.first()
    );
    let stamped = messages.into_iter().map(|m| {
        let value = String::from_utf8(m.payload.to_vec()).unwrap();
        (m.stamp.txn, m.stamp.index, value)
    });
    replay(&group(stamped))
}

/// Deletes the test's stream when dropped.
struct Stream(String);

impl Drop for Stream {
    fn drop(&mut self) {
        block_on(async {
            let admin = sluice_nats::admin::Admin::connect(NATS).await.unwrap();
            let _ = admin.delete_stream(&self.0).await;
        });
    }
}

#[test]
fn an_output_runs_as_one_shard_that_moves_between_members_and_publishes_each_change_once() {
    let etcd = PrivateEtcd::start();
    let schema = Schema::new("cluster_output");
    let stream = Stream(format!("sluice_cluster_output_{}", std::process::id()));
    let subject = format!("{}.views", stream.0);
    let dir = tempfile::tempdir().unwrap();
    let pipeline_path = dir.path().join("cluster.yaml");
    std::fs::write(
        &pipeline_path,
        pipeline(&etcd.url(), &stream.0, &subject, &schema.0),
    )
    .unwrap();
    let input = dir.path().join("views.jsonl");
    let docs = generate(150_000, 400, 41);
    append_lines(&input, &docs[..2_000]);

    let mut members = Members::new(dir.path(), &pipeline_path);
    for m in ["a", "b"] {
        members.start(m, &[]);
    }
    let mut stints = vec![members.holder()];
    let listed = members.list();
    assert_eq!(
        listed.len(),
        1,
        "one shard, not cluster.shards: {listed:#?}"
    );
    let out = members.shards("split", &["views-db", "00000000-ffffffff"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("its endpoint (a nats driver)")
            && err.contains("one ordered stream"),
        "{err}"
    );

    // The input grows, 200 documents every 100 ms, while holders are killed.
    let growing = Growing::start(&input, &docs, 2_000);
    for _ in 0..3 {
        std::thread::sleep(Duration::from_secs(2));
        members.kill_holder_and_rejoin(&mut stints);
    }

    // A holder stopped past its lease: the other member takes the shard over and goes
    // on publishing; resumed, the zombie may still push what it had in hand, which the
    // subject refuses, and it exits fenced.
    std::thread::sleep(Duration::from_secs(2));
    let zombie = members.holder();
    let at = members
        .running
        .iter()
        .position(|(m, _)| *m == zombie)
        .unwrap();
    signal(&members.running[at].1, "STOP");
    let started = Instant::now();
    let successor = loop {
        let shards = members.list();
        let member = shards[0]["member"].as_str().unwrap_or_default().to_string();
        if shards[0]["status"] == "running" && !member.is_empty() && member != zombie {
            break member;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "no member took over from the stopped holder: {shards:#?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("stopped {zombie}, the holder; {successor} holds the shard now");
    // The successor publishes past where the zombie stopped before it resumes.
    std::thread::sleep(Duration::from_secs(2));
    signal(&members.running[at].1, "CONT");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = members.running[at].1.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the zombie did not exit\n{}",
            members.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let log = std::fs::read_to_string(dir.path().join(format!("{zombie}.log"))).unwrap();
    assert!(
        !status.success() && log.contains("fenced"),
        "the zombie did not exit fenced ({status}):\n{log}"
    );
    members.running.swap_remove(at);

    let appended = growing.stop(&docs);
    assert!(
        (stints.iter().enumerate()).any(|(i, m)| stints[..i.saturating_sub(1)].contains(m)),
        "a member took the shard back after another held it: {stints:?}"
    );

    let expected = reduce_expected(&docs[..appended]);
    let started = Instant::now();
    loop {
        let found = published(&subject);
        if found == expected {
            break;
        }
        if started.elapsed() > PATIENCE {
            let lost = expected.keys().filter(|k| !found.contains_key(*k)).count();
            let wrong = (found.iter())
                .filter(|(k, row)| expected.get(*k) != Some(row))
                .count();
            panic!(
                "not exact after {PATIENCE:?}: {lost} users missing, {wrong} users whose \
                 changes do not end at their reduction\n{}",
                members.logs()
            );
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}
