//! A move by load cut short: three members of a private etcd run six shards of one
//! pipeline (a growing file of pageviews into PostgreSQL, `cluster.balance: load`).
//! Every document falls in two shards that rendezvous hashing gives one member, so that
//! member carries all the load and moves one of them to the least busy member: it
//! writes the shard's placement (`P/place/…`, on the target's lease), finishes its
//! transaction, and hands the shard over. The test watches the placements and SIGKILLs
//! the member a placement names the moment it appears, before that member claims the
//! shard. What users rely on:
//!
//! - the placement ends with the member it names: once that member's lease expires
//!   no placement names it (a placement left behind would hand the shard back to a
//!   member that joins again under the same name, whatever the load);
//! - the moved shard is claimed and run by a live member;
//! - the table ends equal to the reduction of every document appended.
//!
//! The kill is checked to have landed before the target's claim (its assignment does
//! not name it); a kill that came too late (the claim won the race) is a plain
//! failover: the member is started again and the next move is tried.

use crate::common;

use common::cluster::Members;
use common::{
    PATIENCE, POSTGRES_URL, Schema, append_lines, block_on, pipeline_yaml, postgres_table,
    reduce_expected,
};
use futures::StreamExt;
use serde_json::{Value, json};
use sluice_cluster::assign::owner;
use sluice_cluster::etcd::Etcd;
use sluice_cluster::keys::{Keys, ShardDef, ShardId};
use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const MEMBERS: [&str; 3] = ["a", "b", "c"];
const SHARDS: u32 = 6;
const MATERIALIZATION: &str = "views-db";
const PREFIX: &str = "/sluice/load-move";
/// Kills tried before one lands between the placement and the target's claim.
const ATTEMPTS: usize = 5;

/// Two shards of the member rendezvous hashing gives most shards.
fn hot_shards() -> [ShardDef; 2] {
    let members: BTreeSet<String> = MEMBERS.iter().map(|m| m.to_string()).collect();
    let ranges = ShardDef::split_evenly(SHARDS);
    let owner_of = |range: &ShardDef| {
        let id = ShardId {
            materialization: MATERIALIZATION.into(),
            range: *range,
        };
        owner(&members, &id).unwrap().to_string()
    };
    let busiest = (MEMBERS.iter())
        .max_by_key(|m| ranges.iter().filter(|r| owner_of(r) == **m).count())
        .unwrap();
    let mut theirs = ranges.iter().filter(|r| owner_of(r) == *busiest);
    [*theirs.next().unwrap(), *theirs.next().unwrap()]
}

/// 2,000 users whose keys fall in `hot`.
fn hot_users(hot: &[ShardDef; 2]) -> Vec<String> {
    (0..)
        .map(|i| format!("user-{i}"))
        .filter(|user| {
            let packed = sluice_doc::tuple::pack_key(&[json!(user)]);
            let hash = sluice_doc::hash::key_hash(&packed);
            hot.iter().any(|r| r.key_begin <= hash && hash <= r.key_end)
        })
        .take(2_000)
        .collect()
}

/// The `n`th document appended.
fn doc(users: &[String], n: usize) -> Value {
    json!({
        "user_id": users[n % users.len()],
        "views": 1 + n % 3,
        "bytes": 100 + n % 7,
        "last_seen": format!("2026-01-01T00:{:02}:{:02}Z", n / 60 % 60, n % 60),
    })
}

/// The placement written after revision `after` naming a running member, as (shard,
/// member, revision), once one is.
async fn next_placement(
    etcd: &Etcd,
    keys: &Keys,
    after: i64,
    running: &[String],
) -> (ShardId, String, i64) {
    let mut changes = Box::pin(etcd.watch(&[keys.placements()]).await.unwrap());
    loop {
        let (placed, _) = etcd.get_prefix(&keys.placements()).await.unwrap();
        let found = placed.iter().find_map(|kv| {
            let key = String::from_utf8_lossy(&kv.key);
            let (materialization, range) = keys.parse_shard(&keys.placements(), &key)?;
            let member = String::from_utf8_lossy(&kv.value).into_owned();
            let shard = ShardId {
                materialization: materialization.to_string(),
                range,
            };
            (kv.mod_revision > after && running.contains(&member)).then_some((
                shard,
                member,
                kv.mod_revision,
            ))
        });
        if let Some(found) = found {
            return found;
        }
        let changed = tokio::time::timeout(PATIENCE, changes.next()).await;
        changed
            .expect("no move by load within PATIENCE")
            .unwrap()
            .unwrap();
    }
}

