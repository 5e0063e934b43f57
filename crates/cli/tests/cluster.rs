//! Sluice as a cluster: `sluice run` processes of one pipeline file, members of a
//! private etcd member, share its shards and write one PostgreSQL table, while an
//! appender grows the input. Every end state is compared with the independent model
//! (each user's row once, equal to the reduction of every document appended):
//! - a member SIGKILLed: its shards move once its lease expires, and the end is exact;
//! - a member SIGSTOPped past its lease, then resumed: it is fenced and exits, and the
//!   end is exact;
//! - a shard split under load: exact, with the halves running;
//! - etcd restarted mid-run: the members ride it out, and the end is exact;
//! - a shard whose store one member cannot open: that member releases and declines
//!   it while its other shard runs on, the other member runs it, and both ends are
//!   exact;
//! - a part that keeps state on one machine is refused under `cluster:`, naming why;
//! - so is a store that cannot fence a former holder (Redis, an external driver
//!   declaring `non_transactional` or nothing).

use crate::common;

use common::{
    POSTGRES_URL, SLUICE, Schema, block_on, generate, pipeline_yaml, postgres_table,
    reduce_expected, signal, sqlite_table,
};
use serde_json::Value;
use sluice_cluster::etcd::Etcd;
use sluice_cluster::keys::Keys;
use sluice_testkit::etcd::PrivateEtcd;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The lease TTL of the tests' members.
const TTL: Duration = Duration::from_secs(3);

/// One cluster test: the etcd member, the table's schema, the folder with the input
/// and the pipeline file, the members, and the appender.
struct Cluster {
    etcd: PrivateEtcd,
    schema: Schema,
    dir: tempfile::TempDir,
    pipeline: PathBuf,
    members: Vec<(String, Option<Child>)>,
    appended: Arc<Mutex<Vec<Value>>>,
    appending: Arc<AtomicBool>,
    appender: Option<std::thread::JoinHandle<()>>,
}

impl Cluster {
    /// A cluster of `shards` first shards over an input holding `first` documents.
    fn new(tag: &str, shards: u32, first: &[Value]) -> Cluster {
        Cluster::with_more(tag, shards, first, "")
    }

    /// [`Cluster::new`], with `more` materializations (YAML under `materializations:`)
    /// beside `views-db`.
    fn with_more(tag: &str, shards: u32, first: &[Value], more: &str) -> Cluster {
        let etcd = PrivateEtcd::start();
        let schema = Schema::new(&format!("cluster_{tag}"));
        let dir = tempfile::tempdir().unwrap();
        let endpoint = format!(
            "postgres: {{url: \"{POSTGRES_URL}\", schema: {}}}",
            schema.0
        );
        let yaml = pipeline_yaml(
            "    file: {path: views.jsonl, format: json}",
            &endpoint,
            false,
            2000,
            "200ms",
        );
        let yaml = yaml.replacen("runtime:\n", &format!("{more}runtime:\n"), 1);
        let yaml = format!(
            "{yaml}cluster:\n  etcd: [\"{}\"]\n  member: ${{MEMBER}}\n  lease_ttl: {}s\n  shards: {shards}\n",
            etcd.url(),
            TTL.as_secs()
        );
        let pipeline = dir.path().join("cluster.yaml");
        std::fs::write(&pipeline, yaml).unwrap();
        let cluster = Cluster {
            etcd,
            schema,
            dir,
            pipeline,
            members: Vec::new(),
            appended: Arc::new(Mutex::new(Vec::new())),
            appending: Arc::new(AtomicBool::new(false)),
            appender: None,
        };
        cluster.append(first);
        cluster
    }

    /// A cluster of `shards` first shards, `members` running them, the first third of
    /// `docs` in the input and the rest being appended.
    fn under_load(tag: &str, shards: u32, members: &[&str], docs: &[Value]) -> Cluster {
        let third = docs.len() / 3;
        let mut c = Cluster::new(tag, shards, &docs[..third]);
        for m in members {
            c.start(m);
        }
        c.wait_running_on(members, Duration::from_secs(30));
        c.append_slowly(docs[third..].to_vec());
        std::thread::sleep(Duration::from_millis(500));
        c
    }

