//! What the cluster tests share: members of one pipeline file started as `sluice run`
//! processes (each with its own `MEMBER` and environment, its log in the test's
//! folder), `sluice shards` of the same file, the member running a shard, and the change
//! data pipeline the CDC tests run and its table read back.

use super::{PATIENCE, SLUICE, postgres};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Instant;

/// The members of one cluster test, started from `pipeline` in `dir` (where their
/// logs go), each killed when dropped.
pub struct Members {
    pub dir: PathBuf,
    pub pipeline: PathBuf,
    /// Environment every member and `sluice shards` gets beside `MEMBER` (what the
    /// pipeline file's `${…}` name).
    pub env: Vec<(String, String)>,
    pub running: Vec<(String, Child)>,
}

impl Members {
    pub fn new(dir: &Path, pipeline: &Path) -> Members {
        Members {
            dir: dir.to_path_buf(),
            pipeline: pipeline.to_path_buf(),
            env: Vec::new(),
            running: Vec::new(),
        }
    }

    /// Starts member `name` with `env` beside the shared environment.
    pub fn start(&mut self, name: &str, env: &[(&str, String)]) {
        let log = std::fs::File::create(self.dir.join(format!("{name}.log"))).unwrap();
        let child = Command::new(SLUICE)
            .current_dir(&self.dir)
            .arg("run")
            .arg(&self.pipeline)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("MEMBER", name)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.running.push((name.to_string(), child));
    }

    /// SIGKILLs member `name` and waits for it.
    pub fn kill(&mut self, name: &str) {
        let at = (self.running.iter().position(|(m, _)| m == name)).expect("a running member");
        let (_, mut child) = self.running.swap_remove(at);
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// SIGKILLs the member running a shard and starts it again under its name, with its
    /// folder, once another member holds the shard; `stints` gets the holders in turn.
    pub fn kill_holder_and_rejoin(&mut self, stints: &mut Vec<String>) {
        let victim = self.holder();
        if stints.last() != Some(&victim) {
            stints.push(victim.clone());
        }
        self.kill(&victim);
        let next = self.holder();
        eprintln!("killed {victim}, the holder; {next} holds the shard now");
        stints.push(next);
        self.start(&victim, &[]);
    }

    /// `sluice shards <verb> <pipeline> <args>`.
    pub fn shards(&self, verb: &str, args: &[&str]) -> Output {
        Command::new(SLUICE)
            .args(["shards", verb])
            .arg(&self.pipeline)
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("MEMBER", "cli")
            .output()
            .unwrap()
    }

    /// The shards as `sluice shards list --json` shows them.
    pub fn list(&self) -> Vec<Value> {
        let out = self.shards("list", &["--json"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// The running member that runs a shard, once one does.
    pub fn holder(&self) -> String {
        let started = Instant::now();
        loop {
            let shards = self.list();
            let running = (shards.iter())
                .find(|s| s["status"] == "running")
                .and_then(|s| s["member"].as_str())
                .filter(|m| self.running.iter().any(|(name, _)| name == m));
            if let Some(member) = running {
                return member.to_string();
            }
            assert!(
                started.elapsed() < PATIENCE,
                "no shard runs: {shards:#?}\n{}",
                self.logs()
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// The last 30 lines of each running member's log.
    pub fn logs(&self) -> String {
        (self.running.iter())
            .map(|(m, _)| {
                let log =
                    std::fs::read_to_string(self.dir.join(format!("{m}.log"))).unwrap_or_default();
                let lines: Vec<&str> = log.lines().collect();
                format!(
                    "--- {m}\n{}\n",
                    lines[lines.len().saturating_sub(30)..].join("\n")
                )
            })
            .collect()
    }
}

impl Drop for Members {
    fn drop(&mut self) {
        for (_, child) in &mut self.running {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A change-data pipeline of table `items` (`id` key, `qty`) under `cluster:` on `etcd`
/// (three shards asked for, a 3 s lease): `source` is the source's kind and settings
/// (`postgres_cdc: {…}`), `endpoint` the endpoint's; transactions of `max_docs` or
/// 200 ms, so a kill lands mid-snapshot.
pub fn items_cdc_pipeline(source: &str, endpoint: &str, max_docs: u64, etcd: &str) -> String {
    format!(
        r#"
collections:
  shop/items:
    key: [/id]
    schema:
      type: object
      required: [id]
      properties:
        id: {{type: integer}}
        qty: {{type: [integer, "null"]}}
sources:
  items-cdc:
    target: shop/items
    {source}
materializations:
  items-db:
    endpoint:
      {endpoint}
    bindings:
      - source: shop/items
        resource: {{table: items}}
runtime:
  transactions: {{max_docs: {max_docs}, max_duration: 200ms, min_duration: 200ms}}
cluster:
  etcd: ["{etcd}"]
  member: ${{MEMBER}}
  lease_ttl: 3s
  shards: 3
"#
    )
}

/// The rows of [`items_cdc_pipeline`]'s table `items` in `schema` of the shared
/// PostgreSQL server, by `id` (empty until the first commit creates it).
pub fn store_items(schema: &str) -> BTreeMap<i64, Option<i64>> {
    let query = format!(r#"SELECT id, qty::bigint FROM "{schema}".items"#);
    postgres(async move |client| {
        let rows = client.query(&query, &[]).await.unwrap_or_default();
        rows.iter().map(|r| (r.get(0), r.get(1))).collect()
    })
}
