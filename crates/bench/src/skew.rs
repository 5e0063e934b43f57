//! `sluice bench skew`: a cluster under a skewed load, shards weighed by count and then
//! by load, in one run.
//!
//! ```text
//!  private etcd; the input: --docs pageviews, --hot-share of them in the key ranges of
//!  two of the 6 shards, the two that rendezvous hashing gives one member of three
//!  for balance in [count (before), load (after)]:
//!     schema, 3 × `sluice run` (members m1, m2, m3; cluster.shards: 6; its own prefix)
//!     every second: the rates each member's shards published (sluice_cluster::load),
//!     until the table holds every document; then the members are stopped
//!  figures per run: drain_seconds (members started → every document in the table),
//!  max/min_member_share (a member's part of the documents committed, integrated from
//!  the published rates), member_docs_per_sec, member_cpu_seconds (/proc), moves (the
//!  shards placed by load), exact (rows and views summed equal the input's)
//! ```
//!
//! Every shard reads the whole input and keeps its range (sources do not read by
//! partition here), so the cool shards' members spend CPU passing documents over too.

use super::sql::PAGEVIEWS_COLLECTION;
use anyhow::{Context, bail};
use serde_json::json;
use sluice_cluster::assign::owner;
use sluice_cluster::etcd::Etcd;
use sluice_cluster::keys::{Keys, ShardDef, ShardId};
use sluice_cluster::load::{cpu_seconds_of, members};
use sluice_postgres::sql::quote_ident;
use sluice_testkit::etcd::PrivateEtcd;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tokio_postgres::NoTls;

#[derive(clap::Args)]
pub struct SkewArgs {
    /// Documents of the input, written before the members start.
    #[arg(long, default_value_t = 400_000)]
    docs: u64,
    /// The part of the documents whose keys fall in the two hot shards' ranges.
    #[arg(long, default_value_t = 0.9)]
    hot_share: f64,
    /// `cluster.balance_interval` of the `load` run.
    #[arg(long, default_value = "10s")]
    balance_interval: String,
    /// The longest a run may take to drain, in seconds.
    #[arg(long, default_value_t = 900)]
    timeout: u64,
    /// The PostgreSQL server (schemas of unique names are created, then dropped).
    #[arg(
        long,
        default_value = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
    )]
    url: String,
    /// Print one JSON object instead of text.
    #[arg(long)]
    json: bool,
}

const MEMBERS: [&str; 3] = ["m1", "m2", "m3"];
const SHARDS: u32 = 6;
const MATERIALIZATION: &str = "views";

/// What the table holds once the input is drained.
struct Input {
    rows: i64,
    views: i64,
}

/// One run, as measured.
struct Measured {
    drain: Duration,
    /// Documents each member committed, integrated from its published rates.
    member_docs: BTreeMap<String, f64>,
    member_cpu: BTreeMap<String, f64>,
    moves: usize,
    exact: bool,
}

pub fn run(args: SkewArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.hot_share),
        "--hot-share is a part of the documents, 0 to 1"
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench(&args))
}

async fn bench(args: &SkewArgs) -> anyhow::Result<()> {
    let (client, connection) = tokio_postgres::connect(&args.url, NoTls)
        .await
        .context("connecting to the server given by --url")?;
    tokio::spawn(connection);
    let etcd = PrivateEtcd::start();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .subsec_nanos();
    let tag = format!("sluice_skew_{}_{nanos:x}", std::process::id());
    let work = std::env::temp_dir().join(&tag);
    std::fs::create_dir_all(&work)?;
    let (hot_member, hot) = hot_shards();
    let input = write_input(args, &hot, &work.join("views.jsonl"))?;
    if !args.json {
        eprintln!(
            "{} documents, {:.0}% in shards {} and {} (both {hot_member}'s by rendezvous)",
            args.docs,
            args.hot_share * 100.0,
            hot[0].id(),
            hot[1].id()
        );
    }
    let mut runs = Vec::new();
    for balance in ["count", "load"] {
        let schema = format!("{tag}_{balance}");
        client
            .batch_execute(&format!("CREATE SCHEMA {}", quote_ident(&schema)))
            .await?;
        let measured = measure(args, &etcd, &client, &work, balance, &schema, &input).await;
        client
            .batch_execute(&format!("DROP SCHEMA {} CASCADE", quote_ident(&schema)))
            .await?;
        runs.push((balance, measured?));
    }
    let _ = std::fs::remove_dir_all(&work);
    report(args, &runs);
    if runs.iter().any(|(_, m)| !m.exact) {
        bail!("a run's table differs from the input");
    }
    Ok(())
}