    fn append(&self, docs: &[Value]) {
        append(&self.dir.path().join("views.jsonl"), &self.appended, docs);
    }

    /// Appends `docs` a batch every 100 ms, in the background.
    fn append_slowly(&mut self, docs: Vec<Value>) {
        let (path, appended) = (self.dir.path().join("views.jsonl"), self.appended.clone());
        let appending = self.appending.clone();
        appending.store(true, Ordering::SeqCst);
        self.appender = Some(std::thread::spawn(move || {
            for batch in docs.chunks(500) {
                append(&path, &appended, batch);
                std::thread::sleep(Duration::from_millis(100));
            }
            appending.store(false, Ordering::SeqCst);
        }));
    }

    fn finish_appending(&mut self) {
        if let Some(appender) = self.appender.take() {
            appender.join().unwrap();
        }
    }

    fn start(&mut self, member: &str) {
        self.start_in(member, self.dir.path().to_path_buf());
    }

    /// Starts `member` in the working folder `cwd`.
    fn start_in(&mut self, member: &str, cwd: PathBuf) {
        let log = std::fs::File::create(self.dir.path().join(format!("{member}.log"))).unwrap();
        let child = Command::new(SLUICE)
            .current_dir(cwd)
            .arg("run")
            .arg(&self.pipeline)
            .env("MEMBER", member)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.members.push((member.to_string(), Some(child)));
    }

    fn child(&mut self, member: &str) -> &mut Child {
        self.members
            .iter_mut()
            .find(|(m, _)| m == member)
            .and_then(|(_, c)| c.as_mut())
            .expect("a running member")
    }

    fn log(&self, member: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{member}.log"))).unwrap_or_default()
    }

