//! A Kafka topic of 500 partitions through a shard's etcd log: a transaction of many
//! small steps (each reading a few partitions, as a trickle or a backlog fetched a
//! partition at a time makes them) is journaled within etcd's record limit, reads back
//! as written, and replays every message. Each step's position names all 500
//! partitions' next offsets; the log stores each after the first as what changed.
//!
//! Needs the local broker (tansu on 127.0.0.1:9092, started if none answers).

use sluice_cluster::etcd::{Cond, Etcd, Op};
use sluice_cluster::keys::{Keys, ShardDef, ShardId};
use sluice_cluster::log::{MAX_RECORD, SharedLog};
use sluice_kafka::admin::Admin;
use sluice_kafka::{KafkaConfig, KafkaFormat, KafkaSource, Start};
use sluice_runtime::pipeline::OpenLog;
use sluice_runtime::recovery::{Checkpoint, Intent, RecoveryError, RecoveryLog};
use sluice_source_sdk::{QueueLimits, Records, Resume, Source};
use sluice_testkit::etcd::PrivateEtcd;
use sluice_testkit::tansu::{LOCAL_BROKER, ensure_local_broker};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 500;
const PER_PARTITION: usize = 3;

async fn blocking<T: Send + 'static>(
    mut log: RecoveryLog,
    f: impl FnOnce(&mut RecoveryLog) -> Result<T, RecoveryError> + Send + 'static,
) -> (RecoveryLog, Result<T, RecoveryError>) {
    tokio::task::spawn_blocking(move || {
        let result = f(&mut log);
        (log, result)
    })
    .await
    .unwrap()
}

fn config(topic: &str) -> KafkaConfig {
    KafkaConfig {
        brokers: vec![LOCAL_BROKER.to_string()],
        topic: topic.to_string(),
        partitions: None,
        start: Start::Earliest,
        format: KafkaFormat::Json,
        partitioned_by: None,
        meta: None,
        fetch_wait: Duration::from_millis(10),
        tls: None,
        sasl: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_over_500_partitions_is_journaled_in_etcd_and_replays_every_message() {
    ensure_local_broker().unwrap();
    let admin = Admin::connect(&[LOCAL_BROKER.to_string()]).await.unwrap();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let topic = format!("cluster-intent-{}-{nanos:x}", std::process::id());
    admin.create_topic(&topic, PARTITIONS).await.unwrap();
    for p in 0..PARTITIONS {
        let messages = (0..PER_PARTITION).map(|i| {
            let value = serde_json::json!({"p": p, "i": i}).to_string();
            (None, value.into_bytes())
        });
        admin.produce(&topic, p, messages).await.unwrap();
    }
    let total = PARTITIONS as usize * PER_PARTITION;

    // One transaction's steps, a few records each.
    let mut source = KafkaSource::new("events", &config(&topic));
    source.extend();
    let limits = QueueLimits {
        max_records: 5,
        max_bytes: 1 << 20,
        max_journaled: u64::MAX,
    };
    let (mut steps, mut read) = (Vec::new(), 0);
    let deadline = Instant::now() + Duration::from_secs(120);
    while read < total {
        assert!(Instant::now() < deadline, "read {read} of {total}");
        let _ = tokio::time::timeout(Duration::from_millis(200), source.ready()).await;
        let mut out = Records::default();
        let step = source.queue(limits, &mut out).await.unwrap();
        if step.records > 0 {
            read += step.records;
            steps.push(step.resume);
        }
    }
    source.disconnect().await;
    let last = steps.last().and_then(Resume::position).unwrap().clone();
    let intent = Intent {
        txn: 1,
        steps: BTreeMap::from([("events".to_string(), steps)]),
        ..Default::default()
    };
    let plain = serde_json::to_vec(&intent).unwrap().len();
    let position = serde_json::to_vec(&last).unwrap().len();

    // Journaled, then committed, through a holder's etcd log.
    let server = PrivateEtcd::start();
    let etcd = Etcd::connect(&[server.url()], Duration::from_secs(2), None).unwrap();
    let keys = Keys::new("/test/kafka");
    let shard = ShardId {
        materialization: "views".into(),
        range: ShardDef::default(),
    };
    let assignment = keys.assignment(&shard);
    let put = Op::Put {
        key: assignment.clone(),
        value: b"a".to_vec(),
        lease: 0,
    };
    let token = (etcd.txn(vec![Cond::Absent(assignment)], vec![put], vec![]))
        .await
        .unwrap()
        .revision;
    let log = SharedLog::new(etcd.clone(), &keys, &shard, token)
        .open()
        .await
        .unwrap();
    let journaled = intent.clone();
    let (_, written) = blocking(log, move |l| l.write_intent(&journaled)).await;
    let steps = intent.steps["events"].len();
    eprintln!(
        "{steps} steps over {PARTITIONS} partitions: one position is {position} bytes, the \
         intent {plain} bytes as JSON"
    );
    if let Err(e) = written {
        panic!("journaling the intent: {e}");
    }
    let stored = etcd
        .get(&format!("{}intent", keys.log(&shard)))
        .await
        .unwrap()
        .expect("the intent is in etcd")
        .value
        .len();
    eprintln!("the intent as etcd holds it: {stored} bytes (limit {MAX_RECORD})");
    assert!(
        stored < MAX_RECORD / 8,
        "{stored} bytes: the record grows with the steps times the partitions"
    );

    // The next holder reads back exactly what was journaled, and replays every message.
    let log = SharedLog::new(etcd.clone(), &keys, &shard, token)
        .open()
        .await
        .unwrap();
    assert_eq!(log.pending_intent(), Some(&intent));
    let mut replayer = KafkaSource::new("events", &config(&topic));
    let mut replayed = 0;
    for step in &intent.steps["events"] {
        let mut out = Records::default();
        replayed += replayer.replay(step, &mut out).await.unwrap().records;
    }
    assert_eq!(replayed, total);
    replayer.disconnect().await;
    let commit = Checkpoint {
        txn: 1,
        sources: BTreeMap::from([("events".to_string(), last)]),
        ..Default::default()
    };
    let (log, committed) = blocking(log, move |l| l.commit(&commit)).await;
    committed.unwrap();
    assert_eq!(log.pending_intent(), None);
}