/// Two shards that rendezvous hashing gives one member (of the member holding most).
fn hot_shards() -> (String, [ShardDef; 2]) {
    let members: BTreeSet<String> = MEMBERS.iter().map(|m| m.to_string()).collect();
    let mut by_member: BTreeMap<&str, Vec<ShardDef>> = BTreeMap::new();
    for range in ShardDef::split_evenly(SHARDS) {
        let id = ShardId {
            materialization: MATERIALIZATION.into(),
            range,
        };
        let member = owner(&members, &id).expect("three members");
        let member = MEMBERS.iter().find(|m| **m == member).expect("one of them");
        by_member.entry(member).or_default().push(range);
    }
    let (member, ranges) = (by_member.into_iter())
        .max_by_key(|(_, ranges)| ranges.len())
        .expect("six shards over three members: one has two");
    (member.to_string(), [ranges[0], ranges[1]])
}

/// Writes the input: each document a user of the hot ranges (`--hot-share` of them) or
/// of the others, each user in two documents.
fn write_input(args: &SkewArgs, hot: &[ShardDef; 2], path: &Path) -> anyhow::Result<Input> {
    let hot_docs = (args.docs as f64 * args.hot_share).round() as u64;
    let (mut hot_users, mut cool_users) = (Vec::new(), Vec::new());
    let (hot_want, cool_want) = (hot_docs.div_ceil(2), (args.docs - hot_docs).div_ceil(2));
    let mut i = 0u64;
    while (hot_users.len() as u64) < hot_want || (cool_users.len() as u64) < cool_want {
        let user = format!("user-{i}");
        let hash = sluice_doc::hash::key_hash(&sluice_doc::tuple::pack_key(&[json!(user)]));
        let in_hot = hot.iter().any(|r| r.key_begin <= hash && hash <= r.key_end);
        match in_hot {
            true if (hot_users.len() as u64) < hot_want => hot_users.push(user),
            false if (cool_users.len() as u64) < cool_want => cool_users.push(user),
            _ => {}
        }
        i += 1;
    }
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut used = BTreeSet::new();
    for n in 0..args.docs {
        // Spread the hot documents evenly through the file.
        let is_hot = (n * hot_docs / args.docs.max(1)) != ((n + 1) * hot_docs / args.docs.max(1));
        let users = if is_hot { &hot_users } else { &cool_users };
        let user = &users[(n as usize / 2) % users.len()];
        used.insert(user.clone());
        let doc = json!({"user_id": user, "views": 1, "bytes": 100,
            "last_seen": "2026-01-01T00:00:00Z"});
        serde_json::to_writer(&mut out, &doc)?;
        out.write_all(b"\n")?;
    }
    out.flush()?;
    Ok(Input {
        rows: used.len() as i64,
        views: args.docs as i64,
    })
}

fn pipeline_yaml(args: &SkewArgs, etcd: &str, prefix: &str, balance: &str, schema: &str) -> String {
    format!(
        r#"{PAGEVIEWS_COLLECTION}sources:
  views-file:
    target: bench/pageviews
    file: {{path: views.jsonl, format: json}}
materializations:
  {MATERIALIZATION}:
    endpoint:
      postgres: {{url: "{url}", schema: {schema}}}
    bindings:
      - source: bench/pageviews
        resource: {{table: pageviews}}
cluster:
  etcd: ["{etcd}"]
  member: ${{MEMBER}}
  prefix: {prefix}
  shards: {SHARDS}
  balance: {balance}
  balance_interval: {interval}
"#,
        url = args.url,
        interval = args.balance_interval,
    )
}

/// One run: the members started, sampled every second until the table holds the input.
async fn measure(
    args: &SkewArgs,
    etcd: &PrivateEtcd,
    client: &tokio_postgres::Client,
    work: &Path,
    balance: &str,
    schema: &str,
    input: &Input,
) -> anyhow::Result<Measured> {
    let prefix = format!("/sluice/{schema}");
    let pipeline = work.join(format!("{balance}.yaml"));
    let yaml = pipeline_yaml(args, &etcd.url(), &prefix, balance, schema);
    std::fs::write(&pipeline, yaml)?;
    let sluice = sluice_app::sibling::sibling("sluice")?;
    let mut running: Vec<(String, Child)> = Vec::new();
    for member in MEMBERS {
        let log = std::fs::File::create(work.join(format!("{balance}-{member}.log")))?;
        let child = Command::new(&sluice)
            .current_dir(work)
            .arg("run")
            .arg(&pipeline)
            .env("MEMBER", member)
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or("info".into()),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting sluice run")?;
        running.push((member.to_string(), child));
    }
    let result = sample(args, etcd, client, (&prefix, schema), input, &mut running).await;
    for (_, child) in &mut running {
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
    }
    let stopping = Instant::now();
    for (member, child) in &mut running {
        while child.try_wait()?.is_none() && stopping.elapsed() < Duration::from_secs(15) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        if child.try_wait()?.is_none() {
            eprintln!("{member} did not stop within 15 s of SIGTERM: killed");
            child.kill()?;
            child.wait()?;
        }
    }
    result.with_context(|| format!("the `{balance}` run (logs in {})", work.display()))
}