    /// `sluice shards <verb> <pipeline> <args>`, which must succeed; its output.
    fn shards_command(&self, verb: &str, args: &[&str]) -> String {
        let out = Command::new(SLUICE)
            .args(["shards", verb])
            .arg(&self.pipeline)
            .args(args)
            .env("MEMBER", "cli")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// `sluice shards list --json`.
    fn shards(&self) -> Vec<Value> {
        serde_json::from_str::<Value>(&self.shards_command("list", &["--json"]))
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    }

    /// Waits until every shard runs on one of `members`.
    fn wait_running_on(&self, members: &[&str], within: Duration) -> Duration {
        let started = Instant::now();
        loop {
            let shards = self.shards();
            let settled = !shards.is_empty()
                && shards
                    .iter()
                    .all(|s| s["status"] == "running" && members.iter().any(|m| s["member"] == *m));
            if settled {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < within,
                "shards not running on {members:?} after {within:?}: {shards:#?}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Watches etcd (every 5 ms) after `victim` died: how long until its member key
    /// went with its lease, and until every shard was claimed by one of `survivors`.
    fn failover(&self, victim: &str, survivors: &[&str], within: Duration) -> (Duration, Duration) {
        let keys = Keys::new("/sluice/cluster");
        let started = Instant::now();
        let mut expired = None;
        block_on(async {
            let etcd = Etcd::connect(&[self.etcd.url()], Duration::from_secs(5), None).unwrap();
            loop {
                assert!(
                    started.elapsed() < within,
                    "the shards of {victim} did not move within {within:?}\n{}",
                    self.logs()
                );
                if expired.is_none() && etcd.get(&keys.member(victim)).await.unwrap().is_none() {
                    expired = Some(started.elapsed());
                }
                let (shards, _) = etcd.get_prefix(&keys.shards()).await.unwrap();
                let (assigned, _) = etcd.get_prefix(&keys.assignments()).await.unwrap();
                let holders: Vec<String> = (assigned.iter())
                    .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
                    .collect();
                if let Some(expired) = expired
                    && holders.len() == shards.len()
                    && holders.iter().all(|h| survivors.contains(&h.as_str()))
                {
                    return (expired, started.elapsed());
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    }

    fn logs(&self) -> String {
        (self.members.iter())
            .map(|(m, _)| format!("--- {m}\n{}", tail(&self.log(m), 30)))
            .collect()
    }

    /// Waits (after the appender ends) until the table equals the model of every
    /// document appended: 0 lost, 0 doubled, 0 mismatched.
    fn assert_exact(&mut self) {
        self.finish_appending();
        let expected = reduce_expected(&self.appended.lock().unwrap());
        let started = Instant::now();
        loop {
            let table = postgres_table(&self.schema.0);
            if table == expected {
                return;
            }
            if started.elapsed() > Duration::from_secs(60) {
                let lost = expected.keys().filter(|k| !table.contains_key(*k)).count();
                let extra = table.keys().filter(|k| !expected.contains_key(*k)).count();
                let mismatched = (expected.iter())
                    .filter(|(k, v)| table.get(*k).is_some_and(|t| t != *v))
                    .count();
                panic!(
                    "not exact after 60s: {lost} lost, {extra} not in the model, {mismatched} \
                     mismatched\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.appending.store(false, Ordering::SeqCst);
        for (_, child) in &mut self.members {
            if let Some(mut child) = child.take() {
                // A stopped member dies of SIGKILL too.
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

fn append(path: &Path, appended: &Mutex<Vec<Value>>, docs: &[Value]) {
    let mut text = String::new();
    for doc in docs {
        text.push_str(&doc.to_string());
        text.push('\n');
    }
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    file.write_all(text.as_bytes()).unwrap();
    appended.lock().unwrap().extend_from_slice(docs);
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n") + "\n"
}

#[test]
fn a_killed_members_shards_move_after_its_lease_and_the_end_is_exact() {
    let docs = generate(30_000, 3_000, 21);
    let mut c = Cluster::under_load("kill", 4, &["a", "b", "c"], &docs);
    let victim = c
        .shards()
        .iter()
        .filter_map(|s| s["member"].as_str().map(str::to_string))
        .next()
        .unwrap();
    c.child(&victim).kill().unwrap();
    let survivors: Vec<&str> = ["a", "b", "c"]
        .into_iter()
        .filter(|m| *m != victim)
        .collect();
    // Its lease expires within the TTL; then the owners, woken by the change, claim.
    let (expired, moved) = c.failover(&victim, &survivors, 2 * TTL + Duration::from_secs(5));
    eprintln!(
        "failover of {victim}: its lease expired {expired:?} after its SIGKILL (TTL \
         {TTL:?}); its shards were claimed {:?} after that",
        moved - expired
    );
    c.assert_exact();
}

#[test]
fn a_member_stopped_past_its_lease_is_fenced_and_exits_and_the_end_is_exact() {
    let docs = generate(30_000, 3_000, 22);
    let mut c = Cluster::under_load("zombie", 2, &["a", "b"], &docs);
    signal(c.child("a"), "STOP");
    // b takes every shard once a's lease expires, while a sleeps.
    c.wait_running_on(&["b"], 2 * TTL + Duration::from_secs(5));
    std::thread::sleep(Duration::from_secs(1));
    signal(c.child("a"), "CONT");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = c.child("a").try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the zombie did not exit\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!status.success(), "the zombie exited successfully");
    let log = c.log("a");
    assert!(
        log.contains("fenced"),
        "the zombie's error does not say it was fenced:\n{}",
        tail(&log, 20)
    );
    c.assert_exact();
}

#[test]
fn a_shard_split_under_load_ends_exact_with_both_halves_running() {
    let docs = generate(30_000, 3_000, 23);
    let mut c = Cluster::under_load("split", 1, &["a", "b"], &docs);
    let out = c.shards_command("split", &["views-db", "00000000-ffffffff"]);
    assert!(
        out.contains("00000000-7fffffff and 80000000-ffffffff"),
        "{out}"
    );
    c.wait_running_on(&["a", "b"], Duration::from_secs(30));
    let shards: Vec<String> = c
        .shards()
        .iter()
        .map(|s| s["shard"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(shards, ["00000000-7fffffff", "80000000-ffffffff"]);
    c.assert_exact();
}

#[test]
fn members_ride_out_an_etcd_restart_and_the_end_is_exact() {
    let docs = generate(30_000, 3_000, 24);
    let mut c = Cluster::under_load("etcd", 2, &["a", "b"], &docs);
    c.etcd.restart(Duration::from_secs(1));
    for m in ["a", "b"] {
        assert!(
            c.child(m).try_wait().unwrap().is_none(),
            "member {m} exited when etcd restarted\n{}",
            c.logs()
        );
    }
    c.assert_exact();
    c.wait_running_on(&["a", "b"], Duration::from_secs(30));
}

#[test]
fn a_part_that_keeps_state_on_one_machine_is_refused_naming_why() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = pipeline_yaml(
        "    file: {path: views.jsonl, format: json}",
        "files: {directory: out}",
        false,
        100,
        "1s",
    );
    let pipeline = dir.path().join("p.yaml");
    let cluster = "cluster:\n  etcd: [\"127.0.0.1:2379\"]\n  member: a\n";
    std::fs::write(&pipeline, format!("{yaml}{cluster}")).unwrap();
    let out = Command::new(SLUICE)
        .arg("check")
        .arg(&pipeline)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("materializations.views-db.endpoint")
            && err.contains("files cannot run under `cluster:`"),
        "{err}"
    );
    assert!(
        err.contains("keeps its view beside the local recovery log")
            && err.contains("`view: {url: postgres://…}`"),
        "the refusal names the fix: {err}"
    );
}

#[test]
fn an_output_runs_in_a_cluster_with_its_view_in_postgresql_unless_its_destination_cannot_refuse_a_former_holder()
 {
    let view = format!("view: {{url: \"{POSTGRES_URL}\"}}");
    for endpoint in [
        format!("files: {{directory: out, {view}}}"),
        format!("nats: {{url: \"nats://127.0.0.1:4222\", {view}}}"),
    ] {
        assert_eq!(check_under_cluster(&endpoint), Ok(()), "{endpoint}");
    }
    let err = check_under_cluster(&format!("kafka: {{brokers: \"127.0.0.1:9092\", {view}}}"))
        .unwrap_err();
    assert!(
        err.contains("a kafka cannot run under `cluster:`")
            && err.contains("Kafka has no conditional produce"),
        "{err}"
    );
}

/// `sluice check` of the pipeline over `endpoint` with a `cluster:` section: its stderr
/// when refused as unfit for a cluster, `Ok` when it passed that check (it may fail
/// later, connecting).
fn check_under_cluster(endpoint: &str) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let yaml = pipeline_yaml(
        "    file: {path: views.jsonl, format: json}",
        endpoint,
        false,
        100,
        "1s",
    );
    let pipeline = dir.path().join("p.yaml");
    let cluster = "delivery: at_least_once\ncluster:\n  etcd: [\"127.0.0.1:2379\"]\n  member: a\n";
    std::fs::write(&pipeline, format!("{yaml}{cluster}")).unwrap();
    std::fs::write(dir.path().join("views.jsonl"), "").unwrap();
    let out = Command::new(SLUICE)
        .arg("check")
        .arg(&pipeline)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    match err.contains("cannot run under `cluster:`") {
        true => Err(err),
        false => Ok(()),
    }
}

#[test]
fn a_store_that_cannot_fence_a_former_holder_is_refused_under_a_cluster_naming_why() {
    // (endpoint, refused naming this)
    let table = [
        (
            "redis: {url: \"redis://127.0.0.1:6379\"}",
            Some("a redis cannot run under `cluster:`"),
        ),
        (
            "command: {program: /bin/false, pattern: non_transactional}",
            Some("a command cannot run under `cluster:`"),
        ),
        (
            "command: {program: /bin/false}",
            Some("undeclared commit pattern counts as non-transactional"),
        ),
        (
            "grpc: {address: \"127.0.0.1:1\"}",
            Some("declare `pattern: authoritative` if the driver fences"),
        ),
        (
            "command: {program: /bin/false, pattern: authoritative}",
            None,
        ),
        ("sqlite: {path: views.db}", None),
    ];
    for (endpoint, refused) in table {
        let checked = check_under_cluster(endpoint);
        eprintln!("{endpoint}: {checked:?}");
        match (refused, checked) {
            (Some(naming), Err(err)) => {
                assert!(err.contains("materializations.views-db.endpoint"), "{err}");
                assert!(err.contains(naming), "{endpoint}: {err}");
                assert!(
                    err.contains("cannot fence a former holder")
                        && err.contains("roll a reduced value back"),
                    "{endpoint}: {err}"
                );
            }
            (None, Ok(())) => {}
            (Some(_), Ok(())) => panic!("{endpoint} was not refused under `cluster:`"),
            (None, Err(err)) => panic!("{endpoint} was refused: {err}"),
        }
    }
}

/// The shard of `materialization` (one shard) as `sluice shards list` shows it.
fn shard_of<'s>(shards: &'s [Value], materialization: &str) -> &'s Value {
    (shards.iter())
        .find(|s| s["materialization"] == materialization)
        .unwrap_or_else(|| panic!("no shard of {materialization}: {shards:#?}"))
}

#[test]
fn a_shard_whose_store_one_member_cannot_open_moves_and_that_members_other_shard_runs_on() {
    // `views-local` writes SQLite at /proc/self/cwd/local.db: the same spec for every
    // member, but each process's own working folder. Member `a`'s is writable; the
    // failing member's holds a folder named local.db, which SQLite cannot open (not
    // retryable), so only that member's loop of `views-local` fails, at its Open.
    let more = "  views-local:\n    endpoint:\n      sqlite: {path: /proc/self/cwd/local.db}\n    \
                bindings:\n      - source: acme/pageviews\n        resource: {table: pageviews}\n        \
                delta_updates: false\n";
    let docs = generate(20_000, 2_000, 25);
    let third = docs.len() / 3;
    let mut c = Cluster::with_more("declines", 1, &docs[..third], more);
    let whole = sluice_cluster::keys::ShardDef::default();
    let id = |materialization: &str| sluice_cluster::keys::ShardId {
        materialization: materialization.into(),
        range: whole,
    };
    // A failing member that rendezvous makes the owner of both shards against `a`: it
    // takes `views-db` over and runs it, and is offered `views-local`, which fails.
    let broken = (0..1000)
        .map(|i| format!("b{i}"))
        .find(|b| {
            let both: std::collections::BTreeSet<String> = ["a".to_string(), b.clone()].into();
            ["views-db", "views-local"]
                .iter()
                .all(|m| sluice_cluster::assign::owner(&both, &id(m)) == Some(b.as_str()))
        })
        .expect("a name owning both shards");
    let (a_dir, b_dir) = (c.dir.path().join("a"), c.dir.path().join(&broken));
    std::fs::create_dir_all(&a_dir).unwrap();
    std::fs::create_dir_all(b_dir.join("local.db")).unwrap();
    c.start_in("a", a_dir.clone());
    c.wait_running_on(&["a"], Duration::from_secs(30));
    c.append_slowly(docs[third..].to_vec());
    c.start_in(&broken, b_dir);
    // The failing member declines `views-local` (a runs it) and keeps `views-db`.
    let started = Instant::now();
    loop {
        let shards = c.shards();
        let (db, local) = (
            shard_of(&shards, "views-db"),
            shard_of(&shards, "views-local"),
        );
        let declined = c.log(&broken).contains("declining it");
        if declined && db["member"] == broken.as_str() && local["member"] == "a" {
            eprintln!(
                "{broken} declined views-local and runs views-db after {:?}",
                started.elapsed()
            );
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "not settled: {shards:#?}\n{}",
            c.logs()
        );
        assert!(
            c.child(&broken).try_wait().unwrap().is_none(),
            "{broken} exited\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    c.assert_exact();
    let expected = reduce_expected(&c.appended.lock().unwrap());
    let started = Instant::now();
    while sqlite_table(&a_dir.join("local.db")) != expected {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "views-local not exact after 60s\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for m in ["a", broken.as_str()] {
        assert!(
            c.child(m).try_wait().unwrap().is_none(),
            "member {m} exited\n{}",
            c.logs()
        );
    }
}