/// Waits until `member`'s lease has expired (its member key is gone).
async fn until_gone(etcd: &Etcd, keys: &Keys, member: &str) {
    let started = Instant::now();
    while etcd.get(&keys.member(member)).await.unwrap().is_some() {
        assert!(
            started.elapsed() < PATIENCE,
            "{member}'s lease never expired"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn a_member_killed_before_claiming_a_shard_moved_to_it_leaves_it_run_elsewhere_and_exact() {
    let etcd_server = sluice_testkit::etcd::PrivateEtcd::start();
    let schema = Schema::new("cluster_load_move");
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!(
        "postgres: {{url: \"{POSTGRES_URL}\", schema: {}}}",
        schema.0
    );
    let source = "    file: {path: views.jsonl, format: json}";
    let yaml = pipeline_yaml(source, &endpoint, false, 2_000, "300ms");
    let yaml = format!(
        "{yaml}cluster:\n  etcd: [\"{}\"]\n  member: ${{MEMBER}}\n  prefix: {PREFIX}\n  \
         lease_ttl: 3s\n  shards: {SHARDS}\n  balance: load\n  balance_interval: 2s\n",
        etcd_server.url()
    );
    let pipeline = dir.path().join("load-move.yaml");
    std::fs::write(&pipeline, yaml).unwrap();
    let input = dir.path().join("views.jsonl");
    let users = Arc::new(hot_users(&hot_shards()));
    append_lines(&input, &[doc(&users, 0)]);

    // About 1,000 documents a second, all in the two hot shards.
    let appended = Arc::new(AtomicUsize::new(1));
    let appending = Arc::new(AtomicBool::new(true));
    let appender = {
        let (users, appended, appending) = (users.clone(), appended.clone(), appending.clone());
        std::thread::spawn(move || {
            while appending.load(Ordering::SeqCst) {
                let from = appended.load(Ordering::SeqCst);
                let docs: Vec<Value> = (from..from + 100).map(|n| doc(&users, n)).collect();
                append_lines(&input, &docs);
                appended.store(from + 100, Ordering::SeqCst);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };

    let mut members = Members::new(dir.path(), &pipeline);
    for m in MEMBERS {
        members.start(m, &[]);
    }
    let keys = Keys::new(PREFIX);
    let mut seen = 0;
    let mut landed = None;
    for attempt in 1..=ATTEMPTS {
        let running: Vec<String> = members.running.iter().map(|(m, _)| m.clone()).collect();
        let (shard, target, claimed) = block_on(async {
            // A client of this runtime (its connection lives on it).
            let etcd = Etcd::connect(&[etcd_server.url()], Duration::from_secs(5), None).unwrap();
            let (shard, target, at) = next_placement(&etcd, &keys, seen, &running).await;
            seen = at;
            members.kill(&target);
            let holder = etcd.get(&keys.assignment(&shard)).await.unwrap();
            let claimed = holder.is_some_and(|kv| kv.value == target.as_bytes());
            // The placement ends with the member it names.
            until_gone(&etcd, &keys, &target).await;
            let (placed, _) = etcd.get_prefix(&keys.placements()).await.unwrap();
            let named: Vec<String> = (placed.iter())
                .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
                .collect();
            assert!(
                !named.contains(&target),
                "a placement outlived the member it names, {target}: {named:?}"
            );
            (shard, target, claimed)
        });
        eprintln!(
            "attempt {attempt}: {shard} placed on {target}, killed; it had claimed: {claimed}"
        );
        if !claimed {
            landed = Some(shard);
            break;
        }
        members.start(&target, &[]);
    }
    let shard = landed.expect("no kill landed between a placement and its target's claim");

    // The moved shard runs on a live member.
    let started = Instant::now();
    loop {
        let shards = members.list();
        let running = shards.iter().any(|s| {
            s["shard"] == shard.range.id().as_str()
                && s["status"] == "running"
                && (s["member"].as_str())
                    .is_some_and(|m| members.running.iter().any(|(name, _)| name == m))
        });
        if running {
            break;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "{shard} is not run by a live member: {shards:#?}\n{}",
            members.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    appending.store(false, Ordering::SeqCst);
    appender.join().unwrap();
    let appended = appended.load(Ordering::SeqCst);
    let docs: Vec<Value> = (0..appended).map(|n| doc(&users, n)).collect();
    let expected = reduce_expected(&docs);
    let started = Instant::now();
    while postgres_table(&schema.0) != expected {
        assert!(
            started.elapsed() < PATIENCE,
            "not exact after {PATIENCE:?}\n{}",
            members.logs()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}