async fn sample(
    args: &SkewArgs,
    etcd: &PrivateEtcd,
    client: &tokio_postgres::Client,
    (prefix, schema): (&str, &str),
    input: &Input,
    running: &mut [(String, Child)],
) -> anyhow::Result<Measured> {
    let started = Instant::now();
    let keys = Keys::new(prefix);
    let etcd = Etcd::connect(&[etcd.url()], Duration::from_secs(5), None)?;
    let mut member_docs: BTreeMap<String, f64> = BTreeMap::new();
    let mut last = Instant::now();
    let sums = format!(
        "SELECT count(*), coalesce(sum(views), 0)::bigint FROM {}.pageviews",
        quote_ident(schema)
    );
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        for (member, child) in running.iter_mut() {
            if let Some(status) = child.try_wait()? {
                bail!("member {member} exited ({status})");
            }
        }
        let dt = last.elapsed().as_secs_f64();
        last = Instant::now();
        for row in members(&etcd, &keys).await.unwrap_or_default() {
            *member_docs.entry(row.member).or_default() += row.rate as f64 * dt;
        }
        // The table appears with the first Apply.
        let (rows, views) = match client.query_one(&sums, &[]).await {
            Ok(row) => (row.get::<_, i64>(0), row.get::<_, i64>(1)),
            Err(_) => (0, 0),
        };
        if views >= input.views {
            let (placed, _) = etcd.get_prefix(&keys.placements()).await?;
            let member_cpu = (running.iter())
                .map(|(m, c)| (m.clone(), cpu_seconds_of(Some(c.id())).unwrap_or(0.0)))
                .collect();
            return Ok(Measured {
                drain: started.elapsed(),
                member_docs,
                member_cpu,
                moves: placed.len(),
                exact: rows == input.rows && views == input.views,
            });
        }
        if started.elapsed() > Duration::from_secs(args.timeout) {
            bail!(
                "not drained after {} s: {views} of {} views",
                args.timeout,
                input.views
            );
        }
    }
}

fn report(args: &SkewArgs, runs: &[(&str, Measured)]) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut figures = json!({
        "docs": args.docs,
        "hot_share": args.hot_share,
        "members": MEMBERS.len(),
        "shards": SHARDS,
        "balance_interval": args.balance_interval,
        "cores": cores,
    });
    for (balance, m) in runs {
        let when = if *balance == "count" {
            "before"
        } else {
            "after"
        };
        let total: f64 = m.member_docs.values().sum::<f64>().max(1.0);
        let shares: Vec<f64> = (MEMBERS.iter())
            .map(|member| m.member_docs.get(*member).copied().unwrap_or(0.0) / total)
            .collect();
        let secs = m.drain.as_secs_f64();
        let rates: Vec<f64> = (MEMBERS.iter())
            .map(|member| (m.member_docs.get(*member).copied().unwrap_or(0.0) / secs).round())
            .collect();
        let cpu: Vec<f64> = (MEMBERS.iter())
            .map(|member| {
                (m.member_cpu.get(*member).copied().unwrap_or(0.0) * 100.0).round() / 100.0
            })
            .collect();
        let round = |x: f64| (x * 1000.0).round() / 1000.0;
        let max = shares.iter().copied().fold(0.0, f64::max);
        let min = shares.iter().copied().fold(1.0, f64::min);
        figures[format!("drain_seconds_{when}")] = json!(round(secs));
        figures[format!("max_member_share_{when}")] = json!(round(max));
        figures[format!("min_member_share_{when}")] = json!(round(min));
        figures[format!("member_docs_per_sec_{when}")] = json!(rates);
        figures[format!("member_cpu_seconds_{when}")] = json!(cpu);
        figures[format!("moves_{when}")] = json!(m.moves);
        figures[format!("exact_{when}")] = json!(m.exact);
        if !args.json {
            println!(
                "balance: {balance} ({when}): drained in {secs:.1} s; members' share of the \
                 documents {shares:.2?} (max {max:.2}, min {min:.2}); docs/s {rates:?}; \
                 CPU seconds {cpu:?}; {} move(s) by load; exact: {}",
                m.moves, m.exact
            );
        }
    }
    if args.json {
        println!("{figures}");
    } else {
        println!("{cores} cores");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hot_shards_are_one_members_by_rendezvous() {
        let (member, hot) = hot_shards();
        let members: BTreeSet<String> = MEMBERS.iter().map(|m| m.to_string()).collect();
        for range in hot {
            let id = ShardId {
                materialization: MATERIALIZATION.into(),
                range,
            };
            assert_eq!(owner(&members, &id), Some(member.as_str()));
        }
        assert_ne!(hot[0], hot[1]);
    }
}
