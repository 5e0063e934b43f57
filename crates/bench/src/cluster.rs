//! `sluice bench cluster`: one pipeline split over 1, 2 and 3 processes by key range,
//! into PostgreSQL. What scale-out by key hash costs and gives on this machine.
//!
//! ```text
//!  for n in 1..=3:  schema s_n, `sluice apply` once
//!     n × `sluice run` at once, process i owning key hashes [i·2³²/n, (i+1)·2³²/n)
//!     each reads the whole input (datagen pageviews) and keeps its range
//!  figures: docs_per_sec_n (input documents over the wall time), cpu_seconds_n (each
//!  process's user + system time), exact (s_n's table equals s_1's, row for row)
//! ```
//!
//! Every process generates and parses every document and passes over the ones of
//! other ranges, as every shard does until sources read by partition; so the figures
//! show what that costs as well as what splitting the writes gives. CPU time is
//! sampled from `/proc` while each process runs (`loads::RunningSluice`).

use super::loads::{Run, RunningSluice};
use super::sql::PAGEVIEWS_COLLECTION;
use anyhow::{Context, bail, ensure};
use serde_json::json;
use sluice_postgres::sql::quote_ident;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use tokio_postgres::NoTls;

#[derive(clap::Args)]
pub struct ClusterArgs {
    /// Documents of the input (every process reads them all).
    #[arg(long, default_value_t = 1_000_000)]
    docs: u64,
    /// Distinct keys.
    #[arg(long, default_value_t = 200_000)]
    keys: u64,
    /// The most processes to split over (1 up to this).
    #[arg(long, default_value_t = 3)]
    processes: u32,
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

/// One split of the pipeline, as measured.
struct Split {
    processes: u32,
    elapsed: Duration,
    cpu_seconds: Vec<f64>,
}

pub fn run(args: ClusterArgs) -> anyhow::Result<()> {
    ensure!(
        (1..=16).contains(&args.processes),
        "--processes must be 1 to 16"
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(bench(&args))
}

async fn bench(args: &ClusterArgs) -> anyhow::Result<()> {
    let (client, connection) = tokio_postgres::connect(&args.url, NoTls)
        .await
        .context("connecting to the server given by --url")?;
    tokio::spawn(connection);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .subsec_nanos();
    let prefix = format!("sluice_cluster_{}_{nanos:x}", std::process::id());
    let schemas: Vec<String> = (1..=args.processes)
        .map(|n| format!("{prefix}_{n}"))
        .collect();
    let work = std::env::temp_dir().join(&prefix);
    std::fs::create_dir_all(&work)?;
    let mut splits = Vec::new();
    let mut result = Ok(());
    for (n, schema) in (1..=args.processes).zip(&schemas) {
        client
            .batch_execute(&format!("CREATE SCHEMA {}", quote_ident(schema)))
            .await?;
        if !args.json {
            eprintln!("{n} process(es): {} documents each…", args.docs);
        }
        match split(args, n, schema, &work.join(format!("n{n}"))) {
            Ok(measured) => splits.push(measured),
            Err(err) => {
                result = Err(err);
                break;
            }
        }
    }
    let mut exact = result.is_ok();
    if exact {
        for schema in &schemas[1..] {
            exact &= same_rows(&client, &schemas[0], schema).await?;
        }
    }
    for schema in &schemas {
        client
            .batch_execute(&format!(
                "DROP SCHEMA IF EXISTS {} CASCADE",
                quote_ident(schema)
            ))
            .await?;
    }
    let _ = std::fs::remove_dir_all(&work);
    result?;
    report(args, &splits, exact);
    if !exact {
        bail!("a split's table differs from the single process's");
    }
    Ok(())
}

/// Runs the pipeline as `n` processes at once, each over its share of the key hashes.
fn split(args: &ClusterArgs, n: u32, schema: &str, dir: &Path) -> anyhow::Result<Split> {
    std::fs::create_dir_all(dir)?;
    let pipelines: Vec<PathBuf> = ranges(n)
        .into_iter()
        .enumerate()
        .map(|(i, range)| {
            let path = dir.join(format!("shard{i}.yaml"));
            std::fs::write(&path, pipeline_yaml(args, schema, range, i))?;
            Ok(path)
        })
        .collect::<anyhow::Result<_>>()?;
    let sluice = sluice_app::sibling::sibling("sluice")?;
    let applied = Command::new(&sluice)
        .arg("apply")
        .arg(&pipelines[0])
        .output()?;
    ensure!(
        applied.status.success(),
        "sluice apply failed: {}",
        String::from_utf8_lossy(&applied.stderr)
    );
    let start = Instant::now();
    let mut running: Vec<RunningSluice> = pipelines
        .iter()
        .map(|pipeline| RunningSluice::start(pipeline, &pipeline.with_extension("log")))
        .collect::<anyhow::Result<_>>()?;
    let mut runs: Vec<Option<Run>> = running.iter().map(|_| None).collect();
    while runs.iter().any(Option::is_none) {
        for (i, process) in running.iter_mut().enumerate() {
            if runs[i].is_none() {
                runs[i] = process
                    .poll()
                    .with_context(|| format!("shard {i} of {n}"))?;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(Split {
        processes: n,
        elapsed: start.elapsed(),
        cpu_seconds: runs
            .into_iter()
            .flatten()
            .map(|run| run.cpu_seconds)
            .collect(),
    })
}

/// `n` ranges splitting the key hashes evenly, inclusive at both ends.
fn ranges(n: u32) -> Vec<(u32, u32)> {
    let width = (1u64 << 32) / u64::from(n);
    (0..u64::from(n))
        .map(|i| {
            let end = if i + 1 == u64::from(n) {
                u64::from(u32::MAX)
            } else {
                (i + 1) * width - 1
            };
            ((i * width) as u32, end as u32)
        })
        .collect()
}

fn pipeline_yaml(args: &ClusterArgs, schema: &str, range: (u32, u32), shard: usize) -> String {
    format!(
        r#"{PAGEVIEWS_COLLECTION}sources:
  views-gen:
    target: bench/pageviews
    datagen: {{seed: 7, documents: {docs}, keys: {keys}, shape: pageviews}}
materializations:
  views:
    shard: {{key_begin: {begin}, key_end: {end}}}
    endpoint:
      postgres: {{url: "{url}", schema: {schema}}}
    bindings:
      - source: bench/pageviews
        resource: {{table: pageviews}}
runtime:
  recovery_log: log{shard}
"#,
        docs = args.docs,
        keys = args.keys,
        begin = range.0,
        end = range.1,
        url = args.url,
    )
}

/// Whether the `pageviews` tables of both schemas hold the same rows.
async fn same_rows(client: &tokio_postgres::Client, a: &str, b: &str) -> anyhow::Result<bool> {
    let (a, b) = (quote_ident(a), quote_ident(b));
    let sql = format!(
        "SELECT count(*) FROM ((SELECT user_id, views, bytes, last_seen FROM {a}.pageviews \
         EXCEPT SELECT user_id, views, bytes, last_seen FROM {b}.pageviews) UNION ALL \
         (SELECT user_id, views, bytes, last_seen FROM {b}.pageviews \
         EXCEPT SELECT user_id, views, bytes, last_seen FROM {a}.pageviews)) AS differ"
    );
    let differ: i64 = client.query_one(&sql, &[]).await?.get(0);
    Ok(differ == 0)
}

fn report(args: &ClusterArgs, splits: &[Split], exact: bool) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut figures = json!({
        "docs": args.docs,
        "keys": args.keys,
        "cores": cores,
        "exact": exact,
    });
    for split in splits {
        let n = split.processes;
        let rate = args.docs as f64 / split.elapsed.as_secs_f64();
        figures[format!("docs_per_sec_{n}")] = json!(rate.round());
        figures[format!("secs_{n}")] = json!(split.elapsed.as_secs_f64());
        figures[format!("cpu_seconds_{n}")] = json!(split.cpu_seconds);
        if !args.json {
            let cpu: Vec<String> = split
                .cpu_seconds
                .iter()
                .map(|s| format!("{s:.1}"))
                .collect();
            println!(
                "{n} process(es): {:.1} s, {rate:.0} docs/s, CPU seconds per process [{}]",
                split.elapsed.as_secs_f64(),
                cpu.join(", ")
            );
        }
    }
    if args.json {
        println!("{figures}");
    } else {
        println!("{cores} cores; exact: {exact}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_every_hash_once() {
        for n in 1..=5 {
            let ranges = ranges(n);
            assert_eq!(ranges.len(), n as usize);
            assert_eq!(ranges[0].0, 0);
            assert_eq!(ranges[n as usize - 1].1, u32::MAX);
            for pair in ranges.windows(2) {
                assert_eq!(pair[0].1 + 1, pair[1].0, "{ranges:?}");
            }
        }
    }
}
